#include "daemon/plans/journal_notifier.h"

#include <algorithm>
#include <cstdlib>

#include "daemon/apply/work_identity.h"
#include "daemon/core/env_vars.h"
#include "daemon/core/hidden_text.h"
#include "daemon/core/json.h"
#include "daemon/obs/log.h"
#include "daemon/obs/trace.h"

namespace idem {
namespace {

// Telegram refuses texts over 4096 characters; bytes are a safe bound.
constexpr size_t kMaxTelegramTextBytes = 4000;
constexpr int64_t kNotifyWindowMs = 7LL * 24 * 3600 * 1000;

ActionConfig NotifyKind(const std::string& name, Json effector) {
  ActionConfig a;
  a.name = name;
  a.identity_fields = {"/event_id"};
  a.identity_version = "v1";
  a.window_ms = kNotifyWindowMs;
  a.on_duplicate = "return_original";
  a.effector = std::move(effector);
  // Patient retries: a human channel that is down for a while should still
  // get the message when it comes back (about 17 minutes of backoff at most,
  // longer when the upstream asks for it).
  a.retry.attempts = 10;
  a.retry.base_ms = 1'000;
  a.retry.cap_ms = 3600LL * 1000;
  a.retry.timeout_ms = 10'000;
  return a;
}

std::string Label(const std::string& kind) {
  if (kind == "awaiting_approval") return "plan awaiting approval";
  if (kind == "approval_overdue") return "approval overdue";
  if (kind == "escalation") return "escalation";
  if (kind == "dead_letter") return "dead letter";
  return kind;
}

// What an approval asks for, in a chat message: each action's kind and
// args (a plan's detail.actions), so the operator sees what they approve
// before they open the link. Args are cut; at most kMaxTextActions shown.
constexpr size_t kMaxTextActions = 10;
constexpr size_t kMaxTextArgsBytes = 300;
std::string ActionLines(const Json& detail) {
  if (!detail.is_object()) return "";
  auto it = detail.find("actions");
  if (it == detail.end() || !it->is_array() || it->empty()) return "";
  std::string out = "\n\nactions:";
  size_t shown = 0;
  for (const Json& a : *it) {
    if (shown == kMaxTextActions) break;
    ++shown;
    // Shown as the operator page and the CLI show it: a character that
    // hides or reorders text is an escape ("O-1<U+00AD>000" is no O-1000).
    std::string args =
        a.is_object() && a.contains("args")
            ? EscapeHiddenInJson(a["args"].dump(-1, ' ', false, Json::error_handler_t::replace))
            : "{}";
    out += "\n- " + ActionKind(a).value_or("?") + " " + CutUtf8(args, kMaxTextArgsBytes, "...");
  }
  if (it->size() > shown) out += "\n(and " + std::to_string(it->size() - shown) + " more)";
  return out;
}

}  // namespace

StatusOr<std::unique_ptr<JournalNotifier>> JournalNotifier::Create(
    const NotificationsConfig& config, Journal& journal, StableClock& clock) {
  std::vector<ActionConfig> kinds;
  if (config.webhook) {
    Json headers = Json::object();
    for (const auto& [name, value] : config.webhook->headers) {
      RETURN_IF_ERROR(
          ExpandEnv(value, "/notifications/webhook/headers/" + JsonPointerToken(name)).status());
      headers[name] = value;  // ${VAR} expanded by the effector, kept in its memory only
    }
    Json http = {{"url", config.webhook->url}, {"idempotency", "header"}};
    if (!headers.empty()) http["headers"] = headers;
    kinds.push_back(NotifyKind(kWebhookNotifyKind, Json{{"http", http}}));
  }
  if (config.telegram) {
    const char* token = std::getenv(config.telegram->bot_token_env.c_str());
    if (token == nullptr || *token == '\0') {
      return Status(Code::kFailedPrecondition,
                    "the environment variable " + config.telegram->bot_token_env +
                        " (the Telegram bot token) is not set",
                    "/notifications/telegram/bot_token_env");
    }
    kinds.push_back(NotifyKind(kTelegramNotifyKind,
                               Json{{"telegram",
                                     {{"base_url", config.telegram->base_url},
                                      {"bot_token_env", config.telegram->bot_token_env}}}}));
  }
  return std::unique_ptr<JournalNotifier>(
      new JournalNotifier(config, journal, clock, std::move(kinds)));
}

Json JournalNotifier::WebhookBody(const Notification& n) {
  return Json{{"event_id", n.event_id}, {"kind", n.kind},       {"subject_id", n.subject_id},
              {"reason", n.reason},     {"command", n.command}, {"link", n.link},
              {"detail", n.detail}};
}

std::string JournalNotifier::TelegramText(const Notification& n) {
  std::string head = "idem: " + Label(n.kind) + " " + n.subject_id + "\n";
  std::string tail = "\n\n" + n.command;
  if (!n.link.empty()) tail += "\n" + n.link;
  const std::string actions = ActionLines(n.detail);
  // CutUtf8 keeps max bytes and then appends its marker. The command and
  // link always fit; a long reason leaves the actions room, and they take
  // what is left.
  const size_t fixed = head.size() + tail.size() + 6;
  const size_t room = kMaxTelegramTextBytes > fixed ? kMaxTelegramTextBytes - fixed : 0;
  std::string reason =
      CutUtf8(n.reason, actions.empty() ? room : std::min<size_t>(room, 1'000), "...");
  const size_t left = room > reason.size() ? room - reason.size() : 0;
  return CutUtf8(head + reason + CutUtf8(actions, left, "...") + tail, kMaxTelegramTextBytes - 3,
                 "...");
}

Json JournalNotifier::ArgsFor(const ActionConfig& kind, const Notification& n) const {
  if (kind.name == kTelegramNotifyKind) {
    return Json{{"event_id", n.event_id},
                {"chat_id", config_.telegram->chat_id},
                {"text", TelegramText(n)}};
  }
  return WebhookBody(n);
}

StatusOr<std::string> JournalNotifier::WorkId(const std::string& kind,
                                              const std::string& event_id) const {
  for (const ActionConfig& k : kinds_) {
    if (k.name != kind) continue;
    ASSIGN_OR_RETURN(KeyMaterial id, ActionWorkId(k, Json{{"event_id", event_id}}));
    return id.key;
  }
  return NotFound("no notification channel " + kind);
}

void JournalNotifier::Notify(const Notification& n) {
  if (n.event_id.empty()) {
    LogEvent(LogLevel::kWarn, "apply.notify_error",
             {{"kind", n.kind}, {"error", "a notification without event_id is not sent"}});
    return;
  }
  // A link given as a path ("/ui/#/plans/x") is made absolute here, where
  // link_base is known; without link_base a path is no use in a message.
  Notification absolute = n;
  if (absolute.link.starts_with("/")) {
    absolute.link = config_.link_base.empty() ? "" : config_.link_base + absolute.link;
  }
  for (const ActionConfig& kind : kinds_) {
    Json args = ArgsFor(kind, absolute);
    StatusOr<KeyMaterial> work_id = ActionWorkId(kind, args);
    StatusOr<Json> identity = ExtractIdentity(args, kind.identity_fields);
    if (!work_id.ok() || !identity.ok()) {
      LogEvent(LogLevel::kWarn, "apply.notify_error",
               {{"event_id", n.event_id},
                {"channel", kind.name},
                {"error", (work_id.ok() ? identity.status() : work_id.status()).ToString()}});
      continue;
    }
    ClaimRequest req;
    req.work_id = work_id->key;
    req.kind = kind.name;
    req.identity = std::move(identity).value();
    req.args = std::move(args);
    req.request_id = n.event_id;
    req.trace_id = CurrentTraceId();  // what caused the notification ("" on the sweeper)
    req.lease_ms = kind.retry.timeout_ms + 1'000;
    req.window_ms = kind.window_ms;
    req.max_attempts = kind.retry.attempts;
    req.now_ms = clock_.NowMillis();
    StatusOr<WorkItem> queued = journal_.Enqueue(req);
    if (!queued.ok()) {
      LogEvent(LogLevel::kWarn, "apply.notify_error",
               {{"event_id", n.event_id},
                {"channel", kind.name},
                {"error", queued.status().ToString()}});
      continue;
    }
    LogEvent(LogLevel::kInfo, "apply.notify_queued",
             {{"event_id", n.event_id},
              {"notification", n.kind},
              {"channel", kind.name},
              {"work_id", queued->work_id},
              {"state", std::string(WorkStateName(queued->state))}});
  }
}

}  // namespace idem
