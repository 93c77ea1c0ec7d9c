#include "providers/openai/openai_provider.h"

#include <algorithm>
#include <exception>
#include <string>

#include "providers/errors.h"
#include "providers/openai/chat_completions.h"
#include "providers/wire.h"

namespace idem {
namespace {

using wire::StripTrailingSlash;

constexpr char kDefaultBaseUrl[] = "https://api.openai.com/v1";
constexpr int64_t kConnectTimeoutMs = 10'000;

class OpenAiProvider final : public Provider {
 public:
  OpenAiProvider(std::string name, std::string base_url, std::string api_key, int64_t max_tokens,
                 HttpHeaders headers, ProviderSecrets secrets, HttpClient& http, Env& env)
      : upstream_(std::move(name)),
        url_(StripTrailingSlash(std::move(base_url)) + "/chat/completions"),
        api_key_(std::move(api_key)),
        max_tokens_(max_tokens),
        headers_(std::move(headers)),
        secrets_(std::move(secrets)),
        http_(http),
        env_(env) {}

  std::string type() const override { return "openai"; }

  StatusOr<ProviderResponse> Complete(const ProviderRequest& request) override {
    try {
      return CompleteOrThrow(request);
    } catch (const std::exception& e) {
      // Nothing below should throw; keep the promise that nothing escapes.
      return Internal(RedactAll(upstream_ + ": unexpected error: " + e.what(), secrets_.errors));
    }
  }

 private:
  StatusOr<ProviderResponse> CompleteOrThrow(const ProviderRequest& request) {
    if (request.model.empty()) return InvalidArgument(upstream_ + ": the request names no model");
    chat_completions::BodyOptions options;
    options.strict = true;
    options.max_tokens = max_tokens_;
    options.max_tokens_key = "max_completion_tokens";
    HttpRequest http_request;
    http_request.method = "POST";
    http_request.url = url_;
    http_request.headers = headers_;
    http_request.headers.insert(http_request.headers.begin(),
                                {{"Authorization", "Bearer " + api_key_},
                                 {"Content-Type", "application/json"},
                                 {"Accept", "application/json"}});
    http_request.body = DumpJson(chat_completions::Body(request, options));
    http_request.timeout_ms = request.timeout_ms;
    http_request.connect_timeout_ms = std::min(kConnectTimeoutMs, request.timeout_ms);
    ASSIGN_OR_RETURN(HttpResponse response,
                     SendChecked(http_, env_, upstream_, http_request, secrets_));
    return chat_completions::ParseAnswer(upstream_, response);
  }

  const std::string upstream_;
  const std::string url_;
  const std::string api_key_;
  const int64_t max_tokens_;
  const HttpHeaders headers_;      // organization and configured extra headers
  const ProviderSecrets secrets_;  // the key, the headers' and base_url's secrets
  HttpClient& http_;
  Env& env_;
};

}  // namespace

StatusOr<std::unique_ptr<Provider>> MakeOpenAiProvider(const ProviderConfig& config,
                                                       HttpClient& http, Env& env) {
  ASSIGN_OR_RETURN(std::string key, ApiKeyFromEnv(config, /*required=*/true));
  ASSIGN_OR_RETURN(int64_t max_tokens, ConfigInt(config, "max_tokens", 0, 0, 1'000'000));
  ASSIGN_OR_RETURN(std::string organization, ConfigString(config, "organization", ""));
  std::vector<std::string> secrets = {key};
  ASSIGN_OR_RETURN(HttpHeaders headers, ConfigHeaders(config, &secrets));
  if (!organization.empty()) headers.insert(headers.begin(), {"OpenAI-Organization", organization});
  std::string base_url = config.base_url.empty() ? kDefaultBaseUrl : config.base_url;
  std::string name = config.name.empty() ? "openai" : config.name;
  ProviderSecrets all = RedactionListsFor(std::move(secrets), {base_url});
  return std::unique_ptr<Provider>(
      std::make_unique<OpenAiProvider>(std::move(name), std::move(base_url), std::move(key),
                                       max_tokens, std::move(headers), std::move(all), http, env));
}

}  // namespace idem
