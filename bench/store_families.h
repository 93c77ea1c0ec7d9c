// PrintFamilies: a stopped store's bytes and keys per column family, for
// the bench programs that say where a store's bytes go (link idem_rocksdb).
#pragma once

#include <rocksdb/db.h>

#include <cstdio>
#include <string>
#include <vector>

namespace idem::bench {

// Bytes on disk (SST + memtable) and keys per column family, read with the
// daemon stopped.
inline void PrintFamilies(const std::string& path) {
  std::vector<std::string> names;
  rocksdb::Options options;
  if (!rocksdb::DB::ListColumnFamilies(options, path, &names).ok()) return;
  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  for (const auto& n : names) descriptors.emplace_back(n, rocksdb::ColumnFamilyOptions());
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  if (!rocksdb::DB::OpenForReadOnly(options, path, descriptors, &handles, &db).ok()) return;
  std::printf("\n%-22s %12s %12s %10s\n", "column family", "sst bytes", "keys (est)", "B/key");
  for (auto* h : handles) {
    uint64_t sst = 0, keys = 0;
    db->GetIntProperty(h, "rocksdb.total-sst-files-size", &sst);
    db->GetIntProperty(h, "rocksdb.estimate-num-keys", &keys);
    if (sst != 0 || keys != 0) {
      std::printf("%-22s %12lu %12lu %10.0f\n", h->GetName().c_str(),
                  static_cast<unsigned long>(sst), static_cast<unsigned long>(keys),
                  keys ? static_cast<double>(sst) / keys : 0.0);
    }
    db->DestroyColumnFamilyHandle(h).PermitUncheckedError();
  }
  delete db;
}

}  // namespace idem::bench
