// The OpenAI Chat Completions wire format (POST .../chat/completions), shared
// by the OpenAI adapter and the OpenAI-compatible adapter (vLLM, LM Studio,
// llama.cpp server, Ollama's /v1). Private to providers/: not a public API.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "daemon/core/http_client.h"
#include "daemon/core/status.h"
#include "providers/provider.h"

namespace idem::chat_completions {

struct BodyOptions {
  bool strict = true;          // response_format.json_schema.strict
  int64_t max_tokens = 0;      // 0: not sent
  std::string max_tokens_key;  // "max_completion_tokens" (OpenAI) or "max_tokens"
};

// [system?, user, (repair) user with the repair feedback].
Json Messages(const ProviderRequest& request);

// ProviderRequest::tools in OpenAI form: a tool already shaped
// {type: "function", function: {...}} passes through; {name, description,
// parameters | input_schema} is wrapped.
Json Tools(const Json& tools);

// {model, messages, temperature?, response_format: {type: json_schema,
//  json_schema: {name, schema, strict}}, tools?, max_*tokens?}; temperature
// only when the request sets it.
Json Body(const ProviderRequest& request, const BodyOptions& options);

// Reads a 2xx answer. Success: raw_text = choices[0].message.content (or the
// tool_calls array as JSON when the model called a tool instead), output =
// raw_text parsed (null if not JSON), usage, finish_reason.
// Failures (see providers/errors.h): message.refusal -> RefusalError;
// finish_reason "length" -> TruncationError; "content_filter" ->
// ContentFilterError; a body that is not a chat completion ->
// MalformedAnswerError (retryable).
StatusOr<ProviderResponse> ParseAnswer(std::string_view upstream, const HttpResponse& response);

}  // namespace idem::chat_completions
