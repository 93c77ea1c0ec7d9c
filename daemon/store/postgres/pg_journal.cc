// PostgreSQL Journal (store.h, class Journal): the effects journal shared by
// every daemon on the schema.
//
// One row per work item. Every write is fenced in the database, never by a
// read-then-write: a claim is one INSERT ... ON CONFLICT DO UPDATE ... WHERE
// <the record may be claimed> RETURNING (the conflicting row is re-checked
// under its lock, so of many daemons claiming one work_id exactly one gets
// the row back); a complete, fail or external ref names the lease token in
// the row it changes.
//
// Round trips:
//   - Claim, Enqueue: one statement in autocommit (one commit). Outcomes
//     that write nothing (done, dead, busy) are answered from the same
//     statement's read, without taking a lock or writing WAL.
//   - BeginOps with claims only, on distinct work: the same statement for
//     every claim at once (unnest of arrays): one round trip, one commit.
//   - BeginOps otherwise (completes, fails, repeated work): one transaction
//     that locks the rows in work_id order (an upsert that creates an
//     uncommitted placeholder for absent work, so new work is locked too),
//     decides every op in order as RocksDB does, then writes them with one
//     multi-row UPDATE, plus the outbox events (StageOutboxEvent:
//     effect.done, work.dead_letter) in the same transaction. Complete and
//     Fail are one-op batches.
// BeginOps commits before it returns, so pending ops hold no lock and are
// never skipped (LockWait only matters to an engine that holds locks until
// FinishOps); the PendingOps it returns is Ready().
//
// Every multi-row statement locks (or creates) its rows in work_id order,
// so batches of several daemons never wait on each other in a cycle; a
// deadlock the server reports anyway is retried (Aborted, retryable).
//
// Failpoint "store.write" (error) fails the commit of every write as a
// disk error would: the statement runs in a transaction that is rolled
// back, so ops answered without a write keep their outcome.
//
// args, identity and result are stored as JSON text, exactly as encoded.
#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "daemon/core/crypto.h"
#include "daemon/core/failpoints.h"
#include "daemon/core/json.h"
#include "daemon/store/journal_rules.h"
#include "daemon/store/postgres/pg_store.h"
#include "daemon/store/record_codec.h"

namespace idem::pg {

using namespace ::idem::journal_rules;  // NOLINT: the rules both engines share

// Migration 3 (session 26): the runs that took work in after it was made
// (Journal::AddToRun). A member names the incarnation it joined by its
// created_at_ms: a record remade after its window (same work_id) is not in
// the run; the sweep deletes the members of the records it deletes.
extern const std::string_view kSchemaRunMembers = R"sql(
CREATE TABLE journal_run_members (
  run_id        text NOT NULL,
  work_id       text NOT NULL,
  created_at_ms bigint NOT NULL,  -- the journal record's, when it joined
  PRIMARY KEY (run_id, work_id)
);
CREATE INDEX journal_run_members_work ON journal_run_members (work_id);
)sql";

// WorkItem::call_id: records made before it have none (every call is then
// judged another's, as before).
extern const std::string_view kSchemaJournalCallId = R"sql(
ALTER TABLE journal ADD COLUMN call_id text NOT NULL DEFAULT '';
)sql";

extern const std::string_view kSchemaJournal = R"sql(
CREATE TABLE journal (
  work_id            text PRIMARY KEY,
  kind               text NOT NULL,
  state              text NOT NULL
                     CHECK (state IN ('pending', 'running', 'done', 'failed', 'dead')),
  attempt            integer NOT NULL,
  max_attempts       integer NOT NULL,
  lease_token        text NOT NULL,
  locked_until_ms    bigint NOT NULL,
  args               text NOT NULL,
  identity           text NOT NULL,
  result             text NOT NULL,
  external_ref       text NOT NULL,
  last_error         text NOT NULL,
  next_attempt_at_ms bigint NOT NULL,
  created_at_ms      bigint NOT NULL,
  updated_at_ms      bigint NOT NULL,
  expires_at_ms      bigint NOT NULL,
  run_id             text NOT NULL,
  request_id         text NOT NULL,
  trace_id           text NOT NULL,
  window_ms          bigint NOT NULL
);
CREATE INDEX journal_due ON journal
  ((CASE WHEN state = 'running' THEN locked_until_ms ELSE next_attempt_at_ms END), work_id)
  WHERE state IN ('pending', 'failed', 'running');
CREATE INDEX journal_dead ON journal (updated_at_ms, work_id) WHERE state = 'dead';
CREATE INDEX journal_run ON journal (run_id, created_at_ms, work_id) WHERE run_id <> '';
CREATE INDEX journal_done_ref ON journal (kind, updated_at_ms DESC, work_id)
  WHERE state = 'done' AND external_ref <> '';
CREATE INDEX journal_expiry ON journal (expires_at_ms, work_id)
  WHERE state = 'done' AND expires_at_ms <> 0;
)sql";

namespace {

// Rounds of a claim that found the record changing under it (another daemon
// wrote between the statement's read and its upsert) before giving up.
constexpr int kClaimRounds = 16;

// The columns, in this order, in every SELECT and RETURNING.
constexpr const char* kColumnNames[] = {"work_id",
                                        "kind",
                                        "state",
                                        "attempt",
                                        "max_attempts",
                                        "lease_token",
                                        "locked_until_ms",
                                        "args",
                                        "identity",
                                        "result",
                                        "external_ref",
                                        "last_error",
                                        "next_attempt_at_ms",
                                        "created_at_ms",
                                        "updated_at_ms",
                                        "expires_at_ms",
                                        "run_id",
                                        "request_id",
                                        "trace_id",
                                        "window_ms",
                                        "call_id"};
constexpr int kNumColumns = 21;
// SQL types of the columns, for unnest() of array parameters.
constexpr const char* kColumnTypes[] = {"text",   "text",   "text",   "integer", "integer", "text",
                                        "bigint", "text",   "text",   "text",    "text",    "text",
                                        "bigint", "bigint", "bigint", "bigint",  "text",    "text",
                                        "text",   "bigint", "text"};

std::string Columns(const std::string& prefix = "") {
  std::string out;
  for (int i = 0; i < kNumColumns; ++i) {
    if (i) out += ", ";
    out += prefix + kColumnNames[i];
  }
  return out;
}

StatusOr<WorkItem> ParseRow(const Result& r, int row, int first_col) {
  WorkItem w;
  auto s = [&](int i) { return r.str(row, first_col + i); };
  auto n = [&](int i) { return r.i64(row, first_col + i); };
  w.work_id = s(0);
  w.kind = s(1);
  ASSIGN_OR_RETURN(w.state, store_internal::ParseWorkState(s(2)));
  w.attempt = static_cast<int>(n(3));
  w.max_attempts = static_cast<int>(n(4));
  w.lease_token = s(5);
  w.locked_until_ms = n(6);
  ASSIGN_OR_RETURN(w.args, store_internal::DecodeJson(r.text(row, first_col + 7), "journal"));
  ASSIGN_OR_RETURN(w.identity, store_internal::DecodeJson(r.text(row, first_col + 8), "journal"));
  ASSIGN_OR_RETURN(w.result, store_internal::DecodeJson(r.text(row, first_col + 9), "journal"));
  w.external_ref = s(10);
  w.last_error = s(11);
  w.next_attempt_at_ms = n(12);
  w.created_at_ms = n(13);
  w.updated_at_ms = n(14);
  w.expires_at_ms = n(15);
  w.run_id = s(16);
  w.request_id = s(17);
  w.trace_id = s(18);
  w.window_ms = n(19);
  w.call_id = s(20);
  return w;
}

Status CheckItemText(const WorkItem& w) {
  for (const auto& [name, v] :
       {std::pair<std::string_view, const std::string*>{"work_id", &w.work_id},
        {"kind", &w.kind},
        {"external_ref", &w.external_ref},
        {"last_error", &w.last_error},
        {"run_id", &w.run_id},
        {"request_id", &w.request_id},
        {"trace_id", &w.trace_id},
        {"call_id", &w.call_id}}) {
    RETURN_IF_ERROR(CheckText(*v, "/" + std::string(name)));
  }
  return Status::Ok();
}

// Column-wise arrays of whole records, for a multi-row INSERT or UPDATE.
StatusOr<std::vector<Param>> RecordArrays(const std::vector<const WorkItem*>& items) {
  std::vector<std::vector<std::string>> cols(kNumColumns);
  for (const WorkItem* w : items) {
    RETURN_IF_ERROR(CheckItemText(*w));
    ASSIGN_OR_RETURN(std::string args, store_internal::EncodeJson(w->args));
    ASSIGN_OR_RETURN(std::string identity, store_internal::EncodeJson(w->identity));
    ASSIGN_OR_RETURN(std::string result, store_internal::EncodeJson(w->result));
    std::string v[kNumColumns] = {w->work_id,
                                  w->kind,
                                  std::string(WorkStateName(w->state)),
                                  std::to_string(w->attempt),
                                  std::to_string(w->max_attempts),
                                  w->lease_token,
                                  std::to_string(w->locked_until_ms),
                                  std::move(args),
                                  std::move(identity),
                                  std::move(result),
                                  w->external_ref,
                                  w->last_error,
                                  std::to_string(w->next_attempt_at_ms),
                                  std::to_string(w->created_at_ms),
                                  std::to_string(w->updated_at_ms),
                                  std::to_string(w->expires_at_ms),
                                  w->run_id,
                                  w->request_id,
                                  w->trace_id,
                                  std::to_string(w->window_ms),
                                  w->call_id};
    for (int i = 0; i < kNumColumns; ++i) cols[i].push_back(std::move(v[i]));
  }
  std::vector<Param> out;
  for (const auto& c : cols) out.push_back(ArrayLiteral(c));
  return out;
}

// unnest($1::text[], $2::text[], ...) AS v(work_id, kind, ...)
std::string UnnestRecords() {
  std::string out = "unnest(";
  for (int i = 0; i < kNumColumns; ++i) {
    if (i) out += ", ";
    out += "$" + std::to_string(i + 1) + "::" + kColumnTypes[i] + "[]";
  }
  out += ") AS v(" + Columns() + ")";
  return out;
}

// --- the claim statement: one row per request, tagged true when claimed
// by this statement, false when it is the record as read (nothing written).

// A record the claim answers without writing (done and not expired, dead,
// running under a live lease, failed before its next attempt is due) or that needs more than an
// upsert (running under an expired lease on its last attempt: it becomes dead).
std::string ReadOnlyPredicate(const std::string& c, const std::string& now) {
  return "((" + c + ".state = 'done' AND NOT (" + c + ".expires_at_ms <> 0 AND " + c +
         ".expires_at_ms <= " + now + ")) OR " + c + ".state = 'dead' OR (" + c +
         ".state = 'running' AND (" + c + ".locked_until_ms > " + now + " OR " + c +
         ".attempt >= " + c + ".max_attempts)) OR (" + c + ".state = 'failed' AND " + c +
         ".next_attempt_at_ms > " + now + "))";
}

// The record may be claimed by an upsert: done with its window over (a new
// record), pending, failed with its backoff waited out, or running under an expired lease with
// attempts left.
std::string ClaimablePredicate(const std::string& j, const std::string& now) {
  return "((" + j + ".state = 'done' AND " + j + ".expires_at_ms <> 0 AND " + j +
         ".expires_at_ms <= " + now + ") OR " + j + ".state = 'pending' OR (" + j +
         ".state = 'failed' AND " + j + ".next_attempt_at_ms <= " + now + ") OR (" + j +
         ".state = 'running' AND " + j + ".locked_until_ms <= " + now + " AND " + j +
         ".attempt < " + j + ".max_attempts))";
}

// Requests as column arrays: work_id, kind, max_attempts, args, identity,
// run_id, request_id, trace_id, window_ms, now_ms, locked_until_ms,
// lease_token, state, attempt, next_attempt_at_ms, call_id.
constexpr int kReqColumns = 16;

// `claim`: a running record with a lease (Claim); otherwise a pending one
// due at now (Enqueue), which only replaces a done record whose window is
// over.
std::string UpsertSql(bool claim) {
  std::string sql =
      "WITH req AS (SELECT * FROM unnest($1::text[], $2::text[], $3::integer[], $4::text[],"
      " $5::text[], $6::text[], $7::text[], $8::text[], $9::bigint[], $10::bigint[],"
      " $11::bigint[], $12::text[], $13::text[], $14::integer[], $15::bigint[], $16::text[])"
      " AS r(work_id, kind, max_attempts, args, identity, run_id, request_id, trace_id,"
      " window_ms, now_ms, locked_until_ms, lease_token, state, attempt, next_attempt_at_ms,"
      " call_id)),"
      " cur AS (SELECT " +
      Columns("j.") +
      " FROM journal j WHERE j.work_id IN (SELECT work_id FROM req)),"
      " up AS (INSERT INTO journal AS j (" +
      Columns() +
      ") SELECT r.work_id, r.kind, r.state, r.attempt, r.max_attempts, r.lease_token,"
      " r.locked_until_ms, r.args, r.identity, 'null', '', '', r.next_attempt_at_ms, r.now_ms,"
      " r.now_ms, 0, r.run_id, r.request_id, r.trace_id, r.window_ms, r.call_id FROM req r"
      " WHERE NOT EXISTS (SELECT 1 FROM cur c WHERE c.work_id = r.work_id AND ";
  if (claim) {
    sql += ReadOnlyPredicate("c", "r.now_ms");
  } else {
    sql += "NOT (c.state = 'done' AND c.expires_at_ms <> 0 AND c.expires_at_ms <= r.now_ms)";
  }
  sql += ") ORDER BY r.work_id ON CONFLICT (work_id) DO UPDATE SET ";
  // A done record whose window is over is replaced whole; otherwise the
  // claim grants a lease on the record as it is.
  const char* kept[] = {"kind",         "max_attempts", "args",          "identity", "result",
                        "external_ref", "last_error",   "created_at_ms", "run_id",   "request_id",
                        "trace_id",     "window_ms",    "call_id"};
  if (claim) {
    for (const char* c : kept) {
      sql += std::string(c) + " = CASE WHEN j.state = 'done' THEN EXCLUDED." + c + " ELSE j." + c +
             " END, ";
    }
    sql +=
        "state = 'running', attempt = CASE WHEN j.state = 'done' THEN 1 ELSE j.attempt + 1 END,"
        " lease_token = EXCLUDED.lease_token, locked_until_ms = EXCLUDED.locked_until_ms,"
        " next_attempt_at_ms = 0, updated_at_ms = EXCLUDED.updated_at_ms,"
        " expires_at_ms = CASE WHEN j.state = 'done' THEN 0 ELSE j.expires_at_ms END WHERE " +
        ClaimablePredicate("j", "EXCLUDED.updated_at_ms");
  } else {
    for (int i = 1; i < kNumColumns; ++i) {
      if (i > 1) sql += ", ";
      sql += std::string(kColumnNames[i]) + " = EXCLUDED." + kColumnNames[i];
    }
    sql +=
        " WHERE j.state = 'done' AND j.expires_at_ms <> 0 AND j.expires_at_ms <="
        " EXCLUDED.updated_at_ms";
  }
  sql += " RETURNING " + Columns("j.") + ") SELECT true, " + Columns("up.") +
         " FROM up UNION ALL SELECT false, " + Columns("c.") +
         " FROM cur c WHERE NOT EXISTS (SELECT 1 FROM up u WHERE u.work_id = c.work_id)";
  return sql;
}

const std::string& ClaimSql() {
  static const std::string* s = new std::string(UpsertSql(true));
  return *s;
}
const std::string& EnqueueSql() {
  static const std::string* s = new std::string(UpsertSql(false));
  return *s;
}

// The outbox hears of work done and work dead, in the same transaction.
Status StageEvent(Conn& c, const std::optional<WorkItem>& before, const WorkItem& after) {
  ASSIGN_OR_RETURN(std::optional<WorkEvent> event, WorkEventFor(before, after));
  if (!event) return Status::Ok();
  return StageOutboxEventText(c, event->type, after.work_id, after.updated_at_ms, event->data);
}

Status WriteFailed(const Status& fp) {
  return Unavailable("store write failed: " + fp.message(), true);
}

// Decided outcomes without a write to wait for.
class DonePending final : public Journal::PendingOps {
 public:
  explicit DonePending(std::vector<StatusOr<JournalOpResult>> r) : results(std::move(r)) {}
  bool Ready() const override { return true; }
  std::vector<StatusOr<JournalOpResult>> results;
};

class PgJournal final : public Journal {
 public:
  explicit PgJournal(PgContext& ctx) : ctx_(ctx) {}

  StatusOr<ClaimResult> Claim(const ClaimRequest& req) override {
    RETURN_IF_ERROR(ValidateRequest(req));
    std::vector<StatusOr<ClaimResult>> out = ClaimDistinct({&req});
    return std::move(out[0]);
  }

  std::unique_ptr<PendingOps> BeginOps(std::span<const JournalOp> ops,
                                       std::function<void()> on_durable,
                                       LockWait /*wait*/) override {
    std::vector<StatusOr<JournalOpResult>> results = RunOps(ops);
    if (on_durable) on_durable();
    return std::make_unique<DonePending>(std::move(results));
  }

  std::vector<StatusOr<JournalOpResult>> FinishOps(std::unique_ptr<PendingOps> pending) override {
    return std::move(static_cast<DonePending&>(*pending).results);
  }

  StatusOr<WorkItem> Enqueue(const ClaimRequest& req) override {
    RETURN_IF_ERROR(ValidateRequest(req));
    for (int round = 0; round < kClaimRounds; ++round) {
      ASSIGN_OR_RETURN(std::vector<Param> params, UpsertParams({&req}, /*claim=*/false));
      Status commit;
      StatusOr<Result> r = ExecWrite(EnqueueSql(), params, &commit);
      if (!r.ok() && r.status().code() == Code::kAborted) continue;
      RETURN_IF_ERROR(r.status());
      RETURN_IF_ERROR(commit);
      if (r->rows() == 0) continue;  // created or deleted meanwhile: read again
      ASSIGN_OR_RETURN(WorkItem w, ParseRow(*r, 0, 1));
      if (r->boolean(0, 0)) return w;
      if (!Expired(w, req.now_ms)) return Scrubbed(std::move(w));
    }
    return Unavailable("work " + req.work_id + " kept changing; try again", true);
  }

  Status Complete(const std::string& work_id, const std::string& lease_token, const Json& result,
                  const std::string& external_ref, int64_t now_ms) override {
    JournalOp op;
    op.type = JournalOp::Type::kComplete;
    op.work_id = work_id;
    op.lease_token = lease_token;
    op.result = result;
    op.external_ref = external_ref;
    op.now_ms = now_ms;
    std::vector<StatusOr<JournalOpResult>> out = RunOps(std::span<const JournalOp>(&op, 1));
    RETURN_IF_ERROR(out[0].status());
    return Refusal(*out[0]);
  }

  Status RecordExternalRef(const std::string& work_id, const std::string& lease_token,
                           const std::string& external_ref, int64_t now_ms) override {
    if (lease_token.empty()) return InvalidArgument("lease token is empty", "/lease_token");
    if (external_ref.empty()) return InvalidArgument("external_ref is empty", "/external_ref");
    RETURN_IF_ERROR(CheckText(external_ref, "/external_ref"));
    if (Status fp = Failpoints::Hit("store.write"); !fp.ok()) return WriteFailed(fp);
    int64_t started = NowMicros();
    ASSIGN_OR_RETURN(
        Result r, ctx_.pool.Exec("UPDATE journal SET external_ref = $3, updated_at_ms = $4"
                                 " WHERE work_id = $1 AND state = 'running' AND lease_token = $2",
                                 {P(work_id), P(lease_token), P(external_ref), P(now_ms)}));
    Observe(started);
    if (r.affected() == 1) return Status::Ok();
    ASSIGN_OR_RETURN(WorkItem found, Get(work_id));
    return StaleLeaseStatus(found);
  }

  StatusOr<WorkItem> Fail(const std::string& work_id, const std::string& lease_token,
                          const std::string& error, bool retryable, int64_t retry_at_ms,
                          int64_t now_ms) override {
    JournalOp op;
    op.type = JournalOp::Type::kFail;
    op.work_id = work_id;
    op.lease_token = lease_token;
    op.error = error;
    op.retryable = retryable;
    op.now_ms = now_ms;
    op.retry_delay_ms = [retry_at_ms, now_ms](const WorkItem&) { return retry_at_ms - now_ms; };
    std::vector<StatusOr<JournalOpResult>> out = RunOps(std::span<const JournalOp>(&op, 1));
    RETURN_IF_ERROR(out[0].status());
    RETURN_IF_ERROR(Refusal(*out[0]));
    return std::move(out[0]->item);
  }

  StatusOr<WorkItem> Get(const std::string& work_id) override {
    ASSIGN_OR_RETURN(
        Result r,
        ctx_.pool.Exec("SELECT " + Columns() + " FROM journal WHERE work_id = $1", {P(work_id)}));
    if (r.rows() == 0) return NotFound("no such work: " + work_id);
    ASSIGN_OR_RETURN(WorkItem w, ParseRow(r, 0, 0));
    return Scrubbed(std::move(w));
  }

  using Journal::Due;
  StatusOr<std::vector<WorkItem>> Due(int64_t now_ms, size_t n,
                                      const std::vector<std::string>& skip_kinds) override {
    if (n == 0 || now_ms < 0) return std::vector<WorkItem>();
    return List(
        "WHERE state IN ('pending', 'failed', 'running') AND (CASE WHEN state = 'running' THEN"
        " locked_until_ms ELSE next_attempt_at_ms END) <= $1 AND kind <> ALL($3::text[])"
        " ORDER BY (CASE WHEN state = 'running' THEN locked_until_ms ELSE next_attempt_at_ms"
        " END), work_id LIMIT $2",
        {P(now_ms), Limit(n), P(ArrayLiteral(skip_kinds))});
  }

  StatusOr<std::vector<WorkItem>> DeadLetters(size_t limit) override {
    if (limit == 0) return std::vector<WorkItem>();
    return List("WHERE state = 'dead' ORDER BY updated_at_ms, work_id LIMIT $1", {Limit(limit)});
  }

  StatusOr<size_t> CountDeadLetters(size_t cap) override {
    return CountRows(ctx_.pool, "journal WHERE state = 'dead'", {}, cap);
  }

  StatusOr<WorkItem> Requeue(const std::string& work_id, int64_t now_ms) override {
    if (Status fp = Failpoints::Hit("store.write"); !fp.ok()) return WriteFailed(fp);
    int64_t started = NowMicros();
    ASSIGN_OR_RETURN(
        Result r,
        ctx_.pool.Exec("UPDATE journal SET state = 'pending', attempt = 0, lease_token = '',"
                       " locked_until_ms = 0, next_attempt_at_ms = $2, updated_at_ms = $2,"
                       " expires_at_ms = 0 WHERE work_id = $1 AND state = 'dead' RETURNING " +
                           Columns(),
                       {P(work_id), P(now_ms)}));
    Observe(started);
    if (r.rows() == 1) return ParseRow(r, 0, 0);
    ASSIGN_OR_RETURN(WorkItem found, Get(work_id));
    return FailedPrecondition("work " + work_id + " is " + std::string(WorkStateName(found.state)) +
                              ", not dead");
  }

  using Journal::ByRun;
  StatusOr<std::vector<WorkItem>> ByRun(const std::string& run_id, size_t limit,
                                        const RunPosition& after) override {
    if (run_id.empty()) return InvalidArgument("run_id is empty", "/run_id");
    if (limit == 0) return std::vector<WorkItem>();
    // Made under the run, or taken in later (the incarnation that joined);
    // after a position in (created_at_ms, work_id) order.
    return List(
        "WHERE (run_id = $1 OR work_id IN (SELECT m.work_id FROM journal_run_members m"
        " JOIN journal j ON j.work_id = m.work_id AND j.created_at_ms = m.created_at_ms"
        " WHERE m.run_id = $1)) AND (created_at_ms, work_id) > ($3, $4)"
        " ORDER BY created_at_ms, work_id LIMIT $2",
        {P(run_id), Limit(limit),
         P(after.start() ? std::numeric_limits<int64_t>::min() : after.created_at_ms),
         P(after.work_id)});
  }

  Status AddToRun(const std::string& work_id, const std::string& run_id) override {
    if (run_id.empty()) return InvalidArgument("run_id is empty", "/run_id");
    RETURN_IF_ERROR(CheckText(run_id, "/run_id"));
    ASSIGN_OR_RETURN(
        Result r,
        ctx_.pool.Exec("WITH w AS (SELECT work_id, created_at_ms, run_id FROM journal"
                       " WHERE work_id = $1), joined AS (INSERT INTO journal_run_members"
                       " (run_id, work_id, created_at_ms) SELECT $2, work_id, created_at_ms"
                       " FROM w WHERE run_id <> $2 ON CONFLICT (run_id, work_id) DO UPDATE"
                       " SET created_at_ms = EXCLUDED.created_at_ms)"
                       " SELECT count(*) FROM w",
                       {P(work_id), P(run_id)}));
    if (r.rows() != 1 || r.i64(0, 0) == 0) return NotFound("no such work: " + work_id);
    return Status::Ok();
  }

  StatusOr<std::vector<WorkItem>> DoneWithRef(const std::string& kind, size_t limit) override {
    if (limit == 0) return std::vector<WorkItem>();
    return List(
        "WHERE kind = $1 AND state = 'done' AND external_ref <> ''"
        " ORDER BY updated_at_ms DESC, work_id LIMIT $2",
        {P(kind), Limit(limit)});
  }

  StatusOr<size_t> SweepExpired(int64_t now_ms, size_t limit) override {
    if (limit == 0 || now_ms < 0) return size_t{0};
    // Rows another daemon is sweeping (or claiming anew) are left to it.
    ASSIGN_OR_RETURN(
        Result r,
        // MATERIALIZED: evaluated once, so LIMIT bounds the deletions.
        ctx_.pool.Exec("WITH doomed AS MATERIALIZED (SELECT work_id FROM journal"
                       " WHERE state = 'done' AND expires_at_ms <> 0 AND expires_at_ms <= $1"
                       " ORDER BY expires_at_ms, work_id LIMIT $2 FOR UPDATE SKIP LOCKED),"
                       " gone AS (DELETE FROM journal j USING doomed d WHERE j.work_id = d.work_id"
                       " RETURNING j.work_id), left_runs AS (DELETE FROM journal_run_members m"
                       " USING gone g WHERE m.work_id = g.work_id)"
                       " SELECT count(*) FROM gone",
                       {P(now_ms), Limit(limit)}));
    return static_cast<size_t>(r.rows() == 1 ? r.i64(0, 0) : 0);
  }

 private:
  static Param Limit(size_t n) { return P(static_cast<int64_t>(std::min<size_t>(n, 1'000'000))); }
  static int64_t NowMicros() {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  void Observe(int64_t started) {
    if (ctx_.on_write_micros) ctx_.on_write_micros(NowMicros() - started);
  }

  StatusOr<std::vector<WorkItem>> List(const std::string& tail, const std::vector<Param>& params) {
    ASSIGN_OR_RETURN(Result r,
                     ctx_.pool.Exec("SELECT " + Columns() + " FROM journal " + tail, params));
    std::vector<WorkItem> out;
    for (int i = 0; i < r.rows(); ++i) {
      ASSIGN_OR_RETURN(WorkItem w, ParseRow(r, i, 0));
      out.push_back(Scrubbed(std::move(w)));
    }
    return out;
  }

  // The upsert's request arrays (UpsertSql).
  static StatusOr<std::vector<Param>> UpsertParams(const std::vector<const ClaimRequest*>& reqs,
                                                   bool claim) {
    std::vector<std::vector<std::string>> cols(kReqColumns);
    for (const ClaimRequest* r : reqs) {
      for (const auto& [name, v] :
           {std::pair<std::string_view, const std::string*>{"work_id", &r->work_id},
            {"kind", &r->kind},
            {"run_id", &r->run_id},
            {"request_id", &r->request_id},
            {"trace_id", &r->trace_id},
            {"call_id", &r->call_id}}) {
        RETURN_IF_ERROR(CheckText(*v, "/" + std::string(name)));
      }
      ASSIGN_OR_RETURN(std::string args, store_internal::EncodeJson(r->args));
      ASSIGN_OR_RETURN(std::string identity, store_internal::EncodeJson(r->identity));
      std::string v[kReqColumns] = {r->work_id,
                                    r->kind,
                                    std::to_string(r->max_attempts),
                                    std::move(args),
                                    std::move(identity),
                                    r->run_id,
                                    r->request_id,
                                    r->trace_id,
                                    std::to_string(r->window_ms),
                                    std::to_string(r->now_ms),
                                    std::to_string(claim ? r->now_ms + r->lease_ms : 0),
                                    claim ? RandomHex(kLeaseTokenBytes) : std::string(),
                                    claim ? "running" : "pending",
                                    claim ? "1" : "0",
                                    std::to_string(claim ? 0 : r->now_ms),
                                    r->call_id};
      for (int i = 0; i < kReqColumns; ++i) cols[i].push_back(std::move(v[i]));
    }
    std::vector<Param> out;
    for (const auto& c : cols) out.push_back(ArrayLiteral(c));
    return out;
  }

  // One statement that may write: autocommit, or with the failpoint
  // "store.write" set, in a transaction rolled back as a failed commit
  // would leave it: then *commit is the failpoint's error when the
  // statement wrote (a row tagged true), and the rows tell what it decided.
  StatusOr<Result> ExecWrite(const std::string& sql, const std::vector<Param>& params,
                             Status* commit) {
    *commit = Status::Ok();
    Status fp = Failpoints::Hit("store.write");
    int64_t started = NowMicros();
    if (fp.ok()) {
      StatusOr<Result> r = ctx_.pool.Exec(sql, params);
      Observe(started);
      return r;
    }
    ASSIGN_OR_RETURN(Pool::Lease lease, ctx_.pool.Acquire());
    RETURN_IF_ERROR(lease->ExecScript("BEGIN"));
    StatusOr<Result> r = lease->Exec(sql, params);
    (void)lease->ExecScript("ROLLBACK");
    if (!r.ok()) return r;
    for (int i = 0; i < r->rows(); ++i) {
      if (r->boolean(i, 0)) *commit = WriteFailed(fp);
    }
    return r;
  }

  // Claims of distinct work_ids, with valid requests: one statement for
  // all; a claim that found its record changing, or that must turn a
  // crashed last attempt dead, goes on alone.
  std::vector<StatusOr<ClaimResult>> ClaimDistinct(const std::vector<const ClaimRequest*>& reqs) {
    std::vector<StatusOr<ClaimResult>> out(reqs.size(), Internal("claim not decided"));
    std::vector<size_t> open(reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i) open[i] = i;
    for (int round = 0; round < kClaimRounds && !open.empty(); ++round) {
      std::vector<const ClaimRequest*> batch;
      for (size_t i : open) batch.push_back(reqs[i]);
      StatusOr<std::vector<Param>> params = UpsertParams(batch, /*claim=*/true);
      Status commit;
      StatusOr<Result> r = params.ok() ? ExecWrite(ClaimSql(), *params, &commit) : params.status();
      if (!r.ok()) {
        if (r.status().code() == Code::kAborted) continue;  // deadlock, serialization: again
        for (size_t i : open) out[i] = r.status();
        return out;
      }
      std::map<std::string_view, std::pair<bool, StatusOr<WorkItem>>> rows;
      for (int k = 0; k < r->rows(); ++k) {
        StatusOr<WorkItem> w = ParseRow(*r, k, 1);
        std::string id = r->str(k, 1);
        auto it = std::find_if(batch.begin(), batch.end(),
                               [&](const ClaimRequest* q) { return q->work_id == id; });
        if (it == batch.end()) continue;
        rows.insert_or_assign((*it)->work_id, std::make_pair(r->boolean(k, 0), std::move(w)));
      }
      std::vector<size_t> again;
      for (size_t i : open) {
        const ClaimRequest& req = *reqs[i];
        auto it = rows.find(req.work_id);
        if (it == rows.end()) {  // inserted by another daemon after the read: read again
          again.push_back(i);
          continue;
        }
        auto& [claimed, row] = it->second;
        if (!row.ok()) {
          out[i] = row.status();
          continue;
        }
        if (claimed) {
          if (commit.ok()) {
            out[i] = ClaimResult{ClaimOutcome::kClaimed, std::move(*row)};
          } else {
            out[i] = commit;  // the write failed: nothing of it is stored
          }
          continue;
        }
        if (std::optional<ClaimOutcome> o = ReadOnlyOutcome(*row, req.now_ms)) {
          out[i] = ClaimResult{*o, Scrubbed(std::move(*row))};
          continue;
        }
        if (row->state == WorkState::kRunning && row->attempt >= row->max_attempts) {
          StatusOr<std::optional<WorkItem>> dead = MarkCrashedDead(*row, req.now_ms);
          if (!dead.ok()) {
            out[i] = dead.status();
          } else if (*dead) {
            out[i] = ClaimResult{.outcome = ClaimOutcome::kDead,
                                 .item = Scrubbed(std::move(**dead)),
                                 .buried = true};
          } else {
            again.push_back(i);
          }
          continue;
        }
        again.push_back(i);  // changed since the statement's read
      }
      open.swap(again);
    }
    for (size_t i : open) {
      out[i] =
          Unavailable("work " + reqs[i]->work_id + " kept changing; try the claim again", true);
    }
    return out;
  }

  // The holder of `seen` crashed on its last attempt: dead, with its
  // outbox event, unless the record changed since (then nullopt).
  StatusOr<std::optional<WorkItem>> MarkCrashedDead(const WorkItem& seen, int64_t now_ms) {
    WorkItem next = seen;
    BuryExpired(next, now_ms);
    bool changed = false;
    int64_t started = NowMicros();
    Status s = ctx_.pool.Tx([&](Conn& c) -> Status {
      ASSIGN_OR_RETURN(
          Result r,
          c.Exec("UPDATE journal SET state = 'dead', last_error = $5,"
                 " locked_until_ms = 0, expires_at_ms = 0, updated_at_ms = $2"
                 " WHERE work_id = $1 AND state = 'running' AND attempt = $3 AND lease_token = $4"
                 " AND locked_until_ms <= $2",
                 {P(seen.work_id), P(now_ms), P(seen.attempt), P(seen.lease_token),
                  P(next.last_error)}));
      changed = r.affected() != 1;
      if (changed) return Status::Ok();
      RETURN_IF_ERROR(StageEvent(c, seen, next));
      if (Status fp = Failpoints::Hit("store.write"); !fp.ok()) return WriteFailed(fp);
      return Status::Ok();
    });
    Observe(started);
    RETURN_IF_ERROR(s);
    if (changed) return std::optional<WorkItem>();
    return std::optional<WorkItem>(std::move(next));
  }

  std::vector<StatusOr<JournalOpResult>> RunOps(std::span<const JournalOp> ops) {
    std::vector<StatusOr<JournalOpResult>> results(ops.size(), Internal("op not decided"));
    std::vector<size_t> valid;
    bool claims_only = true;
    std::set<std::string_view> ids;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (Status v = ValidateOp(ops[i]); !v.ok()) {
        results[i] = v;
        continue;
      }
      valid.push_back(i);
      claims_only = claims_only && ops[i].type == JournalOp::Type::kClaim &&
                    ids.insert(ops[i].claim.work_id).second;
    }
    if (valid.empty()) return results;
    if (claims_only) {
      // The claim lane's usual round: one upsert for every claim.
      std::vector<const ClaimRequest*> reqs;
      for (size_t i : valid) reqs.push_back(&ops[i].claim);
      std::vector<StatusOr<ClaimResult>> claimed = ClaimDistinct(reqs);
      for (size_t k = 0; k < valid.size(); ++k) {
        if (!claimed[k].ok()) {
          results[valid[k]] = claimed[k].status();
        } else {
          results[valid[k]] = OpResultOf(std::move(*claimed[k]));
        }
      }
      return results;
    }
    RunLocked(ops, valid, results);
    return results;
  }

  // Every op in one transaction, on the rows locked in work_id order.
  void RunLocked(std::span<const JournalOp> ops, const std::vector<size_t>& valid,
                 std::vector<StatusOr<JournalOpResult>>& results) {
    std::vector<std::string> ids;
    for (size_t i : valid) ids.push_back(OpWorkId(ops[i]));
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    const std::string array = ArrayLiteral(ids);

    std::vector<size_t> writers;
    bool decided = false;
    int64_t started = NowMicros();
    Status s = ctx_.pool.Tx([&](Conn& c) -> Status {
      writers.clear();
      decided = false;
      // Locks every record of the batch in work_id order, creating a
      // placeholder (max_attempts 0, never committed) for the absent ones, so
      // that the locks are taken in the order of every other multi-row
      // statement here (no deadlock with a claim batch creating the same
      // work), and another daemon creating the same work waits for us.
      ASSIGN_OR_RETURN(
          Result locked,
          c.Exec("INSERT INTO journal AS j (" + Columns() +
                     ") SELECT id, '', 'pending', 0, 0, '', 0, '{}', '{}', 'null', '', '', 0, 0,"
                     " 0, 0, '', '', '', 0, '' FROM unnest($1::text[]) AS id ORDER BY id"
                     " ON CONFLICT (work_id) DO UPDATE SET attempt = j.attempt RETURNING " +
                     Columns("j."),
                 {P(array)}));
      std::map<std::string, std::optional<WorkItem>> stored;  // as found
      std::vector<std::string> placeholders;
      std::map<std::string, StatusOr<WorkItem>> unreadable;
      for (int k = 0; k < locked.rows(); ++k) {
        if (locked.i64(k, 4) == 0) {  // max_attempts: a placeholder, the work is new
          placeholders.push_back(locked.str(k, 0));
          continue;
        }
        StatusOr<WorkItem> w = ParseRow(locked, k, 0);
        if (w.ok()) {
          stored[w->work_id] = std::move(*w);
        } else {
          unreadable.insert_or_assign(locked.str(k, 0), w.status());
        }
      }
      std::map<std::string, WorkItem> staged;
      for (size_t i : valid) {
        const JournalOp& op = ops[i];
        const std::string& work_id = OpWorkId(op);
        if (auto bad = unreadable.find(work_id); bad != unreadable.end()) {
          results[i] = bad->second.status();
          continue;
        }
        std::optional<WorkItem> current;
        if (auto it = staged.find(work_id); it != staged.end()) {
          current = it->second;
        } else if (auto st = stored.find(work_id); st != stored.end()) {
          current = st->second;
        }
        JournalOpResult r;
        if (op.type == JournalOp::Type::kClaim) {
          if (std::optional<ClaimOutcome> o = ReadOnlyOutcome(current, op.claim.now_ms)) {
            results[i] = JournalOpResult{.outcome = *o, .item = Scrubbed(std::move(*current))};
            continue;
          }
          r = OpResultOf(ClaimTransition(current, op.claim));
        } else {
          bool writes = false;
          StatusOr<JournalOpResult> settled = CompleteOrFail(current, op, &writes);
          if (!settled.ok() || !writes) {
            results[i] = std::move(settled);
            continue;
          }
          r = std::move(settled).value();
        }
        staged.insert_or_assign(work_id, r.item);
        results[i] = std::move(r);
        writers.push_back(i);
      }
      decided = true;
      std::vector<std::string> unused;  // placeholders no op wrote
      for (const std::string& id : placeholders) {
        if (!staged.count(id)) unused.push_back(id);
      }
      if (!unused.empty()) {
        RETURN_IF_ERROR(c.Exec("DELETE FROM journal WHERE work_id = ANY($1::text[])"
                               " AND max_attempts = 0",
                               {P(ArrayLiteral(unused))})
                            .status());
      }
      if (staged.empty()) return Status::Ok();
      std::vector<const WorkItem*> records;
      for (const auto& [id, w] : staged) records.push_back(&w);
      ASSIGN_OR_RETURN(std::vector<Param> params, RecordArrays(records));
      std::string set;
      for (int k = 1; k < kNumColumns; ++k) {
        if (k > 1) set += ", ";
        set += std::string(kColumnNames[k]) + " = v." + kColumnNames[k];
      }
      ASSIGN_OR_RETURN(Result u, c.Exec("UPDATE journal j SET " + set + " FROM " + UnnestRecords() +
                                            " WHERE j.work_id = v.work_id",
                                        params));
      if (u.affected() != static_cast<int64_t>(records.size())) {
        return Internal("journal: a locked record vanished during a batch");
      }
      for (const auto& [id, w] : staged) {
        std::optional<WorkItem> before;
        if (auto st = stored.find(id); st != stored.end()) before = st->second;
        RETURN_IF_ERROR(StageEvent(c, before, w));
      }
      if (Status fp = Failpoints::Hit("store.write"); !fp.ok()) return WriteFailed(fp);
      return Status::Ok();
    });
    Observe(started);
    if (!s.ok()) {
      if (!decided) {
        for (size_t i : valid) results[i] = s;
      } else {
        for (size_t i : writers) results[i] = s;
      }
      return;
    }
    for (size_t i : writers) {
      if (results[i]->outcome != ClaimOutcome::kClaimed) {
        results[i]->item = Scrubbed(std::move(results[i]->item));
      }
    }
  }

  PgContext& ctx_;
};

}  // namespace

std::unique_ptr<Journal> MakePgJournal(PgContext& ctx) { return std::make_unique<PgJournal>(ctx); }

const std::string& JournalClaimSql() { return ClaimSql(); }

}  // namespace idem::pg
