// Plans (store.h, class PlanStore) on RocksDB.
//
// Family "plans" holds plan_id -> Plan JSON; "plans_by_state" indexes
// LP(state) | BE8(created_at) | plan_id so ByState reads one range, oldest
// first (List reads it backwards, newest first); "plans_finished"
// (BE8(updated_at) | plan_id) lists the applied, rejected and expired ones
// in the order their windows end, so a sweep reads only what is past its
// window, however many plans finished later were created before them.
// Put and Change hold the plan_id's lock stripe, then (with an audit
// event) the audit log's lock: the plan and its audit event are one atomic
// write.
//
// Thread-safety: all methods may be called concurrently.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "daemon/store/rocksdb/rocksdb_audit_log.h"
#include "daemon/store/rocksdb/rocksdb_database.h"
#include "daemon/store/store.h"

namespace idem::rocks {

class RocksPlanStore final : public PlanStore {
 public:
  // `db` must outlive this object.
  // `db` and `audit` must outlive this object.
  RocksPlanStore(RocksDatabase& db, RocksAuditLog& audit) : db_(db), audit_(audit) {}

  Status Put(const Plan& plan, const AuditEvent* audit = nullptr) override;
  StatusOr<Plan> Get(const std::string& plan_id) override;
  StatusOr<Plan> Change(const std::string& plan_id, const PlanChange& change) override;
  StatusOr<std::vector<Plan>> ByState(const std::string& state, size_t limit) override;
  StatusOr<size_t> CountByState(const std::string& state, size_t cap) override;
  StatusOr<PlanPage> List(const std::string& state, size_t limit,
                          const std::string& cursor) override;
  StatusOr<size_t> SweepFinished(int64_t cutoff_ms, size_t limit) override;
  StatusOr<size_t> DeleteProposed(const std::vector<DecisionPlan>& plans) override;

  // A store written before "plans_finished": lists its finished plans
  // there once (RocksDatabase::IndexOnce). Called when the store opens.
  static Status IndexLegacyFinished(RocksDatabase& db);
  static constexpr char kIndexedMarker[] = "plans.finished_indexed";

 private:
  StatusOr<std::optional<Plan>> Load(const std::string& plan_id,
                                     const rocksdb::Snapshot* snapshot = nullptr);

  // Commits `batch`, with `audit` appended to the chain in the same write.
  Status Commit(const std::function<void(RecordBatch&)>& stage, const AuditEvent* audit,
                Json detail);

  RocksDatabase& db_;
  RocksAuditLog& audit_;
};

}  // namespace idem::rocks
