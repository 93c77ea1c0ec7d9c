// Private to daemon/store/rocksdb: the one RocksDB database behind every
// store, its column families, the striped per-key locks that make a
// read-modify-write atomic, and the translation of rocksdb::Status into
// idem::Status (the only place in the daemon that sees rocksdb::Status).
//
// Atomicity recipe used by every store in this folder:
//   MutexLock lock(db.LockFor(Family::kX, key));   // one stripe per key
//   read the record, decide, stage the new record and its index entries in
//   one RecordBatch, db.Commit(batch, durable)     // one atomic WriteBatch
// Writes to different keys never share a lock, so concurrent committers
// reach RocksDB together and share one fsync (group commit).
//
// Disk full and other write failures: a write that RocksDB refuses (ENOSPC,
// an I/O error; RocksDB then also refuses every later write until
// DB::Resume) marks the database's writes as failing. Reads keep working.
// While marked, a recovery thread calls DB::Resume and writes a small probe
// record about once a second; the first write that succeeds, the probe's or
// a caller's, clears the mark. WriteHealth reports it (/readyz).
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <rocksdb/db.h>
#include <rocksdb/listener.h>
#include <rocksdb/write_batch.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "daemon/core/mutex.h"
#include "daemon/core/status.h"
#include "daemon/store/rocksdb/group_commit.h"
#include "daemon/store/store.h"

namespace idem::rocks {

// One column family per record family, plus the index families. The names
// (Family ColumnFamilyName) are the on-disk layout.
enum class Family : int {
  kMeta = 0,
  kDecisions,          // decision_id -> Decision JSON
  kDecisionKeys,       // decision_key -> decision_id of the cached decision
  kDecisionsByTime,    // BE8(~created_at) | decision_id -> ""
  kDecisionsByStep,    // LP(step) | BE8(~created_at) | decision_id -> ""
  kIdemKeys,           // LP(scope) | key -> IdemRecord JSON
  kIdemExpiry,         // BE8(expires_at) | LP(scope) | key -> ""
  kJournal,            // work_id -> WorkItem JSON
  kJournalDue,         // BE8(due_at) | work_id -> ""  (pending/failed, running)
  kJournalDead,        // BE8(updated_at) | work_id -> ""
  kJournalRun,         // LP(run_id) | BE8(created_at) | work_id -> ""
  kJournalDoneRef,     // LP(kind) | BE8(~updated_at) | work_id -> ""
  kJournalExpiry,      // BE8(expires_at) | work_id -> ""  (done with a window)
  kPlans,              // plan_id -> Plan JSON
  kPlansByState,       // LP(state) | BE8(created_at) | plan_id -> ""
  kAudit,              // BE8(seq) -> AuditEvent JSON
  kLeases,             // name -> NamedLease JSON
  kEscalations,        // escalation_id -> Escalation JSON
  kEscalationsOpen,    // decision_key -> escalation_id of the open escalation
  kEscalationsByTime,  // BE8(~created_at) | escalation_id -> ""
  kIdemInProgress,     // LP(scope) | key -> ""  (records in state in_progress)
  kDecisionsExpiry,    // BE8(expires_at) | decision_id -> ""  (decisions with a window)
  kOutbox,             // BE8(seq) -> OutboxEvent JSON (rocksdb_outbox_store.h)
  kOutboxDead,         // LP(subscriber) | BE8(seq) -> OutboxDeadLetter JSON
  kTraces,  // legacy (older builds; read, swept, not written): trace_id | BE8(at_ms) | BE8(seq) ->
            // TraceEntry JSON
  kTracesByTime,  // legacy: BE8(at_ms) | trace_id | BE8(seq) -> ""
  kTraceLog,  // trace_id | BE8(at_ms) | BE8(seq) -> TraceEntry JSON (FIFO: rocksdb_trace_index.h)
  kDecisionTraces,       // decision_id -> the decision's whole trace JSON (cold)
  kLeasesExpiry,         // BE8(expires_at) | name -> ""  (every lease)
  kEscalationsResolved,  // BE8(resolved_at) | escalation_id -> ""  (resolved ones)
  kPlansFinished,        // BE8(updated_at) | plan_id -> ""  (applied, rejected, expired)
  kCount,
};

std::string_view ColumnFamilyName(Family f);

// The families read only by iterators, never by a point lookup (Get): their
// table files carry no bloom filter. A new point lookup on one of these
// must take it off this list.
inline constexpr Family kScanOnlyFamilies[] = {Family::kDecisionsByTime,
                                               Family::kDecisionsByStep,
                                               Family::kIdemExpiry,
                                               Family::kJournalDue,
                                               Family::kJournalDead,
                                               Family::kJournalRun,
                                               Family::kJournalDoneRef,
                                               Family::kJournalExpiry,
                                               Family::kPlansByState,
                                               Family::kAudit,
                                               Family::kEscalationsByTime,
                                               Family::kIdemInProgress,
                                               Family::kDecisionsExpiry,
                                               Family::kLeasesExpiry,
                                               Family::kEscalationsResolved,
                                               Family::kPlansFinished,
                                               Family::kOutbox,
                                               Family::kTraces,
                                               Family::kTracesByTime};

// The trace id that prefixes every key of kTraceLog (its bloom filters are
// built on it).
inline constexpr size_t kTraceIdBytes = 32;

// --- key encoding: big-endian integers sort like the numbers; a length
// prefix (LP) keeps variable-length parts from bleeding into each other.

// Negative values clamp to 0 (times before the epoch do not occur).
std::string BigEndian8(int64_t v);
std::string BigEndian8(uint64_t v);
// For newest-first indexes: sorts in reverse order of v.
std::string InvertedBigEndian8(int64_t v);
uint64_t ReadBigEndian8(std::string_view bytes);
std::string LengthPrefixed(std::string_view s);

// A WriteBatch that remembers the first error while staging.
class RecordBatch {
 public:
  explicit RecordBatch(class RocksDatabase& db) : db_(db) {}
  ~RecordBatch();  // gives back the outbox seqs of a batch never written
  RecordBatch(const RecordBatch&) = delete;
  RecordBatch& operator=(const RecordBatch&) = delete;
  void Put(Family f, std::string_view key, std::string_view value);
  // Encodes `j`; an encoding error is kept and returned by Commit.
  void PutJson(Family f, std::string_view key, const Json& j);
  void Delete(Family f, std::string_view key);
  // Makes Commit fail with `error` (a record that could not be encoded).
  void Fail(Status error) {
    if (status_.ok()) status_ = std::move(error);
  }
  bool empty() const { return batch_.Count() == 0; }
  // Stages an outbox event (store.h, OutboxEvent) with the state change
  // this batch writes: its seq is taken now, and stays "in flight" (above
  // the readers' watermark) until the batch's write is over or the batch
  // is dropped. Stage it while holding the lock of the record it reports,
  // so events of one key are numbered in the order they commit.
  void AddOutboxEvent(const std::string& type, const std::string& key, int64_t at_ms, Json data);
  // The same with `data` already the text of a JSON object (valid UTF-8).
  void AddOutboxEventText(const std::string& type, const std::string& key, int64_t at_ms,
                          std::string_view data);

 private:
  friend class RocksDatabase;
  RocksDatabase& db_;
  rocksdb::WriteBatch batch_;
  Status status_;
  std::vector<uint64_t> outbox_seqs_;  // taken, not yet given back
};

// A point-in-time view for multi-key reads (an index plus its records).
class ScopedSnapshot {
 public:
  explicit ScopedSnapshot(rocksdb::DB& db) : db_(db), snap_(db.GetSnapshot()) {}
  ~ScopedSnapshot() { db_.ReleaseSnapshot(snap_); }
  ScopedSnapshot(const ScopedSnapshot&) = delete;
  ScopedSnapshot& operator=(const ScopedSnapshot&) = delete;
  const rocksdb::Snapshot* get() const { return snap_; }

 private:
  rocksdb::DB& db_;
  const rocksdb::Snapshot* snap_;
};

class RocksDatabase {
 public:
  // Opens (creating if needed) the database and every column family.
  // Unavailable if the folder is locked by another process or unreadable.
  static StatusOr<std::unique_ptr<RocksDatabase>> Open(const StoreOptions& options);
  ~RocksDatabase();
  RocksDatabase(const RocksDatabase&) = delete;
  RocksDatabase& operator=(const RocksDatabase&) = delete;

  // The value under `key`, nullopt if absent.
  StatusOr<std::optional<std::string>> Get(Family f, std::string_view key,
                                           const rocksdb::Snapshot* snapshot = nullptr);
  // Writes the batch atomically, sharing one WAL write and fsync with
  // concurrent committers (group_commit.h). `durable`: synced to disk before
  // returning when the store was opened with sync=true. Failpoint "store.write" (error)
  // makes it fail as a disk error would (writes are then failing, as above,
  // until the failpoint is cleared and the recovery's probe succeeds).
  Status Commit(RecordBatch& batch, bool durable);
  // Commit without blocking: queues the batch and returns its ticket
  // (nullptr when there was nothing to write). `on_done` runs on the writing
  // thread once the write is over. The batch must outlive the ticket's
  // completion. A staging error is returned at once, with nothing queued.
  StatusOr<std::shared_ptr<GroupCommit::Ticket>> CommitAsync(RecordBatch& batch, bool durable,
                                                             std::function<void()> on_done);
  std::unique_ptr<rocksdb::Iterator> NewIterator(Family f, const rocksdb::ReadOptions& ro);
  // Iterator errors surface only through status(); call after the loop.
  Status IteratorStatus(const rocksdb::Iterator& it, std::string_view what);

  // Up to `limit` keys of an expiry index (BE8(expires_at) | record key)
  // whose time is <= now_ms, oldest first. `what` names it in errors.
  StatusOr<std::vector<std::string>> ExpiredIndexKeys(Family index, int64_t now_ms, size_t limit,
                                                      std::string_view what);

  // How many keys of family `f` start with `prefix`, counted up to `cap`;
  // reads keys only (an index's entries, never the records they name).
  StatusOr<size_t> CountKeys(Family f, std::string_view prefix, size_t cap, std::string_view what);

  // For a store written before index family `index` existed: unless meta
  // key `marker` is set, reads every record of `source` once, writes the
  // index entry `entry_of` returns for it (nullopt: none), then sets the
  // marker (durable, after the entries). Call when the store opens, before
  // anything else writes `source`.
  using IndexEntryOf =
      std::function<StatusOr<std::optional<std::string>>(std::string_view key, const Json& value)>;
  Status IndexOnce(Family source, Family index, std::string_view marker, std::string_view what,
                   const IndexEntryOf& entry_of);

  // The lock stripe for `key` of family `f` (kStripes of them). Hold at most
  // one, unless the others were taken in address order (the journal's
  // batches) or without waiting (ChunkedSweep).
  Mutex& LockFor(Family f, std::string_view key) { return stripes_[StripeOf(f, key)]; }
  // Which stripe LockFor(f, key) is, in [0, kStripes): for state a store
  // keeps per stripe, guarded by that stripe.
  static size_t StripeOf(Family f, std::string_view key);
  static constexpr size_t kStripes = 1024;

  rocksdb::DB& raw() { return *db_; }
  const StoreOptions& options() const { return options_; }
  rocksdb::ColumnFamilyHandle* handle(Family f) { return handles_[static_cast<int>(f)]; }

  // rocksdb::Status -> idem::Status, "store: <what>: <RocksDB's words>".
  // Corruption, NotSupported and InvalidArgument are Internal (500: no wait
  // mends them); everything else is Unavailable and retryable. A Corruption
  // (a checksum mismatch, a truncated table file) is also counted in
  // corruptions() and logged at error level as store.corruption: the first
  // one at once, then at most one line a minute carrying the count.
  Status Translate(const rocksdb::Status& s, std::string_view what);
  // The Corruption statuses met since the database opened: reads, writes
  // and RocksDB's background work (flushes, compactions).
  uint64_t corruptions() const { return corruptions_.load(std::memory_order_relaxed); }

  // OK while writes succeed; Unavailable (retryable), naming the last write
  // error, from a failed write until a write succeeds again.
  Status WriteHealth() const;
  // RocksDB's memory by part (store.h, Store::MemoryUsage), from its properties.
  std::vector<std::pair<std::string, uint64_t>> MemoryUsage() const;
  // The store's disk by part (store.h, Store::DiskUsage): each family's live
  // table files from RocksDB's properties, the WAL and the rest of the
  // folder from a walk of it.
  StatusOr<std::vector<std::pair<std::string, uint64_t>>> DiskUsage();
  // Free bytes on the store's filesystem (nullopt when statvfs fails).
  std::optional<uint64_t> FreeBytes() const;

  // The outbox sequence. Every seq <= the watermark is committed or will
  // never be (its write failed or its batch was dropped); readers serve only
  // those, so a cursor never passes an event that commits later.
  uint64_t TakeOutboxSeq();
  void ReleaseOutboxSeqs(const std::vector<uint64_t>& seqs);
  uint64_t OutboxWatermark();
  // Meta key holding the highest seq retention deleted (seqs are never reused).
  static constexpr char kOutboxSweptKey[] = "outbox.swept_through";
  // The store's id (store.h, kStoreIdKey), read or made by Open; fixed after.
  const std::string& store_id() const { return store_id_; }

 private:
  class ErrorListener;
  explicit RocksDatabase(const StoreOptions& options) : options_(options) {}

  // Every write's outcome (group commit and failpoint): a failure that is
  // not the batch's own fault marks writes failing, a success clears it.
  void NoteWrite(const rocksdb::Status& s);
  void NoteWriteFailure(const std::string& error);
  void NoteCorruption(std::string_view what, const rocksdb::Status& s);
  // The recovery thread: while writes fail, Resume and probe once a second.
  void RecoveryLoop();
  void TryRecover();
  // Before each group write: NoSpace when the filesystem would be left with
  // less than options_.min_free_bytes. Looks (statvfs) at most every 10 ms
  // unless the writes since the last look could have used up the headroom
  // it saw.
  rocksdb::Status AdmitWrite(size_t bytes);

  StoreOptions options_;
  std::unique_ptr<rocksdb::DB> db_;
  std::array<rocksdb::ColumnFamilyHandle*, static_cast<size_t>(Family::kCount)> handles_{};
  std::vector<rocksdb::ColumnFamilyHandle*> other_handles_;  // default + unknown families
  std::array<Mutex, kStripes> stripes_;
  std::unique_ptr<GroupCommit> group_commit_;  // every Commit goes through it

  std::atomic<bool> writes_failing_{false};
  mutable std::mutex health_mu_;
  std::string write_error_;  // guarded by health_mu_: the last write error
  bool stopping_ = false;    // guarded by health_mu_
  std::condition_variable health_cv_;
  std::thread recovery_;
  std::atomic<bool> recovering_{false};  // the recovery thread is inside TryRecover
  std::atomic<uint64_t> corruptions_{0};
  std::atomic<int64_t> corruption_logged_ms_{
      INT64_MIN};                                // steady clock; the last store.corruption line
  std::atomic<uint64_t> corruptions_logged_{0};  // corruptions_ when that line was written

  Mutex space_mu_;
  int64_t space_checked_ms_ GUARDED_BY(space_mu_) = 0;
  uint64_t space_free_ GUARDED_BY(space_mu_) = 0;   // free bytes at the last look
  uint64_t space_since_ GUARDED_BY(space_mu_) = 0;  // bytes admitted since then
  Mutex outbox_mu_;
  uint64_t outbox_next_ GUARDED_BY(outbox_mu_) = 1;
  std::string store_id_;  // set by Open before the database is shared
  std::set<uint64_t> outbox_in_flight_ GUARDED_BY(outbox_mu_);
};

// A sweep's deletions written a chunk of records at a time: one store
// write per chunk instead of one per record. A record's lock stripe is held
// from its check until its chunk is written (what one write per record did),
// so a caller that waits for the stripe sees the record either there or
// gone. Only the first stripe of a chunk is waited for; the others are taken
// with TryLock, and a busy one writes the chunk and releases every stripe
// before waiting for it: a sweep never waits while holding a stripe. (Per
// record, a sweep under load wrote one record per group commit, about a
// thousand a second; bench/bench_soak.cc.)
//
// Deletions only, written not durable: losing them in a crash brings back
// records that read as expired. Thread-safety: one thread per object.
class ChunkedSweep {
 public:
  // Records per write: at most 32 stripes of 1,024 held. (ThreadSanitizer's
  // deadlock detector aborts a thread that holds more than 64 locks.)
  static constexpr size_t kChunk = 32;
  explicit ChunkedSweep(RocksDatabase& db) : db_(db), batch_(std::make_unique<RecordBatch>(db)) {}
  ~ChunkedSweep();  // writes what is staged (its status is lost: call Flush to see it)
  ChunkedSweep(const ChunkedSweep&) = delete;
  ChunkedSweep& operator=(const ChunkedSweep&) = delete;

  // Holds `mu` until the chunk is written (at once when held already). May
  // write the chunk first (kChunk stripes held, records staged or not, or
  // `mu` busy): a RecordBatch& taken before it is then stale.
  Status Lock(Mutex& mu);
  // Where the current record's deletions go (after its Lock).
  RecordBatch& batch() { return *batch_; }
  // Runs after the chunk's write, whatever its status, with its stripes
  // still held (a store's per-stripe cache).
  void AfterWrite(std::function<void()> fn) { after_.push_back(std::move(fn)); }
  // The current record is staged: writes the chunk when it is full.
  Status Next();
  // Writes the chunk and releases its stripes.
  Status Flush();

 private:
  RocksDatabase& db_;
  std::unique_ptr<RecordBatch> batch_;
  std::vector<Mutex*> held_;
  std::vector<std::function<void()>> after_;
  size_t records_ = 0;
};

}  // namespace idem::rocks
