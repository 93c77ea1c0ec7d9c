#include "daemon/store/rocksdb/rocksdb_lease_store.h"

#include <algorithm>
#include <utility>

#include "daemon/core/crypto.h"
#include "daemon/store/record_codec.h"

namespace idem::rocks {
namespace {

std::string ExpiryKey(int64_t expires_at_ms, std::string_view name) {
  std::string key = BigEndian8(static_cast<uint64_t>(std::max<int64_t>(expires_at_ms, 0)));
  key.append(name);
  return key;
}

}  // namespace

StatusOr<std::optional<NamedLease>> RocksLeaseStore::Load(const std::string& name) {
  ASSIGN_OR_RETURN(std::optional<std::string> raw, db_.Get(Family::kLeases, name));
  if (!raw) return std::optional<NamedLease>();
  ASSIGN_OR_RETURN(Json j, store_internal::DecodeJson(*raw, "lease"));
  ASSIGN_OR_RETURN(NamedLease l, store_internal::NamedLeaseFromJson(j));
  return std::optional<NamedLease>(std::move(l));
}

StatusOr<LeaseResult> RocksLeaseStore::Acquire(const std::string& name, const std::string& holder,
                                               const std::string& token, int64_t ttl_ms,
                                               int64_t now_ms) {
  if (name.empty()) return InvalidArgument("lease name is empty", "/name");
  if (holder.empty()) return InvalidArgument("lease holder is empty", "/holder");
  if (ttl_ms <= 0) return InvalidArgument("ttl_ms must be positive", "/ttl_ms");
  MutexLock lock(db_.LockFor(Family::kLeases, name));
  ASSIGN_OR_RETURN(std::optional<NamedLease> current, Load(name));
  bool live = current && current->expires_at_ms > now_ms;
  if (live && current->holder != holder) return LeaseResult{LeaseOutcome::kHeld, *current};
  if (live && (token.empty() || !ConstantTimeEquals(token, current->token))) {
    return Status(Code::kFailedPrecondition,
                  "lease '" + name + "' is held by " + holder +
                      "; renewing it needs the token its acquire returned",
                  "/token");
  }
  if (!live && !token.empty()) return LeaseLapsed(name);
  LeaseResult result;
  if (live) {
    result.outcome = LeaseOutcome::kRenewed;
    result.lease = *current;
  } else {
    result.outcome = LeaseOutcome::kAcquired;
    result.lease.name = name;
    result.lease.holder = holder;
    result.lease.token = RandomHex(16);
    result.lease.acquired_at_ms = now_ms;
  }
  result.lease.expires_at_ms = now_ms + ttl_ms;
  RecordBatch batch(db_);
  if (current) batch.Delete(Family::kLeasesExpiry, ExpiryKey(current->expires_at_ms, name));
  batch.PutJson(Family::kLeases, name, store_internal::NamedLeaseToJson(result.lease));
  batch.Put(Family::kLeasesExpiry, ExpiryKey(result.lease.expires_at_ms, name), "");
  RETURN_IF_ERROR(db_.Commit(batch, /*durable=*/true));
  return result;
}

Status RocksLeaseStore::Release(const std::string& name, const std::string& holder,
                                const std::string& token) {
  MutexLock lock(db_.LockFor(Family::kLeases, name));
  ASSIGN_OR_RETURN(std::optional<NamedLease> current, Load(name));
  if (!current || current->holder != holder) {
    return FailedPrecondition("lease '" + name + "' is not held by " + holder);
  }
  if (token.empty() || !ConstantTimeEquals(token, current->token)) {
    return Status(Code::kFailedPrecondition,
                  "lease '" + name + "' is held by " + holder +
                      " under another token; releasing it needs the token its acquire returned",
                  "/token");
  }
  RecordBatch batch(db_);
  batch.Delete(Family::kLeases, name);
  batch.Delete(Family::kLeasesExpiry, ExpiryKey(current->expires_at_ms, name));
  return db_.Commit(batch, /*durable=*/true);
}

StatusOr<NamedLease> RocksLeaseStore::Get(const std::string& name, int64_t now_ms) {
  ASSIGN_OR_RETURN(std::optional<NamedLease> current, Load(name));
  if (!current || current->expires_at_ms <= now_ms) return NotFound("lease '" + name + "' is free");
  return std::move(*current);
}

StatusOr<size_t> RocksLeaseStore::SweepExpired(int64_t now_ms, size_t limit) {
  if (limit == 0 || now_ms < 0) return size_t{0};
  ASSIGN_OR_RETURN(std::vector<std::string> candidates,
                   db_.ExpiredIndexKeys(Family::kLeasesExpiry, now_ms, limit, "expired leases"));
  size_t swept = 0;
  ChunkedSweep sweep(db_);
  for (const std::string& index_key : candidates) {
    if (index_key.size() <= 8) continue;
    const std::string name = index_key.substr(8);
    RETURN_IF_ERROR(sweep.Lock(db_.LockFor(Family::kLeases, name)));
    ASSIGN_OR_RETURN(std::optional<NamedLease> current, Load(name));
    if (current && index_key == ExpiryKey(current->expires_at_ms, name)) {
      // Its own entry, which the index found over (a renewal moves it).
      sweep.batch().Delete(Family::kLeases, name);
      ++swept;
    }
    // Otherwise the entry was stale (not expected: each write moves it).
    sweep.batch().Delete(Family::kLeasesExpiry, index_key);
    RETURN_IF_ERROR(sweep.Next());
  }
  RETURN_IF_ERROR(sweep.Flush());
  return swept;
}

Status RocksLeaseStore::IndexLegacyLeases(RocksDatabase& db) {
  return db.IndexOnce(
      Family::kLeases, Family::kLeasesExpiry, kIndexedMarker, "lease",
      [](std::string_view name, const Json& j) -> StatusOr<std::optional<std::string>> {
        ASSIGN_OR_RETURN(NamedLease l, store_internal::NamedLeaseFromJson(j));
        return std::optional<std::string>(ExpiryKey(l.expires_at_ms, name));
      });
}

StatusOr<std::optional<std::string>> RocksMetaStore::Get(const std::string& key) {
  return db_.Get(Family::kMeta, key);
}

Status RocksMetaStore::Put(const std::string& key, const std::string& value) {
  if (key.empty()) return InvalidArgument("meta key is empty", "/key");
  RecordBatch batch(db_);
  batch.Put(Family::kMeta, key, value);
  return db_.Commit(batch, /*durable=*/true);
}

}  // namespace idem::rocks
