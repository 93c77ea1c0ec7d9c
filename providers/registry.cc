#include "providers/registry.h"

#include "providers/anthropic/anthropic_provider.h"
#include "providers/openai/openai_provider.h"
#include "providers/openai_compat/openai_compat_provider.h"
#include "providers/replay/replay_provider.h"
#include "providers/scripted/scripted_provider.h"

namespace idem {

StatusOr<std::unique_ptr<Provider>> MakeProvider(const ProviderConfig& config, HttpClient& http,
                                                 Env& env) {
  if (config.type == "scripted") {
    ASSIGN_OR_RETURN(std::unique_ptr<ScriptedProvider> provider,
                     ScriptedProvider::Create(config, env));
    return std::unique_ptr<Provider>(std::move(provider));
  }
  if (config.type == "replay") {
    ASSIGN_OR_RETURN(std::unique_ptr<ReplayProvider> provider, ReplayProvider::Create(config));
    return std::unique_ptr<Provider>(std::move(provider));
  }
  if (config.type == "openai") return MakeOpenAiProvider(config, http, env);
  if (config.type == "anthropic") return MakeAnthropicProvider(config, http, env);
  if (config.type == "openai_compatible") return MakeOpenAiCompatProvider(config, http, env);
  return InvalidArgument("provider " + config.name + ": unknown provider type '" + config.type +
                         "'");
}

}  // namespace idem
