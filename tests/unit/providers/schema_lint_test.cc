#include "providers/schema_lint.h"

#include <doctest/doctest.h>

#include <algorithm>

namespace idem {
namespace {

bool HasIssueAt(const std::vector<LintIssue>& issues, const std::string& pointer,
                const std::string& problem_part) {
  return std::any_of(issues.begin(), issues.end(), [&](const LintIssue& i) {
    return i.pointer == pointer && i.problem.find(problem_part) != std::string::npos &&
           !i.fix.empty();
  });
}

Json StrictObject(Json properties) {
  Json required = Json::array();
  for (auto& [name, _] : properties.items()) required.push_back(name);
  return {{"type", "object"},
          {"properties", std::move(properties)},
          {"required", std::move(required)},
          {"additionalProperties", false}};
}

// An object nested `levels` deep (the root counts as level 1).
Json Nested(int levels) {
  Json s = StrictObject({{"leaf", {{"type", "string"}}}});
  for (int i = 1; i < levels; ++i) s = StrictObject({{"child", s}});
  return s;
}

TEST_CASE("a schema inside OpenAI's strict subset has no issues") {
  Json schema = Json::parse(R"({
    "type": "object",
    "properties": {
      "label": {"type": "string", "enum": ["billing", "bug"]},
      "note": {"type": ["string", "null"]},
      "actions": {"type": "array", "items": {
        "type": "object",
        "properties": {"kind": {"type": "string"}, "args": {"anyOf": [
          {"type": "string"},
          {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"],
           "additionalProperties": false}]}},
        "required": ["kind", "args"],
        "additionalProperties": false}}
    },
    "required": ["label", "note", "actions"],
    "additionalProperties": false,
    "$defs": {"unused": {"type": "string"}}
  })");
  CHECK(LintForStrictMode("openai", schema).empty());
}

TEST_CASE("every object needs additionalProperties false, with the pointer to it") {
  Json schema = StrictObject({{"customer",
                               {{"type", "object"},
                                {"properties", {{"name", {{"type", "string"}}}}},
                                {"required", {"name"}}}}});
  auto issues = LintForStrictMode("openai", schema);
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].pointer == "/properties/customer");
  CHECK(issues[0].problem.find("additionalProperties") != std::string::npos);
  CHECK(issues[0].fix == "add \"additionalProperties\": false");

  schema["additionalProperties"] = true;
  CHECK(HasIssueAt(LintForStrictMode("openai", schema), "/additionalProperties", "not false"));
}

TEST_CASE("every property must be required in OpenAI strict mode") {
  Json schema = StrictObject({{"a", {{"type", "string"}}}, {"b/c", {{"type", "string"}}}});
  schema["required"] = {"a"};
  auto issues = LintForStrictMode("openai", schema);
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].pointer == "/properties/b~1c");  // RFC 6901 escaping
  CHECK(issues[0].fix.find("null") != std::string::npos);
}

TEST_CASE("unsupported composition keywords are reported") {
  Json schema = StrictObject({{"a", {{"allOf", Json::array({{{"type", "string"}}})}}},
                              {"b", {{"type", "string"}, {"not", {{"const", "x"}}}}}});
  schema["if"] = {{"properties", Json::object()}};
  schema["then"] = Json::object();
  schema["dependentRequired"] = {{"a", {"b"}}};
  auto issues = LintForStrictMode("openai", schema);
  CHECK(HasIssueAt(issues, "/properties/a/allOf", "not supported"));
  CHECK(HasIssueAt(issues, "/properties/b/not", "not supported"));
  CHECK(HasIssueAt(issues, "/if", "not supported"));
  CHECK(HasIssueAt(issues, "/then", "not supported"));
  CHECK(HasIssueAt(issues, "/dependentRequired", "not supported"));
}

TEST_CASE("the root must be an object schema") {
  CHECK(HasIssueAt(LintForStrictMode("openai", {{"type", "array"}, {"items", Json::object()}}), "",
                   "not an object"));
  Json any_of = {{"anyOf", Json::array({StrictObject({{"a", {{"type", "string"}}}}),
                                        StrictObject({{"b", {{"type", "string"}}}})})}};
  CHECK(HasIssueAt(LintForStrictMode("openai", any_of), "", "anyOf"));
  CHECK(HasIssueAt(LintForStrictMode("openai", Json::array()), "", "not a JSON object"));
}

TEST_CASE("object nesting deeper than 10 levels is reported once") {
  CHECK(LintForStrictMode("openai", Nested(10)).empty());
  auto issues = LintForStrictMode("openai", Nested(12));
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].problem.find("11 levels") != std::string::npos);
  CHECK(issues[0].pointer.find("/properties/child") == 0);
}

TEST_CASE("size limits: enum values and properties in total") {
  Json big_enum = Json::array();
  for (int i = 0; i < 1001; ++i) big_enum.push_back("v" + std::to_string(i));
  Json schema = StrictObject({{"e", {{"type", "string"}, {"enum", big_enum}}}});
  CHECK(HasIssueAt(LintForStrictMode("openai", schema), "", "1001 enum values"));

  Json props = Json::object();
  for (int i = 0; i < 5001; ++i) props["p" + std::to_string(i)] = {{"type", "string"}};
  CHECK(HasIssueAt(LintForStrictMode("openai", StrictObject(props)), "", "5001 object properties"));
}

TEST_CASE("Anthropic native mode checks additionalProperties only") {
  Json schema = {
      {"type", "object"}, {"properties", {{"a", {{"type", "string"}}}}}, {"allOf", Json::array()}};
  auto issues = LintForStrictMode("anthropic", schema);
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].pointer == "");
  CHECK(issues[0].problem.find("additionalProperties") != std::string::npos);
}

TEST_CASE("other providers are not linted") {
  CHECK(LintForStrictMode("openai_compatible", {{"type", "string"}}).empty());
  CHECK(LintForStrictMode("scripted", Json::array()).empty());
}

}  // namespace
}  // namespace idem
