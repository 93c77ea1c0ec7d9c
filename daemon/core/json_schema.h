// JsonSchema: a compiled JSON Schema (draft 7) that checks JSON documents.
//
// Every schema check in the daemon goes through this class: API bodies, the
// config file, scripted-provider rules and model outputs. It is the one
// adapter over valijson; no valijson type or exception leaves it.
//
// Create parses the schema once; a schema valijson rejects (unknown type
// name, malformed keyword, unresolvable $ref) is InvalidArgument. Only local
// references ("#/definitions/...") resolve; remote ones are rejected.
//
// Validate and Errors report each failure with an RFC 6901 JSON pointer into
// the checked document and a short reason, for example
//   {"/server/threads", "must be <= 4096"}
//   {"/server/colour", "unknown key"}
//   {"/steps/triage/prompt", "missing required key 'version'"}
// Errors that only repeat a deeper failure ("failed to validate property x")
// are left out, so each entry is one thing to fix. The reasons are written
// for people; do not parse them. Of the `format` keywords, only "date",
// "time" and "date-time" are checked (RFC 3339, read by hand), so
// "email-like" belongs to the value checks. `pattern` is matched by PCRE2
// as ECMAScript would (unanchored, `$` only at the very end, \uXXXX),
// within 10 million backtracking steps and 64 MiB per value: a value past
// them fails the check with that reason. A schema with patternProperties
// refuses any key longer than 1,024 bytes (valijson matches keys with
// std::regex, whose recursion a long key would take past the stack).
//
// Thread-safety: a JsonSchema is immutable after Create; Validate and Errors
// may be called concurrently from any number of threads on one instance.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "daemon/core/status.h"

namespace idem {

using Json = nlohmann::json;

struct SchemaError {
  std::string pointer;  // RFC 6901; "" is the document itself
  std::string message;
};

class JsonSchema {
 public:
  // InvalidArgument when `schema` is not a usable draft-7 schema.
  static StatusOr<std::unique_ptr<JsonSchema>> Create(const Json& schema);

  ~JsonSchema();
  JsonSchema(const JsonSchema&) = delete;
  JsonSchema& operator=(const JsonSchema&) = delete;

  // OK when `doc` satisfies the schema. Otherwise InvalidArgument whose
  // message joins all errors ("/a: reason; /b: reason") and whose field()
  // is the pointer of the first error.
  Status Validate(const Json& doc) const;

  // Every error, in document order as valijson reports them; empty when
  // `doc` is valid.
  std::vector<SchemaError> Errors(const Json& doc) const;

  // The schema this was created from.
  const Json& schema() const { return schema_; }

  // A schema that uses only type, required, properties,
  // additionalProperties (true or false), minLength and maxLength (and
  // annotations such as description), at every level, also gets a direct
  // check that Validate and Errors try first: it answers only "valid", and
  // whatever it does not accept (1.0 for an integer, for one) goes to
  // valijson, which decides and explains. DirectlyAccepts(doc) implies
  // valijson accepts doc (tests/fuzz/fuzz_json_schema.cc holds it to that).
  bool HasDirectCheck() const;
  bool DirectlyAccepts(const Json& doc) const;

 private:
  struct Compiled;
  JsonSchema(Json schema, std::unique_ptr<Compiled> compiled);

  const Json schema_;
  const std::unique_ptr<Compiled> compiled_;
};

}  // namespace idem
