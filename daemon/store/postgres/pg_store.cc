// OpenPostgresStore: one pool shared by every PostgreSQL domain store.
#include "daemon/store/postgres/pg_store.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "daemon/core/crypto.h"
#include "daemon/store/store.h"

namespace idem {
namespace {

class PgStore final : public Store {
 public:
  PgStore(std::unique_ptr<pg::Pool> pool, std::string instance_id, std::string store_id,
          std::function<void(int64_t)> on_write)
      : pool_(std::move(pool)),
        ctx_{*pool_, std::move(instance_id), std::move(store_id), std::move(on_write)} {
    meta_ = pg::MakePgMetaStore(ctx_);
    decisions_ = pg::MakePgDecisionStore(ctx_);
    idem_keys_ = pg::MakePgIdemKeyStore(ctx_);
    journal_ = pg::MakePgJournal(ctx_);
    audit_ = pg::MakePgAuditLog(ctx_);
    plans_ = pg::MakePgPlanStore(ctx_);
    leases_ = pg::MakePgLeaseStore(ctx_);
    escalations_ = pg::MakePgEscalationStore(ctx_);
    outbox_ = pg::MakePgOutboxStore(ctx_);
    traces_ = pg::MakePgTraceIndex(ctx_);
  }
  ~PgStore() override {
    traces_.reset();  // may flush through the pool
  }

  DecisionStore& decisions() override { return *decisions_; }
  IdemKeyStore& idem_keys() override { return *idem_keys_; }
  Journal& journal() override { return *journal_; }
  PlanStore& plans() override { return *plans_; }
  AuditLog& audit() override { return *audit_; }
  LeaseStore& leases() override { return *leases_; }
  MetaStore& meta() override { return *meta_; }
  EscalationStore& escalations() override { return *escalations_; }
  OutboxStore& outbox() override { return *outbox_; }
  TraceIndex& traces() override { return *traces_; }
  bool shared() const override { return true; }
  Status WriteHealth() const override {
    // Cheap: a round trip only when asked (readyz), not per write.
    StatusOr<pg::Result> r = pool_->Exec("SELECT 1");
    return r.ok() ? Status::Ok() : r.status();
  }
  StatusOr<int64_t> ClockMillis() override { return pool_->ServerNowMillis(); }
  StatusOr<std::vector<SizePart>> DiskUsage() override {
    // The schema's tables (the connections' search_path), each with its
    // indexes and TOAST.
    ASSIGN_OR_RETURN(pg::Result r,
                     pool_->Exec("SELECT c.relname, pg_total_relation_size(c.oid)"
                                 " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                                 " WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')"
                                 " ORDER BY c.relname"));
    std::vector<SizePart> parts;
    for (int i = 0; i < r.rows(); ++i) {
      parts.push_back({r.str(i, 0), static_cast<uint64_t>(std::max<int64_t>(0, r.i64(i, 1)))});
    }
    return parts;
  }

 private:
  std::unique_ptr<pg::Pool> pool_;  // first: destroyed last
  pg::PgContext ctx_;
  std::unique_ptr<MetaStore> meta_;
  std::unique_ptr<DecisionStore> decisions_;
  std::unique_ptr<IdemKeyStore> idem_keys_;
  std::unique_ptr<Journal> journal_;
  std::unique_ptr<AuditLog> audit_;
  std::unique_ptr<PlanStore> plans_;
  std::unique_ptr<LeaseStore> leases_;
  std::unique_ptr<EscalationStore> escalations_;
  std::unique_ptr<OutboxStore> outbox_;
  std::unique_ptr<TraceIndex> traces_;
};

// The schema's id, made by the first daemon to open it. Two statements: the
// insert waits for a concurrent one to commit, and the select after it
// then sees whichever row stands.
StatusOr<std::string> StoreId(pg::Pool& pool) {
  RETURN_IF_ERROR(pool.Exec("INSERT INTO meta (key, value) VALUES ($1, $2)"
                            " ON CONFLICT (key) DO NOTHING",
                            {pg::P(kStoreIdKey), pg::P(NewStoreId())})
                      .status());
  ASSIGN_OR_RETURN(pg::Result r,
                   pool.Exec("SELECT value FROM meta WHERE key = $1", {pg::P(kStoreIdKey)}));
  if (r.rows() != 1) return Internal("the store's id is missing from meta");
  return r.str(0, 0);
}

}  // namespace

StatusOr<std::unique_ptr<Store>> OpenPostgresStore(const PgStoreOptions& options) {
  pg::PoolOptions po;
  po.conninfo = options.conninfo;
  po.schema = options.schema;
  po.size = options.pool_size;
  po.statement_timeout_ms = options.statement_timeout_ms;
  po.acquire_timeout_ms = options.acquire_timeout_ms;
  ASSIGN_OR_RETURN(std::unique_ptr<pg::Pool> pool, pg::Pool::Open(std::move(po)));
  if (options.migrate) RETURN_IF_ERROR(pg::Migrate(*pool).status());
  // Each process is its own owner: records of a daemon that died are taken
  // over by the others when their leases expire.
  std::string instance_id = "inst_" + RandomHex(8);
  ASSIGN_OR_RETURN(std::string store_id, StoreId(*pool));
  return std::unique_ptr<Store>(new PgStore(std::move(pool), std::move(instance_id),
                                            std::move(store_id), options.on_write_micros));
}

StatusOr<std::vector<int>> MigratePostgres(const PgStoreOptions& options) {
  pg::PoolOptions po;
  po.conninfo = options.conninfo;
  po.schema = options.schema;
  po.size = 1;
  po.statement_timeout_ms = options.statement_timeout_ms;
  po.acquire_timeout_ms = options.acquire_timeout_ms;
  ASSIGN_OR_RETURN(std::unique_ptr<pg::Pool> pool, pg::Pool::Open(std::move(po)));
  return pg::Migrate(*pool);
}

}  // namespace idem
