#include "daemon/core/json_diff.h"

#include <string>

#include "daemon/core/json.h"

namespace idem {
namespace {

using Json = nlohmann::json;

void Walk(const Json& a, const Json& b, const std::string& at, int depth, Json& out) {
  if (a == b) return;
  if (depth > 0 && a.is_object() && b.is_object()) {
    for (auto it = a.begin(); it != a.end(); ++it) {
      std::string p = at + "/" + JsonPointerToken(it.key());
      auto other = b.find(it.key());
      if (other == b.end()) {
        out["removed"].push_back({{"pointer", p}, {"value", it.value()}});
      } else {
        Walk(it.value(), *other, p, depth - 1, out);
      }
    }
    for (auto it = b.begin(); it != b.end(); ++it) {
      if (!a.contains(it.key())) {
        out["added"].push_back(
            {{"pointer", at + "/" + JsonPointerToken(it.key())}, {"value", it.value()}});
      }
    }
    return;
  }
  if (depth > 0 && a.is_array() && b.is_array()) {
    size_t common = std::min(a.size(), b.size());
    for (size_t i = 0; i < common; ++i) {
      Walk(a[i], b[i], at + "/" + std::to_string(i), depth - 1, out);
    }
    for (size_t i = common; i < a.size(); ++i) {
      out["removed"].push_back({{"pointer", at + "/" + std::to_string(i)}, {"value", a[i]}});
    }
    for (size_t i = common; i < b.size(); ++i) {
      out["added"].push_back({{"pointer", at + "/" + std::to_string(i)}, {"value", b[i]}});
    }
    return;
  }
  out["changed"].push_back({{"pointer", at}, {"from", a}, {"to", b}});
}

}  // namespace

nlohmann::json JsonDiff(const nlohmann::json& from, const nlohmann::json& to, int max_depth) {
  Json out = {{"added", Json::array()}, {"removed", Json::array()}, {"changed", Json::array()}};
  Walk(from, to, "", max_depth, out);
  return out;
}

}  // namespace idem
