// The effects journal (store.h, class Journal) on RocksDB.
//
// Records live in family "journal" (work_id -> WorkItem JSON); four index
// families are kept exact in the same WriteBatch as the record:
//   journal_due     pending/failed at next_attempt_at, running at locked_until
//   journal_dead    dead items by time of death
//   journal_run     items by run_id
//   journal_done_ref done items with an external_ref, by kind
//   journal_expiry  done items with a window, by expires_at
// so Due, DeadLetters, ByRun, DoneWithRef and SweepExpired read an index
// range, never the whole journal.
//
// Claim reads without a lock first: an outcome that writes nothing (done,
// dead, busy) is answered from that read, costing no lock and no fsync.
// Only a claim that writes takes the work_id's lock stripe and re-reads.
// BeginOps/FinishOps do the same for a whole batch of claims, completes and
// fails with one write and one fsync; Complete and Fail are one-op batches.
//
// Each lock stripe keeps, under that stripe, a version (bumped after every
// journal write under it) and the record last written under it. A claim
// whose stripe version is unchanged between its lock-free read and taking
// the lock uses that read instead of reading again; an op whose work_id is
// the stripe's last written record (a complete right after its claim) takes
// it from there instead of reading and decoding the stored one. Every write
// of the journal family holds the key's stripe, so both stay exact; the
// cache holds at most one record per stripe and is empty at start.
//
// Thread-safety: all methods may be called concurrently.
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/store/rocksdb/rocksdb_database.h"
#include "daemon/store/store.h"

namespace idem::rocks {

class RocksJournal final : public Journal {
 public:
  // `db` must outlive this object.
  explicit RocksJournal(RocksDatabase& db) : db_(db) {}

  StatusOr<ClaimResult> Claim(const ClaimRequest& req) override;
  // Takes the lock stripes of every writing op in address order (with
  // kSkipBusy: those free at once), stages all records in one RecordBatch
  // and queues it (group_commit.h); FinishOps releases the stripes, on the
  // same thread, once the write is over. No deadlock: a caller blocks for a
  // stripe only while it holds no pending stripes (kBlock), taking them in
  // address order, and every other holder of a stripe holds just that one
  // and waits for nothing but the write.
  std::unique_ptr<PendingOps> BeginOps(std::span<const JournalOp> ops,
                                       std::function<void()> on_durable, LockWait wait) override;
  std::vector<StatusOr<JournalOpResult>> FinishOps(std::unique_ptr<PendingOps> pending) override;
  StatusOr<WorkItem> Enqueue(const ClaimRequest& req) override;
  Status Complete(const std::string& work_id, const std::string& lease_token, const Json& result,
                  const std::string& external_ref, int64_t now_ms) override;
  Status RecordExternalRef(const std::string& work_id, const std::string& lease_token,
                           const std::string& external_ref, int64_t now_ms) override;
  StatusOr<WorkItem> Fail(const std::string& work_id, const std::string& lease_token,
                          const std::string& error, bool retryable, int64_t retry_at_ms,
                          int64_t now_ms) override;
  StatusOr<WorkItem> Get(const std::string& work_id) override;
  using Journal::Due;
  StatusOr<std::vector<WorkItem>> Due(int64_t now_ms, size_t n,
                                      const std::vector<std::string>& skip_kinds) override;
  StatusOr<std::vector<WorkItem>> DeadLetters(size_t limit) override;
  StatusOr<size_t> CountDeadLetters(size_t cap) override;
  StatusOr<WorkItem> Requeue(const std::string& work_id, int64_t now_ms) override;
  using Journal::ByRun;
  StatusOr<std::vector<WorkItem>> ByRun(const std::string& run_id, size_t limit,
                                        const RunPosition& after) override;
  Status AddToRun(const std::string& work_id, const std::string& run_id) override;
  StatusOr<std::vector<WorkItem>> DoneWithRef(const std::string& kind, size_t limit) override;
  StatusOr<size_t> SweepExpired(int64_t now_ms, size_t limit) override;

 private:
  StatusOr<std::optional<WorkItem>> Load(const std::string& work_id,
                                         const rocksdb::Snapshot* snapshot = nullptr);
  // Stages `after` (or the deletion when null) and moves its index entries
  // from those of `before`.
  void Stage(RecordBatch& batch, const std::optional<WorkItem>& before, const WorkItem* after);
  // The holder's running record, or FailedPrecondition / NotFound.
  StatusOr<WorkItem> LoadHeld(const std::string& work_id, const std::string& lease_token);
  StatusOr<JournalOpResult> RunOne(JournalOp op);
  // Up to `limit` items named by the index keys `prefix | BE8 | work_id`.
  // The items an index lists under `prefix`, in key order, from the first
  // key after `after` (a whole key; "": from the start of the prefix).
  StatusOr<std::vector<WorkItem>> ScanIndex(Family f, const std::string& prefix, size_t limit,
                                            const std::string& after = "");

  // Per lock stripe of the journal family (see above). `version` is read
  // without the stripe, written with it; the rest only with it held.
  struct StripeState {
    std::atomic<uint64_t> version{0};
    bool cached = false;             // `item` is what `work_id` holds
    std::string work_id;             // of `item`, when cached
    std::unique_ptr<WorkItem> item;  // allocated on the stripe's first write
  };

 public:
  // For this journal's batches, with stripe `stripe` held, after a write
  // under it: `stored` is what `work_id` now holds; nullopt forgets the
  // stripe's record (a failed write, a deletion, a write not worth keeping).
  // Bumps the stripe's version either way.
  void NoteWrite(size_t stripe, const std::string& work_id, std::optional<WorkItem> stored);

 private:
  RocksDatabase& db_;
  std::array<StripeState, RocksDatabase::kStripes> stripes_;
};

}  // namespace idem::rocks
