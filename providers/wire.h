// Reading provider answers without throwing: the small accessors every
// adapter needs for a JSON body whose shape it does not control.
//
// Thread-safety: pure functions.
#pragma once

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace idem::wire {

using Json = nlohmann::json;

// The member `key` of object `j`, or nullptr (also when `j` is no object).
inline const Json* Find(const Json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

// The string member `key`, or "" when absent or not a string.
inline std::string StringAt(const Json& j, const char* key) {
  const Json* v = Find(j, key);
  return v != nullptr && v->is_string() ? v->get<std::string>() : std::string();
}

// Token counts are the only integers read from answers. An upstream may
// send anything: a count is clamped to [0, 2^53] (a double is truncated,
// NaN is 0), so converting it is defined and adding a few cannot overflow.
inline constexpr int64_t kMaxCount = int64_t{1} << 53;

// `v` as a count, or 0 when it is not a number.
inline int64_t AsCount(const Json& v) {
  if (v.is_number_unsigned())
    return static_cast<int64_t>(std::min<uint64_t>(v.get<uint64_t>(), kMaxCount));
  if (v.is_number_integer()) return std::clamp<int64_t>(v.get<int64_t>(), 0, kMaxCount);
  if (!v.is_number()) return 0;
  double d = v.get<double>();
  if (!(d > 0)) return 0;  // also NaN
  return d >= static_cast<double>(kMaxCount) ? kMaxCount : static_cast<int64_t>(d);
}

// The numeric member `key` as a count (see AsCount), or 0.
inline int64_t IntAt(const Json& j, const char* key) {
  const Json* v = Find(j, key);
  return v == nullptr ? 0 : AsCount(*v);
}

inline std::string StripTrailingSlash(std::string url) {
  while (!url.empty() && url.back() == '/') url.pop_back();
  return url;
}

}  // namespace idem::wire
