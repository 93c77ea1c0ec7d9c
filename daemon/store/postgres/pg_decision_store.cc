// PostgreSQL DecisionStore (store.h): the decision cache shared by every
// daemon on the database.
//
// Table "decisions" holds every decision by id (superseded ones too), its
// hot record in `body` (record_codec.h, EncodeDecision: Decision::ToJson
// with the trace's summary), its whole trace in `trace` (NULL when the
// trace has no detail and is whole in `body`), and the columns List and
// SweepExpired filter and order on. GetByKey selects `body` only, so a
// cache hit never reads (nor detoasts) the trace. "decision_keys" maps a
// decision_key to the id of the cached decision, with a copy of its
// expiry, so that "is the cached decision still live?" is a question about
// the one row that PutIfAbsent locks:
//   - PutIfAbsent is one INSERT ... ON CONFLICT on decision_keys that takes
//     the key only if it is absent or its decision expired (a compare-and-set
//     on the latest row version, so two daemons storing the same key store
//     one decision and both get it back), with the decision row in the same
//     statement and the outbox event in the same transaction;
//   - a live decision is answered from one read, before any transaction.
// There is no in-process cache (unlike RocksDB): another daemon may Replace
// a key at any time, and a cache here would serve its old decision.
//
// List is newest first (created_at_ms descending, then decision_id
// ascending, bytewise as on RocksDB); cursors are opaque (hex of the
// position of the last item).
//
// Thread-safety: all methods may be called concurrently, from any number of
// processes.
#include <algorithm>
#include <chrono>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "daemon/core/json.h"
#include "daemon/store/postgres/pg_store.h"
#include "daemon/store/record_codec.h"

namespace idem::pg {

extern const std::string_view kSchemaDecisions = R"sql(
CREATE TABLE decisions (
  decision_id   text COLLATE "C" PRIMARY KEY,
  decision_key  text COLLATE "C" NOT NULL,
  step          text COLLATE "C" NOT NULL,
  status        text NOT NULL,
  created_at_ms bigint NOT NULL,
  expires_at_ms bigint NOT NULL,  -- 0: kept forever
  body          text NOT NULL     -- the hot record (EncodeDecision)
);
CREATE INDEX decisions_by_time ON decisions (created_at_ms DESC, decision_id);
CREATE INDEX decisions_by_step ON decisions (step, created_at_ms DESC, decision_id);
CREATE INDEX decisions_expiry ON decisions (expires_at_ms) WHERE expires_at_ms <> 0;
CREATE TABLE decision_keys (
  decision_key  text COLLATE "C" PRIMARY KEY,
  decision_id   text COLLATE "C" NOT NULL,
  expires_at_ms bigint NOT NULL  -- the cached decision's
);
)sql";

// Migration 2 (session 7): the trace kept apart from the hot record.
extern const std::string_view kSchemaDecisionTraces = R"sql(
ALTER TABLE decisions ADD COLUMN trace text;  -- the whole trace; NULL: whole in body
)sql";

namespace {

bool Live(int64_t expires_at_ms, int64_t now_ms) {
  return expires_at_ms == 0 || expires_at_ms > now_ms;
}

Status Validate(const Decision& d) {
  if (d.decision_id.empty()) return InvalidArgument("decision_id is empty", "/decision_id");
  if (d.decision_key.empty()) return InvalidArgument("decision_key is empty", "/decision_key");
  RETURN_IF_ERROR(CheckText(d.decision_id, "/decision_id"));
  RETURN_IF_ERROR(CheckText(d.decision_key, "/decision_key"));
  RETURN_IF_ERROR(CheckText(d.step, "/step"));
  return CheckText(d.status, "/status");
}

// A decision as GetByKey answers it, from its hot record.
StatusOr<Decision> DecodeHot(std::string_view body) {
  ASSIGN_OR_RETURN(Decision d, store_internal::DecodeDecision(body));
  store_internal::CutTraceToSummary(d);
  return d;
}

// A whole decision, from columns `body` and `trace` of row `row`.
StatusOr<Decision> DecodeWhole(const Result& r, int row, int body_col, int trace_col) {
  ASSIGN_OR_RETURN(Decision d, store_internal::DecodeDecision(r.text(row, body_col)));
  if (!d.trace_whole) {
    if (r.null(row, trace_col)) {
      return Internal("the trace of decision " + d.decision_id + " is missing");
    }
    RETURN_IF_ERROR(store_internal::AttachTrace(d, r.text(row, trace_col)));
  }
  return d;
}

// The key row and the decision row in one statement. With `only_if_free`
// (PutIfAbsent) the key is taken only when absent or when its decision
// expired at $9; ON CONFLICT evaluates that on the latest version of the
// key row, which it locks, so the answer holds until COMMIT. Returns one
// row (true when the decision id is new) if the decision was stored.
std::string WriteSql(bool only_if_free) {
  std::string sql =
      "WITH k AS ("
      " INSERT INTO decision_keys AS k (decision_key, decision_id, expires_at_ms)"
      " VALUES ($1, $2, $3::bigint)"
      " ON CONFLICT (decision_key) DO UPDATE"
      " SET decision_id = EXCLUDED.decision_id, expires_at_ms = EXCLUDED.expires_at_ms";
  if (only_if_free) sql += " WHERE k.expires_at_ms <> 0 AND k.expires_at_ms <= $9::bigint";
  sql +=
      " RETURNING 1)"
      " INSERT INTO decisions AS d"
      " (decision_id, decision_key, step, status, created_at_ms, expires_at_ms, body, trace)"
      " SELECT $2, $1, $4, $5, $6::bigint, $3::bigint, $7, $8 FROM k"
      " ON CONFLICT (decision_id) DO UPDATE SET decision_key = EXCLUDED.decision_key,"
      " step = EXCLUDED.step, status = EXCLUDED.status,"
      " created_at_ms = EXCLUDED.created_at_ms, expires_at_ms = EXCLUDED.expires_at_ms,"
      " body = EXCLUDED.body, trace = EXCLUDED.trace"
      " RETURNING (d.xmax = 0) AS created";
  return sql;
}

class PgDecisionStore final : public DecisionStore {
 public:
  explicit PgDecisionStore(PgContext& ctx) : ctx_(ctx) {}

  StatusOr<Decision> GetByKey(const std::string& decision_key, int64_t now_ms) override {
    ASSIGN_OR_RETURN(std::optional<Decision> d, Current(decision_key, now_ms));
    if (!d) return NotFound("no cached decision for key " + decision_key);
    return std::move(*d);
  }

  StatusOr<Decision> Get(const std::string& decision_id) override {
    if (CheckText(decision_id, "/decision_id").code() != Code::kOk) {
      return NotFound("no such decision: " + decision_id);
    }
    ASSIGN_OR_RETURN(Result r,
                     ctx_.pool.Exec("SELECT body, trace FROM decisions WHERE decision_id = $1",
                                    {P(decision_id)}));
    if (r.rows() == 0) return NotFound("no such decision: " + decision_id);
    return DecodeWhole(r, 0, 0, 1);
  }

  StatusOr<Decision> PutIfAbsent(const Decision& d, int64_t now_ms,
                                 bool* stored_here = nullptr) override {
    if (stored_here != nullptr) *stored_here = false;
    RETURN_IF_ERROR(Validate(d));
    // The hot path (a cache hit): one read, no transaction.
    {
      ASSIGN_OR_RETURN(std::optional<Decision> current, Current(d.decision_key, now_ms));
      if (current) return std::move(*current);
    }
    ASSIGN_OR_RETURN(store_internal::StoredDecision body, store_internal::EncodeDecision(d));
    std::optional<Decision> winner;
    StatusOr<bool> stored = Write(d, body, /*only_if_free=*/true, now_ms, [&](Conn& c) -> Status {
      // Another decision is live under the key: the row ON CONFLICT locked
      // (it stays locked until this transaction ends) and its decision.
      ASSIGN_OR_RETURN(Result r, c.Exec("SELECT d.body FROM decision_keys k"
                                        " JOIN decisions d ON d.decision_id = k.decision_id"
                                        " WHERE k.decision_key = $1",
                                        {P(d.decision_key)}));
      if (r.rows() == 0) {
        return Internal("decision key " + d.decision_key + " points at a missing decision");
      }
      ASSIGN_OR_RETURN(Decision found, DecodeHot(r.text(0, 0)));
      winner = std::move(found);
      return Status::Ok();
    });
    RETURN_IF_ERROR(stored.status());
    if (*stored) {
      if (stored_here != nullptr) *stored_here = true;
      return d;
    }
    if (!winner) return Internal("storing decision " + d.decision_id + " found no decision");
    return std::move(*winner);
  }

  Status Replace(const Decision& d) override {
    RETURN_IF_ERROR(Validate(d));
    ASSIGN_OR_RETURN(store_internal::StoredDecision body, store_internal::EncodeDecision(d));
    StatusOr<bool> stored = Write(d, body, /*only_if_free=*/false, 0, [&](Conn&) -> Status {
      return Internal("replacing decision " + d.decision_id + " stored nothing");
    });
    return stored.status();
  }

  StatusOr<DecisionPage> List(const std::string& step, const std::string& status,
                              const std::string& cursor, size_t limit) override {
    if (limit == 0) return InvalidArgument("limit must be positive", "/limit");
    std::optional<std::pair<int64_t, std::string>> after;
    if (!cursor.empty()) {
      ASSIGN_OR_RETURN(after, ParseTimeIdCursor(cursor));
    }
    DecisionPage page;
    // Filters on text no stored decision can hold match nothing.
    if (CheckText(step, "/step").code() != Code::kOk ||
        CheckText(status, "/status").code() != Code::kOk) {
      return page;
    }
    std::string sql = "SELECT body, created_at_ms, decision_id, trace FROM decisions WHERE true";
    std::vector<Param> params;
    auto next = [&params](Param p) {
      params.push_back(std::move(p));
      return "$" + std::to_string(params.size());
    };
    if (!step.empty()) sql += " AND step = " + next(P(step));
    if (!status.empty()) sql += " AND status = " + next(P(status));
    if (after) {
      std::string created = next(P(after->first));
      std::string id = next(P(after->second));
      sql += " AND (created_at_ms < " + created + "::bigint OR (created_at_ms = " + created +
             "::bigint AND decision_id > " + id + "))";
    }
    const size_t capped = std::min<size_t>(limit, 100'000);
    sql += " ORDER BY created_at_ms DESC, decision_id LIMIT " +
           next(P(static_cast<int64_t>(capped) + 1));
    ASSIGN_OR_RETURN(Result r, ctx_.pool.Exec(sql, params));
    for (int i = 0; i < r.rows(); ++i) {
      if (page.items.size() == capped) {
        // One more match exists: the page is full and another follows.
        page.next_cursor = TimeIdCursor(r.i64(i - 1, 1), r.str(i - 1, 2));
        break;
      }
      ASSIGN_OR_RETURN(Decision d, DecodeWhole(r, i, 0, 3));
      page.items.push_back(std::move(d));
    }
    return page;
  }

  StatusOr<size_t> SweepExpired(int64_t now_ms, size_t limit,
                                std::vector<std::string>* swept_ids) override {
    if (limit == 0 || now_ms < 0) return size_t{0};
    const int64_t capped = static_cast<int64_t>(std::min<size_t>(limit, 100'000));
    size_t swept = 0;
    WriteTimer timer(ctx_);
    // The key row goes with its decision only while it still points at it:
    // a PutIfAbsent or Replace that moved the key meanwhile keeps it (the
    // DELETE waits for its lock and re-checks the row). SKIP LOCKED: two
    // daemons sweeping at once take different rows.
    RETURN_IF_ERROR(ctx_.pool.Tx([&](Conn& c) -> Status {
      ASSIGN_OR_RETURN(
          Result r,
          c.Exec("WITH gone AS ("
                 " DELETE FROM decisions WHERE decision_id IN ("
                 "  SELECT decision_id FROM decisions"
                 "  WHERE expires_at_ms <> 0 AND expires_at_ms <= $1::bigint"
                 "  ORDER BY expires_at_ms LIMIT $2 FOR UPDATE SKIP LOCKED)"
                 " AND expires_at_ms <> 0 AND expires_at_ms <= $1::bigint"
                 " RETURNING decision_id, decision_key),"
                 " keys AS ("
                 " DELETE FROM decision_keys k USING gone"
                 " WHERE k.decision_key = gone.decision_key AND k.decision_id = gone.decision_id)"
                 " SELECT decision_id FROM gone",
                 {P(now_ms), P(capped)}));
      swept = static_cast<size_t>(r.rows());
      if (swept_ids != nullptr) {
        for (int i = 0; i < r.rows(); ++i) swept_ids->emplace_back(r.text(i, 0));
      }
      return Status::Ok();
    }));
    return swept;
  }

 private:
  // The live decision cached under the key, if any.
  StatusOr<std::optional<Decision>> Current(const std::string& decision_key, int64_t now_ms) {
    if (CheckText(decision_key, "/decision_key").code() != Code::kOk) {
      return std::optional<Decision>();
    }
    ASSIGN_OR_RETURN(Result r, ctx_.pool.Exec("SELECT d.body, d.expires_at_ms FROM decision_keys k"
                                              " JOIN decisions d ON d.decision_id = k.decision_id"
                                              " WHERE k.decision_key = $1",
                                              {P(decision_key)}));
    if (r.rows() == 0 || !Live(r.i64(0, 1), now_ms)) return std::optional<Decision>();
    ASSIGN_OR_RETURN(Decision d, DecodeHot(r.text(0, 0)));
    return std::optional<Decision>(std::move(d));
  }

  // Stores `d` as the cached decision of its key, with its outbox event, in
  // one transaction; when `only_if_free` and the key holds a live decision,
  // nothing is stored and `on_taken` runs in the transaction instead.
  // Returns whether `d` was stored (by the attempt that committed).
  StatusOr<bool> Write(const Decision& d, const store_internal::StoredDecision& body,
                       bool only_if_free, int64_t now_ms,
                       const std::function<Status(Conn&)>& on_taken) {
    std::vector<Param> params = {P(d.decision_key), P(d.decision_id), P(d.expires_at_ms),
                                 P(d.step),         P(d.status),      P(d.created_at_ms),
                                 P(body.hot),       body.trace};
    if (only_if_free) params.push_back(P(now_ms));
    const std::string sql = WriteSql(only_if_free);
    WriteTimer timer(ctx_);
    bool stored = false;
    RETURN_IF_ERROR(ctx_.pool.Tx([&](Conn& c) -> Status {
      stored = false;  // fn runs again when the transaction is retried
      ASSIGN_OR_RETURN(Result r, c.Exec(sql, params));
      if (r.rows() == 0) return on_taken(c);
      stored = true;
      const bool created = r.boolean(0, 0);
      return StageOutboxEvent(c, created ? "decision.created" : "decision.updated", d.decision_id,
                              d.created_at_ms,
                              Json{{"decision_id", d.decision_id},
                                   {"decision_key", d.decision_key},
                                   {"step", d.step},
                                   {"status", d.status},
                                   {"decided_by", d.decided_by}});
    }));
    return stored;
  }

  PgContext& ctx_;
};

}  // namespace

std::unique_ptr<DecisionStore> MakePgDecisionStore(PgContext& ctx) {
  return std::make_unique<PgDecisionStore>(ctx);
}

}  // namespace idem::pg
