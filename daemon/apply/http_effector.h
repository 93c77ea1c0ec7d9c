// HttpEffector: an action kind's effect as one HTTP call (or a lookup and a
// call) to the target system, at the idempotency level the target supports
// (R15-R17). Private to the apply component.
//
// Config (`actions.<kind>.effector.http`; url and idempotency are required,
// the rest optional; unknown keys are InvalidArgument):
//
//   method              POST | PUT | PATCH | DELETE. Default POST, PUT for
//                       idempotency: upsert.
//   url                 http:// or https:// URL of the effect. Placeholders,
//                       percent-encoded when substituted:
//                         {key}          the natural key (needs upsert_key)
//                         {fingerprint}  the work_id ({work_id} is the same)
//   idempotency         header          R15: sends `<idempotency_header>:
//                                       <work_id>`; the same key on every
//                                       attempt, never a per-attempt one.
//                       upsert          R16: the call overwrites by a natural
//                                       key we control ({key} in the URL, or
//                                       the key member inside the body).
//                       check_then_act  R17: look the fingerprint up first;
//                                       when found, its id is the external_ref
//                                       and nothing is created; otherwise
//                                       create with the fingerprint embedded
//                                       and record external_ref at once
//                                       (before the completion).
//                       none            no protection at the target: only the
//                                       journal guards (R18 message guard). A
//                                       crash between the call and the record
//                                       can repeat the effect.
//   idempotency_header  header name for level header. Default Idempotency-Key.
//   headers             {name: value} sent on every call (lookups too).
//                       `${VAR}` in a value is replaced at start-up by the
//                       environment variable VAR (secrets stay out of the
//                       file); an unset VAR is FailedPrecondition.
//   upsert_key          JSON pointer into args of the natural key (a string
//                       or an integer). Required for upsert. Fills {key}.
//   lookup              how to find the target's record by fingerprint.
//                       Required for check_then_act; with any level it turns
//                       on reconciliation (R23).
//     url               the lookup URL ({fingerprint}, {key} placeholders).
//     method            GET (default) or POST; POST sends the JSON body
//                       {"<fingerprint_field>": "<work_id>"}.
//     found             JSON pointer of the matches in the answer (e.g.
//                       /data). Default: the answer itself when it is an
//                       array, else the answer is the one match. 404 and 410
//                       mean "not found", as does an empty array.
//   list_url            GET URL listing every record of the target (matches
//                       at lookup.found, as above). Optional: lets
//                       reconciliation report records the journal does not
//                       know ("extra").
//   fingerprint_field   the top-level body member idem embeds the work_id in
//                       (check_then_act, and any level with a lookup).
//                       Default idem_fingerprint. A lookup match carrying the
//                       member with another value is ignored.
//   external_ref        JSON pointer of the target's id in the create answer
//                       and in a found record. Default /id.
//
// The request body is the item's args as JSON, plus the fingerprint member
// where embedded; Content-Type: application/json. Each call's timeout is the
// kind's retry.timeout.
//
// The stored result is {"status": <HTTP status>, "body": <the answer: JSON,
// or text when not JSON, or null when empty>}; a check_then_act attempt that
// found an earlier attempt's record stores {"status": 200, "body": <the
// record>, "found_existing": true}. An answer that echoes a secret of the
// request is stored with it as "[redacted]" (every string, member names
// included; HttpEffectorConfig::stored_secrets), and external_ref is read
// from what is stored.
//
// Failures: HttpClient's network errors as they are (retryable); non-2xx
// answers classified by providers/errors.h (408, 409, 429, 5xx retryable,
// other 4xx permanent, Retry-After honoured up to retry.cap); a 2xx lookup
// answer that is not JSON is retryable Unavailable. A failure's message
// never holds a secret, even when the target's answer echoes the request:
// the `${VAR}` header values and what UrlForMessages hides of the
// configured URLs (see HttpEffectorConfig::secrets) show as "[redacted]".
//
// Failpoint: apply.after_lookup (check_then_act: the lookup found nothing,
// the create has not been sent).
//
// Thread-safety: immutable after Create; Execute / Lookup / List may run
// concurrently.
#pragma once

#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "daemon/apply/effector.h"

namespace idem {

struct HttpEffectorConfig {
  enum class Level { kHeader, kUpsert, kCheckThenAct, kNone };

  std::string kind;
  std::string method = "POST";
  std::string url;
  Level level = Level::kHeader;
  std::string idempotency_header = "Idempotency-Key";
  HttpHeaders headers;  // values with ${VAR} already substituted
  // Redacted from messages (an answer may echo the request): the ${VAR}
  // values, and the parts of url, lookup.url and list_url that the daemon's
  // own messages hide (UrlSecrets: userinfo and its Basic credential, query
  // values, secret-looking path segments; a template's literal text only).
  std::vector<std::string> secrets;
  // Redacted from what is stored of a 2xx answer (the result body, a found
  // record): the ${VAR} values, and the URL parts in `secrets` that are not
  // PlainSegment (longer than 12 characters, or with characters other than
  // letters, digits and ._:-). A short plain query value (format=json) is
  // hidden from messages but not from data, where it is likelier the
  // answer's own text ("application/json") than an echo.
  std::vector<std::string> stored_secrets;
  std::string upsert_key;  // JSON pointer into args
  std::string lookup_url;
  std::string lookup_method = "GET";
  std::string lookup_found;  // JSON pointer of the matches in a lookup/list answer
  std::string list_url;
  std::string fingerprint_field = "idem_fingerprint";
  bool embed_fingerprint = false;
  std::string external_ref = "/id";  // JSON pointer of the target's id
  int64_t timeout_ms = 10'000;
};

// Parses `action.effector.http` (see above). InvalidArgument with the field
// "/actions/<kind>/effector/http/<key>" on a bad node.
StatusOr<HttpEffectorConfig> ParseHttpEffectorConfig(const ActionConfig& action);

class HttpEffector final : public Effector {
 public:
  // `http` and `env` must outlive the effector.
  static StatusOr<std::unique_ptr<HttpEffector>> Create(const ActionConfig& action,
                                                        HttpClient& http, Env& env);

  Status Validate(const Json& args) const override;
  int64_t AttemptBudgetMs() const override;
  int64_t UnknownOutcomeSettleMs() const override;
  EffectAttempt Execute(const WorkItem& item, EffectContext& context) override;
  bool CanLookup() const override { return !config_.lookup_url.empty(); }
  bool CanList() const override { return !config_.list_url.empty(); }
  StatusOr<LookupResult> Lookup(const WorkItem& item) override;
  StatusOr<std::vector<ListedRecord>> List() override;

  const HttpEffectorConfig& config() const { return config_; }

 private:
  HttpEffector(HttpEffectorConfig config, HttpClient& http, Env& env)
      : config_(std::move(config)), http_(http), env_(env) {}

  // The natural key of `args` as text; InvalidArgument when absent.
  StatusOr<std::string> NaturalKey(const Json& args) const;
  // `url_template` with its placeholders filled for `item`.
  StatusOr<std::string> ExpandUrl(const std::string& url_template, const WorkItem& item) const;
  HttpRequest BaseRequest(std::string method, std::string url) const;
  // One exchange; non-2xx answers other than those in `accepted` become the
  // classified failure (with retry_after_ms).
  EffectAttempt Exchange(const HttpRequest& request, HttpResponse* response,
                         std::initializer_list<int> accepted = {}) const;
  // The effect call itself; with a context, external_ref is recorded at once.
  EffectAttempt CreateRecord(const WorkItem& item, EffectContext* context);
  StatusOr<LookupResult> DoLookup(const WorkItem& item, int64_t* retry_after_ms);
  std::string RedactSecrets(std::string text) const;

  const HttpEffectorConfig config_;
  HttpClient& http_;
  Env& env_;
};

}  // namespace idem
