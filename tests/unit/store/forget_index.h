// ForgetIndex: a RocksDB store made to look as an older idem left it, for
// the tests of the one-time indexing at open (store tests and the daemon's
// integration tests; apart from store_test_util.h, whose TempDir the
// integration harness has its own of).
#pragma once

#include <doctest/doctest.h>
#include <rocksdb/iterator.h>

#include <memory>
#include <string>

#include "daemon/store/rocksdb/rocksdb_database.h"
#include "daemon/store/store.h"

namespace idem::testing {

// Makes a RocksDB store at `path` look as an older idem left it, before
// index family `index` existed: deletes its every entry and the meta
// `marker` that says it was built. Returns how many entries there were.
inline int ForgetIndex(const std::string& path, rocks::Family index, const char* marker) {
  auto db = rocks::RocksDatabase::Open(StoreOptions{path, false});
  REQUIRE(db.ok());
  rocks::RecordBatch batch(**db);
  std::unique_ptr<rocksdb::Iterator> it = (*db)->NewIterator(index, {});
  int entries = 0;
  for (it->SeekToFirst(); it->Valid(); it->Next(), ++entries) {
    batch.Delete(index, it->key().ToString());
  }
  batch.Delete(rocks::Family::kMeta, marker);
  REQUIRE((*db)->Commit(batch, false).ok());
  return entries;
}

}  // namespace idem::testing
