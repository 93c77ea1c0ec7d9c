// The OpenAI adapter: Chat Completions with Structured Outputs.
//
//   POST {base_url}/chat/completions      base_url default https://api.openai.com/v1
//   Authorization: Bearer <key from the env variable named by api_key_env>
//   {model, messages: [system?, user, repair feedback?], temperature,
//    response_format: {type: "json_schema",
//                      json_schema: {name, schema, strict: true}},
//    tools?: [{type: "function", function: {name, description, parameters}}],
//    max_completion_tokens?}
//
// Config keys read from ProviderConfig::raw (all optional):
//   max_tokens     integer, sent as max_completion_tokens (default: not sent)
//   organization   sent as the OpenAI-Organization header
//   headers        map of extra request headers (e.g. for a gateway)
// The whole exchange is bounded by ProviderRequest::timeout_ms; connecting
// by 10 s or that, whichever is less.
//
// Complete returns raw_text = choices[0].message.content, output = its JSON
// (null if not JSON), usage.prompt_tokens (cached included),
// completion_tokens and prompt_tokens_details.cached_tokens. Failures as in
// providers/errors.h: HTTP errors classified with retry-after markers,
// refusals, truncation (finish_reason "length"), content filter. The API key
// never appears in a Status, even when a 401 echoes it.
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
StatusOr<std::unique_ptr<Provider>> MakeOpenAiProvider(const ProviderConfig& config,
                                                       HttpClient& http, Env& env);

}  // namespace idem
