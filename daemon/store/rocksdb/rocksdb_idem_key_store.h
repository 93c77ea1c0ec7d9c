// Idempotency-Key records (store.h, class IdemKeyStore) on RocksDB.
//
// Family "idem_keys" holds LP(scope) | key -> IdemRecord JSON; "idem_expiry"
// indexes records with an expiry by BE8(expires_at) for SweepExpired;
// "idem_in_progress" lists the records in progress, which a restart
// releases (ReleaseOwnInProgress) without reading every record. Every
// write holds the (scope, key) lock stripe. Begin answers replays, mismatches
// and in-flight keys from a read alone (no lock, no write, no fsync).
//
// Thread-safety: all methods may be called concurrently.
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "daemon/store/rocksdb/rocksdb_database.h"
#include "daemon/store/store.h"

namespace idem::rocks {

class RocksIdemKeyStore final : public IdemKeyStore {
 public:
  // `db` must outlive this object. `owner`: the store's instance id, written
  // on every in_progress record ("" in tests that do not care).
  explicit RocksIdemKeyStore(RocksDatabase& db, std::string owner = "")
      : db_(db), owner_(std::move(owner)) {}

  StatusOr<BeginResult> Begin(const std::string& scope, const std::string& key,
                              const std::string& fingerprint, const std::string& request_id,
                              int64_t now_ms, int64_t ttl_ms, int64_t lease_ms) override;
  Status Finish(const std::string& scope, const std::string& key, const std::string& fingerprint,
                int status, const std::string& body, const std::string& content_type,
                int64_t now_ms) override;
  Status Abandon(const std::string& scope, const std::string& key,
                 const std::string& fingerprint) override;
  Status Release(const std::string& scope, const std::string& key,
                 const std::string& fingerprint) override;
  Status ExtendLease(const std::string& scope, const std::string& key,
                     const std::string& fingerprint, const std::string& request_id, int64_t now_ms,
                     int64_t lease_ms) override;
  StatusOr<size_t> ReleaseOwnInProgress() override;
  StatusOr<IdemRecord> Get(const std::string& scope, const std::string& key) override;
  StatusOr<size_t> SweepExpired(int64_t now_ms, size_t limit) override;

  // Meta key present once every in_progress record is listed in the
  // "idem_in_progress" index (stores from before it are read in full once).
  static constexpr char kIndexedMarker[] = "idem_keys.in_progress_indexed";

 private:
  StatusOr<std::optional<IdemRecord>> Load(const std::string& record_key);
  // The in_progress record that Abandon or Release may end: nullopt when
  // there is nothing to end (absent or already released); FailedPrecondition
  // when it is completed or bound to another fingerprint.
  StatusOr<std::optional<IdemRecord>> LoadHeld(const std::string& record_key,
                                               const std::string& key,
                                               const std::string& fingerprint);
  // Stages `after` (or the deletion when null), moving the expiry entry.
  void Stage(RecordBatch& batch, const std::string& record_key,
             const std::optional<IdemRecord>& before, const IdemRecord* after);

  RocksDatabase& db_;
  const std::string owner_;
};

}  // namespace idem::rocks
