// MakeProvider: builds the Provider adapter a ProviderConfig names.
//
// Types: scripted (offline rules), replay (a recorded decisions export,
// answered by decision key), openai (Chat Completions, strict
// json_schema), anthropic (Messages API, forced tool use or native
// structured output), openai_compatible (Ollama, vLLM, llama.cpp server, LM
// Studio). An unknown type is InvalidArgument. Errors from the adapter's own
// Create (a malformed rules file, say) come back unchanged.
//
// Thread-safety: MakeProvider may be called from any thread; `env` must
// outlive the returned provider.
#pragma once

#include <memory>

#include "daemon/config/config.h"
#include "daemon/core/env.h"
#include "daemon/core/http_client.h"
#include "daemon/core/status.h"
#include "providers/provider.h"

namespace idem {

// `http` and `env` must outlive the returned provider.
StatusOr<std::unique_ptr<Provider>> MakeProvider(const ProviderConfig& config, HttpClient& http,
                                                 Env& env);

}  // namespace idem
