// PgImporter (store_copy.h): records of another store written into an empty
// PostgreSQL schema as they are, in one transaction.
//
// Each record goes to the table its PostgreSQL store reads (the schemas in
// pg_<name>.cc), in the form that store writes: JSON text through the same
// codecs, so a store reading it back cannot tell it from one it wrote. No
// store method is called: those would stage outbox events, append audit
// events, give new seqs and new times. The importer holds one connection
// and one transaction from Open to Commit; another daemon on the schema
// sees nothing until the commit, then everything.
#include <algorithm>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "daemon/store/postgres/pg_store.h"
#include "daemon/store/record_codec.h"
#include "daemon/store/store_copy.h"

namespace idem {
namespace {

using pg::Conn;
using pg::P;
using pg::Param;
using pg::Pool;

// Every table that holds records; a copy goes only into a schema where all
// are empty. (The one-row heads, audit_head and outbox_head, are not records.)
constexpr std::string_view kRecordTables[] = {"decisions",   "decision_keys",
                                              "idem_keys",   "journal",
                                              "plans",       "audit",
                                              "escalations", "outbox",
                                              "outbox_dead", "outbox_cursors",
                                              "meta",        "traces",
                                              "leases",      "journal_run_members"};

class PgImporterImpl final : public PgImporter {
 public:
  PgImporterImpl(std::unique_ptr<Pool> pool, Pool::Lease lease)
      : pool_(std::move(pool)), lease_(std::move(lease)) {}
  ~PgImporterImpl() override {
    if (open_ && c().healthy()) (void)c().ExecScript("ROLLBACK");
  }

  Status Begin() {
    RETURN_IF_ERROR(c().ExecScript("BEGIN"));
    open_ = true;
    // No other writer while the copy runs: a daemon started meanwhile waits
    // for the commit instead of interleaving its records with the copy's.
    for (std::string_view t : kRecordTables) {
      RETURN_IF_ERROR(c().ExecScript("LOCK TABLE " + pg::QuoteIdent(t) + " IN EXCLUSIVE MODE"));
    }
    for (std::string_view t : kRecordTables) {
      // A daemon that opened the schema gave it an id (kStoreIdKey); the
      // copy replaces it with the source's, so it does not count.
      const std::string except = t == "meta" ? " WHERE key <> $1" : "";
      ASSIGN_OR_RETURN(
          pg::Result r,
          c().Exec("SELECT EXISTS (SELECT 1 FROM " + pg::QuoteIdent(t) + except + ")",
                   t == "meta" ? std::vector<Param>{P(kStoreIdKey)} : std::vector<Param>{}));
      if (r.rows() == 1 && r.boolean(0, 0)) {
        return FailedPrecondition("the PostgreSQL schema '" + pool_->options().schema +
                                  "' already holds records (table " + std::string(t) +
                                  "); idem store copy writes only into an empty schema: choose "
                                  "another --schema, or drop this one if its data is not needed");
      }
    }
    return Status::Ok();
  }

  Status OnDecision(const Decision& d) override {
    ASSIGN_OR_RETURN(store_internal::StoredDecision body, store_internal::EncodeDecision(d));
    RETURN_IF_ERROR(
        Exec("INSERT INTO decisions (decision_id, decision_key, step, status,"
             " created_at_ms, expires_at_ms, body, trace) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
             {P(d.decision_id), P(d.decision_key), P(d.step), P(d.status), P(d.created_at_ms),
              P(d.expires_at_ms), P(body.hot), body.trace},
             "decision " + d.decision_id));
    ++counts_.decisions;
    return Status::Ok();
  }

  Status OnCachedDecision(const std::string& decision_key,
                          const std::string& decision_id) override {
    // The key row carries its decision's expiry (pg_decision_store.cc).
    ASSIGN_OR_RETURN(pg::Result r,
                     c().Exec("INSERT INTO decision_keys (decision_key, decision_id, expires_at_ms)"
                              " SELECT $1, decision_id, expires_at_ms FROM decisions"
                              " WHERE decision_id = $2",
                              {P(decision_key), P(decision_id)}));
    if (r.affected() != 1) {
      return Internal("the cached decision " + decision_id +
                      " of a decision key is not among the decisions (the source store is "
                      "inconsistent)");
    }
    ++counts_.cached_decision_keys;
    return Status::Ok();
  }

  Status OnIdemRecord(const IdemRecord& in) override {
    IdemRecord r = in;
    if (r.state == IdemRecord::State::kInProgress) {
      // The source's daemon is stopped: what it would do to its own orphans
      // at its next start (ReleaseOwnInProgress).
      r.state = IdemRecord::State::kReleased;
      r.ran = true;
      r.lease_until_ms = 0;
      ++counts_.idem_keys_released;
    }
    RETURN_IF_ERROR(
        Exec("INSERT INTO idem_keys (scope, key, fingerprint, state, ran, owner, response_status,"
             " response_body, response_content_type, request_id, created_at_ms, expires_at_ms,"
             " lease_until_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
             {P(r.scope), P(r.key), P(r.fingerprint), P(store_internal::IdemStateName(r.state)),
              P(r.ran), P(r.owner), P(r.response_status), pg::Bytea(r.response_body),
              P(r.response_content_type), P(r.request_id), P(r.created_at_ms), P(r.expires_at_ms),
              P(r.lease_until_ms)},
             "idempotency key"));
    ++counts_.idem_keys;
    return Status::Ok();
  }

  Status OnWorkItem(const WorkItem& w) override {
    ASSIGN_OR_RETURN(std::string args, store_internal::EncodeJson(w.args));
    ASSIGN_OR_RETURN(std::string identity, store_internal::EncodeJson(w.identity));
    ASSIGN_OR_RETURN(std::string result, store_internal::EncodeJson(w.result));
    // A running item keeps its lease token: it fences the stopped holder's
    // writes and is never handed out, so the item is taken over (attempt + 1)
    // once locked_until passes, as after a crash.
    RETURN_IF_ERROR(
        Exec("INSERT INTO journal (work_id, kind, state, attempt, max_attempts, lease_token,"
             " locked_until_ms, args, identity, result, external_ref, last_error,"
             " next_attempt_at_ms, created_at_ms, updated_at_ms, expires_at_ms, run_id, request_id,"
             " trace_id, window_ms, call_id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11,"
             " $12, $13, $14, $15, $16, $17, $18, $19, $20, $21)",
             {P(w.work_id),
              P(w.kind),
              P(WorkStateName(w.state)),
              P(w.attempt),
              P(w.max_attempts),
              P(w.lease_token),
              P(w.locked_until_ms),
              P(args),
              P(identity),
              P(result),
              P(w.external_ref),
              P(w.last_error),
              P(w.next_attempt_at_ms),
              P(w.created_at_ms),
              P(w.updated_at_ms),
              P(w.expires_at_ms),
              P(w.run_id),
              P(w.request_id),
              P(w.trace_id),
              P(w.window_ms),
              P(w.call_id)},
             "work " + w.work_id));
    for (const std::string& run : w.other_runs) {
      RETURN_IF_ERROR(
          Exec("INSERT INTO journal_run_members (run_id, work_id, created_at_ms)"
               " VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
               {P(run), P(w.work_id), P(w.created_at_ms)}, "work " + w.work_id));
    }
    ++counts_.work_items;
    return Status::Ok();
  }

  Status OnPlan(const Plan& p) override {
    ASSIGN_OR_RETURN(std::string text, store_internal::EncodeJson(p.ToJson()));
    RETURN_IF_ERROR(
        Exec("INSERT INTO plans (plan_id, state, created_at_ms, updated_at_ms, plan)"
             " VALUES ($1, $2, $3, $4, $5)",
             {P(p.plan_id), P(p.state), P(p.created_at_ms), P(p.updated_at_ms), P(text)},
             "plan " + p.plan_id));
    ++counts_.plans;
    return Status::Ok();
  }

  Status OnAuditEvent(const AuditEvent& e) override {
    // seq, prev_hash and hash as stored: the chain is not recomputed.
    ASSIGN_OR_RETURN(std::string text,
                     store_internal::EncodeJson(store_internal::AuditEventToJson(e)));
    RETURN_IF_ERROR(Exec("INSERT INTO audit (seq, event) VALUES ($1, $2)", {P(e.seq), P(text)},
                         "audit event " + std::to_string(e.seq)));
    ++counts_.audit_events;
    return Status::Ok();
  }

  Status OnAuditHead(uint64_t seq, const std::string& hash) override {
    head_ = std::make_pair(seq, hash);
    return Status::Ok();
  }

  Status OnEscalation(const Escalation& e) override {
    ASSIGN_OR_RETURN(std::string text, store_internal::EncodeJson(e.ToJson()));
    RETURN_IF_ERROR(
        Exec("INSERT INTO escalations (escalation_id, decision_key, state,"
             " created_at_ms, resolved_at_ms, escalation)"
             " VALUES ($1, $2, $3, $4, $5, $6)",
             {P(e.escalation_id), P(e.decision_key), P(e.state), P(e.created_at_ms),
              P(e.resolved_at_ms), P(text)},
             "escalation " + e.escalation_id));
    ++counts_.escalations;
    return Status::Ok();
  }

  Status OnOutboxEvent(const OutboxEvent& e) override {
    // With its seq: already numbered, so the sequencer leaves it alone.
    ASSIGN_OR_RETURN(std::string data, store_internal::EncodeJson(e.data));
    RETURN_IF_ERROR(
        Exec("INSERT INTO outbox (seq, type, key, at_ms, data)"
             " VALUES ($1, $2, $3, $4, $5::jsonb)",
             {P(e.seq), P(e.type), P(e.key), P(e.at_ms), P(data)},
             "outbox event " + std::to_string(e.seq)));
    ++counts_.outbox_events;
    return Status::Ok();
  }

  Status OnOutboxCursor(const std::string& subscriber, uint64_t seq) override {
    RETURN_IF_ERROR(Exec("INSERT INTO outbox_cursors (subscriber, seq) VALUES ($1, $2)",
                         {P(subscriber), P(seq)}, "outbox cursor of " + subscriber));
    ++counts_.outbox_cursors;
    return Status::Ok();
  }

  Status OnOutboxDeadLetter(const OutboxDeadLetter& dl) override {
    ASSIGN_OR_RETURN(std::string event, store_internal::EncodeJson(dl.event.ToJson()));
    RETURN_IF_ERROR(
        Exec("INSERT INTO outbox_dead (subscriber, seq, event, attempts, last_error,"
             " state, dead_at_ms) VALUES ($1, $2, $3::jsonb, $4, $5, $6, $7)",
             {P(dl.subscriber), P(dl.event.seq), P(event), P(dl.attempts), P(dl.last_error),
              P(dl.state), P(dl.dead_at_ms)},
             "outbox dead letter"));
    ++counts_.outbox_dead_letters;
    return Status::Ok();
  }

  Status OnOutboxLastSeq(uint64_t seq) override {
    last_seq_ = std::max(last_seq_, seq);
    return Status::Ok();
  }

  Status OnOutboxSweptThrough(uint64_t seq) override {
    return Exec("INSERT INTO meta (key, value) VALUES ($1, $2)",
                {P(std::string(pg::kPgOutboxSweptKey)), P(std::to_string(seq))},
                "outbox retention mark");
  }

  Status OnMeta(const std::string& key, const std::string& value) override {
    RETURN_IF_ERROR(
        Exec("INSERT INTO meta (key, value) VALUES ($1, $2)"
             " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
             {P(key), P(value)}, "meta " + key));
    ++counts_.meta;
    return Status::Ok();
  }

  Status OnTrace(const TraceEntry& e) override {
    const std::string& detail = e.detail;
    // In the order visited: ids keep the entries of one millisecond in order.
    RETURN_IF_ERROR(
        Exec("INSERT INTO traces (trace_id, at_ms, type, ref, detail)"
             " VALUES ($1, $2, $3, $4, $5::jsonb)",
             {P(e.trace_id), P(e.at_ms), P(e.type), P(e.ref), P(detail)}, "trace entry"));
    ++counts_.traces;
    return Status::Ok();
  }

  Status OnLease(const NamedLease&) override {
    ++counts_.leases_skipped;
    return Status::Ok();
  }

  StatusOr<CopyCounts> Commit() override {
    if (!open_) return FailedPrecondition("the import is not open");
    if (head_) {
      RETURN_IF_ERROR(Exec("UPDATE audit_head SET seq = $1, hash = $2 WHERE one",
                           {P(head_->first), P(head_->second)}, "audit head"));
    } else if (counts_.audit_events > 0) {
      // Events without a head (it was removed): copied as found, so Check
      // reports it here too.
      RETURN_IF_ERROR(Exec("DELETE FROM audit_head", {}, "audit head"));
    }
    // New events continue after every seq the source gave.
    RETURN_IF_ERROR(Exec("UPDATE outbox_head SET last_seq = greatest(last_seq, $1)", {P(last_seq_)},
                         "outbox sequence"));
    RETURN_IF_ERROR(c().ExecScript("COMMIT"));
    open_ = false;
    return counts_;
  }

 private:
  Conn& c() { return *lease_; }

  Status Exec(std::string_view sql, const std::vector<Param>& params, const std::string& what) {
    StatusOr<pg::Result> r = c().Exec(sql, params);
    if (!r.ok()) return r.status().Annotate("copying " + what);
    return Status::Ok();
  }

  std::unique_ptr<Pool> pool_;  // first: destroyed last
  Pool::Lease lease_;
  bool open_ = false;
  CopyCounts counts_;
  std::optional<std::pair<uint64_t, std::string>> head_;
  uint64_t last_seq_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<PgImporter>> PgImporter::Open(const PgStoreOptions& options) {
  pg::PoolOptions po;
  po.conninfo = options.conninfo;
  po.schema = options.schema;
  po.size = 1;
  // A copy's statements are small, but its COMMIT writes everything.
  po.statement_timeout_ms = std::max<int64_t>(options.statement_timeout_ms, 600'000);
  po.acquire_timeout_ms = options.acquire_timeout_ms;
  ASSIGN_OR_RETURN(std::unique_ptr<Pool> pool, Pool::Open(std::move(po)));
  RETURN_IF_ERROR(pg::Migrate(*pool).status());
  ASSIGN_OR_RETURN(Pool::Lease lease, pool->Acquire());
  auto importer = std::make_unique<PgImporterImpl>(std::move(pool), std::move(lease));
  RETURN_IF_ERROR(importer->Begin());
  return std::unique_ptr<PgImporter>(std::move(importer));
}

}  // namespace idem
