#include "daemon/apply/http_effector.h"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <set>
#include <string_view>

#include "daemon/apply/telegram_effector.h"
#include "daemon/core/env_vars.h"
#include "daemon/core/failpoints.h"
#include "daemon/core/json.h"
#include "providers/errors.h"

namespace idem {
namespace {

using Level = HttpEffectorConfig::Level;

const std::set<std::string, std::less<>>& KnownKeys() {
  static const auto* keys = new std::set<std::string, std::less<>>{
      "method",     "url",    "idempotency", "idempotency_header", "headers",
      "upsert_key", "lookup", "list_url",    "fingerprint_field",  "external_ref"};
  return *keys;
}

// nlohmann throws on a malformed pointer; this is the one place we build them.
std::optional<Json::json_pointer> Pointer(const std::string& text) {
  try {
    return Json::json_pointer(text);
  } catch (const Json::exception&) {
    return std::nullopt;
  }
}

// The value at `pointer` in `doc` as text (strings as they are, integers in
// decimal), or nullopt when absent or of another type.
std::optional<std::string> TextAt(const Json& doc, const std::string& pointer) {
  std::optional<Json::json_pointer> p = Pointer(pointer);
  if (!p || !(doc.is_object() || doc.is_array()) || !doc.contains(*p)) return std::nullopt;
  const Json& v = doc.at(*p);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_integer() || v.is_number_unsigned()) return v.dump();
  return std::nullopt;
}

// The placeholder names in `url_template` ("{key}" -> "key"); InvalidArgument
// for an unclosed brace.
StatusOr<std::vector<std::string>> Placeholders(const std::string& url_template) {
  std::vector<std::string> names;
  size_t pos = 0;
  while ((pos = url_template.find('{', pos)) != std::string::npos) {
    size_t end = url_template.find('}', pos);
    if (end == std::string::npos) return InvalidArgument("unclosed '{' in the URL");
    names.push_back(url_template.substr(pos + 1, end - pos - 1));
    pos = end + 1;
  }
  return names;
}

Status CheckUrl(const std::string& url, const std::string& field, bool allow_key,
                bool allow_placeholders) {
  if (!(url.starts_with("http://") || url.starts_with("https://")) || url.size() < 9 ||
      url.find_first_of(" \r\n\t") != std::string::npos) {
    return InvalidArgument("must be an http:// or https:// URL", field);
  }
  StatusOr<std::vector<std::string>> names = Placeholders(url);
  if (!names.ok()) return names.status().WithField(field);
  for (const std::string& name : *names) {
    if (!allow_placeholders) return InvalidArgument("takes no placeholders", field);
    if (name == "fingerprint" || name == "work_id") continue;
    if (name == "key") {
      if (!allow_key) return InvalidArgument("{key} needs upsert_key", field);
      continue;
    }
    return InvalidArgument("unknown placeholder {" + name + "} (use {key}, {fingerprint})", field);
  }
  return Status::Ok();
}

// The candidate records of a lookup or list answer.
StatusOr<std::vector<Json>> Items(const Json& answer, const std::string& items_pointer,
                                  std::string_view upstream) {
  const Json* list = &answer;
  if (!items_pointer.empty()) {
    std::optional<Json::json_pointer> p = Pointer(items_pointer);
    if (!p || !answer.is_object() || !answer.contains(*p)) {
      return MalformedAnswerError(upstream, "the lookup answer has nothing at " + items_pointer);
    }
    list = &answer.at(*p);
  }
  std::vector<Json> out;
  if (list->is_array()) {
    for (const Json& item : *list) out.push_back(item);
    return out;
  }
  if (list->is_object() && items_pointer.empty()) {
    out.push_back(*list);
    return out;
  }
  if (list->is_null()) return out;
  return MalformedAnswerError(upstream, "the lookup answer is neither a record nor a list");
}

Json AnswerBody(const HttpResponse& response) {
  if (response.body.empty()) return nullptr;
  if (std::optional<Json> j = ParseJsonBody(response.body)) return std::move(*j);
  // Kept as text; bytes that are not UTF-8 (a latin-1 answer) could not be
  // stored, and a completion that cannot be recorded would run the effect
  // again on the next attempt.
  return ValidUtf8Text(response.body);
}

}  // namespace

StatusOr<HttpEffectorConfig> ParseHttpEffectorConfig(const ActionConfig& action) {
  const std::string base = "/actions/" + JsonPointerToken(action.name) + "/effector";
  HttpEffectorConfig c;
  c.kind = action.name;
  c.timeout_ms = action.retry.timeout_ms > 0 ? action.retry.timeout_ms : c.timeout_ms;
  const Json& effector = action.effector;
  if (!effector.is_object()) return InvalidArgument("must be an object", base);
  for (const auto& [name, value] : effector.items()) {
    if (name != "http") return InvalidArgument("unknown effector type '" + name + "'", base);
  }
  if (!effector.contains("http") || !effector["http"].is_object()) {
    return InvalidArgument("must have an http object", base + "/http");
  }
  const std::string at = base + "/http";
  const Json& node = effector["http"];
  for (const auto& [name, value] : node.items()) {
    if (!KnownKeys().contains(name)) {
      return InvalidArgument("unknown key '" + name + "'", at + "/" + JsonPointerToken(name));
    }
  }
  auto str_in = [](const Json& obj, const std::string& where, const char* key, std::string& out,
                   bool required) -> Status {
    if (!obj.contains(key)) {
      return required ? InvalidArgument("is required", where + "/" + key) : Status::Ok();
    }
    if (!obj[key].is_string() || obj[key].get<std::string>().empty()) {
      return InvalidArgument("must be a non-empty string", where + "/" + key);
    }
    out = obj[key].get<std::string>();
    return Status::Ok();
  };
  auto pointer_in = [&](const Json& obj, const std::string& where, const char* key,
                        std::string& out) -> Status {
    RETURN_IF_ERROR(str_in(obj, where, key, out, false));
    if (obj.contains(key) && (!out.starts_with("/") || !Pointer(out))) {
      return InvalidArgument("must be a JSON pointer such as /id", where + "/" + key);
    }
    return Status::Ok();
  };
  auto str = [&](const char* key, std::string& out, bool required) {
    return str_in(node, at, key, out, required);
  };
  auto pointer = [&](const char* key, std::string& out) { return pointer_in(node, at, key, out); };

  std::string level;
  RETURN_IF_ERROR(str("idempotency", level, true));
  if (level == "header") {
    c.level = Level::kHeader;
  } else if (level == "upsert") {
    c.level = Level::kUpsert;
    c.method = "PUT";
  } else if (level == "check_then_act") {
    c.level = Level::kCheckThenAct;
  } else if (level == "none") {
    c.level = Level::kNone;
  } else {
    return InvalidArgument("must be header, upsert, check_then_act or none", at + "/idempotency");
  }
  RETURN_IF_ERROR(str("method", c.method, false));
  if (c.method != "POST" && c.method != "PUT" && c.method != "PATCH" && c.method != "DELETE") {
    return InvalidArgument("must be POST, PUT, PATCH or DELETE", at + "/method");
  }
  RETURN_IF_ERROR(str("idempotency_header", c.idempotency_header, false));
  if (c.idempotency_header.find_first_of(" :\r\n\t") != std::string::npos) {
    return InvalidArgument("is not a header name", at + "/idempotency_header");
  }
  RETURN_IF_ERROR(pointer("upsert_key", c.upsert_key));
  RETURN_IF_ERROR(pointer("external_ref", c.external_ref));
  RETURN_IF_ERROR(str("fingerprint_field", c.fingerprint_field, false));
  const bool has_key = !c.upsert_key.empty();

  RETURN_IF_ERROR(str("url", c.url, true));
  RETURN_IF_ERROR(CheckUrl(c.url, at + "/url", has_key, true));
  if (node.contains("lookup")) {
    const std::string lat = at + "/lookup";
    const Json& lookup = node["lookup"];
    if (!lookup.is_object()) return InvalidArgument("must be an object", lat);
    for (const auto& [name, value] : lookup.items()) {
      if (name != "url" && name != "method" && name != "found") {
        return InvalidArgument("unknown key '" + name + "'", lat + "/" + JsonPointerToken(name));
      }
    }
    RETURN_IF_ERROR(str_in(lookup, lat, "url", c.lookup_url, true));
    RETURN_IF_ERROR(CheckUrl(c.lookup_url, lat + "/url", has_key, true));
    RETURN_IF_ERROR(str_in(lookup, lat, "method", c.lookup_method, false));
    if (c.lookup_method != "GET" && c.lookup_method != "POST") {
      return InvalidArgument("must be GET or POST", lat + "/method");
    }
    RETURN_IF_ERROR(pointer_in(lookup, lat, "found", c.lookup_found));
  }
  RETURN_IF_ERROR(str("list_url", c.list_url, false));
  if (!c.list_url.empty()) {
    RETURN_IF_ERROR(CheckUrl(c.list_url, at + "/list_url", false, false));
  }
  if (c.level == Level::kUpsert && !has_key) {
    return InvalidArgument("upsert needs upsert_key (the natural key)", at + "/upsert_key");
  }
  if (c.level == Level::kCheckThenAct && c.lookup_url.empty()) {
    return InvalidArgument("check_then_act needs lookup", at + "/lookup");
  }
  c.embed_fingerprint = c.level == Level::kCheckThenAct || !c.lookup_url.empty();

  if (node.contains("headers")) {
    const Json& headers = node["headers"];
    if (!headers.is_object()) return InvalidArgument("must be an object", at + "/headers");
    for (const auto& [name, value] : headers.items()) {
      std::string field = at + "/headers/" + JsonPointerToken(name);
      if (name.empty() || name.find_first_of(" :\r\n\t") != std::string::npos) {
        return InvalidArgument("is not a header name", field);
      }
      if (!value.is_string()) return InvalidArgument("must be a string", field);
      ASSIGN_OR_RETURN(std::string v,
                       ExpandEnv(value.get<std::string>(), field, &c.stored_secrets));
      if (v.find_first_of("\r\n") != std::string::npos) {
        return InvalidArgument("must not contain CR or LF", field);
      }
      c.headers.emplace_back(name, std::move(v));
    }
  }
  // A target may echo the request in its error answer: what the daemon's
  // own messages hide of its URLs (UrlForMessages) is as secret there.
  RedactionLists lists =
      RedactionListsFor(std::move(c.stored_secrets), {c.url, c.lookup_url, c.list_url});
  c.secrets = std::move(lists.errors);
  c.stored_secrets = std::move(lists.answers);
  return c;
}

StatusOr<std::unique_ptr<Effector>> MakeEffector(const ActionConfig& action, HttpClient& http,
                                                 Env& env) {
  if (action.effector.is_null() || (action.effector.is_object() && action.effector.empty())) {
    return std::unique_ptr<Effector>();
  }
  if (action.effector.is_object() && action.effector.size() == 1 &&
      action.effector.contains("telegram")) {
    // idem's own notification kind (daemon/plans/journal_notifier.h); the
    // config schema lets no user-written action reach this.
    ASSIGN_OR_RETURN(std::unique_ptr<TelegramEffector> telegram,
                     TelegramEffector::Create(action, http, env));
    return std::unique_ptr<Effector>(std::move(telegram));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<HttpEffector> effector, HttpEffector::Create(action, http, env));
  return std::unique_ptr<Effector>(std::move(effector));
}

StatusOr<std::unique_ptr<HttpEffector>> HttpEffector::Create(const ActionConfig& action,
                                                             HttpClient& http, Env& env) {
  ASSIGN_OR_RETURN(HttpEffectorConfig config, ParseHttpEffectorConfig(action));
  return std::unique_ptr<HttpEffector>(new HttpEffector(std::move(config), http, env));
}

StatusOr<std::string> HttpEffector::NaturalKey(const Json& args) const {
  std::optional<std::string> key = TextAt(args, config_.upsert_key);
  if (!key || key->empty()) {
    return InvalidArgument(
        "the key field " + config_.upsert_key + " must be a non-empty string or an integer",
        "/args" + config_.upsert_key);
  }
  if (*key == "." || *key == "..") {
    // A dot segment in the URL names the collection or its parent (libcurl
    // and servers resolve it), not one resource of it.
    return InvalidArgument("the key field " + config_.upsert_key +
                               " cannot be \".\" or \"..\": in the URL that names another "
                               "resource than one item",
                           "/args" + config_.upsert_key);
  }
  return std::move(*key);
}

Status HttpEffector::Validate(const Json& args) const {
  if (!args.is_object()) return InvalidArgument("args must be a JSON object", "/args");
  if (!config_.upsert_key.empty()) RETURN_IF_ERROR(NaturalKey(args).status());
  return Status::Ok();
}

int64_t HttpEffector::UnknownOutcomeSettleMs() const {
  // A create that timed out may land up to a whole call's time later: a
  // lookup sooner would miss it, a keyed retry sooner would be told 409.
  return config_.level == Level::kCheckThenAct || config_.level == Level::kHeader
             ? config_.timeout_ms
             : 0;
}

int64_t HttpEffector::AttemptBudgetMs() const {
  int calls = config_.level == Level::kCheckThenAct ? 2 : 1;
  return calls * config_.timeout_ms;
}

StatusOr<std::string> HttpEffector::ExpandUrl(const std::string& url_template,
                                              const WorkItem& item) const {
  std::string out;
  size_t pos = 0;
  while (true) {
    size_t start = url_template.find('{', pos);
    if (start == std::string::npos) break;
    size_t end = url_template.find('}', start);
    if (end == std::string::npos) break;  // rejected at parse time
    out += url_template.substr(pos, start - pos);
    std::string name = url_template.substr(start + 1, end - start - 1);
    if (name == "key") {
      ASSIGN_OR_RETURN(std::string key, NaturalKey(item.args));
      out += PercentEncode(key);
    } else {
      out += PercentEncode(item.work_id);
    }
    pos = end + 1;
  }
  out += url_template.substr(pos);
  return out;
}

HttpRequest HttpEffector::BaseRequest(std::string method, std::string url) const {
  HttpRequest request;
  request.method = std::move(method);
  request.url = std::move(url);
  request.headers = config_.headers;
  request.headers.emplace_back("Accept", "application/json");
  request.timeout_ms = config_.timeout_ms;
  request.connect_timeout_ms = std::min<int64_t>(config_.timeout_ms, 10'000);
  request.max_response_bytes = 4u << 20;
  return request;
}

std::string HttpEffector::RedactSecrets(std::string text) const {
  for (const std::string& secret : config_.secrets) text = Redact(std::move(text), secret);
  return text;
}

EffectAttempt HttpEffector::Exchange(const HttpRequest& request, HttpResponse* response,
                                     std::initializer_list<int> accepted) const {
  EffectAttempt attempt;
  const std::string upstream = "effector " + config_.kind;
  StatusOr<HttpResponse> sent = http_.Send(request);
  if (!sent.ok()) {
    const Status& s = sent.status();
    attempt.status =
        Status(s.code(), RedactSecrets(upstream + ": " + s.message()), s.field(), s.retryable());
    return attempt;
  }
  *response = std::move(sent).value();
  bool ok = response->status >= 200 && response->status <= 299;
  for (int code : accepted) ok = ok || response->status == code;
  if (ok) return attempt;
  UpstreamError error =
      ClassifyHttpFailure(upstream, *response, env_.WallMillis(), config_.secrets);
  attempt.status = error.status;
  attempt.retry_after_ms = error.retry_after_ms;
  return attempt;
}

EffectAttempt HttpEffector::CreateRecord(const WorkItem& item, EffectContext* context) {
  EffectAttempt attempt;
  StatusOr<std::string> url = ExpandUrl(config_.url, item);
  if (!url.ok()) {
    attempt.status = url.status();  // permanent: the args lack the key
    return attempt;
  }
  HttpRequest request = BaseRequest(config_.method, std::move(url).value());
  Json body = item.args;
  if (config_.embed_fingerprint && body.is_object()) body[config_.fingerprint_field] = item.work_id;
  request.body = DumpJson(body);
  request.headers.emplace_back("Content-Type", "application/json");
  if (config_.level == Level::kHeader) {
    // The work_id, on every attempt: a per-attempt key would make each retry new work.
    request.headers.emplace_back(config_.idempotency_header, item.work_id);
  } else {
    // No key the target could dedupe on: never a kept-alive connection,
    // which libcurl would silently send the create down twice should it
    // die after the target acted (check_then_act looked up first only once).
    request.fresh_connection = true;
  }
  HttpResponse response;
  attempt = Exchange(request, &response);
  if (!attempt.status.ok()) {
    if (config_.level == Level::kHeader && response.status == 409) {
      // The idempotency-key draft's "a request with this key is in
      // progress": an earlier attempt that timed out here is still running
      // there. Wait a call's time for it to finish, then its answer replays.
      attempt.settle_ms = config_.timeout_ms;
    }
    return attempt;
  }
  Json answer = RedactAllIn(AnswerBody(response), config_.stored_secrets);
  attempt.result.external_ref = TextAt(answer, config_.external_ref).value_or("");
  attempt.result.result = Json{{"status", response.status}, {"body", std::move(answer)}};
  if (context != nullptr && !attempt.result.external_ref.empty()) {
    // Proof first (R17): if this write is lost, the effect stays findable by
    // its fingerprint, so the next attempt's lookup adopts it.
    Status recorded = context->RecordExternalRef(attempt.result.external_ref);
    if (!recorded.ok()) {
      attempt.status = recorded.Annotate("recording external_ref after the effect landed");
      attempt.abandoned = true;
    }
  }
  return attempt;
}

StatusOr<LookupResult> HttpEffector::DoLookup(const WorkItem& item, int64_t* retry_after_ms) {
  ASSIGN_OR_RETURN(std::string url, ExpandUrl(config_.lookup_url, item));
  HttpRequest request = BaseRequest(config_.lookup_method, std::move(url));
  if (config_.lookup_method == "POST") {
    request.body = DumpJson(Json{{config_.fingerprint_field, item.work_id}});
    request.headers.emplace_back("Content-Type", "application/json");
  }
  HttpResponse response;
  EffectAttempt exchanged = Exchange(request, &response, {404, 410});
  if (!exchanged.status.ok()) {
    if (retry_after_ms != nullptr) *retry_after_ms = exchanged.retry_after_ms;
    return exchanged.status;
  }
  LookupResult result;
  if (response.status == 404 || response.status == 410) return result;
  const std::string upstream = "effector " + config_.kind + " lookup";
  std::optional<Json> answer = ParseJsonBody(response.body);
  if (!answer) return MalformedAnswerError(upstream, "the lookup answer is not JSON");
  ASSIGN_OR_RETURN(std::vector<Json> items, Items(*answer, config_.lookup_found, upstream));
  for (Json& record : items) {
    if (!record.is_object()) continue;
    auto fp = record.find(config_.fingerprint_field);
    // A search that also returns near matches must not adopt another work's record.
    if (fp != record.end() && !(fp->is_string() && fp->get<std::string>() == item.work_id)) {
      continue;
    }
    ++result.matches;
    if (result.found) continue;  // the first is the one adopted; the rest are counted
    result.found = true;
    result.record = RedactAllIn(std::move(record), config_.stored_secrets);
    result.external_ref = TextAt(result.record, config_.external_ref).value_or("");
  }
  return result;
}

StatusOr<LookupResult> HttpEffector::Lookup(const WorkItem& item) {
  if (!CanLookup()) return FailedPrecondition("effector " + config_.kind + " has no lookup");
  return DoLookup(item, nullptr);
}

StatusOr<std::vector<ListedRecord>> HttpEffector::List() {
  if (!CanList()) return FailedPrecondition("effector " + config_.kind + " has no list_url");
  HttpRequest request = BaseRequest("GET", config_.list_url);
  HttpResponse response;
  EffectAttempt exchanged = Exchange(request, &response);
  if (!exchanged.status.ok()) return exchanged.status;
  const std::string upstream = "effector " + config_.kind + " list";
  std::optional<Json> answer = ParseJsonBody(response.body);
  if (!answer) return MalformedAnswerError(upstream, "the list answer is not JSON");
  ASSIGN_OR_RETURN(std::vector<Json> items, Items(*answer, config_.lookup_found, upstream));
  std::vector<ListedRecord> out;
  for (const Json& record : items) {
    if (!record.is_object()) continue;
    ListedRecord listed;
    auto fp = record.find(config_.fingerprint_field);
    if (fp != record.end() && fp->is_string()) listed.fingerprint = fp->get<std::string>();
    listed.external_ref =
        RedactAll(TextAt(record, config_.external_ref).value_or(""), config_.stored_secrets);
    out.push_back(std::move(listed));
  }
  return out;
}

EffectAttempt HttpEffector::Execute(const WorkItem& item, EffectContext& context) {
  if (config_.level != Level::kCheckThenAct) return CreateRecord(item, nullptr);
  EffectAttempt attempt;
  StatusOr<LookupResult> found = DoLookup(item, &attempt.retry_after_ms);
  if (!found.ok()) {
    attempt.status = found.status();
    return attempt;
  }
  if (found->found) {
    // An earlier attempt created it and crashed before recording: adopt it.
    attempt.result.external_ref = found->external_ref;
    attempt.result.result =
        Json{{"status", 200}, {"body", std::move(found->record)}, {"found_existing", true}};
    return attempt;
  }
  if (Status fp = Failpoints::Hit("apply.after_lookup"); !fp.ok()) {
    attempt.status = fp;
    attempt.abandoned = true;
    return attempt;
  }
  return CreateRecord(item, &context);
}

}  // namespace idem
