// The inbox (R29): webhook events processed once per event id, however
// often and however concurrently they are delivered; bad signatures refused
// and recorded nowhere.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "daemon/core/crypto.h"
#include "tests/fakes/fake_effector.h"
#include "tests/integration/harness.h"

namespace idem::testing {
namespace {

using fakes::FakeEffectorServer;

const char* kTelegramSecret = "tg-secret-123";
const char* kHmacSecret = "hmac-secret-456";

struct Fixture {
  std::unique_ptr<FakeEffectorServer> target = FakeEffectorServer::Start();
  TempDir dir;
  std::unique_ptr<DaemonProcess> daemon;
  std::unique_ptr<httplib::Client> client;

  explicit Fixture(bool escalating = false) {
    REQUIRE(target != nullptr);
    // A ticket saying "slowfail" makes the model fail after a second, for
    // good (not retryable): the event is forgotten, for a retry to process.
    // "outage": no model answers (retryable, every attempt); "slowok":
    // the model answers after 2.5 s, longer than the key lease below.
    const std::string rules =
        "rules:\n"
        "  - match: {input: {text: {contains: slowfail}}}\n"
        "    delay_ms: 1000\n"
        "    fail: {code: invalid_argument, message: refused}\n"
        "  - match: {input: {text: {contains: outage}}}\n"
        "    fail: {code: unavailable, message: the provider is down}\n"
        "  - match: {input: {text: {contains: slowok}}}\n"
        "    delay_ms: 2500\n"
        "    output: "
        "'{\"category\":\"question\",\"priority\":\"low\",\"summary\":\"s\",\"actions\":[]}'\n"
        "default:\n  output: "
        "'{\"category\":\"question\",\"priority\":\"low\",\"summary\":\"s\",\"actions\":[]}'\n";
    std::string extra =
        "actions:\n"
        "  send_reply:\n"
        "    identity: {fields: [/chat_id, /text], version: v1}\n"
        "    window: 24h\n"
        "    on_duplicate: return_original\n"
        "    effector: {http: {method: POST, url: \"" +
        target->base_url() +
        "/replies\", idempotency: header}}\n"
        "inbox:\n"
        "  telegram:\n"
        "    event_id: {pointer: /update_id}\n"
        "    signature: {header: X-Telegram-Bot-Api-Secret-Token, secret_env: IDEM_TEST_TG, "
        "scheme: token}\n"
        "    on_event: {action: send_reply, pointer: /message}\n"
        "  shop:\n"
        "    event_id: {header: X-Event-Id}\n"
        "    signature: {header: X-Signature, secret_env: IDEM_TEST_HMAC, prefix: \"sha256=\"}\n"
        "    on_event: {decide: triage_ticket, pointer: /data}\n"
        "  audit_log:\n"
        "    event_id: {pointer: /id}\n"
        "    on_event: {record: true}\n"
        "  tickets:\n"
        "    event_id: {pointer: /id}\n"
        "    on_event: {decide: triage_ticket, pointer: /data}\n";
    // Keys are leased 1 s, renewed while their handler runs. With
    // `escalating`, a decide no model answers escalates (as the default
    // config's does).
    std::string text = ReadFile(WriteTestConfig(dir, rules, extra + "idempotency:\n  lease: 1s\n"));
    if (escalating) {
      text.replace(text.find("    attempts: 3\n"), 16,
                   "    attempts: 2\n    fallback: [escalate]\n");
    }
    const std::string config = dir.File("idem.yaml", text);
    std::string err;
    daemon =
        DaemonProcess::Start({config,
                              dir.path() + "/data",
                              {},
                              {{"IDEM_TEST_TG", kTelegramSecret}, {"IDEM_TEST_HMAC", kHmacSecret}}},
                             &err);
    REQUIRE_MESSAGE(daemon != nullptr, err);
    client = daemon->Client();
  }

  httplib::Result Telegram(httplib::Client& c, int update_id, const std::string& secret) {
    Json update = {
        {"update_id", update_id},
        {"message", {{"chat_id", "c-1"}, {"text", "hello " + std::to_string(update_id)}}}};
    return c.Post("/v1/inbox/telegram", {{"X-Telegram-Bot-Api-Secret-Token", secret}},
                  update.dump(), "application/json");
  }
};

Json J(const httplib::Result& r) {
  REQUIRE(r);
  return Json::parse(r->body);
}

}  // namespace

TEST_CASE("the same inbox event delivered 50 times at once is processed once") {
  Fixture f;
  std::atomic<int> ok{0}, fresh{0}, retry_later{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 50; ++i) {
    threads.emplace_back([&] {
      auto c = f.daemon->Client();
      auto r = f.Telegram(*c, 1001, kTelegramSecret);
      if (r && r->status == 200) {
        ok++;
        if (Json::parse(r->body)["duplicate"] == false) fresh++;
      }
      // While the first is being processed: come back (it may yet fail).
      if (r && r->status == 503 && r->get_header_value("Retry-After") == "1") retry_later++;
    });
  }
  for (auto& t : threads) t.join();
  CHECK(ok + retry_later == 50);
  CHECK(fresh == 1);
  CHECK(f.target->stats().effects == 1);
  CHECK(f.target->stats().raw_calls == 1);
  // A later redelivery answers with the first answer.
  Json again = J(f.Telegram(*f.client, 1001, kTelegramSecret));
  CHECK(again["duplicate"] == true);
  CHECK(again["first"]["outcome"] == "executed");
  CHECK(MetricValue(*f.client, "idem_inbox_events_total") == 1);
}

TEST_CASE(
    "a redelivery while the first delivery runs is told to come back, so a failure loses nothing") {
  Fixture f;
  const std::string event = R"({"id":"ev-7","data":{"ticket_id":"T-7","text":"slowfail"}})";
  auto first = std::async(std::launch::async, [&] {
    return f.daemon->Client()->Post("/v1/inbox/tickets", event, "application/json");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto during = f.client->Post("/v1/inbox/tickets", event, "application/json");
  REQUIRE(during);
  CHECK(during->status == 503);  // not a 2xx: the sender keeps the event
  CHECK(during->get_header_value("Retry-After") == "1");
  auto failed = first.get();
  REQUIRE(failed);
  CHECK(failed->status >= 400);  // the model refused: the event is forgotten
  // The sender's retry processes it again (and it fails again here), rather
  // than being told it was a duplicate of a success that never happened.
  auto again = f.client->Post("/v1/inbox/tickets", event, "application/json");
  REQUIRE(again);
  CHECK(again->status == failed->status);
  CHECK(again->body.find("duplicate") == std::string::npos);
}

TEST_CASE("a bad signature is refused and recorded nowhere") {
  Fixture f;
  auto bad = f.Telegram(*f.client, 2002, "wrong");
  REQUIRE(bad);
  CHECK(bad->status == 401);
  CHECK(J(bad)["pointer"] == "header:x-telegram-bot-api-secret-token");
  CHECK(f.client->Post("/v1/inbox/telegram", R"({"update_id":2002})", "application/json")->status ==
        401);
  CHECK(f.target->stats().raw_calls == 0);
  // The genuine delivery of the same event is new: the refused one left nothing.
  Json good = J(f.Telegram(*f.client, 2002, kTelegramSecret));
  CHECK(good["duplicate"] == false);
  CHECK(f.target->stats().effects == 1);

  // HMAC over the raw bytes, with the event id in a header.
  const std::string body = R"({"data": {"ticket_id": "S-1", "text": "where is my parcel?"}})";
  auto signed_post = [&](const std::string& sig, const std::string& id) {
    return f.client->Post("/v1/inbox/shop", {{"X-Event-Id", id}, {"X-Signature", sig}}, body,
                          "text/plain");
  };
  CHECK(signed_post("sha256=" + HmacSha256Hex("other", body), "evt_1")->status == 401);
  CHECK(signed_post(HmacSha256Hex(kHmacSecret, body), "evt_1")->status == 401);  // no prefix
  auto decided = signed_post("sha256=" + HmacSha256Hex(kHmacSecret, body), "evt_1");
  REQUIRE(decided);
  REQUIRE_MESSAGE(decided->status == 200, decided->body);
  CHECK(J(decided)["outcome"] == "decided");
  CHECK(J(decided)["output"]["category"] == "question");
  CHECK(J(signed_post("sha256=" + HmacSha256Hex(kHmacSecret, body), "evt_1"))["duplicate"] == true);
  // The event id header twice: which one names the event is not guessed.
  auto twice = f.client->Post("/v1/inbox/shop",
                              {{"X-Event-Id", "evt_2"},
                               {"X-Event-Id", "evt_3"},
                               {"X-Signature", "sha256=" + HmacSha256Hex(kHmacSecret, body)}},
                              body, "text/plain");
  REQUIRE(twice);
  CHECK(twice->status == 400);
  CHECK(J(twice)["pointer"] == "header:x-event-id");
  // Too long an id from a header names the header, as a missing one does.
  auto long_id = signed_post("sha256=" + HmacSha256Hex(kHmacSecret, body), std::string(256, 'e'));
  REQUIRE(long_id);
  CHECK(long_id->status == 400);
  CHECK(J(long_id)["pointer"] == "header:x-event-id");
}

TEST_CASE("an inbox event without its id, or for an unknown source, is refused") {
  Fixture f;
  auto no_id = f.client->Post("/v1/inbox/audit_log", R"({"what":"x"})", "application/json");
  REQUIRE(no_id);
  CHECK(no_id->status == 400);
  CHECK(J(no_id)["pointer"] == "/id");
  CHECK(f.client->Post("/v1/inbox/nope", R"({"id":"1"})", "application/json")->status == 404);
  CHECK(f.client->Post("/v1/inbox/audit_log", "not json", "text/plain")->status == 400);
  Json recorded = J(f.client->Post("/v1/inbox/audit_log", R"({"id":7})", "application/json"));
  CHECK(recorded["outcome"] == "recorded");
  CHECK(recorded["event_id"] == "7");
  // An event id is up to 255 characters, not bytes ("é" is two).
  std::string e255;
  for (int i = 0; i < 255; ++i) e255 += "\u00e9";
  auto fits =
      f.client->Post("/v1/inbox/audit_log", "{\"id\":\"" + e255 + "\"}", "application/json");
  REQUIRE(fits);
  CHECK(fits->status == 200);
  auto too_long =
      f.client->Post("/v1/inbox/audit_log", "{\"id\":\"" + e255 + "\\u00e9\"}", "application/json");
  REQUIRE(too_long);
  CHECK(too_long->status == 400);
  CHECK(J(too_long)["pointer"] == "/id");
}

TEST_CASE(
    "inbox errors point into the event as sent: the whole body when it is not JSON, where it "
    "nests too deep (400), a payload field where the sender put it") {
  Fixture f;
  for (const char* body : {"notjson", "{\"id\":\"x\","}) {
    CAPTURE(body);
    auto bad = f.client->Post("/v1/inbox/audit_log", body, "application/json");
    REQUIRE(bad);
    CHECK(bad->status == 400);
    CHECK(J(bad)["pointer"] == "");
  }
  std::string deep = "{\"id\":\"d\",\"x\":";
  for (int i = 0; i < 100; ++i) deep += "[";
  for (int i = 0; i < 100; ++i) deep += "]";
  deep += "}";
  auto too_deep = f.client->Post("/v1/inbox/audit_log", deep, "application/json");
  REQUIRE(too_deep);
  CHECK(too_deep->status == 400);
  CHECK(J(too_deep)["pointer"].get<std::string>().rfind("/x/0/0/0", 0) == 0);

  // The action's identity field /chat_id is missing from /message.
  Json update = {{"update_id", 901}, {"message", {{"text", "no chat"}}}};
  auto no_chat =
      f.client->Post("/v1/inbox/telegram", {{"X-Telegram-Bot-Api-Secret-Token", kTelegramSecret}},
                     update.dump(), "application/json");
  REQUIRE(no_chat);
  CHECK(no_chat->status == 400);
  CHECK(J(no_chat)["pointer"] == "/message/chat_id");
  // The step's input field past 2^53, decided from /data.
  auto huge = f.client->Post(
      "/v1/inbox/tickets",
      R"({"id":"t-huge","data":{"ticket_id":9007199254740993,"text":"refund please"}})",
      "application/json");
  REQUIRE(huge);
  CHECK(huge->status == 400);
  CHECK(J(huge)["pointer"] == "/data/ticket_id");
}

TEST_CASE(
    "a web page cannot deliver inbox events through the user's browser: a foreign Origin is "
    "refused before anything is recorded, the daemon's own is not") {
  Fixture f;
  const std::string body = R"({"id":"csrf-1","what":"x"})";
  for (const char* origin : {"http://evil.example", "null"}) {
    CAPTURE(origin);
    auto refused = f.client->Post("/v1/inbox/audit_log", {{"Origin", origin}}, body, "text/plain");
    REQUIRE(refused);
    CHECK(refused->status == 403);
    CHECK(J(refused)["pointer"] == "header:Origin");
  }
  // DNS rebinding: the page's own name as Host and Origin.
  auto rebound = f.client->Post("/v1/inbox/audit_log",
                                {{"Host", "evil.example"}, {"Origin", "http://evil.example"}}, body,
                                "text/plain");
  REQUIRE(rebound);
  CHECK(rebound->status == 403);
  // Nothing was recorded: the sender's own delivery is the first.
  Json first = J(f.client->Post("/v1/inbox/audit_log", body, "application/json"));
  CHECK(first["outcome"] == "recorded");
  CHECK(first["duplicate"] == false);
  const std::string self = "http://127.0.0.1:" + std::to_string(f.daemon->port());
  auto own = f.client->Post("/v1/inbox/audit_log", {{"Origin", self}}, R"({"id":"own-1"})",
                            "application/json");
  REQUIRE(own);
  CHECK(own->status == 200);
}

TEST_CASE(
    "an event no model could answer is not stored as escalated: the sender is told to retry, and "
    "its retry decides it") {
  Fixture f(/*escalating=*/true);
  const std::string body = R"({"id":"out-1","data":{"ticket_id":"T-1","text":"outage"}})";
  auto first = f.client->Post("/v1/inbox/tickets", body, "application/json");
  REQUIRE(first);
  CHECK_MESSAGE(first->status == 503, first->body);
  CHECK(first->get_header_value("Retry-After") == "1");
  // The same event again is processed again, not answered "duplicate".
  auto retried = f.client->Post("/v1/inbox/tickets", body, "application/json");
  REQUIRE(retried);
  CHECK(retried->status == 503);
  CHECK(retried->body.find("duplicate") == std::string::npos);
}

TEST_CASE(
    "an event whose processing outlasts the key lease stays the first delivery's: a retry "
    "meanwhile waits (503), and is a duplicate afterwards") {
  Fixture f;
  const std::string body = R"({"id":"slow-1","data":{"ticket_id":"T-2","text":"slowok"}})";
  auto first = std::async(std::launch::async, [&] {
    auto c = f.daemon->Client();
    return c->Post("/v1/inbox/tickets", body, "application/json");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(1'700));  // past the 1 s lease
  auto during = f.client->Post("/v1/inbox/tickets", body, "application/json");
  REQUIRE(during);
  CHECK_MESSAGE(during->status == 503, during->body);
  auto answered = first.get();
  REQUIRE(answered);
  CHECK(answered->status == 200);
  CHECK(J(answered)["duplicate"] == false);
  auto after = f.client->Post("/v1/inbox/tickets", body, "application/json");
  REQUIRE(after);
  CHECK(after->status == 200);
  CHECK(J(after)["duplicate"] == true);
}

}  // namespace idem::testing
