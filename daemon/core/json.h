// JSON at the edge of the daemon: parsing untrusted text with limits, and
// RFC 8785 (JCS) canonical serialization for hashing.
//
// ParseJson rejects, with InvalidArgument and a message that says where:
//   - syntax errors (with the byte offset),
//   - invalid UTF-8 and lone surrogate escapes,
//   - duplicate member names (field() is the JSON pointer of the duplicate),
// and with ResourceExhausted: text longer than limits.max_bytes, nesting
// deeper than limits.max_depth (checked while parsing, before the value is
// built, so a hostile body cannot exhaust the stack or memory).
//
// CanonicalJson returns the RFC 8785 form: members sorted by their UTF-16
// code units, numbers in ECMAScript Number-to-String form (integers are
// treated as IEEE-754 doubles, as JCS requires), strings with the minimal
// escaping of RFC 8785 section 3.2.2.2. NaN or infinities are
// InvalidArgument (nlohmann can hold them; JSON cannot).
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "daemon/core/status.h"

namespace idem {

using Json = nlohmann::json;

struct JsonLimits {
  size_t max_bytes = 1 << 20;
  int max_depth = 64;
  // Refuse (InvalidArgument at its pointer) an integer literal that does
  // not fit 64 bits: it could only be kept as a rounded double, and two
  // such integers would be one (1000000000000000000000001 and ...002 are
  // both 1e24). For what callers send; an upstream's answer is read as is.
  bool exact_integer_literals = false;
};

StatusOr<Json> ParseJson(std::string_view text, const JsonLimits& limits = {});

StatusOr<std::string> CanonicalJson(const Json& value);

// Appends `s` escaped for the inside of a JSON string literal (no quotes),
// with RFC 8785's escaping: \" \\ \b \f \n \r \t, other controls as \u00xx.
void AppendJsonStringContent(std::string_view s, std::string& out);

// Decodes one well-formed UTF-8 sequence (Unicode Table 3-7: no overlong
// forms, no encoded surrogates, nothing above U+10FFFF) starting at `pos`.
// Returns the code point and advances `pos`, or nullopt leaving `pos` alone.
std::optional<char32_t> DecodeUtf8(std::string_view s, size_t& pos);

// True if `s` is well-formed UTF-8 (no overlong forms, no surrogates).
bool IsValidUtf8(std::string_view s);

// The characters (code points) of well-formed UTF-8 `s`: its bytes that do
// not continue a character. What a limit "in characters" counts; check
// IsValidUtf8 first (continuation bytes alone count as nothing).
size_t CodePoints(std::string_view s);

// `s` with each byte that does not begin a well-formed UTF-8 character
// replaced by `replacement` (U+FFFD by default): text from outside (an
// upstream's answer) made storable as JSON, losing only what was not text.
std::string ValidUtf8Text(std::string_view s, std::string_view replacement = "\xEF\xBF\xBD");

// The longest prefix of `s` of at most `max_bytes` bytes that does not end
// inside a UTF-8 character, so that text cut at a byte limit stays valid
// UTF-8 (and storable as JSON). Every byte cap on text goes through here.
std::string_view Utf8Prefix(std::string_view s, size_t max_bytes);

// Utf8Prefix(s, max_bytes), plus `marker` when anything was cut.
std::string CutUtf8(std::string_view s, size_t max_bytes, std::string_view marker = "...[cut]");

// ECMAScript Number::toString for a finite double (RFC 8785 3.2.2.3).
std::string FormatJcsNumber(double value);

// Writes one JSON object as text, member by member, without building a
// Json value first (for hot paths). Names are the caller's literals. A
// string value that is not UTF-8 is written as "" and remembered (bad()).
//
//   std::string text = JsonObjectWriter().Str("kind", k).Int("attempt", 2).Take();
class JsonObjectWriter {
 public:
  JsonObjectWriter();
  JsonObjectWriter& Str(std::string_view name, std::string_view value);
  JsonObjectWriter& Int(std::string_view name, int64_t value);
  JsonObjectWriter& Double(std::string_view name, double value);  // not finite: null
  JsonObjectWriter& Bool(std::string_view name, bool value);
  // `json_text` must be one JSON value's text; it is copied as is.
  JsonObjectWriter& Raw(std::string_view name, std::string_view json_text);
  // The name of the first string value that was not UTF-8, "" if none.
  std::string_view bad() const { return bad_; }
  // The object's text, closed; the writer is spent.
  std::string Take();

 private:
  void Name(std::string_view name);

  std::string out_;
  std::string_view bad_;
};

// Escapes one reference token for a JSON pointer (RFC 6901: ~ -> ~0, / -> ~1).
std::string JsonPointerToken(std::string_view token);

}  // namespace idem
