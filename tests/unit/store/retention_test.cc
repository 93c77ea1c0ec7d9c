// SweepRetention: one pass of the daemon's sweeper over the store.
#include "daemon/store/retention.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "daemon/core/mutex.h"
#include "daemon/store/rocksdb/rocksdb_database.h"
#include "daemon/store/store.h"
#include "tests/unit/store/store_test_util.h"

namespace idem {
namespace {

using testing::OpenStore;
using testing::TempDir;

constexpr int64_t kT0 = 1'700'000'000'000;

Decision Expiring(int i, int64_t expires_at_ms) {
  return testing::MakeDecision("dec_" + std::to_string(i), "key-" + std::to_string(i), kT0,
                               expires_at_ms);
}

// `decisions` decisions and `leases` named leases, all over at kT0 + 1,000,
// and one decision that lives on.
void Fill(Store& store, int decisions, int leases) {
  for (int i = 0; i < decisions; ++i) {
    REQUIRE(store.decisions().PutIfAbsent(Expiring(i, kT0 + 1'000), kT0).ok());
  }
  REQUIRE(store.decisions().PutIfAbsent(Expiring(-1, kT0 + 3'600'000), kT0).ok());
  for (int i = 0; i < leases; ++i) {
    char name[16];
    std::snprintf(name, sizeof name, "n%05d", i);
    REQUIRE(store.leases().Acquire(name, "cron", "", 1'000, kT0).ok());
  }
}

RetentionPass PassAt(int64_t now_ms, size_t page) {
  RetentionPass pass;
  pass.now_ms = now_ms;
  pass.finished_cutoff_ms = now_ms - 30LL * 24 * 3600 * 1000;
  pass.page = page;
  return pass;
}

// A plan of `decision_id` in `state`, created and last changed at kT0.
Plan PlanAt(const std::string& plan_id, const std::string& decision_id, const char* state) {
  Plan p;
  p.plan_id = plan_id;
  p.decision_id = decision_id;
  p.state = state;
  p.actions = Json::array({Json{{"kind", "send_reply"}}});
  p.created_at_ms = kT0;
  p.updated_at_ms = kT0;
  return p;
}

TEST_CASE("one_sweep_pass_deletes_a_backlog_of_many_pages_in_every_family") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  // 3.5 pages of decisions; 25 pages of leases.
  Fill(*store, 350, 2'500);
  const RetentionCounts swept = SweepRetention(*store, PassAt(kT0 + 1'000, 100));
  CHECK(swept.first_error.ok());
  CHECK(swept.decisions == 350);
  CHECK(swept.leases == 2'500);
  CHECK_FALSE(swept.behind);
  CHECK(swept.rounds >= 4);
  CHECK(store->decisions().GetByKey("key-0", kT0 + 1'000).status().code() == Code::kNotFound);
  CHECK(store->decisions().GetByKey("key-349", kT0 + 1'000).status().code() == Code::kNotFound);
  CHECK(store->decisions().GetByKey("key--1", kT0 + 1'000).ok());  // not over: kept
  CHECK(SweepRetention(*store, PassAt(kT0 + 1'000, 100)).total() == 0);
}

TEST_CASE(
    "a_sweep_pass_out_of_time_takes_one_page_a_family_says_it_is_behind_and_the_next_goes_on") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  Fill(*store, 350, 0);
  RetentionPass pass = PassAt(kT0 + 1'000, 100);
  int64_t clock = 0;
  pass.monotonic_ms = [&clock] { return clock += 1'000; };  // each look: a second later
  pass.budget_ms = 500;
  const RetentionCounts first = SweepRetention(*store, pass);
  CHECK(first.rounds == 1);
  CHECK(first.decisions == 100);
  CHECK(first.behind);
  pass.monotonic_ms = nullptr;  // no budget: to the end
  const RetentionCounts rest = SweepRetention(*store, pass);
  CHECK(rest.decisions == 250);
  CHECK_FALSE(rest.behind);
}

TEST_CASE("a_family_whose_sweep_fails_is_left_for_the_pass_and_the_others_go_on") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  Fill(*store, 250, 0);
  RetentionPass pass = PassAt(kT0 + 1'000, 100);
  int outbox_calls = 0;
  pass.outbox = [&outbox_calls](int64_t, size_t) -> StatusOr<size_t> {
    ++outbox_calls;
    return Unavailable("outbox: disk full");
  };
  const RetentionCounts swept = SweepRetention(*store, pass);
  CHECK(outbox_calls == 1);
  CHECK(swept.first_error.code() == Code::kUnavailable);
  CHECK(swept.decisions == 250);
  CHECK_FALSE(swept.behind);
}

TEST_CASE("the_outbox_is_swept_page_after_page_with_the_pass_time") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  RetentionPass pass = PassAt(kT0 + 1'000, 100);
  size_t left = 420;
  pass.outbox = [&left](int64_t now_ms, size_t limit) -> StatusOr<size_t> {
    CHECK(now_ms == kT0 + 1'000);
    const size_t n = std::min(left, limit);
    left -= n;
    return n;
  };
  const RetentionCounts swept = SweepRetention(*store, pass);
  CHECK(swept.outbox_events == 420);
  CHECK(left == 0);
}

TEST_CASE("a_sweep_racing_new_decisions_of_its_keys_never_leaves_a_key_without_its_record") {
  // The sweep writes its deletions a chunk at a time; each key's stripe is
  // held until its chunk is written. Released any earlier, a new decision
  // stored meanwhile under the key would lose its key to the chunk's write.
  TempDir dir;
  auto store = OpenStore(dir.path());
  constexpr int kKeys = 2'000;
  const int64_t now = kT0 + 2'000;
  for (int round = 0; round < 4; ++round) {
    const int first = round * kKeys;
    for (int i = first; i < first + kKeys; ++i) {
      REQUIRE(store->decisions().PutIfAbsent(Expiring(i, kT0 + 1'000), kT0).ok());
    }
    std::thread sweeper([&] { CHECK(store->decisions().SweepExpired(now, 10'000).ok()); });
    // Against the sweep's order (its index sorts the ids as text): the two
    // meet on the keys of a chunk being staged.
    std::vector<std::string> order;
    for (int i = first; i < first + kKeys; ++i) order.push_back(std::to_string(i));
    std::sort(order.rbegin(), order.rend());
    for (const std::string& i : order) {
      Decision fresh = Expiring(std::stoi(i), kT0 + 3'600'000);
      fresh.decision_id = "new_" + i;
      auto stored = store->decisions().PutIfAbsent(fresh, now);
      REQUIRE(stored.ok());
      CHECK(stored->decision_id == "new_" + i);
    }
    sweeper.join();
    CHECK(store->decisions().SweepExpired(now, 10'000).ok());  // whatever the race left
    for (int i = first; i < first + kKeys; ++i) {
      auto got = store->decisions().GetByKey("key-" + std::to_string(i), now);
      REQUIRE_MESSAGE(got.ok(), "key-", i, ": ", got.status().ToString());
      CHECK(got->decision_id == "new_" + std::to_string(i));
      CHECK(store->decisions().Get("dec_" + std::to_string(i)).status().code() == Code::kNotFound);
    }
  }
}

TEST_CASE("a_swept_decision_takes_its_plan_if_no_one_has_acted_on_it") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  Fill(*store, 3, 0);  // dec_0..dec_2 over at kT0 + 1,000; dec_-1 lives on
  auto plan_of = [](const std::string& decision_id) { return "plan_" + decision_id.substr(4); };
  for (const char* id : {"dec_0", "dec_1", "dec_2", "dec_-1"}) {
    REQUIRE(store->plans().Put(PlanAt(plan_of(id), id, "proposed")).ok());
  }
  // An operator approved dec_1's plan: it stays, whatever its decision.
  REQUIRE(store->plans().Transition("plan_1", "proposed", "approved", "op", "", kT0 + 1).ok());
  RetentionPass pass = PassAt(kT0 + 1'000, 100);
  pass.plan_of_decision = plan_of;
  const RetentionCounts swept = SweepRetention(*store, pass);
  CHECK(swept.decisions == 3);
  CHECK(swept.plans == 2);
  CHECK(store->plans().Get("plan_0").status().code() == Code::kNotFound);
  CHECK(store->plans().Get("plan_2").status().code() == Code::kNotFound);
  CHECK(store->plans().Get("plan_1")->state == "approved");
  CHECK(store->plans().Get("plan_-1")->state == "proposed");  // its decision lives
}

TEST_CASE("without_a_plan_rule_a_swept_decision_leaves_its_plan") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  Fill(*store, 1, 0);
  REQUIRE(store->plans().Put(PlanAt("plan_0", "dec_0", "proposed")).ok());
  const RetentionCounts swept = SweepRetention(*store, PassAt(kT0 + 1'000, 100));
  CHECK(swept.decisions == 1);
  CHECK(swept.plans == 0);
  CHECK(store->plans().Get("plan_0").ok());
}

// An applied plan, a resolved escalation and a trace entry, all finished at kT0.
void FillFinished(Store& store, const std::string& trace_id) {
  REQUIRE(store.plans().Put(PlanAt("plan_done", "dec_done", "applied")).ok());
  Escalation e;
  e.escalation_id = "esc_done";
  e.decision_key = "key-done";
  e.step = "t";
  e.created_at_ms = kT0;
  REQUIRE(store.escalations().Put(e).ok());
  REQUIRE(store.escalations().Resolve("esc_done", "dec_done", "human", kT0).ok());
  REQUIRE(
      store.traces().Add(TraceEntry{.trace_id = trace_id, .at_ms = kT0, .type = "request"}).ok());
  REQUIRE(store.traces().Flush().ok());
}

TEST_CASE("finished_records_are_kept_by_a_pass_that_keeps_them_forever_and_go_past_a_cutoff") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  const std::string trace(32, 'c');
  FillFinished(*store, trace);
  const int64_t years_later = kT0 + 3LL * 365 * 24 * 3600 * 1000;
  RetentionPass forever = PassAt(years_later, 100);
  forever.finished_cutoff_ms = -1;  // store.finished_retention: forever
  const RetentionCounts kept = SweepRetention(*store, forever);
  CHECK(kept.first_error.ok());
  CHECK(kept.plans == 0);
  CHECK(kept.escalations == 0);
  CHECK(kept.traces == 0);
  CHECK(store->plans().Get("plan_done")->state == "applied");
  CHECK(store->escalations().Get("esc_done")->state == "resolved");
  CHECK(store->traces().List(trace, 10)->size() == 1);

  // A cutoff just past them: each goes (the trace entry is no longer listed).
  RetentionPass past = PassAt(years_later, 100);
  past.finished_cutoff_ms = kT0;
  const RetentionCounts swept = SweepRetention(*store, past);
  CHECK(swept.first_error.ok());
  CHECK(swept.plans == 1);
  CHECK(swept.escalations == 1);
  CHECK(store->plans().Get("plan_done").status().code() == Code::kNotFound);
  CHECK(store->escalations().Get("esc_done").status().code() == Code::kNotFound);
  CHECK(store->traces().List(trace, 10)->empty());
}

bool TakeAndGiveBack(Mutex& mu) {
  if (!mu.TryLock()) return false;
  mu.Unlock();
  return true;
}

// Whether another thread could take `mu` now (a thread may not try a
// mutex it holds).
bool FreeForOthers(Mutex& mu) {
  bool free = false;
  std::thread([&] { free = TakeAndGiveBack(mu); }).join();
  return free;
}

TEST_CASE("a_chunked_sweep_holds_at_most_a_chunk_of_stripes_however_many_records_it_leaves" *
          doctest::test_suite("rocksdb")) {
  TempDir dir;
  auto db = rocks::RocksDatabase::Open(StoreOptions{dir.path(), false});
  REQUIRE(db.ok());
  std::vector<Mutex*> stripes;
  for (int i = 0; stripes.size() < 3 * rocks::ChunkedSweep::kChunk; ++i) {
    Mutex* mu = &(*db)->LockFor(rocks::Family::kLeases, "n" + std::to_string(i));
    if (std::find(stripes.begin(), stripes.end(), mu) == stripes.end()) stripes.push_back(mu);
  }
  rocks::ChunkedSweep sweep(**db);
  for (Mutex* mu : stripes) REQUIRE(sweep.Lock(*mu).ok());  // looked at, each left: no Next
  size_t held = 0;
  for (Mutex* mu : stripes) held += FreeForOthers(*mu) ? 0 : 1;
  CHECK(held >= 1);
  CHECK(held <= rocks::ChunkedSweep::kChunk);
  CHECK(FreeForOthers(*stripes.front()));
  REQUIRE(sweep.Flush().ok());
  CHECK_FALSE(
      std::any_of(stripes.begin(), stripes.end(), [](Mutex* mu) { return !FreeForOthers(*mu); }));
}

}  // namespace
}  // namespace idem
