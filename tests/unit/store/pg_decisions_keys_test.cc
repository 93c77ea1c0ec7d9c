// Several daemons on one PostgreSQL schema: decisions, Idempotency-Keys and
// named leases keep their guarantees across processes. Two OpenStore calls
// on one TempDir are two daemons (two pools, two instance ids, one schema).
// Suite "postgres": run only by ctest unit_store_postgres (on a real server).
#include <doctest/doctest.h>

#include <atomic>
#include <functional>
#include <latch>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "daemon/core/mutex.h"
#include "daemon/store/postgres/pg_store.h"
#include "daemon/store/store.h"
#include "tests/unit/store/store_test_util.h"

namespace idem {
namespace {

using testing::MakeDecision;
using testing::OpenStore;
using testing::TempDir;

constexpr int64_t kT0 = 1'700'000'000'000;
constexpr int64_t kTtl = 24 * 3600 * 1000;
constexpr int64_t kLease = 30'000;
constexpr int kPerDaemon = 8;  // threads per daemon in the races below

// The schema behind a test folder, read directly (what every daemon sees).
std::unique_ptr<pg::Pool> RawPool(const std::string& path) {
  auto pool = pg::Pool::Open(pg::PoolOptions{testing::PgConninfo(), testing::PgSchemaFor(path), 1});
  REQUIRE_MESSAGE(pool.ok(), pool.status().ToString());
  return std::move(pool).value();
}

int64_t Count(pg::Pool& pool, const std::string& sql, const std::vector<pg::Param>& params = {}) {
  auto r = pool.Exec(sql, params);
  REQUIRE_MESSAGE(r.ok(), r.status().ToString());
  return r->i64(0, 0);
}

// Runs fn(daemon, thread) on kPerDaemon threads for each of `daemons`,
// released together.
void Race(std::vector<std::unique_ptr<Store>>& daemons,
          const std::function<void(Store&, int)>& fn) {
  const int n = static_cast<int>(daemons.size()) * kPerDaemon;
  std::latch start(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      fn(*daemons[i % daemons.size()], i);
    });
  }
  for (std::thread& t : threads) t.join();
}

std::vector<std::unique_ptr<Store>> TwoDaemons(const std::string& path) {
  std::vector<std::unique_ptr<Store>> d;
  d.push_back(OpenStore(path));
  d.push_back(OpenStore(path));
  return d;
}

TEST_SUITE("postgres") {
  TEST_CASE("two daemons beginning one Idempotency-Key at once: exactly one runs it") {
    TempDir dir;
    auto daemons = TwoDaemons(dir.path());
    for (int round = 0; round < 10; ++round) {
      const std::string key = "storm-" + std::to_string(round);
      std::atomic<int> fresh{0}, in_flight{0}, other{0};
      std::atomic<int> winner{-1};
      Race(daemons, [&](Store& s, int i) {
        StatusOr<BeginResult> r = s.idem_keys().Begin(
            "tok:POST /v1/apply", key, "fp", "req-" + std::to_string(i), kT0, kTtl, kLease);
        if (!r.ok()) {
          MESSAGE(r.status().ToString());
          ++other;
        } else if (r->outcome == BeginOutcome::kNew) {
          ++fresh;
          winner = i;
        } else if (r->outcome == BeginOutcome::kInFlight) {
          ++in_flight;
        } else {
          ++other;
        }
      });
      REQUIRE(fresh.load() == 1);
      CHECK(in_flight.load() == 2 * kPerDaemon - 1);
      CHECK(other.load() == 0);
      // The winner's daemon holds it: only it may extend the lease.
      const int w = winner.load();
      const std::string rid = "req-" + std::to_string(w);
      CHECK(daemons[w % 2]
                ->idem_keys()
                .ExtendLease("tok:POST /v1/apply", key, "fp", rid, kT0 + 1, kLease)
                .ok());
      CHECK(daemons[(w + 1) % 2]
                ->idem_keys()
                .ExtendLease("tok:POST /v1/apply", key, "fp", rid, kT0 + 1, kLease)
                .code() == Code::kFailedPrecondition);
    }
  }

  TEST_CASE("two daemons taking over one expired key lease at once: exactly one runs it") {
    TempDir dir;
    auto daemons = TwoDaemons(dir.path());
    REQUIRE(daemons[0]->idem_keys().Begin("s", "k", "fp", "req-dead", kT0, kTtl, kLease)->outcome ==
            BeginOutcome::kNew);
    std::atomic<int> fresh{0}, in_flight{0};
    Race(daemons, [&](Store& s, int) {
      StatusOr<BeginResult> r =
          s.idem_keys().Begin("s", "k", "fp", "req", kT0 + kLease, kTtl, kLease);
      CHECK_MESSAGE(r.ok(), r.status().ToString());  // CHECK: a thread must not throw
      if (!r.ok()) return;
      if (r->outcome == BeginOutcome::kNew) ++fresh;
      if (r->outcome == BeginOutcome::kInFlight) ++in_flight;
    });
    CHECK(fresh.load() == 1);
    CHECK(in_flight.load() == 2 * kPerDaemon - 1);
  }

  TEST_CASE("a dead daemon's keys stay in flight until their lease ends, then another runs them") {
    TempDir dir;
    const std::string scope = "tok:POST /v1/apply";
    {
      auto dead = OpenStore(dir.path());
      REQUIRE(dead->idem_keys().Begin(scope, "k", "fp-a", "req-1", kT0, kTtl, kLease)->outcome ==
              BeginOutcome::kNew);
    }  // killed with the key in progress
    auto alive = OpenStore(dir.path());
    // A new daemon is a new instance: it releases nothing of the dead one.
    StatusOr<size_t> released = alive->idem_keys().ReleaseOwnInProgress();
    REQUIRE(released.ok());
    CHECK(*released == 0);
    CHECK(alive->idem_keys().Get(scope, "k")->state == IdemRecord::State::kInProgress);
    CHECK(alive->idem_keys().ExtendLease(scope, "k", "fp-a", "req-1", kT0 + 1, kLease).code() ==
          Code::kFailedPrecondition);
    CHECK(alive->idem_keys()
              .Begin(scope, "k", "fp-a", "req-2", kT0 + kLease - 1, kTtl, kLease)
              ->outcome == BeginOutcome::kInFlight);
    StatusOr<BeginResult> taken =
        alive->idem_keys().Begin(scope, "k", "fp-a", "req-2", kT0 + kLease, kTtl, kLease);
    REQUIRE(taken.ok());
    CHECK(taken->outcome == BeginOutcome::kNew);
    CHECK(taken->record.request_id == "req-2");
    CHECK(alive->idem_keys().ExtendLease(scope, "k", "fp-a", "req-2", kT0 + kLease, kLease).ok());
  }

  TEST_CASE("ReleaseOwnInProgress releases this daemon's keys and leaves another daemon's") {
    TempDir dir;
    const std::string scope = "tok:POST /v1/apply";
    auto daemons = TwoDaemons(dir.path());
    IdemKeyStore& a = daemons[0]->idem_keys();
    IdemKeyStore& b = daemons[1]->idem_keys();
    REQUIRE(a.Begin(scope, "mine", "fp", "r1", kT0, kTtl, kLease).ok());
    REQUIRE(b.Begin(scope, "theirs", "fp", "r2", kT0, kTtl, kLease).ok());
    REQUIRE(b.Begin(scope, "done", "fp", "r3", kT0, kTtl, kLease).ok());
    REQUIRE(b.Finish(scope, "done", "fp", 200, "{}", "application/json", kT0).ok());
    StatusOr<size_t> released = a.ReleaseOwnInProgress();
    REQUIRE(released.ok());
    CHECK(*released == 1);
    CHECK(a.Get(scope, "mine")->state == IdemRecord::State::kReleased);
    CHECK(a.Get(scope, "theirs")->state == IdemRecord::State::kInProgress);
    CHECK(a.Get(scope, "done")->state == IdemRecord::State::kCompleted);
    CHECK(b.Begin(scope, "theirs", "fp", "r4", kT0 + 1, kTtl, kLease)->outcome ==
          BeginOutcome::kInFlight);
    CHECK(b.Begin(scope, "mine", "fp", "r5", kT0 + 1, kTtl, kLease)->outcome == BeginOutcome::kNew);
  }

  TEST_CASE("two daemons storing one decision_key at once store one decision and both get it") {
    TempDir dir;
    auto daemons = TwoDaemons(dir.path());
    auto raw = RawPool(dir.path());
    for (int round = 0; round < 10; ++round) {
      const std::string key = "key-" + std::to_string(round);
      Mutex mu;
      std::set<std::string> returned;
      std::atomic<int> errors{0};
      std::atomic<int> stored_by{0};  // calls that say they wrote theirs
      Race(daemons, [&](Store& s, int i) {
        bool stored = false;
        StatusOr<Decision> got = s.decisions().PutIfAbsent(
            MakeDecision("dec_" + std::to_string(round) + "_" + std::to_string(i), key, kT0), kT0,
            &stored);
        if (!got.ok()) {
          MESSAGE(got.status().ToString());
          ++errors;
          return;
        }
        stored_by += stored;
        MutexLock lock(mu);
        returned.insert(got->decision_id);
      });
      CHECK(errors.load() == 0);
      CHECK(stored_by.load() == 1);
      REQUIRE(returned.size() == 1);
      const std::string id = *returned.begin();
      for (auto& d : daemons) CHECK(d->decisions().GetByKey(key, kT0 + 1)->decision_id == id);
      CHECK(Count(*raw, "SELECT count(*) FROM decisions WHERE decision_key = $1", {pg::P(key)}) ==
            1);
      // One event, of the decision that was stored.
      CHECK(Count(*raw, "SELECT count(*) FROM outbox WHERE type = 'decision.created' AND key = $1",
                  {pg::P(id)}) == 1);
    }
    CHECK(Count(*raw, "SELECT count(*) FROM outbox") == 10);
  }

  TEST_CASE("a stored decision's outbox event commits with it: created, then updated") {
    TempDir dir;
    auto store = OpenStore(dir.path());
    auto raw = RawPool(dir.path());
    DecisionStore& s = store->decisions();
    REQUIRE(s.PutIfAbsent(MakeDecision("dec_1", "key-a", kT0), kT0).ok());
    REQUIRE(s.PutIfAbsent(MakeDecision("dec_2", "key-a", kT0 + 1), kT0 + 1).ok());  // not stored
    REQUIRE(s.Replace(MakeDecision("dec_3", "key-a", kT0 + 2)).ok());
    REQUIRE(s.Replace(MakeDecision("dec_3", "key-a", kT0 + 3)).ok());  // the same id again
    auto events = raw->Exec("SELECT type, key, data->>'decision_key' FROM outbox ORDER BY id");
    REQUIRE(events.ok());
    REQUIRE(events->rows() == 3);
    CHECK(events->str(0, 0) == "decision.created");
    CHECK(events->str(0, 1) == "dec_1");
    CHECK(events->str(0, 2) == "key-a");
    CHECK(events->str(1, 0) == "decision.created");
    CHECK(events->str(1, 1) == "dec_3");
    CHECK(events->str(2, 0) == "decision.updated");
    CHECK(events->str(2, 1) == "dec_3");
    CHECK(s.Get("dec_3")->created_at_ms == kT0 + 3);
    CHECK(s.List("", "", "", 10)->items.size() == 2);  // dec_1 and dec_3, once each
  }

  TEST_CASE("two daemons sweeping expired decisions at once delete each one once") {
    TempDir dir;
    auto daemons = TwoDaemons(dir.path());
    constexpr int kDecisions = 60;
    for (int i = 0; i < kDecisions; ++i) {
      REQUIRE(daemons[0]
                  ->decisions()
                  .PutIfAbsent(MakeDecision("dec_" + std::to_string(i), "key-" + std::to_string(i),
                                            kT0, kT0 + 10),
                               kT0)
                  .ok());
    }
    REQUIRE(
        daemons[0]->decisions().PutIfAbsent(MakeDecision("dec_keep", "key-keep", kT0), kT0).ok());
    std::atomic<int> swept{0};
    Race(daemons, [&](Store& s, int) {
      for (int n = 0; n < 100; ++n) {
        StatusOr<size_t> r = s.decisions().SweepExpired(kT0 + 10, 3);
        CHECK_MESSAGE(r.ok(), r.status().ToString());
        if (!r.ok()) return;
        swept += static_cast<int>(*r);
        if (*r == 0) std::this_thread::yield();
      }
    });
    CHECK(swept.load() == kDecisions);
    auto raw = RawPool(dir.path());
    CHECK(Count(*raw, "SELECT count(*) FROM decisions") == 1);
    CHECK(Count(*raw, "SELECT count(*) FROM decision_keys") == 1);
    // The swept keys are free for new decisions, from either daemon.
    CHECK(daemons[1]
              ->decisions()
              .PutIfAbsent(MakeDecision("dec_new", "key-7", kT0 + 11), kT0 + 11)
              ->decision_id == "dec_new");
  }

  TEST_CASE("two daemons acquiring one named lease at once: one holder") {
    TempDir dir;
    auto daemons = TwoDaemons(dir.path());
    for (int round = 0; round < 10; ++round) {
      const std::string name = "cron:digest-" + std::to_string(round);
      std::atomic<int> acquired{0}, held{0}, other{0};
      Mutex mu;
      std::set<std::string> holders_seen;
      std::string winner;
      Race(daemons, [&](Store& s, int i) {
        const std::string holder = "run-" + std::to_string(i);
        StatusOr<LeaseResult> r = s.leases().Acquire(name, holder, "", 60'000, kT0);
        if (!r.ok()) {
          MESSAGE(r.status().ToString());
          ++other;
          return;
        }
        MutexLock lock(mu);
        if (r->outcome == LeaseOutcome::kAcquired) {
          ++acquired;
          winner = holder;
        } else if (r->outcome == LeaseOutcome::kHeld) {
          ++held;
          holders_seen.insert(r->lease.holder);
        } else {
          ++other;
        }
      });
      REQUIRE(acquired.load() == 1);
      CHECK(held.load() == 2 * kPerDaemon - 1);
      CHECK(other.load() == 0);
      CHECK(holders_seen == std::set<std::string>{winner});
      for (auto& d : daemons) CHECK(d->leases().Get(name, kT0 + 1)->holder == winner);
    }
  }

  TEST_CASE("a lease renewed on one daemon is renewed for all, and released only with its token") {
    TempDir dir;
    auto daemons = TwoDaemons(dir.path());
    LeaseStore& a = daemons[0]->leases();
    LeaseStore& b = daemons[1]->leases();
    StatusOr<LeaseResult> got = a.Acquire("cron:x", "run-1", "", 1'000, kT0);
    REQUIRE(got.ok());
    const std::string token = got->lease.token;
    // The holder may renew through any daemon: the token is what counts.
    StatusOr<LeaseResult> renewed = b.Acquire("cron:x", "run-1", token, 1'000, kT0 + 900);
    REQUIRE(renewed.ok());
    CHECK(renewed->outcome == LeaseOutcome::kRenewed);
    CHECK(a.Get("cron:x", kT0 + 1'899)->expires_at_ms == kT0 + 1'900);
    CHECK(a.Acquire("cron:x", "run-2", "", 1'000, kT0 + 1'000)->outcome == LeaseOutcome::kHeld);
    CHECK(b.Release("cron:x", "run-1", "0123456789abcdef").field() == "/token");
    CHECK(b.Release("cron:x", "run-1", token).ok());
    CHECK(a.Acquire("cron:x", "run-2", "", 1'000, kT0 + 1'001)->outcome == LeaseOutcome::kAcquired);
  }

  TEST_CASE("a cache hit does not read the trace column, a read by id does") {
    TempDir dir;
    auto store = OpenStore(dir.path());
    Decision d;
    d.decision_id = "dec_1";
    d.decision_key = "key-a";
    d.step = "triage";
    d.output = Json{{"label", "x"}};
    d.trace = Json{{"attempts", Json::array({Json{{"raw", "{}"}}})}, {"cost_usd", 0.5}};
    REQUIRE(store->decisions().PutIfAbsent(d, kT0).ok());
    auto raw = RawPool(dir.path());
    CHECK(Count(*raw, "SELECT count(*) FROM decisions WHERE trace IS NOT NULL") == 1);
    REQUIRE(raw->Exec("UPDATE decisions SET trace = 'not json'").ok());
    StatusOr<Decision> hit = store->decisions().GetByKey("key-a", kT0);
    REQUIRE_MESSAGE(hit.ok(), hit.status().ToString());
    CHECK(hit->trace == Json{{"cost_usd", 0.5}});
    CHECK(store->decisions().Get("dec_1").status().code() == Code::kInternal);
  }
}

}  // namespace
}  // namespace idem
