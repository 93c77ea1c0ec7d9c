#include "daemon/store/rocksdb/rocksdb_plan_store.h"

#include <algorithm>
#include <utility>

#include "daemon/core/crypto.h"
#include "daemon/store/record_codec.h"

namespace idem::rocks {
namespace {

std::string StateIndexKey(const Plan& p) {
  return LengthPrefixed(p.state) + BigEndian8(p.created_at_ms) + p.plan_id;
}

bool Finished(const std::string& state) {
  return state == "applied" || state == "rejected" || state == "expired";
}

// Its key in "plans_finished": when its window starts.
std::string FinishedKey(const Plan& p) {
  return BigEndian8(static_cast<uint64_t>(std::max<int64_t>(p.updated_at_ms, 0))) + p.plan_id;
}

// The outbox event's data for a plan entering its state.
Json OutboxData(const Plan& p, const std::string& from, const std::string& actor) {
  Json data = {{"plan_id", p.plan_id}, {"state", p.state}, {"origin", p.origin}};
  if (!from.empty()) data["from"] = from;
  if (!actor.empty()) data["actor"] = actor;
  if (!p.decision_id.empty()) data["decision_id"] = p.decision_id;
  if (!p.step.empty()) data["step"] = p.step;
  return data;
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

Status RocksPlanStore::Commit(const std::function<void(RecordBatch&)>& stage,
                              const AuditEvent* audit, Json detail) {
  if (audit == nullptr) {
    RecordBatch batch(db_);
    stage(batch);
    return db_.Commit(batch, /*durable=*/true);
  }
  AuditEvent event = *audit;
  if (!event.detail.is_object()) event.detail = Json::object();
  for (auto it = detail.begin(); it != detail.end(); ++it) event.detail[it.key()] = it.value();
  // The audit log commits the plan's writes with its event, durably.
  auto appended = audit_.AppendWith(std::move(event), [&stage](RecordBatch& batch) {
    stage(batch);
    return Status::Ok();
  });
  return appended.status();
}

Status RocksPlanStore::Put(const Plan& plan, const AuditEvent* audit) {
  if (plan.plan_id.empty()) return InvalidArgument("plan_id is empty", "/plan_id");
  if (plan.state.empty()) return InvalidArgument("plan state is empty", "/state");
  if (!plan.actions.is_array()) return InvalidArgument("actions is not an array", "/actions");
  if (!plan.history.is_array()) return InvalidArgument("history is not an array", "/history");
  MutexLock lock(db_.LockFor(Family::kPlans, plan.plan_id));
  ASSIGN_OR_RETURN(std::optional<Plan> current, Load(plan.plan_id));
  if (current) return AlreadyExists("plan " + plan.plan_id + " exists");
  return Commit(
      [&plan](RecordBatch& batch) {
        batch.PutJson(Family::kPlans, plan.plan_id, plan.ToJson());
        batch.Put(Family::kPlansByState, StateIndexKey(plan), "");
        if (Finished(plan.state)) batch.Put(Family::kPlansFinished, FinishedKey(plan), "");
        batch.AddOutboxEvent("plan." + plan.state, plan.plan_id,
                             std::max(plan.updated_at_ms, plan.created_at_ms),
                             OutboxData(plan, "", plan.created_by));
      },
      audit, {{"plan_id", plan.plan_id}, {"to", plan.state}});
}

StatusOr<Plan> RocksPlanStore::Get(const std::string& plan_id) {
  ASSIGN_OR_RETURN(std::optional<Plan> p, Load(plan_id));
  if (!p) return NotFound("no such plan: " + plan_id);
  return std::move(*p);
}

StatusOr<Plan> RocksPlanStore::Change(const std::string& plan_id, const PlanChange& change) {
  if (change.to.empty()) return InvalidArgument("target state is empty", "/to");
  MutexLock lock(db_.LockFor(Family::kPlans, plan_id));
  ASSIGN_OR_RETURN(std::optional<Plan> current, Load(plan_id));
  if (!current) return NotFound("no such plan: " + plan_id);
  if (current->state != change.from) {
    return FailedPrecondition("plan " + plan_id + " is " + current->state + ", not " + change.from);
  }
  Plan next = *current;
  if (change.mutate) RETURN_IF_ERROR(change.mutate(next));
  next.plan_id = plan_id;
  next.created_at_ms = current->created_at_ms;  // the index key depends on both
  next.state = change.to;
  next.updated_at_ms = change.now_ms;
  next.history.push_back(Json{{"from", change.from},
                              {"to", change.to},
                              {"actor", change.actor},
                              {"note", change.note},
                              {"at_ms", change.now_ms}});
  const Plan& before = *current;
  RETURN_IF_ERROR(Commit(
      [&](RecordBatch& batch) {
        if (change.from != change.to) {
          batch.Delete(Family::kPlansByState, StateIndexKey(before));
          batch.Put(Family::kPlansByState, StateIndexKey(next), "");
        }
        if (Finished(before.state)) batch.Delete(Family::kPlansFinished, FinishedKey(before));
        if (Finished(next.state)) batch.Put(Family::kPlansFinished, FinishedKey(next), "");
        batch.PutJson(Family::kPlans, plan_id, next.ToJson());
        if (change.from != change.to) {
          batch.AddOutboxEvent("plan." + change.to, plan_id, change.now_ms,
                               OutboxData(next, change.from, change.actor));
        }
      },
      change.audit, {{"plan_id", plan_id}, {"from", change.from}, {"to", change.to}}));
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
  RETURN_IF_ERROR(db_.IteratorStatus(*it, "listing plans"));
  return out;
}

StatusOr<size_t> RocksPlanStore::CountByState(const std::string& state, size_t cap) {
  return db_.CountKeys(Family::kPlansByState, LengthPrefixed(state), cap, "plans");
}

StatusOr<PlanPage> RocksPlanStore::List(const std::string& state, size_t limit,
                                        const std::string& cursor) {
  PlanPage page;
  if (limit == 0) return page;
  const std::string prefix = LengthPrefixed(state);
  // The cursor is the hex of the last index key's suffix (created_at, id).
  std::string after;
  if (!cursor.empty()) {
    auto raw = HexDecode(cursor);
    if (!raw || raw->size() <= 8) {
      return store_internal::BadCursor();
    }
    after = prefix + *raw;
  }
  ScopedSnapshot snapshot(db_.raw());
  rocksdb::ReadOptions ro;
  ro.snapshot = snapshot.get();
  std::unique_ptr<rocksdb::Iterator> it = db_.NewIterator(Family::kPlansByState, ro);
  if (after.empty()) {
    it->SeekForPrev(prefix + std::string(9, '\xff'));
  } else {
    it->SeekForPrev(after);
    if (it->Valid() && it->key() == rocksdb::Slice(after)) it->Prev();
  }
  std::string last;
  for (; it->Valid(); it->Prev()) {
    std::string_view key(it->key().data(), it->key().size());
    if (!key.starts_with(prefix)) break;
    if (key.size() <= prefix.size() + 8) continue;
    if (page.items.size() == limit) {  // one more exists: there is a next page
      page.next_cursor = HexEncode(last.substr(prefix.size()));
      break;
    }
    ASSIGN_OR_RETURN(std::optional<Plan> p,
                     Load(std::string(key.substr(prefix.size() + 8)), snapshot.get()));
    if (p) page.items.push_back(std::move(*p));
    last = std::string(key);
  }
  RETURN_IF_ERROR(db_.IteratorStatus(*it, "listing plans"));
  return page;
}

StatusOr<size_t> RocksPlanStore::SweepFinished(int64_t cutoff_ms, size_t limit) {
  if (limit == 0 || cutoff_ms < 0) return size_t{0};
  ASSIGN_OR_RETURN(
      std::vector<std::string> candidates,
      db_.ExpiredIndexKeys(Family::kPlansFinished, cutoff_ms, limit, "finished plans"));
  size_t swept = 0;
  ChunkedSweep sweep(db_);
  for (const std::string& index_key : candidates) {
    if (index_key.size() <= 8) continue;
    const std::string plan_id = index_key.substr(8);
    RETURN_IF_ERROR(sweep.Lock(db_.LockFor(Family::kPlans, plan_id)));
    ASSIGN_OR_RETURN(std::optional<Plan> p, Load(plan_id));
    // Under the stripe a Change of it waits for this chunk's write; an
    // entry no longer its plan's (gone, or changed since) goes alone.
    sweep.batch().Delete(Family::kPlansFinished, index_key);
    if (p && Finished(p->state) && FinishedKey(*p) == index_key) {
      sweep.batch().Delete(Family::kPlans, plan_id);
      sweep.batch().Delete(Family::kPlansByState, StateIndexKey(*p));
      // Losing a sweep in a crash only brings back a finished plan.
      ++swept;
    }
    RETURN_IF_ERROR(sweep.Next());
  }
  RETURN_IF_ERROR(sweep.Flush());
  return swept;
}

StatusOr<size_t> RocksPlanStore::DeleteProposed(const std::vector<DecisionPlan>& plans) {
  size_t deleted = 0;
  ChunkedSweep sweep(db_);
  for (const auto& [plan_id, decision_id] : plans) {
    // Its stripe until the chunk is written: an approval or apply of it
    // waits, and then finds it gone.
    RETURN_IF_ERROR(sweep.Lock(db_.LockFor(Family::kPlans, plan_id)));
    ASSIGN_OR_RETURN(std::optional<Plan> p, Load(plan_id));
    if (!p || p->state != "proposed" || p->decision_id != decision_id) continue;
    sweep.batch().Delete(Family::kPlans, plan_id);
    sweep.batch().Delete(Family::kPlansByState, StateIndexKey(*p));
    ++deleted;
    RETURN_IF_ERROR(sweep.Next());
  }
  RETURN_IF_ERROR(sweep.Flush());
  return deleted;
}

Status RocksPlanStore::IndexLegacyFinished(RocksDatabase& db) {
  return db.IndexOnce(Family::kPlans, Family::kPlansFinished, kIndexedMarker, "plan",
                      [](std::string_view, const Json& j) -> StatusOr<std::optional<std::string>> {
                        ASSIGN_OR_RETURN(Plan p, Plan::FromJson(j));
                        if (!Finished(p.state)) return std::optional<std::string>();
                        return std::optional<std::string>(FinishedKey(p));
                      });
}

}  // namespace idem::rocks
