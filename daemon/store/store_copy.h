// Copying a whole store from one engine to another: `idem store copy`
// moves a stopped daemon's RocksDB store into a PostgreSQL schema, so that
// several daemons can share it with nothing lost (issue 13).
//
// Two halves meet at StoreRecordVisitor, a walk over the typed records of
// store.h:
//   - VisitRocksStore (store/rocksdb/rocksdb_export.cc) opens the RocksDB
//     folder (Unavailable while a daemon holds it: stop the daemon first),
//     takes one snapshot and hands every record of every column family to
//     the visitor, decoded with the same codecs the RocksDB stores use. The
//     index families are not visited: they are derived from the records.
//   - PgImporter (store/postgres/pg_import.cc) writes what it is handed into
//     an empty PostgreSQL schema, as it is: same ids, seqs, hashes, times,
//     states and attempts.
// CopyRocksToPostgres joins the two.
//
// What is copied, and how:
//   - decisions (superseded ones too) and which one is cached per key;
//   - Idempotency-Key records; a record still in progress belonged to the
//     stopped daemon, so it arrives released (ran = true), exactly what that
//     daemon would have done to its own orphans at its next start
//     (IdemKeyStore::ReleaseOwnInProgress): a retry runs again instead of
//     waiting for a lease nobody will end;
//   - the journal: every item with its state, attempt, result and times; a
//     running item keeps its lease (token and locked_until), so it is taken
//     over once the lease ends, as after a crash;
//   - plans with their history, escalations;
//   - the audit chain: every event as stored and the head (seq and hash), so
//     AuditLog::Check verifies the copy with the same head hash;
//   - the outbox: events with their seqs, each subscriber's cursor, dead
//     letters; the PostgreSQL sequence continues after the highest seq the
//     RocksDB store used (events retention deleted included), so no seq is
//     given twice; and how far retention deleted, so a /v1/events cursor
//     below it is still refused (409) after the move;
//   - meta (prompt hashes, cost counters, ...) except the RocksDB engine's
//     own bookkeeping (audit head, outbox cursors, its instance id, ...),
//     which the records above carry;
//   - trace entries.
// Named leases are not copied: they are held by processes, and the process
// that held them is stopped. CopyCounts::leases_skipped says how many.
//
// The copy is one transaction: it is in the schema whole or not at all, so a
// failed copy can simply be run again. It refuses (FailedPrecondition) a
// schema that already holds records of any family.
//
// Thread-safety: a visitor is driven by one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "daemon/core/status.h"
#include "daemon/store/store.h"

namespace idem {

// Every record of a store, one call each. A visitor that returns an error
// stops the walk (the error is returned).
class StoreRecordVisitor {
 public:
  virtual ~StoreRecordVisitor() = default;
  virtual Status OnDecision(const Decision& d) = 0;
  // `decision_key` answers with `decision_id` (visited after every decision).
  virtual Status OnCachedDecision(const std::string& decision_key,
                                  const std::string& decision_id) = 0;
  virtual Status OnIdemRecord(const IdemRecord& r) = 0;
  virtual Status OnWorkItem(const WorkItem& w) = 0;
  virtual Status OnPlan(const Plan& p) = 0;
  // In seq order.
  virtual Status OnAuditEvent(const AuditEvent& e) = 0;
  // The head the writer recorded; not called when the store has none.
  virtual Status OnAuditHead(uint64_t seq, const std::string& hash) = 0;
  virtual Status OnEscalation(const Escalation& e) = 0;
  // In seq order.
  virtual Status OnOutboxEvent(const OutboxEvent& e) = 0;
  virtual Status OnOutboxCursor(const std::string& subscriber, uint64_t seq) = 0;
  virtual Status OnOutboxDeadLetter(const OutboxDeadLetter& dl) = 0;
  // The highest seq the store ever gave (events retention deleted count).
  virtual Status OnOutboxLastSeq(uint64_t seq) = 0;
  // The highest seq retention deleted (OutboxStore::SweptThrough); not
  // called when nothing was deleted. The copy keeps refusing a reader whose
  // cursor is below it (it would skip those events unseen).
  virtual Status OnOutboxSweptThrough(uint64_t seq) = 0;
  virtual Status OnMeta(const std::string& key, const std::string& value) = 0;
  // In time order within each trace.
  virtual Status OnTrace(const TraceEntry& e) = 0;
  // A named lease, seen but not a record to copy.
  virtual Status OnLease(const NamedLease& l) = 0;
};

// How many records of each family were copied.
struct CopyCounts {
  uint64_t decisions = 0;
  uint64_t cached_decision_keys = 0;
  uint64_t idem_keys = 0;
  uint64_t idem_keys_released = 0;  // of idem_keys: in progress, arrived released
  uint64_t work_items = 0;
  uint64_t plans = 0;
  uint64_t audit_events = 0;
  uint64_t escalations = 0;
  uint64_t outbox_events = 0;
  uint64_t outbox_cursors = 0;
  uint64_t outbox_dead_letters = 0;
  uint64_t meta = 0;
  uint64_t traces = 0;
  uint64_t leases_skipped = 0;  // transient: not copied

  Json ToJson() const;
};

// Walks the RocksDB store at `path` (see above). NotFound when there is no
// store there; Unavailable when a daemon holds it.
Status VisitRocksStore(const std::string& path, StoreRecordVisitor& visitor);
// The same, with the visitor made only once the folder is open (so known to
// be free): a copy refused because a daemon holds the folder creates nothing
// on the server.
Status VisitRocksStore(const std::string& path,
                       const std::function<StatusOr<StoreRecordVisitor*>()>& visitor_once_open);

// Writes visited records into a PostgreSQL schema in one transaction.
class PgImporter : public StoreRecordVisitor {
 public:
  // Connects, applies the migrations, checks that the schema holds no
  // record (FailedPrecondition naming a table that has rows) and begins the
  // transaction.
  static StatusOr<std::unique_ptr<PgImporter>> Open(const PgStoreOptions& options);
  // Ends the records: sets the audit head and the outbox sequence, commits.
  // Without Commit nothing is kept.
  virtual StatusOr<CopyCounts> Commit() = 0;
};

// VisitRocksStore into a PgImporter, committed.
StatusOr<CopyCounts> CopyRocksToPostgres(const std::string& rocks_path,
                                         const PgStoreOptions& options);

}  // namespace idem
