// Several idem daemons on one PostgreSQL schema: plans, escalations and the
// audit chain keep their single-daemon guarantees. Each daemon is a Store
// opened separately on the same TempDir (so the same schema), with its own
// pool. Suite "postgres": run only by ctest unit_store_postgres.
#include <doctest/doctest.h>

#include <atomic>
#include <latch>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "daemon/store/postgres/pg_client.h"
#include "daemon/store/store.h"
#include "tests/unit/store/store_test_util.h"

namespace idem {
namespace {

using testing::OpenStore;
using testing::TempDir;

constexpr int64_t kT0 = 1'700'000'000'000;

std::unique_ptr<pg::Pool> PoolFor(const std::string& path) {
  auto pool = pg::Pool::Open(pg::PoolOptions{testing::PgConninfo(), testing::PgSchemaFor(path), 1});
  REQUIRE_MESSAGE(pool.ok(), pool.status().ToString());
  return std::move(pool).value();
}

int64_t Count(const std::string& path, const std::string& sql) {
  auto r = PoolFor(path)->Exec(sql);
  REQUIRE_MESSAGE(r.ok(), r.status().ToString());
  return r->i64(0, 0);
}

Plan Waiting(const std::string& id) {
  Plan p;
  p.plan_id = id;
  p.decision_id = "dec_1";
  p.state = "awaiting_approval";
  p.actions = Json::array({Json{{"kind", "send_email"}}});
  p.created_at_ms = kT0;
  p.updated_at_ms = kT0;
  return p;
}

TEST_SUITE("postgres") {
  TEST_CASE("three daemons appending at once build one audit chain that verifies") {
    TempDir dir;
    std::vector<std::unique_ptr<Store>> daemons;
    for (int i = 0; i < 3; ++i) daemons.push_back(OpenStore(dir.path()));
    constexpr int kThreadsPerDaemon = 2;
    constexpr int kPerThread = 50;  // 3 * 2 * 50 = 300 events
    constexpr int kWriters = 3 * kThreadsPerDaemon;
    std::latch start(kWriters);
    std::atomic<int> failed{0};
    std::vector<std::thread> threads;
    for (int w = 0; w < kWriters; ++w) {
      threads.emplace_back([&, w] {
        AuditLog& log = daemons[static_cast<size_t>(w / kThreadsPerDaemon)]->audit();
        start.arrive_and_wait();
        for (int i = 0; i < kPerThread; ++i) {
          AuditEvent e;
          e.actor = "writer-" + std::to_string(w);
          e.action = "test.append";
          e.at_ms = kT0 + i;
          e.detail = Json{{"i", i}};
          if (!log.Append(std::move(e)).ok()) failed.fetch_add(1);
        }
      });
    }
    for (auto& t : threads) t.join();
    CHECK(failed.load() == 0);

    std::vector<AuditEvent> all = daemons[0]->audit().Scan(1, 1000).value();
    REQUIRE(all.size() == static_cast<size_t>(kWriters * kPerThread));
    std::map<std::string, int> next_of;  // each writer's events in its order
    for (size_t i = 0; i < all.size(); ++i) {
      CHECK(all[i].seq == i + 1);
      if (i > 0) CHECK(all[i].prev_hash == all[i - 1].hash);
      CHECK(all[i].detail["i"] == next_of[all[i].actor]++);
    }
    CHECK(next_of.size() == static_cast<size_t>(kWriters));
    for (auto& d : daemons) {
      AuditVerification v = d->audit().Check().value();
      CHECK(v.ok);
      CHECK(v.checked == 300);
      CHECK(v.head_seq == 300);
      CHECK(v.head_hash == all.back().hash);
    }
  }

  TEST_CASE("two daemons approving one plan at once: exactly one approval, audited and announced") {
    TempDir dir;
    auto a = OpenStore(dir.path());
    auto b = OpenStore(dir.path());
    constexpr int kPlans = 20;
    for (int i = 0; i < kPlans; ++i) {
      REQUIRE(a->plans().Put(Waiting("plan_" + std::to_string(i))).ok());
    }
    int total_ok = 0;
    for (int i = 0; i < kPlans; ++i) {
      const std::string id = "plan_" + std::to_string(i);
      std::latch start(2);
      Status results[2];
      auto approve = [&](Store& store, int who) {
        AuditEvent event;
        event.actor = "op-" + std::to_string(who);
        event.action = "plan.approved";
        PlanChange change{.from = "awaiting_approval",
                          .to = "approved",
                          .actor = event.actor,
                          .now_ms = kT0 + 1,
                          .mutate =
                              [&event](Plan& p) {
                                p.approved_by = event.actor;
                                return Status::Ok();
                              },
                          .audit = &event};
        start.arrive_and_wait();
        results[who] = store.plans().Change(id, change).status();
      };
      std::thread ta([&] { approve(*a, 0); });
      std::thread tb([&] { approve(*b, 1); });
      ta.join();
      tb.join();
      const int ok = (results[0].ok() ? 1 : 0) + (results[1].ok() ? 1 : 0);
      CHECK(ok == 1);
      total_ok += ok;
      for (const Status& s : results) {
        if (!s.ok()) CHECK(s.code() == Code::kFailedPrecondition);
      }
      Plan p = b->plans().Get(id).value();
      CHECK(p.state == "approved");
      CHECK(p.history.size() == 1);
      CHECK(p.approved_by == (results[0].ok() ? "op-0" : "op-1"));
    }
    CHECK(total_ok == kPlans);
    // One audit event and one outbox event per approval, none for the losers.
    CHECK(Count(dir.path(), "SELECT count(*) FROM audit") == kPlans);
    CHECK(Count(dir.path(), "SELECT count(*) FROM outbox WHERE type = 'plan.approved'") == kPlans);
    CHECK(a->audit().Verify().ok());
  }

  TEST_CASE("a plan change that is refused leaves no outbox event behind") {
    TempDir dir;
    auto store = OpenStore(dir.path());
    PlanStore& s = store->plans();
    REQUIRE(s.Put(Waiting("plan_a")).ok());
    CHECK(Count(dir.path(), "SELECT count(*) FROM outbox WHERE type = 'plan.awaiting_approval'") ==
          1);
    PlanChange refused{
        .from = "awaiting_approval", .to = "approved", .now_ms = kT0 + 1, .mutate = [](Plan&) {
          return InvalidArgument("no", "/edits/0/value");
        }};
    CHECK(s.Change("plan_a", refused).status().code() == Code::kInvalidArgument);
    CHECK(s.Transition("plan_a", "proposed", "approved", "op", "", kT0 + 1).status().code() ==
          Code::kFailedPrecondition);
    CHECK(Count(dir.path(), "SELECT count(*) FROM outbox WHERE type = 'plan.approved'") == 0);
    REQUIRE(s.Transition("plan_a", "awaiting_approval", "approved", "op", "", kT0 + 2).ok());
    CHECK(Count(dir.path(), "SELECT count(*) FROM outbox WHERE type = 'plan.approved'") == 1);
    // A change that keeps the state only mutates: no event.
    REQUIRE(s.Transition("plan_a", "approved", "approved", "op", "edit", kT0 + 3).ok());
    CHECK(Count(dir.path(), "SELECT count(*) FROM outbox") == 2);
  }

  TEST_CASE("two daemons resolving one escalation at once: exactly one resolution") {
    TempDir dir;
    auto a = OpenStore(dir.path());
    auto b = OpenStore(dir.path());
    constexpr int kRounds = 20;
    for (int i = 0; i < kRounds; ++i) {
      Escalation e;
      e.escalation_id = "esc_" + std::to_string(i);
      e.decision_key = "key-" + std::to_string(i);
      e.step = "t";
      e.created_at_ms = kT0;
      REQUIRE(a->escalations().Put(e).ok());
      std::latch start(2);
      StatusOr<Escalation> results[2] = {Internal("unset"), Internal("unset")};
      auto resolve = [&](Store& store, int who) {
        start.arrive_and_wait();
        results[who] = store.escalations().Resolve(e.escalation_id, "dec_" + std::to_string(who),
                                                   "human-" + std::to_string(who), kT0 + 1);
      };
      std::thread ta([&] { resolve(*a, 0); });
      std::thread tb([&] { resolve(*b, 1); });
      ta.join();
      tb.join();
      CHECK((results[0].ok() ? 1 : 0) + (results[1].ok() ? 1 : 0) == 1);
      const int winner = results[0].ok() ? 0 : 1;
      CHECK(results[1 - winner].status().code() == Code::kFailedPrecondition);
      Escalation stored = b->escalations().Get(e.escalation_id).value();
      CHECK(stored.state == "resolved");
      CHECK(stored.decision_id == "dec_" + std::to_string(winner));
      CHECK(b->escalations().OpenByKey(e.decision_key).status().code() == Code::kNotFound);
    }
  }
}

}  // namespace
}  // namespace idem
