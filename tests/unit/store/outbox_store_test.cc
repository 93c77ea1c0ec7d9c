// The outbox (store.h, OutboxStore): events written in the same atomic
// write as the state change they report, read in commit order without ever
// skipping one that commits late, and the subscribers' cursors and dead
// letters.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "daemon/core/failpoints.h"
#include "daemon/store/store.h"
#include "tests/unit/store/store_test_util.h"

namespace idem {
namespace {

using testing::ClaimReq;
using testing::kT0;
using testing::OpenStore;
using testing::TempDir;

Plan MakePlan(const std::string& id) {
  Plan p;
  p.plan_id = id;
  p.decision_id = "dec_1";
  p.state = "proposed";
  p.actions = Json::array();
  p.created_at_ms = kT0;
  p.updated_at_ms = kT0;
  return p;
}

Decision MakeDecision(const std::string& id, const std::string& key) {
  return testing::MakeDecision(id, key, kT0);
}

std::vector<OutboxEvent> All(Store& store) {
  StatusOr<std::vector<OutboxEvent>> events = store.outbox().After(0, 1000);
  REQUIRE_MESSAGE(events.ok(), events.status().ToString());
  return *events;
}

std::vector<std::string> Types(const std::vector<OutboxEvent>& events) {
  std::vector<std::string> out;
  for (const auto& e : events) out.push_back(e.type + " " + e.key);
  return out;
}

TEST_CASE("each committed state change leaves one outbox event, in commit order") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  REQUIRE(store->plans().Put(MakePlan("plan_1")).ok());
  REQUIRE(store->plans().Transition("plan_1", "proposed", "approved", "alice", "", kT0 + 1).ok());
  REQUIRE(store->decisions().PutIfAbsent(MakeDecision("dec_a", "key_a"), kT0).ok());
  StatusOr<ClaimResult> c = store->journal().Claim(ClaimReq("w1", kT0));
  REQUIRE(c.ok());
  REQUIRE(
      store->journal().Complete("w1", c->item.lease_token, Json{{"id", 7}}, "ref-7", kT0 + 2).ok());
  ClaimRequest once = ClaimReq("w2", kT0);
  once.max_attempts = 1;
  StatusOr<ClaimResult> c2 = store->journal().Claim(once);
  REQUIRE(c2.ok());
  REQUIRE(store->journal().Fail("w2", c2->item.lease_token, "boom", true, kT0 + 3, kT0 + 3).ok());

  std::vector<OutboxEvent> events = All(*store);
  CHECK(Types(events) == std::vector<std::string>{"plan.proposed plan_1", "plan.approved plan_1",
                                                  "decision.created dec_a", "effect.done w1",
                                                  "work.dead_letter w2"});
  for (size_t i = 1; i < events.size(); ++i) CHECK(events[i].seq > events[i - 1].seq);
  REQUIRE(events.size() == 5);
  StatusOr<std::optional<std::string>> store_id = store->meta().Get(kStoreIdKey);
  REQUIRE(store_id.ok());
  REQUIRE(store_id->has_value());
  CHECK((*store_id)->size() == 16);
  CHECK(events[0].event_id ==
        "evt_" + **store_id + "_" + std::string(19, '0') + std::to_string(events[0].seq));
  CHECK(events[1].data["from"] == "proposed");
  CHECK(events[1].data["actor"] == "alice");
  CHECK(events[3].data == Json{{"attempt", 1},
                               {"external_ref", "ref-7"},
                               {"kind", "send_email"},
                               {"state", "done"},
                               {"work_id", "w1"}});
  CHECK(events[4].data == Json{{"attempt", 1},
                               {"error", "boom"},
                               {"kind", "send_email"},
                               {"state", "dead"},
                               {"work_id", "w2"}});
  CHECK_FALSE(events[3].data.contains("result"));  // small: no results or args
  CHECK(events[4].data["error"] == "boom");
  // A cursor continues after the last event seen.
  StatusOr<std::vector<OutboxEvent>> rest = store->outbox().After(events[2].seq, 10);
  REQUIRE(rest.ok());
  CHECK(Types(*rest) == std::vector<std::string>{"effect.done w1", "work.dead_letter w2"});
}

TEST_CASE("a refused compare-and-set or a repeated write leaves no outbox event") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  REQUIRE(store->plans().Put(MakePlan("plan_1")).ok());
  REQUIRE(store->plans().Transition("plan_1", "proposed", "rejected", "bob", "", kT0 + 1).ok());
  // Stale state: the CAS fails, nothing is written.
  CHECK(store->plans()
            .Transition("plan_1", "proposed", "approved", "alice", "", kT0 + 2)
            .status()
            .code() == Code::kFailedPrecondition);
  // A live decision is kept: the second one is not stored.
  REQUIRE(store->decisions().PutIfAbsent(MakeDecision("dec_a", "key_a"), kT0).ok());
  REQUIRE(store->decisions().PutIfAbsent(MakeDecision("dec_b", "key_a"), kT0).ok());
  // A completed work completed again, and a stale token.
  StatusOr<ClaimResult> c = store->journal().Claim(ClaimReq("w1", kT0));
  REQUIRE(c.ok());
  REQUIRE(store->journal().Complete("w1", c->item.lease_token, Json(), "", kT0 + 2).ok());
  REQUIRE(store->journal().Complete("w1", c->item.lease_token, Json(), "", kT0 + 3).ok());
  CHECK(store->journal().Complete("w1", "not-the-token", Json(), "", kT0 + 3).code() ==
        Code::kFailedPrecondition);

  CHECK(Types(All(*store)) == std::vector<std::string>{"plan.proposed plan_1",
                                                       "plan.rejected plan_1",
                                                       "decision.created dec_a", "effect.done w1"});
}

// The failpoint store.write is RocksDB's; on PostgreSQL, pg_outbox_test.cc
// covers a rolled back event and one that commits late.
TEST_CASE("a write the disk refuses leaves no outbox event and holds nothing back" *
          doctest::test_suite("rocksdb")) {
  TempDir dir;
  auto store = OpenStore(dir.path());
  REQUIRE(Failpoints::Set("store.write=error").ok());
  CHECK_FALSE(store->plans().Put(MakePlan("plan_lost")).ok());
  Failpoints::Clear();
  CHECK(All(*store).empty());
  REQUIRE(store->plans().Put(MakePlan("plan_kept")).ok());
  // The failed write's seq is a gap, not a hole that stops readers.
  CHECK(Types(All(*store)) == std::vector<std::string>{"plan.proposed plan_kept"});
}

TEST_CASE("an event that commits late is not skipped by a reader that read past it" *
          doctest::test_suite("rocksdb")) {
  TempDir dir;
  auto store = OpenStore(dir.path());
  // The first write takes its seq, then stalls before its commit.
  REQUIRE(Failpoints::Set("store.write=1*delay(600)").ok());
  std::thread slow([&] { CHECK(store->plans().Put(MakePlan("plan_slow")).ok()); });
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  REQUIRE(store->plans().Put(MakePlan("plan_fast")).ok());  // a later seq, committed first
  // The fast event is committed, but serving it would let a reader's cursor
  // pass the slow one's smaller seq.
  std::vector<OutboxEvent> early = All(*store);
  slow.join();
  Failpoints::Clear();
  CHECK(early.empty());
  std::vector<OutboxEvent> events = All(*store);
  CHECK(Types(events) ==
        std::vector<std::string>{"plan.proposed plan_slow", "plan.proposed plan_fast"});
}

TEST_CASE("a batch of completes in one write leaves one event per completed work") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  Journal& j = store->journal();
  std::vector<JournalOp> ops;
  for (const std::string id : {"w1", "w2", "w3"}) {
    StatusOr<ClaimResult> c = j.Claim(ClaimReq(id, kT0));
    REQUIRE(c.ok());
    JournalOp op;
    op.type = JournalOp::Type::kComplete;
    op.work_id = id;
    op.lease_token = id == "w2" ? "stale" : c->item.lease_token;
    op.now_ms = kT0 + 1;
    ops.push_back(op);
  }
  std::vector<StatusOr<JournalOpResult>> out = j.FinishOps(j.BeginOps(ops, nullptr));
  REQUIRE(out.size() == 3);
  CHECK(out[1]->stale_lease);
  CHECK(Types(All(*store)) == std::vector<std::string>{"effect.done w1", "effect.done w3"});
}

TEST_CASE("a reader polling during concurrent writes sees every event once, in seq order") {
  TempDir dir;
  auto store = OpenStore(dir.path(), /*sync=*/true);  // fsyncs: writes commit in shared groups
  // A pause between taking a seq and committing: writes commit out of seq order.
  REQUIRE(Failpoints::Set("store.write=delay(1)").ok());
  constexpr int kThreads = 6, kPerThread = 40;
  std::atomic<bool> done{false};
  std::vector<std::thread> writers;
  for (int t = 0; t < kThreads; ++t) {
    writers.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const std::string id = "plan_" + std::to_string(t) + "_" + std::to_string(i);
        CHECK(store->plans().Put(MakePlan(id)).ok());
      }
    });
  }
  std::thread closer([&] {
    for (auto& w : writers) w.join();
    done = true;
  });
  std::vector<uint64_t> seen;
  std::set<std::string> keys;
  uint64_t cursor = 0;
  while (true) {
    const bool last_round = done.load();
    StatusOr<std::vector<OutboxEvent>> page = store->outbox().After(cursor, 7);
    REQUIRE(page.ok());
    for (const OutboxEvent& e : *page) {
      seen.push_back(e.seq);
      keys.insert(e.key);
      cursor = e.seq;
    }
    if (last_round && page->empty()) break;
    if (page->empty()) std::this_thread::yield();
  }
  closer.join();
  Failpoints::Clear();
  CHECK(keys.size() == size_t{kThreads * kPerThread});
  CHECK(seen.size() == size_t{kThreads * kPerThread});
  for (size_t i = 1; i < seen.size(); ++i) CHECK(seen[i] > seen[i - 1]);
}

TEST_CASE("a subscriber's cursor moves forward only, and a dead letter moves it too") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  OutboxStore& o = store->outbox();
  CHECK(*o.Cursor("billing") == 0);
  REQUIRE(o.Advance("billing", 5).ok());
  REQUIRE(o.Advance("billing", 3).ok());
  CHECK(*o.Cursor("billing") == 5);
  CHECK(*o.Cursor("crm") == 0);

  OutboxDeadLetter dl;
  dl.subscriber = "billing";
  dl.event.seq = 9;
  dl.event.event_id = OutboxEvent::IdFor("", 9);
  dl.event.type = "effect.done";
  dl.event.key = "w9";
  dl.attempts = 3;
  dl.last_error = "HTTP 503";
  dl.dead_at_ms = kT0;
  REQUIRE(o.AddDeadLetter(dl).ok());
  CHECK(*o.Cursor("billing") == 9);
  StatusOr<std::vector<OutboxDeadLetter>> dead = o.DeadLetters("billing", 0, 10);
  REQUIRE(dead.ok());
  REQUIRE(dead->size() == 1);
  CHECK((*dead)[0].event.key == "w9");
  CHECK((*dead)[0].state == "dead");
  CHECK(o.DeadLetters("crm", 0, 10)->empty());

  CHECK(o.RequestReplay("billing", 8).status().code() == Code::kNotFound);
  StatusOr<OutboxDeadLetter> replaying = o.RequestReplay("billing", 9);
  REQUIRE(replaying.ok());
  CHECK(replaying->state == "replaying");
  REQUIRE(o.FinishReplay("billing", 9, false, "HTTP 500", kT0 + 1).ok());
  dead = o.DeadLetters("", 0, 10);
  REQUIRE(dead->size() == 1);
  CHECK((*dead)[0].state == "dead");
  CHECK((*dead)[0].attempts == 4);
  CHECK((*dead)[0].last_error == "HTTP 500");
  REQUIRE(o.RequestReplay("billing", 9).ok());
  REQUIRE(o.FinishReplay("billing", 9, true, "", kT0 + 2).ok());
  CHECK(o.DeadLetters("", 0, 10)->empty());
}

TEST_CASE(
    "the outbox head is at or above every seq a reader was served, reopen and retention "
    "included") {
  TempDir dir;
  uint64_t last = 0;
  {
    auto store = OpenStore(dir.path());
    CHECK(*store->outbox().Head() == 0);
    REQUIRE(store->plans().Put(MakePlan("plan_1")).ok());
    REQUIRE(store->plans().Put(MakePlan("plan_2")).ok());
    std::vector<OutboxEvent> events = All(*store);
    REQUIRE(events.size() == 2);
    last = events[1].seq;
    CHECK(*store->outbox().Head() == last);
    // Retention deletes them all: the head stays.
    CHECK(*store->outbox().Sweep(last, kT0, 100) == 2);
    CHECK(*store->outbox().Head() == last);
  }
  auto store = OpenStore(dir.path());
  CHECK(*store->outbox().Head() == last);
  REQUIRE(store->plans().Put(MakePlan("plan_3")).ok());
  std::vector<OutboxEvent> events = All(*store);
  REQUIRE(events.size() == 1);
  CHECK(*store->outbox().Head() == events[0].seq);
}

TEST_CASE("retention deletes old events up to a seq, and seqs are never reused after reopen") {
  TempDir dir;
  uint64_t last = 0;
  {
    auto store = OpenStore(dir.path());
    REQUIRE(store->plans().Put(MakePlan("plan_1")).ok());
    REQUIRE(store->plans().Put(MakePlan("plan_2")).ok());
    std::vector<OutboxEvent> events = All(*store);
    REQUIRE(events.size() == 2);
    last = events[1].seq;
    CHECK(*store->outbox().SweptThrough() == 0);
    // Not past the seq, not inside the window: kept.
    CHECK(*store->outbox().Sweep(events[0].seq, kT0, 100) == 1);
    CHECK(*store->outbox().Sweep(last, kT0 - 1, 100) == 0);
    CHECK(*store->outbox().SweptThrough() == events[0].seq);
    CHECK(*store->outbox().Sweep(last, kT0, 100) == 1);
    CHECK(*store->outbox().SweptThrough() == last);
    CHECK(All(*store).empty());
  }
  auto store = OpenStore(dir.path());
  CHECK(*store->outbox().SweptThrough() == last);  // durable
  REQUIRE(store->plans().Put(MakePlan("plan_3")).ok());
  std::vector<OutboxEvent> events = All(*store);
  REQUIRE(events.size() == 1);
  CHECK(events[0].seq > last);
}

TEST_CASE("retention with no subscriber to wait for sweeps through every seq") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  REQUIRE(store->plans().Put(MakePlan("plan_1")).ok());
  REQUIRE(store->plans().Put(MakePlan("plan_2")).ok());
  const uint64_t last = All(*store).back().seq;
  // The dispatcher's bound when no subscriber holds events back; a bigint
  // column cannot hold it (PostgreSQL refused the sweep, so nothing went).
  const uint64_t everything = std::numeric_limits<uint64_t>::max() - 1;
  StatusOr<std::vector<OutboxEvent>> none = store->outbox().After(everything, 10);
  REQUIRE_MESSAGE(none.ok(), none.status().ToString());
  CHECK(none->empty());
  StatusOr<size_t> swept = store->outbox().Sweep(everything, kT0, 100);
  REQUIRE_MESSAGE(swept.ok(), swept.status().ToString());
  CHECK(*swept == 2);
  CHECK(*store->outbox().SweptThrough() == last);
  CHECK(All(*store).empty());
}

TEST_CASE("dead letters page in seq order after a seq, per subscriber and for all") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  OutboxStore& o = store->outbox();
  for (uint64_t seq = 1; seq <= 7; ++seq) {
    OutboxDeadLetter dl;
    dl.subscriber = seq % 2 == 0 ? "crm" : "billing";  // billing: 1 3 5 7, crm: 2 4 6
    dl.event.seq = seq;
    dl.event.event_id = OutboxEvent::IdFor("", seq);
    dl.event.type = "effect.done";
    dl.event.key = "w" + std::to_string(seq);
    dl.attempts = 1;
    dl.dead_at_ms = kT0;
    REQUIRE(o.AddDeadLetter(dl).ok());
  }
  auto seqs = [](const StatusOr<std::vector<OutboxDeadLetter>>& page) {
    std::vector<uint64_t> out;
    REQUIRE_MESSAGE(page.ok(), page.status().ToString());
    for (const OutboxDeadLetter& d : *page) out.push_back(d.event.seq);
    return out;
  };
  CHECK(seqs(o.DeadLetters("billing", 0, 2)) == std::vector<uint64_t>{1, 3});
  CHECK(seqs(o.DeadLetters("billing", 3, 2)) == std::vector<uint64_t>{5, 7});
  CHECK(seqs(o.DeadLetters("billing", 4, 10)) == std::vector<uint64_t>{5, 7});
  CHECK(seqs(o.DeadLetters("billing", 7, 10)).empty());
  CHECK(seqs(o.DeadLetters("crm", 2, 10)) == std::vector<uint64_t>{4, 6});
  CHECK(seqs(o.DeadLetters("", 0, 3)) == std::vector<uint64_t>{1, 2, 3});
  CHECK(seqs(o.DeadLetters("", 3, 3)) == std::vector<uint64_t>{4, 5, 6});
  CHECK(seqs(o.DeadLetters("", 6, 3)) == std::vector<uint64_t>{7});
}

TEST_CASE("event ids of two stores differ and a store keeps its own across a restart") {
  // A consumer dedupes on event_id; a new store (a reset folder, or staging
  // beside production on one hook) must not reuse the ids it has seen.
  TempDir a_dir;
  TempDir b_dir;
  std::string first_a;
  {
    auto a = OpenStore(a_dir.path());
    REQUIRE(a->plans().Put(MakePlan("plan_1")).ok());
    first_a = All(*a).at(0).event_id;
  }
  auto b = OpenStore(b_dir.path());
  REQUIRE(b->plans().Put(MakePlan("plan_1")).ok());
  const OutboxEvent first_b = All(*b).at(0);
  CHECK(first_b.seq == 1);
  CHECK(first_a != first_b.event_id);
  CHECK(first_a.substr(first_a.size() - 20) ==
        first_b.event_id.substr(first_b.event_id.size() - 20));

  auto a = OpenStore(a_dir.path());
  REQUIRE(a->plans().Put(MakePlan("plan_2")).ok());
  const std::vector<OutboxEvent> events = All(*a);
  REQUIRE(events.size() == 2);
  CHECK(events[0].event_id == first_a);
  CHECK(events[1].event_id.substr(0, events[1].event_id.size() - 20) ==
        first_a.substr(0, first_a.size() - 20));
  CHECK(events[1].event_id != first_a);
}

}  // namespace
}  // namespace idem
