// The decision cache (store.h, class DecisionStore) on RocksDB.
//
// Family "decisions" holds every decision by id (superseded ones too);
// "decision_keys" maps a decision_key to the id of the cached one;
// "decisions_by_time" and "decisions_by_step" order ids newest first for
// List; "decisions_expiry" orders those with a window by its end, for
// SweepExpired. PutIfAbsent and Replace hold the decision_key's lock stripe.
//
// A decision's trace lives apart from it (record_codec.h, EncodeDecision):
// "decisions" holds the hot record with the trace's summary, and
// "decision_traces" (ZSTD, cold) the whole trace by id, written in the same
// batch and swept with it. GetByKey and the in-memory cache never touch the
// latter; Get, List and export read it. Records written before the split
// hold their whole trace and read whole.
//
// List cursors are opaque (hex of the position after the last item).
//
// Thread-safety: all methods may be called concurrently.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "daemon/store/rocksdb/rocksdb_database.h"
#include "daemon/store/store.h"

namespace idem::rocks {

class RocksDecisionStore final : public DecisionStore {
 public:
  // What the in-memory cache of current decisions may hold, by default.
  static constexpr size_t kDefaultCacheBytes = 8 << 20;

  // `db` must outlive this object. `cache_bytes`: the memory budget of the
  // write-through cache below (an estimate of the heap its entries use).
  explicit RocksDecisionStore(RocksDatabase& db, size_t cache_bytes = kDefaultCacheBytes)
      : db_(db), shard_budget_(cache_bytes / kCacheShards) {}

  StatusOr<Decision> GetByKey(const std::string& decision_key, int64_t now_ms) override;
  StatusOr<Decision> Get(const std::string& decision_id) override;
  StatusOr<Decision> PutIfAbsent(const Decision& d, int64_t now_ms,
                                 bool* stored = nullptr) override;
  Status Replace(const Decision& d) override;
  StatusOr<DecisionPage> List(const std::string& step, const std::string& status,
                              const std::string& cursor, size_t limit) override;
  StatusOr<size_t> SweepExpired(int64_t now_ms, size_t limit,
                                std::vector<std::string>* swept_ids) override;

  // The estimated bytes the in-memory cache holds now (for tests).
  size_t CachedBytes();

 private:
  // The decision stored under the id; `whole`: with its whole trace (read
  // from `snapshot`, or from one of its own), else as its hot record holds
  // it. `trace_apart` (optional): whether its trace is stored apart.
  StatusOr<std::optional<Decision>> Load(const std::string& decision_id, bool whole,
                                         const rocksdb::Snapshot* snapshot = nullptr,
                                         bool* trace_apart = nullptr);
  // The decision currently cached under the key (expired or not).
  StatusOr<std::optional<Decision>> Current(const std::string& decision_key);
  // Stages `d` as the cached decision for its key. REQUIRES: the key's stripe.
  Status Store(const Decision& d);

  // A write-through memory of the current decision per key: a cache hit
  // (the daemon's hottest read) then costs no RocksDB read and no JSON
  // parse. One process owns the store, so every write passes through here.
  // A shard's generation changes with every write to it; a reader that
  // loaded from disk inserts only if no write happened meanwhile, so a
  // stale decision can never be put back. Bounded by bytes, not entries (a
  // decision with a long trace can be large): a shard past its share of the
  // budget evicts entries (in no particular order) until the new one fits;
  // one larger than a whole share is not kept.
  struct CacheEntry {
    std::shared_ptr<const Decision> decision;
    size_t bytes = 0;
  };
  struct CacheShard {
    Mutex mu;
    std::unordered_map<std::string, CacheEntry> by_key GUARDED_BY(mu);
    size_t bytes GUARDED_BY(mu) = 0;
    uint64_t generation GUARDED_BY(mu) = 0;
  };
  static constexpr size_t kCacheShards = 16;
  CacheShard& ShardFor(const std::string& decision_key);
  void Remember(const Decision& d);
  // Drops the key from the cache (its decision was deleted).
  void Forget(const std::string& decision_key);
  // Puts `d` under its key within the shard's budget. REQUIRES: shard.mu.
  void Insert(CacheShard& shard, std::shared_ptr<const Decision> d) REQUIRES(shard.mu);

  RocksDatabase& db_;
  const size_t shard_budget_;
  std::array<CacheShard, kCacheShards> cache_;
};

}  // namespace idem::rocks
