// Provider: one model API behind one interface. An adapter turns a
// ProviderRequest into the provider's wire format, sends it, and turns the
// answer into a ProviderResponse or a Status.
//
// Adapters never retry: the decide engine owns the one retry loop. A
// retryable failure (network, 408, 429, 5xx, 529) comes back as a Status
// with retryable() set and, where the provider said so, retry_after_ms.
//
// Secrets: an adapter reads its key from the environment variable named in
// its config and never puts it in a Status, a log line or a response.
//
// Thread-safety: Complete may be called from many threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "daemon/core/status.h"

namespace idem {

using Json = nlohmann::json;

struct ProviderRequest {
  std::string step;
  // The decision key this call decides (the replay provider answers by it).
  std::string decision_key;
  std::string model;
  // Sampling parameters are sent only when set: some models refuse them
  // (newer Claude models answer 400 to any temperature but 1.0), and an
  // unset one leaves the provider's own default in force.
  std::optional<double> temperature;
  std::string system_prompt;  // may be empty
  std::string prompt;         // the rendered user prompt
  Json input;                 // the canonical input (the scripted provider matches on it)
  Json output_schema;         // JSON Schema the output must satisfy
  std::string schema_name;    // a short name for the schema (provider APIs want one)
  Json tools = Json::array();
  std::string repair_feedback;  // non-empty on a repair attempt: the errors to fix
  int64_t timeout_ms = 30'000;
};

struct ProviderResponse {
  std::string raw_text;  // what the model returned, verbatim
  Json output;           // raw_text parsed as JSON (null if it is not JSON)
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
  int64_t cached_input_tokens = 0;
  std::string finish_reason;
  int64_t retry_after_ms = 0;  // set on retryable failures when the provider said
};

class Provider {
 public:
  virtual ~Provider() = default;
  virtual StatusOr<ProviderResponse> Complete(const ProviderRequest& request) = 0;
  virtual std::string type() const = 0;
};

}  // namespace idem
