#include "daemon/http/idempotency_key.h"

#include <algorithm>
#include <cstdint>

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
  // What follows the item: RFC 8941 parameters (";name" or ";name=value"),
  // which the Idempotency-Key field gives no meaning, so they are ignored,
  // or nothing.
  std::string_view after;
  if (!v.empty() && v.front() == '"') {
    size_t i = 1;
    for (; i < v.size() && v[i] != '"'; ++i) {
      char c = v[i];
      if (c == '\\') {
        if (i + 1 >= v.size() || (v[i + 1] != '"' && v[i + 1] != '\\')) {
          return InvalidArgument("Idempotency-Key has an invalid escape", kField);
        }
        key += v[++i];
      } else if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) {
        return InvalidArgument("Idempotency-Key may hold printable ASCII only", kField);
      } else {
        key += c;
      }
    }
    if (i >= v.size()) {
      return InvalidArgument("Idempotency-Key is an unterminated sf-string", kField);
    }
    after = v.substr(i + 1);
  } else {
    const size_t semi = v.find(';');
    std::string_view token = v.substr(0, semi);
    after = semi == std::string_view::npos ? std::string_view() : v.substr(semi);
    for (char c : token) {
      if (!IsKeyChar(c)) {
        return InvalidArgument(
            "Idempotency-Key must be an sf-string (\"...\") or a token; it has '" +
                std::string(1, c) + "'",
            kField);
      }
    }
    key = std::string(token);
  }
  if (!after.empty() && after.front() != ';') {
    return InvalidArgument(
        "Idempotency-Key has text after its value; only ;parameters may follow (RFC 8941)", kField);
  }
  if (key.empty()) return InvalidArgument("Idempotency-Key is empty", kField);
  if (key.size() > kMaxKeyLength) {
    return InvalidArgument("Idempotency-Key is longer than 255 characters", kField);
  }
  return key;
}

StatusOr<int64_t> ParsePreferWait(const std::vector<std::string>& values, int64_t max_wait_ms) {
  constexpr char kPrefer[] = "header:Prefer";
  constexpr int64_t kMaxDeltaSeconds = 2147483647;  // RFC 9111 5.2
  int64_t wait_ms = 0;
  for (const std::string& header : values) {
    std::string_view rest(header);
    while (!rest.empty()) {
      size_t comma = rest.find(',');
      std::string_view pref = rest.substr(0, comma);
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
      pref = pref.substr(0, pref.find(';'));  // parameters do not concern wait
      size_t eq = pref.find('=');
      std::string_view name = http1::TrimOws(pref.substr(0, eq));
      if (name.size() != 4 || !std::equal(name.begin(), name.end(), "wait", [](char a, char b) {
            return (a >= 'A' && a <= 'Z' ? a - 'A' + 'a' : a) == b;
          })) {
        continue;
      }
      std::string_view value =
          eq == std::string_view::npos ? std::string_view() : http1::TrimOws(pref.substr(eq + 1));
      if (value.size() >= 2 && value.front() == '"' && value.back() == '"') {
        value = value.substr(1, value.size() - 2);
      }
      if (value.empty()) return InvalidArgument("Prefer: wait needs a number of seconds", kPrefer);
      int64_t secs = 0;
      for (char c : value) {
        if (c < '0' || c > '9') {
          return InvalidArgument("Prefer: wait must be a whole number of seconds", kPrefer);
        }
        secs = secs * 10 + (c - '0');
        if (secs > kMaxDeltaSeconds) {
          return InvalidArgument("Prefer: wait is out of range (at most 2147483647 seconds)",
                                 kPrefer);
        }
      }
      // secs <= 2^31-1, so secs * 1000 fits in 64 bits.
      wait_ms = std::clamp<int64_t>(secs * 1000, 0, std::max<int64_t>(0, max_wait_ms));
    }
  }
  return wait_ms;
}

std::string RequestFingerprint(std::string_view method, std::string_view path,
                               std::string_view canonical_body) {
  std::string material;
  material.reserve(method.size() + path.size() + canonical_body.size() + 2);
  material.append(method).append(" ").append(path).append("\n").append(canonical_body);
  return Sha256Hex(material);
}

}  // namespace idem
