#include "daemon/store/rocksdb/rocksdb_plan_store.h"

#include <utility>

#include "daemon/store/record_codec.h"

namespace idem::rocks {
namespace {

std::string StateIndexKey(const Plan& p) {
  return LengthPrefixed(p.state) + BigEndian8(p.created_at_ms) + p.plan_id;
}

}  // namespace

StatusOr<std::optional<Plan>> RocksPlanStore::Load(const std::string& plan_id,
                                                   const rocksdb::Snapshot* snapshot) {
  ASSIGN_OR_RETURN(std::optional<std::string> raw, db_.Get(Family::kPlans, plan_id, snapshot));
  if (!raw) return std::optional<Plan>();
  ASSIGN_OR_RETURN(Json j, store_internal::DecodeJson(*raw, "plan"));
  ASSIGN_OR_RETURN(Plan p, Plan::FromJson(j));
  return std::optional<Plan>(std::move(p));
}

Status RocksPlanStore::Put(const Plan& plan) {
  if (plan.plan_id.empty()) return InvalidArgument("plan_id is empty", "/plan_id");
  if (plan.state.empty()) return InvalidArgument("plan state is empty", "/state");
  if (!plan.actions.is_array()) return InvalidArgument("actions is not an array", "/actions");
  if (!plan.history.is_array()) return InvalidArgument("history is not an array", "/history");
  MutexLock lock(db_.LockFor(Family::kPlans, plan.plan_id));
  ASSIGN_OR_RETURN(std::optional<Plan> current, Load(plan.plan_id));
  if (current) return AlreadyExists("plan " + plan.plan_id + " exists");
  RecordBatch batch(db_);
  batch.PutJson(Family::kPlans, plan.plan_id, plan.ToJson());
  batch.Put(Family::kPlansByState, StateIndexKey(plan), "");
  return db_.Commit(batch, /*durable=*/true);
}

StatusOr<Plan> RocksPlanStore::Get(const std::string& plan_id) {
  ASSIGN_OR_RETURN(std::optional<Plan> p, Load(plan_id));
  if (!p) return NotFound("no such plan: " + plan_id);
  return std::move(*p);
}

StatusOr<Plan> RocksPlanStore::Transition(const std::string& plan_id, const std::string& from,
                                          const std::string& to, const std::string& actor,
                                          const std::string& note, int64_t now_ms) {
  if (to.empty()) return InvalidArgument("target state is empty", "/to");
  MutexLock lock(db_.LockFor(Family::kPlans, plan_id));
  ASSIGN_OR_RETURN(std::optional<Plan> current, Load(plan_id));
  if (!current) return NotFound("no such plan: " + plan_id);
  if (current->state != from) {
    return FailedPrecondition("plan " + plan_id + " is " + current->state + ", not " + from);
  }
  Plan next = *current;
  next.state = to;
  next.updated_at_ms = now_ms;
  next.history.push_back(
      Json{{"from", from}, {"to", to}, {"actor", actor}, {"note", note}, {"at_ms", now_ms}});
  RecordBatch batch(db_);
  batch.Delete(Family::kPlansByState, StateIndexKey(*current));
  batch.Put(Family::kPlansByState, StateIndexKey(next), "");
  batch.PutJson(Family::kPlans, plan_id, next.ToJson());
  RETURN_IF_ERROR(db_.Commit(batch, /*durable=*/true));
  return next;
}

StatusOr<std::vector<Plan>> RocksPlanStore::ByState(const std::string& state, size_t limit) {
  std::vector<Plan> out;
  if (limit == 0) return out;
  std::string prefix = LengthPrefixed(state);
  ScopedSnapshot snapshot(db_.raw());
  rocksdb::ReadOptions ro;
  ro.snapshot = snapshot.get();
  std::unique_ptr<rocksdb::Iterator> it = db_.NewIterator(Family::kPlansByState, ro);
  for (it->Seek(prefix); it->Valid() && out.size() < limit; it->Next()) {
    std::string_view key(it->key().data(), it->key().size());
    if (!key.starts_with(prefix)) break;
    if (key.size() <= prefix.size() + 8) continue;
    ASSIGN_OR_RETURN(std::optional<Plan> p,
                     Load(std::string(key.substr(prefix.size() + 8)), snapshot.get()));
    if (p) out.push_back(std::move(*p));
  }
  RETURN_IF_ERROR(RocksDatabase::IteratorStatus(*it, "listing plans"));
  return out;
}

StatusOr<size_t> RocksPlanStore::SweepFinished(int64_t cutoff_ms, size_t limit) {
  if (limit == 0 || cutoff_ms < 0) return size_t{0};
  size_t swept = 0;
  for (const std::string state : {"applied", "rejected"}) {
    const std::string prefix = LengthPrefixed(state);
    std::vector<std::string> candidates;
    {
      // Oldest created first; a plan last changed after the cutoff was
      // created no later than that, so stop at plans created after it.
      std::string upper = prefix + BigEndian8(cutoff_ms + 1);
      rocksdb::Slice upper_slice(upper);
      rocksdb::ReadOptions ro;
      ro.iterate_upper_bound = &upper_slice;
      std::unique_ptr<rocksdb::Iterator> it = db_.NewIterator(Family::kPlansByState, ro);
      for (it->Seek(prefix); it->Valid() && candidates.size() < limit; it->Next()) {
        candidates.push_back(it->key().ToString());
      }
      RETURN_IF_ERROR(RocksDatabase::IteratorStatus(*it, "scanning plans"));
    }
    for (const std::string& index_key : candidates) {
      if (index_key.size() <= prefix.size() + 8) continue;
      const std::string plan_id = index_key.substr(prefix.size() + 8);
      MutexLock lock(db_.LockFor(Family::kPlans, plan_id));
      ASSIGN_OR_RETURN(std::optional<Plan> p, Load(plan_id));
      if (!p || p->state != state || p->updated_at_ms > cutoff_ms) continue;
      RecordBatch batch(db_);
      batch.Delete(Family::kPlans, plan_id);
      batch.Delete(Family::kPlansByState, index_key);
      // Losing a sweep in a crash only brings back a finished plan.
      RETURN_IF_ERROR(db_.Commit(batch, /*durable=*/false));
      ++swept;
    }
  }
  return swept;
}

}  // namespace idem::rocks
