// The hash-chained audit log (store.h, class AuditLog) on RocksDB.
//
// Family "audit" holds BE8(seq) -> AuditEvent JSON (with hash). Each event's
// hash = sha256_hex(prev_hash + JCS(event without hash)), so changing,
// removing or reordering a stored event breaks every later link. Each append
// also writes the head, meta "audit.head" = {"seq","hash"} of the new event,
// in the same atomic batch; Check recomputes the chain (AuditChainCheck) and
// compares its end with that head, so events removed from the end are
// detected after a restart too. A log with events but no head record was
// tampered with (every append writes one) and fails Check at seq 1.
//
// Appends are serialized by one mutex held across the durable write: the
// chain is a sequence, and releasing earlier could let event N+1 reach the
// disk without event N if the process died in between.
//
// Thread-safety: all methods may be called concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "daemon/core/mutex.h"
#include "daemon/store/rocksdb/rocksdb_database.h"
#include "daemon/store/store.h"

namespace idem::rocks {

class RocksAuditLog final : public AuditLog {
 public:
  // Reads the head of the chain. `db` must outlive the log.
  static StatusOr<std::unique_ptr<RocksAuditLog>> Create(RocksDatabase& db);

  StatusOr<uint64_t> Append(AuditEvent event) override;
  // Appends `event` in one atomic write with whatever `also` adds to the
  // batch (a plan's change): both land or neither. `also` runs under the
  // log's lock; it may refuse (its error is returned, nothing written).
  StatusOr<uint64_t> AppendWith(AuditEvent event, const std::function<Status(RecordBatch&)>& also);
  StatusOr<std::vector<AuditEvent>> Scan(uint64_t from_seq, size_t limit) override;
  StatusOr<AuditVerification> Check() override;

 private:
  explicit RocksAuditLog(RocksDatabase& db) : db_(db) {}

  RocksDatabase& db_;
  Mutex mu_;
  uint64_t last_seq_ GUARDED_BY(mu_) = 0;
  std::string last_hash_ GUARDED_BY(mu_);
  // Events on disk but no head record at open; cleared by the next append.
  bool head_missing_ GUARDED_BY(mu_) = false;
};

}  // namespace idem::rocks
