// Client-executed work, named leases, dead letters and the required
// Idempotency-Key, over HTTP against the real daemon.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "tests/integration/harness.h"

namespace idem::testing {
namespace {

const char* kActions = R"(actions:
  send_invoice:
    identity: {fields: [/invoice_id], version: v1}
    window: 24h
    on_duplicate: return_original
    retry: {attempts: 2, base: 10ms, cap: 20ms, timeout: 5s}
  notify:
    identity: {fields: [/chat_id, /text], version: v1}
    window: forever
    on_duplicate: conflict
  charge_once:
    identity: {fields: [/job], version: v1}
    window: 24h
    on_duplicate: return_original
    retry: {attempts: 1, timeout: 5s}
  ship_order:
    identity: {fields: [/order/id], version: v1}
    window: 24h
    on_duplicate: return_original
)";

struct Fixture {
  TempDir dir;
  std::string config = WriteTestConfig(dir, kQuestionRules, kActions);
  std::unique_ptr<DaemonProcess> daemon;
  std::unique_ptr<httplib::Client> client;
  Fixture() {
    std::string err;
    daemon = DaemonProcess::Start({config, dir.path() + "/data", {}, {}}, &err);
    REQUIRE_MESSAGE(daemon != nullptr, err);
    client = daemon->Client();
  }
  httplib::Result Post(const std::string& path, const Json& body, const std::string& key = "") {
    httplib::Headers h;
    if (!key.empty()) h.emplace("Idempotency-Key", key);
    return client->Post(path.c_str(), h, body.dump(), "application/json");
  }
};

Json J(const httplib::Result& r) {
  REQUIRE(r);
  return Json::parse(r->body);
}

}  // namespace

TEST_CASE(
    "a duplicate claim that finds the last attempt's lease over buries the work, and the slow "
    "holder's complete still lands, so no replay charges twice") {
  Fixture f;
  Json claim = {{"kind", "charge_once"}, {"identity", {{"job", "pay-77"}}}, {"lease", "1s"}};
  auto first = f.Post("/v1/work/claim", claim);
  REQUIRE(first->status == 201);
  const std::string id = J(first)["work_id"], token = J(first)["lease_token"];
  std::this_thread::sleep_for(std::chrono::milliseconds(1'500));  // the holder is slow, not dead
  auto duplicate = f.Post("/v1/work/claim", claim);
  REQUIRE(duplicate->status == 409);
  CHECK(J(duplicate)["state"] == "dead");
  CHECK_FALSE(J(duplicate).contains("lease_token"));
  // A new dead letter, counted once (the next claim finds it dead, and
  // buries nothing), and not as a failed attempt.
  CHECK(MetricValue(*f.client, "idem_work_dead_total") == 1);
  CHECK(f.Post("/v1/work/claim", claim)->status == 409);
  CHECK(MetricValue(*f.client, "idem_work_dead_total") == 1);
  CHECK(MetricValue(*f.client, "idem_work_failed_total") == 0);
  auto late =
      f.Post("/v1/work/" + id + "/complete",
             {{"lease_token", token}, {"result", {{"charge", "ch_1"}}}, {"external_ref", "ch_1"}});
  REQUIRE(late);
  CHECK(late->status == 200);
  CHECK(J(late)["state"] == "done");
  CHECK(J(f.client->Get("/v1/dead-letters"))["items"].empty());
  // The next claim gets the recorded charge, not a new lease.
  auto again = f.Post("/v1/work/claim", claim);
  REQUIRE(again);
  CHECK(again->status == 200);
  CHECK(J(again)["external_ref"] == "ch_1");
}

TEST_CASE(
    "client work whose last attempt's holder crashed becomes a dead letter without another "
    "claim") {
  Fixture f;
  Json claim = {{"kind", "charge_once"}, {"identity", {{"job", "pay-crash"}}}, {"lease", "1s"}};
  auto first = f.Post("/v1/work/claim", claim);
  REQUIRE(first->status == 201);
  const std::string id = J(first)["work_id"];
  // The holder dies: nobody completes, fails or claims it again.
  std::string state;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(6);
  while (state != "dead" && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    state = J(f.client->Get(("/v1/work/" + id).c_str()))["state"];
  }
  CHECK(state == "dead");
  const Json dead = J(f.client->Get("/v1/dead-letters"));
  REQUIRE(dead["items"].size() == 1);
  CHECK(dead["items"][0]["work_id"] == id);
  CHECK(MetricValue(*f.client, "idem_work_dead_total") == 1);
}

TEST_CASE("claim, complete, and a second claim returns the original result") {
  Fixture f;
  Json claim = {
      {"kind", "send_invoice"}, {"identity", {{"invoice_id", "INV-7"}}}, {"lease", "30s"}};
  auto first = f.Post("/v1/work/claim", claim);
  REQUIRE(first->status == 201);
  Json c = J(first);
  CHECK(c["state"] == "running");
  CHECK(c["attempt"] == 1);
  std::string id = c["work_id"], token = c["lease_token"];
  CHECK(id.size() == 64);

  // While the lease is live, another caller is told who holds it until when.
  auto busy = f.Post("/v1/work/claim", claim);
  REQUIRE(busy->status == 409);
  CHECK(J(busy)["state"] == "running");
  CHECK(J(busy)["locked_until_ms"].get<int64_t>() > 0);
  CHECK_FALSE(J(busy).contains("lease_token"));

  auto done =
      f.Post("/v1/work/" + id + "/complete",
             {{"lease_token", token}, {"result", {{"sent", true}}}, {"external_ref", "in_123"}});
  REQUIRE(done->status == 200);
  CHECK(J(done)["state"] == "done");

  auto again = f.Post("/v1/work/claim", claim);
  REQUIRE(again->status == 200);
  Json a = J(again);
  CHECK(a["state"] == "done");
  CHECK(a["duplicate"] == true);
  CHECK(a["result"]["sent"] == true);
  CHECK(a["external_ref"] == "in_123");
  CHECK(a["work_id"] == id);

  auto item = f.client->Get(("/v1/work/" + id).c_str());
  CHECK(J(item)["identity"]["/invoice_id"] == "INV-7");
}

TEST_CASE("a stale lease token is refused") {
  Fixture f;
  Json claim = {{"kind", "send_invoice"}, {"identity", {{"invoice_id", "INV-8"}}}, {"lease", "1s"}};
  Json c = J(f.Post("/v1/work/claim", claim));
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  auto second = f.Post("/v1/work/claim", claim);
  REQUIRE(second->status == 201);  // the lease expired: the next caller wins
  CHECK(J(second)["attempt"] == 2);
  auto stale = f.Post("/v1/work/" + c["work_id"].get<std::string>() + "/complete",
                      {{"lease_token", c["lease_token"]}, {"result", 1}});
  REQUIRE(stale->status == 409);
  CHECK(J(stale)["pointer"] == "/lease_token");
  auto fresh = f.Post("/v1/work/" + c["work_id"].get<std::string>() + "/complete",
                      {{"lease_token", J(second)["lease_token"]}, {"result", 2}});
  CHECK(fresh->status == 200);
}

TEST_CASE(
    "a claim before a failure's retry_after is 409 with Retry-After, and is granted once it is "
    "due") {
  Fixture f;
  Json claim = {{"kind", "send_invoice"}, {"identity", {{"invoice_id", "INV-9"}}}};
  Json c = J(f.Post("/v1/work/claim", claim));
  const std::string id = c["work_id"];
  auto failed =
      f.Post("/v1/work/" + id + "/fail",
             {{"lease_token", c["lease_token"]}, {"error", "429 from CRM"}, {"retry_after", 1}});
  REQUIRE(J(failed)["state"] == "failed");

  // Another worker (or the same one, too soon) is told to wait, not handed
  // an attempt that would hit the upstream the failure backed off from.
  auto early = f.Post("/v1/work/claim", claim);
  REQUIRE(early->status == 409);
  CHECK(early->get_header_value("Retry-After") == "1");
  Json e = J(early);
  CHECK(e["state"] == "failed");
  CHECK(e["attempt"] == 1);
  CHECK(e["next_attempt_at_ms"] == J(failed)["next_attempt_at_ms"]);
  CHECK(e["detail"].get<std::string>().find("429 from CRM") != std::string::npos);
  CHECK_FALSE(e.contains("lease_token"));

  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  auto due = f.Post("/v1/work/claim", claim);
  REQUIRE(due->status == 201);
  Json d = J(due);
  CHECK(d["attempt"] == 2);
  // While it is held, a claim is told when the lease ends.
  auto busy = f.Post("/v1/work/claim", claim);
  REQUIRE(busy->status == 409);
  CHECK_FALSE(busy->get_header_value("Retry-After").empty());

  auto done = f.Post("/v1/work/" + id + "/complete",
                     {{"lease_token", d["lease_token"]}, {"result", {{"crm_id", 3}}}});
  REQUIRE(done->status == 200);
  CHECK_FALSE(J(done).contains("last_error"));  // the earlier attempt's error is history

  // The holder's retry with the same result is answered as the first; with
  // another result it is refused, and the answer carries the one that stands.
  auto again = f.Post("/v1/work/" + id + "/complete",
                      {{"lease_token", d["lease_token"]}, {"result", {{"crm_id", 3}}}});
  CHECK(again->status == 200);
  CHECK(again->body == done->body);
  auto other = f.Post("/v1/work/" + id + "/complete",
                      {{"lease_token", d["lease_token"]}, {"result", {{"crm_id", 4}}}});
  REQUIRE(other->status == 409);
  CHECK(J(other)["pointer"] == "/result");
  CHECK(J(other)["result"] == Json{{"crm_id", 3}});
  // A fail from the lease that completed it says the work is done.
  auto late_fail = f.Post("/v1/work/" + id + "/fail",
                          {{"lease_token", d["lease_token"]}, {"error", "cleanup failed"}});
  REQUIRE(late_fail->status == 409);
  CHECK(J(late_fail)["detail"].get<std::string>().find("a fail after a complete") !=
        std::string::npos);
  CHECK(J(f.client->Get(("/v1/work/" + id).c_str()))["state"] == "done");
}

TEST_CASE("64 simultaneous HTTP claims of one work item have one winner") {
  Fixture f;
  Json claim = {{"kind", "send_invoice"}, {"identity", {{"invoice_id", "INV-64"}}}};
  std::atomic<int> won{0}, busy{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 64; ++i) {
    threads.emplace_back([&] {
      auto c = f.daemon->Client();
      auto r = c->Post("/v1/work/claim", claim.dump(), "application/json");
      if (r && r->status == 201) won++;
      if (r && r->status == 409) busy++;
    });
  }
  for (auto& t : threads) t.join();
  CHECK(won == 1);
  CHECK(busy == 63);
}

// Once `progress()` reaches `target` (within 20 s), kills the daemon with
// SIGKILL, waits for the clients (they stop when it is gone) and starts it
// again on the same store, in `daemon` (which the clients may still read).
void KillMidLoadAndRestart(std::unique_ptr<DaemonProcess>& daemon, const std::string& config,
                           const TempDir& dir, const std::function<size_t()>& progress,
                           size_t target, std::vector<std::thread>& clients) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (progress() < target && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  daemon->Kill9();
  for (auto& t : clients) t.join();
  REQUIRE(progress() >= target);
  std::string err;
  daemon = DaemonProcess::Start({config, dir.path() + "/data", {}, {}}, &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);
}

TEST_CASE("every claim answered 201 survives a kill -9 that lands while claims are in flight") {
  TempDir dir;
  std::string config = WriteTestConfig(dir, kQuestionRules, kActions);
  std::string err;
  auto daemon = DaemonProcess::Start({config, dir.path() + "/data", {}, {}}, &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);
  // Claims of new work from 16 connections (the batch lane) until the kill.
  struct Won {
    std::string work_id, token;
  };
  std::mutex mu;
  std::vector<Won> won;
  std::atomic<int> answered{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 16; ++t) {
    clients.emplace_back([&, t] {
      auto c = daemon->Client();
      for (int n = 0;; ++n) {
        Json claim = {
            {"kind", "send_invoice"},
            {"identity", {{"invoice_id", "K-" + std::to_string(t) + "-" + std::to_string(n)}}},
            {"lease", "10m"}};
        auto r = c->Post("/v1/work/claim", claim.dump(), "application/json");
        if (!r) return;  // the daemon is gone
        if (r->status != 201) continue;
        Json j = Json::parse(r->body);
        std::lock_guard<std::mutex> lock(mu);
        won.push_back({j["work_id"], j["lease_token"]});
        ++answered;
      }
    });
  }
  KillMidLoadAndRestart(
      daemon, config, dir, [&] { return static_cast<size_t>(answered.load()); }, 300, clients);
  auto c = daemon->Client();
  int completed = 0;
  for (const Won& w : won) {
    Json done = {{"lease_token", w.token}, {"result", {{"ok", true}}}};
    auto r =
        c->Post(("/v1/work/" + w.work_id + "/complete").c_str(), done.dump(), "application/json");
    REQUIRE(r);
    CHECK_MESSAGE(r->status == 200, std::string(w.work_id + ": " + r->body));
    completed += r->status == 200 ? 1 : 0;
  }
  MESSAGE("claims answered 201 before the kill: ", won.size(), ", completed after it: ", completed);
  CHECK(completed == static_cast<int>(won.size()));
}

TEST_CASE(
    "every complete answered 200 survives a kill -9 that lands while completes are in flight") {
  TempDir dir;
  std::string config = WriteTestConfig(dir, kQuestionRules, kActions);
  std::string err;
  auto daemon = DaemonProcess::Start({config, dir.path() + "/data", {}, {}}, &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);
  // Claim + complete from 16 connections (both on the batch lane) until the kill.
  std::mutex mu;
  std::vector<std::string> done;
  std::vector<std::thread> clients;
  for (int t = 0; t < 16; ++t) {
    clients.emplace_back([&, t] {
      auto c = daemon->Client();
      for (int n = 0;; ++n) {
        Json claim = {
            {"kind", "send_invoice"},
            {"identity", {{"invoice_id", "C-" + std::to_string(t) + "-" + std::to_string(n)}}}};
        auto r = c->Post("/v1/work/claim", claim.dump(), "application/json");
        if (!r) return;  // the daemon is gone
        if (r->status != 201) continue;
        Json j = Json::parse(r->body);
        std::string id = j["work_id"];
        Json body = {{"lease_token", j["lease_token"]}, {"result", {{"n", n}}}};
        auto fin =
            c->Post(("/v1/work/" + id + "/complete").c_str(), body.dump(), "application/json");
        if (!fin) return;
        if (fin->status != 200) continue;
        std::lock_guard<std::mutex> lock(mu);
        done.push_back(id);
      }
    });
  }
  auto count = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return done.size();
  };
  KillMidLoadAndRestart(daemon, config, dir, count, 300, clients);
  auto c = daemon->Client();
  size_t still_done = 0;
  for (const std::string& id : done) {
    auto r = c->Get(("/v1/work/" + id).c_str());
    REQUIRE(r);
    bool ok = r->status == 200 && Json::parse(r->body)["state"] == "done";
    CHECK_MESSAGE(ok, std::string(id + ": " + r->body));
    still_done += ok ? 1 : 0;
  }
  MESSAGE("completes answered 200 before the kill: ", done.size(), ", done after it: ", still_done);
  CHECK(still_done == done.size());
}

TEST_CASE("failures are retried until attempts run out, then a dead letter that replays") {
  Fixture f;
  Json claim = {{"kind", "send_invoice"}, {"identity", {{"invoice_id", "INV-9"}}}};
  Json c = J(f.Post("/v1/work/claim", claim));
  std::string id = c["work_id"];
  auto failed =
      f.Post("/v1/work/" + id + "/fail",
             {{"lease_token", c["lease_token"]}, {"error", "smtp 451"}, {"retry_after", 0}});
  CHECK(J(failed)["state"] == "failed");
  // The holder's retry of that fail (its answer lost) is answered, not refused.
  auto failed_again =
      f.Post("/v1/work/" + id + "/fail",
             {{"lease_token", c["lease_token"]}, {"error", "smtp 451"}, {"retry_after", 0}});
  CHECK(failed_again->status == 200);
  CHECK(J(failed_again)["state"] == "failed");
  CHECK(J(failed_again)["attempt"] == 1);
  Json c2 = J(f.Post("/v1/work/claim", claim));
  REQUIRE(c2["attempt"] == 2);
  auto dead = f.Post("/v1/work/" + id + "/fail",
                     {{"lease_token", c2["lease_token"]}, {"error", "smtp 550"}});
  CHECK(J(dead)["state"] == "dead");
  auto refused = f.Post("/v1/work/claim", claim);
  CHECK(refused->status == 409);
  CHECK(J(refused)["state"] == "dead");
  // One failed attempt to be tried again, one dead letter (the last
  // failure counts there, not in both).
  CHECK(MetricValue(*f.client, "idem_work_failed_total") == 1);
  CHECK(MetricValue(*f.client, "idem_work_dead_total") == 1);

  Json letters = J(f.client->Get("/v1/dead-letters"));
  REQUIRE(letters["items"].size() == 1);
  CHECK(letters["items"][0]["work_id"] == id);
  CHECK(letters["items"][0]["attempts"] == 2);
  CHECK(letters["items"][0]["last_error"] == "smtp 550");

  // Replay requires an Idempotency-Key (it changes state).
  CHECK(f.Post("/v1/dead-letters/" + id + "/replay", Json::object())->status == 400);
  auto replay = f.Post("/v1/dead-letters/" + id + "/replay", Json::object(), "\"replay-1\"");
  REQUIRE(replay->status == 202);
  CHECK(J(f.client->Get("/v1/dead-letters"))["items"].empty());
  auto revived = f.Post("/v1/work/claim", claim);
  CHECK(revived->status == 201);
}

TEST_CASE("the kind's duplicate response is honoured: conflict") {
  Fixture f;
  Json claim = {{"kind", "notify"}, {"identity", {{"chat_id", 5}, {"text", " hi "}}}};
  Json c = J(f.Post("/v1/work/claim", claim));
  REQUIRE(f.Post("/v1/work/" + c["work_id"].get<std::string>() + "/complete",
                 {{"lease_token", c["lease_token"]}})
              ->status == 200);
  // Trimmed strings are the same identity (R5).
  Json same = {{"kind", "notify"}, {"identity", {{"chat_id", 5}, {"text", "hi"}}}};
  auto dup = f.Post("/v1/work/claim", same);
  CHECK(dup->status == 409);
  CHECK(J(dup)["state"] == "done");
}

TEST_CASE(
    "a claim retried with its key after its grant ran out and the work was done is told the "
    "result, under conflict too; another caller's claim is still refused") {
  Fixture f;
  Json claim = {
      {"kind", "notify"}, {"identity", {{"chat_id", 6}, {"text", "hi"}}}, {"lease", "1s"}};
  auto first = f.Post("/v1/work/claim", claim, "\"claim-n6\"");
  REQUIRE(first);
  REQUIRE(first->status == 201);
  Json c = J(first);
  REQUIRE(f.Post("/v1/work/" + c["work_id"].get<std::string>() + "/complete",
                 {{"lease_token", c["lease_token"]}, {"result", {{"sent", 1}}}})
              ->status == 200);
  // The key replays "you hold it" only as long as the lease asked for.
  std::this_thread::sleep_for(std::chrono::milliseconds(1'200));
  auto again = f.Post("/v1/work/claim", claim, "\"claim-n6\"");
  REQUIRE(again);
  CHECK(again->get_header_value("Idempotent-Replayed") == "");
  CHECK_MESSAGE(again->status == 200, again->body);
  CHECK(J(again)["duplicate"] == true);
  CHECK(J(again)["result"] == Json{{"sent", 1}});
  CHECK(f.Post("/v1/work/claim", claim, "\"another-claim-n6\"")->status == 409);
  CHECK(f.Post("/v1/work/claim", claim)->status == 409);  // no key: another call
}

TEST_CASE("claims name a declared kind and carry every identity field") {
  Fixture f;
  auto unknown = f.Post("/v1/work/claim", {{"kind", "nope"}, {"identity", {{"a", 1}}}});
  CHECK(unknown->status == 404);
  CHECK(J(unknown)["pointer"] == "/kind");
  auto missing = f.Post("/v1/work/claim", {{"kind", "send_invoice"}, {"identity", {{"x", 1}}}});
  CHECK(missing->status == 400);
  CHECK(J(missing)["pointer"] == "/identity/invoice_id");
  auto bad_lease =
      f.Post("/v1/work/claim",
             {{"kind", "send_invoice"}, {"identity", {{"invoice_id", "a"}}}, {"lease", "forever"}});
  CHECK(bad_lease->status == 400);
  CHECK(J(bad_lease)["pointer"] == "/lease");
  // A run of a client-executed kind could only fail item by item: refused.
  auto run = f.client->Post(
      "/v1/runs", {{"Idempotency-Key", "\"run-x\""}},
      Json{{"run_id", "r-1"}, {"kind", "send_invoice"}, {"items", {{{"invoice_id", "a"}}}}}.dump(),
      "application/json");
  REQUIRE(run);
  CHECK(run->status == 409);
  CHECK(J(run)["pointer"] == "/kind");
  // A required member left out: the pointer names it (the body's schema).
  auto no_kind = f.Post("/v1/work/claim", {{"identity", {{"invoice_id", "a"}}}});
  CHECK(no_kind->status == 400);
  CHECK(J(no_kind)["pointer"] == "/kind");
  auto no_token = f.Post("/v1/work/x/complete", Json::object());
  CHECK(no_token->status == 400);
  CHECK(J(no_token)["pointer"] == "/lease_token");
}

TEST_CASE("a named lease keeps an overlapping cron run out until released or expired") {
  Fixture f;
  auto a = f.Post("/v1/leases/nightly-report", {{"holder", "run-1"}, {"ttl", "1s"}});
  CHECK(a->status == 201);
  std::string token1 = J(a)["token"];
  auto b = f.Post("/v1/leases/nightly-report", {{"holder", "run-2"}, {"ttl", "1s"}});
  CHECK(b->status == 409);
  CHECK(J(b)["holder"] == "run-1");
  CHECK_FALSE(J(b).contains("token"));
  auto renewed =
      f.Post("/v1/leases/nightly-report", {{"holder", "run-1"}, {"ttl", "1s"}, {"token", token1}});
  CHECK(renewed->status == 200);
  CHECK(J(renewed)["token"] == token1);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  auto c = f.Post("/v1/leases/nightly-report", {{"holder", "run-2"}, {"ttl", "5s"}});
  CHECK(c->status == 201);
  std::string token2 = J(c)["token"];
  CHECK(f.client->Delete("/v1/leases/nightly-report?holder=run-1&token=" + token1)->status == 409);
  auto released = f.client->Delete("/v1/leases/nightly-report?holder=run-2&token=" + token2);
  REQUIRE(released);
  CHECK(released->status == 200);
  CHECK_FALSE(J(released).contains("was_free"));  // held until this release
  // The same release sent again (its answer was lost): the lease is free,
  // which is what it asked for.
  auto again = f.client->Delete("/v1/leases/nightly-report?holder=run-2&token=" + token2);
  REQUIRE(again);
  CHECK(again->status == 200);
  CHECK(J(again)["was_free"] == true);
  CHECK(f.Post("/v1/leases/nightly-report", {{"holder", "run-3"}})->status == 201);
  // Once another holds it, an old token's release is refused.
  CHECK(f.client->Delete("/v1/leases/nightly-report?holder=run-2&token=" + token2)->status == 409);
  // A release after the lease lapsed (the run outlived its ttl, nobody took
  // it): released, and told it was free already.
  auto short_lease = f.Post("/v1/leases/hourly", {{"holder", "run-4"}, {"ttl", "1s"}});
  REQUIRE(short_lease->status == 201);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  auto late = f.client->Delete("/v1/leases/hourly?holder=run-4&token=" +
                               J(short_lease)["token"].get<std::string>());
  REQUIRE(late);
  CHECK(late->status == 200);
  CHECK(J(late)["was_free"] == true);
}

TEST_CASE(
    "a named lease's 409 held is not kept under the Idempotency-Key: the cron's retry with the "
    "same key acquires it once it is free") {
  Fixture f;
  auto a = f.Post("/v1/leases/weekly", {{"holder", "A"}, {"ttl", "10m"}});
  REQUIRE(a->status == 201);
  auto held = f.Post("/v1/leases/weekly", {{"holder", "B"}, {"ttl", "10m"}}, "\"b-try-1\"");
  REQUIRE(held);
  CHECK(held->status == 409);
  REQUIRE(f.client->Delete("/v1/leases/weekly?holder=A&token=" + J(a)["token"].get<std::string>())
              ->status == 200);
  auto retried = f.Post("/v1/leases/weekly", {{"holder", "B"}, {"ttl", "10m"}}, "\"b-try-1\"");
  REQUIRE(retried);
  CHECK(retried->status == 201);
  CHECK(retried->get_header_value("Idempotent-Replayed").empty());
  // Acquired, the answer is final: the same key replays it.
  auto replayed = f.Post("/v1/leases/weekly", {{"holder", "B"}, {"ttl", "10m"}}, "\"b-try-1\"");
  REQUIRE(replayed);
  CHECK(replayed->status == 201);
  CHECK(replayed->get_header_value("Idempotent-Replayed") == "true");
}

TEST_CASE(
    "a claim retried with its Idempotency-Key after its lease ran out and another finished the "
    "work gets the work as it is, not the old grant again") {
  Fixture f;
  const Json claim = {
      {"kind", "send_invoice"}, {"identity", {{"invoice_id", "INV-GRANT"}}}, {"lease", "1s"}};
  auto a = f.Post("/v1/work/claim", claim, "\"claim-a\"");  // A's answer is lost
  REQUIRE(a);
  REQUIRE(a->status == 201);
  // Within the lease, a retry with the key gets A's own grant back.
  auto again = f.Post("/v1/work/claim", claim, "\"claim-a\"");
  REQUIRE(again);
  CHECK(again->status == 201);
  CHECK(again->get_header_value("Idempotent-Replayed") == "true");
  CHECK(J(again)["lease_token"] == J(a)["lease_token"]);
  std::this_thread::sleep_for(std::chrono::milliseconds(1'300));
  auto b = f.Post("/v1/work/claim", claim, "\"claim-b\"");  // B takes it over and does it
  REQUIRE(b);
  REQUIRE(b->status == 201);
  CHECK(J(b)["attempt"] == 2);
  REQUIRE(f.Post("/v1/work/" + J(b)["work_id"].get<std::string>() + "/complete",
                 {{"lease_token", J(b)["lease_token"]}, {"result", {{"sent", true}}}})
              ->status == 200);
  auto late = f.Post("/v1/work/claim", claim, "\"claim-a\"");
  REQUIRE(late);
  CHECK_MESSAGE(late->status == 200, late->body);  // done: the original result, not "yours"
  CHECK(J(late)["duplicate"] == true);
  CHECK(J(late).value("lease_token", "") != J(a)["lease_token"].get<std::string>());
}

TEST_CASE(
    "a claim retried with its Idempotency-Key after its holder completed the work gets the work "
    "as it is, not a lease that ended") {
  Fixture f;
  const Json claim = {
      {"kind", "send_invoice"}, {"identity", {{"invoice_id", "INV-ENDED"}}}, {"lease", "30s"}};
  auto a = f.Post("/v1/work/claim", claim, "\"claim-ended\"");
  REQUIRE(a);
  REQUIRE(a->status == 201);
  REQUIRE(f.Post("/v1/work/" + J(a)["work_id"].get<std::string>() + "/complete",
                 {{"lease_token", J(a)["lease_token"]}, {"result", {{"sent", true}}}})
              ->status == 200);
  auto again = f.Post("/v1/work/claim", claim, "\"claim-ended\"");  // the key reused
  REQUIRE(again);
  CHECK_MESSAGE(again->status == 200, again->body);
  CHECK(J(again)["state"] == "done");
  CHECK(again->get_header_value("Idempotent-Replayed").empty());
}

TEST_CASE(
    "a named lease retried with its Idempotency-Key after it lapsed and another holder took it "
    "is held, not acquired again") {
  Fixture f;
  auto a = f.Post("/v1/leases/nightly-x", {{"holder", "host-a"}, {"ttl", "1s"}}, "\"acq-a\"");
  REQUIRE(a);
  REQUIRE(a->status == 201);
  std::this_thread::sleep_for(std::chrono::milliseconds(1'300));
  auto b = f.Post("/v1/leases/nightly-x", {{"holder", "host-b"}, {"ttl", "10m"}});
  REQUIRE(b);
  REQUIRE(b->status == 201);
  auto late = f.Post("/v1/leases/nightly-x", {{"holder", "host-a"}, {"ttl", "1s"}}, "\"acq-a\"");
  REQUIRE(late);
  CHECK_MESSAGE(late->status == 409, late->body);
  CHECK(J(late)["holder"] == "host-b");
}

TEST_CASE(
    "a caller's lease name is bounded printable text and none of the daemon's own, which would "
    "stall its decides or stop its outbox") {
  Fixture f;
  for (const std::string& name : std::vector<std::string>{
           "decide:0123abcd", "outbox:hook", "cost:flush", "idem.x", std::string(201, 'n'), "a%0Ab",
           "a%00b", "a%C3", "a%C2%9Bb", "a%C2%85b"}) {
    auto taken = f.Post("/v1/leases/" + name, {{"holder", "cron"}, {"ttl", "1m"}});
    REQUIRE(taken);
    CHECK_MESSAGE(taken->status == 400, name);
    CHECK(J(taken)["pointer"] == "path:name");
    auto released = f.client->Delete(("/v1/leases/" + name + "?holder=cron&token=t0123").c_str());
    REQUIRE(released);
    CHECK(released->status == 400);
  }
  CHECK(f.Post("/v1/leases/" + std::string(200, 'n'), {{"holder", "cron"}})->status == 201);
  CHECK(f.Post("/v1/leases/decided:nightly", {{"holder", "cron"}})->status == 201);
  CHECK(f.Post("/v1/leases/caf%C3%A9%C2%A0nightly", {{"holder", "cron"}})->status == 201);
  for (const std::string& holder : {std::string("a\0b", 3), std::string("a\x1b[2J"),
                                    std::string("a\xC2\x9B"
                                                "2J")}) {
    auto refused = f.Post("/v1/leases/held-by-control", {{"holder", holder}});
    REQUIRE(refused);
    CHECK(refused->status == 400);
    CHECK(J(refused)["pointer"] == "/holder");
  }
}

TEST_CASE("renewing or releasing a named lease needs its token, not only the holder's name") {
  Fixture f;
  auto a = f.Post("/v1/leases/digest", {{"holder", "cron"}, {"ttl", "1m"}});
  REQUIRE(a->status == 201);
  std::string token = J(a)["token"];
  // A second run that calls itself "cron" too neither renews nor releases it.
  auto renew = f.Post("/v1/leases/digest", {{"holder", "cron"}, {"ttl", "1m"}});
  CHECK(renew->status == 409);
  CHECK(J(renew)["pointer"] == "/token");
  auto wrong = f.Post("/v1/leases/digest",
                      {{"holder", "cron"}, {"ttl", "1m"}, {"token", "0123456789abcdef"}});
  CHECK(wrong->status == 409);
  auto no_token = f.client->Delete("/v1/leases/digest?holder=cron");
  CHECK(no_token->status == 400);
  CHECK(J(no_token)["pointer"] == "query:token");
  auto bad_token = f.client->Delete("/v1/leases/digest?holder=cron&token=0123456789abcdef");
  CHECK(bad_token->status == 409);
  CHECK(J(bad_token)["pointer"] == "query:token");
  // Still held: another holder is kept out.
  CHECK(f.Post("/v1/leases/digest", {{"holder", "other"}})->status == 409);
  CHECK(f.client->Delete("/v1/leases/digest?holder=cron&token=" + token)->status == 200);
  CHECK(f.Post("/v1/leases/digest", {{"holder", "other"}})->status == 201);
}

TEST_CASE("actions require an Idempotency-Key") {
  Fixture f;
  auto r = f.Post("/v1/actions/send_invoice", {{"args", {{"invoice_id", "1"}}}});
  REQUIRE(r);
  CHECK(r->status == 400);
  CHECK(J(r)["pointer"] == "header:Idempotency-Key");
  CHECK(MetricValue(*f.client, "idem_key_missing_total") == 1);
}

TEST_CASE("runs require an Idempotency-Key, since they execute effects") {
  Fixture f;
  auto r = f.Post("/v1/runs", {{"run_id", "r-1"},
                               {"kind", "send_invoice"},
                               {"items", Json::array({{{"invoice_id", "1"}}})}});
  REQUIRE(r);
  CHECK(r->status == 400);
  CHECK(J(r)["pointer"] == "header:Idempotency-Key");
}

TEST_CASE("a caller's run_id cannot take a plan's, whose run lists the plan's actions") {
  Fixture f;
  auto run = f.Post("/v1/runs",
                    {{"run_id", "plan_60c5"},
                     {"kind", "send_invoice"},
                     {"items", Json::array({{{"invoice_id", "1"}}})}},
                    "\"run-plan\"");
  REQUIRE(run);
  CHECK(run->status == 400);
  CHECK(J(run)["pointer"] == "/run_id");
  auto action = f.Post("/v1/actions/send_invoice",
                       {{"args", {{"invoice_id", "2"}}}, {"run_id", "plan_60c5"}}, "\"act-plan\"");
  REQUIRE(action);
  CHECK(action->status == 400);
  CHECK(J(action)["pointer"] == "/run_id");
  auto claim = f.Post(
      "/v1/work/claim",
      {{"kind", "send_invoice"}, {"identity", {{"invoice_id", "3"}}}, {"run_id", "plan_60c5"}});
  REQUIRE(claim);
  CHECK(claim->status == 400);
  CHECK(J(claim)["pointer"] == "/run_id");
  // Nothing was claimed under it; a run_id that merely contains plan_ is fine.
  CHECK(f.client->Get("/v1/runs/plan_60c5")->status == 404);
  auto own = f.Post("/v1/work/claim", {{"kind", "send_invoice"},
                                       {"identity", {{"invoice_id", "3"}}},
                                       {"run_id", "nightly-plan_60c5"}});
  REQUIRE(own);
  CHECK(own->status == 201);
}

TEST_CASE("a duration in seconds too large to scale is refused with its field, not wrapped") {
  Fixture f;
  // 2305843009213693960 s * 1000 wraps to 8000 ms in 64 bits.
  auto lease = f.Post("/v1/work/claim", {{"kind", "send_invoice"},
                                         {"identity", {{"invoice_id", "big"}}},
                                         {"lease", 2305843009213693960LL}});
  REQUIRE(lease);
  CHECK(lease->status == 400);
  CHECK(J(lease)["pointer"] == "/lease");
  auto huge = f.Post("/v1/work/claim", {{"kind", "send_invoice"},
                                        {"identity", {{"invoice_id", "big"}}},
                                        {"lease", 18446744073709551615ULL}});
  CHECK(huge->status == 400);
  auto as_text = f.Post("/v1/work/claim", {{"kind", "send_invoice"},
                                           {"identity", {{"invoice_id", "big"}}},
                                           {"lease", "9223372036854775807ms"}});
  CHECK(as_text->status == 400);
  CHECK(J(as_text)["pointer"] == "/lease");
  auto ttl = f.Post("/v1/leases/overflow", {{"holder", "h"}, {"ttl", 2305843009213693960LL}});
  CHECK(ttl->status == 400);
  CHECK(J(ttl)["pointer"] == "/ttl");
  Json c = J(
      f.Post("/v1/work/claim", {{"kind", "send_invoice"}, {"identity", {{"invoice_id", "big"}}}}));
  auto retry = f.Post(
      "/v1/work/" + c["work_id"].get<std::string>() + "/fail",
      {{"lease_token", c["lease_token"]}, {"error", "x"}, {"retry_after", 2305843009213693960LL}});
  CHECK(retry->status == 400);
  CHECK(J(retry)["pointer"] == "/retry_after");
}

TEST_CASE(
    "idem dlq replay sends a new key each time, so an item that died again is replayed again") {
  Fixture f;
  Json claim = {{"kind", "send_invoice"}, {"identity", {{"invoice_id", "INV-D"}}}};
  auto kill = [&] {  // two failed attempts: a dead letter
    for (int i = 0; i < 2; ++i) {
      Json c = J(f.Post("/v1/work/claim", claim));
      REQUIRE(c.contains("lease_token"));
      f.Post("/v1/work/" + c["work_id"].get<std::string>() + "/fail",
             {{"lease_token", c["lease_token"]}, {"error", "smtp 550"}, {"retry_after", 0}});
    }
    return J(f.Post("/v1/work/claim", claim))["work_id"].get<std::string>();
  };
  const std::string id = kill();
  REQUIRE(J(f.client->Get("/v1/dead-letters"))["items"].size() == 1);
  const std::string url = "http://127.0.0.1:" + std::to_string(f.daemon->port());
  CliResult first = RunCli({"--url", url, "dlq", "replay", id});
  CHECK_MESSAGE(first.exit_code == 0, first.err);
  CHECK(first.err.find("replay of " + id) != std::string::npos);
  CHECK(first.err.find("state pending") != std::string::npos);
  CHECK(J(f.client->Get("/v1/dead-letters"))["items"].empty());

  REQUIRE(kill() == id);  // it died again
  REQUIRE(J(f.client->Get("/v1/dead-letters"))["items"].size() == 1);
  CliResult second = RunCli({"--url", url, "dlq", "replay", id});
  CHECK_MESSAGE(second.exit_code == 0, second.err);
  CHECK(J(f.client->Get("/v1/dead-letters"))["items"].empty());  // replayed, not a no-op
  auto key_of = [](const std::string& err) {
    size_t at = err.find("Idempotency-Key ");
    return at == std::string::npos ? std::string()
                                   : err.substr(at + 16, err.find(')', at) - at - 16);
  };
  CHECK_FALSE(key_of(first.err).empty());
  CHECK(key_of(first.err) != key_of(second.err));
}

TEST_CASE("every name at /metrics has one idem_ prefix and _total exactly on counters") {
  Fixture f;
  auto res = f.client->Get("/metrics");
  REQUIRE(res);
  REQUIRE(res->status == 200);
  std::istringstream text(res->body);
  std::string line;
  int families = 0;
  while (std::getline(text, line)) {
    if (line.rfind("# TYPE ", 0) != 0) continue;
    std::istringstream fields(line.substr(7));
    std::string name, type;
    fields >> name >> type;
    CAPTURE(name);
    ++families;
    CHECK(name.rfind("idem_", 0) == 0);
    CHECK(name.find("idem_idem") == std::string::npos);
    bool total = name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0;
    CHECK(total == (type == "counter"));
    CHECK(name.find("_ms") == std::string::npos);  // base units: seconds
  }
  CHECK(families > 10);
  CHECK(res->body.find("idem_key_in_progress_seconds_count") != std::string::npos);
}

}  // namespace idem::testing

namespace idem::testing {

TEST_CASE("a claim whose identity holds an integer beyond 2^53 is a 400 naming the field") {
  Fixture f;
  // With and without an Idempotency-Key: without one the claim takes the
  // batch lane, which prepares the claim on its own path.
  Json claim = {{"kind", "send_invoice"},
                {"identity", {{"invoice_id", 9007199254740993ULL}}},
                {"lease", "30s"}};
  // Without an Idempotency-Key the claim takes the batch lane, which
  // prepares it on its own path; with one, the ordinary handler.
  for (const std::string key : {"", "\"big-1\""}) {
    CAPTURE(key);
    auto res = f.Post("/v1/work/claim", claim, key);
    REQUIRE(res);
    CHECK(res->status == 400);
    CHECK(res->get_header_value("Content-Type") == "application/problem+json");
    CHECK(J(res)["pointer"] == "/identity/invoice_id");
  }
  // As strings, the two ids are two pieces of work, not one.
  claim["identity"]["invoice_id"] = "9007199254740993";
  auto one = f.Post("/v1/work/claim", claim);
  REQUIRE(one);
  CHECK(one->status == 201);
  claim["identity"]["invoice_id"] = "9007199254740992";
  auto other = f.Post("/v1/work/claim", claim);
  REQUIRE(other);
  CHECK(other->status == 201);
  CHECK(J(one)["work_id"] != J(other)["work_id"]);
  // Past 64 bits a literal is refused too, however large: nlohmann reads
  // 1000000000000000000000001 and ...002 as one double, 1e24.
  for (const std::string key : {"", "\"big-2\""}) {
    CAPTURE(key);
    httplib::Headers headers;
    if (!key.empty()) headers.emplace("Idempotency-Key", key);
    auto huge = f.client->Post(
        "/v1/work/claim", headers,
        R"({"kind":"send_invoice","identity":{"invoice_id":1000000000000000000000001}})",
        "application/json");
    REQUIRE(huge);
    CHECK(huge->status == 400);
    CHECK(J(huge)["pointer"] == "/identity/invoice_id");
  }
}

TEST_CASE(
    "a claim whose args hold a non-object where an identity field goes is a 400 naming it, on "
    "either lane, never a 500") {
  Fixture f;
  int n = 0;
  for (const Json& order : {Json(5), Json("str"), Json::array({1}), Json(true)}) {
    ++n;
    for (const std::string& key : {std::string(), "\"nested-" + std::to_string(n) + "\""}) {
      CAPTURE(key);
      Json claim = {{"kind", "ship_order"},
                    {"identity", {{"order", {{"id", "O-1"}}}}},
                    {"args", {{"order", order}}}};
      auto res = f.Post("/v1/work/claim", claim, key);
      REQUIRE(res);
      CHECK(res->status == 400);
      CHECK(J(res)["pointer"] == "/args/order/id");
    }
  }
  Json fine = {{"kind", "ship_order"},
               {"identity", {{"order", {{"id", "O-1"}}}}},
               {"args", {{"order", {{"note", "x"}}}}}};
  auto claimed = f.Post("/v1/work/claim", fine);
  REQUIRE(claimed);
  CHECK(claimed->status == 201);
}

TEST_CASE("work answers are written as text with members in name order, and replay as objects") {
  Fixture f;
  // Claims and completes write their answers as text (no Json value built):
  // the bytes must be what dumping the object gives, members in name order.
  auto canonical = [](const httplib::Result& r) {
    REQUIRE(r);
    CHECK(r->get_header_value("Content-Type") == "application/json");
    Json j = Json::parse(r->body, nullptr, false);
    REQUIRE(j.is_object());
    CHECK(r->body == j.dump());
    return j;
  };
  Json claim = {{"kind", "send_invoice"},
                {"identity", {{"invoice_id", "INV-text"}}},
                {"lease", "30s"},
                {"run_id", "run-9"}};
  auto claimed = f.Post("/v1/work/claim", claim);
  REQUIRE(claimed->status == 201);
  Json c = canonical(claimed);
  CHECK(c["state"] == "running");
  CHECK(c["run_id"] == "run-9");
  CHECK(c.contains("locked_until_ms"));
  const std::string id = c["work_id"];
  auto done = f.Post("/v1/work/" + id + "/complete",
                     {{"lease_token", c["lease_token"]},
                      {"result", {{"sent", true}, {"note", "line\n\"two\""}}},
                      {"external_ref", "in_9"}});
  REQUIRE(done->status == 200);
  Json d = canonical(done);
  CHECK(d["result"]["note"] == "line\n\"two\"");
  CHECK(d["external_ref"] == "in_9");
  CHECK_FALSE(d.contains("lease_token"));
  Json dup = canonical(f.Post("/v1/work/claim", claim));
  CHECK(dup["duplicate"] == true);
  CHECK(dup["result"] == d["result"]);

  // Under an Idempotency-Key the answer is stored, and a retry gets the
  // same object back, not that text quoted as one JSON string.
  claim["identity"]["invoice_id"] = "INV-text-2";
  auto first = f.Post("/v1/work/claim", claim, "text-key-1");
  REQUIRE(first->status == 201);
  canonical(first);
  auto again = f.Post("/v1/work/claim", claim, "text-key-1");
  REQUIRE(again->status == 201);
  CHECK(again->body == first->body);
  CHECK(canonical(again)["work_id"].is_string());
}

TEST_CASE("idem key --step prints the v2 material with step and prompt hash") {
  TempDir dir;
  std::string config = WriteTestConfig(dir, kQuestionRules, kActions);
  CliResult r = RunCli({"key", "--config", config, "--step", "triage_ticket"},
                       R"({"ticket_id":42,"text":"refund please"})");
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  CHECK(r.out.find("decision_key ") == 0);
  CHECK(r.out.find(R"("step":"triage_ticket")") != std::string::npos);
  CHECK(r.out.find(R"("prompt_hash":")") != std::string::npos);
  CHECK(r.out.find(R"("v":2})") != std::string::npos);
  CliResult big = RunCli({"key", "--config", config, "--kind", "send_invoice"},
                         R"({"invoice_id":9007199254740993})");
  CHECK(big.exit_code != 0);
  CHECK(big.err.find("/args/invoice_id") != std::string::npos);
}

}  // namespace idem::testing
