// The Anthropic adapter: the Messages API.
//
//   POST {base_url}/v1/messages           base_url default https://api.anthropic.com
//   x-api-key: <key>, anthropic-version: 2023-06-01, content-type: application/json
//   {model, max_tokens, system?, temperature?, messages: [user, repair feedback?], ...}
//   temperature only when the step sets it: models newer than Claude Opus 4.6
//   refuse any value but 1.0 (declare them in the provider's
//   unsupported_params so that such a step fails at start-up).
//
// Structured output, chosen by config `structured_output`:
//   "tool" (default): forced tool use. One tool named after the schema
//     (SchemaNameForWire) with input_schema = the output schema, and
//     tool_choice {type: "tool", name}; the output is the tool_use block's
//     input. Works with every Claude model that has tool use.
//   "native": JSON outputs, `output_config: {format: {type: "json_schema",
//     schema}}` (generally available, no beta header; it replaced the beta
//     `output_format` + `anthropic-beta: structured-outputs-2025-11-13`);
//     the output is the text of the answer. Only models that support
//     structured outputs accept it, and the schema must fit its subset (see
//     providers/schema_lint.h).
// Request tools are sent as {name, description, input_schema}; in "tool"
// mode the forced output tool is the one the model must call.
//
// Config keys read from ProviderConfig::raw (all optional):
//   max_tokens          integer, default 4096
//   structured_output   "tool" | "native", default "tool"
//   headers             map of extra request headers (e.g. for a gateway)
//
// Usage: input_tokens = usage.input_tokens + cache_read_input_tokens +
// cache_creation_input_tokens (all prompt tokens, as OpenAI counts them),
// cached_input_tokens = cache_read_input_tokens, output_tokens =
// usage.output_tokens. stop_reason "max_tokens" is a TruncationError,
// "refusal" a RefusalError whose text carries stop_details (category,
// explanation) and the answer's text; 529 overloaded is Unavailable and retryable.
//
// Thread-safety: Complete may be called concurrently.
#pragma once

#include <memory>

#include "daemon/config/config.h"
#include "daemon/core/env.h"
#include "daemon/core/http_client.h"
#include "daemon/core/status.h"
#include "providers/provider.h"

namespace idem {

// Reads the key now: FailedPrecondition naming the variable when api_key_env
// is missing, unset or empty; InvalidArgument for a bad config value.
// `http` and `env` must outlive the provider.
StatusOr<std::unique_ptr<Provider>> MakeAnthropicProvider(const ProviderConfig& config,
                                                          HttpClient& http, Env& env);

}  // namespace idem
