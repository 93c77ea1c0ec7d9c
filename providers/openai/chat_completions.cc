#include "providers/openai/chat_completions.h"

#include "providers/errors.h"
#include "providers/wire.h"

namespace idem::chat_completions {
namespace {

using wire::Find;
using wire::StringAt;

int64_t IntAt(const Json& j, std::initializer_list<const char*> path) {
  const Json* cur = &j;
  for (const char* key : path) {
    if (!cur->is_object()) return 0;
    auto it = cur->find(key);
    if (it == cur->end()) return 0;
    cur = &*it;
  }
  return wire::AsCount(*cur);
}

}  // namespace

Json Messages(const ProviderRequest& request) {
  Json messages = Json::array();
  if (!request.system_prompt.empty()) {
    messages.push_back({{"role", "system"}, {"content", request.system_prompt}});
  }
  messages.push_back({{"role", "user"}, {"content", request.prompt}});
  if (!request.repair_feedback.empty()) {
    messages.push_back({{"role", "user"}, {"content", request.repair_feedback}});
  }
  return messages;
}

Json Tools(const Json& tools) {
  Json out = Json::array();
  if (!tools.is_array()) return out;
  for (const Json& tool : tools) {
    if (!tool.is_object()) continue;
    if (StringAt(tool, "type") == "function" && tool.contains("function")) {
      out.push_back(tool);
      continue;
    }
    Json fn = {{"name", StringAt(tool, "name")}};
    if (auto d = tool.find("description"); d != tool.end()) fn["description"] = *d;
    if (auto p = tool.find("parameters"); p != tool.end()) {
      fn["parameters"] = *p;
    } else if (auto s = tool.find("input_schema"); s != tool.end()) {
      fn["parameters"] = *s;
    } else {
      fn["parameters"] = {{"type", "object"}, {"properties", Json::object()}};
    }
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

Json Body(const ProviderRequest& request, const BodyOptions& options) {
  Json body = {
      {"model", request.model},
      {"messages", Messages(request)},
      {"response_format",
       {{"type", "json_schema"},
        {"json_schema",
         {{"name",
           SchemaNameForWire(request.schema_name.empty() ? request.step : request.schema_name)},
          {"schema", request.output_schema},
          {"strict", options.strict}}}}},
  };
  if (request.temperature) body["temperature"] = *request.temperature;
  Json tools = Tools(request.tools);
  if (!tools.empty()) body["tools"] = std::move(tools);
  if (options.max_tokens > 0 && !options.max_tokens_key.empty()) {
    body[options.max_tokens_key] = options.max_tokens;
  }
  return body;
}

StatusOr<ProviderResponse> ParseAnswer(std::string_view upstream, const HttpResponse& response) {
  std::optional<Json> parsed = ParseJsonBody(response.body);
  if (!parsed || !parsed->is_object()) {
    return MalformedAnswerError(upstream, "the response body is not a JSON object");
  }
  const Json& j = *parsed;
  const Json* choices = Find(j, "choices");
  if (choices == nullptr || !choices->is_array() || choices->empty() ||
      !(*choices)[0].is_object()) {
    return MalformedAnswerError(upstream, "the response has no choices");
  }
  const Json& choice = (*choices)[0];
  const Json* message = Find(choice, "message");
  if (message == nullptr || !message->is_object()) {
    return MalformedAnswerError(upstream, "choices[0] has no message");
  }
  ProviderResponse out;
  if (const Json* fr = Find(choice, "finish_reason"); fr != nullptr && fr->is_string()) {
    out.finish_reason = fr->get<std::string>();
  }
  if (const Json* refusal = Find(*message, "refusal");
      refusal != nullptr && refusal->is_string() &&
      !refusal->get_ref<const std::string&>().empty()) {
    return RefusalError(upstream, refusal->get_ref<const std::string&>());
  }
  if (out.finish_reason == "length") return TruncationError(upstream, "finish_reason=length");
  if (out.finish_reason == "content_filter") return ContentFilterError(upstream);

  const Json* content = Find(*message, "content");
  const Json* tool_calls = Find(*message, "tool_calls");
  const bool has_content = content != nullptr && content->is_string();
  const bool has_calls = tool_calls != nullptr && tool_calls->is_array() && !tool_calls->empty();
  // Some OpenAI-compatible servers send "content": "" beside the calls.
  if (has_content && (!content->get_ref<const std::string&>().empty() || !has_calls)) {
    out.raw_text = content->get<std::string>();
  } else if (has_calls) {
    // The model called a tool instead of answering: hand the calls on
    // verbatim; validation against the output schema decides what happens.
    out.raw_text = DumpJson(*tool_calls);
  } else {
    return MalformedAnswerError(upstream, "choices[0].message has no content");
  }
  out.output = ParseJsonBody(out.raw_text).value_or(Json());
  out.input_tokens = IntAt(j, {"usage", "prompt_tokens"});
  out.output_tokens = IntAt(j, {"usage", "completion_tokens"});
  out.cached_input_tokens = IntAt(j, {"usage", "prompt_tokens_details", "cached_tokens"});
  return out;
}

}  // namespace idem::chat_completions
