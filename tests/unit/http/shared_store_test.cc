// What a daemon does differently on a store shared by several daemons
// (postgres): its clock follows the store's clock (AnchoredClock), and
// decisions it has seen stay readable while the store is unreachable
// (WithDecisionFallback). A RocksDB store stands in for the database, with
// the shared clock and the outage staged around it.
#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>

#include "daemon/core/env.h"
#include "daemon/core/failpoints.h"
#include "daemon/http/daemon.h"
#include "daemon/http/decision_fallback.h"

namespace idem {
namespace {

namespace fs = std::filesystem;

struct TempStore {
  fs::path path;
  std::unique_ptr<Store> rocks;
  TempStore() {
    static std::atomic<int> counter{0};
    path = fs::temp_directory_path() / ("idem_shared_store_test_" + std::to_string(::getpid()) +
                                        "_" + std::to_string(counter++));
    fs::remove_all(path);
    StoreOptions o;
    o.path = path.string();
    o.sync = false;
    auto s = OpenRocksStore(o);
    REQUIRE(s.ok());
    rocks = std::move(s).value();
  }
  ~TempStore() {
    rocks.reset();
    fs::remove_all(path);
  }
};

// Decisions that fail with Unavailable while `down` is set.
class FlakyDecisions final : public DecisionStore {
 public:
  explicit FlakyDecisions(DecisionStore& inner) : inner_(inner) {}
  std::atomic<bool> down{false};
  StatusOr<Decision> GetByKey(const std::string& key, int64_t now_ms) override {
    if (down) return Unavailable("database unreachable");
    return inner_.GetByKey(key, now_ms);
  }
  StatusOr<Decision> Get(const std::string& id) override {
    if (down) return Unavailable("database unreachable");
    return inner_.Get(id);
  }
  StatusOr<Decision> PutIfAbsent(const Decision& d, int64_t now_ms,
                                 bool* stored = nullptr) override {
    if (down) return Unavailable("database unreachable");
    return inner_.PutIfAbsent(d, now_ms, stored);
  }
  Status Replace(const Decision& d) override {
    if (down) return Unavailable("database unreachable");
    return inner_.Replace(d);
  }
  StatusOr<DecisionPage> List(const std::string& step, const std::string& status,
                              const std::string& cursor, size_t limit) override {
    if (down) return Unavailable("database unreachable");
    return inner_.List(step, status, cursor, limit);
  }
  StatusOr<size_t> SweepExpired(int64_t now_ms, size_t limit,
                                std::vector<std::string>* swept_ids) override {
    if (down) return Unavailable("database unreachable");
    return inner_.SweepExpired(now_ms, limit, swept_ids);
  }

 private:
  DecisionStore& inner_;
};

// The RocksDB store with a clock of its own and flaky decisions.
class SharedStore final : public Store {
 public:
  SharedStore(Store& inner, StatusOr<int64_t> clock)
      : inner_(inner), clock_(std::move(clock)), decisions_(inner.decisions()) {}
  FlakyDecisions& flaky() { return decisions_; }
  DecisionStore& decisions() override { return decisions_; }
  IdemKeyStore& idem_keys() override { return inner_.idem_keys(); }
  Journal& journal() override { return inner_.journal(); }
  PlanStore& plans() override { return inner_.plans(); }
  AuditLog& audit() override { return inner_.audit(); }
  LeaseStore& leases() override { return inner_.leases(); }
  MetaStore& meta() override { return inner_.meta(); }
  EscalationStore& escalations() override { return inner_.escalations(); }
  OutboxStore& outbox() override { return inner_.outbox(); }
  TraceIndex& traces() override { return inner_.traces(); }
  StatusOr<int64_t> ClockMillis() override { return clock_; }

 private:
  Store& inner_;
  StatusOr<int64_t> clock_;
  FlakyDecisions decisions_;
};

Decision MakeDecision(const std::string& id, const std::string& key, int64_t expires_at_ms) {
  Decision d;
  d.decision_id = id;
  d.decision_key = key;
  d.step = "triage";
  d.output = {{"category", "question"}};
  d.material = {{"step", "triage"}};
  d.created_at_ms = 1'000;
  d.expires_at_ms = expires_at_ms;
  return d;
}

}  // namespace

TEST_CASE("the_daemon_clock_follows_the_database_clock_not_a_skewed_local_clock") {
  TempStore t;
  FakeEnv env(1'700'000'000'000);
  // The database is 5 minutes behind this host.
  SharedStore shared(*t.rocks, int64_t{1'700'000'000'000 - 300'000});
  REQUIRE(Failpoints::Set("clock.local_plus_1h=error").ok());
  auto clock = AnchoredClock(env, shared);
  Failpoints::Clear();
  REQUIRE(clock.ok());
  CHECK((*clock)->NowMillis() == 1'700'000'000'000 - 300'000);
  env.Advance(1'500);
  CHECK((*clock)->NowMillis() == 1'700'000'000'000 - 300'000 + 1'500);
}

TEST_CASE("an_embedded_store_keeps_the_local_clock_and_the_skew_failpoint_moves_it") {
  TempStore t;
  FakeEnv env(1'700'000'000'000);
  auto plain = AnchoredClock(env, *t.rocks);
  REQUIRE(plain.ok());
  CHECK((*plain)->NowMillis() == 1'700'000'000'000);
  REQUIRE(Failpoints::Set("clock.local_plus_1h=error").ok());
  auto skewed = AnchoredClock(env, *t.rocks);
  Failpoints::Clear();
  REQUIRE(skewed.ok());
  CHECK((*skewed)->NowMillis() == 1'700'000'000'000 + 3'600'000);
}

TEST_CASE("a_database_that_cannot_tell_its_time_stops_the_start_up") {
  TempStore t;
  FakeEnv env;
  SharedStore shared(*t.rocks, Unavailable("connection refused"));
  auto clock = AnchoredClock(env, shared);
  REQUIRE_FALSE(clock.ok());
  CHECK(clock.status().code() == Code::kUnavailable);
}

TEST_CASE("seen_decisions_are_answered_while_the_database_is_unreachable_and_nothing_else") {
  TempStore t;
  auto owned = std::make_unique<SharedStore>(*t.rocks, NotFound("none"));
  SharedStore& shared = *owned;
  std::unique_ptr<Store> store = WithDecisionFallback(std::move(owned), 2);
  DecisionStore& decisions = store->decisions();
  REQUIRE(decisions.PutIfAbsent(MakeDecision("dec_a", "key_a", 0), 1'000).ok());
  REQUIRE(decisions.PutIfAbsent(MakeDecision("dec_b", "key_b", 5'000), 1'000).ok());
  REQUIRE(t.rocks->decisions().PutIfAbsent(MakeDecision("dec_c", "key_c", 0), 1'000).ok());

  shared.flaky().down = true;
  auto a = decisions.GetByKey("key_a", 2'000);
  REQUIRE(a.ok());
  CHECK(a->decision_id == "dec_a");
  CHECK(decisions.Get("dec_a").ok());
  // Expired by now: not answered from memory either.
  auto b = decisions.GetByKey("key_b", 6'000);
  CHECK(b.status().code() == Code::kUnavailable);
  // Never seen by this daemon: unavailable, not "not found".
  CHECK(decisions.GetByKey("key_c", 2'000).status().code() == Code::kUnavailable);
  CHECK(decisions.Get("dec_c").status().code() == Code::kUnavailable);
  // Writes and lists fail as the database does.
  CHECK(decisions.PutIfAbsent(MakeDecision("dec_d", "key_d", 0), 2'000).status().code() ==
        Code::kUnavailable);
  CHECK(decisions.List("", "", "", 10).status().code() == Code::kUnavailable);
}

TEST_CASE("the_decision_memory_keeps_only_the_most_recently_used") {
  TempStore t;
  auto owned = std::make_unique<SharedStore>(*t.rocks, NotFound("none"));
  SharedStore& shared = *owned;
  std::unique_ptr<Store> store = WithDecisionFallback(std::move(owned), 2);
  DecisionStore& decisions = store->decisions();
  for (const char* n : {"1", "2", "3"}) {
    REQUIRE(
        decisions
            .PutIfAbsent(MakeDecision(std::string("dec_") + n, std::string("key_") + n, 0), 1'000)
            .ok());
  }
  shared.flaky().down = true;
  CHECK(decisions.GetByKey("key_1", 2'000).status().code() == Code::kUnavailable);
  CHECK(decisions.GetByKey("key_2", 2'000).ok());
  CHECK(decisions.GetByKey("key_3", 2'000).ok());
}

}  // namespace idem
