// Schema lint: does an output schema fit a provider's strict structured-output
// mode? Strict modes accept only a subset of JSON Schema and answer a schema
// outside it with a 400 at request time; this finds the problems at start-up
// (`idem doctor`, config load) with a pointer and a fix for each.
//
// "openai" (Structured Outputs, strict: true; limits as documented by
// OpenAI's Structured Outputs guide, "Supported schemas"):
//   - the root is an object schema, not anyOf;
//   - every object sets additionalProperties: false;
//   - every object lists all of its properties in required (an optional
//     field is expressed as a union with null, e.g. type: ["string","null"]);
//   - none of allOf, not, if, then, else, dependentRequired,
//     dependentSchemas;
//   - at most 10 levels of object nesting (counted from the root object,
//     which is level 1; a $defs entry counts from level 1 as well, since
//     where it is referenced is not resolved here);
//   - at most 5000 object properties in total, at most 1000 enum values in
//     total, at most 120000 characters of property names, definition names,
//     enum and const values, and at most 15000 characters across one string
//     enum of more than 250 values.
// "anthropic" (native structured outputs, output_config.format):
//   - the root is an object schema;
//   - every object sets additionalProperties: false.
//   (The default forced-tool-use mode takes any input_schema.)
// Any other provider type: no issues (their servers differ too much to
// promise anything; the decide engine validates every output anyway).
//
// Thread-safety: a pure function.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace idem {

using Json = nlohmann::json;

struct LintIssue {
  std::string pointer;  // JSON pointer (RFC 6901) into the schema; "" is the root
  std::string problem;  // what is wrong, in one sentence
  std::string fix;      // what to change
};

std::vector<LintIssue> LintForStrictMode(std::string_view provider_type, const Json& schema);

}  // namespace idem
