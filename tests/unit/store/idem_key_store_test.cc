#include <doctest/doctest.h>

#include <atomic>
#include <latch>
#include <string>
#include <thread>
#include <vector>

#include "daemon/store/rocksdb/rocksdb_database.h"
#include "daemon/store/rocksdb/rocksdb_idem_key_store.h"
#include "daemon/store/store.h"
#include "tests/unit/store/store_test_util.h"

namespace idem {
namespace {

using testing::OpenStore;
using testing::TempDir;

constexpr int64_t kT0 = 1'700'000'000'000;
constexpr int64_t kTtl = 24 * 3600 * 1000;
constexpr int64_t kLease = 30'000;

BeginResult MustBegin(IdemKeyStore& s, const std::string& key, const std::string& fp,
                      int64_t now_ms, int64_t ttl_ms = kTtl) {
  StatusOr<BeginResult> r = s.Begin("tok:POST /v1/apply", key, fp, "req-1", now_ms, ttl_ms, kLease);
  REQUIRE_MESSAGE(r.ok(), r.status().ToString());
  return std::move(r).value();
}

Status MustFinish(IdemKeyStore& s, const std::string& key, const std::string& fp, int64_t now_ms) {
  return s.Finish("tok:POST /v1/apply", key, fp, 201, R"({"id":1})", "application/json", now_ms);
}

TEST_CASE("a new idempotency key is taken, then replayed with the stored response") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  IdemKeyStore& s = store->idem_keys();
  BeginResult b = MustBegin(s, "k1", "fp-a", kT0);
  CHECK(b.outcome == BeginOutcome::kNew);
  CHECK(b.record.state == IdemRecord::State::kInProgress);
  CHECK(b.record.lease_until_ms == kT0 + kLease);
  CHECK(b.record.expires_at_ms == kT0 + kTtl);

  REQUIRE(MustFinish(s, "k1", "fp-a", kT0 + 10).ok());
  BeginResult replay = MustBegin(s, "k1", "fp-a", kT0 + 20);
  CHECK(replay.outcome == BeginOutcome::kReplay);
  CHECK(replay.record.response_status == 201);
  CHECK(replay.record.response_body == R"({"id":1})");
  CHECK(replay.record.response_content_type == "application/json");
  CHECK(replay.record.request_id == "req-1");
}

TEST_CASE("an idempotency key reused with another fingerprint is a mismatch") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  IdemKeyStore& s = store->idem_keys();
  MustBegin(s, "k1", "fp-a", kT0);
  CHECK(MustBegin(s, "k1", "fp-b", kT0 + 1).outcome == BeginOutcome::kMismatch);
  REQUIRE(MustFinish(s, "k1", "fp-a", kT0 + 2).ok());
  BeginResult m = MustBegin(s, "k1", "fp-b", kT0 + 3);
  CHECK(m.outcome == BeginOutcome::kMismatch);
  CHECK(m.record.fingerprint == "fp-a");
  CHECK(MustFinish(s, "k1", "fp-b", kT0 + 4).code() == Code::kFailedPrecondition);
}

TEST_CASE("a key in progress under a live lease is in flight") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  IdemKeyStore& s = store->idem_keys();
  MustBegin(s, "k1", "fp-a", kT0);
  BeginResult again = MustBegin(s, "k1", "fp-a", kT0 + kLease - 1);
  CHECK(again.outcome == BeginOutcome::kInFlight);
  CHECK(again.record.lease_until_ms == kT0 + kLease);
}

TEST_CASE("a key whose owner's lease expired is taken over") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  IdemKeyStore& s = store->idem_keys();
  MustBegin(s, "k1", "fp-a", kT0);
  BeginResult takeover = MustBegin(s, "k1", "fp-a", kT0 + kLease);
  CHECK(takeover.outcome == BeginOutcome::kNew);
  CHECK(takeover.record.lease_until_ms == kT0 + 2 * kLease);
  CHECK(MustBegin(s, "k1", "fp-a", kT0 + kLease + 1).outcome == BeginOutcome::kInFlight);
}

TEST_CASE("finishing a key twice keeps the first response") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  IdemKeyStore& s = store->idem_keys();
  MustBegin(s, "k1", "fp-a", kT0);
  REQUIRE(MustFinish(s, "k1", "fp-a", kT0 + 1).ok());
  CHECK(s.Finish("tok:POST /v1/apply", "k1", "fp-a", 500, "late", "text/plain", kT0 + 2).ok());
  CHECK(s.Get("tok:POST /v1/apply", "k1")->response_status == 201);
  CHECK(s.Finish("tok:POST /v1/apply", "absent", "fp-a", 200, "", "", kT0).code() ==
        Code::kFailedPrecondition);
}

TEST_CASE("an abandoned key can be used again") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  IdemKeyStore& s = store->idem_keys();
  MustBegin(s, "k1", "fp-a", kT0);
  CHECK(s.Abandon("tok:POST /v1/apply", "k1", "fp-b").code() == Code::kFailedPrecondition);
  REQUIRE(s.Abandon("tok:POST /v1/apply", "k1", "fp-a").ok());
  CHECK(s.Get("tok:POST /v1/apply", "k1").status().code() == Code::kNotFound);
  CHECK(s.Abandon("tok:POST /v1/apply", "k1", "fp-a").ok());  // absent: no-op
  CHECK(MustBegin(s, "k1", "fp-b", kT0 + 1).outcome == BeginOutcome::kNew);
  REQUIRE(MustFinish(s, "k1", "fp-b", kT0 + 2).ok());
  CHECK(s.Abandon("tok:POST /v1/apply", "k1", "fp-b").code() == Code::kFailedPrecondition);
}

TEST_CASE("keys are scoped: the same key in two scopes is two records") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  IdemKeyStore& s = store->idem_keys();
  CHECK(s.Begin("a", "bk", "fp", "r", kT0, kTtl, kLease)->outcome == BeginOutcome::kNew);
  CHECK(s.Begin("ab", "k", "fp", "r", kT0, kTtl, kLease)->outcome == BeginOutcome::kNew);
  CHECK(s.Begin("b", "bk", "fp", "r", kT0, kTtl, kLease)->outcome == BeginOutcome::kNew);
}

TEST_CASE("an expired key is new again and the sweep deletes expired keys") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  IdemKeyStore& s = store->idem_keys();
  MustBegin(s, "short", "fp-a", kT0, 1'000);
  REQUIRE(MustFinish(s, "short", "fp-a", kT0 + 1).ok());
  MustBegin(s, "long", "fp-a", kT0, 10'000);
  MustBegin(s, "forever", "fp-a", kT0, 0);

  CHECK(MustBegin(s, "short", "fp-b", kT0 + 999).outcome == BeginOutcome::kMismatch);
  BeginResult fresh = MustBegin(s, "short", "fp-b", kT0 + 1'000, 1'000);
  CHECK(fresh.outcome == BeginOutcome::kNew);
  CHECK(fresh.record.expires_at_ms == kT0 + 2'000);

  CHECK(s.SweepExpired(kT0 + 1'999, 100).value() == 0);
  // Both are still held (in progress under their 30 s leases): not over.
  CHECK(s.SweepExpired(kT0 + 10'000, 100).value() == 0);
  CHECK(s.SweepExpired(kT0 + 1'000 + kLease, 100).value() == 2);
  CHECK(s.Get("tok:POST /v1/apply", "short").status().code() == Code::kNotFound);
  CHECK(s.Get("tok:POST /v1/apply", "long").status().code() == Code::kNotFound);
  CHECK(s.Get("tok:POST /v1/apply", "forever").ok());
  CHECK(s.SweepExpired(kT0 + 100'000'000, 100).value() == 0);
}

TEST_CASE("64 concurrent Begin calls of one key give exactly one kNew") {
  TempDir dir;
  auto store = OpenStore(dir.path(), /*sync=*/true);
  constexpr int kThreads = 64;
  std::latch start(kThreads);
  std::atomic<int> fresh{0}, in_flight{0}, other{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&] {
      start.arrive_and_wait();
      StatusOr<BeginResult> r =
          store->idem_keys().Begin("scope", "storm", "fp", "req", kT0, kTtl, kLease);
      if (!r.ok()) {
        ++other;
      } else if (r->outcome == BeginOutcome::kNew) {
        ++fresh;
      } else if (r->outcome == BeginOutcome::kInFlight) {
        ++in_flight;
      } else {
        ++other;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  CHECK(fresh.load() == 1);
  CHECK(in_flight.load() == kThreads - 1);
  CHECK(other.load() == 0);
}

TEST_CASE("Begin refuses a negative ttl and a non-positive lease") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  CHECK(store->idem_keys().Begin("s", "k", "f", "r", kT0, -1, kLease).status().code() ==
        Code::kInvalidArgument);
  CHECK(store->idem_keys().Begin("s", "k", "f", "r", kT0, kTtl, 0).status().code() ==
        Code::kInvalidArgument);
}

TEST_CASE("a released key runs again with its payload and stays bound to it") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  IdemKeyStore& s = store->idem_keys();
  const std::string scope = "tok:POST /v1/apply";
  MustBegin(s, "k1", "fp-a", kT0);
  REQUIRE(s.Release(scope, "k1", "fp-a").ok());
  IdemRecord released = s.Get(scope, "k1").value();
  CHECK(released.state == IdemRecord::State::kReleased);
  CHECK(released.response_body.empty());  // nothing stored to replay
  // Another payload under the key is still refused, before and after a retake.
  CHECK(MustBegin(s, "k1", "fp-b", kT0 + 1).outcome == BeginOutcome::kMismatch);
  BeginResult again = MustBegin(s, "k1", "fp-a", kT0 + 2);  // the lease is live, yet it runs
  CHECK(again.outcome == BeginOutcome::kNew);
  CHECK(again.record.expires_at_ms == kT0 + kTtl);  // the window began at the first Begin
  CHECK(MustBegin(s, "k1", "fp-b", kT0 + 3).outcome == BeginOutcome::kMismatch);
  REQUIRE(MustFinish(s, "k1", "fp-a", kT0 + 4).ok());
  CHECK(MustBegin(s, "k1", "fp-a", kT0 + 5).outcome == BeginOutcome::kReplay);
  CHECK(s.Release(scope, "k1", "fp-a").code() == Code::kFailedPrecondition);
}

TEST_CASE("abandoning a retaken key keeps it bound to the payload that once ran") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  IdemKeyStore& s = store->idem_keys();
  const std::string scope = "tok:POST /v1/apply";
  MustBegin(s, "k1", "fp-a", kT0);
  REQUIRE(s.Release(scope, "k1", "fp-a").ok());
  MustBegin(s, "k1", "fp-a", kT0 + 1);
  REQUIRE(s.Abandon(scope, "k1", "fp-a").ok());
  CHECK(s.Get(scope, "k1").value().state == IdemRecord::State::kReleased);
  CHECK(MustBegin(s, "k1", "fp-b", kT0 + 2).outcome == BeginOutcome::kMismatch);
  CHECK(MustBegin(s, "k1", "fp-a", kT0 + 3).outcome == BeginOutcome::kNew);
}

TEST_CASE("extending a held key's lease keeps a retry in flight past the first lease") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  IdemKeyStore& s = store->idem_keys();
  const std::string scope = "tok:POST /v1/apply";
  MustBegin(s, "long", "fp-a", kT0);
  REQUIRE(s.ExtendLease(scope, "long", "fp-a", "req-1", kT0 + kLease / 2, kLease).ok());
  CHECK(s.Get(scope, "long").value().lease_until_ms == kT0 + kLease / 2 + kLease);
  // Past the first lease, a retry is still in flight, not a takeover.
  CHECK(MustBegin(s, "long", "fp-a", kT0 + kLease).outcome == BeginOutcome::kInFlight);
  // A renewal never shortens the lease.
  REQUIRE(s.ExtendLease(scope, "long", "fp-a", "req-1", kT0 + kLease / 2, 1).ok());
  CHECK(s.Get(scope, "long").value().lease_until_ms == kT0 + kLease / 2 + kLease);
  // Once the extended lease is over too, the key is taken over.
  CHECK(MustBegin(s, "long", "fp-a", kT0 + kLease / 2 + kLease).outcome == BeginOutcome::kNew);
}

TEST_CASE(
    "a key held past its window stays in flight while its holder renews it, and its holder can "
    "still finish it") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  IdemKeyStore& s = store->idem_keys();
  const std::string scope = "tok:POST /v1/apply";
  const int64_t window = 5'000;  // shorter than the run: idempotency.routes set it so
  MustBegin(s, "run", "fp-a", kT0, window);
  // A retry at 7 s, while the first still runs: in flight, not a second run.
  CHECK(MustBegin(s, "run", "fp-a", kT0 + 7'000, window).outcome == BeginOutcome::kInFlight);
  REQUIRE(s.ExtendLease(scope, "run", "fp-a", "req-1", kT0 + kLease - 1, kLease).ok());
  CHECK(MustBegin(s, "run", "fp-a", kT0 + kLease + 1, window).outcome == BeginOutcome::kInFlight);
  // The sweep leaves it, and finds it again once it is done.
  CHECK(s.SweepExpired(kT0 + kLease + 1, 100).value() == 0);
  REQUIRE(s.Get(scope, "run").ok());
  REQUIRE(MustFinish(s, "run", "fp-a", kT0 + kLease + 2).ok());
  CHECK(s.Get(scope, "run")->state == IdemRecord::State::kCompleted);
  // Its window was over before it finished: the answer is not kept.
  CHECK(s.SweepExpired(kT0 + kLease + 3, 100).value() == 1);
  CHECK(MustBegin(s, "run", "fp-a", kT0 + kLease + 3, window).outcome == BeginOutcome::kNew);
}

TEST_CASE("only the holder of a key in progress may extend its lease") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  IdemKeyStore& s = store->idem_keys();
  const std::string scope = "tok:POST /v1/apply";
  auto refused = [&](const std::string& key, const std::string& fp, const std::string& rid) {
    Status st = s.ExtendLease(scope, key, fp, rid, kT0 + 1, kLease);
    return st.code() == Code::kFailedPrecondition;
  };
  CHECK(refused("absent", "fp-a", "req-1"));
  MustBegin(s, "k", "fp-a", kT0);
  CHECK(refused("k", "fp-b", "req-1"));  // another payload
  CHECK(refused("k", "fp-a", "req-2"));  // another request
  CHECK(s.ExtendLease(scope, "k", "fp-a", "req-1", kT0 + 1, 0).code() == Code::kInvalidArgument);
  REQUIRE(s.Release(scope, "k", "fp-a").ok());
  CHECK(refused("k", "fp-a", "req-1"));  // released: the handler ended
  MustBegin(s, "done", "fp-a", kT0);
  REQUIRE(MustFinish(s, "done", "fp-a", kT0 + 1).ok());
  CHECK(refused("done", "fp-a", "req-1"));  // completed
  // A key another request took over after the lease ran out.
  MustBegin(s, "stale", "fp-a", kT0);
  StatusOr<BeginResult> taken =
      s.Begin(scope, "stale", "fp-a", "req-9", kT0 + kLease, kTtl, kLease);
  REQUIRE(taken.ok());
  REQUIRE(taken->outcome == BeginOutcome::kNew);
  CHECK(refused("stale", "fp-a", "req-1"));
  // Another instance's key (the store folder changed hands).
  MustBegin(s, "theirs", "fp-a", kT0);
  REQUIRE(store->meta().Put("store.instance_id", "inst_other").ok());
  store.reset();
  store = OpenStore(dir.path());
  CHECK(store->idem_keys().ExtendLease(scope, "theirs", "fp-a", "req-1", kT0 + 1, kLease).code() ==
        Code::kFailedPrecondition);
}

// RocksDB: one process owns the folder, and its instance id (meta
// "store.instance_id") survives a restart, so the restarted daemon knows its
// orphans. On PostgreSQL every process is a new instance (many daemons share
// the database); a dead daemon's keys are taken over after their lease
// (pg_decisions_keys_test.cc).
TEST_CASE("reopening a store releases its own keys in progress and leaves others' leases" *
          doctest::test_suite("rocksdb")) {
  TempDir dir;
  const std::string scope = "tok:POST /v1/apply";
  {
    auto store = OpenStore(dir.path());
    MustBegin(store->idem_keys(), "mine", "fp-a", kT0);  // its process then dies
  }
  {
    auto store = OpenStore(dir.path());
    CHECK(store->idem_keys().Get(scope, "mine").value().state == IdemRecord::State::kInProgress);
    StatusOr<size_t> released = store->idem_keys().ReleaseOwnInProgress();
    REQUIRE(released.ok());
    CHECK(*released == 1);
    // Within the dead owner's lease, and still a retry runs at once.
    CHECK(MustBegin(store->idem_keys(), "mine", "fp-a", kT0 + 1).outcome == BeginOutcome::kNew);
    CHECK(MustBegin(store->idem_keys(), "mine", "fp-b", kT0 + 2).outcome ==
          BeginOutcome::kMismatch);
    MustBegin(store->idem_keys(), "theirs", "fp-a", kT0);
    // From now on the folder belongs to another instance.
    REQUIRE(store->meta().Put("store.instance_id", "inst_other").ok());
  }
  auto store = OpenStore(dir.path());
  StatusOr<size_t> released = store->idem_keys().ReleaseOwnInProgress();
  REQUIRE(released.ok());
  CHECK(*released == 0);
  CHECK(MustBegin(store->idem_keys(), "theirs", "fp-a", kT0 + 3).outcome ==
        BeginOutcome::kInFlight);
  CHECK(MustBegin(store->idem_keys(), "theirs", "fp-a", kT0 + kLease).outcome ==
        BeginOutcome::kNew);
}

// RocksDB's "idem_in_progress" index and its upgrade path.
TEST_CASE("a store from before the in-progress index still has its orphans released once" *
          doctest::test_suite("rocksdb")) {
  TempDir dir;
  const std::string scope = "tok:POST /v1/apply";
  {
    auto store = OpenStore(dir.path());
    REQUIRE(store->idem_keys().ReleaseOwnInProgress().ok());  // a fresh store: marks it indexed
    MustBegin(store->idem_keys(), "mine", "fp-a", kT0);
    MustBegin(store->idem_keys(), "done", "fp-a", kT0);
    REQUIRE(
        store->idem_keys().Finish(scope, "done", "fp-a", 200, "{}", "application/json", kT0).ok());
  }
  // As an older idem left it: no index entries and no marker. One entry:
  // "mine"; "done" left the index when it finished.
  CHECK(testing::ForgetIndex(dir.path(), rocks::Family::kIdemInProgress,
                             rocks::RocksIdemKeyStore::kIndexedMarker) == 1);
  for (size_t expected : {1, 0}) {
    auto store = OpenStore(dir.path());
    StatusOr<size_t> released = store->idem_keys().ReleaseOwnInProgress();
    REQUIRE(released.ok());
    CHECK(*released == expected);
    CHECK(store->idem_keys().Get(scope, "mine").value().state == IdemRecord::State::kReleased);
    CHECK(store->idem_keys().Get(scope, "done").value().state == IdemRecord::State::kCompleted);
  }
}

}  // namespace
}  // namespace idem
