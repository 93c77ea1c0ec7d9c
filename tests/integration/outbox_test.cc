// The outbox (R29) against the real daemon: events of committed state
// changes pushed to a webhook subscriber (the fake effector's /messages,
// which honours Idempotency-Key) and served by GET /v1/events; a failing
// subscriber's dead letters and their replay; delivery after kill -9.
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "tests/fakes/fake_effector.h"
#include "tests/integration/harness.h"

namespace idem::testing {
namespace {

std::string OutboxYaml(const fakes::FakeEffectorServer& hook, int max_attempts) {
  return "actions:\n"
         "  send_invoice:\n"
         "    identity: {fields: [/invoice_id], version: v1}\n"
         "    window: 24h\n"
         "    on_duplicate: return_original\n"
         "outbox:\n"
         "  poll: 20ms\n"
         "  subscribers:\n"
         "    hook:\n"
         "      url: " +
         hook.base_url() +
         "/messages\n"
         "      headers: {Authorization: \"Bearer ${IDEM_IT_OUTBOX}\"}\n"
         "      max_attempts: " +
         std::to_string(max_attempts) +
         "\n"
         "      backoff: {base: 10ms, cap: 20ms}\n"
         "      timeout: 5s\n";
}

DaemonArgs Args(const std::string& config, const TempDir& dir, const std::string& failpoints = "") {
  DaemonArgs args{config, dir.path() + "/data", {}, {}};
  args.env["IDEM_IT_OUTBOX"] = "outbox-secret";
  if (!failpoints.empty()) args.env["IDEM_FAILPOINTS"] = failpoints;
  return args;
}

Json Post(httplib::Client& c, const std::string& path, const Json& body) {
  auto r = c.Post(path.c_str(), body.dump(), "application/json");
  REQUIRE(r);
  Json j = r->body.empty() ? Json() : Json::parse(r->body);
  j["_status"] = r->status;
  return j;
}

Json Get(httplib::Client& c, const std::string& path) {
  auto r = c.Get(path.c_str());
  REQUIRE(r);
  REQUIRE_MESSAGE(r->status == 200, r->body);
  return Json::parse(r->body);
}

// A /v1/events read refused with 409 at query:after (a cursor of another
// store, one retention passed, one ahead of the store); its detail.
std::string RefusedCursor(httplib::Client& c, const std::string& path) {
  auto r = c.Get(path.c_str());
  REQUIRE(r);
  CHECK(r->status == 409);
  const Json problem = Json::parse(r->body);
  CHECK(problem["pointer"] == "query:after");
  return problem.value("detail", "");
}

// Claims and completes one invoice; returns its work_id.
std::string Complete(httplib::Client& c, const std::string& invoice) {
  Json claim = Post(c, "/v1/work/claim",
                    {{"kind", "send_invoice"}, {"identity", {{"invoice_id", invoice}}}});
  REQUIRE(claim["_status"] == 201);
  Json done = Post(c, "/v1/work/" + claim["work_id"].get<std::string>() + "/complete",
                   {{"lease_token", claim["lease_token"]}, {"result", {{"ok", true}}}});
  REQUIRE(done["_status"] == 200);
  return claim["work_id"];
}

// The events the subscriber received, by their body.
std::vector<Json> Received(const fakes::FakeEffectorServer& hook) {
  std::vector<Json> out;
  for (const auto& call : hook.calls()) {
    if (call.method == "POST" && call.path == "/messages") out.push_back(Json::parse(call.body));
  }
  return out;
}

}  // namespace

TEST_CASE("outbox: each committed state change reaches the subscriber and the puller once") {
  auto hook = fakes::FakeEffectorServer::Start();
  REQUIRE(hook != nullptr);
  TempDir dir;
  std::string config = WriteTestConfig(dir, kQuestionRules, OutboxYaml(*hook, 3));
  std::string err;
  auto daemon = DaemonProcess::Start(Args(config, dir), &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);
  auto c = daemon->Client();

  Json decided = Post(*c, "/v1/decide",
                      {{"step", "triage_ticket"}, {"input", {{"ticket_id", "1"}, {"text", "hi"}}}});
  REQUIRE(decided["_status"] == 200);
  std::string work_id = Complete(*c, "INV-1");
  // Not state changes: a cached decide, and a complete with a stale token.
  REQUIRE(Post(*c, "/v1/decide",
               {{"step", "triage_ticket"},
                {"input", {{"ticket_id", "1"}, {"text", "hi"}}}})["_status"] == 200);
  Json claim2 = Post(*c, "/v1/work/claim",
                     {{"kind", "send_invoice"}, {"identity", {{"invoice_id", "INV-2"}}}});
  REQUIRE(claim2["_status"] == 201);
  CHECK(Post(*c, "/v1/work/" + claim2["work_id"].get<std::string>() + "/complete",
             {{"lease_token", "0123456789abcdef0123456789abcdef"}})["_status"] == 409);

  Json page = Get(*c, "/v1/events?after=0");
  REQUIRE(page["items"].size() == 2);
  CHECK(page["items"][0]["type"] == "decision.created");
  CHECK(page["items"][0]["key"] == decided["decision_id"]);
  CHECK(page["items"][1]["type"] == "effect.done");
  CHECK(page["items"][1]["key"] == work_id);
  CHECK(page["items"][1]["data"]["kind"] == "send_invoice");
  CHECK(Get(*c, "/v1/events?after=" + page["next_cursor"].get<std::string>())["items"].empty());
  // A cursor names its store (the event ids' prefix) and the seq.
  const std::string first_id = page["items"][0]["event_id"];
  const std::string store_id = first_id.substr(4, 16);
  CHECK(Get(*c, "/v1/events?after=0&limit=1")["next_cursor"] ==
        store_id + ":" + std::to_string(page["items"][0]["seq"].get<uint64_t>()));
  // A cursor another store gave (a reset folder, another environment) is
  // refused, not answered with nothing from its seq on; a bare seq is taken.
  RefusedCursor(*c, "/v1/events?after=0123456789abcdef:542");
  CHECK(Get(*c, "/v1/events?after=0")["items"].size() == 2);
  // A cursor of this store beyond its last event (a store restored from
  // an older copy) is refused: the next events would take seqs the reader
  // believes it has seen. The cursor the answer names is served.
  const uint64_t last_seq = page["items"][1]["seq"].get<uint64_t>();
  const std::string ahead_detail =
      RefusedCursor(*c, "/v1/events?after=" + store_id + ":" + std::to_string(last_seq + 5));
  CHECK_MESSAGE(ahead_detail.find("ahead of this store") != std::string::npos, ahead_detail);
  CHECK(ahead_detail.substr(ahead_detail.rfind("after=") + 6) ==
        store_id + ":" + std::to_string(last_seq));
  auto overflow = c->Get("/v1/events?after=18446744073709551616");
  REQUIRE(overflow);
  CHECK(overflow->status == 400);

  REQUIRE(WaitFor([&] { return Received(*hook).size() >= 2; }, 10'000));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // nothing more comes
  std::vector<Json> got = Received(*hook);
  REQUIRE(got.size() == 2);
  CHECK(got[0]["event_id"] == page["items"][0]["event_id"]);
  CHECK(got[1]["event_id"] == page["items"][1]["event_id"]);
  std::vector<fakes::FakeEffectorCall> calls = hook->calls();
  CHECK(calls[1].headers["idempotency-key"] == page["items"][1]["event_id"]);
  CHECK(calls[1].headers["authorization"] == "Bearer outbox-secret");

  auto bad = c->Get("/v1/events?after=abc");
  REQUIRE(bad);
  CHECK(bad->status == 400);
}

TEST_CASE("outbox: a failing subscriber's event goes to its dead letters, and it recovers") {
  auto hook = fakes::FakeEffectorServer::Start();
  REQUIRE(hook != nullptr);
  TempDir dir;
  std::string config = WriteTestConfig(dir, kQuestionRules, OutboxYaml(*hook, 2));
  std::string err;
  auto daemon = DaemonProcess::Start(Args(config, dir), &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);
  auto c = daemon->Client();

  hook->FailNext(2, 503);
  std::string first = Complete(*c, "INV-1");
  REQUIRE(WaitFor([&] { return !Get(*c, "/v1/outbox/dead-letters")["items"].empty(); }, 10'000));
  Json dead = Get(*c, "/v1/outbox/dead-letters?subscriber=hook");
  REQUIRE(dead["items"].size() == 1);
  CHECK(dead["items"][0]["event"]["key"] == first);
  CHECK(dead["items"][0]["attempts"] == 2);
  CHECK(dead["items"][0]["state"] == "dead");
  // ?subscriber= empty is not "all", and a mistyped name is not "none".
  auto empty = c->Get("/v1/outbox/dead-letters?subscriber=");
  REQUIRE(empty);
  CHECK(empty->status == 400);
  CHECK(Json::parse(empty->body)["pointer"] == "query:subscriber");
  auto typo = c->Get("/v1/outbox/dead-letters?subscriber=hokk");
  REQUIRE(typo);
  CHECK(typo->status == 404);
  CHECK(Json::parse(typo->body)["pointer"] == "query:subscriber");

  // The subscriber moved on: the next event arrives.
  std::string second = Complete(*c, "INV-2");
  REQUIRE(WaitFor([&] { return hook->Records("messages").size() == 1; }, 10'000));
  CHECK(hook->Records("messages")[0]["key"] == second);

  // Back up: a replay delivers the dead letter, which then goes.
  const std::string seq = std::to_string(dead["items"][0]["event"]["seq"].get<uint64_t>());
  Json replay = Post(*c, "/v1/outbox/dead-letters/hook/" + seq + "/replay", Json::object());
  CHECK(replay["_status"] == 202);
  CHECK(replay["state"] == "replaying");
  REQUIRE(WaitFor([&] { return Get(*c, "/v1/outbox/dead-letters")["items"].empty(); }, 10'000));
  std::vector<Json> records = hook->Records("messages");
  REQUIRE(records.size() == 2);
  CHECK(records[1]["key"] == first);
  CHECK(Post(*c, "/v1/outbox/dead-letters/hook/" + seq + "/replay", Json::object())["_status"] ==
        404);
  CHECK(Post(*c, "/v1/outbox/dead-letters/nobody/1/replay", Json::object())["_status"] == 404);

  // What an SRE watches: each result counted, and the cursor.
  auto metric = [&](const std::string& series) {
    auto res = c->Get("/metrics");
    REQUIRE(res);
    const size_t at = res->body.find("\n" + series + " ");
    return at == std::string::npos ? -1 : std::atol(res->body.c_str() + at + series.size() + 2);
  };
  const std::string family = "idem_outbox_deliveries_total{subscriber=\"hook\",result=";
  CHECK(metric(family + "\"failed\"}") == 2);
  CHECK(metric(family + "\"dead_lettered\"}") == 1);
  CHECK(metric(family + "\"delivered\"}") == 1);
  CHECK(metric(family + "\"replay_delivered\"}") == 1);
  CHECK(metric(family + "\"replay_failed\"}") == 0);
  CHECK(metric("idem_outbox_cursor{subscriber=\"hook\"}") ==
        static_cast<long>(Get(*c, "/v1/events?after=0")["items"][1]["seq"].get<uint64_t>()));
}

TEST_CASE("outbox: an event committed before a kill -9 is delivered after the restart") {
  auto hook = fakes::FakeEffectorServer::Start();
  REQUIRE(hook != nullptr);
  TempDir dir;
  std::string config = WriteTestConfig(dir, kQuestionRules, OutboxYaml(*hook, 3));
  std::string err;
  std::string work_id;
  {
    // The daemon dies (SIGKILL) between the state change's commit and the delivery.
    auto daemon = DaemonProcess::Start(Args(config, dir, "outbox.deliver=crash"), &err);
    REQUIRE_MESSAGE(daemon != nullptr, err);
    auto c = daemon->Client();
    Json claim = Post(*c, "/v1/work/claim",
                      {{"kind", "send_invoice"}, {"identity", {{"invoice_id", "INV-9"}}}});
    REQUIRE(claim["_status"] == 201);
    work_id = claim["work_id"];
    auto done = c->Post(("/v1/work/" + work_id + "/complete").c_str(),
                        Json{{"lease_token", claim["lease_token"]}}.dump(), "application/json");
    (void)done;  // the crash may cut the answer; the commit came first
    REQUIRE(daemon->WaitExit(10'000));
  }
  CHECK(Received(*hook).empty());
  {
    // Delivered, then killed before the cursor moved: delivered again, same event id.
    // (It may die before it answers /healthz: Start then returns null.)
    auto daemon = DaemonProcess::Start(Args(config, dir, "outbox.delivered=crash"), &err);
    if (daemon != nullptr) REQUIRE(daemon->WaitExit(10'000));
  }
  REQUIRE(Received(*hook).size() == 1);
  auto daemon = DaemonProcess::Start(Args(config, dir), &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);
  REQUIRE(WaitFor([&] { return Received(*hook).size() >= 2; }, 10'000));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::vector<Json> got = Received(*hook);
  REQUIRE(got.size() == 2);
  CHECK(got[0]["type"] == "effect.done");
  CHECK(got[0]["key"] == work_id);
  CHECK(got[1]["event_id"] == got[0]["event_id"]);
  // The consumer's inbox (here the fake's Idempotency-Key) took it once.
  CHECK(hook->Records("messages").size() == 1);
  CHECK(hook->stats().replays == 1);
}

}  // namespace idem::testing

namespace idem::testing {

TEST_CASE("outbox: a puller's cursor that retention passed is refused, not answered with a gap") {
  auto hook = fakes::FakeEffectorServer::Start();
  REQUIRE(hook != nullptr);
  TempDir dir;
  std::string config =
      WriteTestConfig(dir, kQuestionRules, OutboxYaml(*hook, 3) + "  retention: 1s\n");
  std::string err;
  auto daemon = DaemonProcess::Start(Args(config, dir, "daemon.sweep_every_second=error"), &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);
  auto c = daemon->Client();
  // A puller whose first read found the store empty: its cursor is at 0.
  const Json empty = Get(*c, "/v1/events?after=0");
  REQUIRE(empty["items"].empty());
  const std::string first_cursor = empty["next_cursor"];
  Complete(*c, "INV-R1");
  const std::string cursor = Get(*c, "/v1/events?after=0")["next_cursor"];  // the puller's
  Complete(*c, "INV-R2");
  Complete(*c, "INV-R3");
  // The subscriber takes all three; then retention deletes them.
  REQUIRE(WaitFor([&] { return Received(*hook).size() >= 3; }, 10'000));
  REQUIRE(WaitFor([&] { return Get(*c, "/v1/events?after=0")["items"].empty(); }, 10'000));
  const std::string detail = RefusedCursor(*c, "/v1/events?after=" + cursor);
  CHECK_MESSAGE(detail.find("deleted by retention") != std::string::npos, detail);
  // The cursor of the empty store too: it has not seen INV-R1.
  const std::string from_empty = RefusedCursor(*c, "/v1/events?after=" + first_cursor);
  CHECK_MESSAGE(from_empty.find("deleted by retention") != std::string::npos, from_empty);
  // A reader starting now (a bare 0) reads on from what is kept, and its
  // cursor after an empty page is past what retention deleted: reading on
  // from it is no gap.
  const Json fresh = Get(*c, "/v1/events?after=0");
  CHECK(fresh["items"].empty());
  const std::string fresh_cursor = fresh["next_cursor"];
  CHECK(Get(*c, "/v1/events?after=" + fresh_cursor)["items"].empty());
  // The cursor it names goes on from there.
  const std::string resume = detail.substr(detail.rfind("after=") + 6);
  CHECK(Get(*c, "/v1/events?after=" + resume)["items"].empty());
  Complete(*c, "INV-R4");
  CHECK(Get(*c, "/v1/events?after=" + resume)["items"].size() == 1);
}

TEST_CASE(
    "outbox: a sweep between a pull's check of its cursor and its read is a 409, never a page "
    "that starts past the cursor") {
  auto hook = fakes::FakeEffectorServer::Start();
  REQUIRE(hook != nullptr);
  TempDir dir;
  std::string config =
      WriteTestConfig(dir, kQuestionRules, OutboxYaml(*hook, 3) + "  retention: 3s\n");
  std::string err;
  // Sweeps every second; the first positioned pull waits 2 s between its
  // check of the cursor and its read, as when another daemon's sweep
  // commits between the two on a shared store.
  auto daemon = DaemonProcess::Start(
      Args(config, dir, "daemon.sweep_every_second=error,outbox.pull_between_reads=1*delay(2000)"),
      &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);
  auto c = daemon->Client();
  Complete(*c, "INV-S1");
  const Json first = Get(*c, "/v1/events?after=0");
  REQUIRE(first["items"].size() == 1);
  const uint64_t seen = first["items"][0]["seq"].get<uint64_t>();
  Complete(*c, "INV-S2");
  REQUIRE(WaitFor([&] { return Received(*hook).size() >= 2; }, 10'000));
  // INV-S2's event turns 3 s old during the pull's wait; INV-S3's does not.
  std::this_thread::sleep_for(std::chrono::milliseconds(2'500));
  Complete(*c, "INV-S3");
  auto r = c->Get(("/v1/events?after=" + first["next_cursor"].get<std::string>()).c_str());
  REQUIRE(r);
  if (r->status == 200) {
    // Served only when nothing after the cursor was gone.
    const Json page = Json::parse(r->body);
    REQUIRE_FALSE(page["items"].empty());
    CHECK(page["items"][0]["seq"].get<uint64_t>() == seen + 1);
  } else {
    CHECK(r->status == 409);
    CHECK(Json::parse(r->body)["pointer"] == "query:after");
  }
}

}  // namespace idem::testing
