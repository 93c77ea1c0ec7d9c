// The PostgreSQL journal shared by several daemons: Stores opened on the
// same folder name share one schema, as daemons share one database. Suite
// "postgres": run only by ctest unit_store_postgres (on a real server).
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <latch>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "daemon/store/postgres/pg_client.h"
#include "daemon/store/store.h"
#include "tests/unit/store/store_test_util.h"

namespace idem {
namespace {

using testing::kT0;
using testing::OpenStore;
using testing::TempDir;

// A direct connection to a test's schema, to look at rows and transactions.
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

std::vector<std::unique_ptr<Store>> Daemons(const std::string& path, int n) {
  std::vector<std::unique_ptr<Store>> out;
  for (int i = 0; i < n; ++i) out.push_back(OpenStore(path));
  return out;
}

JournalOp CompleteOp(const std::string& work_id, const std::string& token, int64_t now_ms) {
  JournalOp op;
  op.type = JournalOp::Type::kComplete;
  op.work_id = work_id;
  op.lease_token = token;
  op.result = Json{{"ok", true}};
  op.external_ref = "ref-" + work_id;
  op.now_ms = now_ms;
  return op;
}

TEST_SUITE("postgres") {
  TEST_CASE("64 claims of one work_id over three daemons on one schema give exactly one winner") {
    TempDir dir;
    auto daemons = Daemons(dir.path(), 3);
    constexpr int kThreads = 64;
    std::latch start(kThreads);
    std::atomic<int> claimed{0}, busy{0}, other{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) {
      threads.emplace_back([&, i] {
        Journal& j = daemons[i % 3]->journal();
        start.arrive_and_wait();
        StatusOr<ClaimResult> c = j.Claim(testing::ClaimReq("contended", kT0, 60'000));
        if (!c.ok()) {
          ++other;
        } else if (c->outcome == ClaimOutcome::kClaimed) {
          ++claimed;
        } else if (c->outcome == ClaimOutcome::kBusy) {
          ++busy;
        } else {
          ++other;
        }
      });
    }
    for (std::thread& t : threads) t.join();
    CHECK(claimed.load() == 1);
    CHECK(busy.load() == kThreads - 1);
    CHECK(other.load() == 0);
    for (auto& d : daemons) CHECK(d->journal().Get("contended")->attempt == 1);
  }

  TEST_CASE("a complete with an expired lease's token is refused once another daemon re-claimed") {
    TempDir dir;
    auto daemons = Daemons(dir.path(), 2);
    Journal& a = daemons[0]->journal();
    Journal& b = daemons[1]->journal();
    StatusOr<ClaimResult> first = a.Claim(testing::ClaimReq("w1", kT0, 1'000));
    REQUIRE(first.ok());
    StatusOr<ClaimResult> second = b.Claim(testing::ClaimReq("w1", kT0 + 1'000, 1'000));
    REQUIRE(second.ok());
    REQUIRE(second->outcome == ClaimOutcome::kClaimed);
    CHECK(second->item.attempt == 2);

    const std::string stale = first->item.lease_token;
    CHECK(a.Complete("w1", stale, Json{{"by", "a"}}, "ref-a", kT0 + 1'100).code() ==
          Code::kFailedPrecondition);
    CHECK(a.Fail("w1", stale, "e", true, kT0, kT0 + 1'100).status().code() ==
          Code::kFailedPrecondition);
    CHECK(a.RecordExternalRef("w1", stale, "ref-a", kT0 + 1'100).code() ==
          Code::kFailedPrecondition);
    std::vector<JournalOp> batch = {CompleteOp("w1", stale, kT0 + 1'100)};
    std::vector<StatusOr<JournalOpResult>> out = a.FinishOps(a.BeginOps(batch, nullptr));
    REQUIRE(out[0].ok());
    CHECK(out[0]->stale_lease);
    CHECK(out[0]->item.lease_token.empty());

    auto raw = RawPool(dir.path());
    CHECK(Count(*raw, "SELECT count(*) FROM outbox") == 0);  // nothing staged by a refusal
    CHECK(b.Complete("w1", second->item.lease_token, Json{{"by", "b"}}, "ref-b", kT0 + 1'200).ok());
    StatusOr<WorkItem> got = a.Get("w1");
    REQUIRE(got.ok());
    CHECK(got->result == Json{{"by", "b"}});
    CHECK(got->external_ref == "ref-b");
    CHECK(Count(*raw, "SELECT count(*) FROM outbox WHERE type = 'effect.done' AND key = 'w1'") ==
          1);
  }

  TEST_CASE("a batch of claims is one transaction, and so is a batch of completes with events") {
    TempDir dir;
    auto store = OpenStore(dir.path());
    Journal& j = store->journal();
    StatusOr<ClaimResult> held = j.Claim(testing::ClaimReq("held", kT0, 60'000));
    REQUIRE(held.ok());
    std::vector<JournalOp> claims;
    for (int i = 0; i < 20; ++i) {
      claims.push_back(JournalOp::Claim(testing::ClaimReq("c" + std::to_string(i), kT0, 60'000)));
    }
    claims.push_back(JournalOp::Claim(testing::ClaimReq("held", kT0 + 1, 60'000)));
    std::vector<StatusOr<JournalOpResult>> out = j.FinishOps(j.BeginOps(claims, nullptr));
    for (int i = 0; i < 20; ++i) {
      REQUIRE(out[i].ok());
      CHECK(out[i]->outcome == ClaimOutcome::kClaimed);
    }
    REQUIRE(out[20].ok());
    CHECK(out[20]->outcome == ClaimOutcome::kBusy);

    // Rows written by one transaction carry its id as xmin.
    auto raw = RawPool(dir.path());
    CHECK(Count(*raw, "SELECT count(DISTINCT xmin::text) FROM journal WHERE work_id LIKE 'c%'") ==
          1);
    CHECK(Count(*raw,
                "SELECT count(*) FROM journal WHERE work_id = 'held' AND xmin::text IN"
                " (SELECT xmin::text FROM journal WHERE work_id = 'c0')") == 0);

    std::vector<JournalOp> completes;
    for (int i = 0; i < 20; ++i) {
      completes.push_back(CompleteOp("c" + std::to_string(i), out[i]->item.lease_token, kT0 + 10));
    }
    completes.push_back(JournalOp::Claim(testing::ClaimReq("c0", kT0 + 11, 60'000)));  // done now
    std::vector<StatusOr<JournalOpResult>> done = j.FinishOps(j.BeginOps(completes, nullptr));
    for (int i = 0; i < 20; ++i) {
      REQUIRE(done[i].ok());
      CHECK(done[i]->item.state == WorkState::kDone);
    }
    REQUIRE(done[20].ok());
    CHECK(done[20]->outcome == ClaimOutcome::kDone);
    CHECK(Count(*raw, "SELECT count(DISTINCT xmin::text) FROM journal WHERE work_id LIKE 'c%'") ==
          1);
    // The events of the batch committed with it, in the same transaction.
    CHECK(Count(*raw, "SELECT count(*) FROM outbox WHERE type = 'effect.done'") == 20);
  }

  TEST_CASE("a duplicate claim of held or done work takes no row lock and writes nothing") {
    TempDir dir;
    auto daemons = Daemons(dir.path(), 2);
    StatusOr<ClaimResult> held =
        daemons[0]->journal().Claim(testing::ClaimReq("held", kT0, 60'000));
    StatusOr<ClaimResult> done =
        daemons[0]->journal().Claim(testing::ClaimReq("done", kT0, 60'000));
    REQUIRE((held.ok() && done.ok()));
    REQUIRE(daemons[0]->journal().Complete("done", done->item.lease_token, 1, "", kT0).ok());
    auto raw = RawPool(dir.path());
    auto versions = [&] {
      auto r = raw->Exec(
          "SELECT string_agg(xmin::text || '/' || xmax::text, ',' ORDER BY work_id)"
          " FROM journal");
      REQUIRE(r.ok());
      return r->str(0, 0);
    };
    const std::string before = versions();
    CHECK(daemons[1]->journal().Claim(testing::ClaimReq("held", kT0 + 1, 60'000))->outcome ==
          ClaimOutcome::kBusy);
    CHECK(daemons[1]->journal().Claim(testing::ClaimReq("done", kT0 + 1, 60'000))->outcome ==
          ClaimOutcome::kDone);
    std::vector<ClaimRequest> batch = {testing::ClaimReq("held", kT0 + 2, 60'000),
                                       testing::ClaimReq("done", kT0 + 2, 60'000)};
    for (auto& r : daemons[1]->journal().ClaimMany(batch)) CHECK(r.ok());
    CHECK(versions() == before);  // a lock would have set xmax, a write xmin
  }

  TEST_CASE("ops on unknown work in a locked batch leave no record behind") {
    TempDir dir;
    auto store = OpenStore(dir.path());
    Journal& j = store->journal();
    std::vector<JournalOp> batch = {CompleteOp("ghost", "t", kT0),
                                    JournalOp::Claim(testing::ClaimReq("new", kT0, 60'000)),
                                    JournalOp::Claim(testing::ClaimReq("new", kT0, 60'000))};
    std::vector<StatusOr<JournalOpResult>> out = j.FinishOps(j.BeginOps(batch, nullptr));
    CHECK(out[0].status().code() == Code::kNotFound);
    REQUIRE((out[1].ok() && out[2].ok()));
    CHECK(out[1]->outcome == ClaimOutcome::kClaimed);
    CHECK(out[2]->outcome == ClaimOutcome::kBusy);
    CHECK(j.Get("ghost").status().code() == Code::kNotFound);
    auto raw = RawPool(dir.path());
    CHECK(Count(*raw, "SELECT count(*) FROM journal") == 1);
  }

  TEST_CASE("a crash on the last attempt seen by many daemons at once dies once, with one event") {
    TempDir dir;
    auto daemons = Daemons(dir.path(), 2);
    ClaimRequest r = testing::ClaimReq("w1", kT0, 1'000);
    r.max_attempts = 1;
    REQUIRE(daemons[0]->journal().Claim(r).ok());
    r.now_ms = kT0 + 5'000;
    constexpr int kThreads = 8;
    std::latch start(kThreads);
    std::atomic<int> dead{0}, other{0}, buried{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) {
      threads.emplace_back([&, i] {
        start.arrive_and_wait();
        StatusOr<ClaimResult> c = daemons[i % 2]->journal().Claim(r);
        (c.ok() && c->outcome == ClaimOutcome::kDead && c->item.lease_token.empty()) ? ++dead
                                                                                     : ++other;
        if (c.ok() && c->buried) ++buried;
      });
    }
    for (std::thread& t : threads) t.join();
    CHECK(dead.load() == kThreads);
    CHECK(other.load() == 0);
    CHECK(buried.load() == 1);  // one claim says it wrote the dead letter
    auto raw = RawPool(dir.path());
    CHECK(Count(*raw, "SELECT count(*) FROM outbox WHERE type = 'work.dead_letter'") == 1);
  }

  TEST_CASE("batches and single claims from three daemons over the same work: one winner each") {
    TempDir dir;
    auto daemons = Daemons(dir.path(), 3);
    constexpr int kWork = 24;
    constexpr int kThreads = 9;
    std::latch start(kThreads);
    std::mutex mu;
    std::map<std::string, int> winners;
    std::atomic<int> errors{0};
    auto record = [&](const StatusOr<JournalOpResult>& r, const std::string& id) {
      if (!r.ok()) {
        ++errors;
        MESSAGE(r.status().ToString());
      } else if (r->outcome == ClaimOutcome::kClaimed) {
        std::lock_guard<std::mutex> lock(mu);
        ++winners[id];
      } else if (r->outcome != ClaimOutcome::kBusy) {
        ++errors;
      }
    };
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        Journal& j = daemons[t % 3]->journal();
        std::vector<JournalOp> batch;
        for (int w = 0; w < kWork; ++w) {
          batch.push_back(
              JournalOp::Claim(testing::ClaimReq("w" + std::to_string(w), kT0, 60'000)));
        }
        std::shuffle(batch.begin(), batch.end(), std::mt19937(static_cast<unsigned>(t)));
        if (t % 3 == 1) batch.push_back(batch.front());  // a repeat: the locking path
        start.arrive_and_wait();
        if (t % 3 == 2) {
          for (const JournalOp& op : batch) {
            StatusOr<ClaimResult> c = j.Claim(op.claim);
            record(c.ok() ? StatusOr<JournalOpResult>(
                                JournalOpResult{.outcome = c->outcome, .item = c->item})
                          : StatusOr<JournalOpResult>(c.status()),
                   op.claim.work_id);
          }
          return;
        }
        std::vector<StatusOr<JournalOpResult>> out = j.FinishOps(j.BeginOps(batch, nullptr));
        for (size_t i = 0; i < out.size(); ++i) record(out[i], batch[i].claim.work_id);
      });
    }
    for (std::thread& t : threads) t.join();
    CHECK(errors.load() == 0);
    REQUIRE(winners.size() == kWork);
    for (const auto& winner : winners) CHECK_MESSAGE(winner.second == 1, winner.first);
  }

  TEST_CASE("pending ops hold no lock on PostgreSQL, so a kSkipBusy batch skips nothing") {
    TempDir dir;
    auto store = OpenStore(dir.path());
    Journal& j = store->journal();
    std::vector<JournalOp> first = {JournalOp::Claim(testing::ClaimReq("x", kT0, 60'000))};
    std::unique_ptr<Journal::PendingOps> held = j.BeginOps(first, nullptr);
    CHECK(held->Ready());  // committed before BeginOps returned
    std::vector<JournalOp> second = {
        JournalOp::Claim(testing::ClaimReq("x", kT0 + 120'000, 60'000))};
    std::unique_ptr<Journal::PendingOps> next =
        j.BeginOps(second, nullptr, Journal::LockWait::kSkipBusy);
    CHECK(next->Skipped().empty());
    std::vector<StatusOr<JournalOpResult>> took = j.FinishOps(std::move(next));
    std::vector<StatusOr<JournalOpResult>> won = j.FinishOps(std::move(held));
    REQUIRE((won[0].ok() && took[0].ok()));
    CHECK(won[0]->outcome == ClaimOutcome::kClaimed);
    CHECK(took[0]->outcome == ClaimOutcome::kClaimed);  // the first lease had expired
    CHECK(took[0]->item.attempt == 2);
  }

  TEST_CASE("args, identity and results are stored as sent; text with NUL is refused") {
    TempDir dir;
    auto store = OpenStore(dir.path());
    Journal& j = store->journal();
    ClaimRequest r = testing::ClaimReq("w1", kT0);
    r.args = Json{{"z", 1}, {"a", {1.5, "\"quoted\\", nullptr}}, {"nul", std::string("a\0b", 3)}};
    r.identity = Json{{"big", 18446744073709551615ULL}};
    StatusOr<ClaimResult> c = j.Claim(r);
    REQUIRE_MESSAGE(c.ok(), c.status().ToString());
    CHECK(j.Get("w1")->args == r.args);
    CHECK(j.Get("w1")->identity == r.identity);
    REQUIRE(j.Complete("w1", c->item.lease_token, Json::array({"x", 2}), "", kT0 + 1).ok());
    CHECK(j.Get("w1")->result == Json::array({"x", 2}));

    ClaimRequest bad = testing::ClaimReq("w2", kT0);
    bad.kind = std::string("k\0ind", 5);
    CHECK(j.Claim(bad).status().code() == Code::kInvalidArgument);
    CHECK(j.Claim(bad).status().field() == "/kind");
    CHECK(j.Get("w2").status().code() == Code::kNotFound);
    ClaimRequest bad_call = testing::ClaimReq("w3", kT0);
    bad_call.call_id = "\xff";
    CHECK(j.Claim(bad_call).status().field() == "/call_id");
    CHECK(j.Get("w3").status().code() == Code::kNotFound);
  }
}

}  // namespace
}  // namespace idem
