#include "daemon/store/rocksdb/rocksdb_idem_key_store.h"

#include <limits>
#include <utility>

#include "daemon/store/record_codec.h"

namespace idem::rocks {
namespace {

std::string RecordKey(const std::string& scope, const std::string& key) {
  return LengthPrefixed(scope) + key;
}

bool Expired(const IdemRecord& r, int64_t now_ms) { return IdemKeyOver(r, now_ms); }

// The answer to a Begin that writes nothing, or nullopt when Begin takes the key.
std::optional<BeginResult> ReadOnlyOutcome(const std::optional<IdemRecord>& current,
                                           const std::string& fingerprint, int64_t now_ms) {
  if (!current || Expired(*current, now_ms)) return std::nullopt;
  bool in_progress = current->state == IdemRecord::State::kInProgress;
  if (in_progress && current->lease_until_ms <= now_ms) return std::nullopt;  // owner crashed
  if (current->fingerprint != fingerprint) return BeginResult{BeginOutcome::kMismatch, *current};
  if (current->state == IdemRecord::State::kReleased) return std::nullopt;  // run it again
  if (in_progress) return BeginResult{BeginOutcome::kInFlight, *current};
  return BeginResult{BeginOutcome::kReplay, *current};
}

}  // namespace

StatusOr<std::optional<IdemRecord>> RocksIdemKeyStore::Load(const std::string& record_key) {
  ASSIGN_OR_RETURN(std::optional<std::string> raw, db_.Get(Family::kIdemKeys, record_key));
  if (!raw) return std::optional<IdemRecord>();
  ASSIGN_OR_RETURN(Json j, store_internal::DecodeJson(*raw, "idempotency key"));
  ASSIGN_OR_RETURN(IdemRecord r, store_internal::IdemRecordFromJson(j));
  return std::optional<IdemRecord>(std::move(r));
}

void RocksIdemKeyStore::Stage(RecordBatch& batch, const std::string& record_key,
                              const std::optional<IdemRecord>& before, const IdemRecord* after) {
  int64_t old_expiry = before ? before->expires_at_ms : 0;
  int64_t new_expiry = after != nullptr ? after->expires_at_ms : 0;
  if (old_expiry != 0 && old_expiry != new_expiry) {
    batch.Delete(Family::kIdemExpiry, BigEndian8(old_expiry) + record_key);
  }
  if (new_expiry != 0 && old_expiry != new_expiry) {
    batch.Put(Family::kIdemExpiry, BigEndian8(new_expiry) + record_key, "");
  }
  // The in-progress index lets a restart find its orphans without reading
  // every key record.
  const bool was_in_progress = before && before->state == IdemRecord::State::kInProgress;
  const bool in_progress = after != nullptr && after->state == IdemRecord::State::kInProgress;
  if (in_progress && !was_in_progress) batch.Put(Family::kIdemInProgress, record_key, "");
  if (was_in_progress && !in_progress) batch.Delete(Family::kIdemInProgress, record_key);
  if (after != nullptr) {
    batch.PutJson(Family::kIdemKeys, record_key, store_internal::IdemRecordToJson(*after));
  } else {
    batch.Delete(Family::kIdemKeys, record_key);
  }
}

StatusOr<BeginResult> RocksIdemKeyStore::Begin(const std::string& scope, const std::string& key,
                                               const std::string& fingerprint,
                                               const std::string& request_id, int64_t now_ms,
                                               int64_t ttl_ms, int64_t lease_ms) {
  if (key.empty()) return InvalidArgument("idempotency key is empty", "/key");
  if (ttl_ms < 0) return InvalidArgument("ttl_ms must not be negative", "/ttl_ms");
  if (lease_ms <= 0) return InvalidArgument("lease_ms must be positive", "/lease_ms");
  std::string record_key = RecordKey(scope, key);
  {
    ASSIGN_OR_RETURN(std::optional<IdemRecord> seen, Load(record_key));
    if (std::optional<BeginResult> r = ReadOnlyOutcome(seen, fingerprint, now_ms)) {
      return std::move(*r);
    }
  }
  MutexLock lock(db_.LockFor(Family::kIdemKeys, record_key));
  ASSIGN_OR_RETURN(std::optional<IdemRecord> current, Load(record_key));
  if (std::optional<BeginResult> r = ReadOnlyOutcome(current, fingerprint, now_ms)) {
    return std::move(*r);
  }
  IdemRecord next;
  next.scope = scope;
  next.key = key;
  next.fingerprint = fingerprint;
  next.state = IdemRecord::State::kInProgress;
  next.request_id = request_id;
  next.owner = owner_;
  next.created_at_ms = now_ms;
  next.expires_at_ms = ttl_ms == 0 ? 0 : now_ms + ttl_ms;
  next.lease_until_ms = now_ms + lease_ms;
  if (current && !Expired(*current, now_ms) && current->fingerprint == fingerprint &&
      (current->ran || current->state == IdemRecord::State::kReleased)) {
    // Retaking a key whose earlier attempt ran: the window began then.
    next.ran = true;
    next.created_at_ms = current->created_at_ms;
    next.expires_at_ms = current->expires_at_ms;
  }
  RecordBatch batch(db_);
  Stage(batch, record_key, current, &next);
  RETURN_IF_ERROR(db_.Commit(batch, /*durable=*/true));
  return BeginResult{BeginOutcome::kNew, std::move(next)};
}

Status RocksIdemKeyStore::Finish(const std::string& scope, const std::string& key,
                                 const std::string& fingerprint, int status,
                                 const std::string& body, const std::string& content_type,
                                 int64_t now_ms) {
  std::string record_key = RecordKey(scope, key);
  MutexLock lock(db_.LockFor(Family::kIdemKeys, record_key));
  ASSIGN_OR_RETURN(std::optional<IdemRecord> current, Load(record_key));
  if (!current || Expired(*current, now_ms)) {
    return FailedPrecondition("idempotency key '" + key + "' is no longer recorded");
  }
  if (current->fingerprint != fingerprint) {
    return FailedPrecondition("idempotency key '" + key + "' belongs to another request");
  }
  if (current->state == IdemRecord::State::kCompleted) return Status::Ok();  // first one wins
  IdemRecord next = *current;
  next.state = IdemRecord::State::kCompleted;
  next.response_status = status;
  next.response_body = body;
  next.response_content_type = content_type;
  next.lease_until_ms = 0;
  RecordBatch batch(db_);
  Stage(batch, record_key, current, &next);
  return db_.Commit(batch, /*durable=*/true);
}

StatusOr<std::optional<IdemRecord>> RocksIdemKeyStore::LoadHeld(const std::string& record_key,
                                                                const std::string& key,
                                                                const std::string& fingerprint) {
  ASSIGN_OR_RETURN(std::optional<IdemRecord> current, Load(record_key));
  if (!current) return std::optional<IdemRecord>();
  if (current->fingerprint != fingerprint) {
    return FailedPrecondition("idempotency key '" + key + "' belongs to another request");
  }
  if (current->state == IdemRecord::State::kCompleted) {
    return FailedPrecondition("idempotency key '" + key + "' is completed");
  }
  if (current->state == IdemRecord::State::kReleased) return std::optional<IdemRecord>();
  return current;
}

Status RocksIdemKeyStore::Abandon(const std::string& scope, const std::string& key,
                                  const std::string& fingerprint) {
  std::string record_key = RecordKey(scope, key);
  MutexLock lock(db_.LockFor(Family::kIdemKeys, record_key));
  ASSIGN_OR_RETURN(std::optional<IdemRecord> current, LoadHeld(record_key, key, fingerprint));
  if (!current) return Status::Ok();
  RecordBatch batch(db_);
  if (current->ran) {
    IdemRecord next = *current;
    next.state = IdemRecord::State::kReleased;
    next.lease_until_ms = 0;
    Stage(batch, record_key, current, &next);
  } else {
    Stage(batch, record_key, current, nullptr);
  }
  return db_.Commit(batch, /*durable=*/true);
}

Status RocksIdemKeyStore::Release(const std::string& scope, const std::string& key,
                                  const std::string& fingerprint) {
  std::string record_key = RecordKey(scope, key);
  MutexLock lock(db_.LockFor(Family::kIdemKeys, record_key));
  ASSIGN_OR_RETURN(std::optional<IdemRecord> current, LoadHeld(record_key, key, fingerprint));
  if (!current) return Status::Ok();
  IdemRecord next = *current;
  next.state = IdemRecord::State::kReleased;
  next.ran = true;
  next.lease_until_ms = 0;
  RecordBatch batch(db_);
  Stage(batch, record_key, current, &next);
  return db_.Commit(batch, /*durable=*/true);
}

Status RocksIdemKeyStore::ExtendLease(const std::string& scope, const std::string& key,
                                      const std::string& fingerprint, const std::string& request_id,
                                      int64_t now_ms, int64_t lease_ms) {
  if (lease_ms <= 0) return InvalidArgument("lease_ms must be positive", "/lease_ms");
  std::string record_key = RecordKey(scope, key);
  MutexLock lock(db_.LockFor(Family::kIdemKeys, record_key));
  ASSIGN_OR_RETURN(std::optional<IdemRecord> current, Load(record_key));
  if (!current || Expired(*current, now_ms) || current->state != IdemRecord::State::kInProgress) {
    return FailedPrecondition("idempotency key '" + key + "' is not in progress");
  }
  if (current->fingerprint != fingerprint || current->owner != owner_ ||
      current->request_id != request_id) {
    return FailedPrecondition("idempotency key '" + key + "' is held by another request");
  }
  if (current->lease_until_ms >= now_ms + lease_ms) return Status::Ok();
  IdemRecord next = *current;
  next.lease_until_ms = now_ms + lease_ms;
  RecordBatch batch(db_);
  Stage(batch, record_key, current, &next);
  // Not synced: a lease only matters while this process lives; after a crash
  // the restart releases the key whatever its lease says.
  return db_.Commit(batch, /*durable=*/false);
}

StatusOr<size_t> RocksIdemKeyStore::ReleaseOwnInProgress() {
  if (owner_.empty()) return size_t{0};
  // A store written before the in-progress index has in_progress records
  // the index does not list: read every record once, then rely on the index.
  ASSIGN_OR_RETURN(std::optional<std::string> indexed, db_.Get(Family::kMeta, kIndexedMarker));
  std::vector<std::string> orphans;
  if (indexed) {
    std::unique_ptr<rocksdb::Iterator> it = db_.NewIterator(Family::kIdemInProgress, {});
    for (it->SeekToFirst(); it->Valid(); it->Next()) orphans.push_back(it->key().ToString());
    RETURN_IF_ERROR(db_.IteratorStatus(*it, "scanning idempotency keys in progress"));
  } else {
    std::unique_ptr<rocksdb::Iterator> it = db_.NewIterator(Family::kIdemKeys, {});
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      ASSIGN_OR_RETURN(Json j,
                       store_internal::DecodeJson(it->value().ToString(), "idempotency key"));
      ASSIGN_OR_RETURN(IdemRecord r, store_internal::IdemRecordFromJson(j));
      if (r.state == IdemRecord::State::kInProgress) orphans.push_back(it->key().ToString());
    }
    RETURN_IF_ERROR(db_.IteratorStatus(*it, "scanning idempotency keys"));
  }
  size_t released = 0;
  for (const std::string& record_key : orphans) {
    MutexLock lock(db_.LockFor(Family::kIdemKeys, record_key));
    ASSIGN_OR_RETURN(std::optional<IdemRecord> current, Load(record_key));
    if (!current || current->state != IdemRecord::State::kInProgress) {
      if (indexed) {  // an entry left behind; not expected
        RecordBatch batch(db_);
        batch.Delete(Family::kIdemInProgress, record_key);
        RETURN_IF_ERROR(db_.Commit(batch, /*durable=*/false));
      }
      continue;
    }
    if (current->owner != owner_) {
      if (!indexed) {  // another instance's key: list it in the index
        RecordBatch batch(db_);
        batch.Put(Family::kIdemInProgress, record_key, "");
        RETURN_IF_ERROR(db_.Commit(batch, /*durable=*/true));
      }
      continue;
    }
    // Whether the orphan's handler ran is unknown: released keeps the key
    // bound to its fingerprint, as after a transient answer.
    IdemRecord next = *current;
    next.state = IdemRecord::State::kReleased;
    next.ran = true;
    next.lease_until_ms = 0;
    RecordBatch batch(db_);
    Stage(batch, record_key, current, &next);
    RETURN_IF_ERROR(db_.Commit(batch, /*durable=*/true));
    ++released;
  }
  if (!indexed) {
    RecordBatch batch(db_);
    batch.Put(Family::kMeta, kIndexedMarker, "1");
    RETURN_IF_ERROR(db_.Commit(batch, /*durable=*/true));
  }
  return released;
}

StatusOr<IdemRecord> RocksIdemKeyStore::Get(const std::string& scope, const std::string& key) {
  ASSIGN_OR_RETURN(std::optional<IdemRecord> current, Load(RecordKey(scope, key)));
  if (!current) return NotFound("no such idempotency key: " + key);
  return std::move(*current);
}

StatusOr<size_t> RocksIdemKeyStore::SweepExpired(int64_t now_ms, size_t limit) {
  if (limit == 0 || now_ms < 0) return size_t{0};
  ASSIGN_OR_RETURN(
      std::vector<std::string> candidates,
      db_.ExpiredIndexKeys(Family::kIdemExpiry, now_ms, limit, "expired idempotency keys"));
  size_t swept = 0;
  ChunkedSweep sweep(db_);
  for (const std::string& index_key : candidates) {
    if (index_key.size() <= 8) continue;
    std::string record_key = index_key.substr(8);
    RETURN_IF_ERROR(sweep.Lock(db_.LockFor(Family::kIdemKeys, record_key)));
    ASSIGN_OR_RETURN(std::optional<IdemRecord> current, Load(record_key));
    if (current && Expired(*current, now_ms)) {
      Stage(sweep.batch(), record_key, current, nullptr);
      ++swept;
    } else if (current && index_key.compare(0, 8, BigEndian8(current->expires_at_ms)) == 0) {
      continue;  // held past its window (IdemKeyOver): swept once its holder is done
    } else {
      sweep.batch().Delete(Family::kIdemExpiry, index_key);  // stale; not expected
    }
    // Losing a sweep in a crash only brings back a record that reads as absent.
    RETURN_IF_ERROR(sweep.Next());
  }
  RETURN_IF_ERROR(sweep.Flush());
  return swept;
}

}  // namespace idem::rocks
