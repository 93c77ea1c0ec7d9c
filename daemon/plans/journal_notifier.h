// JournalNotifier: the Notifier that sends through idem's own journal.
//
// Each configured channel (config `notifications`: webhook, telegram) is an
// internal action kind of the ApplyEngine (ApplyOptions::internal_kinds,
// from kinds()):
//   idem.notify.webhook   POST <url> with the JSON body {event_id, kind,
//                         subject_id, reason, command, link, detail}, the
//                         configured headers (${VAR} expanded from the
//                         environment) and `Idempotency-Key: <work_id>`
//                         (idempotency: header — the receiver can drop a
//                         repeat);
//   idem.notify.telegram  Bot API sendMessage {chat_id, text} to
//                         <base_url>/bot<token>/sendMessage (idempotency:
//                         none — only the journal guards; see
//                         daemon/apply/telegram_effector.h).
// Both kinds have the identity {/event_id}, so the work_id is a function
// of (event_id, channel): Notify turns each (event, channel) into one
// pending journal record (Journal::Enqueue, a local durable write — never a
// network call) and the apply workers deliver it, retrying with backoff
// (Retry-After and Telegram's parameters.retry_after honoured) and, after a
// crash, re-running work whose lease expired. A second Notify with the same
// event_id finds the record and adds nothing, before or after delivery
// (for the kinds' window, 7 days).
//
// Delivery across a kill -9: the webhook receives each message exactly once
// when it honours Idempotency-Key, otherwise at least once; Telegram gets
// each message once, except when the process dies after sendMessage
// returned and before the completion was recorded: that message is sent
// again when the work is retried (at least once, never lost).
//
// Links: a Notification::link that is a path ("/ui/#/plans/<id>") is
// prefixed with link_base, or dropped ("") when no link_base is configured.
//
// Secrets: the webhook's header values and the bot token are read from the
// environment at Create and kept in the effectors' memory only; the journal
// records hold the message (args) and the receiver's answer, never a secret
// or a URL with the token.
//
// Errors: Create returns FailedPrecondition naming the config field
// ("/notifications/webhook/headers/<name>", "/notifications/telegram/
// bot_token_env") when an environment variable it names is unset. Notify
// never fails its caller: a journal error is logged (apply.notify_error).
//
// Thread-safety: Notify may be called concurrently from any thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "daemon/config/config.h"
#include "daemon/core/env.h"
#include "daemon/core/status.h"
#include "daemon/plans/notifier.h"
#include "daemon/store/store.h"

namespace idem {

inline constexpr char kWebhookNotifyKind[] = "idem.notify.webhook";
inline constexpr char kTelegramNotifyKind[] = "idem.notify.telegram";

class JournalNotifier final : public Notifier {
 public:
  // `journal` and `clock` must outlive the notifier.
  static StatusOr<std::unique_ptr<JournalNotifier>> Create(const NotificationsConfig& config,
                                                           Journal& journal, StableClock& clock);

  // The internal action kinds of the configured channels, for
  // ApplyOptions::internal_kinds (the ApplyEngine that delivers must have them).
  const std::vector<ActionConfig>& kinds() const { return kinds_; }

  void Notify(const Notification& n) override;

  // The journal work_id of `event_id` on channel `kind` (one of kinds()).
  StatusOr<std::string> WorkId(const std::string& kind, const std::string& event_id) const;

  // What each channel sends (exposed for tests and docs).
  static Json WebhookBody(const Notification& n);
  static std::string TelegramText(const Notification& n);

 private:
  JournalNotifier(NotificationsConfig config, Journal& journal, StableClock& clock,
                  std::vector<ActionConfig> kinds)
      : config_(std::move(config)), journal_(journal), clock_(clock), kinds_(std::move(kinds)) {}

  Json ArgsFor(const ActionConfig& kind, const Notification& n) const;

  const NotificationsConfig config_;
  Journal& journal_;
  StableClock& clock_;
  const std::vector<ActionConfig> kinds_;
};

}  // namespace idem
