#include "daemon/store/rocksdb/rocksdb_journal.h"

#include <algorithm>
#include <limits>
#include <map>
#include <utility>

#include "daemon/core/crypto.h"
#include "daemon/store/journal_rules.h"
#include "daemon/store/record_codec.h"

namespace idem::rocks {

using namespace ::idem::journal_rules;  // NOLINT: the rules both engines share
namespace {

std::vector<std::pair<Family, std::string>> IndexEntries(const WorkItem& w) {
  std::vector<std::pair<Family, std::string>> out;
  switch (w.state) {
    case WorkState::kPending:
    case WorkState::kFailed:
      out.emplace_back(Family::kJournalDue, BigEndian8(w.next_attempt_at_ms) + w.work_id);
      break;
    case WorkState::kRunning:
      out.emplace_back(Family::kJournalDue, BigEndian8(w.locked_until_ms) + w.work_id);
      break;
    case WorkState::kDone:
      if (!w.external_ref.empty()) {
        out.emplace_back(Family::kJournalDoneRef,
                         LengthPrefixed(w.kind) + InvertedBigEndian8(w.updated_at_ms) + w.work_id);
      }
      if (w.expires_at_ms != 0) {
        out.emplace_back(Family::kJournalExpiry, BigEndian8(w.expires_at_ms) + w.work_id);
      }
      break;
    case WorkState::kDead:
      out.emplace_back(Family::kJournalDead, BigEndian8(w.updated_at_ms) + w.work_id);
      break;
  }
  if (!w.run_id.empty()) {
    out.emplace_back(Family::kJournalRun,
                     LengthPrefixed(w.run_id) + BigEndian8(w.created_at_ms) + w.work_id);
  }
  // The runs that took it in later: in the same index, in its place by
  // creation time; dropped with the record (Stage), or with the run when
  // the record leaves it.
  for (const std::string& run : w.other_runs) {
    out.emplace_back(Family::kJournalRun,
                     LengthPrefixed(run) + BigEndian8(w.created_at_ms) + w.work_id);
  }
  return out;
}

std::string WorkLabel(const std::string& work_id) { return "work " + work_id; }

}  // namespace

StatusOr<std::optional<WorkItem>> RocksJournal::Load(const std::string& work_id,
                                                     const rocksdb::Snapshot* snapshot) {
  ASSIGN_OR_RETURN(std::optional<std::string> raw, db_.Get(Family::kJournal, work_id, snapshot));
  if (!raw) return std::optional<WorkItem>();
  ASSIGN_OR_RETURN(WorkItem w, store_internal::DecodeWorkItem(*raw));
  return std::optional<WorkItem>(std::move(w));
}

void RocksJournal::Stage(RecordBatch& batch, const std::optional<WorkItem>& before,
                         const WorkItem* after) {
  std::vector<std::pair<Family, std::string>> old_entries;
  if (before) old_entries = IndexEntries(*before);
  std::vector<std::pair<Family, std::string>> new_entries;
  if (after != nullptr) new_entries = IndexEntries(*after);
  for (const auto& e : old_entries) {
    bool kept = false;
    for (const auto& n : new_entries) kept = kept || n == e;
    if (!kept) batch.Delete(e.first, e.second);
  }
  for (const auto& e : new_entries) {
    bool existed = false;
    for (const auto& o : old_entries) existed = existed || o == e;
    if (!existed) batch.Put(e.first, e.second, "");
  }
  // The outbox hears of work done and work dead, in this same write.
  if (after != nullptr) {
    StatusOr<std::optional<WorkEvent>> event = WorkEventFor(before, *after);
    if (!event.ok()) {
      batch.Fail(event.status());
    } else if (*event) {
      batch.AddOutboxEventText((*event)->type, after->work_id, after->updated_at_ms,
                               (*event)->data);
    }
  }
  if (after != nullptr) {
    StatusOr<std::string> text = store_internal::EncodeWorkItem(*after);
    if (text.ok()) {
      batch.Put(Family::kJournal, after->work_id, *text);
    } else {
      batch.Fail(text.status());
    }
  } else if (before) {
    batch.Delete(Family::kJournal, before->work_id);
  }
}

void RocksJournal::NoteWrite(size_t stripe, const std::string& work_id,
                             std::optional<WorkItem> stored) {
  StripeState& s = stripes_[stripe];
  s.cached = stored.has_value();
  if (stored) {
    s.work_id = work_id;
    if (s.item == nullptr) {
      s.item = std::make_unique<WorkItem>(std::move(*stored));
    } else {
      *s.item = std::move(*stored);
    }
  }
  // After the write is visible: a reader that saw the old version re-reads.
  s.version.fetch_add(1, std::memory_order_release);
}

StatusOr<ClaimResult> RocksJournal::Claim(const ClaimRequest& req) {
  RETURN_IF_ERROR(ValidateRequest(req));
  const size_t stripe = RocksDatabase::StripeOf(Family::kJournal, req.work_id);
  // Any outcome that writes nothing is linearizable at this read.
  const uint64_t seen_version = stripes_[stripe].version.load(std::memory_order_acquire);
  ASSIGN_OR_RETURN(std::optional<WorkItem> current, Load(req.work_id));
  if (std::optional<ClaimOutcome> o = ReadOnlyOutcome(current, req.now_ms)) {
    return ClaimResult{*o, Scrubbed(std::move(*current))};
  }
  MutexLock lock(db_.LockFor(Family::kJournal, req.work_id));
  // Written since the read above: read again.
  if (stripes_[stripe].version.load(std::memory_order_relaxed) != seen_version) {
    ASSIGN_OR_RETURN(current, Load(req.work_id));
    if (std::optional<ClaimOutcome> o = ReadOnlyOutcome(current, req.now_ms)) {
      return ClaimResult{*o, Scrubbed(std::move(*current))};
    }
  }
  ClaimResult r = ClaimTransition(current, req);
  RecordBatch batch(db_);
  Stage(batch, current, &r.item);
  Status written = db_.Commit(batch, /*durable=*/true);
  NoteWrite(stripe, req.work_id, written.ok() ? std::optional<WorkItem>(r.item) : std::nullopt);
  RETURN_IF_ERROR(written);
  if (r.outcome != ClaimOutcome::kClaimed) r.item = Scrubbed(std::move(r.item));
  return r;
}

namespace {

// A batch of ops between BeginOps and FinishOps: the outcomes, the stripes
// held for the writing ones, and their write in flight.
class RocksPendingOps final : public Journal::PendingOps {
 public:
  explicit RocksPendingOps(RocksDatabase& db, RocksJournal& journal, size_t n)
      : db(db),
        journal(journal),
        batch(db),
        results(n, StatusOr<JournalOpResult>(Internal("op not decided"))) {}
  ~RocksPendingOps() override { Settle(); }

  bool Ready() const override { return ticket == nullptr || ticket->done(); }
  const std::vector<size_t>& Skipped() const override { return skipped; }

  // Waits for the write, releases the stripes, applies the write's status.
  // The stripes are a run-time set taken in BeginClaims.
  void Settle() NO_THREAD_SAFETY_ANALYSIS {
    if (settled) return;
    settled = true;
    Status written = staged;
    if (written.ok() && ticket != nullptr) {
      written = db.Translate(ticket->Wait(), "writing");
    }
    // Still under the stripes: what each written work_id now holds.
    for (auto& [work_id, item] : staged_items) {
      journal.NoteWrite(RocksDatabase::StripeOf(Family::kJournal, work_id), work_id,
                        written.ok() ? std::optional<WorkItem>(std::move(item)) : std::nullopt);
    }
    for (auto it = stripes.rbegin(); it != stripes.rend(); ++it) (*it)->Unlock();
    for (size_t i : writers) {
      if (!written.ok()) {
        results[i] = written;
      } else if (results[i]->outcome != ClaimOutcome::kClaimed) {
        results[i]->item = Scrubbed(std::move(results[i]->item));
      }
    }
  }

  RocksDatabase& db;
  RocksJournal& journal;
  RecordBatch batch;
  std::vector<StatusOr<JournalOpResult>> results;
  // The record staged for each work_id written (the last one when an op
  // batch writes a work_id twice).
  std::map<std::string, WorkItem, std::less<>> staged_items;
  std::vector<Mutex*> stripes;  // held, in address order
  std::vector<size_t> writers;  // results whose outcome is written
  std::vector<size_t> skipped;  // ops whose stripe was busy (kSkipBusy)
  Status staged;                // a staging or queueing error
  std::shared_ptr<GroupCommit::Ticket> ticket;
  bool settled = false;
};

}  // namespace

// Takes a run-time set of stripes that RocksPendingOps::Settle releases:
// beyond what the thread-safety analysis can follow.
std::unique_ptr<Journal::PendingOps> RocksJournal::BeginOps(
    std::span<const JournalOp> ops, std::function<void()> on_durable,
    LockWait wait) NO_THREAD_SAFETY_ANALYSIS {
  auto p = std::make_unique<RocksPendingOps>(db_, *this, ops.size());
  // A claim's lock-free read, kept for use under the lock while its
  // stripe's version says nothing was written since.
  struct Seen {
    bool read = false;
    uint64_t version = 0;
    std::optional<WorkItem> item;
  };
  std::vector<Seen> seen(ops.size());
  // Lock-free first pass: invalid requests and claims that write nothing.
  std::vector<size_t> candidates;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (Status v = ValidateOp(ops[i]); !v.ok()) {
      p->results[i] = v;
      continue;
    }
    if (ops[i].type == JournalOp::Type::kClaim) {
      const ClaimRequest& req = ops[i].claim;
      const size_t stripe = RocksDatabase::StripeOf(Family::kJournal, req.work_id);
      const uint64_t version = stripes_[stripe].version.load(std::memory_order_acquire);
      StatusOr<std::optional<WorkItem>> loaded = Load(req.work_id);
      if (!loaded.ok()) {
        p->results[i] = loaded.status();
        continue;
      }
      if (std::optional<ClaimOutcome> o = ReadOnlyOutcome(*loaded, req.now_ms)) {
        p->results[i] = JournalOpResult{.outcome = *o, .item = Scrubbed(std::move(**loaded))};
        continue;
      }
      seen[i] = Seen{.read = true, .version = version, .item = std::move(*loaded)};
    }
    candidates.push_back(i);
  }
  if (candidates.empty()) {
    if (on_durable) on_durable();
    return p;
  }

  std::vector<Mutex*> wanted;
  for (size_t i : candidates) wanted.push_back(&db_.LockFor(Family::kJournal, OpWorkId(ops[i])));
  std::sort(wanted.begin(), wanted.end());
  wanted.erase(std::unique(wanted.begin(), wanted.end()), wanted.end());
  for (Mutex* m : wanted) {
    if (wait == LockWait::kBlock) {
      m->Lock();
    } else if (!m->TryLock()) {
      continue;
    }
    p->stripes.push_back(m);
  }
  if (p->stripes.size() < wanted.size()) {
    std::vector<size_t> kept;
    for (size_t i : candidates) {
      Mutex* m = &db_.LockFor(Family::kJournal, OpWorkId(ops[i]));
      if (std::binary_search(p->stripes.begin(), p->stripes.end(), m)) {
        kept.push_back(i);
      } else {
        p->results[i] = Unavailable("op skipped: its lock stripe is busy", true);
        p->skipped.push_back(i);
      }
    }
    candidates.swap(kept);
  }

  // Under the locks: re-read, decide, stage. A work_id seen earlier in this
  // batch reads the record staged for it, not the stored one; else the
  // stripe's last written record when it is this work_id's, else the
  // claim's own read when nothing was written under its stripe since.
  std::map<std::string, WorkItem, std::less<>>& staged = p->staged_items;
  for (size_t i : candidates) {
    const JournalOp& op = ops[i];
    const std::string& work_id = OpWorkId(op);
    StripeState& stripe = stripes_[RocksDatabase::StripeOf(Family::kJournal, work_id)];
    std::optional<WorkItem> current;
    if (auto it = staged.find(work_id); it != staged.end()) {
      current = it->second;
    } else if (stripe.cached && stripe.work_id == work_id) {
      current = std::move(*stripe.item);  // noted again by Settle when this op writes
      stripe.cached = false;
    } else if (seen[i].read && stripe.version.load(std::memory_order_relaxed) == seen[i].version) {
      current = std::move(seen[i].item);
    } else {
      StatusOr<std::optional<WorkItem>> loaded = Load(work_id);
      if (!loaded.ok()) {
        p->results[i] = loaded.status();
        continue;
      }
      current = std::move(*loaded);
    }
    JournalOpResult r;
    if (op.type == JournalOp::Type::kClaim) {
      if (std::optional<ClaimOutcome> o = ReadOnlyOutcome(current, op.claim.now_ms)) {
        p->results[i] = JournalOpResult{.outcome = *o, .item = Scrubbed(std::move(*current))};
        continue;
      }
      r = OpResultOf(ClaimTransition(current, op.claim));
    } else {
      bool writes = false;
      StatusOr<JournalOpResult> settled = CompleteOrFail(current, op, &writes);
      if (!settled.ok() || !writes) {
        p->results[i] = std::move(settled);
        continue;
      }
      r = std::move(settled).value();
    }
    Stage(p->batch, current, &r.item);
    staged.insert_or_assign(work_id, r.item);
    p->results[i] = std::move(r);
    p->writers.push_back(i);
  }
  if (p->writers.empty()) {
    if (on_durable) on_durable();
    return p;
  }
  StatusOr<std::shared_ptr<GroupCommit::Ticket>> queued =
      db_.CommitAsync(p->batch, /*durable=*/true, on_durable);
  if (!queued.ok()) {
    p->staged = queued.status();
  } else {
    p->ticket = std::move(*queued);
  }
  if (p->ticket == nullptr && on_durable) on_durable();
  return p;
}

std::vector<StatusOr<JournalOpResult>> RocksJournal::FinishOps(
    std::unique_ptr<PendingOps> pending) {
  auto& p = static_cast<RocksPendingOps&>(*pending);
  p.Settle();
  return std::move(p.results);
}

StatusOr<WorkItem> RocksJournal::Enqueue(const ClaimRequest& req) {
  RETURN_IF_ERROR(ValidateRequest(req));
  {
    ASSIGN_OR_RETURN(std::optional<WorkItem> seen, Load(req.work_id));
    if (seen && !Expired(*seen, req.now_ms)) return Scrubbed(std::move(*seen));
  }
  MutexLock lock(db_.LockFor(Family::kJournal, req.work_id));
  ASSIGN_OR_RETURN(std::optional<WorkItem> current, Load(req.work_id));
  if (current && !Expired(*current, req.now_ms)) return Scrubbed(std::move(*current));
  WorkItem next = NewItem(req);
  next.state = WorkState::kPending;
  next.next_attempt_at_ms = req.now_ms;
  RecordBatch batch(db_);
  Stage(batch, current, &next);
  Status written = db_.Commit(batch, /*durable=*/true);
  NoteWrite(RocksDatabase::StripeOf(Family::kJournal, req.work_id), req.work_id, std::nullopt);
  RETURN_IF_ERROR(written);
  return next;
}

StatusOr<WorkItem> RocksJournal::LoadHeld(const std::string& work_id,
                                          const std::string& lease_token) {
  ASSIGN_OR_RETURN(std::optional<WorkItem> current, Load(work_id));
  if (!current) return NotFound("no such work: " + work_id);
  if (!Holds(*current, lease_token)) return StaleLeaseStatus(*current);
  return std::move(*current);
}

Status RocksJournal::RecordExternalRef(const std::string& work_id, const std::string& lease_token,
                                       const std::string& external_ref, int64_t now_ms) {
  if (lease_token.empty()) return InvalidArgument("lease token is empty", "/lease_token");
  if (external_ref.empty()) return InvalidArgument("external_ref is empty", "/external_ref");
  MutexLock lock(db_.LockFor(Family::kJournal, work_id));
  ASSIGN_OR_RETURN(WorkItem next, LoadHeld(work_id, lease_token));
  std::optional<WorkItem> before = next;
  next.external_ref = external_ref;
  next.updated_at_ms = now_ms;
  RecordBatch batch(db_);
  Stage(batch, before, &next);
  Status written = db_.Commit(batch, /*durable=*/true);
  NoteWrite(RocksDatabase::StripeOf(Family::kJournal, work_id), work_id, std::nullopt);
  return written;
}

// Complete and Fail are one-op batches, so the lane and the single calls
// share one transition (CompleteOrFail).
StatusOr<JournalOpResult> RocksJournal::RunOne(JournalOp op) {
  std::vector<StatusOr<JournalOpResult>> out =
      FinishOps(BeginOps(std::span<const JournalOp>(&op, 1), nullptr, LockWait::kBlock));
  return std::move(out[0]);
}

Status RocksJournal::Complete(const std::string& work_id, const std::string& lease_token,
                              const Json& result, const std::string& external_ref, int64_t now_ms) {
  JournalOp op;
  op.type = JournalOp::Type::kComplete;
  op.work_id = work_id;
  op.lease_token = lease_token;
  op.result = result;
  op.external_ref = external_ref;
  op.now_ms = now_ms;
  ASSIGN_OR_RETURN(JournalOpResult r, RunOne(std::move(op)));
  return Refusal(r);
}

StatusOr<WorkItem> RocksJournal::Fail(const std::string& work_id, const std::string& lease_token,
                                      const std::string& error, bool retryable, int64_t retry_at_ms,
                                      int64_t now_ms) {
  JournalOp op;
  op.type = JournalOp::Type::kFail;
  op.work_id = work_id;
  op.lease_token = lease_token;
  op.error = error;
  op.retryable = retryable;
  op.now_ms = now_ms;
  op.retry_delay_ms = [retry_at_ms, now_ms](const WorkItem&) { return retry_at_ms - now_ms; };
  ASSIGN_OR_RETURN(JournalOpResult r, RunOne(std::move(op)));
  RETURN_IF_ERROR(Refusal(r));
  return std::move(r.item);
}

StatusOr<WorkItem> RocksJournal::Get(const std::string& work_id) {
  ASSIGN_OR_RETURN(std::optional<WorkItem> current, Load(work_id));
  if (!current) return NotFound("no such work: " + work_id);
  return Scrubbed(std::move(*current));
}

StatusOr<std::vector<WorkItem>> RocksJournal::Due(int64_t now_ms, size_t n,
                                                  const std::vector<std::string>& skip_kinds) {
  std::vector<WorkItem> out;
  if (n == 0 || now_ms < 0) return out;
  ScopedSnapshot snapshot(db_.raw());
  // Index keys start with BE8(due_at); everything below BE8(now + 1) is due.
  int64_t bound = now_ms == std::numeric_limits<int64_t>::max() ? now_ms : now_ms + 1;
  std::string upper = BigEndian8(bound);
  rocksdb::Slice upper_slice(upper);
  rocksdb::ReadOptions ro;
  ro.snapshot = snapshot.get();
  ro.iterate_upper_bound = &upper_slice;
  std::unique_ptr<rocksdb::Iterator> it = db_.NewIterator(Family::kJournalDue, ro);
  for (it->SeekToFirst(); it->Valid() && out.size() < n; it->Next()) {
    std::string_view key(it->key().data(), it->key().size());
    if (key.size() <= 8) continue;
    std::string work_id(key.substr(8));
    ASSIGN_OR_RETURN(std::optional<WorkItem> w, Load(work_id, snapshot.get()));
    if (!w) continue;
    if (std::find(skip_kinds.begin(), skip_kinds.end(), w->kind) != skip_kinds.end()) continue;
    bool due = ((w->state == WorkState::kPending || w->state == WorkState::kFailed) &&
                w->next_attempt_at_ms <= now_ms) ||
               (w->state == WorkState::kRunning && w->locked_until_ms <= now_ms);
    if (due) out.push_back(Scrubbed(std::move(*w)));
  }
  RETURN_IF_ERROR(db_.IteratorStatus(*it, "scanning due work"));
  return out;
}

StatusOr<std::vector<WorkItem>> RocksJournal::ScanIndex(Family f, const std::string& prefix,
                                                        size_t limit, const std::string& after) {
  std::vector<WorkItem> out;
  if (limit == 0) return out;
  ScopedSnapshot snapshot(db_.raw());
  rocksdb::ReadOptions ro;
  ro.snapshot = snapshot.get();
  std::unique_ptr<rocksdb::Iterator> it = db_.NewIterator(f, ro);
  if (after.empty()) {
    it->Seek(prefix);
  } else {
    it->Seek(after);
    if (it->Valid() && it->key() == rocksdb::Slice(after)) it->Next();
  }
  for (; it->Valid() && out.size() < limit; it->Next()) {
    std::string_view key(it->key().data(), it->key().size());
    if (!key.starts_with(prefix)) break;
    if (key.size() <= prefix.size() + 8) continue;
    std::string work_id(key.substr(prefix.size() + 8));
    ASSIGN_OR_RETURN(std::optional<WorkItem> w, Load(work_id, snapshot.get()));
    if (w) out.push_back(Scrubbed(std::move(*w)));
  }
  RETURN_IF_ERROR(db_.IteratorStatus(*it, "scanning the journal"));
  return out;
}

StatusOr<std::vector<WorkItem>> RocksJournal::DeadLetters(size_t limit) {
  return ScanIndex(Family::kJournalDead, "", limit);
}

StatusOr<size_t> RocksJournal::CountDeadLetters(size_t cap) {
  return db_.CountKeys(Family::kJournalDead, "", cap, "dead letters");
}

StatusOr<std::vector<WorkItem>> RocksJournal::ByRun(const std::string& run_id, size_t limit,
                                                    const RunPosition& after) {
  if (run_id.empty()) return InvalidArgument("run_id is empty", "/run_id");
  const std::string prefix = LengthPrefixed(run_id);
  // The run index's keys: run | BE8(created_at_ms) | work_id (IndexEntries).
  return ScanIndex(Family::kJournalRun, prefix, limit,
                   after.start() ? "" : prefix + BigEndian8(after.created_at_ms) + after.work_id);
}

Status RocksJournal::AddToRun(const std::string& work_id, const std::string& run_id) {
  if (run_id.empty()) return InvalidArgument("run_id is empty", "/run_id");
  MutexLock lock(db_.LockFor(Family::kJournal, work_id));
  ASSIGN_OR_RETURN(std::optional<WorkItem> current, Load(work_id));
  if (!current) return NotFound("no such work: " + work_id);
  if (current->run_id == run_id || std::find(current->other_runs.begin(), current->other_runs.end(),
                                             run_id) != current->other_runs.end()) {
    return Status::Ok();
  }
  WorkItem next = *current;
  if (next.other_runs.size() >= kMaxOtherRuns) next.other_runs.erase(next.other_runs.begin());
  next.other_runs.push_back(run_id);
  RecordBatch batch(db_);
  Stage(batch, current, &next);
  Status written = db_.Commit(batch, /*durable=*/false);
  NoteWrite(RocksDatabase::StripeOf(Family::kJournal, work_id), work_id,
            written.ok() ? std::optional<WorkItem>(next) : std::nullopt);
  return written;
}

StatusOr<std::vector<WorkItem>> RocksJournal::DoneWithRef(const std::string& kind, size_t limit) {
  return ScanIndex(Family::kJournalDoneRef, LengthPrefixed(kind), limit);
}

StatusOr<WorkItem> RocksJournal::Requeue(const std::string& work_id, int64_t now_ms) {
  MutexLock lock(db_.LockFor(Family::kJournal, work_id));
  ASSIGN_OR_RETURN(std::optional<WorkItem> current, Load(work_id));
  if (!current) return NotFound("no such work: " + work_id);
  if (current->state != WorkState::kDead) {
    return FailedPrecondition(WorkLabel(work_id) + " is " +
                              std::string(WorkStateName(current->state)) + ", not dead");
  }
  WorkItem next = *current;
  next.state = WorkState::kPending;
  next.attempt = 0;  // a fresh attempt budget
  next.lease_token.clear();
  next.locked_until_ms = 0;
  next.next_attempt_at_ms = now_ms;
  next.updated_at_ms = now_ms;
  next.expires_at_ms = 0;
  RecordBatch batch(db_);
  Stage(batch, current, &next);
  Status written = db_.Commit(batch, /*durable=*/true);
  NoteWrite(RocksDatabase::StripeOf(Family::kJournal, work_id), work_id, std::nullopt);
  RETURN_IF_ERROR(written);
  return next;
}

StatusOr<size_t> RocksJournal::SweepExpired(int64_t now_ms, size_t limit) {
  if (limit == 0 || now_ms < 0) return size_t{0};
  ASSIGN_OR_RETURN(std::vector<std::string> candidates,
                   db_.ExpiredIndexKeys(Family::kJournalExpiry, now_ms, limit, "expired work"));
  size_t swept = 0;
  ChunkedSweep sweep(db_);
  for (const std::string& index_key : candidates) {
    if (index_key.size() <= 8) continue;
    std::string work_id = index_key.substr(8);
    RETURN_IF_ERROR(sweep.Lock(db_.LockFor(Family::kJournal, work_id)));
    ASSIGN_OR_RETURN(std::optional<WorkItem> current, Load(work_id));
    if (current && Expired(*current, now_ms)) {
      Stage(sweep.batch(), current, nullptr);
      ++swept;
    } else {
      sweep.batch().Delete(Family::kJournalExpiry, index_key);  // stale; not expected
    }
    // Losing a sweep in a crash only brings back a record that reads as absent.
    sweep.AfterWrite([this, work_id] {
      NoteWrite(RocksDatabase::StripeOf(Family::kJournal, work_id), work_id, std::nullopt);
    });
    RETURN_IF_ERROR(sweep.Next());
  }
  RETURN_IF_ERROR(sweep.Flush());
  return swept;
}

}  // namespace idem::rocks
