// PostgreSQL LeaseStore (store.h): named leases shared by every daemon on
// the database, one row per name in "leases", so that a cron job (or any
// work one daemon of many must do) runs under one holder at a time.
//
// Every change is a compare-and-set on the row's latest version:
//   - renewing is an UPDATE that matches only the live lease of this holder
//     under this token;
//   - acquiring is one INSERT ... ON CONFLICT that writes only if the name is
//     free or its lease expired at now_ms: two daemons acquiring one name at
//     once get one kAcquired, the other kHeld;
//   - releasing is a DELETE that matches only this holder under this token.
// When nothing matched, a read says why (kHeld, or FailedPrecondition for a
// wrong token), or that the row changed meanwhile (then it tries again).
// Tokens are compared as SHA-256 digests in SQL and with ConstantTimeEquals
// in C++, so the time a comparison takes says nothing about the token.
//
// Thread-safety: all methods may be called concurrently, from any number of
// processes.
#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>

#include "daemon/core/crypto.h"
#include "daemon/core/json.h"
#include "daemon/store/postgres/pg_store.h"

namespace idem::pg {

extern const std::string_view kSchemaLeases = R"sql(
CREATE TABLE leases (
  name           text COLLATE "C" PRIMARY KEY,
  holder         text NOT NULL,
  token          text NOT NULL,
  acquired_at_ms bigint NOT NULL,
  expires_at_ms  bigint NOT NULL
);
CREATE INDEX leases_expiry ON leases (expires_at_ms);
)sql";

namespace {

constexpr char kColumns[] = "name, holder, token, acquired_at_ms, expires_at_ms";

// How often a call retries when the row keeps changing under it.
constexpr int kAttempts = 16;

NamedLease LeaseAt(const Result& r, int row) {
  NamedLease l;
  l.name = r.str(row, 0);
  l.holder = r.str(row, 1);
  l.token = r.str(row, 2);
  l.acquired_at_ms = r.i64(row, 3);
  l.expires_at_ms = r.i64(row, 4);
  return l;
}

Status WrongToken(const std::string& name, const std::string& holder, const char* what) {
  return Status(Code::kFailedPrecondition,
                "lease '" + name + "' is held by " + holder + what + " needs the token its " +
                    "acquire returned",
                "/token");
}

class PgLeaseStore final : public LeaseStore {
 public:
  explicit PgLeaseStore(PgContext& ctx) : ctx_(ctx) {}

  StatusOr<LeaseResult> Acquire(const std::string& name, const std::string& holder,
                                const std::string& token, int64_t ttl_ms, int64_t now_ms) override {
    if (name.empty()) return InvalidArgument("lease name is empty", "/name");
    if (holder.empty()) return InvalidArgument("lease holder is empty", "/holder");
    if (ttl_ms <= 0) return InvalidArgument("ttl_ms must be positive", "/ttl_ms");
    if (!IsText(name)) return InvalidArgument("lease name is not valid text", "/name");
    if (!IsText(holder)) return InvalidArgument("lease holder is not valid text", "/holder");
    const int64_t until = now_ms + ttl_ms;
    for (int attempt = 0; attempt < kAttempts; ++attempt) {
      if (!token.empty() && IsText(token)) {
        WriteTimer timer(ctx_);
        ASSIGN_OR_RETURN(Result r,
                         ctx_.pool.Exec(std::string("UPDATE leases SET expires_at_ms = $4::bigint"
                                                    " WHERE name = $1 AND holder = $2"
                                                    " AND expires_at_ms > $5::bigint"
                                                    " AND sha256(convert_to(token, 'UTF8'))"
                                                    " = sha256(convert_to($3, 'UTF8'))"
                                                    " RETURNING ") +
                                            kColumns,
                                        {P(name), P(holder), P(token), P(until), P(now_ms)}));
        if (r.rows() == 1) return LeaseResult{LeaseOutcome::kRenewed, LeaseAt(r, 0)};
      }
      if (!token.empty()) {
        // Not renewed: held by another, under another token, or lapsed.
        ASSIGN_OR_RETURN(std::optional<NamedLease> current, Load(name));
        if (!current || current->expires_at_ms <= now_ms) return LeaseLapsed(name);
        if (current->holder != holder) return LeaseResult{LeaseOutcome::kHeld, *current};
        if (!ConstantTimeEquals(token, current->token)) {
          return WrongToken(name, holder, "; renewing it");
        }
        continue;  // renewed meanwhile by a concurrent call with the same token
      }
      {
        WriteTimer timer(ctx_);
        ASSIGN_OR_RETURN(
            Result r,
            ctx_.pool.Exec(
                std::string(
                    "INSERT INTO leases AS l (name, holder, token, acquired_at_ms, expires_at_ms)"
                    " VALUES ($1, $2, $3, $4::bigint, $5::bigint)"
                    " ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder,"
                    " token = EXCLUDED.token, acquired_at_ms = EXCLUDED.acquired_at_ms,"
                    " expires_at_ms = EXCLUDED.expires_at_ms"
                    " WHERE l.expires_at_ms <= $4::bigint"
                    " RETURNING ") +
                    kColumns,
                {P(name), P(holder), P(RandomHex(16)), P(now_ms), P(until)}));
        if (r.rows() == 1) return LeaseResult{LeaseOutcome::kAcquired, LeaseAt(r, 0)};
      }
      ASSIGN_OR_RETURN(std::optional<NamedLease> current, Load(name));
      if (!current || current->expires_at_ms <= now_ms) continue;  // freed meanwhile
      if (current->holder != holder) return LeaseResult{LeaseOutcome::kHeld, *current};
      if (token.empty() || !ConstantTimeEquals(token, current->token)) {
        return WrongToken(name, holder, "; renewing it");
      }
      // Renewed by a concurrent call with the same token: renew again.
    }
    return Unavailable("lease '" + name + "' kept changing under concurrent acquires");
  }

  Status Release(const std::string& name, const std::string& holder,
                 const std::string& token) override {
    if (!IsText(name) || !IsText(holder)) {
      return FailedPrecondition("lease '" + name + "' is not held by " + holder);
    }
    if (!token.empty() && IsText(token)) {
      WriteTimer timer(ctx_);
      ASSIGN_OR_RETURN(Result r, ctx_.pool.Exec("DELETE FROM leases WHERE name = $1"
                                                " AND holder = $2"
                                                " AND sha256(convert_to(token, 'UTF8'))"
                                                " = sha256(convert_to($3, 'UTF8'))",
                                                {P(name), P(holder), P(token)}));
      if (r.affected() == 1) return Status::Ok();
    }
    ASSIGN_OR_RETURN(std::optional<NamedLease> current, Load(name));
    if (!current || current->holder != holder) {
      return FailedPrecondition("lease '" + name + "' is not held by " + holder);
    }
    return WrongToken(name, holder, " under another token; releasing it");
  }

  StatusOr<NamedLease> Get(const std::string& name, int64_t now_ms) override {
    std::optional<NamedLease> current;
    if (IsText(name)) {
      ASSIGN_OR_RETURN(current, Load(name));
    }
    if (!current || current->expires_at_ms <= now_ms)
      return NotFound("lease '" + name + "' is free");
    return std::move(*current);
  }

  StatusOr<size_t> SweepExpired(int64_t now_ms, size_t limit) override {
    if (limit == 0) return size_t{0};
    const int64_t capped = static_cast<int64_t>(std::min<size_t>(limit, 100'000));
    WriteTimer timer(ctx_);
    // SKIP LOCKED: a lease being renewed is left alone; the outer condition
    // is checked again on the locked row.
    ASSIGN_OR_RETURN(Result r, ctx_.pool.Exec("DELETE FROM leases WHERE name IN ("
                                              " SELECT name FROM leases"
                                              " WHERE expires_at_ms <= $1::bigint"
                                              " ORDER BY expires_at_ms LIMIT $2"
                                              " FOR UPDATE SKIP LOCKED)"
                                              " AND expires_at_ms <= $1::bigint",
                                              {P(now_ms), P(capped)}));
    return static_cast<size_t>(r.affected());
  }

 private:
  StatusOr<std::optional<NamedLease>> Load(const std::string& name) {
    ASSIGN_OR_RETURN(
        Result r, ctx_.pool.Exec(std::string("SELECT ") + kColumns + " FROM leases WHERE name = $1",
                                 {P(name)}));
    if (r.rows() == 0) return std::optional<NamedLease>();
    return std::optional<NamedLease>(LeaseAt(r, 0));
  }

  PgContext& ctx_;
};

}  // namespace

std::unique_ptr<LeaseStore> MakePgLeaseStore(PgContext& ctx) {
  return std::make_unique<PgLeaseStore>(ctx);
}

}  // namespace idem::pg
