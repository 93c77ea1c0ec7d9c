#include "daemon/decide/value_checks.h"

#include <map>
#include <utility>

#include "daemon/config/yaml_document.h"
#include "daemon/core/json_schema.h"
#include "daemon/decide/jsonlogic.h"

namespace idem {
namespace {

// The shape of a policy file. Rules are checked by CheckJsonLogicRule, which
// knows the operators; the schema only says that a rule is present.
constexpr std::string_view kPolicySchema = R"json({
  "type": "object",
  "additionalProperties": false,
  "required": ["checks"],
  "properties": {
    "description": {"type": "string"},
    "data": {"type": "object"},
    "checks": {
      "type": "array",
      "minItems": 1,
      "items": {
        "type": "object",
        "additionalProperties": false,
        "required": ["name", "rule", "message"],
        "properties": {
          "name": {"type": "string", "pattern": "^[a-z][a-z0-9_]*$"},
          "rule": {},
          "message": {"type": "string", "minLength": 1},
          "pointer": {"type": "string", "pattern": "^(/([^~]|~[01])*)*$"}
        }
      }
    }
  }
})json";

StatusOr<const JsonSchema*> PolicySchema() {
  // Compiled once; a JsonSchema may be used from many threads.
  static const StatusOr<std::unique_ptr<JsonSchema>>* const schema =
      new StatusOr<std::unique_ptr<JsonSchema>>(JsonSchema::Create(Json::parse(kPolicySchema)));
  if (!schema->ok()) return schema->status().Annotate("value-check policy schema");
  return schema->value().get();
}

}  // namespace

StatusOr<std::unique_ptr<ValueChecks>> ValueChecks::Load(const std::string& path) {
  ASSIGN_OR_RETURN(YamlDocument doc, ReadYamlFile(path));
  return FromDocument(doc);
}

StatusOr<std::unique_ptr<ValueChecks>> ValueChecks::Parse(std::string_view yaml_text,
                                                          const std::string& source) {
  ASSIGN_OR_RETURN(YamlDocument doc, ParseYaml(yaml_text, source));
  return FromDocument(doc);
}

StatusOr<std::unique_ptr<ValueChecks>> ValueChecks::FromDocument(const YamlDocument& doc) {
  ASSIGN_OR_RETURN(const JsonSchema* schema, PolicySchema());
  RETURN_IF_ERROR(doc.Check(*schema));

  std::vector<Check> checks;
  std::map<std::string, size_t> index_of_name;
  const Json& items = doc.value["checks"];
  for (size_t i = 0; i < items.size(); ++i) {
    const Json& item = items[i];
    const std::string at = "/checks/" + std::to_string(i);
    Check check;
    check.name = item["name"].get<std::string>();
    check.rule = item["rule"];
    check.message = item["message"].get<std::string>();
    check.pointer = item.value("pointer", std::string());
    const auto [it, inserted] = index_of_name.emplace(check.name, i);
    if (!inserted) {
      return doc.Error(at + "/name", "duplicate check name '" + check.name +
                                         "' (first at /checks/" + std::to_string(it->second) + ")");
    }
    if (Status s = CheckJsonLogicRule(check.rule); !s.ok()) {
      return doc.Error(at + "/rule" + s.field(), s.message());
    }
    checks.push_back(std::move(check));
  }
  Json policy = doc.value.value("data", Json::object());
  return std::unique_ptr<ValueChecks>(
      new ValueChecks(doc.source, std::move(policy), std::move(checks)));
}

std::vector<CheckFailure> ValueChecks::Evaluate(const Json& output, const Json& input) const {
  const Json data = {{"output", output}, {"input", input}, {"policy", policy_}};
  std::vector<CheckFailure> failures;
  for (const Check& check : checks_) {
    StatusOr<Json> result = EvalJsonLogic(check.rule, data);
    if (!result.ok()) {
      failures.push_back({check.name,
                          check.message + " (check '" + check.name +
                              "' could not be evaluated: " + result.status().message() + ")",
                          check.pointer, /*rule_error=*/true});
    } else if (!JsonLogicTruthy(*result)) {
      failures.push_back({check.name, check.message, check.pointer, false});
    }
  }
  return failures;
}

}  // namespace idem
