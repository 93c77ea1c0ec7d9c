// The trace index (store.h, class TraceIndex) on RocksDB: families
// "traces" (trace_id | BE8(at_ms) | BE8(seq) -> entry JSON) and
// "traces_by_time" (BE8(at_ms) | trace_id | BE8(seq) -> "", for the sweep).
// Add queues; a background thread writes the queue (not synced) every
// 200 ms or once 256 entries wait; List and Flush write it first.
//
// Thread-safety: all methods may be called concurrently.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "daemon/store/rocksdb/rocksdb_database.h"
#include "daemon/store/store.h"

namespace idem::rocks {

// The stored JSON of an entry, back to the entry (also read by
// rocksdb_export.cc). Internal when malformed.
StatusOr<TraceEntry> TraceEntryFromJson(const Json& j);

class RocksTraceIndex final : public TraceIndex {
 public:
  static constexpr size_t kMaxQueued = 65'536;

  // `db` must outlive this object.
  explicit RocksTraceIndex(RocksDatabase& db);
  ~RocksTraceIndex() override;
  RocksTraceIndex(const RocksTraceIndex&) = delete;
  RocksTraceIndex& operator=(const RocksTraceIndex&) = delete;

  Status Add(TraceEntry entry) override;
  Status Flush() override;
  StatusOr<std::vector<TraceEntry>> List(const std::string& trace_id, size_t limit) override;
  StatusOr<size_t> SweepBefore(int64_t cutoff_ms, size_t limit) override;
  uint64_t dropped() const override { return dropped_.load(std::memory_order_relaxed); }

 private:
  void Loop();

  RocksDatabase& db_;
  std::atomic<uint64_t> seq_;
  std::atomic<uint64_t> dropped_{0};
  std::mutex flush_mu_;  // one writer of the queue at a time (keeps entries in order)
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<TraceEntry> queue_;  // guarded by mu_
  bool stopping_ = false;          // guarded by mu_
  std::thread thread_;
};

}  // namespace idem::rocks
