#include "daemon/apply/telegram_effector.h"

#include <algorithm>
#include <cstdlib>
#include <optional>

#include "daemon/core/json.h"
#include "providers/errors.h"

namespace idem {

StatusOr<std::unique_ptr<TelegramEffector>> TelegramEffector::Create(const ActionConfig& action,
                                                                     HttpClient& http, Env& env) {
  const std::string at = "/actions/" + JsonPointerToken(action.name) + "/effector/telegram";
  if (!action.effector.is_object() || !action.effector.contains("telegram") ||
      !action.effector["telegram"].is_object()) {
    return InvalidArgument("must be an object", at);
  }
  const Json& node = action.effector["telegram"];
  for (const auto& [name, value] : node.items()) {
    if (name != "base_url" && name != "bot_token_env") {
      return InvalidArgument("unknown key '" + name + "'", at + "/" + JsonPointerToken(name));
    }
  }
  auto text = [&](const char* key) -> StatusOr<std::string> {
    if (!node.contains(key) || !node[key].is_string() || node[key].get<std::string>().empty()) {
      return InvalidArgument("must be a non-empty string", at + "/" + key);
    }
    return node[key].get<std::string>();
  };
  ASSIGN_OR_RETURN(std::string base_url, text("base_url"));
  if (!(base_url.starts_with("http://") || base_url.starts_with("https://")) ||
      base_url.find_first_of(" \r\n\t?#") != std::string::npos) {
    return InvalidArgument("must be an http:// or https:// URL", at + "/base_url");
  }
  while (base_url.ends_with("/")) base_url.pop_back();
  ASSIGN_OR_RETURN(std::string var, text("bot_token_env"));
  const char* token = std::getenv(var.c_str());
  if (token == nullptr || *token == '\0') {
    return Status(Code::kFailedPrecondition,
                  "the environment variable " + var + " (the Telegram bot token) is not set",
                  at + "/bot_token_env");
  }
  std::string t = token;
  if (t.find_first_of(" \r\n\t/?#") != std::string::npos) {
    // Never echo it: it is a secret even when malformed.
    return Status(Code::kFailedPrecondition,
                  "the environment variable " + var + " does not hold a bot token",
                  at + "/bot_token_env");
  }
  const int64_t timeout_ms = action.retry.timeout_ms > 0 ? action.retry.timeout_ms : 10'000;
  return std::unique_ptr<TelegramEffector>(
      new TelegramEffector(action.name, std::move(base_url), std::move(t), timeout_ms, http, env));
}

Status TelegramEffector::Validate(const Json& args) const {
  if (!args.is_object()) return InvalidArgument("args must be a JSON object", "/args");
  for (const char* key : {"chat_id", "text"}) {
    if (!args.contains(key) || !args[key].is_string() || args[key].get<std::string>().empty()) {
      return InvalidArgument("must be a non-empty string", std::string("/args/") + key);
    }
  }
  return Status::Ok();
}

std::string TelegramEffector::Redacted(std::string text) const {
  return RedactAll(std::move(text), TokenForms());
}

std::vector<std::string> TelegramEffector::TokenForms() const {
  // As sent, and as a target that echoes the URL may write it back.
  std::string encoded;
  for (char c : token_) encoded += c == ':' ? std::string("%3A") : std::string(1, c);
  return {token_, encoded};
}

EffectAttempt TelegramEffector::Execute(const WorkItem& item, EffectContext&) {
  EffectAttempt attempt;
  if (Status valid = Validate(item.args); !valid.ok()) {
    attempt.status = valid;  // permanent: the args cannot become a message
    return attempt;
  }
  const std::string upstream = "telegram sendMessage (" + kind_ + ")";
  HttpRequest request;
  request.method = "POST";
  // The token is put into the URL here, at send time, and nowhere else.
  request.url = base_url_ + "/bot" + token_ + "/sendMessage";
  request.headers = {{"Content-Type", "application/json"}, {"Accept", "application/json"}};
  request.body = DumpJson(Json{{"chat_id", item.args["chat_id"]}, {"text", item.args["text"]}});
  request.timeout_ms = timeout_ms_;
  request.connect_timeout_ms = std::min<int64_t>(timeout_ms_, 10'000);
  request.max_response_bytes = 1u << 20;

  StatusOr<HttpResponse> sent = http_.Send(request);
  if (!sent.ok()) {
    const Status& s = sent.status();
    attempt.status =
        Status(s.code(), Redacted(upstream + ": " + s.message()), s.field(), s.retryable());
    return attempt;
  }
  const HttpResponse& response = *sent;
  std::optional<Json> answer = ParseJsonBody(response.body);
  if (response.status < 200 || response.status > 299) {
    UpstreamError error = ClassifyHttpFailure(upstream, response, env_.WallMillis(), TokenForms());
    std::string message = error.status.message();
    int64_t retry_after_ms = error.retry_after_ms;
    if (answer && answer->is_object()) {
      if (answer->contains("description") && (*answer)["description"].is_string()) {
        message = upstream + ": HTTP " + std::to_string(response.status) + ": " +
                  (*answer)["description"].get<std::string>();
      }
      const Json* params = answer->contains("parameters") ? &(*answer)["parameters"] : nullptr;
      if (params != nullptr && params->is_object() && params->contains("retry_after") &&
          (*params)["retry_after"].is_number_integer()) {
        // Telegram says how long its flood control lasts in the body.
        int64_t seconds = std::clamp<int64_t>((*params)["retry_after"].get<int64_t>(), 0, 86'400);
        if (error.status.retryable()) retry_after_ms = std::max(retry_after_ms, seconds * 1000);
      }
    }
    attempt.status = Status(error.status.code(), Redacted(std::move(message)), error.status.field(),
                            error.status.retryable());
    attempt.retry_after_ms = retry_after_ms;
    return attempt;
  }
  if (!answer || !answer->is_object() || !answer->value("ok", false)) {
    attempt.status = Status(Code::kUnavailable,
                            Redacted(upstream + ": HTTP " + std::to_string(response.status) +
                                     " without {\"ok\": true}"),
                            "", /*retryable=*/true);
    return attempt;
  }
  // What is stored and shown is kept clear of the token: a compatible
  // server may echo the request's URL in its answer.
  Json body = RedactAllIn(std::move(*answer), TokenForms());
  const Json& result = body.contains("result") ? body["result"] : Json();
  if (result.is_object() && result.contains("message_id")) {
    const Json& id = result["message_id"];
    attempt.result.external_ref = id.is_string() ? id.get<std::string>() : id.dump();
  }
  attempt.result.result = Json{{"status", response.status}, {"body", std::move(body)}};
  return attempt;
}

StatusOr<LookupResult> TelegramEffector::Lookup(const WorkItem&) {
  return FailedPrecondition("effector " + kind_ + " has no lookup");
}

StatusOr<std::vector<ListedRecord>> TelegramEffector::List() {
  return FailedPrecondition("effector " + kind_ + " has no list_url");
}

}  // namespace idem
