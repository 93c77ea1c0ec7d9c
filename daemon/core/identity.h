// Identity: turning "the same work" into the same key, every time.
//
//   decision_key = sha256(JCS({"v":1, "provider", "model", "prompt_version",
//                              "temperature", "tools_hash", "schema_hash",
//                              "input"}))
//     with tools_hash = sha256(JCS(tools)), schema_hash = sha256(JCS(schema)),
//     and input normalized by the step's normalizers first.
//   work_id = sha256(kind + ":" + version + ":" + JCS(identity))
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

struct DecisionKeyParts {
  std::string provider;
  std::string model;
  std::string prompt_version;
  double temperature = 0;
  Json tools = Json::array();
  Json output_schema = Json::object();
  // Precomputed sha256 hex of JCS(tools) / JCS(output_schema); when empty
  // they are computed from the fields above.
  std::string tools_hash;
  std::string schema_hash;
  Json input;  // already normalized
};

StatusOr<KeyMaterial> ComputeDecisionKey(const DecisionKeyParts& parts);

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
  std::string suffix_;  // `,"model":...,"v":1}`
};

StatusOr<KeyMaterial> ComputeWorkId(std::string_view kind, std::string_view version,
                                    const Json& identity);

}  // namespace idem
