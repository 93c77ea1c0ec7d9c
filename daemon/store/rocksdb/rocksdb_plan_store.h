// Plans (store.h, class PlanStore) on RocksDB.
//
// Family "plans" holds plan_id -> Plan JSON; "plans_by_state" indexes
// LP(state) | BE8(created_at) | plan_id so ByState reads one range, oldest
// first. Put and Transition hold the plan_id's lock stripe.
//
// Thread-safety: all methods may be called concurrently.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "daemon/store/rocksdb/rocksdb_database.h"
#include "daemon/store/store.h"

namespace idem::rocks {

class RocksPlanStore final : public PlanStore {
 public:
  // `db` must outlive this object.
  explicit RocksPlanStore(RocksDatabase& db) : db_(db) {}

  Status Put(const Plan& plan) override;
  StatusOr<Plan> Get(const std::string& plan_id) override;
  StatusOr<Plan> Transition(const std::string& plan_id, const std::string& from,
                            const std::string& to, const std::string& actor,
                            const std::string& note, int64_t now_ms) override;
  StatusOr<std::vector<Plan>> ByState(const std::string& state, size_t limit) override;
  StatusOr<size_t> SweepFinished(int64_t cutoff_ms, size_t limit) override;

 private:
  StatusOr<std::optional<Plan>> Load(const std::string& plan_id,
                                     const rocksdb::Snapshot* snapshot = nullptr);

  RocksDatabase& db_;
};

}  // namespace idem::rocks
