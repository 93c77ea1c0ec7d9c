// Named leases (store.h, class LeaseStore) and small facts (MetaStore) on
// RocksDB: families "leases" (name -> NamedLease JSON), "leases_expiry"
// (BE8(expires_at) | name -> "", one entry per lease, so that a sweep reads
// only what is over, however many leases live) and "meta" (key -> value).
// Lease writes hold the name's lock stripe and are durable: a cron run
// starts only after its lease is on disk.
//
// Thread-safety: all methods may be called concurrently.
#pragma once

#include <optional>
#include <string>

#include "daemon/core/mutex.h"
#include "daemon/store/rocksdb/rocksdb_database.h"
#include "daemon/store/store.h"

namespace idem::rocks {

class RocksLeaseStore final : public LeaseStore {
 public:
  // `db` must outlive this object.
  explicit RocksLeaseStore(RocksDatabase& db) : db_(db) {}

  StatusOr<LeaseResult> Acquire(const std::string& name, const std::string& holder,
                                const std::string& token, int64_t ttl_ms, int64_t now_ms) override;
  Status Release(const std::string& name, const std::string& holder,
                 const std::string& token) override;
  StatusOr<NamedLease> Get(const std::string& name, int64_t now_ms) override;
  StatusOr<size_t> SweepExpired(int64_t now_ms, size_t limit) override;

  // A store written before "leases_expiry" has leases that family does not
  // list: index each once, then mark the store (kIndexedMarker). Called
  // when the store opens, before anything else uses it.
  static Status IndexLegacyLeases(RocksDatabase& db);
  static constexpr char kIndexedMarker[] = "leases.expiry_indexed";

 private:
  StatusOr<std::optional<NamedLease>> Load(const std::string& name);

  RocksDatabase& db_;
};

class RocksMetaStore final : public MetaStore {
 public:
  // `db` must outlive this object.
  explicit RocksMetaStore(RocksDatabase& db) : db_(db) {}

  StatusOr<std::optional<std::string>> Get(const std::string& key) override;
  Status Put(const std::string& key, const std::string& value) override;

 private:
  RocksDatabase& db_;
};

}  // namespace idem::rocks
