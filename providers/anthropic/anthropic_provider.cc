#include "providers/anthropic/anthropic_provider.h"

#include <algorithm>
#include <exception>
#include <string>

#include "providers/errors.h"
#include "providers/wire.h"

namespace idem {
namespace {

using wire::Find;
using wire::IntAt;
using wire::StringAt;
using wire::StripTrailingSlash;

constexpr char kDefaultBaseUrl[] = "https://api.anthropic.com";
constexpr char kApiVersion[] = "2023-06-01";
constexpr int64_t kConnectTimeoutMs = 10'000;

// A tool from the step config in Anthropic form.
Json ToAnthropicTool(const Json& tool) {
  const Json* fn = Find(tool, "function");  // an OpenAI-shaped tool
  const Json& src = fn != nullptr && fn->is_object() ? *fn : tool;
  Json out = {{"name", StringAt(src, "name")}};
  if (const Json* d = Find(src, "description"); d != nullptr && d->is_string()) {
    out["description"] = *d;
  }
  if (const Json* s = Find(src, "input_schema")) {
    out["input_schema"] = *s;
  } else if (const Json* p = Find(src, "parameters")) {
    out["input_schema"] = *p;
  } else {
    out["input_schema"] = {{"type", "object"}, {"properties", Json::object()}};
  }
  return out;
}

// Why the model refused, for the escalation: stop_details (RefusalStopDetails
// in the SDK types: {type: "refusal", category?, explanation?}, either may
// be null) says it best; the text of the answer, if any, follows.
std::string RefusalReason(const Json& message, const std::string& text) {
  std::string reason;
  if (const Json* d = Find(message, "stop_details"); d != nullptr && d->is_object()) {
    const std::string category = StringAt(*d, "category");
    const std::string explanation = StringAt(*d, "explanation");
    if (!category.empty()) reason = "category " + category;
    if (!explanation.empty()) reason += (reason.empty() ? "" : ": ") + explanation;
  }
  if (!text.empty()) reason += (reason.empty() ? "" : "; the answer said: ") + text;
  return reason.empty() ? "(no explanation given)" : reason;
}

struct Settings {
  std::string upstream;
  std::string url;
  std::string api_key;
  ProviderSecrets secrets;  // the key, the headers' and base_url's secrets
  int64_t max_tokens = 4096;
  bool native = false;
  HttpHeaders extra_headers;  // from config
};

class AnthropicProvider final : public Provider {
 public:
  AnthropicProvider(Settings settings, HttpClient& http, Env& env)
      : s_(std::move(settings)), http_(http), env_(env) {}

  std::string type() const override { return "anthropic"; }

  StatusOr<ProviderResponse> Complete(const ProviderRequest& request) override {
    try {
      return CompleteOrThrow(request);
    } catch (const std::exception& e) {
      return Internal(
          RedactAll(s_.upstream + ": unexpected error: " + e.what(), s_.secrets.errors));
    }
  }

 private:
  Json Body(const ProviderRequest& request, const std::string& tool_name) const {
    Json messages = Json::array();
    messages.push_back({{"role", "user"}, {"content", request.prompt}});
    if (!request.repair_feedback.empty()) {
      // Consecutive user turns are merged by the API; keep them apart for clarity.
      messages.push_back({{"role", "user"}, {"content", request.repair_feedback}});
    }
    Json body = {
        {"model", request.model}, {"max_tokens", s_.max_tokens}, {"messages", std::move(messages)}};
    if (request.temperature) body["temperature"] = *request.temperature;
    if (!request.system_prompt.empty()) body["system"] = request.system_prompt;
    Json tools = Json::array();
    if (s_.native) {
      body["output_config"] = {
          {"format", {{"type", "json_schema"}, {"schema", request.output_schema}}}};
    } else {
      tools.push_back({{"name", tool_name},
                       {"description",
                        "Record the answer. Call this tool exactly once; its input is the "
                        "answer and must match the schema."},
                       {"input_schema", request.output_schema}});
      body["tool_choice"] = {{"type", "tool"}, {"name", tool_name}};
    }
    if (request.tools.is_array()) {
      for (const Json& tool : request.tools) {
        if (tool.is_object()) tools.push_back(ToAnthropicTool(tool));
      }
    }
    if (!tools.empty()) body["tools"] = std::move(tools);
    return body;
  }

  StatusOr<ProviderResponse> CompleteOrThrow(const ProviderRequest& request) {
    if (request.model.empty()) return InvalidArgument(s_.upstream + ": the request names no model");
    const std::string tool_name =
        SchemaNameForWire(request.schema_name.empty() ? request.step : request.schema_name);
    HttpRequest http_request;
    http_request.method = "POST";
    http_request.url = s_.url;
    http_request.headers = {{"x-api-key", s_.api_key},
                            {"anthropic-version", kApiVersion},
                            {"content-type", "application/json"},
                            {"accept", "application/json"}};
    http_request.headers.insert(http_request.headers.end(), s_.extra_headers.begin(),
                                s_.extra_headers.end());
    http_request.body = DumpJson(Body(request, tool_name));
    http_request.timeout_ms = request.timeout_ms;
    http_request.connect_timeout_ms = std::min(kConnectTimeoutMs, request.timeout_ms);
    ASSIGN_OR_RETURN(HttpResponse response,
                     SendChecked(http_, env_, s_.upstream, http_request, s_.secrets));
    return ParseAnswer(response, tool_name);
  }

  StatusOr<ProviderResponse> ParseAnswer(const HttpResponse& response,
                                         const std::string& tool_name) const {
    std::optional<Json> parsed = ParseJsonBody(response.body);
    if (!parsed || !parsed->is_object()) {
      return MalformedAnswerError(s_.upstream, "the response body is not a JSON object");
    }
    const Json& j = *parsed;
    const Json* content = Find(j, "content");
    if (StringAt(j, "type") != "message" || content == nullptr || !content->is_array()) {
      return MalformedAnswerError(s_.upstream, "the response is not a message with content");
    }
    ProviderResponse out;
    out.finish_reason = StringAt(j, "stop_reason");
    std::string text;
    const Json* tool_input = nullptr;
    for (const Json& block : *content) {
      std::string type = StringAt(block, "type");
      if (type == "text") {
        text += StringAt(block, "text");
      } else if (type == "tool_use" && tool_input == nullptr && !s_.native &&
                 StringAt(block, "name") == tool_name) {
        tool_input = Find(block, "input");
      }
    }
    if (out.finish_reason == "refusal") return RefusalError(s_.upstream, RefusalReason(j, text));
    if (out.finish_reason == "max_tokens") {
      return TruncationError(s_.upstream, "stop_reason=max_tokens");
    }
    if (tool_input != nullptr) {
      out.raw_text = DumpJson(*tool_input);
      out.output = *tool_input;
    } else if (!text.empty()) {
      // Native mode, or the model answered in prose despite the forced tool:
      // validation against the schema decides.
      out.raw_text = text;
      out.output = ParseJsonBody(text).value_or(Json());
    } else {
      return MalformedAnswerError(s_.upstream,
                                  "the message has neither the output tool call "
                                  "nor text");
    }
    const Json* usage = Find(j, "usage");
    if (usage != nullptr) {
      int64_t cache_read = IntAt(*usage, "cache_read_input_tokens");
      out.input_tokens =
          IntAt(*usage, "input_tokens") + cache_read + IntAt(*usage, "cache_creation_input_tokens");
      out.cached_input_tokens = cache_read;
      out.output_tokens = IntAt(*usage, "output_tokens");
    }
    return out;
  }

  const Settings s_;
  HttpClient& http_;
  Env& env_;
};

}  // namespace

StatusOr<std::unique_ptr<Provider>> MakeAnthropicProvider(const ProviderConfig& config,
                                                          HttpClient& http, Env& env) {
  Settings s;
  ASSIGN_OR_RETURN(s.api_key, ApiKeyFromEnv(config, /*required=*/true));
  ASSIGN_OR_RETURN(s.max_tokens, ConfigInt(config, "max_tokens", 4096, 1, 1'000'000));
  ASSIGN_OR_RETURN(std::string mode,
                   ConfigString(config, "structured_output", "tool", {"tool", "native"}));
  std::vector<std::string> own = {s.api_key};
  ASSIGN_OR_RETURN(s.extra_headers, ConfigHeaders(config, &own));
  s.native = mode == "native";
  s.upstream = config.name.empty() ? "anthropic" : config.name;
  const std::string base = config.base_url.empty() ? kDefaultBaseUrl : config.base_url;
  s.secrets = RedactionListsFor(std::move(own), {base});
  s.url = StripTrailingSlash(base) + "/v1/messages";
  return std::unique_ptr<Provider>(std::make_unique<AnthropicProvider>(std::move(s), http, env));
}

}  // namespace idem
