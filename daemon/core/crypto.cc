#include "daemon/core/crypto.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

namespace idem {

std::string HexEncode(std::string_view raw) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.resize(raw.size() * 2);
  for (size_t i = 0; i < raw.size(); ++i) {
    auto b = static_cast<unsigned char>(raw[i]);
    out[2 * i] = kHex[b >> 4];
    out[2 * i + 1] = kHex[b & 15];
  }
  return out;
}

std::optional<std::string> HexDecode(std::string_view hex) {
  if (hex.size() % 2 != 0) return std::nullopt;
  auto nibble = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
  };
  std::string out;
  out.reserve(hex.size() / 2);
  for (size_t i = 0; i < hex.size(); i += 2) {
    const int hi = nibble(hex[i]);
    const int lo = nibble(hex[i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out.push_back(static_cast<char>(hi * 16 + lo));
  }
  return out;
}

namespace {

// SHA-256 fetched once for the process. EVP_Digest with EVP_sha256() looks
// the algorithm up (a lock and a hash table) and allocates a context on
// every call: most of a work id's hashing on claim + complete was that,
// not the hash (README, "Benchmarks").
const EVP_MD* Sha256Algorithm() {
  static EVP_MD* const md = [] {
    EVP_MD* m = EVP_MD_fetch(nullptr, "SHA256", nullptr);
    if (m == nullptr) std::abort();  // OpenSSL cannot hash: no promise can be kept
    return m;
  }();
  return md;
}

// One digest context per thread, reset by each use.
struct DigestContext {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  DigestContext() = default;
  DigestContext(const DigestContext&) = delete;
  DigestContext& operator=(const DigestContext&) = delete;
  ~DigestContext() { EVP_MD_CTX_free(ctx); }
};

}  // namespace

std::string Sha256Raw(std::string_view data) {
  thread_local DigestContext digest;
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (digest.ctx == nullptr || EVP_DigestInit_ex2(digest.ctx, Sha256Algorithm(), nullptr) != 1 ||
      EVP_DigestUpdate(digest.ctx, data.data(), data.size()) != 1 ||
      EVP_DigestFinal_ex(digest.ctx, md, &len) != 1) {
    std::abort();  // OpenSSL cannot hash: the process cannot keep any promise
  }
  return std::string(reinterpret_cast<char*>(md), len);
}

std::string Sha256Hex(std::string_view data) { return HexEncode(Sha256Raw(data)); }

std::string HmacSha256Hex(std::string_view key, std::string_view data) {
  EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  if (mac == nullptr) std::abort();
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(mac);
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                         OSSL_PARAM_construct_end()};
  unsigned char out[EVP_MAX_MD_SIZE];
  size_t out_len = 0;
  if (ctx == nullptr ||
      EVP_MAC_init(ctx, reinterpret_cast<const unsigned char*>(key.data()), key.size(), params) !=
          1 ||
      EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(data.data()), data.size()) != 1 ||
      EVP_MAC_final(ctx, out, &out_len, sizeof(out)) != 1) {
    std::abort();
  }
  EVP_MAC_CTX_free(ctx);
  EVP_MAC_free(mac);
  return HexEncode(std::string_view(reinterpret_cast<char*>(out), out_len));
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string RandomHex(size_t bytes) {
  // RAND_bytes takes a lock in OpenSSL's shared DRBG on every call; lease
  // tokens and request ids are drawn on every claim. Each thread draws 4 KiB
  // at a time and hands out slices, each byte used once.
  constexpr size_t kPool = 4096;
  thread_local unsigned char pool[kPool];
  thread_local size_t used = kPool;
  std::string raw;
  raw.reserve(bytes);
  while (raw.size() < bytes) {
    if (used == kPool) {
      if (RAND_bytes(pool, static_cast<int>(kPool)) != 1) std::abort();
      used = 0;
    }
    size_t take = std::min(bytes - raw.size(), kPool - used);
    raw.append(reinterpret_cast<const char*>(pool + used), take);
    OPENSSL_cleanse(pool + used, take);
    used += take;
  }
  std::string hex = HexEncode(raw);
  OPENSSL_cleanse(raw.data(), raw.size());
  return hex;
}

}  // namespace idem
