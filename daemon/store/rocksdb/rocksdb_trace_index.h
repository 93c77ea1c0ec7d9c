// The trace index (store.h, class TraceIndex) on RocksDB. Add encodes the
// entry at once into a pending write batch, on the caller's thread; a
// background thread writes that batch (not synced) every 200 ms or once
// 256 entries wait; List and Flush write it first.
//
// Entries go to the family "trace_log" (trace_id | BE8(at_ms) | BE8(seq) ->
// entry JSON), one key each, first in first out: the family is never
// compacted, and its oldest table file is dropped (DB::DeleteFile) while the
// family is over StoreOptions::trace_budget_bytes or that file is older
// than trace_retention_ms. SweepBefore hides the log's entries at or before its
// cutoff at once (a mark in "meta"); their space goes with their file.
// Entries written by builds before the log ("traces", with the time index
// "traces_by_time") are still listed, and swept one by one.
//
// Thread-safety: all methods may be called concurrently.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "daemon/store/rocksdb/rocksdb_database.h"
#include "daemon/store/store.h"

namespace idem::rocks {

// A stored entry, back to the entry (also read by rocksdb_export.cc):
// its key (trace_id | BE8(at_ms) | BE8(seq)) and its JSON. The log's
// entries keep trace_id and at_ms only in the key; an older build's carry
// them in the JSON too. Internal when malformed.
StatusOr<TraceEntry> TraceEntryFromStored(std::string_view key, const Json& j);
// The sweep mark: entries of the log at or before it are no longer listed
// (0 before any sweep). Internal when malformed.
StatusOr<int64_t> TraceSweptBefore(RocksDatabase& db);

class RocksTraceIndex final : public TraceIndex {
 public:
  static constexpr size_t kMaxQueued = 65'536;

  // `db` must outlive this object.
  explicit RocksTraceIndex(RocksDatabase& db);
  ~RocksTraceIndex() override;
  RocksTraceIndex(const RocksTraceIndex&) = delete;
  RocksTraceIndex& operator=(const RocksTraceIndex&) = delete;

  Status Add(TraceEntry entry) override;
  Status Record(std::string_view trace_id, int64_t at_ms, std::string_view type,
                std::string_view ref, std::string detail) override;
  Status Flush() override;
  StatusOr<std::vector<TraceEntry>> List(const std::string& trace_id, size_t limit) override;
  StatusOr<size_t> SweepBefore(int64_t cutoff_ms, size_t limit) override;
  uint64_t dropped() const override { return dropped_.load(std::memory_order_relaxed); }

 private:
  void Loop();
  Status HideThrough(int64_t cutoff_ms);
  // Drops the log's oldest table files while it is over its budget or the
  // oldest is past the retention; returns how many. Also run by the
  // background thread once a second.
  StatusOr<size_t> PruneLog();

  RocksDatabase& db_;
  std::atomic<uint64_t> seq_;
  std::atomic<uint64_t> dropped_{0};
  std::atomic<int64_t> swept_before_{0};  // written under sweep_mu_
  std::mutex sweep_mu_;
  std::mutex flush_mu_;  // one writer of the pending batch at a time (keeps entries in order)
  std::mutex mu_;
  std::condition_variable cv_;
  // Entries encoded and not yet written, and how many (guarded by mu_).
  std::unique_ptr<RecordBatch> pending_;
  size_t pending_count_ = 0;
  bool stopping_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace idem::rocks
