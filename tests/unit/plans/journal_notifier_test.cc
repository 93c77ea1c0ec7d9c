// JournalNotifier: notifications as journal work of idem's own kinds,
// delivered by the apply engine to a fake webhook (the fake effector, which
// honours Idempotency-Key) and a fake Telegram Bot API.
#include "daemon/plans/journal_notifier.h"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/fakes/fake_telegram.h"
#include "tests/unit/apply/apply_test_util.h"
#include "tests/unit/stderr_capture.h"

namespace idem::testing {
namespace {

constexpr char kToken[] = "123456789:AAF-secret-bot-token_xyz";
constexpr char kTokenEnv[] = "IDEM_TEST_TG_TOKEN";
constexpr char kHookEnv[] = "IDEM_TEST_HOOK_TOKEN";
constexpr char kHookSecret[] = "hook-secret-value-42";

// An apply harness whose engine also runs the notification kinds.
class NotifyHarness {
 public:
  explicit NotifyHarness(bool webhook = true, bool telegram = true,
                         std::string telegram_base = "") {
    setenv(kTokenEnv, kToken, 1);
    setenv(kHookEnv, kHookSecret, 1);
    tg_ = fakes::FakeTelegramServer::Start(kToken);
    REQUIRE(tg_ != nullptr);
    NotificationsConfig config;
    config.link_base = "http://idem.test:7411";
    if (webhook) {
      config.webhook = WebhookNotifyConfig{
          h_.Url("/messages"), {{"Authorization", std::string("Bearer ${") + kHookEnv + "}"}}};
    }
    if (telegram) {
      TelegramNotifyConfig t;
      t.base_url = telegram_base.empty() ? tg_->base_url() : telegram_base;
      t.bot_token_env = kTokenEnv;
      t.chat_id = "4242";
      config.telegram = t;
    }
    h_.config_.notifications = config;
    auto made = JournalNotifier::Create(config, h_.journal(), h_.clock_);
    REQUIRE_MESSAGE(made.ok(), made.status().ToString());
    notifier_ = std::move(made).value();
    h_.options_.internal_kinds = notifier_->kinds();
    h_.options_.notifier = notifier_.get();
  }

  std::string WorkId(const std::string& kind, const std::string& event_id) {
    auto id = notifier_->WorkId(kind, event_id);
    REQUIRE_MESSAGE(id.ok(), id.status().ToString());
    return *id;
  }

  ApplyHarness h_;
  std::unique_ptr<fakes::FakeTelegramServer> tg_;
  std::unique_ptr<JournalNotifier> notifier_;
};

Notification Approval(const std::string& plan_id) {
  Notification n;
  n.event_id = plan_id + ":awaiting_approval";
  n.kind = "awaiting_approval";
  n.subject_id = plan_id;
  n.reason = "refunds over 100 need a human";
  n.command = "idem approve " + plan_id;
  n.link = "http://idem.test:7411/ui/#/plans/" + plan_id;
  n.detail = {{"amount", 250}};
  return n;
}

}  // namespace

TEST_CASE("a notification reaches the webhook and telegram once each") {
  NotifyHarness t;
  t.h_.engine();
  t.notifier_->Notify(Approval("plan_a"));
  CHECK(t.h_.RunDue() == 2);

  // Webhook: the JSON body, the header secret, and the work_id as the key.
  auto calls = t.h_.fake().calls();
  REQUIRE(calls.size() == 1);
  CHECK(calls[0].method == "POST");
  CHECK(calls[0].path == "/messages");
  CHECK(calls[0].headers["authorization"] == std::string("Bearer ") + kHookSecret);
  CHECK(calls[0].headers["idempotency-key"] ==
        t.WorkId(kWebhookNotifyKind, "plan_a:awaiting_approval"));
  Json body = Json::parse(calls[0].body);
  CHECK(body["event_id"] == "plan_a:awaiting_approval");
  CHECK(body["kind"] == "awaiting_approval");
  CHECK(body["subject_id"] == "plan_a");
  CHECK(body["reason"] == "refunds over 100 need a human");
  CHECK(body["command"] == "idem approve plan_a");
  CHECK(body["link"] == "http://idem.test:7411/ui/#/plans/plan_a");
  CHECK(body["detail"]["amount"] == 250);
  CHECK(t.h_.fake().stats().effects == 1);

  // Telegram: one message to the chat with the kind, id, reason, command and link.
  auto messages = t.tg_->messages();
  REQUIRE(messages.size() == 1);
  CHECK(messages[0].chat_id == "4242");
  const std::string& text = messages[0].text;
  CHECK(text.find("plan awaiting approval") != std::string::npos);
  CHECK(text.find("plan_a") != std::string::npos);
  CHECK(text.find("refunds over 100 need a human") != std::string::npos);
  CHECK(text.find("idem approve plan_a") != std::string::npos);
  CHECK(text.find("http://idem.test:7411/ui/#/plans/plan_a") != std::string::npos);
  Json sent = Json::parse(t.tg_->calls()[0].body);
  CHECK(sent == Json{{"chat_id", "4242"}, {"text", text}});  // nothing else goes out

  WorkItem tg_item = t.h_.Get(t.WorkId(kTelegramNotifyKind, "plan_a:awaiting_approval"));
  CHECK(tg_item.state == WorkState::kDone);
  CHECK(tg_item.external_ref == "1");  // the message_id

  // Nothing is left to deliver.
  t.h_.env_.Advance(3'600'000);
  CHECK(t.h_.RunDue() == 0);
  CHECK(t.h_.fake().calls().size() == 1);
  CHECK(t.tg_->messages().size() == 1);
}

TEST_CASE("a telegram answer that echoes the bot token is stored without it") {
  NotifyHarness t(/*webhook=*/false);
  t.tg_->EchoPath();
  t.h_.engine();
  t.notifier_->Notify(Approval("plan_echo"));
  CHECK(t.h_.RunDue() == 1);
  REQUIRE(t.tg_->calls().size() == 1);
  CHECK(t.tg_->calls()[0].path.find(kToken) != std::string::npos);  // the token went out
  WorkItem item = t.h_.Get(t.WorkId(kTelegramNotifyKind, "plan_echo:awaiting_approval"));
  CHECK(item.state == WorkState::kDone);
  const std::string stored = item.result.dump();
  CHECK(stored.find("AAF-secret-bot-token") == std::string::npos);
  CHECK(item.result["body"]["result"]["request_path"] == "/bot[redacted]/sendMessage");
  CHECK(item.external_ref == "1");
}

TEST_CASE("notify called twice with the same event_id sends once per channel") {
  NotifyHarness t;
  t.h_.engine();
  t.notifier_->Notify(Approval("plan_b"));
  t.notifier_->Notify(Approval("plan_b"));  // a retry storm before delivery
  CHECK(t.h_.RunDue() == 2);
  t.notifier_->Notify(Approval("plan_b"));  // and after it
  t.h_.env_.Advance(60'000);
  CHECK(t.h_.RunDue() == 0);
  CHECK(t.h_.fake().calls().size() == 1);
  CHECK(t.tg_->messages().size() == 1);

  t.notifier_->Notify(Approval("plan_c"));  // another event is another message
  CHECK(t.h_.RunDue() == 2);
  CHECK(t.h_.fake().stats().effects == 2);
  CHECK(t.tg_->messages().size() == 2);
}

TEST_CASE("a telegram 429 with retry_after is retried once the wait is over") {
  NotifyHarness t(/*webhook=*/false);
  t.h_.engine();
  t.tg_->FloodNext(1, 30);
  t.notifier_->Notify(Approval("plan_flood"));
  CHECK(t.h_.RunDue() == 1);
  CHECK(t.tg_->messages().empty());
  REQUIRE(t.tg_->calls().size() == 1);
  CHECK(t.tg_->calls()[0].status == 429);
  WorkItem item = t.h_.Get(t.WorkId(kTelegramNotifyKind, "plan_flood:awaiting_approval"));
  CHECK(item.state == WorkState::kFailed);
  CHECK(item.next_attempt_at_ms >= t.h_.clock_.NowMillis() + 30'000);
  CHECK(item.last_error.find("Too Many Requests") != std::string::npos);

  t.h_.env_.Advance(29'000);  // not yet: Telegram said 30 s
  CHECK(t.h_.RunDue() == 0);
  CHECK(t.tg_->calls().size() == 1);
  t.h_.env_.Advance(1'001);
  CHECK(t.h_.RunDue() == 1);
  CHECK(t.tg_->messages().size() == 1);
  CHECK(t.h_.Get(item.work_id).state == WorkState::kDone);
}

TEST_CASE("the bot token is absent from the stored work item, its errors and the logs") {
  // A Bot API that cannot be reached: curl's error names the URL, which
  // holds the token; the stored error and the logs must not.
  std::string closed;
  {
    auto gone = fakes::FakeTelegramServer::Start("x");
    REQUIRE(gone != nullptr);
    closed = gone->base_url();
  }
  StderrCapture logs;
  {
    NotifyHarness t(/*webhook=*/true, /*telegram=*/true, closed);
    t.h_.engine();
    t.notifier_->Notify(Approval("plan_secret"));
    CHECK(t.h_.RunDue() == 2);
    WorkItem tg = t.h_.Get(t.WorkId(kTelegramNotifyKind, "plan_secret:awaiting_approval"));
    CHECK(tg.state == WorkState::kFailed);
    CHECK_FALSE(tg.last_error.empty());
    const std::string stored = tg.ToJson().dump();
    CHECK(stored.find(kToken) == std::string::npos);
    CHECK(stored.find("AAF-secret") == std::string::npos);  // not even a part of it
    // The URL is named, its token segment cut (curl_http_client's rule).
    CHECK(tg.last_error.find("/…/sendMessage") != std::string::npos);
    WorkItem hook = t.h_.Get(t.WorkId(kWebhookNotifyKind, "plan_secret:awaiting_approval"));
    CHECK(hook.state == WorkState::kDone);
    CHECK(hook.ToJson().dump().find(kHookSecret) == std::string::npos);
    // Let the attempts run out: the dead letter is logged, still without it.
    for (int i = 0; i < 12; ++i) {
      t.h_.env_.Advance(3'600'000);
      t.h_.RunDue();
    }
    WorkItem dead = t.h_.Get(tg.work_id);
    CHECK(dead.state == WorkState::kDead);
    CHECK(dead.ToJson().dump().find(kToken) == std::string::npos);
    CHECK(t.h_.metrics_.work_dead.Get() == 1);
  }
  const std::string text = logs.Finish();
  CHECK(text.find("apply.dead_letter") != std::string::npos);  // the capture works
  CHECK(text.find(kToken) == std::string::npos);
  CHECK(text.find(kHookSecret) == std::string::npos);
}

TEST_CASE("a dead letter is notified with the replay command; a dead notification is not") {
  NotifyHarness t(/*webhook=*/true, /*telegram=*/false);
  t.h_.AddKind("send_reply", {"/ticket_id"},
               {{"url", t.h_.Url("/replies")}, {"idempotency", "header"}});
  t.h_.engine();
  t.h_.fake().FailNext(1, 400);  // a permanent failure: dead at once
  ActionOutcome o = t.h_.Submit("send_reply", {{"ticket_id", "T-1"}, {"text", "hi"}});
  REQUIRE(o.kind == ActionOutcomeKind::kDead);
  CHECK(t.h_.RunDue() == 1);  // the dead_letter notification
  std::vector<Json> hooks = t.h_.fake().Records("messages");
  REQUIRE(hooks.size() == 1);
  CHECK(hooks[0]["kind"] == "dead_letter");
  CHECK(hooks[0]["subject_id"] == o.item.work_id);
  CHECK(hooks[0]["command"] == "idem dlq replay " + o.item.work_id);
  CHECK(hooks[0]["link"] == "http://idem.test:7411/ui/#/dead-letters");
  CHECK(hooks[0]["detail"]["work_kind"] == "send_reply");
  CHECK(hooks[0]["reason"].get<std::string>().find("send_reply") != std::string::npos);

  // A notification that dies (the webhook refuses it for good) is logged
  // as a dead letter but tells nobody: it would feed itself otherwise.
  t.h_.fake().FailNext(1, 400);
  t.notifier_->Notify(Approval("plan_dies"));
  CHECK(t.h_.RunDue() == 1);
  CHECK(t.h_.Get(t.WorkId(kWebhookNotifyKind, "plan_dies:awaiting_approval")).state ==
        WorkState::kDead);
  t.h_.env_.Advance(3'600'000);
  CHECK(t.h_.RunDue() == 0);
  CHECK(t.h_.fake().Records("messages").size() == 1);
}

TEST_CASE("no API caller can run a notification kind") {
  NotifyHarness t;
  auto o = t.h_.engine().Submit(
      kTelegramNotifyKind, {{"event_id", "x"}, {"chat_id", "4242"}, {"text", "phish"}}, "", "req");
  REQUIRE_FALSE(o.ok());
  CHECK(o.status().code() == Code::kNotFound);
  CHECK(t.tg_->calls().empty());
}

TEST_CASE("a notification kind that collides with a configured action is refused") {
  NotifyHarness t;
  t.h_.AddKind(kWebhookNotifyKind, {"/event_id"},
               {{"url", t.h_.Url("/replies")}, {"idempotency", "header"}});
  auto made = ApplyEngine::Create(t.h_.config_, t.h_.journal(), *t.h_.http_, t.h_.clock_,
                                  t.h_.metrics_, t.h_.options_);
  REQUIRE_FALSE(made.ok());
  CHECK(made.status().code() == Code::kInvalidArgument);
}

TEST_CASE("an unset secret variable fails start-up naming the config field") {
  NotificationsConfig config;
  config.telegram = TelegramNotifyConfig{"http://127.0.0.1:9", "IDEM_TEST_UNSET_TOKEN", "1"};
  unsetenv("IDEM_TEST_UNSET_TOKEN");
  ApplyHarness h;
  auto made = JournalNotifier::Create(config, h.journal(), h.clock_);
  REQUIRE_FALSE(made.ok());
  CHECK(made.status().code() == Code::kFailedPrecondition);
  CHECK(made.status().field() == "/notifications/telegram/bot_token_env");

  NotificationsConfig hook;
  hook.webhook =
      WebhookNotifyConfig{"http://127.0.0.1:9/h", {{"X-Key", "${IDEM_TEST_UNSET_TOKEN}"}}};
  auto made2 = JournalNotifier::Create(hook, h.journal(), h.clock_);
  REQUIRE_FALSE(made2.ok());
  CHECK(made2.status().field() == "/notifications/webhook/headers/X-Key");
}

TEST_CASE("a link given as a path is made absolute with link_base") {
  NotifyHarness t(/*webhook=*/true, /*telegram=*/false);
  t.h_.engine();
  Notification n = Approval("plan_path");
  n.link = "/ui/#/plans/plan_path";
  t.notifier_->Notify(n);
  CHECK(t.h_.RunDue() == 1);
  std::vector<Json> hooks = t.h_.fake().Records("messages");
  REQUIRE(hooks.size() == 1);
  CHECK(hooks[0]["link"] == "http://idem.test:7411/ui/#/plans/plan_path");
}

TEST_CASE("a long reason is cut so that the telegram text stays within the Bot API limit") {
  Notification n = Approval("plan_long");
  n.reason = std::string(10'000, 'x');
  std::string text = JournalNotifier::TelegramText(n);
  CHECK(text.size() <= 4000);
  CHECK(text.find("idem approve plan_long") != std::string::npos);  // the command survives
}

TEST_CASE("a plan's telegram text shows a character that hides or reorders text as an escape") {
  Notification n = Approval("plan_hidden");
  // "O-1<soft hyphen>000" would read O-1000; "<RLO>" would reorder the rest.
  n.detail = {
      {"plan_id", "plan_hidden"},
      {"actions",
       Json::array({Json{{"kind", "refund"},
                         {"args", {{"order_id", "O-1\u00ad000"}, {"memo", "\u202eok"}}}}})}};
  std::string text = JournalNotifier::TelegramText(n);
  CHECK_MESSAGE(text.find("O-1\\u00ad000") != std::string::npos, text);
  CHECK_MESSAGE(text.find("\\u202eok") != std::string::npos, text);
  CHECK(text.find("\u00ad") == std::string::npos);
  CHECK(text.find("\u202e") == std::string::npos);
}

TEST_CASE("a plan's telegram text says what each action would do, cut to the Bot API limit") {
  Notification n = Approval("plan_acts");
  n.detail = {{"plan_id", "plan_acts"},
              {"actions",
               Json::array({Json{{"kind", "refund"}, {"args", {{"amount_eur", 500}}}},
                            Json{{"kind", "send_email"}, {"args", {{"to", "a@example.com"}}}}})}};
  std::string text = JournalNotifier::TelegramText(n);
  CHECK_MESSAGE(text.find("- refund {\"amount_eur\":500}") != std::string::npos, text);
  CHECK_MESSAGE(text.find("- send_email {\"to\":\"a@example.com\"}") != std::string::npos, text);
  CHECK(text.find("idem approve plan_acts") != std::string::npos);

  // Many large actions and a long reason: the text stays within the
  // limit, the reason and the first actions are shown, the command stays.
  Json many = Json::array();
  for (int i = 0; i < 40; ++i) {
    many.push_back(
        Json{{"kind", "k" + std::to_string(i)}, {"args", {{"blob", std::string(2'000, 'y')}}}});
  }
  n.detail["actions"] = many;
  n.reason = std::string(10'000, 'x');
  text = JournalNotifier::TelegramText(n);
  CHECK(text.size() <= 4000);
  CHECK(text.find("xxxxxxxxxx") != std::string::npos);
  CHECK(text.find("- k0 {\"blob\":\"yyyy") != std::string::npos);
  CHECK(text.find("idem approve plan_acts") != std::string::npos);
  // A malformed action is shown, not thrown on.
  n.detail["actions"] = Json::array({Json(7), Json{{"kind", 3}}});
  n.reason = "r";
  text = JournalNotifier::TelegramText(n);
  CHECK(text.find("- ? {}") != std::string::npos);
}

}  // namespace idem::testing
