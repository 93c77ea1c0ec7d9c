// Escalations (store.h, class EscalationStore) on RocksDB.
//
// "escalations" holds escalation_id -> Escalation JSON; "escalations_open"
// maps a decision_key to its open escalation (at most one), so a repeated
// decide finds it with one point read; "escalations_by_time" lists newest
// first; a list of the open ones reads the open index, never the resolved
// records; "escalations_resolved" (BE8(resolved_at) | id) lists the
// resolved ones oldest first, so a sweep reads only what is past its
// window, however many stay open. Put and Resolve hold the decision key's lock stripe, so two
// escalations for one key, or two resolutions of one escalation, cannot
// interleave.
//
// Thread-safety: all methods may be called concurrently.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "daemon/store/rocksdb/rocksdb_database.h"
#include "daemon/store/store.h"

namespace idem::rocks {

class RocksEscalationStore final : public EscalationStore {
 public:
  // `db` must outlive this object.
  explicit RocksEscalationStore(RocksDatabase& db) : db_(db) {}

  // List reads at most this many records it does not answer: open ones
  // from the open index (so at most this many open escalations are seen),
  // others from the time index past those of another state.
  static constexpr size_t kMaxScanned = 10'000;

  Status Put(const Escalation& e) override;
  StatusOr<Escalation> Get(const std::string& escalation_id) override;
  StatusOr<Escalation> OpenByKey(const std::string& decision_key) override;
  StatusOr<std::vector<Escalation>> List(const std::string& state, size_t limit) override;
  StatusOr<size_t> CountOpen(size_t cap) override;
  StatusOr<Escalation> Resolve(const std::string& escalation_id, const std::string& decision_id,
                               const std::string& actor, int64_t now_ms) override;
  StatusOr<size_t> SweepResolved(int64_t cutoff_ms, size_t limit) override;

  // A store written before "escalations_resolved": lists its resolved
  // escalations there once (RocksDatabase::IndexOnce). Called when the
  // store opens.
  static Status IndexLegacyResolved(RocksDatabase& db);
  static constexpr char kIndexedMarker[] = "escalations.resolved_indexed";

 private:
  StatusOr<std::optional<Escalation>> Load(const std::string& id,
                                           const rocksdb::Snapshot* snapshot = nullptr);
  RocksDatabase& db_;
};

}  // namespace idem::rocks
