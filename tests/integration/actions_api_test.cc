// Daemon-executed actions, runs and plans over HTTP, against the fake
// effector in this process.
#include <doctest/doctest.h>

#include <chrono>
#include <future>
#include <set>
#include <thread>

#include "tests/fakes/fake_effector.h"
#include "tests/integration/harness.h"

namespace idem::testing {
namespace {

using fakes::FakeEffectorServer;

struct Fixture {
  std::unique_ptr<FakeEffectorServer> target = FakeEffectorServer::Start();
  TempDir dir;
  std::unique_ptr<DaemonProcess> daemon;
  std::unique_ptr<httplib::Client> client;
  std::string config;
  std::map<std::string, std::string> env;  // of the daemon (IDEM_FAILPOINTS)

  // `extra_yaml`: more config after the actions (more kinds, two-space
  // indented, or top-level keys); "{effector}" in it is the target's URL.
  explicit Fixture(std::string extra_yaml = "") {
    REQUIRE(target != nullptr);
    for (size_t at = extra_yaml.find("{effector}"); at != std::string::npos;
         at = extra_yaml.find("{effector}")) {
      extra_yaml.replace(at, 10, target->base_url());
    }
    target->SetBusinessKeyField("/invoice_id");
    const std::string rules = R"(default:
  output: '{"category":"refund","priority":"high","summary":"s","actions":[{"kind":"send_reply","args":{"ticket_id":"{{input.ticket_id}}","text":"on it"}},{"kind":"send_reply","args":{"ticket_id":"{{input.ticket_id}}","text":"done"}}]}'
)";
    const std::string actions =
        "    plan: {pointer: /actions}\n"
        "actions:\n"
        "  send_invoice:\n"
        "    identity: {fields: [/invoice_id], version: v1}\n"
        "    window: forever\n"
        "    on_duplicate: return_original\n"
        "    effector: {http: {method: POST, url: \"" +
        target->base_url() +
        "/records\", idempotency: header}}\n"
        "    retry: {attempts: 3, base: 10ms, cap: 50ms, timeout: 5s}\n"
        "  send_reply:\n"
        "    identity: {fields: [/ticket_id, /text], version: v1}\n"
        "    window: 24h\n"
        "    on_duplicate: return_original\n"
        "    effector: {http: {method: POST, url: \"" +
        target->base_url() + "/replies\", idempotency: header}}\n" + extra_yaml;
    config = WriteTestConfig(dir, rules, actions);
    Restart();
  }
  void Restart() {
    client.reset();
    daemon.reset();
    std::string err;
    daemon = DaemonProcess::Start({config, dir.path() + "/data", {}, env}, &err);
    REQUIRE_MESSAGE(daemon != nullptr, err);
    client = daemon->Client();
  }
  httplib::Result Post(const std::string& path, const Json& body, const std::string& key) {
    return client->Post(path.c_str(), {{"Idempotency-Key", key}}, body.dump(), "application/json");
  }
};

Json J(const httplib::Result& r) {
  REQUIRE(r);
  return Json::parse(r->body);
}

}  // namespace

TEST_CASE("an action runs once: 201 now, then 200 with the original result") {
  Fixture f;
  Json args = {{"args", {{"invoice_id", "INV-1"}, {"amount", 10}}}};
  auto first = f.Post("/v1/actions/send_invoice", args, "\"a-1\"");
  REQUIRE(first->status == 201);
  Json a = J(first);
  CHECK(a["state"] == "done");
  CHECK_FALSE(a["external_ref"].get<std::string>().empty());
  // A retry with a new key (a new attempt of the caller) is a duplicate of
  // the same work: the original result, and no second effect.
  auto again = f.Post("/v1/actions/send_invoice", args, "\"a-2\"");
  REQUIRE(again->status == 200);
  CHECK(J(again)["duplicate"] == true);
  CHECK(J(again)["external_ref"] == a["external_ref"]);
  CHECK(f.target->stats().effects == 1);
  // The effector got the work_id as its Idempotency-Key.
  auto calls = f.target->calls();
  REQUIRE_FALSE(calls.empty());
  CHECK(calls.back().headers["idempotency-key"] == a["work_id"]);
}

TEST_CASE(
    "an on_duplicate: ignore kind never shows one call another's result, not even through a key "
    "released while that work ran") {
  Fixture f(
      "  hidden:\n"
      "    identity: {fields: [/id], version: v1}\n"
      "    window: 24h\n"
      "    on_duplicate: ignore\n"
      "    effector: {http: {method: POST, url: \"{effector}/records\", idempotency: header}}\n");
  f.target->SetLatencyMs(1'500);
  const Json call = {{"args", {{"id", "h-1"}, {"note", "alice's"}}}};
  auto alice = std::async(std::launch::async, [&] {
    auto c = f.daemon->Client();
    return c->Post("/v1/actions/hidden", {{"Idempotency-Key", "\"alice-1\""}}, call.dump(),
                   "application/json");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  auto busy = f.Post("/v1/actions/hidden", call, "\"bob-1\"");  // released: work still moving
  REQUIRE(busy);
  CHECK(busy->status == 409);
  auto first = alice.get();
  REQUIRE(first);
  REQUIRE(first->status == 201);
  f.target->SetLatencyMs(0);
  auto retried = f.Post("/v1/actions/hidden", call, "\"bob-1\"");
  REQUIRE(retried);
  CHECK(retried->status == 200);
  CHECK(J(retried)["duplicate"] == true);
  CHECK_FALSE(J(retried).contains("result"));  // alice's result stays alice's
  CHECK(f.target->stats().effects == 1);
}

TEST_CASE("the same work called again while it runs is 409 with Retry-After") {
  Fixture f;
  f.target->SetLatencyMs(1500);
  const Json body = {{"args", {{"invoice_id", "INV-BUSY"}, {"amount", 5}}}};
  auto first = std::async(std::launch::async, [&] {
    return f.daemon->Client()->Post("/v1/actions/send_invoice", {{"Idempotency-Key", "\"b-1\""}},
                                    body.dump(), "application/json");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto busy = f.Post("/v1/actions/send_invoice", body, "\"b-2\"");  // another key: the same work
  REQUIRE(busy);
  CHECK(busy->status == 409);
  const std::string after = busy->get_header_value("Retry-After");
  CHECK_FALSE(after.empty());
  CHECK(std::atoi(after.c_str()) >= 1);
  REQUIRE(first.get()->status == 201);
}

TEST_CASE("a resubmitted run does no work that is already done") {
  Fixture f;
  Json items = Json::array();
  for (int i = 0; i < 5; ++i) items.push_back({{"invoice_id", "R-" + std::to_string(i)}});
  Json run = {{"run_id", "nightly-1"}, {"kind", "send_invoice"}, {"items", items}};
  auto first = f.Post("/v1/runs", run, "\"run-1\"");
  REQUIRE(first->status == 200);
  CHECK(J(first)["counts"]["executed"] == 5);
  CHECK(f.target->stats().effects == 5);

  // A new run over the same items (say, after a crash and a restart of the
  // batch): nothing is done again.
  items.push_back({{"invoice_id", "R-5"}});
  Json resumed = {{"run_id", "nightly-1"}, {"kind", "send_invoice"}, {"items", items}};
  auto second = f.Post("/v1/runs", resumed, "\"run-2\"");
  REQUIRE(second->status == 200);
  CHECK(J(second)["counts"]["already_done"] == 5);
  CHECK(J(second)["counts"]["executed"] == 1);
  CHECK(f.target->stats().effects == 6);
  auto listed = f.client->Get("/v1/runs/nightly-1");
  CHECK(J(listed)["counts"]["done"] == 6);
  CHECK_FALSE(J(listed).contains("more_items"));
  // A page lists fewer, but counts the whole run: "all done?" reads right.
  Json page = J(f.client->Get("/v1/runs/nightly-1?limit=2"));
  CHECK(page["items"].size() == 2);
  CHECK(page["counts"]["done"] == 6);
  CHECK(page["total"] == 6);
  CHECK(page["more_items"] == true);
  // The pages after it (?cursor= from next_cursor) list every item once,
  // oldest first, each page counting the whole run.
  std::vector<std::string> ids;
  for (const Json& w : page["items"]) ids.push_back(w["work_id"]);
  for (int pages = 0; page.contains("next_cursor") && pages < 10; ++pages) {
    page = J(f.client->Get(
        ("/v1/runs/nightly-1?limit=2&cursor=" + page["next_cursor"].get<std::string>()).c_str()));
    CHECK(page["counts"]["done"] == 6);
    for (const Json& w : page["items"]) ids.push_back(w["work_id"]);
  }
  CHECK(ids.size() == 6);
  CHECK(std::set<std::string>(ids.begin(), ids.end()).size() == 6);
  const Json whole = J(f.client->Get("/v1/runs/nightly-1"));  // one page of all six
  std::vector<std::string> in_one;
  for (const Json& w : whole["items"]) in_one.push_back(w["work_id"]);
  CHECK(ids == in_one);
  CHECK_FALSE(page.contains("more_items"));
  // A cursor no page gave: 400 at query:cursor.
  for (const char* cursor : {"zz", "6869", "2d312f77"}) {  // not hex; "hi"; "-1/w"
    CAPTURE(cursor);
    auto bad_cursor = f.client->Get((std::string("/v1/runs/nightly-1?cursor=") + cursor).c_str());
    REQUIRE(bad_cursor);
    CHECK(bad_cursor->status == 400);
    CHECK(J(bad_cursor)["pointer"] == "query:cursor");
  }
  // An item without its identity refuses the run, naming the item's field.
  Json bad = {{"run_id", "nightly-2"},
              {"kind", "send_invoice"},
              {"items", {{{"invoice_id", "R-9"}}, {{"amount", 1}}}}};
  auto refused = f.Post("/v1/runs", bad, "\"run-3\"");
  REQUIRE(refused->status == 400);
  CHECK(J(refused)["pointer"] == "/items/1/invoice_id");
  CHECK(f.target->stats().effects == 6);  // nothing of the refused run ran
  // So there is no such run: 404, not an empty list that reads "nothing to do".
  auto none = f.client->Get("/v1/runs/nightly-2");
  REQUIRE(none);
  CHECK(none->status == 404);
  CHECK(J(none)["detail"].get<std::string>().find("nightly-2") != std::string::npos);
}

TEST_CASE(
    "a run counts the items another run, a single call or a client's claim did before it: "
    "GET /v1/runs/{id} lists every item the run submitted") {
  Fixture f(
      "  export_row:\n"
      "    identity: {fields: [/row], version: v1}\n"
      "    window: 24h\n"
      "    on_duplicate: return_original\n");
  REQUIRE(
      f.Post("/v1/actions/send_invoice", {{"args", {{"invoice_id", "P-0"}}}}, "\"one\"")->status ==
      201);
  auto run = [&f](const std::string& id, std::vector<std::string> invoices) {
    Json items = Json::array();
    for (const std::string& i : invoices) items.push_back({{"invoice_id", i}});
    Json body = {{"run_id", id}, {"kind", "send_invoice"}, {"items", items}};
    auto r = f.Post("/v1/runs", body, "\"" + id + "\"");
    REQUIRE(r);
    REQUIRE_MESSAGE(r->status == 200, r->body);
  };
  run("alpha", {"P-0", "P-1"});
  run("beta", {"P-0", "P-1"});  // nothing of it is new
  CHECK(f.target->stats().effects == 2);
  for (const char* id : {"alpha", "beta"}) {
    CAPTURE(id);
    auto listed = f.client->Get((std::string("/v1/runs/") + id).c_str());
    REQUIRE(listed);
    REQUIRE_MESSAGE(listed->status == 200, listed->body);
    CHECK(J(listed)["total"] == 2);
    CHECK(J(listed)["counts"]["done"] == 2);
  }

  // A client's claim under a run, of work claimed and done before.
  Json claim = {{"kind", "export_row"}, {"identity", {{"row", 7}}}, {"run_id", "gamma"}};
  auto first = f.client->Post("/v1/work/claim", claim.dump(), "application/json");
  REQUIRE(first->status == 201);
  Json done = {{"lease_token", J(first)["lease_token"]}, {"result", {{"ok", true}}}};
  REQUIRE(f.client
              ->Post(("/v1/work/" + J(first)["work_id"].get<std::string>() + "/complete").c_str(),
                     done.dump(), "application/json")
              ->status == 200);
  claim["run_id"] = "delta";
  REQUIRE(f.client->Post("/v1/work/claim", claim.dump(), "application/json")->status == 200);
  Json delta = J(f.client->Get("/v1/runs/delta"));
  CHECK(delta["total"] == 1);
  CHECK(delta["items"][0]["work_id"] == J(first)["work_id"]);
  CHECK(J(f.client->Get("/v1/runs/gamma"))["total"] == 1);
}

TEST_CASE("a retry of a run that outlasts its key's lease is answered in progress, not run again") {
  Fixture f("idempotency:\n  lease: 300ms\n");
  f.target->SetLatencyMs(1500);  // the one effect takes five leases
  Json run = {{"run_id", "long-1"},
              {"kind", "send_invoice"},
              {"items", Json::array({{{"invoice_id", "L-1"}}})}};
  auto first = std::async(std::launch::async, [&] {
    auto c = f.daemon->Client();
    return c->Post("/v1/runs", {{"Idempotency-Key", "\"long\""}}, run.dump(), "application/json");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  auto retry = f.Post("/v1/runs", run, "\"long\"");
  REQUIRE(retry);
  CHECK(retry->status == 409);
  CHECK(J(retry)["detail"].get<std::string>().find("still in progress") != std::string::npos);
  auto original = first.get();
  REQUIRE(original);
  CHECK(original->status == 200);
  CHECK(J(original)["counts"]["executed"] == 1);
  CHECK(f.target->stats().effects == 1);
  CHECK(MetricValue(*f.client, "idem_key_in_flight_total") >= 1);
  // Once it ended, the key replays the run's answer.
  auto later = f.Post("/v1/runs", run, "\"long\"");
  REQUIRE(later);
  CHECK(later->status == 200);
  CHECK(later->get_header_value("Idempotent-Replayed") == "true");
  CHECK(later->body == original->body);
}

TEST_CASE("applying a decision's plan executes each action once, however often it is applied") {
  Fixture f;
  auto d = f.client->Post("/v1/decide",
                          R"({"step":"triage_ticket","input":{"ticket_id":"T-9","text":"x"}})",
                          "application/json");
  REQUIRE(d->status == 200);
  std::string id = J(d)["decision_id"];
  auto no_key = f.client->Post(("/v1/plans/" + id + "/apply").c_str(), "{}", "application/json");
  CHECK(no_key->status == 400);
  auto applied = f.Post("/v1/plans/" + id + "/apply", Json::object(), "\"p-1\"");
  REQUIRE(applied->status == 200);
  Json p = J(applied);
  CHECK(p["state"] == "applied");
  CHECK(p["actions"].size() == 2);
  CHECK(f.target->stats().effects == 2);
  auto again = f.Post("/v1/plans/" + id + "/apply", Json::object(), "\"p-2\"");
  CHECK(J(again)["state"] == "applied");
  CHECK(f.target->stats().effects == 2);
  CHECK(J(f.client->Get(("/v1/plans/plan_" + id.substr(4)).c_str()))["state"] == "applied");
}

TEST_CASE("a 202 retrying is not replayed: a retry with the key reports the work's state now") {
  Fixture f;
  f.target->FailNext(1, 503);
  Json args = {{"args", {{"invoice_id", "INV-T"}, {"amount", 5}}}};
  auto first = f.Post("/v1/actions/send_invoice", args, "\"t-1\"");
  REQUIRE(first);
  REQUIRE(first->status == 202);
  CHECK(J(first)["state"] != "done");
  // Another payload under the key is still refused while the work moves.
  Json other = {{"args", {{"invoice_id", "INV-U"}, {"amount", 5}}}};
  CHECK(f.Post("/v1/actions/send_invoice", other, "\"t-1\"")->status == 422);
  // The daemon's workers retry the effect (10-50 ms backoff).
  int status = 0;
  Json later;
  for (int i = 0; i < 100; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    auto res = f.Post("/v1/actions/send_invoice", args, "\"t-1\"");
    REQUIRE(res);
    CHECK(res->get_header_value("Idempotent-Replayed") == "");
    status = res->status;
    later = J(res);
    // 202 retrying, or 409 busy while a worker runs the due attempt: both
    // are answers about work still moving, never stored under the key.
    if (status != 202 && status != 409) break;
  }
  // 201 if this retry ran the due attempt itself, 200 if a worker had.
  REQUIRE_MESSAGE((status == 200 || status == 201), later.dump());
  CHECK(later["state"] == "done");
  CHECK(f.target->stats().effects == 1);
  // A final outcome is stored: from now on it is replayed.
  auto replayed = f.Post("/v1/actions/send_invoice", args, "\"t-1\"");
  CHECK(replayed->status == status);
  CHECK(replayed->get_header_value("Idempotent-Replayed") == "true");
  CHECK(f.Post("/v1/actions/send_invoice", other, "\"t-1\"")->status == 422);
}

TEST_CASE(
    "a dead-letter replay is in the audit log before its effect runs, so a crash during the "
    "effect leaves the operator's action recorded") {
  Fixture f;
  f.target->FailNext(3, 500);
  auto first = f.Post("/v1/actions/send_invoice", {{"args", {{"invoice_id", "INV-9"}}}}, "\"d-1\"");
  REQUIRE(first);
  std::string work_id;
  REQUIRE(WaitFor(
      [&] {
        Json dead = J(f.client->Get("/v1/dead-letters"));
        if (dead["items"].empty()) return false;
        work_id = dead["items"][0]["work_id"];
        return true;
      },
      10'000));
  f.target->SetLatencyMs(3'000);
  auto replay = std::async(std::launch::async, [&] {
    return f.daemon->Client()->Post("/v1/dead-letters/" + work_id + "/replay",
                                    {{"Idempotency-Key", "\"r-1\""}}, "", "application/json");
  });
  // The effect is under way when the daemon dies.
  REQUIRE(WaitFor([&] { return f.target->stats().raw_calls >= 4; }, 5'000));
  f.daemon->Kill9();
  (void)replay.get();
  f.target->SetLatencyMs(0);
  f.Restart();
  bool recorded = false;
  const Json audit = J(f.client->Get("/v1/audit?limit=100"));
  for (const Json& e : audit["items"]) {
    recorded =
        recorded || (e["action"] == "dead_letter.replayed" && e["detail"]["work_id"] == work_id);
  }
  CHECK_MESSAGE(recorded, audit.dump());
}

TEST_CASE("a dead-letter replay whose attempt fails for good again is 409 dead, not 202") {
  Fixture f;
  f.target->FailNext(1, 422);  // not retryable: dead at once
  auto first =
      f.Post("/v1/actions/send_invoice", {{"args", {{"invoice_id", "INV-422"}}}}, "\"d-422\"");
  REQUIRE(first);
  REQUIRE(first->status == 409);
  const std::string work_id = J(first)["work_id"];
  f.target->FailNext(1, 422);
  auto replay = f.client->Post("/v1/dead-letters/" + work_id + "/replay",
                               {{"Idempotency-Key", "\"r-422\""}}, "", "application/json");
  REQUIRE(replay);
  CHECK(replay->status == 409);
  CHECK(J(replay)["state"] == "dead");
  CHECK(J(replay)["detail"].get<std::string>().find("dead letter again") != std::string::npos);
  // The next replay, with the target fixed, runs it.
  auto fixed = f.client->Post("/v1/dead-letters/" + work_id + "/replay",
                              {{"Idempotency-Key", "\"r-422-2\""}}, "", "application/json");
  REQUIRE(fixed);
  CHECK(fixed->status == 200);
  CHECK(J(fixed)["state"] == "done");
}

TEST_CASE(
    "a run whose item met an error that may pass is not stored under its key: the retry runs "
    "again and finishes it") {
  Fixture f;
  f.env["IDEM_FAILPOINTS"] = "apply.after_claim=2*error";  // the second item's claim
  f.Restart();
  const Json run = {
      {"run_id", "re"},
      {"kind", "send_invoice"},
      {"items",
       Json::array({{{"invoice_id", "R-1"}}, {{"invoice_id", "R-2"}}, {{"invoice_id", "R-3"}}})}};
  auto first = f.Post("/v1/runs", run, "\"run-e\"");
  REQUIRE(first);
  REQUIRE_MESSAGE(first->status == 200, first->body);
  const Json a = J(first);
  CHECK(a["counts"]["error"] == 1);
  const Json& bad = a["items"][1];
  CHECK(bad.contains("error"));
  CHECK(bad["work_id"].get<std::string>().size() == 64);  // trackable
  CHECK(bad["retryable"] == true);
  auto again = f.Post("/v1/runs", run, "\"run-e\"");
  REQUIRE(again);
  CHECK_FALSE(again->has_header("Idempotent-Replayed"));
  const Json b = J(again);
  CHECK(b["counts"].value("error", 0) == 0);
  // The item whose claim failed holds its lease until the takeover: busy
  // now, and done once the daemon's worker has run it.
  CHECK(b["counts"].value("executed", 0) + b["counts"].value("already_done", 0) +
            b["counts"].value("busy", 0) + b["counts"].value("retrying", 0) ==
        3);
  REQUIRE(WaitFor([&] { return J(f.client->Get("/v1/runs/re"))["counts"].value("done", 0) == 3; },
                  20'000));
  CHECK(f.target->stats().duplicates_by_key == 0);
}

TEST_CASE("of two dead-letter replays at once, one runs it and the other is 409, as after it") {
  Fixture f;
  f.target->FailNext(1, 422);
  auto first =
      f.Post("/v1/actions/send_invoice", {{"args", {{"invoice_id", "INV-2x"}}}}, "\"d-2x\"");
  REQUIRE(first);
  REQUIRE(first->status == 409);
  const std::string work_id = J(first)["work_id"];
  f.target->SetLatencyMs(1'000);
  auto replay = [&](const std::string& key) {
    return std::async(std::launch::async, [&f, &work_id, key] {
      auto r = f.daemon->Client()->Post("/v1/dead-letters/" + work_id + "/replay",
                                        {{"Idempotency-Key", "\"" + key + "\""}}, "",
                                        "application/json");
      return r ? r->status : -1;
    });
  };
  auto a = replay("ra");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto b = replay("rb");
  std::multiset<int> got = {a.get(), b.get()};
  CHECK(got == std::multiset<int>{200, 409});
  CHECK(f.target->stats().effects == 1);
}

// Kinds that answer another call with the same identity without the
// result: "conflict" (409) and "ignore" (200, no result). The gated ones
// wait for an operator first.
std::string OnceKinds() {
  std::string kinds;
  for (const char* mode : {"conflict", "ignore"}) {
    for (const char* gated : {"", "_gated"}) {
      kinds += std::string("  once_") + mode + gated +
               ":\n    identity: {fields: [/invoice_id], version: v1}\n"
               "    window: forever\n    on_duplicate: " +
               mode +
               "\n    effector: {http: {method: POST, url: \"{effector}/records\", idempotency: "
               "header}}\n    retry: {attempts: 3, base: 10ms, cap: 50ms, timeout: 5s}\n" +
               (*gated ? "    approval: {require: always, reason: checked}\n" : "");
    }
  }
  return kinds;
}

// The call of a test on kind `kind`: its body and its Idempotency-Key.
Json OnceArgs(const std::string& kind) {
  return {{"args", {{"invoice_id", "INV-" + kind}, {"amount", 5}}}};
}
std::string OnceKey(const std::string& kind) { return "\"" + kind + "-call\""; }

// Makes the call of `kind`, which must be answered 202; its answer.
Json FirstCallAccepted(Fixture& f, const std::string& kind) {
  auto first = f.Post("/v1/actions/" + kind, OnceArgs(kind), OnceKey(kind));
  REQUIRE(first);
  REQUIRE_MESSAGE(first->status == 202, first->body);
  return J(first);
}

// What a call of `kind` gets once its work is done: the same call again is
// told what it did; another call is answered as the kind's on_duplicate
// says.
void CheckDoneAnswers(Fixture& f, const std::string& kind) {
  const std::string path = "/v1/actions/" + kind;
  const Json args = OnceArgs(kind);
  auto same = f.Post(path, args, OnceKey(kind));
  REQUIRE(same);
  CHECK_MESSAGE(same->status == 200, same->body);
  CHECK(J(same)["duplicate"] == true);
  CHECK(J(same)["state"] == "done");
  CHECK(J(same).contains("result"));
  CHECK_FALSE(J(same)["result"].is_null());
  auto other = f.Post(path, args, "\"another-call-of-" + kind + "\"");
  REQUIRE(other);
  if (kind.find("conflict") != std::string::npos) {
    CHECK(other->status == 409);
  } else {
    CHECK(other->status == 200);
    CHECK_FALSE(J(other).contains("result"));
  }
}

TEST_CASE(
    "a call first answered 202 retrying gets its work's result when retried after it is done, "
    "whatever the kind's on_duplicate") {
  Fixture f(OnceKinds());
  for (const std::string kind : {"once_conflict", "once_ignore"}) {
    CAPTURE(kind);
    const int64_t effects_before = f.target->stats().effects;
    f.target->FailNext(1, 503);
    const std::string work = FirstCallAccepted(f, kind)["work_id"];
    // The daemon's workers retry the effect (10-50 ms backoff).
    REQUIRE(WaitFor(
        [&] {
          auto w = f.client->Get(("/v1/work/" + work).c_str());
          return w && w->status == 200 && Json::parse(w->body)["state"] == "done";
        },
        10'000));
    CheckDoneAnswers(f, kind);
    CHECK(f.target->stats().effects == effects_before + 1);
  }
}

TEST_CASE(
    "a call first answered 202 awaiting approval gets its work's result when retried after the "
    "approved work ran, whatever the kind's on_duplicate") {
  Fixture f(OnceKinds());
  for (const std::string kind : {"once_conflict_gated", "once_ignore_gated"}) {
    CAPTURE(kind);
    const int64_t effects_before = f.target->stats().effects;
    const std::string plan = FirstCallAccepted(f, kind)["plan_id"];
    auto approved = f.Post("/v1/plans/" + plan + "/approve", Json::object(), "\"ok-" + kind + "\"");
    REQUIRE(approved);
    REQUIRE_MESSAGE(approved->status == 200, approved->body);
    CHECK(f.target->stats().effects == effects_before + 1);
    CheckDoneAnswers(f, kind);
    CHECK(f.target->stats().effects == effects_before + 1);
  }
}

TEST_CASE("a run with no items is refused: it would be a run no GET /v1/runs/{id} finds") {
  Fixture f;
  auto empty =
      f.Post("/v1/runs", {{"run_id", "none"}, {"kind", "send_invoice"}, {"items", Json::array()}},
             "\"run-none\"");
  REQUIRE(empty);
  CHECK(empty->status == 400);
  CHECK(J(empty)["pointer"] == "/items");
}

}  // namespace idem::testing
