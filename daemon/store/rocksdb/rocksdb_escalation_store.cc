#include "daemon/store/rocksdb/rocksdb_escalation_store.h"

#include <algorithm>
#include <utility>

#include "daemon/store/record_codec.h"

namespace idem::rocks {
namespace {

std::string ResolvedKey(const Escalation& e) {
  return BigEndian8(static_cast<uint64_t>(std::max<int64_t>(e.resolved_at_ms, 0))) +
         e.escalation_id;
}

}  // namespace

StatusOr<std::optional<Escalation>> RocksEscalationStore::Load(const std::string& id,
                                                               const rocksdb::Snapshot* snapshot) {
  ASSIGN_OR_RETURN(std::optional<std::string> raw, db_.Get(Family::kEscalations, id, snapshot));
  if (!raw) return std::optional<Escalation>();
  ASSIGN_OR_RETURN(Json j, store_internal::DecodeJson(*raw, "escalation"));
  ASSIGN_OR_RETURN(Escalation e, Escalation::FromJson(j));
  return std::optional<Escalation>(std::move(e));
}

Status RocksEscalationStore::Put(const Escalation& e) {
  if (e.escalation_id.empty()) return InvalidArgument("escalation_id is empty");
  if (e.decision_key.empty()) return InvalidArgument("decision_key is empty");
  MutexLock lock(db_.LockFor(Family::kEscalationsOpen, e.decision_key));
  ASSIGN_OR_RETURN(std::optional<Escalation> existing, Load(e.escalation_id));
  if (existing) return AlreadyExists("escalation " + e.escalation_id + " exists");
  RecordBatch batch(db_);
  batch.PutJson(Family::kEscalations, e.escalation_id, e.ToJson());
  batch.Put(Family::kEscalationsByTime, InvertedBigEndian8(e.created_at_ms) + e.escalation_id, "");
  if (e.state == "open") batch.Put(Family::kEscalationsOpen, e.decision_key, e.escalation_id);
  if (e.state == "resolved") batch.Put(Family::kEscalationsResolved, ResolvedKey(e), "");
  return db_.Commit(batch, /*durable=*/true);
}

StatusOr<Escalation> RocksEscalationStore::Get(const std::string& escalation_id) {
  ASSIGN_OR_RETURN(std::optional<Escalation> e, Load(escalation_id));
  if (!e) return NotFound("no such escalation: " + escalation_id);
  return std::move(*e);
}

StatusOr<Escalation> RocksEscalationStore::OpenByKey(const std::string& decision_key) {
  ASSIGN_OR_RETURN(std::optional<std::string> id, db_.Get(Family::kEscalationsOpen, decision_key));
  if (!id) return NotFound("no open escalation for this key");
  ASSIGN_OR_RETURN(std::optional<Escalation> e, Load(*id));
  if (!e || e->state != "open") return NotFound("no open escalation for this key");
  return std::move(*e);
}

StatusOr<std::vector<Escalation>> RocksEscalationStore::List(const std::string& state,
                                                             size_t limit) {
  std::vector<Escalation> out;
  if (limit == 0) return out;
  ScopedSnapshot snapshot(db_.raw());
  rocksdb::ReadOptions ro;
  ro.snapshot = snapshot.get();
  if (state == "open") {
    // From the open index, not the time index: open escalations among many
    // resolved ones are found without reading the resolved ones (a scrape
    // lists them every few seconds). It holds at most kMaxScanned of them.
    std::unique_ptr<rocksdb::Iterator> it = db_.NewIterator(Family::kEscalationsOpen, ro);
    size_t scanned = 0;
    for (it->SeekToFirst(); it->Valid() && scanned < kMaxScanned; it->Next(), ++scanned) {
      ASSIGN_OR_RETURN(std::optional<Escalation> e, Load(it->value().ToString(), snapshot.get()));
      if (e && e->state == "open") out.push_back(std::move(*e));
    }
    RETURN_IF_ERROR(db_.IteratorStatus(*it, "listing open escalations"));
    // The time index's order: newest first, then by id.
    std::sort(out.begin(), out.end(), [](const Escalation& a, const Escalation& b) {
      if (a.created_at_ms != b.created_at_ms) return a.created_at_ms > b.created_at_ms;
      return a.escalation_id < b.escalation_id;
    });
    if (out.size() > limit) out.resize(limit);
    return out;
  }
  // Newest first from the time index. A filter reads past the others, so it
  // reads at most kMaxScanned records beyond the `limit` it answers.
  std::unique_ptr<rocksdb::Iterator> it = db_.NewIterator(Family::kEscalationsByTime, ro);
  size_t skipped = 0;
  for (it->SeekToFirst(); it->Valid() && out.size() < limit && skipped <= kMaxScanned; it->Next()) {
    std::string_view key(it->key().data(), it->key().size());
    if (key.size() <= 8) continue;
    ASSIGN_OR_RETURN(std::optional<Escalation> e, Load(std::string(key.substr(8)), snapshot.get()));
    if (e && (state.empty() || e->state == state)) {
      out.push_back(std::move(*e));
    } else {
      ++skipped;
    }
  }
  RETURN_IF_ERROR(db_.IteratorStatus(*it, "listing escalations"));
  return out;
}

StatusOr<size_t> RocksEscalationStore::CountOpen(size_t cap) {
  return db_.CountKeys(Family::kEscalationsOpen, "", cap, "open escalations");
}

StatusOr<Escalation> RocksEscalationStore::Resolve(const std::string& escalation_id,
                                                   const std::string& decision_id,
                                                   const std::string& actor, int64_t now_ms) {
  ASSIGN_OR_RETURN(Escalation current, Get(escalation_id));
  MutexLock lock(db_.LockFor(Family::kEscalationsOpen, current.decision_key));
  ASSIGN_OR_RETURN(current, Get(escalation_id));  // re-read under the lock
  if (current.state != "open") {
    return FailedPrecondition("escalation " + escalation_id + " is " + current.state);
  }
  Escalation next = current;
  next.state = "resolved";
  next.decision_id = decision_id;
  next.resolved_by = actor;
  next.resolved_at_ms = now_ms;
  RecordBatch batch(db_);
  batch.PutJson(Family::kEscalations, escalation_id, next.ToJson());
  batch.Put(Family::kEscalationsResolved, ResolvedKey(next), "");
  // The key's open entry, if it is this one's (never another's).
  ASSIGN_OR_RETURN(std::optional<std::string> open,
                   db_.Get(Family::kEscalationsOpen, current.decision_key));
  if (open && *open == escalation_id) batch.Delete(Family::kEscalationsOpen, current.decision_key);
  RETURN_IF_ERROR(db_.Commit(batch, /*durable=*/true));
  return next;
}

StatusOr<size_t> RocksEscalationStore::SweepResolved(int64_t cutoff_ms, size_t limit) {
  if (limit == 0 || cutoff_ms < 0) return size_t{0};
  ASSIGN_OR_RETURN(
      std::vector<std::string> candidates,
      db_.ExpiredIndexKeys(Family::kEscalationsResolved, cutoff_ms, limit, "resolved escalations"));
  size_t swept = 0;
  ChunkedSweep sweep(db_);
  for (const std::string& index_key : candidates) {
    if (index_key.size() <= 8) continue;
    const std::string id = index_key.substr(8);
    ASSIGN_OR_RETURN(std::optional<Escalation> seen, Load(id));
    if (seen) {
      RETURN_IF_ERROR(sweep.Lock(db_.LockFor(Family::kEscalationsOpen, seen->decision_key)));
      ASSIGN_OR_RETURN(std::optional<Escalation> e, Load(id));  // re-read under the lock
      if (e && e->state == "resolved" && ResolvedKey(*e) == index_key) {
        sweep.batch().Delete(Family::kEscalations, id);
        sweep.batch().Delete(Family::kEscalationsByTime, InvertedBigEndian8(e->created_at_ms) + id);
        ++swept;
      }
    }
    // Otherwise an entry left behind (not expected). Losing a sweep in a
    // crash only brings back a resolved escalation.
    sweep.batch().Delete(Family::kEscalationsResolved, index_key);
    RETURN_IF_ERROR(sweep.Next());
  }
  RETURN_IF_ERROR(sweep.Flush());
  return swept;
}

Status RocksEscalationStore::IndexLegacyResolved(RocksDatabase& db) {
  return db.IndexOnce(Family::kEscalations, Family::kEscalationsResolved, kIndexedMarker,
                      "escalation",
                      [](std::string_view, const Json& j) -> StatusOr<std::optional<std::string>> {
                        ASSIGN_OR_RETURN(Escalation e, Escalation::FromJson(j));
                        if (e.state != "resolved") return std::optional<std::string>();
                        return std::optional<std::string>(ResolvedKey(e));
                      });
}

}  // namespace idem::rocks
