// Disk full and write errors: writes fail Unavailable, reads keep working,
// WriteHealth reports it, and the store recovers by itself once writes can
// succeed again (rocksdb_database.h).
#include <doctest/doctest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "daemon/core/failpoints.h"
#include "tests/support/small_filesystem.h"
#include "tests/unit/store/store_test_util.h"

namespace idem::testing {
namespace {

using namespace std::chrono_literals;

// Polls `ok` for up to `limit`; true once it holds.
template <typename F>
bool Eventually(F ok, std::chrono::milliseconds limit) {
  auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (ok()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return ok();
}

struct FailpointsCleared {
  ~FailpointsCleared() { Failpoints::Clear(); }
};

TEST_CASE("a failing disk fails writes Unavailable, keeps reads, and recovers by itself" *
          doctest::test_suite("rocksdb")) {
  TempDir dir;
  auto store = OpenStore(dir.path());
  FailpointsCleared cleanup;
  REQUIRE(store->journal().Claim(ClaimReq("w-before", kT0)).ok());
  CHECK(store->WriteHealth().ok());

  REQUIRE(Failpoints::Set("store.write=error").ok());
  auto claim = store->journal().Claim(ClaimReq("w-during", kT0));
  REQUIRE_FALSE(claim.ok());
  CHECK(claim.status().code() == Code::kUnavailable);
  CHECK(claim.status().retryable());
  Status health = store->WriteHealth();
  CHECK(health.code() == Code::kUnavailable);
  CHECK(health.retryable());
  CHECK(health.message().find("failpoint store.write") != std::string::npos);
  // Reads are served meanwhile.
  auto before = store->journal().Get("w-before");
  REQUIRE_MESSAGE(before.ok(), before.status().ToString());
  CHECK(before->state == WorkState::kRunning);
  // The recovery's probe fails too while the disk does: still unhealthy.
  std::this_thread::sleep_for(1300ms);
  CHECK_FALSE(store->WriteHealth().ok());

  Failpoints::Clear();
  // Nobody writes: the recovery's probe alone finds out that writes work.
  CHECK(Eventually([&] { return store->WriteHealth().ok(); }, 4000ms));
  CHECK(store->journal().Claim(ClaimReq("w-during", kT0)).ok());
}

// Fills a 16 MiB filesystem under a store (with `min_free_bytes` as its
// floor), checks writes fail and reads work, frees the space, and (when
// `recovery`) checks that writes work again by themselves.
void FullDiskEpisode(uint64_t min_free_bytes, bool recovery) {
  SmallFilesystem fs("16m");
  if (!fs.mounted()) {
    MESSAGE("skipped: cannot mount tmpfs (not root, or no CAP_SYS_ADMIN)");
    return;
  }
  const std::string data = fs.path() + "/store";
  const std::string filler = fs.path() + "/filler";
  {
    auto store = OpenStore(data, /*sync=*/true, min_free_bytes);
    REQUIRE(store->journal().Claim(ClaimReq("w-before", kT0)).ok());
    FillUp(filler);

    // Records big enough that the WAL soon needs a page the disk lacks.
    Status failed;
    for (int i = 0; i < 2000 && failed.ok(); ++i) {
      ClaimRequest r = ClaimReq("w-" + std::to_string(i), kT0);
      r.args = Json{{"pad", std::string(8 * 1024, 'x')}};
      auto claimed = store->journal().Claim(r);
      if (!claimed.ok()) failed = claimed.status();
    }
    REQUIRE_MESSAGE(!failed.ok(), "the disk never filled up");
    CHECK(failed.code() == Code::kUnavailable);
    CHECK(failed.retryable());
    MESSAGE("write error on a full disk: " << failed.message());
    CHECK_FALSE(store->WriteHealth().ok());
    auto before = store->journal().Get("w-before");
    REQUIRE_MESSAGE(before.ok(), before.status().ToString());
    CHECK(before->state == WorkState::kRunning);
    std::filesystem::remove(filler);
    if (!recovery) return;
    CHECK(Eventually([&] { return store->WriteHealth().ok(); }, 5000ms));
    auto after = store->journal().Claim(ClaimReq("w-after", kT0));
    CHECK_MESSAGE(after.ok(), after.status().ToString());
  }
  // What was written before and after the episode survives a reopen.
  auto reopened = OpenStore(data);
  CHECK(reopened->journal().Get("w-before").ok());
  CHECK(reopened->journal().Get("w-after").ok());
}

TEST_CASE("below store.min_free writes fail before RocksDB meets the full disk, and recover" *
          doctest::test_suite("rocksdb")) {
  // RocksDB never sees ENOSPC, so no Resume (whose wait can hang in 7.8) is
  // needed: writes simply succeed again once there is room.
  FullDiskEpisode(/*min_free_bytes=*/1 << 20, /*recovery=*/true);
}

TEST_CASE("a full disk met by RocksDB itself fails writes Unavailable and keeps reads" *
          doctest::test_suite("rocksdb")) {
  // Without the floor the WAL write meets ENOSPC. Known gap: RocksDB 7.8's
  // Resume() then sometimes waits for a flush that is never rescheduled
  // (about 1 run in 5 here), so recovery on this path is checked only when
  // asked for (IDEM_DISK_RECOVERY_TESTS=1). The daemon runs with the floor.
  FullDiskEpisode(/*min_free_bytes=*/0, std::getenv("IDEM_DISK_RECOVERY_TESTS") != nullptr);
}

TEST_CASE("a store below its free-space floor refuses writes and names the setting" *
          doctest::test_suite("rocksdb")) {
  TempDir dir;
  OpenStore(dir.path());  // made with room (a new folder's first open writes its identity)
  auto store = OpenStore(dir.path(), /*sync=*/false, /*min_free_bytes=*/uint64_t{1} << 62);
  // Not ready before any write is tried (a balancer moves writes at once).
  Status ready = store->WriteHealth();
  CHECK(ready.code() == Code::kUnavailable);
  CHECK(ready.message().find("store.min_free_mb") != std::string::npos);
  auto claim = store->journal().Claim(ClaimReq("w-1", kT0));
  REQUIRE_FALSE(claim.ok());
  CHECK(claim.status().code() == Code::kUnavailable);
  CHECK(claim.status().message().find("store.min_free_mb") != std::string::npos);
  CHECK_FALSE(store->WriteHealth().ok());
  CHECK(store->journal().Get("w-1").status().code() == Code::kNotFound);
}

}  // namespace
}  // namespace idem::testing
