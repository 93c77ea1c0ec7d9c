// Reading provider answers without throwing: the small accessors every
// adapter needs for a JSON body whose shape it does not control.
//
// Thread-safety: pure functions.
#pragma once

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

// The numeric member `key` as an integer (a double is truncated), or 0.
inline int64_t IntAt(const Json& j, const char* key) {
  const Json* v = Find(j, key);
  if (v == nullptr || !v->is_number()) return 0;
  return v->is_number_integer() ? v->get<int64_t>() : static_cast<int64_t>(v->get<double>());
}

inline std::string StripTrailingSlash(std::string url) {
  while (!url.empty() && url.back() == '/') url.pop_back();
  return url;
}

}  // namespace idem::wire
