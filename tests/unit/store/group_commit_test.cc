// GroupCommit (daemon/store/rocksdb/group_commit.h) over a bare RocksDB.
#include "daemon/store/rocksdb/group_commit.h"

#include <doctest/doctest.h>
#include <rocksdb/db.h>

#include <atomic>
#include <latch>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/unit/store/store_test_util.h"

namespace idem {
namespace {

using testing::TempDir;

struct RawDb {
  TempDir dir;
  std::unique_ptr<rocksdb::DB> db;
  RawDb() {
    rocksdb::Options options;
    options.create_if_missing = true;
    options.allow_concurrent_memtable_write = false;
    rocksdb::DB* raw = nullptr;
    REQUIRE(rocksdb::DB::Open(options, dir.path(), &raw).ok());
    db.reset(raw);
  }
  std::string Get(const std::string& key) {
    std::string value;
    rocksdb::Status s = db->Get(rocksdb::ReadOptions(), key, &value);
    return s.ok() ? value : "<" + s.ToString() + ">";
  }
};

TEST_CASE("concurrent synced commits all land, sharing writes" * doctest::test_suite("rocksdb")) {
  RawDb raw;
  std::vector<std::string> written;
  {
    rocks::GroupCommit gc(*raw.db, {raw.db->DefaultColumnFamily()});
    constexpr int kThreads = 32;
    std::latch start(kThreads);
    std::atomic<int> failed{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        rocksdb::WriteBatch b;
        REQUIRE(b.Put("k" + std::to_string(t), "v" + std::to_string(t)).ok());
        REQUIRE(b.Put("other" + std::to_string(t), "x").ok());
        start.arrive_and_wait();
        if (!gc.Commit(b, /*sync=*/true).ok()) ++failed;
      });
    }
    for (auto& th : threads) th.join();
    CHECK(failed.load() == 0);
    CHECK(gc.batches() == kThreads);
    CHECK(gc.writes() >= 1);
    CHECK(gc.writes() <= gc.batches());
    MESSAGE("32 commits took ", gc.writes(), " writes");
  }
  for (int t = 0; t < 32; ++t) {
    CHECK(raw.Get("k" + std::to_string(t)) == "v" + std::to_string(t));
    CHECK(raw.Get("other" + std::to_string(t)) == "x");
  }
}

TEST_CASE(
    "a submitted batch is written by the committer and on_done runs once before Wait returns" *
    doctest::test_suite("rocksdb")) {
  RawDb raw;
  rocks::GroupCommit gc(*raw.db, {raw.db->DefaultColumnFamily()});
  constexpr int kBatches = 20;
  std::vector<std::unique_ptr<rocksdb::WriteBatch>> batches;
  std::vector<std::shared_ptr<rocks::GroupCommit::Ticket>> tickets;
  std::atomic<int> callbacks{0};
  for (int i = 0; i < kBatches; ++i) {
    batches.push_back(std::make_unique<rocksdb::WriteBatch>());
    REQUIRE(batches.back()->Put("s" + std::to_string(i), std::to_string(i)).ok());
    tickets.push_back(gc.Submit(*batches.back(), /*sync=*/true, [&] { ++callbacks; }));
  }
  for (auto& t : tickets) CHECK(t->Wait().ok());
  CHECK(callbacks.load() == kBatches);  // Wait returned only after on_done
  for (auto& t : tickets) CHECK(t->done());
  for (int i = 0; i < kBatches; ++i) CHECK(raw.Get("s" + std::to_string(i)) == std::to_string(i));
  CHECK(gc.batches() == kBatches);
}

}  // namespace
}  // namespace idem
