#include "daemon/http/idempotency_key.h"

#include "daemon/core/crypto.h"
#include "daemon/http/http1.h"

namespace idem {
namespace {

constexpr size_t kMaxKeyLength = 255;
const char kField[] = "header:Idempotency-Key";

// RFC 9110 tchar, plus the characters a token of RFC 8941 may contain (':' '/').
bool IsKeyChar(char c) { return http1::IsTokenChar(c) || c == ':' || c == '/'; }

}  // namespace

StatusOr<std::string> ParseIdempotencyKey(const std::vector<std::string>& values) {
  if (values.empty()) return std::string();
  if (values.size() > 1) {
    return InvalidArgument(
        "Idempotency-Key must be sent once; this request has " + std::to_string(values.size()),
        kField);
  }
  std::string_view v = http1::TrimOws(values[0]);
  std::string key;
  if (!v.empty() && v.front() == '"') {
    if (v.size() < 2 || v.back() != '"') {
      return InvalidArgument("Idempotency-Key is an unterminated sf-string", kField);
    }
    std::string_view inner = v.substr(1, v.size() - 2);
    for (size_t i = 0; i < inner.size(); ++i) {
      char c = inner[i];
      if (c == '\\') {
        if (i + 1 >= inner.size() || (inner[i + 1] != '"' && inner[i + 1] != '\\')) {
          return InvalidArgument("Idempotency-Key has an invalid escape", kField);
        }
        key += inner[++i];
      } else if (c == '"') {
        return InvalidArgument("Idempotency-Key has an unescaped quote", kField);
      } else if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) {
        return InvalidArgument("Idempotency-Key may hold printable ASCII only", kField);
      } else {
        key += c;
      }
    }
  } else {
    for (char c : v) {
      if (!IsKeyChar(c)) {
        return InvalidArgument(
            "Idempotency-Key must be an sf-string (\"...\") or a token; it has '" +
                std::string(1, c) + "'",
            kField);
      }
    }
    key = std::string(v);
  }
  if (key.empty()) return InvalidArgument("Idempotency-Key is empty", kField);
  if (key.size() > kMaxKeyLength) {
    return InvalidArgument("Idempotency-Key is longer than 255 characters", kField);
  }
  return key;
}

std::string RequestFingerprint(std::string_view method, std::string_view path,
                               std::string_view canonical_body) {
  std::string material;
  material.reserve(method.size() + path.size() + canonical_body.size() + 2);
  material.append(method).append(" ").append(path).append("\n").append(canonical_body);
  return Sha256Hex(material);
}

}  // namespace idem
