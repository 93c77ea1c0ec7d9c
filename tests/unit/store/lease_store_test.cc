#include <doctest/doctest.h>

#include <string>

#include "daemon/store/rocksdb/rocksdb_database.h"
#include "daemon/store/rocksdb/rocksdb_lease_store.h"
#include "daemon/store/store.h"
#include "tests/unit/store/store_test_util.h"

namespace idem {
namespace {

using testing::OpenStore;
using testing::TempDir;

constexpr int64_t kT0 = 1'700'000'000'000;

TEST_CASE("a named lease is acquired, held against others, renewed with its token, and expires") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  LeaseStore& s = store->leases();
  StatusOr<LeaseResult> a = s.Acquire("cron:digest", "run-1", "", 1'000, kT0);
  REQUIRE(a.ok());
  CHECK(a->outcome == LeaseOutcome::kAcquired);
  CHECK(a->lease.expires_at_ms == kT0 + 1'000);
  CHECK(!a->lease.token.empty());

  StatusOr<LeaseResult> held = s.Acquire("cron:digest", "run-2", "", 1'000, kT0 + 500);
  REQUIRE(held.ok());
  CHECK(held->outcome == LeaseOutcome::kHeld);
  CHECK(held->lease.holder == "run-1");

  StatusOr<LeaseResult> renewed =
      s.Acquire("cron:digest", "run-1", a->lease.token, 1'000, kT0 + 900);
  REQUIRE(renewed.ok());
  CHECK(renewed->outcome == LeaseOutcome::kRenewed);
  CHECK(renewed->lease.expires_at_ms == kT0 + 1'900);
  CHECK(renewed->lease.token == a->lease.token);
  CHECK(renewed->lease.acquired_at_ms == kT0);

  CHECK(s.Get("cron:digest", kT0 + 1'899)->holder == "run-1");
  CHECK(s.Get("cron:digest", kT0 + 1'900).status().code() == Code::kNotFound);

  StatusOr<LeaseResult> taken = s.Acquire("cron:digest", "run-2", "", 1'000, kT0 + 1'900);
  REQUIRE(taken.ok());
  CHECK(taken->outcome == LeaseOutcome::kAcquired);
  CHECK(taken->lease.holder == "run-2");
  CHECK(taken->lease.token != a->lease.token);
}

TEST_CASE("the holder's name alone does not renew a named lease: its token does") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  LeaseStore& s = store->leases();
  StatusOr<LeaseResult> a = s.Acquire("cron:x", "run-1", "", 1'000, kT0);
  REQUIRE(a.ok());
  StatusOr<LeaseResult> no_token = s.Acquire("cron:x", "run-1", "", 1'000, kT0 + 500);
  CHECK(no_token.status().code() == Code::kFailedPrecondition);
  CHECK(no_token.status().field() == "/token");
  StatusOr<LeaseResult> wrong = s.Acquire("cron:x", "run-1", "0123456789abcdef", 1'000, kT0 + 500);
  CHECK(wrong.status().code() == Code::kFailedPrecondition);
  // Refused renewals left the lease as it was.
  CHECK(s.Get("cron:x", kT0 + 999)->expires_at_ms == kT0 + 1'000);
  // Once it expired, the name takes it again with a new token.
  StatusOr<LeaseResult> again = s.Acquire("cron:x", "run-1", "", 1'000, kT0 + 1'000);
  REQUIRE(again.ok());
  CHECK(again->outcome == LeaseOutcome::kAcquired);
  CHECK(again->lease.token != a->lease.token);
}

TEST_CASE(
    "a renewal whose lease lapsed is refused, so its holder learns another may have run, and "
    "acquires anew") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  LeaseStore& l = store->leases();
  auto a = l.Acquire("nightly", "run-A", "", 2'000, kT0);
  REQUIRE(a.ok());
  // run-B takes it once it lapsed, and lets it go.
  auto b = l.Acquire("nightly", "run-B", "", 10'000, kT0 + 2'500);
  REQUIRE(b.ok());
  CHECK(b->outcome == LeaseOutcome::kAcquired);
  REQUIRE(l.Release("nightly", "run-B", b->lease.token).ok());
  // run-A's renew loop comes back with its old token: not a silent new lease.
  auto renew = l.Acquire("nightly", "run-A", a->lease.token, 2'000, kT0 + 3'000);
  CHECK(renew.status().code() == Code::kFailedPrecondition);
  CHECK(renew.status().field() == "/token");
  CHECK(renew.status().message().find("acquire it again") != std::string::npos);
  // Lapsed with nobody in between: the same.
  auto lapsed = l.Acquire("nightly", "run-A", a->lease.token, 2'000, kT0 + 60'000);
  CHECK(lapsed.status().code() == Code::kFailedPrecondition);
  auto fresh = l.Acquire("nightly", "run-A", "", 2'000, kT0 + 60'000);
  REQUIRE(fresh.ok());
  CHECK(fresh->outcome == LeaseOutcome::kAcquired);
  CHECK(fresh->lease.token != a->lease.token);
}

TEST_CASE("only the holder with the lease's token releases a named lease") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  LeaseStore& s = store->leases();
  StatusOr<LeaseResult> a = s.Acquire("cron:x", "run-1", "", 60'000, kT0);
  REQUIRE(a.ok());
  const std::string token = a->lease.token;
  CHECK(s.Release("cron:x", "run-2", token).code() == Code::kFailedPrecondition);
  CHECK(s.Release("cron:x", "run-1", "").code() == Code::kFailedPrecondition);
  Status wrong = s.Release("cron:x", "run-1", "0123456789abcdef");
  CHECK(wrong.code() == Code::kFailedPrecondition);
  CHECK(wrong.field() == "/token");
  CHECK(s.Get("cron:x", kT0)->holder == "run-1");
  CHECK(s.Release("cron:x", "run-1", token).ok());
  CHECK(s.Get("cron:x", kT0).status().code() == Code::kNotFound);
  CHECK(s.Release("cron:x", "run-1", token).code() == Code::kFailedPrecondition);
  CHECK(s.Acquire("cron:x", "run-2", "", 60'000, kT0 + 1)->outcome == LeaseOutcome::kAcquired);
  CHECK(s.Acquire("", "run-2", "", 60'000, kT0).status().code() == Code::kInvalidArgument);
  CHECK(s.Acquire("cron:y", "run-2", "", 0, kT0).status().code() == Code::kInvalidArgument);
}

TEST_CASE("meta stores small strings") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  MetaStore& m = store->meta();
  CHECK(!m.Get("prompt:triage:v1").value().has_value());
  REQUIRE(m.Put("prompt:triage:v1", "abc").ok());
  CHECK(m.Get("prompt:triage:v1").value() == std::optional<std::string>("abc"));
  REQUIRE(m.Put("prompt:triage:v1", "def").ok());
  CHECK(m.Get("prompt:triage:v1").value() == std::optional<std::string>("def"));
}

// Keys left in a family of a closed store.
std::vector<std::string> RawKeys(const std::string& path, const std::string& family) {
  std::vector<std::string> keys;
  testing::WithRawDb(path, [&](rocksdb::DB& db, auto& cf) {
    std::unique_ptr<rocksdb::Iterator> it(db.NewIterator({}, cf.at(family)));
    for (it->SeekToFirst(); it->Valid(); it->Next()) keys.push_back(it->key().ToString());
  });
  return keys;
}

TEST_CASE("the sweep deletes expired leases from disk and keeps live ones") {
  TempDir dir;
  {
    auto store = OpenStore(dir.path());
    LeaseStore& s = store->leases();
    REQUIRE(s.Acquire("old", "run-1", "", 1'000, kT0).ok());
    REQUIRE(s.Acquire("live", "run-2", "", 60'000, kT0).ok());
    CHECK(s.SweepExpired(kT0 + 999, 100).value() == 0);
    CHECK(s.SweepExpired(kT0 + 1'000, 100).value() == 1);
    CHECK(s.SweepExpired(kT0 + 1'000, 100).value() == 0);
    CHECK(s.Get("live", kT0 + 1'000)->holder == "run-2");
    // A swept name is free to take.
    CHECK(s.Acquire("old", "run-3", "", 1'000, kT0 + 1'001)->outcome == LeaseOutcome::kAcquired);
    CHECK(s.SweepExpired(kT0 + 10'000, 1).value() == 1);  // at most `limit`
  }
  if (testing::OnPostgres()) return;  // RocksDB's families below
  CHECK(RawKeys(dir.path(), "leases") == std::vector<std::string>{"live"});
  CHECK(RawKeys(dir.path(), "leases_expiry").size() == 1);  // live's entry, and no other
}

void AcquireNumbered(LeaseStore& s, const char* prefix, int count, int64_t ttl_ms) {
  for (int i = 0; i < count; ++i) {
    char name[24];
    std::snprintf(name, sizeof name, "%s%05d", prefix, i);
    REQUIRE(s.Acquire(name, "cron", "", ttl_ms, kT0).ok());
  }
}

TEST_CASE("a sweep finds the expired leases behind thousands of live ones") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  LeaseStore& s = store->leases();
  AcquireNumbered(s, "a", 2'500, 3'600'000);  // named first, and live
  AcquireNumbered(s, "z", 30, 1'000);
  CHECK(s.SweepExpired(kT0 + 1'000, 100'000).value() == 30);
  CHECK(s.SweepExpired(kT0 + 1'000, 100'000).value() == 0);
  CHECK(s.Get("a00000", kT0 + 1'000).ok());
  CHECK(s.Get("a02499", kT0 + 1'000).ok());
}

TEST_CASE("a sweep deletes at most its limit of expired leases, and the next goes on") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  LeaseStore& s = store->leases();
  AcquireNumbered(s, "n", 2'500, 1'000);
  for (size_t expected : {1'000, 1'000, 500, 0}) {
    CHECK(s.SweepExpired(kT0 + 1'000, 1'000).value() == expected);
  }
}

TEST_CASE("a renewed lease is swept by its new expiry, not its first") {
  TempDir dir;
  {
    auto store = OpenStore(dir.path());
    LeaseStore& s = store->leases();
    StatusOr<LeaseResult> first = s.Acquire("nightly", "run-1", "", 1'000, kT0);
    REQUIRE(first.ok());
    REQUIRE(s.Acquire("nightly", "run-1", first->lease.token, 10'000, kT0 + 500).ok());
    CHECK(s.SweepExpired(kT0 + 1'000, 100).value() == 0);
    CHECK(s.Get("nightly", kT0 + 1'000)->holder == "run-1");
    CHECK(s.SweepExpired(kT0 + 10'499, 100).value() == 0);
    CHECK(s.SweepExpired(kT0 + 10'500, 100).value() == 1);
    // Taken again after it lapsed, and released: nothing is left to sweep.
    StatusOr<LeaseResult> again = s.Acquire("nightly", "run-2", "", 1'000, kT0 + 20'000);
    REQUIRE(again.ok());
    StatusOr<LeaseResult> other = s.Acquire("weekly", "run-3", "", 1'000, kT0 + 20'000);
    REQUIRE(other.ok());
    REQUIRE(s.Release("nightly", "run-2", again->lease.token).ok());
    REQUIRE(s.Acquire("weekly", "run-4", "", 1'000, kT0 + 30'000).ok());  // lapsed: taken over
    CHECK(s.SweepExpired(kT0 + 30'999, 100).value() == 0);
    CHECK(s.SweepExpired(kT0 + 31'000, 100).value() == 1);
  }
  if (testing::OnPostgres()) return;  // RocksDB's families below
  CHECK(RawKeys(dir.path(), "leases").empty());
  CHECK(RawKeys(dir.path(), "leases_expiry").empty());
}

// RocksDB's "leases_expiry" index and its upgrade path.
TEST_CASE("a store from before the lease expiry index has its leases indexed once, then swept" *
          doctest::test_suite("rocksdb")) {
  TempDir dir;
  {
    auto store = OpenStore(dir.path());
    AcquireNumbered(store->leases(), "old", 2'500, 1'000);  // past one write of the indexing
    AcquireNumbered(store->leases(), "live", 2, 3'600'000);
  }
  // As an older idem left it: no index entries and no marker.
  CHECK(testing::ForgetIndex(dir.path(), rocks::Family::kLeasesExpiry,
                             rocks::RocksLeaseStore::kIndexedMarker) == 2'502);
  {
    auto store = OpenStore(dir.path());
    CHECK(store->leases().SweepExpired(kT0 + 1'000, 100'000).value() == 2'500);
    CHECK(store->leases().Get("live00001", kT0 + 1'000).ok());
  }
  CHECK(RawKeys(dir.path(), "leases_expiry").size() == 2);
}

}  // namespace
}  // namespace idem
