// TelegramEffector: sends one message through a Telegram-Bot-API-compatible
// server (sendMessage). Private to the apply component; idem's own
// notification kind (daemon/plans/journal_notifier.h) is its only user.
//
// Config (`effector.telegram`, built by the notifier, not user-written):
//   base_url       the Bot API's address (https://api.telegram.org, or a
//                  fake in tests), without a trailing '/'.
//   bot_token_env  the environment variable holding the bot token. Read
//                  once at Create (FailedPrecondition when unset); the token
//                  lives only in this object's memory.
//
// Args: {"chat_id": string, "text": string, ...}; other members (the
// notification's event_id, which is the kind's identity) are not sent.
//
// Wire format: POST <base_url>/bot<token>/sendMessage with the JSON body
// {"chat_id", "text"}. An answer {"ok": true, "result": {"message_id": N,
// ...}} is the effect; external_ref is the message_id. Failures answer
// {"ok": false, "error_code": N, "description": "...", "parameters":
// {"retry_after": S}}: classified by HTTP status as providers/errors.h does
// (429 and 5xx retryable; other 4xx permanent), and `parameters.retry_after`
// (seconds) is honoured as a Retry-After. A 2xx whose body is not ok:true
// is retryable Unavailable.
//
// Idempotency: none. The Bot API has no idempotency key, so only the
// journal guards (R18 message guard): a crash after the message was sent
// and before its completion was recorded sends it again when the work is
// retried (at-least-once across that window; exactly once otherwise).
//
// Secrets: the token is in the URL only. It is redacted from every error
// message; the stored result is the Bot API's answer, which does not carry
// it; the work item's args never hold it.
//
// Thread-safety: immutable after Create; Execute may run concurrently.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "daemon/apply/effector.h"

namespace idem {

class TelegramEffector final : public Effector {
 public:
  // InvalidArgument (field "/actions/<kind>/effector/telegram/...") for a bad
  // node; FailedPrecondition when the token variable is unset.
  static StatusOr<std::unique_ptr<TelegramEffector>> Create(const ActionConfig& action,
                                                            HttpClient& http, Env& env);

  Status Validate(const Json& args) const override;
  int64_t AttemptBudgetMs() const override { return timeout_ms_; }
  EffectAttempt Execute(const WorkItem& item, EffectContext& context) override;
  bool CanLookup() const override { return false; }
  bool CanList() const override { return false; }
  StatusOr<LookupResult> Lookup(const WorkItem&) override;
  StatusOr<std::vector<ListedRecord>> List() override;

 private:
  TelegramEffector(std::string kind, std::string base_url, std::string token, int64_t timeout_ms,
                   HttpClient& http, Env& env)
      : kind_(std::move(kind)),
        base_url_(std::move(base_url)),
        token_(std::move(token)),
        timeout_ms_(timeout_ms),
        http_(http),
        env_(env) {}

  std::string Redacted(std::string text) const;
  std::vector<std::string> TokenForms() const;

  const std::string kind_;
  const std::string base_url_;
  const std::string token_;
  const int64_t timeout_ms_;
  HttpClient& http_;
  Env& env_;
};

}  // namespace idem
