#include "providers/scripted/scripted_provider.h"

#include <kainjow/mustache.hpp>
#include <optional>
#include <regex>
#include <utility>

#include "daemon/config/yaml_document.h"
#include "daemon/core/json.h"
#include "daemon/core/json_schema.h"

namespace idem {
namespace {

constexpr size_t kMaxRegexSubject = 4096;
constexpr const char* kDefaultFinishReason = "stop";

// The shape of a rules file; semantic checks (pointers, regexes, templates)
// follow in Compile.
constexpr std::string_view kRulesSchema = R"json({
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "rules": {"type": "array", "items": {"$ref": "#/definitions/rule"}},
    "default": {"$ref": "#/definitions/answer"}
  },
  "definitions": {
    "condition": {
      "type": "object",
      "additionalProperties": false,
      "properties": {
        "equals": {},
        "contains": {"type": "string"},
        "regex": {"type": "string", "maxLength": 256},
        "exists": {"type": "boolean"},
        "ignore_case": {"type": "boolean"}
      }
    },
    "fail": {
      "type": "object",
      "additionalProperties": false,
      "required": ["code"],
      "properties": {
        "code": {"type": "string", "enum": ["unavailable", "deadline_exceeded",
          "resource_exhausted", "invalid_argument", "internal", "permission_denied",
          "unauthenticated"]},
        "message": {"type": "string"},
        "retryable": {"type": "boolean"}
      }
    },
    "answer": {
      "type": "object",
      "additionalProperties": false,
      "properties": {
        "output": {"type": ["string", "object", "array"]},
        "fail": {"$ref": "#/definitions/fail"},
        "delay_ms": {"type": "integer", "minimum": 0, "maximum": 86400000},
        "finish_reason": {"type": "string", "minLength": 1}
      }
    },
    "rule": {
      "type": "object",
      "additionalProperties": false,
      "properties": {
        "name": {"type": "string"},
        "match": {
          "type": "object",
          "additionalProperties": false,
          "properties": {
            "step": {"type": "string"},
            "model": {"type": "string"},
            "repair": {"type": "boolean"},
            "input": {"type": "object", "additionalProperties": {"$ref": "#/definitions/condition"}},
            "prompt": {"$ref": "#/definitions/condition"}
          }
        },
        "output": {"type": ["string", "object", "array"]},
        "fail": {"$ref": "#/definitions/fail"},
        "delay_ms": {"type": "integer", "minimum": 0, "maximum": 86400000},
        "times": {"type": "integer", "minimum": 1},
        "finish_reason": {"type": "string", "minLength": 1}
      }
    }
  }
})json";

const JsonSchema& RulesSchema() {
  // Built in and tested; failing to compile it is a broken invariant.
  static const std::unique_ptr<JsonSchema> schema = [] {
    auto created = JsonSchema::Create(Json::parse(kRulesSchema));
    if (!created.ok()) std::abort();
    return std::move(created).value();
  }();
  return *schema;
}

std::string FoldCase(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

// {{x}} in an output template lands inside a JSON string literal.
std::string EscapeForJsonString(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  AppendJsonStringContent(s, out);
  return out;
}

kainjow::mustache::data ToMustache(const Json& value) {
  using kainjow::mustache::data;
  switch (value.type()) {
    case Json::value_t::object: {
      data d{data::type::object};
      for (auto it = value.begin(); it != value.end(); ++it) d.set(it.key(), ToMustache(*it));
      return d;
    }
    case Json::value_t::array: {
      data d{data::type::list};
      for (const Json& item : value) d.push_back(ToMustache(item));
      return d;
    }
    case Json::value_t::string:
      return data(value.get<std::string>());
    case Json::value_t::boolean:
      return data(value.get<bool>());
    case Json::value_t::null:
      return data(false);
    default:
      return data(value.dump());  // numbers, as JSON writes them
  }
}

struct Failure {
  Code code;
  std::string message;
  bool retryable;
};

std::optional<Code> FailureCode(const std::string& name) {
  if (name == "unavailable") return Code::kUnavailable;
  if (name == "deadline_exceeded") return Code::kDeadlineExceeded;
  if (name == "resource_exhausted") return Code::kResourceExhausted;
  if (name == "invalid_argument") return Code::kInvalidArgument;
  if (name == "internal") return Code::kInternal;
  if (name == "permission_denied") return Code::kPermissionDenied;
  if (name == "unauthenticated") return Code::kUnauthenticated;
  return std::nullopt;
}

bool RetryableByDefault(Code code) {
  return code == Code::kUnavailable || code == Code::kDeadlineExceeded ||
         code == Code::kResourceExhausted;
}

}  // namespace

struct ScriptedProvider::Rule {
  struct Condition {
    Json::json_pointer pointer;
    std::optional<Json> equals;
    std::optional<std::string> contains;  // folded when ignore_case
    std::optional<std::regex> regex;
    std::optional<bool> exists;
    bool ignore_case = false;
  };

  std::string name;
  std::optional<std::string> step;
  std::optional<std::string> model;
  std::optional<bool> repair;
  std::vector<Condition> conditions;
  std::optional<Condition> prompt;  // on the rendered prompt text (pointer "")

  // The answer: exactly one of output (a template or a JSON value of
  // templates) and failure.
  bool output_is_text = true;
  std::string output_text;
  Json output_value;
  std::optional<Failure> failure;
  int64_t delay_ms = 0;
  std::string finish_reason = kDefaultFinishReason;

  int64_t times = 0;  // 0: unlimited
  std::atomic<int64_t> used{0};

  bool Matches(const ProviderRequest& request) const {
    if (step && *step != request.step) return false;
    if (model && *model != request.model) return false;
    if (repair && *repair != !request.repair_feedback.empty()) return false;
    for (const Condition& c : conditions) {
      if (!Holds(c, request.input)) return false;
    }
    if (prompt && !Holds(*prompt, Json(request.prompt))) return false;
    return true;
  }

  static bool Holds(const Condition& c, const Json& input) {
    const Json* value = nullptr;
    try {
      if (input.contains(c.pointer)) value = &input.at(c.pointer);
    } catch (const std::exception&) {
      // A pointer that does not fit the input's shape names nothing.
    }
    if (c.exists && *c.exists != (value != nullptr)) return false;
    if (c.equals) {
      if (value == nullptr) return false;
      if (c.ignore_case && value->is_string() && c.equals->is_string()) {
        if (FoldCase(value->get_ref<const std::string&>()) !=
            FoldCase(c.equals->get_ref<const std::string&>())) {
          return false;
        }
      } else if (*value != *c.equals) {
        return false;
      }
    }
    if (c.contains) {
      if (value == nullptr || !value->is_string()) return false;
      const std::string& s = value->get_ref<const std::string&>();
      if ((c.ignore_case ? FoldCase(s) : s).find(*c.contains) == std::string::npos) return false;
    }
    if (c.regex) {
      if (value == nullptr || !value->is_string()) return false;
      const std::string& s = value->get_ref<const std::string&>();
      const size_t n = Utf8Prefix(s, kMaxRegexSubject).size();
      try {
        if (!std::regex_search(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(n), *c.regex)) {
          return false;
        }
      } catch (const std::regex_error&) {
        return false;  // error_complexity / error_stack: treat as no match
      }
    }
    return true;
  }

  // Counts a use against `times`; false when the rule is used up.
  bool Claim() {
    if (times == 0) return true;
    return used.fetch_add(1) < times;
  }

  static StatusOr<std::unique_ptr<Rule>> Compile(const YamlDocument& doc, const std::string& at,
                                                 const Json& node);
  static StatusOr<Condition> CompileCondition(const YamlDocument& doc, const std::string& where,
                                              Json::json_pointer pointer, const Json& spec);
  static Status CompileAnswer(const YamlDocument& doc, const std::string& at, const Json& node,
                              Rule& rule);
};

namespace {

Status CheckTemplate(const YamlDocument& doc, const std::string& at, const std::string& text) {
  kainjow::mustache::mustache compiled(text);
  if (!compiled.is_valid()) {
    return doc.Error(at, "not a valid mustache template: " + compiled.error_message());
  }
  return Status::Ok();
}

Status CheckTemplates(const YamlDocument& doc, const std::string& at, const Json& value) {
  if (value.is_string()) return CheckTemplate(doc, at, value.get<std::string>());
  if (value.is_object()) {
    for (auto it = value.begin(); it != value.end(); ++it) {
      RETURN_IF_ERROR(CheckTemplates(doc, at + "/" + JsonPointerToken(it.key()), *it));
    }
  } else if (value.is_array()) {
    for (size_t i = 0; i < value.size(); ++i) {
      RETURN_IF_ERROR(CheckTemplates(doc, at + "/" + std::to_string(i), value[i]));
    }
  }
  return Status::Ok();
}

// Renders `text` with `data`; `escape` decides what {{x}} does.
StatusOr<std::string> Render(const std::string& text, const kainjow::mustache::data& data,
                             bool json_string_escape) {
  kainjow::mustache::mustache tmpl(text);
  if (json_string_escape) {
    tmpl.set_custom_escape(EscapeForJsonString);
  } else {
    tmpl.set_custom_escape([](const std::string& s) { return s; });
  }
  std::string out = tmpl.render(data);
  if (!tmpl.is_valid()) return Internal("scripted output template: " + tmpl.error_message());
  return out;
}

StatusOr<Json> RenderValue(const Json& value, const kainjow::mustache::data& data) {
  if (value.is_string()) {
    ASSIGN_OR_RETURN(std::string text, Render(value.get<std::string>(), data, false));
    return Json(std::move(text));
  }
  if (value.is_object()) {
    Json out = Json::object();
    for (auto it = value.begin(); it != value.end(); ++it) {
      ASSIGN_OR_RETURN(out[it.key()], RenderValue(*it, data));
    }
    return out;
  }
  if (value.is_array()) {
    Json out = Json::array();
    for (const Json& item : value) {
      ASSIGN_OR_RETURN(Json rendered, RenderValue(item, data));
      out.push_back(std::move(rendered));
    }
    return out;
  }
  return value;
}

}  // namespace

// Reads the answer part of a rule (or the default) at `at` into `rule`.
Status ScriptedProvider::Rule::CompileAnswer(const YamlDocument& doc, const std::string& at,
                                             const Json& node, Rule& rule) {
  const bool has_output = node.contains("output");
  const bool has_fail = node.contains("fail");
  if (has_output == has_fail) {
    return doc.Error(at, "needs exactly one of output and fail");
  }
  if (has_output) {
    const Json& output = node["output"];
    rule.output_is_text = output.is_string();
    if (rule.output_is_text) {
      rule.output_text = output.get<std::string>();
      RETURN_IF_ERROR(CheckTemplate(doc, at + "/output", rule.output_text));
    } else {
      rule.output_value = output;
      RETURN_IF_ERROR(CheckTemplates(doc, at + "/output", output));
    }
  } else {
    const Json& fail = node["fail"];
    Failure failure;
    failure.code = *FailureCode(fail["code"].get<std::string>());  // the schema's enum
    failure.message = fail.value(
        "message", "scripted failure" + (rule.name.empty() ? "" : " (rule " + rule.name + ")"));
    failure.retryable = fail.value("retryable", RetryableByDefault(failure.code));
    rule.failure = std::move(failure);
  }
  rule.delay_ms = node.value("delay_ms", int64_t{0});
  rule.finish_reason = node.value("finish_reason", std::string(kDefaultFinishReason));
  return Status::Ok();
}

StatusOr<std::unique_ptr<ScriptedProvider::Rule>> ScriptedProvider::Rule::Compile(
    const YamlDocument& doc, const std::string& at, const Json& node) {
  auto rule = std::make_unique<Rule>();
  rule->name = node.value("name", "");
  rule->times = node.value("times", int64_t{0});
  if (node.contains("match")) {
    const Json& match = node["match"];
    if (match.contains("step")) rule->step = match["step"].get<std::string>();
    if (match.contains("model")) rule->model = match["model"].get<std::string>();
    if (match.contains("repair")) rule->repair = match["repair"].get<bool>();
    if (match.contains("prompt")) {
      ASSIGN_OR_RETURN(Condition c, CompileCondition(doc, at + "/match/prompt",
                                                     Json::json_pointer(), match["prompt"]));
      rule->prompt = std::move(c);
    }
    if (match.contains("input")) {
      for (const auto& [key, spec] : match["input"].items()) {
        const std::string where = at + "/match/input/" + JsonPointerToken(key);
        const std::string pointer =
            !key.empty() && key[0] == '/' ? key : "/" + JsonPointerToken(key);
        Json::json_pointer parsed;
        try {
          parsed = Json::json_pointer(pointer);
        } catch (const std::exception& e) {
          return doc.Error(where, "not a JSON pointer: " + std::string(e.what()));
        }
        ASSIGN_OR_RETURN(Condition c, CompileCondition(doc, where, std::move(parsed), spec));
        rule->conditions.push_back(std::move(c));
      }
    }
  }
  RETURN_IF_ERROR(CompileAnswer(doc, at, node, *rule));
  return rule;
}

StatusOr<ScriptedProvider::Rule::Condition> ScriptedProvider::Rule::CompileCondition(
    const YamlDocument& doc, const std::string& where, Json::json_pointer pointer,
    const Json& spec) {
  Condition c;
  c.pointer = std::move(pointer);
  c.ignore_case = spec.value("ignore_case", false);
  if (spec.contains("equals")) c.equals = spec["equals"];
  if (spec.contains("contains")) {
    const std::string text = spec["contains"].get<std::string>();
    c.contains = c.ignore_case ? FoldCase(text) : text;
  }
  if (spec.contains("exists")) c.exists = spec["exists"].get<bool>();
  if (spec.contains("regex")) {
    auto flags = std::regex::ECMAScript | std::regex::optimize;
    if (c.ignore_case) flags |= std::regex::icase;
    try {
      c.regex.emplace(spec["regex"].get<std::string>(), flags);
    } catch (const std::regex_error& e) {
      return doc.Error(where + "/regex",
                       "not a valid regular expression: " + std::string(e.what()));
    }
  }
  if (!c.equals && !c.contains && !c.regex && !c.exists) {
    return doc.Error(where, "needs equals, contains, regex or exists");
  }
  return c;
}

ScriptedProvider::ScriptedProvider(Env& env, std::vector<std::unique_ptr<Rule>> rules,
                                   std::unique_ptr<Rule> fallback)
    : env_(env), rules_(std::move(rules)), default_(std::move(fallback)) {}

ScriptedProvider::~ScriptedProvider() = default;

StatusOr<std::unique_ptr<ScriptedProvider>> ScriptedProvider::Create(const ProviderConfig& config,
                                                                     Env& env) {
  if (config.rules_path.empty()) {
    return InvalidArgument("scripted provider " + config.name + " has no rules file");
  }
  ASSIGN_OR_RETURN(YamlDocument doc, ReadYamlFile(config.rules_path));
  return Build(doc, env);
}

StatusOr<std::unique_ptr<ScriptedProvider>> ScriptedProvider::FromYaml(std::string_view yaml,
                                                                       std::string source,
                                                                       Env& env) {
  ASSIGN_OR_RETURN(YamlDocument doc, ParseYaml(yaml, std::move(source)));
  return Build(doc, env);
}

StatusOr<std::unique_ptr<ScriptedProvider>> ScriptedProvider::Build(const YamlDocument& doc,
                                                                    Env& env) {
  if (!doc.value.is_null()) RETURN_IF_ERROR(doc.Check(RulesSchema()));
  const Json root = doc.value.is_null() ? Json::object() : doc.value;
  std::vector<std::unique_ptr<Rule>> rules;
  std::unique_ptr<Rule> fallback;
  // A schema-valid document has the types read below; nlohmann throws only
  // if that promise is broken.
  try {
    if (root.contains("rules")) {
      for (size_t i = 0; i < root["rules"].size(); ++i) {
        ASSIGN_OR_RETURN(auto rule,
                         Rule::Compile(doc, "/rules/" + std::to_string(i), root["rules"][i]));
        rules.push_back(std::move(rule));
      }
    }
    if (root.contains("default")) {
      fallback = std::make_unique<Rule>();
      fallback->name = "default";
      RETURN_IF_ERROR(Rule::CompileAnswer(doc, "/default", root["default"], *fallback));
    }
  } catch (const std::exception& e) {
    return Internal(doc.source + ": rules passed their schema but could not be read: " + e.what());
  }
  return std::unique_ptr<ScriptedProvider>(
      new ScriptedProvider(env, std::move(rules), std::move(fallback)));
}

StatusOr<ProviderResponse> ScriptedProvider::Complete(const ProviderRequest& request) {
  calls_.fetch_add(1);
  Rule* answer = nullptr;
  for (const auto& rule : rules_) {
    if (rule->Matches(request) && rule->Claim()) {
      answer = rule.get();
      break;
    }
  }
  if (answer == nullptr) answer = default_.get();
  if (answer == nullptr) {
    return FailedPrecondition("scripted provider: no rule matches step '" + request.step +
                              "' and there is no default");
  }

  if (answer->delay_ms > 0) {
    if (request.timeout_ms > 0 && answer->delay_ms > request.timeout_ms) {
      env_.SleepMillis(request.timeout_ms);
      return DeadlineExceeded("scripted provider: no answer within " +
                              std::to_string(request.timeout_ms) + " ms");
    }
    env_.SleepMillis(answer->delay_ms);
  }
  if (answer->failure) {
    const Failure& f = *answer->failure;
    return Status(f.code, f.message, {}, f.retryable);
  }

  kainjow::mustache::data data{kainjow::mustache::data::type::object};
  data.set("input", ToMustache(request.input));
  data.set("input_json", kainjow::mustache::data(request.input.dump()));
  data.set("step", kainjow::mustache::data(request.step));
  data.set("model", kainjow::mustache::data(request.model));
  data.set("repair_feedback", kainjow::mustache::data(request.repair_feedback));

  ProviderResponse response;
  if (answer->output_is_text) {
    ASSIGN_OR_RETURN(response.raw_text, Render(answer->output_text, data, true));
    response.output = Json::parse(response.raw_text, nullptr, /*allow_exceptions=*/false);
    if (response.output.is_discarded()) response.output = nullptr;
  } else {
    ASSIGN_OR_RETURN(response.output, RenderValue(answer->output_value, data));
    response.raw_text = response.output.dump();
  }
  response.finish_reason = answer->finish_reason;
  response.input_tokens =
      static_cast<int64_t>((request.system_prompt.size() + request.prompt.size() + 3) / 4);
  response.output_tokens = static_cast<int64_t>((response.raw_text.size() + 3) / 4);
  return response;
}

}  // namespace idem
