#include "providers/schema_lint.h"

#include <algorithm>
#include <array>
#include <cstdint>

#include "daemon/core/json.h"

namespace idem {
namespace {

constexpr int kMaxObjectDepth = 10;
constexpr size_t kMaxProperties = 5000;
constexpr size_t kMaxEnumValues = 1000;
constexpr size_t kMaxTotalStringChars = 120'000;
constexpr size_t kLargeEnumValues = 250;
constexpr size_t kMaxLargeEnumChars = 15'000;

std::string Child(const std::string& pointer, std::string_view token) {
  return pointer + "/" + JsonPointerToken(token);
}

bool IsObjectSchema(const Json& s) {
  if (!s.is_object()) return false;
  auto type = s.find("type");
  if (type != s.end()) {
    if (type->is_string()) return *type == "object";
    if (type->is_array()) {
      return std::any_of(type->begin(), type->end(),
                         [](const Json& t) { return t.is_string() && t == "object"; });
    }
  }
  return s.contains("properties");
}

struct Rules {
  bool all_required = false;
  bool forbid_composition = false;
  bool limits = false;
};

class Linter {
 public:
  explicit Linter(Rules rules) : rules_(rules) {}

  void LintRoot(const Json& schema) {
    if (!schema.is_object()) {
      Add("", "the schema is not a JSON object", "write the output schema as a JSON object");
      return;
    }
    if (schema.contains("anyOf")) {
      Add("", "the root schema is anyOf", "wrap the alternatives in a property of a root object");
    } else if (!IsObjectSchema(schema)) {
      Add("", "the root schema is not an object",
          "make the root {\"type\": \"object\", ...} and put the value in a property");
    }
    Walk(schema, "", 0);
    if (rules_.limits) CheckTotals();
  }

  std::vector<LintIssue> Take() { return std::move(issues_); }

 private:
  void Add(std::string pointer, std::string problem, std::string fix) {
    issues_.push_back({std::move(pointer), std::move(problem), std::move(fix)});
  }

  void Walk(const Json& s, const std::string& ptr, int parent_depth) {
    if (!s.is_object()) return;  // true/false schemas
    int depth = parent_depth;
    if (IsObjectSchema(s)) {
      depth = parent_depth + 1;
      CheckObject(s, ptr, depth);
    }
    if (rules_.forbid_composition) {
      static constexpr std::array<std::string_view, 7> kUnsupported = {
          "allOf", "not", "if", "then", "else", "dependentRequired", "dependentSchemas"};
      for (std::string_view kw : kUnsupported) {
        if (s.contains(kw)) {
          Add(Child(ptr, kw), "'" + std::string(kw) + "' is not supported in strict mode",
              kw == "allOf" ? "merge the subschemas into one object schema"
                            : "remove '" + std::string(kw) + "' and check the rule in code " +
                                  "(policies) instead");
        }
      }
    }
    if (rules_.limits) CountStrings(s);

    // Subschemas.
    for (const char* kw :
         {"properties", "$defs", "definitions", "patternProperties", "dependentSchemas"}) {
      auto it = s.find(kw);
      if (it == s.end() || !it->is_object()) continue;
      std::string base = Child(ptr, kw);
      bool defs = std::string_view(kw) == "$defs" || std::string_view(kw) == "definitions";
      for (auto& [name, sub] : it->items()) {
        if (rules_.limits && defs) total_chars_ += name.size();
        // Definitions are referenced from unknown depths: count them from the top.
        Walk(sub, Child(base, name), defs ? 0 : depth);
      }
    }
    for (const char* kw : {"anyOf", "oneOf", "allOf", "prefixItems"}) {
      auto it = s.find(kw);
      if (it == s.end() || !it->is_array()) continue;
      for (size_t i = 0; i < it->size(); ++i) {
        Walk((*it)[i], Child(Child(ptr, kw), std::to_string(i)), depth);
      }
    }
    for (const char* kw : {"items", "additionalProperties", "not", "if", "then", "else", "contains",
                           "unevaluatedProperties", "propertyNames"}) {
      auto it = s.find(kw);
      if (it == s.end()) continue;
      if (it->is_object()) {
        Walk(*it, Child(ptr, kw), depth);
      } else if (it->is_array() && std::string_view(kw) == "items") {
        for (size_t i = 0; i < it->size(); ++i) {
          Walk((*it)[i], Child(Child(ptr, kw), std::to_string(i)), depth);
        }
      }
    }
  }

  void CheckObject(const Json& s, const std::string& ptr, int depth) {
    auto ap = s.find("additionalProperties");
    if (ap == s.end()) {
      Add(ptr, "object without \"additionalProperties\": false",
          "add \"additionalProperties\": false");
    } else if (!(ap->is_boolean() && !ap->get<bool>())) {
      Add(Child(ptr, "additionalProperties"), "additionalProperties is not false",
          "set \"additionalProperties\": false and list every allowed key in properties");
    }
    const Json* props = nullptr;
    if (auto it = s.find("properties"); it != s.end() && it->is_object()) props = &*it;
    if (rules_.all_required && props != nullptr) {
      const Json* required = nullptr;
      if (auto it = s.find("required"); it != s.end() && it->is_array()) required = &*it;
      for (auto& [name, sub] : props->items()) {
        const std::string& key = name;  // clang 14 cannot capture a structured binding
        bool listed = required != nullptr &&
                      std::any_of(required->begin(), required->end(),
                                  [&](const Json& r) { return r.is_string() && r == key; });
        if (!listed) {
          Add(Child(Child(ptr, "properties"), name),
              "property '" + name + "' is not listed in required",
              "add '" + name + "' to required; to keep it optional, allow null: " +
                  "\"type\": [<type>, \"null\"]");
        }
      }
    }
    if (rules_.limits) {
      if (props != nullptr) {
        total_properties_ += props->size();
        for (auto& [name, sub] : props->items()) total_chars_ += name.size();
      }
      if (depth > kMaxObjectDepth && !depth_reported_) {
        depth_reported_ = true;
        Add(ptr,
            "objects nest " + std::to_string(depth) + " levels deep; the limit is " +
                std::to_string(kMaxObjectDepth),
            "flatten the structure (move nested fields up or into arrays of flat objects)");
      }
    }
  }

  void CountStrings(const Json& s) {
    if (auto e = s.find("enum"); e != s.end() && e->is_array()) {
      total_enum_values_ += e->size();
      size_t chars = 0;
      for (const Json& v : *e) {
        if (v.is_string()) chars += v.get_ref<const std::string&>().size();
      }
      total_chars_ += chars;
      if (e->size() > kLargeEnumValues && chars > kMaxLargeEnumChars && !large_enum_reported_) {
        large_enum_reported_ = true;
        large_enum_issue_ = true;
      }
    }
    if (auto c = s.find("const"); c != s.end() && c->is_string()) {
      total_chars_ += c->get_ref<const std::string&>().size();
    }
  }

  void CheckTotals() {
    if (total_properties_ > kMaxProperties) {
      Add("",
          std::to_string(total_properties_) + " object properties in total; the limit is " +
              std::to_string(kMaxProperties),
          "split the step into smaller steps or simplify the output");
    }
    if (total_enum_values_ > kMaxEnumValues) {
      Add("",
          std::to_string(total_enum_values_) + " enum values in total; the limit is " +
              std::to_string(kMaxEnumValues),
          "replace large enums with strings checked in code (policies)");
    }
    if (total_chars_ > kMaxTotalStringChars) {
      Add("",
          std::to_string(total_chars_) +
              " characters of property names, definition names, enum and const values; the " +
              "limit is " + std::to_string(kMaxTotalStringChars),
          "shorten names or move long enums into checks in code");
    }
    if (large_enum_issue_) {
      Add("",
          "a string enum with more than " + std::to_string(kLargeEnumValues) +
              " values has more than " + std::to_string(kMaxLargeEnumChars) + " characters",
          "shorten the enum or check the value in code");
    }
  }

  Rules rules_;
  std::vector<LintIssue> issues_;
  size_t total_properties_ = 0;
  size_t total_enum_values_ = 0;
  size_t total_chars_ = 0;
  bool depth_reported_ = false;
  bool large_enum_reported_ = false;
  bool large_enum_issue_ = false;
};

}  // namespace

std::vector<LintIssue> LintForStrictMode(std::string_view provider_type, const Json& schema) {
  Rules rules;
  if (provider_type == "openai") {
    rules = {.all_required = true, .forbid_composition = true, .limits = true};
  } else if (provider_type == "anthropic") {
    rules = {};
  } else {
    return {};
  }
  Linter linter(rules);
  linter.LintRoot(schema);
  return linter.Take();
}

}  // namespace idem
