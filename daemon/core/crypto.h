// SHA-256, HMAC-SHA-256, constant-time comparison and random tokens, all
// through OpenSSL 3 (EVP interfaces). Thread-safe: pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace idem {

// Lower-case hex SHA-256 of `data` (64 characters).
std::string Sha256Hex(std::string_view data);
// Raw 32-byte SHA-256 digest.
std::string Sha256Raw(std::string_view data);
// Lower-case hex HMAC-SHA-256.
std::string HmacSha256Hex(std::string_view key, std::string_view data);
// Constant-time equality of two strings (length may leak, contents do not).
bool ConstantTimeEquals(std::string_view a, std::string_view b);
// `bytes` cryptographically random bytes, hex-encoded (2*bytes characters).
std::string RandomHex(size_t bytes);
std::string HexEncode(std::string_view raw);
// The bytes of HexEncode's output; nullopt for anything else (odd length,
// upper case, a non-hex character).
std::optional<std::string> HexDecode(std::string_view hex);

}  // namespace idem
