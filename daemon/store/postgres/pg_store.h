// The PostgreSQL engine (store.engine: postgres): every store interface of
// store.h on one database, shared by any number of idem daemons.
//
// Each interface lives in its own file (pg_<name>.cc) and adds its tables to
// the schema through its kSchema* fragment; Migrations() (pg_migrate.cc)
// applies them, versioned, under an advisory lock.
//
// Shared records written inside another store's transaction:
//   - StageOutboxEvent: an outbox event in the same transaction as the state
//     change it reports (decisions, plans, journal);
//   - AppendAuditTx: an audit event in the same transaction (plans).
//
// Thread-safety: as store.h; a Pool connection is held only for the length
// of one call.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/store/postgres/pg_client.h"
#include "daemon/store/store.h"

namespace idem::pg {

// What every PostgreSQL store gets.
struct PgContext {
  Pool& pool;
  std::string instance_id;  // this process ("inst_" + 16 hex), for records it owns
  std::string store_id;     // the schema's id (kStoreIdKey), shared by every daemon on it
  std::function<void(int64_t micros)> on_write_micros;
};

// Reports a write's duration to ctx.on_write_micros (when set) when it
// goes out of scope.
class WriteTimer {
 public:
  explicit WriteTimer(PgContext& ctx) : ctx_(ctx), start_(std::chrono::steady_clock::now()) {}
  ~WriteTimer() {
    if (!ctx_.on_write_micros) return;
    ctx_.on_write_micros(std::chrono::duration_cast<std::chrono::microseconds>(
                             std::chrono::steady_clock::now() - start_)
                             .count());
  }
  WriteTimer(const WriteTimer&) = delete;
  WriteTimer& operator=(const WriteTimer&) = delete;

 private:
  PgContext& ctx_;
  std::chrono::steady_clock::time_point start_;
};

// --- schema fragments (each defined in its store's file), in Migration 1
extern const std::string_view kSchemaMeta;
extern const std::string_view kSchemaDecisions;
extern const std::string_view kSchemaIdemKeys;
extern const std::string_view kSchemaJournal;
extern const std::string_view kSchemaPlans;
extern const std::string_view kSchemaAudit;
extern const std::string_view kSchemaLeases;
extern const std::string_view kSchemaEscalations;
extern const std::string_view kSchemaOutbox;
extern const std::string_view kSchemaTraces;
// --- later migrations
extern const std::string_view kSchemaDecisionTraces;  // 2
extern const std::string_view kSchemaRunMembers;      // 3
extern const std::string_view kSchemaJournalCallId;   // 4
extern const std::string_view kSchemaPlansFinished;   // 5

struct Migration {
  int version;
  std::string name;
  std::string sql;
};
// Every migration in version order. A released migration is never edited
// and never destructive (no DROP of data); changes come as the next one.
const std::vector<Migration>& Migrations();
// Applies the migrations the database lacks, each in its own transaction,
// under pg_advisory_lock (so daemons starting together apply them once).
// Returns the versions applied now (empty: up to date). FailedPrecondition
// when the database has a version newer than this binary knows.
StatusOr<std::vector<int>> Migrate(Pool& pool);

// --- the stores, one factory per interface (each in its pg_<name>.cc)
std::unique_ptr<MetaStore> MakePgMetaStore(PgContext& ctx);
std::unique_ptr<DecisionStore> MakePgDecisionStore(PgContext& ctx);
std::unique_ptr<IdemKeyStore> MakePgIdemKeyStore(PgContext& ctx);
std::unique_ptr<Journal> MakePgJournal(PgContext& ctx);
std::unique_ptr<PlanStore> MakePgPlanStore(PgContext& ctx);
std::unique_ptr<AuditLog> MakePgAuditLog(PgContext& ctx);
std::unique_ptr<LeaseStore> MakePgLeaseStore(PgContext& ctx);
std::unique_ptr<EscalationStore> MakePgEscalationStore(PgContext& ctx);
std::unique_ptr<OutboxStore> MakePgOutboxStore(PgContext& ctx);
// The meta key of the highest outbox seq retention deleted, as decimal text
// (OutboxStore::SweptThrough; store copy writes it too).
inline constexpr std::string_view kPgOutboxSweptKey = "outbox.swept_through";
std::unique_ptr<TraceIndex> MakePgTraceIndex(PgContext& ctx);

// The journal's claim statement (INSERT ... ON CONFLICT ... RETURNING over
// unnest of its 15 request arrays, pg_journal.cc), for bench_pg_claims to
// run the very same statement through pgbench.
const std::string& JournalClaimSql();

// --- records other stores write inside their own transaction
// Stages an outbox event (store.h, OutboxEvent) with the caller's change;
// it gets its seq only once committed (pg_outbox_store.cc).
Status StageOutboxEvent(Conn& c, const std::string& type, const std::string& key, int64_t at_ms,
                        const Json& data);
// The same with `data` already a JSON object's text.
Status StageOutboxEventText(Conn& c, const std::string& type, const std::string& key, int64_t at_ms,
                            const std::string& data);
// Appends to the one linear audit chain in the caller's transaction;
// returns the event's seq (pg_audit_log.cc).
StatusOr<uint64_t> AppendAuditTx(Conn& c, AuditEvent event);

}  // namespace idem::pg
