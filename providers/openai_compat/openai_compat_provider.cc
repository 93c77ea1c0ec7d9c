#include "providers/openai_compat/openai_compat_provider.h"

#include <algorithm>
#include <cctype>
#include <exception>
#include <string>

#include "providers/errors.h"
#include "providers/openai/chat_completions.h"
#include "providers/wire.h"

namespace idem {
namespace {

using wire::Find;
using wire::IntAt;
using wire::StringAt;
using wire::StripTrailingSlash;

constexpr char kDefaultOllamaUrl[] = "http://127.0.0.1:11434";
constexpr int64_t kConnectTimeoutMs = 10'000;

// True when the URL's last path segment is a version: "/v1", "/v1beta".
bool EndsWithVersionSegment(const std::string& url) {
  size_t slash = url.rfind('/');
  size_t scheme = url.find("://");
  if (slash == std::string::npos || (scheme != std::string::npos && slash < scheme + 3)) {
    return false;
  }
  std::string_view last = std::string_view(url).substr(slash + 1);
  return last.size() >= 2 && last[0] == 'v' && std::isdigit(static_cast<unsigned char>(last[1]));
}

enum class Api { kOpenAi, kOllama };

struct Settings {
  Api api = Api::kOpenAi;
  std::string upstream;
  std::string url;
  std::string api_key;      // may be empty
  ProviderSecrets secrets;  // the key, the headers' and base_url's secrets
  int64_t max_tokens = 0;
  HttpHeaders extra_headers;  // from config
};

class OpenAiCompatProvider final : public Provider {
 public:
  OpenAiCompatProvider(Settings settings, HttpClient& http, Env& env)
      : s_(std::move(settings)), http_(http), env_(env) {}

  std::string type() const override { return "openai_compatible"; }

  StatusOr<ProviderResponse> Complete(const ProviderRequest& request) override {
    try {
      return CompleteOrThrow(request);
    } catch (const std::exception& e) {
      return Internal(
          RedactAll(s_.upstream + ": unexpected error: " + e.what(), s_.secrets.errors));
    }
  }

 private:
  StatusOr<ProviderResponse> CompleteOrThrow(const ProviderRequest& request) {
    if (request.model.empty()) return InvalidArgument(s_.upstream + ": the request names no model");
    HttpRequest http_request;
    http_request.method = "POST";
    http_request.url = s_.url;
    http_request.headers = {{"Content-Type", "application/json"}, {"Accept", "application/json"}};
    if (!s_.api_key.empty()) {
      http_request.headers.emplace_back("Authorization", "Bearer " + s_.api_key);
    }
    http_request.headers.insert(http_request.headers.end(), s_.extra_headers.begin(),
                                s_.extra_headers.end());
    http_request.timeout_ms = request.timeout_ms;
    http_request.connect_timeout_ms = std::min(kConnectTimeoutMs, request.timeout_ms);
    if (s_.api == Api::kOpenAi) {
      chat_completions::BodyOptions options;
      options.strict = true;
      options.max_tokens = s_.max_tokens;
      options.max_tokens_key = "max_tokens";  // what the compatible servers read
      http_request.body = DumpJson(chat_completions::Body(request, options));
    } else {
      http_request.body = DumpJson(OllamaBody(request));
    }
    ASSIGN_OR_RETURN(HttpResponse response,
                     SendChecked(http_, env_, s_.upstream, http_request, s_.secrets));
    if (s_.api == Api::kOpenAi) return chat_completions::ParseAnswer(s_.upstream, response);
    return ParseOllamaAnswer(response);
  }

  Json OllamaBody(const ProviderRequest& request) const {
    Json options = Json::object();
    if (request.temperature) options["temperature"] = *request.temperature;
    if (s_.max_tokens > 0) options["num_predict"] = s_.max_tokens;
    Json body = {{"model", request.model},
                 {"messages", chat_completions::Messages(request)},
                 {"format", request.output_schema},
                 {"stream", false}};
    if (!options.empty()) body["options"] = std::move(options);
    Json tools = chat_completions::Tools(request.tools);
    if (!tools.empty()) body["tools"] = std::move(tools);
    return body;
  }

  StatusOr<ProviderResponse> ParseOllamaAnswer(const HttpResponse& response) const {
    std::optional<Json> parsed = ParseJsonBody(response.body);
    if (!parsed || !parsed->is_object()) {
      return MalformedAnswerError(s_.upstream, "the response body is not a JSON object");
    }
    const Json& j = *parsed;
    if (std::string error = StringAt(j, "error"); !error.empty()) {
      // Ollama can report a failure inside a 200 (e.g. mid-generation).
      return Unavailable(RedactAll(s_.upstream + ": " + error, s_.secrets.errors));
    }
    const Json* message = Find(j, "message");
    const Json* content = message == nullptr ? nullptr : Find(*message, "content");
    if (content == nullptr || !content->is_string()) {
      return MalformedAnswerError(s_.upstream, "the response has no message.content");
    }
    ProviderResponse out;
    out.finish_reason = StringAt(j, "done_reason");
    if (out.finish_reason == "length") return TruncationError(s_.upstream, "done_reason=length");
    out.raw_text = content->get<std::string>();
    if (out.raw_text.empty()) {
      if (const Json* calls = Find(*message, "tool_calls"); calls != nullptr && calls->is_array()) {
        out.raw_text = DumpJson(*calls);
      }
    }
    out.output = ParseJsonBody(out.raw_text).value_or(Json());
    out.input_tokens = IntAt(j, "prompt_eval_count");
    out.output_tokens = IntAt(j, "eval_count");
    return out;
  }

  const Settings s_;
  HttpClient& http_;
  Env& env_;
};

}  // namespace

StatusOr<std::unique_ptr<Provider>> MakeOpenAiCompatProvider(const ProviderConfig& config,
                                                             HttpClient& http, Env& env) {
  Settings s;
  s.upstream = config.name.empty() ? "openai_compatible" : config.name;
  ASSIGN_OR_RETURN(std::string api, ConfigString(config, "api", "openai", {"openai", "ollama"}));
  s.api = api == "ollama" ? Api::kOllama : Api::kOpenAi;
  ASSIGN_OR_RETURN(s.api_key, ApiKeyFromEnv(config, /*required=*/false));
  ASSIGN_OR_RETURN(s.max_tokens, ConfigInt(config, "max_tokens", 0, 0, 1'000'000));
  std::vector<std::string> own = {s.api_key};
  ASSIGN_OR_RETURN(s.extra_headers, ConfigHeaders(config, &own));
  std::string base = StripTrailingSlash(config.base_url);
  if (s.api == Api::kOllama) {
    if (base.empty()) base = kDefaultOllamaUrl;
    if (EndsWithVersionSegment(base)) base = base.substr(0, base.rfind('/'));
    s.url = base + "/api/chat";
  } else {
    if (base.empty()) {
      return FailedPrecondition("provider '" + config.name +
                                "' (openai_compatible): base_url is required, e.g. "
                                "http://127.0.0.1:8000/v1");
    }
    s.url = base + (EndsWithVersionSegment(base) ? "" : "/v1") + "/chat/completions";
  }
  s.secrets = RedactionListsFor(std::move(own), {base});
  return std::unique_ptr<Provider>(std::make_unique<OpenAiCompatProvider>(std::move(s), http, env));
}

}  // namespace idem
