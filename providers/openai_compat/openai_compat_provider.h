// The adapter for local and self-hosted OpenAI-compatible servers: Ollama,
// vLLM, llama.cpp server, LM Studio.
//
// config raw `api`:
//   "openai" (default): POST {base_url}/chat/completions when base_url ends
//     in a version segment (".../v1"), else {base_url}/v1/chat/completions;
//     the OpenAI Chat Completions body with response_format json_schema
//     (strict: true), which vLLM, LM Studio, llama.cpp server and Ollama's
//     /v1 accept. Answers are read as from OpenAI (providers/openai/
//     chat_completions.h). base_url is required.
//   "ollama": Ollama's native API, POST {base_url}/api/chat (a trailing
//     "/v1" on base_url is dropped; default http://127.0.0.1:11434) with
//     {model, messages, format: <the output schema>, stream: false,
//      options?: {temperature?, num_predict?}, tools?}; reads message.content,
//     done_reason ("length" is a TruncationError), prompt_eval_count and
//     eval_count.
//
// The API key is optional: without api_key_env no Authorization header is
// sent; with it, the variable must be set (Bearer <key>).
//
// Config keys read from ProviderConfig::raw (all optional):
//   api          "openai" | "ollama", default "openai"
//   max_tokens   integer; max_tokens (openai) or options.num_predict (ollama)
//   headers      map of extra request headers (e.g. for a reverse proxy)
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

// FailedPrecondition when api_key_env names an unset variable or base_url is
// missing for api "openai"; InvalidArgument for a bad config value.
// `http` and `env` must outlive the provider.
StatusOr<std::unique_ptr<Provider>> MakeOpenAiCompatProvider(const ProviderConfig& config,
                                                             HttpClient& http, Env& env);

}  // namespace idem
