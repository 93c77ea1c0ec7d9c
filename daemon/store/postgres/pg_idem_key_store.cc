// PostgreSQL IdemKeyStore (store.h): Idempotency-Key records shared by every
// daemon on the database, one row per (scope, key) in "idem_keys".
//
// Every change is one conditional statement on the row's latest version
// (INSERT ... ON CONFLICT DO UPDATE ... WHERE, UPDATE/DELETE ... WHERE), a
// compare-and-set that PostgreSQL re-checks after waiting for a concurrent
// writer of the same row; when it matches nothing, a read says why (the
// answer) or that the row changed under it (then it tries again). So:
//   - Begin answers replays, mismatches and keys in flight from one read
//     (no write); taking a key is one INSERT ... ON CONFLICT that writes only
//     if the key is absent, expired, in progress under a lease that ended,
//     or released with the same fingerprint. Two daemons beginning one key
//     at once: exactly one kNew, the other kInFlight.
//   - Finish, Abandon, Release and ExtendLease change the row only in the
//     state their contract names.
//
// Owners. Every PostgreSQL store is its own instance: PgContext::instance_id
// is random per process and never reused, because many daemons share the
// database and none can tell which dead daemon it replaces. Consequences:
//   - ReleaseOwnInProgress releases the keys in progress that this very
//     process wrote; at start-up there are none, so it is a no-op there. The
//     keys of a daemon that died (kill -9) stay in flight until their lease
//     ends, then the next Begin takes them over (Begin's takeover rule), from
//     any daemon. That is the price of not guessing: releasing another
//     instance's keys early could run a request twice while its daemon is
//     only slow.
//   - ExtendLease is allowed only to the instance that wrote the record, so
//     a daemon never extends a key another daemon took over.
// ExtendLease commits like every other write (a lease must be seen by the
// other daemons, not only survive this one).
//
// Thread-safety: all methods may be called concurrently, from any number of
// processes.
#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>
#include <vector>

#include "daemon/core/json.h"
#include "daemon/store/postgres/pg_store.h"
#include "daemon/store/record_codec.h"

namespace idem::pg {

extern const std::string_view kSchemaIdemKeys = R"sql(
CREATE TABLE idem_keys (
  scope                 text COLLATE "C" NOT NULL,
  key                   text COLLATE "C" NOT NULL,
  fingerprint           text NOT NULL,
  state                 text NOT NULL CHECK (state IN ('in_progress', 'completed', 'released')),
  ran                   boolean NOT NULL DEFAULT false,
  owner                 text NOT NULL DEFAULT '',
  response_status       integer NOT NULL DEFAULT 0,
  response_body         bytea NOT NULL DEFAULT '',
  response_content_type text NOT NULL DEFAULT '',
  request_id            text NOT NULL DEFAULT '',
  created_at_ms         bigint NOT NULL,
  expires_at_ms         bigint NOT NULL,  -- 0: never
  lease_until_ms        bigint NOT NULL DEFAULT 0,
  PRIMARY KEY (scope, key)
);
CREATE INDEX idem_keys_expiry ON idem_keys (expires_at_ms) WHERE expires_at_ms <> 0;
CREATE INDEX idem_keys_in_progress ON idem_keys (owner) WHERE state = 'in_progress';
)sql";

namespace {

constexpr char kColumns[] =
    "scope, key, fingerprint, state, ran, owner, response_status, response_body,"
    " response_content_type, request_id, created_at_ms, expires_at_ms, lease_until_ms";

// How often a call retries when the row keeps changing under it.
constexpr int kAttempts = 16;

bool Expired(const IdemRecord& r, int64_t now_ms) { return IdemKeyOver(r, now_ms); }

StatusOr<IdemRecord> RecordAt(const Result& r, int row) {
  IdemRecord rec;
  rec.scope = r.str(row, 0);
  rec.key = r.str(row, 1);
  rec.fingerprint = r.str(row, 2);
  std::string_view state = r.text(row, 3);
  if (state == "in_progress") {
    rec.state = IdemRecord::State::kInProgress;
  } else if (state == "completed") {
    rec.state = IdemRecord::State::kCompleted;
  } else if (state == "released") {
    rec.state = IdemRecord::State::kReleased;
  } else {
    return Internal("stored idempotency key record has unknown state '" + std::string(state) + "'");
  }
  rec.ran = r.boolean(row, 4);
  rec.owner = r.str(row, 5);
  rec.response_status = static_cast<int>(r.i64(row, 6));
  rec.response_body = r.bytea(row, 7);
  rec.response_content_type = r.str(row, 8);
  rec.request_id = r.str(row, 9);
  rec.created_at_ms = r.i64(row, 10);
  rec.expires_at_ms = r.i64(row, 11);
  rec.lease_until_ms = r.i64(row, 12);
  return rec;
}

// The answer to a Begin that writes nothing, or nullopt when Begin takes the
// key (the rules of store.h, as on RocksDB).
std::optional<BeginResult> ReadOnlyOutcome(const std::optional<IdemRecord>& current,
                                           const std::string& fingerprint, int64_t now_ms) {
  if (!current || Expired(*current, now_ms)) return std::nullopt;
  bool in_progress = current->state == IdemRecord::State::kInProgress;
  if (in_progress && current->lease_until_ms <= now_ms) return std::nullopt;  // owner gone
  if (current->fingerprint != fingerprint) return BeginResult{BeginOutcome::kMismatch, *current};
  if (current->state == IdemRecord::State::kReleased) return std::nullopt;  // run it again
  if (in_progress) return BeginResult{BeginOutcome::kInFlight, *current};
  return BeginResult{BeginOutcome::kReplay, *current};
}

// Takes the key: inserts, or overwrites a row Begin may take over (checked
// on the row's latest version, under its lock). A retake of a key whose
// earlier attempt ran keeps it marked ran and keeps its window. Returns the
// row written, or no row when the key was not free to take.
constexpr char kTakeSql[] =
    "INSERT INTO idem_keys AS k (scope, key, fingerprint, state, ran, owner, request_id,"
    " created_at_ms, expires_at_ms, lease_until_ms)"
    " VALUES ($1, $2, $3, 'in_progress', false, $4, $5, $6::bigint, $7::bigint, $8::bigint)"
    " ON CONFLICT (scope, key) DO UPDATE SET"
    "  fingerprint = EXCLUDED.fingerprint, state = 'in_progress', owner = EXCLUDED.owner,"
    "  request_id = EXCLUDED.request_id, lease_until_ms = EXCLUDED.lease_until_ms,"
    "  response_status = 0, response_body = ''::bytea, response_content_type = '',"
    "  ran = (k.expires_at_ms = 0 OR k.expires_at_ms > $6::bigint)"
    "   AND k.fingerprint = EXCLUDED.fingerprint AND (k.ran OR k.state = 'released'),"
    "  created_at_ms = CASE WHEN (k.expires_at_ms = 0 OR k.expires_at_ms > $6::bigint)"
    "   AND k.fingerprint = EXCLUDED.fingerprint AND (k.ran OR k.state = 'released')"
    "   THEN k.created_at_ms ELSE EXCLUDED.created_at_ms END,"
    "  expires_at_ms = CASE WHEN (k.expires_at_ms = 0 OR k.expires_at_ms > $6::bigint)"
    "   AND k.fingerprint = EXCLUDED.fingerprint AND (k.ran OR k.state = 'released')"
    "   THEN k.expires_at_ms ELSE EXCLUDED.expires_at_ms END"
    " WHERE (k.expires_at_ms <> 0 AND k.expires_at_ms <= $6::bigint"
    "   AND NOT (k.state = 'in_progress' AND k.lease_until_ms > $6::bigint))"
    "  OR (k.state = 'in_progress' AND k.lease_until_ms <= $6::bigint)"
    "  OR (k.state = 'released' AND k.fingerprint = EXCLUDED.fingerprint)"
    " RETURNING scope, key, fingerprint, state, ran, owner, response_status, response_body,"
    " response_content_type, request_id, created_at_ms, expires_at_ms, lease_until_ms";

class PgIdemKeyStore final : public IdemKeyStore {
 public:
  explicit PgIdemKeyStore(PgContext& ctx) : ctx_(ctx) {}

  StatusOr<BeginResult> Begin(const std::string& scope, const std::string& key,
                              const std::string& fingerprint, const std::string& request_id,
                              int64_t now_ms, int64_t ttl_ms, int64_t lease_ms) override {
    if (key.empty()) return InvalidArgument("idempotency key is empty", "/key");
    if (ttl_ms < 0) return InvalidArgument("ttl_ms must not be negative", "/ttl_ms");
    if (lease_ms <= 0) return InvalidArgument("lease_ms must be positive", "/lease_ms");
    RETURN_IF_ERROR(CheckText(scope, "/scope"));
    RETURN_IF_ERROR(CheckText(key, "/key"));
    RETURN_IF_ERROR(CheckText(fingerprint, "/fingerprint"));
    RETURN_IF_ERROR(CheckText(request_id, "/request_id"));
    const int64_t expires_at_ms = ttl_ms == 0 ? 0 : now_ms + ttl_ms;
    for (int attempt = 0; attempt < kAttempts; ++attempt) {
      ASSIGN_OR_RETURN(std::optional<IdemRecord> seen, Load(scope, key));
      if (std::optional<BeginResult> r = ReadOnlyOutcome(seen, fingerprint, now_ms)) {
        return std::move(*r);
      }
      WriteTimer timer(ctx_);
      ASSIGN_OR_RETURN(
          Result r, ctx_.pool.Exec(kTakeSql, {P(scope), P(key), P(fingerprint), P(ctx_.instance_id),
                                              P(request_id), P(now_ms), P(expires_at_ms),
                                              P(now_ms + lease_ms)}));
      if (r.rows() == 1) {
        ASSIGN_OR_RETURN(IdemRecord taken, RecordAt(r, 0));
        return BeginResult{BeginOutcome::kNew, std::move(taken)};
      }
      // Another request took or changed the key between the read and the
      // write: read it again.
    }
    return Contended(key);
  }

  Status Finish(const std::string& scope, const std::string& key, const std::string& fingerprint,
                int status, const std::string& body, const std::string& content_type,
                int64_t now_ms) override {
    if (!IsText(scope) || !IsText(key) || !IsText(fingerprint)) {
      return FailedPrecondition("idempotency key '" + key + "' is no longer recorded");
    }
    RETURN_IF_ERROR(CheckText(content_type, "/content_type"));
    for (int attempt = 0; attempt < kAttempts; ++attempt) {
      {
        WriteTimer timer(ctx_);
        ASSIGN_OR_RETURN(
            Result r,
            ctx_.pool.Exec("UPDATE idem_keys SET state = 'completed', response_status = $4,"
                           " response_body = $5, response_content_type = $6, lease_until_ms = 0"
                           " WHERE scope = $1 AND key = $2 AND fingerprint = $3"
                           " AND state <> 'completed'"
                           " AND (expires_at_ms = 0 OR expires_at_ms > $7::bigint"
                           "  OR (state = 'in_progress' AND lease_until_ms > $7::bigint))",
                           {P(scope), P(key), P(fingerprint), P(status), Bytea(body),
                            P(content_type), P(now_ms)}));
        if (r.affected() == 1) return Status::Ok();
      }
      ASSIGN_OR_RETURN(std::optional<IdemRecord> current, Load(scope, key));
      if (!current || Expired(*current, now_ms)) {
        return FailedPrecondition("idempotency key '" + key + "' is no longer recorded");
      }
      if (current->fingerprint != fingerprint) {
        return FailedPrecondition("idempotency key '" + key + "' belongs to another request");
      }
      if (current->state == IdemRecord::State::kCompleted) return Status::Ok();  // first wins
    }
    return Contended(key);
  }

  Status Abandon(const std::string& scope, const std::string& key,
                 const std::string& fingerprint) override {
    if (!IsText(scope) || !IsText(key)) return Status::Ok();  // no such record
    RETURN_IF_ERROR(CheckText(fingerprint, "/fingerprint"));
    for (int attempt = 0; attempt < kAttempts; ++attempt) {
      ASSIGN_OR_RETURN(std::optional<IdemRecord> current, LoadHeld(scope, key, fingerprint));
      if (!current) return Status::Ok();
      WriteTimer timer(ctx_);
      // A key whose earlier attempt ran stays bound to its fingerprint
      // (released); otherwise it is forgotten.
      ASSIGN_OR_RETURN(
          Result r,
          current->ran
              ? ctx_.pool.Exec("UPDATE idem_keys SET state = 'released', lease_until_ms = 0"
                               " WHERE scope = $1 AND key = $2 AND fingerprint = $3"
                               " AND state = 'in_progress' AND ran",
                               {P(scope), P(key), P(fingerprint)})
              : ctx_.pool.Exec("DELETE FROM idem_keys"
                               " WHERE scope = $1 AND key = $2 AND fingerprint = $3"
                               " AND state = 'in_progress' AND NOT ran",
                               {P(scope), P(key), P(fingerprint)}));
      if (r.affected() == 1) return Status::Ok();
    }
    return Contended(key);
  }

  Status Release(const std::string& scope, const std::string& key,
                 const std::string& fingerprint) override {
    if (!IsText(scope) || !IsText(key)) return Status::Ok();  // no such record
    RETURN_IF_ERROR(CheckText(fingerprint, "/fingerprint"));
    for (int attempt = 0; attempt < kAttempts; ++attempt) {
      {
        WriteTimer timer(ctx_);
        ASSIGN_OR_RETURN(Result r, ctx_.pool.Exec("UPDATE idem_keys SET state = 'released',"
                                                  " ran = true, lease_until_ms = 0"
                                                  " WHERE scope = $1 AND key = $2"
                                                  " AND fingerprint = $3 AND state = 'in_progress'",
                                                  {P(scope), P(key), P(fingerprint)}));
        if (r.affected() == 1) return Status::Ok();
      }
      ASSIGN_OR_RETURN(std::optional<IdemRecord> current, LoadHeld(scope, key, fingerprint));
      if (!current) return Status::Ok();
    }
    return Contended(key);
  }

  Status ExtendLease(const std::string& scope, const std::string& key,
                     const std::string& fingerprint, const std::string& request_id, int64_t now_ms,
                     int64_t lease_ms) override {
    if (lease_ms <= 0) return InvalidArgument("lease_ms must be positive", "/lease_ms");
    if (!IsText(scope) || !IsText(key) || !IsText(fingerprint) || !IsText(request_id)) {
      return FailedPrecondition("idempotency key '" + key + "' is not in progress");
    }
    const int64_t until = now_ms + lease_ms;
    {
      WriteTimer timer(ctx_);
      // GREATEST: never shortens the lease.
      ASSIGN_OR_RETURN(Result r,
                       ctx_.pool.Exec("UPDATE idem_keys"
                                      " SET lease_until_ms = GREATEST(lease_until_ms, $6::bigint)"
                                      " WHERE scope = $1 AND key = $2 AND state = 'in_progress'"
                                      " AND (expires_at_ms = 0 OR expires_at_ms > $7::bigint"
                                      "  OR lease_until_ms > $7::bigint)"
                                      " AND fingerprint = $3 AND owner = $4 AND request_id = $5",
                                      {P(scope), P(key), P(fingerprint), P(ctx_.instance_id),
                                       P(request_id), P(until), P(now_ms)}));
      if (r.affected() == 1) return Status::Ok();
    }
    // Refused either way; the read only chooses the message.
    ASSIGN_OR_RETURN(std::optional<IdemRecord> current, Load(scope, key));
    if (!current || Expired(*current, now_ms) || current->state != IdemRecord::State::kInProgress) {
      return FailedPrecondition("idempotency key '" + key + "' is not in progress");
    }
    return FailedPrecondition("idempotency key '" + key + "' is held by another request");
  }

  StatusOr<size_t> ReleaseOwnInProgress() override {
    if (ctx_.instance_id.empty()) return size_t{0};
    WriteTimer timer(ctx_);
    // Whether the handlers ran is unknown: released keeps each key bound to
    // its fingerprint, as after a transient answer.
    ASSIGN_OR_RETURN(Result r, ctx_.pool.Exec("UPDATE idem_keys SET state = 'released',"
                                              " ran = true, lease_until_ms = 0"
                                              " WHERE owner = $1 AND state = 'in_progress'",
                                              {P(ctx_.instance_id)}));
    return static_cast<size_t>(r.affected());
  }

  StatusOr<IdemRecord> Get(const std::string& scope, const std::string& key) override {
    std::optional<IdemRecord> current;
    if (IsText(scope) && IsText(key)) {
      ASSIGN_OR_RETURN(current, Load(scope, key));
    }
    if (!current) return NotFound("no such idempotency key: " + key);
    return std::move(*current);
  }

  StatusOr<size_t> SweepExpired(int64_t now_ms, size_t limit) override {
    if (limit == 0 || now_ms < 0) return size_t{0};
    const int64_t capped = static_cast<int64_t>(std::min<size_t>(limit, 100'000));
    WriteTimer timer(ctx_);
    // SKIP LOCKED: a row being written is left for the next sweep, and two
    // daemons sweeping at once take different rows. The outer condition is
    // checked again on the locked row (a retake may have moved its window).
    ASSIGN_OR_RETURN(
        Result r, ctx_.pool.Exec("DELETE FROM idem_keys WHERE (scope, key) IN ("
                                 " SELECT scope, key FROM idem_keys"
                                 " WHERE expires_at_ms <> 0 AND expires_at_ms <= $1::bigint"
                                 " AND NOT (state = 'in_progress' AND lease_until_ms > $1::bigint)"
                                 " ORDER BY expires_at_ms LIMIT $2 FOR UPDATE SKIP LOCKED)"
                                 " AND expires_at_ms <> 0 AND expires_at_ms <= $1::bigint"
                                 " AND NOT (state = 'in_progress' AND lease_until_ms > $1::bigint)",
                                 {P(now_ms), P(capped)}));
    return static_cast<size_t>(r.affected());
  }

 private:
  static Status Contended(const std::string& key) {
    return Unavailable("idempotency key '" + key + "' kept changing under concurrent requests");
  }

  StatusOr<std::optional<IdemRecord>> Load(const std::string& scope, const std::string& key) {
    static const std::string kSql = std::string("SELECT ").append(kColumns).append(
        " FROM idem_keys WHERE scope = $1 AND key = $2");
    ASSIGN_OR_RETURN(Result r, ctx_.pool.Exec(kSql, {P(scope), P(key)}));
    if (r.rows() == 0) return std::optional<IdemRecord>();
    ASSIGN_OR_RETURN(IdemRecord rec, RecordAt(r, 0));
    return std::optional<IdemRecord>(std::move(rec));
  }

  // The in_progress record that Abandon or Release may end: nullopt when
  // there is nothing to end (absent or already released); FailedPrecondition
  // when it is completed or bound to another fingerprint.
  StatusOr<std::optional<IdemRecord>> LoadHeld(const std::string& scope, const std::string& key,
                                               const std::string& fingerprint) {
    ASSIGN_OR_RETURN(std::optional<IdemRecord> current, Load(scope, key));
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

  PgContext& ctx_;
};

}  // namespace

std::unique_ptr<IdemKeyStore> MakePgIdemKeyStore(PgContext& ctx) {
  return std::make_unique<PgIdemKeyStore>(ctx);
}

}  // namespace idem::pg
