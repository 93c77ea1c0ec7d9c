// ValueChecks: the value checks of one LLM step (R31), read from a policy
// file and evaluated on each output that passed the step's JSON Schema.
//
// A policy file is YAML (read with daemon/config/yaml_document.h):
//
//   data:                       # optional constants, seen by rules as policy.*
//     allowed_action_kinds: [send_reply]
//   checks:                     # at least one
//     - name: summary_not_empty           # [a-z][a-z0-9_]*, unique
//       rule: {"!!": {"var": "output.summary"}}   # JSONLogic (jsonlogic.h)
//       message: summary must not be empty         # said to the model on repair
//       pointer: /summary                  # optional JSON pointer into the output
//     description: ...                     # optional, for people
//
// Each rule is applied to {"output": <output>, "input": <normalized input>,
// "policy": <data>}. A check fails when its rule's result is falsy in
// JSONLogic's sense (null, false, 0, "", []), or when the rule cannot be
// evaluated (a JavaScript TypeError in json-logic-js, or a limit); then the
// message says so and rule_error is set, since the policy, not the model, is
// at fault, though the output is still not accepted.
//
// Load fails with InvalidArgument "FILE:LINE: POINTER: reason" (field() is
// the pointer in the file) when the file cannot be read or parsed, does not
// have the shape above (unknown keys are errors), repeats a check name, or
// has a rule with an unknown operator (`method` included) or nested deeper
// than the evaluator allows. An operator that only a later evaluation would
// reach is rejected at load time, so a typo cannot hide in an `if` branch.
//
// Thread-safety: a loaded ValueChecks is immutable; Evaluate may be called
// from any number of threads at once.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/core/status.h"

namespace idem {

using Json = nlohmann::json;
struct YamlDocument;

struct CheckFailure {
  std::string name;         // the check's name
  std::string message;      // the check's message; with the reason when rule_error
  std::string pointer;      // JSON pointer into the output; "" is the whole output
  bool rule_error = false;  // the rule could not be evaluated
};

class ValueChecks {
 public:
  // Reads and checks the policy file at `path` (named so in messages).
  static StatusOr<std::unique_ptr<ValueChecks>> Load(const std::string& path);

  // The same from text; `source` names it in messages.
  static StatusOr<std::unique_ptr<ValueChecks>> Parse(std::string_view yaml_text,
                                                      const std::string& source);

  ValueChecks(const ValueChecks&) = delete;
  ValueChecks& operator=(const ValueChecks&) = delete;

  // Every failing check, in file order; empty when all pass.
  std::vector<CheckFailure> Evaluate(const Json& output, const Json& input) const;

  // The number of checks, and the file they came from.
  size_t size() const { return checks_.size(); }
  const std::string& source() const { return source_; }

 private:
  struct Check {
    std::string name;
    Json rule;
    std::string message;
    std::string pointer;
  };

  static StatusOr<std::unique_ptr<ValueChecks>> FromDocument(const YamlDocument& doc);

  ValueChecks(std::string source, Json policy, std::vector<Check> checks)
      : source_(std::move(source)), policy_(std::move(policy)), checks_(std::move(checks)) {}

  const std::string source_;
  const Json policy_;
  const std::vector<Check> checks_;
};

}  // namespace idem
