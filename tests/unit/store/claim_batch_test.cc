// Journal::ClaimMany / BeginOps / FinishOps: a batch of claims, completes
// and fails is one durable write with the outcomes single calls would get.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <latch>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "daemon/core/failpoints.h"
#include "daemon/store/store.h"
#include "tests/unit/store/store_test_util.h"

namespace idem {
namespace {

using testing::kT0;
using testing::OpenStore;
using testing::TempDir;

// Leases outlive every test here: a second claim of held work is busy.
ClaimRequest Req(const std::string& work_id, int64_t now_ms) {
  return testing::ClaimReq(work_id, now_ms, /*lease_ms=*/60'000);
}

std::vector<JournalOp> Claims(const std::vector<ClaimRequest>& reqs) {
  std::vector<JournalOp> ops;
  for (const ClaimRequest& r : reqs) ops.push_back(JournalOp::Claim(r));
  return ops;
}

JournalOp CompleteOp(const std::string& work_id, const std::string& token, int64_t now_ms,
                     Json result = Json{{"ok", true}}) {
  JournalOp op;
  op.type = JournalOp::Type::kComplete;
  op.work_id = work_id;
  op.lease_token = token;
  op.result = std::move(result);
  op.now_ms = now_ms;
  return op;
}

// The outcomes a batch answers with, for a claim's or an op's result. An
// answer that does not grant the lease never carries its token.
template <class Result>
void CheckGranted(const StatusOr<Result>& r) {
  REQUIRE(r.ok());
  CHECK(r->outcome == ClaimOutcome::kClaimed);
  CHECK(r->item.lease_token.size() == 32);
}

template <class Result>
void CheckBusy(const StatusOr<Result>& r) {
  REQUIRE(r.ok());
  CHECK(r->outcome == ClaimOutcome::kBusy);
  CHECK(r->item.lease_token.empty());
}

template <class Result>
void CheckDoneWith(const StatusOr<Result>& r, const Json& result, const std::string& external_ref) {
  REQUIRE(r.ok());
  CHECK(r->outcome == ClaimOutcome::kDone);
  CHECK(r->item.result == result);
  CHECK(r->item.external_ref == external_ref);
  CHECK(r->item.lease_token.empty());
}

JournalOp FailOp(const std::string& work_id, const std::string& token, int64_t now_ms,
                 bool retryable, int64_t delay_ms = 0) {
  JournalOp op;
  op.type = JournalOp::Type::kFail;
  op.work_id = work_id;
  op.lease_token = token;
  op.error = "boom";
  op.retryable = retryable;
  op.now_ms = now_ms;
  op.retry_delay_ms = [delay_ms](const WorkItem&) { return delay_ms; };
  return op;
}

TEST_CASE("a batch of claims gives each claim the outcome a single claim would get") {
  TempDir dir;
  auto store = OpenStore(dir.path(), /*sync=*/true);
  Journal& j = store->journal();
  StatusOr<ClaimResult> done = j.Claim(Req("done", kT0));
  REQUIRE(done.ok());
  REQUIRE(j.Complete("done", done->item.lease_token, Json{{"n", 1}}, "ref-1", kT0).ok());
  REQUIRE(j.Claim(Req("held", kT0)).ok());
  ClaimRequest invalid = Req("bad", kT0);
  invalid.lease_ms = 0;

  std::vector<ClaimRequest> batch = {Req("new-1", kT0),
                                     Req("done", kT0 + 1),
                                     Req("held", kT0 + 1),
                                     Req("new-2", kT0),
                                     Req("new-1", kT0),  // the same work again in the batch
                                     invalid};
  std::vector<StatusOr<ClaimResult>> out = j.ClaimMany(batch);
  REQUIRE(out.size() == batch.size());
  CheckGranted(out[0]);
  CheckDoneWith(out[1], Json{{"n", 1}}, "ref-1");
  CheckBusy(out[2]);
  CheckGranted(out[3]);
  CheckBusy(out[4]);  // sees the claim before it
  CHECK(out[5].status().code() == Code::kInvalidArgument);

  // The winners' leases are real: their tokens complete the work.
  CHECK(j.Complete("new-1", out[0]->item.lease_token, 1, "", kT0 + 2).ok());
  CHECK(j.Complete("new-2", out[3]->item.lease_token, 2, "", kT0 + 2).ok());
  CHECK(j.Get("bad").status().code() == Code::kNotFound);
}

TEST_CASE("claims of a batch survive a reopen of the store") {
  TempDir dir;
  std::string token;
  {
    auto store = OpenStore(dir.path(), /*sync=*/true);
    std::vector<ClaimRequest> batch = {Req("a", kT0), Req("b", kT0), Req("c", kT0)};
    std::vector<StatusOr<ClaimResult>> out = store->journal().ClaimMany(batch);
    for (const auto& r : out) REQUIRE((r.ok() && r->outcome == ClaimOutcome::kClaimed));
    token = out[1]->item.lease_token;
  }
  auto store = OpenStore(dir.path(), /*sync=*/true);
  for (const char* id : {"a", "b", "c"}) {
    StatusOr<WorkItem> w = store->journal().Get(id);
    REQUIRE(w.ok());
    CHECK(w->state == WorkState::kRunning);
  }
  CHECK(store->journal().Complete("b", token, 1, "", kT0 + 1).ok());
}

TEST_CASE("a failed batch write fails every writing claim and stores none of them") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  Journal& j = store->journal();
  StatusOr<ClaimResult> done = j.Claim(Req("done", kT0));
  REQUIRE(done.ok());
  REQUIRE(j.Complete("done", done->item.lease_token, 1, "", kT0).ok());

  REQUIRE(Failpoints::Set("store.write=error").ok());
  std::vector<ClaimRequest> batch = {Req("x", kT0), Req("done", kT0), Req("y", kT0)};
  std::vector<StatusOr<ClaimResult>> out = j.ClaimMany(batch);
  Failpoints::Clear();
  CHECK(out[0].status().code() == Code::kUnavailable);
  CHECK(out[0].status().retryable());
  REQUIRE(out[1].ok());  // answered from a read: no write needed
  CHECK(out[1]->outcome == ClaimOutcome::kDone);
  CHECK(out[2].status().code() == Code::kUnavailable);
  CHECK(j.Get("x").status().code() == Code::kNotFound);
  CHECK(j.Get("y").status().code() == Code::kNotFound);
  // Nothing is left locked: the same claims go through afterwards.
  std::vector<StatusOr<ClaimResult>> again = j.ClaimMany(batch);
  CHECK((again[0].ok() && again[0]->outcome == ClaimOutcome::kClaimed));
  CHECK((again[2].ok() && again[2]->outcome == ClaimOutcome::kClaimed));
}

TEST_CASE("a batch begun without waiting becomes ready and durable once on_durable has run") {
  TempDir dir;
  auto store = OpenStore(dir.path(), /*sync=*/true);
  Journal& j = store->journal();
  std::mutex mu;
  std::condition_variable cv;
  bool durable = false;
  std::vector<JournalOp> batch = Claims({Req("p", kT0), Req("q", kT0)});
  std::unique_ptr<Journal::PendingOps> pending = j.BeginOps(batch, [&] {
    std::lock_guard<std::mutex> lock(mu);
    durable = true;
    cv.notify_all();
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    REQUIRE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return durable; }));
  }
  CHECK(pending->Ready());
  CHECK(pending->Skipped().empty());
  std::vector<StatusOr<JournalOpResult>> out = j.FinishOps(std::move(pending));
  CHECK((out[0].ok() && out[0]->outcome == ClaimOutcome::kClaimed));
  CHECK((out[1].ok() && out[1]->outcome == ClaimOutcome::kClaimed));
  CHECK(j.Get("p")->state == WorkState::kRunning);
}

// RocksDB holds the stripes of pending ops until FinishOps; the PostgreSQL
// journal commits in BeginOps and holds nothing (pg_journal_test.cc).
TEST_CASE("a batch begun with kSkipBusy leaves work whose lock is held by pending claims" *
          doctest::test_suite("rocksdb")) {
  TempDir dir;
  auto store = OpenStore(dir.path());
  Journal& j = store->journal();
  std::vector<JournalOp> first = Claims({Req("x", kT0)});
  std::unique_ptr<Journal::PendingOps> held = j.BeginOps(first, nullptr);
  // The same thread still holds x's stripe: waiting for it would deadlock.
  // The second claim comes after the first lease would expire, so it must
  // write (and lock) whether or not the first batch's write has landed.
  std::vector<ClaimRequest> second = {Req("x", kT0 + 120'000)};
  std::unique_ptr<Journal::PendingOps> skipping =
      j.BeginOps(Claims(second), nullptr, Journal::LockWait::kSkipBusy);
  REQUIRE(skipping->Skipped() == std::vector<size_t>{0});
  std::vector<StatusOr<JournalOpResult>> skipped = j.FinishOps(std::move(skipping));
  CHECK(skipped[0].status().code() == Code::kUnavailable);
  std::vector<StatusOr<JournalOpResult>> won = j.FinishOps(std::move(held));
  CHECK((won[0].ok() && won[0]->outcome == ClaimOutcome::kClaimed));
  // Begun again once the first batch is finished: it takes over the lease.
  std::vector<StatusOr<ClaimResult>> retried = j.ClaimMany(second);
  REQUIRE(retried[0].ok());
  CHECK(retried[0]->outcome == ClaimOutcome::kClaimed);
  CHECK(retried[0]->item.attempt == 2);
}

TEST_CASE("a batch mixes claims, completes and fails, each with the outcome a single call gets") {
  TempDir dir;
  auto store = OpenStore(dir.path(), /*sync=*/true);
  Journal& j = store->journal();
  StatusOr<ClaimResult> a = j.Claim(Req("a", kT0));
  StatusOr<ClaimResult> b = j.Claim(Req("b", kT0));
  StatusOr<ClaimResult> c = j.Claim(Req("c", kT0));
  REQUIRE((a.ok() && b.ok() && c.ok()));
  ClaimRequest last = Req("d", kT0);
  last.max_attempts = 1;
  StatusOr<ClaimResult> d = j.Claim(last);
  REQUIRE(d.ok());

  std::vector<JournalOp> batch = {
      CompleteOp("a", a->item.lease_token, kT0 + 5, Json{{"n", 1}}),
      CompleteOp("a", a->item.lease_token, kT0 + 6),  // retried by its holder: a no-op
      CompleteOp("b", "not-the-token", kT0 + 5),      // stale
      FailOp("c", c->item.lease_token, kT0 + 5, /*retryable=*/true, /*delay_ms=*/700),
      FailOp("d", d->item.lease_token, kT0 + 5, /*retryable=*/true),  // no attempts left
      CompleteOp("nope", "t", kT0 + 5),
      JournalOp::Claim(Req("new", kT0 + 5)),
  };
  std::vector<StatusOr<JournalOpResult>> out = j.FinishOps(j.BeginOps(batch, nullptr));
  REQUIRE(out.size() == batch.size());
  REQUIRE(out[0].ok());
  CHECK(out[0]->item.state == WorkState::kDone);
  CHECK_FALSE(out[0]->repeated);
  CHECK(out[0]->item.lease_token.empty());
  REQUIRE(out[1].ok());
  CHECK(out[1]->repeated);
  CHECK(out[1]->item.result == Json{{"n", 1}});
  REQUIRE(out[2].ok());
  CHECK(out[2]->stale_lease);
  CHECK(out[2]->item.state == WorkState::kRunning);
  CHECK(out[2]->item.lease_token.empty());
  REQUIRE(out[3].ok());
  CHECK(out[3]->item.state == WorkState::kFailed);
  CHECK(out[3]->item.next_attempt_at_ms == kT0 + 5 + 700);
  REQUIRE(out[4].ok());
  CHECK(out[4]->outcome == ClaimOutcome::kDead);
  CHECK(out[4]->item.state == WorkState::kDead);
  CHECK(out[5].status().code() == Code::kNotFound);
  REQUIRE(out[6].ok());
  CHECK(out[6]->outcome == ClaimOutcome::kClaimed);

  // What was written is what a reader sees, and the unwritten stays as it was.
  CHECK(j.Get("a")->result == Json{{"n", 1}});
  CHECK(j.Get("b")->state == WorkState::kRunning);
  CHECK(j.Get("c")->state == WorkState::kFailed);
  CHECK(j.Get("d")->state == WorkState::kDead);
  CHECK(j.Get("new")->state == WorkState::kRunning);
  // The single call agrees with the batch about a retried complete, and
  // refuses one that brings another result: the first stands.
  CHECK(j.Complete("a", a->item.lease_token, Json{{"n", 1}}, "", kT0 + 9).ok());
  Status other = j.Complete("a", a->item.lease_token, Json{{"n", 2}}, "", kT0 + 9);
  CHECK(other.code() == Code::kFailedPrecondition);
  CHECK(other.field() == "/result");
  CHECK(j.Get("a")->result == Json{{"n", 1}});
}

TEST_CASE("a batch reads records in table files as single claims do, op by op in its order") {
  TempDir dir;
  std::string held_token;
  std::string owed_token;
  {
    auto store = OpenStore(dir.path(), /*sync=*/true);
    Journal& j = store->journal();
    StatusOr<ClaimResult> done = j.Claim(Req("done", kT0));
    REQUIRE(done.ok());
    REQUIRE(j.Complete("done", done->item.lease_token, Json{{"n", 7}}, "ref-7", kT0).ok());
    StatusOr<ClaimResult> held = j.Claim(Req("held", kT0));
    StatusOr<ClaimResult> owed = j.Claim(Req("owed", kT0));
    REQUIRE((held.ok() && owed.ok()));
    held_token = held->item.lease_token;
    owed_token = owed->item.lease_token;
  }  // a clean close flushes every family: the records are now in table files
  auto store = OpenStore(dir.path(), /*sync=*/true);
  Journal& j = store->journal();
  ClaimRequest invalid = Req("bad", kT0);
  invalid.lease_ms = 0;
  std::vector<JournalOp> batch = {
      JournalOp::Claim(Req("held", kT0 + 1)),
      JournalOp::Claim(invalid),
      CompleteOp("owed", owed_token, kT0 + 1, Json{{"n", 8}}),
      JournalOp::Claim(Req("fresh", kT0 + 1)),
      JournalOp::Claim(Req("done", kT0 + 1)),
      CompleteOp("nope", "t", kT0 + 1),
      // Concurrent with the complete above: either order is one a single
      // claim could see (RocksDB answers it from the record as stored,
      // PostgreSQL after the complete).
      JournalOp::Claim(Req("owed", kT0 + 2)),
  };
  std::vector<StatusOr<JournalOpResult>> out = j.FinishOps(j.BeginOps(batch, nullptr));
  REQUIRE(out.size() == batch.size());
  CheckBusy(out[0]);
  CHECK(out[1].status().code() == Code::kInvalidArgument);
  REQUIRE(out[2].ok());
  CHECK(out[2]->item.state == WorkState::kDone);
  CheckGranted(out[3]);
  CheckDoneWith(out[4], Json{{"n", 7}}, "ref-7");
  CHECK(out[5].status().code() == Code::kNotFound);
  REQUIRE(out[6].ok());
  CHECK(out[6]->item.lease_token.empty());
  if (out[6]->outcome == ClaimOutcome::kDone) {
    CHECK(out[6]->item.result == Json{{"n", 8}});
  } else {
    CHECK(out[6]->outcome == ClaimOutcome::kBusy);
  }

  // Single claims, afterwards, agree with the batch and see what it wrote.
  CHECK(j.Claim(Req("done", kT0 + 3))->outcome == ClaimOutcome::kDone);
  CHECK(j.Claim(Req("owed", kT0 + 3))->item.result == Json{{"n", 8}});
  CHECK(j.Claim(Req("held", kT0 + 3))->outcome == ClaimOutcome::kBusy);
  CHECK(j.Complete("held", held_token, 1, "", kT0 + 3).ok());
  CHECK(j.Complete("fresh", out[3]->item.lease_token, 1, "", kT0 + 3).ok());
}

TEST_CASE("a claim and the complete of the same work in one batch: the complete sees the claim") {
  TempDir dir;
  auto store = OpenStore(dir.path(), /*sync=*/true);
  Journal& j = store->journal();
  StatusOr<ClaimResult> first = j.Claim(Req("w", kT0));
  REQUIRE(first.ok());
  // The lease expired; a new claim takes it over, and the old holder's
  // complete in the same batch must then be stale.
  std::vector<JournalOp> batch = {JournalOp::Claim(Req("w", kT0 + 120'000)),
                                  CompleteOp("w", first->item.lease_token, kT0 + 120'001)};
  std::vector<StatusOr<JournalOpResult>> out = j.FinishOps(j.BeginOps(batch, nullptr));
  REQUIRE((out[0].ok() && out[1].ok()));
  CHECK(out[0]->outcome == ClaimOutcome::kClaimed);
  CHECK(out[0]->item.attempt == 2);
  CHECK(out[1]->stale_lease);
  CHECK(j.Get("w")->state == WorkState::kRunning);
}

TEST_CASE("a failed write fails every complete in the batch and stores none") {
  TempDir dir;
  auto store = OpenStore(dir.path(), /*sync=*/true);
  Journal& j = store->journal();
  StatusOr<ClaimResult> a = j.Claim(Req("a", kT0));
  REQUIRE(a.ok());
  REQUIRE(Failpoints::Set("store.write=error").ok());
  std::vector<JournalOp> batch = {CompleteOp("a", a->item.lease_token, kT0 + 1)};
  std::vector<StatusOr<JournalOpResult>> out = j.FinishOps(j.BeginOps(batch, nullptr));
  Failpoints::Clear();
  CHECK_FALSE(out[0].ok());
  CHECK(j.Get("a")->state == WorkState::kRunning);
  CHECK(j.Complete("a", a->item.lease_token, Json{}, "", kT0 + 2).ok());
  // Written now, not taken for a retry of the failed write.
  CHECK(j.Get("a")->state == WorkState::kDone);
}

TEST_CASE("a batch after a write outside the batch lane works from the record that write stored") {
  TempDir dir;
  auto store = OpenStore(dir.path(), /*sync=*/true);
  Journal& j = store->journal();
  std::vector<StatusOr<JournalOpResult>> claimed =
      j.FinishOps(j.BeginOps(Claims({Req("w", kT0)}), nullptr));
  REQUIRE(claimed[0].ok());
  std::vector<JournalOp> fail = {FailOp("w", claimed[0]->item.lease_token, kT0 + 1, false)};
  std::vector<StatusOr<JournalOpResult>> failed = j.FinishOps(j.BeginOps(fail, nullptr));
  REQUIRE(failed[0].ok());
  REQUIRE(failed[0]->item.state == WorkState::kDead);
  // Requeue writes outside the lane: the next batch claims the requeued work.
  REQUIRE(j.Requeue("w", kT0 + 2).ok());
  std::vector<StatusOr<JournalOpResult>> again =
      j.FinishOps(j.BeginOps(Claims({Req("w", kT0 + 3)}), nullptr));
  REQUIRE(again[0].ok());
  CHECK(again[0]->outcome == ClaimOutcome::kClaimed);
  CHECK(again[0]->item.attempt == 1);
  // And a completion in a batch keeps what RecordExternalRef stored.
  REQUIRE(j.RecordExternalRef("w", again[0]->item.lease_token, "crm:9", kT0 + 4).ok());
  std::vector<JournalOp> done = {CompleteOp("w", again[0]->item.lease_token, kT0 + 5)};
  std::vector<StatusOr<JournalOpResult>> completed = j.FinishOps(j.BeginOps(done, nullptr));
  REQUIRE(completed[0].ok());
  CHECK(j.Get("w")->state == WorkState::kDone);
  CHECK(j.Get("w")->external_ref == "crm:9");
}

TEST_CASE("concurrent batches and single claims over the same work give one winner per work") {
  TempDir dir;
  auto store = OpenStore(dir.path(), /*sync=*/true);
  Journal& j = store->journal();
  constexpr int kWork = 24;
  constexpr int kBatchThreads = 6;
  constexpr int kSingleThreads = 6;
  std::latch start(kBatchThreads + kSingleThreads);
  std::mutex mu;
  std::map<std::string, int> winners;
  std::atomic<int> errors{0};
  auto record = [&](const StatusOr<ClaimResult>& r, const std::string& id) {
    if (!r.ok()) {
      ++errors;
    } else if (r->outcome == ClaimOutcome::kClaimed) {
      std::lock_guard<std::mutex> lock(mu);
      ++winners[id];
    } else if (r->outcome != ClaimOutcome::kBusy) {
      ++errors;
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kBatchThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<ClaimRequest> batch;
      for (int w = 0; w < kWork; ++w) batch.push_back(Req("w" + std::to_string(w), kT0));
      std::shuffle(batch.begin(), batch.end(), std::mt19937(static_cast<unsigned>(t)));
      start.arrive_and_wait();
      std::vector<StatusOr<ClaimResult>> out = j.ClaimMany(batch);
      for (size_t i = 0; i < out.size(); ++i) record(out[i], batch[i].work_id);
    });
  }
  for (int t = 0; t < kSingleThreads; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      for (int k = 0; k < kWork; ++k) {
        std::string id = "w" + std::to_string((k + t * 5) % kWork);
        record(j.Claim(Req(id, kT0)), id);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  CHECK(errors.load() == 0);
  REQUIRE(winners.size() == kWork);
  // Not a structured binding: CHECK_MESSAGE's lambda captures it (clang 14).
  for (const auto& winner : winners) CHECK_MESSAGE(winner.second == 1, winner.first);
}

}  // namespace
}  // namespace idem
