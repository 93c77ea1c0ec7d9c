#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "daemon/core/crypto.h"
#include "daemon/store/rocksdb/rocksdb_plan_store.h"
#include "daemon/store/store.h"
#include "tests/unit/store/store_test_util.h"

namespace idem {
namespace {

using testing::OpenStore;
using testing::RawKeys;
using testing::TempDir;

constexpr int64_t kT0 = 1'700'000'000'000;

Plan MakePlan(const std::string& id, int64_t created_at_ms) {
  Plan p;
  p.plan_id = id;
  p.decision_id = "dec_1";
  p.state = "proposed";
  p.actions = Json::array({Json{{"kind", "send_email"}}});
  p.created_at_ms = created_at_ms;
  p.updated_at_ms = created_at_ms;
  return p;
}

TEST_CASE("a plan is stored once and read back") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  PlanStore& s = store->plans();
  REQUIRE(s.Put(MakePlan("plan_1", kT0)).ok());
  CHECK(s.Put(MakePlan("plan_1", kT0)).code() == Code::kAlreadyExists);
  StatusOr<Plan> p = s.Get("plan_1");
  REQUIRE(p.ok());
  CHECK(p->state == "proposed");
  CHECK(p->actions.size() == 1);
  CHECK(s.Get("plan_2").status().code() == Code::kNotFound);
}

TEST_CASE("a plan transition is a compare-and-set that appends to the history") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  PlanStore& s = store->plans();
  REQUIRE(s.Put(MakePlan("plan_1", kT0)).ok());
  StatusOr<Plan> approved = s.Transition("plan_1", "proposed", "approved", "alice", "ok", kT0 + 5);
  REQUIRE(approved.ok());
  CHECK(approved->state == "approved");
  CHECK(approved->updated_at_ms == kT0 + 5);
  REQUIRE(approved->history.size() == 1);
  CHECK(approved->history[0] == Json{{"from", "proposed"},
                                     {"to", "approved"},
                                     {"actor", "alice"},
                                     {"note", "ok"},
                                     {"at_ms", kT0 + 5}});

  // A second operator acting on the stale state loses.
  StatusOr<Plan> rejected = s.Transition("plan_1", "proposed", "rejected", "bob", "", kT0 + 6);
  CHECK(rejected.status().code() == Code::kFailedPrecondition);
  CHECK(s.Get("plan_1")->state == "approved");
  CHECK(s.Get("plan_1")->history.size() == 1);
  CHECK(s.Transition("nope", "proposed", "approved", "a", "", kT0).status().code() ==
        Code::kNotFound);
}

TEST_CASE("ByState lists plans in a state, oldest first, following transitions") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  PlanStore& s = store->plans();
  REQUIRE(s.Put(MakePlan("plan_b", kT0 + 2)).ok());
  REQUIRE(s.Put(MakePlan("plan_a", kT0 + 1)).ok());
  REQUIRE(s.Put(MakePlan("plan_c", kT0 + 3)).ok());
  REQUIRE(s.Transition("plan_b", "proposed", "approved", "alice", "", kT0 + 4).ok());
  std::vector<Plan> proposed = s.ByState("proposed", 10).value();
  REQUIRE(proposed.size() == 2);
  CHECK(proposed[0].plan_id == "plan_a");
  CHECK(proposed[1].plan_id == "plan_c");
  std::vector<Plan> approved = s.ByState("approved", 10).value();
  REQUIRE(approved.size() == 1);
  CHECK(approved[0].plan_id == "plan_b");
  CHECK(s.ByState("proposed", 1)->size() == 1);
  CHECK(s.ByState("applied", 10)->empty());
  // Counted the same way, up to a cap.
  CHECK(s.CountByState("proposed", 10).value() == 2);
  CHECK(s.CountByState("approved", 10).value() == 1);
  CHECK(s.CountByState("applied", 10).value() == 0);
  CHECK(s.CountByState("proposed", 1).value() == 1);
  CHECK(s.CountByState("propose", 10).value() == 0);  // a state, not a prefix of one
}

TEST_CASE("the sweep deletes plans finished before the cutoff and keeps the rest") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  PlanStore& s = store->plans();
  for (const char* id : {"plan_applied", "plan_rejected", "plan_late", "plan_open", "plan_new"}) {
    REQUIRE(s.Put(MakePlan(id, std::string(id) == "plan_new" ? kT0 + 500 : kT0)).ok());
  }
  REQUIRE(s.Transition("plan_applied", "proposed", "applied", "a", "", kT0 + 10).ok());
  REQUIRE(s.Transition("plan_rejected", "proposed", "rejected", "a", "", kT0 + 10).ok());
  REQUIRE(s.Transition("plan_late", "proposed", "applied", "a", "", kT0 + 200).ok());
  REQUIRE(s.Transition("plan_new", "proposed", "applied", "a", "", kT0 + 600).ok());
  CHECK(s.SweepFinished(kT0 + 9, 100).value() == 0);
  CHECK(s.SweepFinished(kT0 + 100, 100).value() == 2);
  CHECK(s.SweepFinished(kT0 + 100, 100).value() == 0);
  CHECK(s.Get("plan_applied").status().code() == Code::kNotFound);
  CHECK(s.Get("plan_rejected").status().code() == Code::kNotFound);
  CHECK(s.Get("plan_late")->state == "applied");   // finished after the cutoff
  CHECK(s.Get("plan_open")->state == "proposed");  // not finished, however old
  CHECK(s.ByState("applied", 10)->size() == 2);
  CHECK(s.SweepFinished(kT0 + 10'000, 1).value() == 1);  // at most `limit`
  CHECK(s.SweepFinished(kT0 + 10'000, 100).value() == 1);
  CHECK(s.ByState("applied", 10)->empty());
  CHECK(s.ByState("proposed", 10)->size() == 1);
}

TEST_CASE("the sweep finds plans finished before the cutoff behind older ones finished after it") {
  TempDir dir;
  {
    auto store = OpenStore(dir.path());
    PlanStore& s = store->plans();
    // Created first, finished last: a page's worth that stays.
    for (int i = 0; i < 5; ++i) {
      const std::string id = "plan_long_" + std::to_string(i);
      REQUIRE(s.Put(MakePlan(id, kT0)).ok());
      REQUIRE(s.Transition(id, "proposed", "applied", "a", "", kT0 + 500).ok());
    }
    for (int i = 0; i < 3; ++i) {
      const std::string id = "plan_quick_" + std::to_string(i);
      REQUIRE(s.Put(MakePlan(id, kT0 + 1)).ok());
      REQUIRE(
          s.Transition(id, "proposed", i == 2 ? "rejected" : "applied", "a", "", kT0 + 10).ok());
    }
    Plan copied = MakePlan("plan_copied", kT0 + 2);  // as `idem store copy` writes one
    copied.state = "expired";
    copied.updated_at_ms = kT0 + 20;
    REQUIRE(s.Put(copied).ok());
    CHECK(s.SweepFinished(kT0 + 100, 5).value() == 4);
    CHECK(s.SweepFinished(kT0 + 100, 5).value() == 0);
    CHECK(s.Get("plan_quick_0").status().code() == Code::kNotFound);
    CHECK(s.Get("plan_copied").status().code() == Code::kNotFound);
    CHECK(s.Get("plan_long_4")->state == "applied");
    CHECK(s.SweepFinished(kT0 + 500, 2).value() == 2);  // oldest finished first, `limit` a call
    CHECK(s.SweepFinished(kT0 + 500, 5).value() == 3);
    CHECK(s.ByState("applied", 10)->empty());
  }
  if (testing::OnPostgres()) return;  // RocksDB's index families below
  CHECK(RawKeys(dir.path(), "plans").empty());
  CHECK(RawKeys(dir.path(), "plans_by_state").empty());
  CHECK(RawKeys(dir.path(), "plans_finished").empty());
}

// RocksDB's "plans_finished" index and its upgrade path.
TEST_CASE("a store from before the finished-plan index has them indexed once, then swept" *
          doctest::test_suite("rocksdb")) {
  TempDir dir;
  {
    auto store = OpenStore(dir.path());
    PlanStore& s = store->plans();
    for (int i = 0; i < 3; ++i) {
      const std::string id = "plan_" + std::to_string(i);
      REQUIRE(s.Put(MakePlan(id, kT0)).ok());
      REQUIRE(s.Transition(id, "proposed", "applied", "a", "", kT0 + 10 * i).ok());
    }
    REQUIRE(s.Put(MakePlan("plan_open", kT0)).ok());
    REQUIRE(s.Transition("plan_open", "proposed", "approved", "a", "", kT0).ok());
  }
  // As an older idem left it: no index entries and no marker.
  CHECK(testing::ForgetIndex(dir.path(), rocks::Family::kPlansFinished,
                             rocks::RocksPlanStore::kIndexedMarker) == 3);
  {
    auto store = OpenStore(dir.path());
    CHECK(store->plans().SweepFinished(kT0 + 10, 100).value() == 2);  // finished by then
    CHECK(store->plans().Get("plan_2")->state == "applied");
    CHECK(store->plans().Get("plan_open")->state == "approved");
  }
  CHECK(RawKeys(dir.path(), "plans_finished").size() == 1);  // plan_2's
}

}  // namespace
TEST_CASE(
    "DeleteProposed deletes a decision's plan only while it is proposed and that decision's") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  PlanStore& s = store->plans();
  REQUIRE(s.Put(MakePlan("plan_proposed", kT0)).ok());
  REQUIRE(s.Put(MakePlan("plan_approved", kT0)).ok());
  REQUIRE(s.Transition("plan_approved", "proposed", "approved", "alice", "", kT0 + 1).ok());
  REQUIRE(s.Put(MakePlan("plan_other", kT0)).ok());  // its decision is dec_1, not dec_2
  CHECK(s.DeleteProposed({{"plan_proposed", "dec_1"},
                          {"plan_approved", "dec_1"},
                          {"plan_other", "dec_2"},
                          {"plan_missing", "dec_1"}})
            .value() == 1);
  CHECK(s.Get("plan_proposed").status().code() == Code::kNotFound);
  CHECK(s.ByState("proposed", 10).value().size() == 1);  // plan_other; the index followed
  CHECK(s.Get("plan_approved")->state == "approved");
  CHECK(s.Get("plan_other")->state == "proposed");
  CHECK(s.DeleteProposed({}).value() == 0);
  // Gone, it takes no transition, and its id may be proposed again.
  CHECK(s.Transition("plan_proposed", "proposed", "approved", "bob", "", kT0 + 2).status().code() ==
        Code::kNotFound);
  CHECK(s.Put(MakePlan("plan_proposed", kT0 + 3)).ok());
}

TEST_CASE("a plan change and its audit event are one write: a refused change audits nothing") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  PlanStore& s = store->plans();
  AuditEvent created;
  created.actor = "agent-1";
  created.action = "plan.awaiting_approval";
  Plan waiting = MakePlan("plan_a", kT0);
  waiting.state = "awaiting_approval";
  REQUIRE(s.Put(waiting, &created).ok());
  AuditEvent approved;
  approved.actor = "op-1";
  approved.action = "plan.approved";
  approved.detail = {{"comment", "fine"}};
  PlanChange change{.from = "awaiting_approval",
                    .to = "approved",
                    .actor = "op-1",
                    .note = "fine",
                    .now_ms = kT0 + 1,
                    .mutate =
                        [](Plan& p) {
                          p.approved_by = "op-1";
                          return Status::Ok();
                        },
                    .audit = &approved};
  StatusOr<Plan> p = s.Change("plan_a", change);
  REQUIRE(p.ok());
  CHECK(p->approved_by == "op-1");
  // The second approval loses the compare-and-set and leaves no event.
  CHECK(s.Change("plan_a", change).status().code() == Code::kFailedPrecondition);
  // A mutation that refuses writes nothing either.
  PlanChange refused{.from = "approved",
                     .to = "applying",
                     .now_ms = kT0 + 2,
                     .mutate = [](Plan&) { return InvalidArgument("no", "/edits/0/value"); },
                     .audit = &approved};
  CHECK(s.Change("plan_a", refused).status().field() == "/edits/0/value");
  CHECK(s.Get("plan_a")->state == "approved");
  auto events = store->audit().Scan(1, 10);
  REQUIRE(events.ok());
  REQUIRE(events->size() == 2);
  CHECK((*events)[0].action == "plan.awaiting_approval");
  CHECK((*events)[0].detail["plan_id"] == "plan_a");
  CHECK((*events)[1].action == "plan.approved");
  CHECK((*events)[1].detail["from"] == "awaiting_approval");
  CHECK((*events)[1].detail["to"] == "approved");
  CHECK((*events)[1].detail["comment"] == "fine");
  CHECK(store->audit().Verify().ok());
}

TEST_CASE("plans of one state page newest first with a cursor") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  PlanStore& s = store->plans();
  for (int i = 0; i < 5; ++i) REQUIRE(s.Put(MakePlan("plan_" + std::to_string(i), kT0 + i)).ok());
  REQUIRE(s.Put(MakePlan("plan_other", kT0 + 9)).ok());
  REQUIRE(s.Transition("plan_other", "proposed", "applied", "a", "", kT0 + 10).ok());
  std::vector<std::string> seen;
  std::string cursor;
  int pages = 0;
  do {
    StatusOr<PlanPage> page = s.List("proposed", 2, cursor);
    REQUIRE(page.ok());
    for (const Plan& p : page->items) seen.push_back(p.plan_id);
    cursor = page->next_cursor;
    ++pages;
  } while (!cursor.empty() && pages < 10);
  CHECK(pages == 3);
  CHECK(seen == std::vector<std::string>{"plan_4", "plan_3", "plan_2", "plan_1", "plan_0"});
  CHECK(s.List("proposed", 2, "not-hex").status().code() == Code::kInvalidArgument);
  CHECK(s.List("applied", 10, "")->items.size() == 1);
}

TEST_CASE("a list cursor no page returned is a 400 on query:cursor, never a store error") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  REQUIRE(store->plans().Put(MakePlan("plan_0", kT0)).ok());
  // Not hex, odd length, upper case, too short to hold a position.
  for (const std::string cursor : {"zz", "not-hex", "ABCDEF0123456789ABCD", "0", "00"}) {
    CAPTURE(cursor);
    Status plans = store->plans().List("proposed", 2, cursor).status();
    CHECK(plans.code() == Code::kInvalidArgument);
    CHECK(plans.field() == "query:cursor");
    Status decisions = store->decisions().List("", "", cursor, 2).status();
    CHECK(decisions.code() == Code::kInvalidArgument);
    CHECK(decisions.field() == "query:cursor");
  }
  // Hex of a position followed by bytes no id holds (a NUL, a byte that is
  // not UTF-8): a page from that position, or the same 400, as the engine
  // can tell; never an error of the store itself.
  for (const std::string& cursor : std::vector<std::string>{
           "000001900000000000ff", "00000190000000000000", HexEncode("1700000000000/\xff"),
           HexEncode(std::string("17/a\0b", 6))}) {
    CAPTURE(cursor);
    for (Status s : {store->plans().List("proposed", 2, cursor).status(),
                     store->decisions().List("", "", cursor, 2).status()}) {
      if (s.ok()) continue;
      CHECK(s.code() == Code::kInvalidArgument);
      CHECK(s.field() == "query:cursor");
    }
  }
}

}  // namespace idem
