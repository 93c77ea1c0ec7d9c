// Identity: turning "the same work" into the same key, every time.
//
//   decision_key = sha256(JCS({"v":2, "step", "provider", "model",
//                              "prompt_version", "prompt_hash", "temperature",
//                              "tools_hash", "schema_hash", "input"}))
//     with tools_hash = sha256(JCS(tools)), schema_hash = sha256(JCS(schema)),
//     prompt_hash = ComputePromptHash(template, system, tools), temperature
//     null when the step leaves it unset (the provider's default is not 0),
//     and input normalized by the step's normalizers first. The step name is
//     in the material so that two steps never share a decision, even with
//     the same prompt, model and input.
//   work_id = sha256(kind + ":" + version + ":" + JCS(identity))
//
// Numbers: JCS writes every number as an IEEE double, so two integers
// beyond 2^53 can canonicalize to the same text. Key material (the input)
// and identities holding a number with |n| >= 2^53 (an integer, or a double:
// every double that large is an integer) are refused with InvalidArgument
// whose field() points at the number; send it as a string. Smaller floats
// are taken as the doubles they are.
//
// Normalizers (declared per step / action kind):
//   drop          member names dropped at any depth ("received_at"), or JSON
//                 pointers ("/meta/trace_id") dropped at that place only;
//   trim_strings  leading and trailing white space removed from every string;
//   url_fields    JSON pointers of URL strings normalized by NormalizeUrl.
//
// Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/core/status.h"

namespace idem {

using Json = nlohmann::json;

struct Normalizers {
  std::vector<std::string> drop;
  bool trim_strings = true;
  std::vector<std::string> url_fields;
};

// Returns a normalized copy. InvalidArgument (with field()) when a
// url_fields pointer names a value that is not a string or not a URL.
StatusOr<Json> NormalizeInput(const Json& input, const Normalizers& normalizers);

// Lower-cases scheme and host, drops the default port (80 for http, 443
// for https), drops the fragment, drops tracking parameters (utm_*, gclid,
// fbclid, dclid, msclkid, mc_cid, mc_eid, _ga, yclid, igshid), and sorts
// the remaining query parameters (stable, by name then value). An empty
// path becomes "/". InvalidArgument if `url` has no scheme://host.
StatusOr<std::string> NormalizeUrl(std::string_view url);

struct KeyMaterial {
  std::string key;        // lower-case sha256 hex
  std::string canonical;  // the exact bytes that were hashed
};

// The version of the decision key material ("v"). Bumped when the material
// changes shape, so that keys written by an older idem simply miss.
inline constexpr int kDecisionKeyVersion = 2;

// sha256 hex of JCS({"system": system, "template": template_text,
// "tools": tools}): everything that shapes the prompt the model sees. The
// prompt-drift guard stores it per step and prompt version.
StatusOr<std::string> ComputePromptHash(std::string_view template_text, std::string_view system,
                                        const Json& tools);

// OK unless `value` holds a number of magnitude 2^53 or more: an integer a
// double cannot hold exactly, or a double (every double that large is an
// integer with neighbours more than 1 apart: an integer literal past 64
// bits, 1e16, 1e22); then InvalidArgument naming `where` + the number's
// pointer.
Status CheckExactIntegers(const Json& value, const std::string& where);

struct DecisionKeyParts {
  std::string step;
  std::string provider;
  std::string model;
  std::string prompt_version;
  std::string prompt_hash;            // ComputePromptHash of the step's prompt parts
  std::optional<double> temperature;  // unset: null in the material
  Json tools = Json::array();
  Json output_schema = Json::object();
  // Precomputed sha256 hex of JCS(tools) / JCS(output_schema); when empty
  // they are computed from the fields above.
  std::string tools_hash;
  std::string schema_hash;
  Json input;  // already normalized
};

StatusOr<KeyMaterial> ComputeDecisionKey(const DecisionKeyParts& parts);

// The decision key of stored key material (a Decision's `material`, as
// exported): the parts are read back from it and the key is computed by
// ComputeDecisionKey, then the material must be exactly what that
// computation hashes (no member added, dropped or changed). InvalidArgument
// with field "/material..." when the material is not version
// kDecisionKeyVersion material or does not canonicalize to itself. Used to
// verify imported decisions and replay files: a line whose key does not
// match its material was edited.
StatusOr<KeyMaterial> DecisionKeyOfMaterial(const Json& material);

// The decision key for many inputs of one step: everything but the input is
// canonicalized once. Because "input" sorts first among the material's
// members, the canonical material is `{"input":` + JCS(input) + a suffix
// that depends on the step only. Key(input) equals ComputeDecisionKey of
// the same parts with that input (ComputeDecisionKey is built on it).
class DecisionKeyer {
 public:
  // parts.input is ignored.
  static StatusOr<DecisionKeyer> Create(const DecisionKeyParts& parts);
  StatusOr<KeyMaterial> Key(const Json& normalized_input) const;

 private:
  std::string suffix_;  // `,"model":...,"v":2}`
};

StatusOr<KeyMaterial> ComputeWorkId(std::string_view kind, std::string_view version,
                                    const Json& identity);

}  // namespace idem
