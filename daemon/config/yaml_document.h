// YamlDocument: a YAML file read as JSON, remembering the line each value
// came from, so that errors found later (by a JSON Schema or by resolution
// code) can say "FILE:LINE: /json/pointer: reason".
//
// Scalars are typed as YAML 1.2's core schema says, from the node's tag and
// style: a plain 12 is an integer, 1.5 / 1e3 / .inf a double, true / false a
// boolean, ~ / null / an empty value null; anything quoted ("1", '1') or in
// a block scalar (| or >) stays a string, and an explicit !!str / !!int /
// !!float / !!bool / !!null tag wins. (So yes / no / on / off are strings.)
// Mapping keys are always strings. A duplicate key, a non-scalar key, or
// nesting deeper than 64 levels is InvalidArgument.
//
// Used by the config loader and by file-driven components (the scripted
// provider's rules) so that every YAML file in idem reads the same way.
//
// Thread-safety: functions are pure; a YamlDocument is a value.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "daemon/core/json_schema.h"
#include "daemon/core/status.h"

namespace idem {

using Json = nlohmann::json;

struct YamlDocument {
  std::string source;                // the file name used in messages
  Json value;                        // the first document; null when empty
  std::map<std::string, int> lines;  // JSON pointer -> 1-based line of its key

  // The line of `pointer`, or of its nearest ancestor that has one; 0 when
  // nothing is known (an empty document).
  int LineOf(std::string_view pointer) const;

  // InvalidArgument "SOURCE:LINE: POINTER: reason" with field() = pointer.
  // The document itself is written "(root)".
  Status Error(std::string_view pointer, std::string_view reason) const;

  // OK, or InvalidArgument listing every schema error, one per line, each
  // as Error() formats it; field() is the first error's pointer.
  Status Check(const JsonSchema& schema) const;
};

// `source` names the text in messages (usually its path). Syntax errors are
// InvalidArgument "SOURCE:LINE: yaml syntax error: ...".
StatusOr<YamlDocument> ParseYaml(std::string_view text, std::string source);

// Reads `path` and parses it; `display_name` (default: `path`) is used in
// messages. InvalidArgument when it cannot be read ("SOURCE: cannot read:
// No such file or directory") or parsed.
StatusOr<YamlDocument> ReadYamlFile(const std::string& path, std::string display_name = {});

}  // namespace idem
