// OpenRocksStore: one RocksDatabase shared by every domain store.
#include <memory>
#include <utility>

#include "daemon/core/crypto.h"
#include "daemon/store/rocksdb/rocksdb_audit_log.h"
#include "daemon/store/rocksdb/rocksdb_database.h"
#include "daemon/store/rocksdb/rocksdb_decision_store.h"
#include "daemon/store/rocksdb/rocksdb_escalation_store.h"
#include "daemon/store/rocksdb/rocksdb_idem_key_store.h"
#include "daemon/store/rocksdb/rocksdb_journal.h"
#include "daemon/store/rocksdb/rocksdb_lease_store.h"
#include "daemon/store/rocksdb/rocksdb_outbox_store.h"
#include "daemon/store/rocksdb/rocksdb_plan_store.h"
#include "daemon/store/rocksdb/rocksdb_trace_index.h"
#include "daemon/store/store.h"

namespace idem {
namespace {

class RocksStore final : public Store {
 public:
  RocksStore(std::unique_ptr<rocks::RocksDatabase> db, std::unique_ptr<rocks::RocksAuditLog> audit,
             std::string instance_id)
      : db_(std::move(db)),
        decisions_(*db_),
        idem_keys_(*db_, std::move(instance_id)),
        journal_(*db_),
        plans_(*db_, *audit),  // before audit_ takes the pointer
        audit_(std::move(audit)),
        leases_(*db_),
        meta_(*db_),
        escalations_(*db_),
        outbox_(*db_),
        traces_(*db_) {}

  DecisionStore& decisions() override { return decisions_; }
  IdemKeyStore& idem_keys() override { return idem_keys_; }
  Journal& journal() override { return journal_; }
  PlanStore& plans() override { return plans_; }
  AuditLog& audit() override { return *audit_; }
  LeaseStore& leases() override { return leases_; }
  MetaStore& meta() override { return meta_; }
  EscalationStore& escalations() override { return escalations_; }
  OutboxStore& outbox() override { return outbox_; }
  TraceIndex& traces() override { return traces_; }
  Status WriteHealth() const override { return db_->WriteHealth(); }
  std::optional<uint64_t> Corruptions() const override { return db_->corruptions(); }
  std::vector<SizePart> MemoryUsage() override {
    std::vector<SizePart> parts;
    for (const auto& [name, bytes] : db_->MemoryUsage()) parts.push_back({name, bytes});
    parts.push_back({"decision_cache", decisions_.CachedBytes()});
    return parts;
  }
  StatusOr<std::vector<SizePart>> DiskUsage() override {
    ASSIGN_OR_RETURN(auto usage, db_->DiskUsage());
    std::vector<SizePart> parts;
    for (auto& [name, bytes] : usage) parts.push_back({std::move(name), bytes});
    return parts;
  }
  std::optional<uint64_t> DiskFreeBytes() override { return db_->FreeBytes(); }

 private:
  // Declared first: destroyed last, after every store that refers to it.
  std::unique_ptr<rocks::RocksDatabase> db_;
  rocks::RocksDecisionStore decisions_;
  rocks::RocksIdemKeyStore idem_keys_;
  rocks::RocksJournal journal_;
  rocks::RocksPlanStore plans_;
  std::unique_ptr<rocks::RocksAuditLog> audit_;
  rocks::RocksLeaseStore leases_;
  rocks::RocksMetaStore meta_;
  rocks::RocksEscalationStore escalations_;
  rocks::RocksOutboxStore outbox_;
  rocks::RocksTraceIndex traces_;  // last: its writer thread stops first
};

// The identity of this store's owner, made once per store folder. One
// process at a time owns the folder, so records stamped with it that are
// still in progress when the store is opened again belong to a process that
// is gone.
StatusOr<std::string> InstanceId(rocks::RocksDatabase& db) {
  rocks::RocksMetaStore meta(db);
  constexpr char kKey[] = "store.instance_id";
  ASSIGN_OR_RETURN(std::optional<std::string> have, meta.Get(kKey));
  if (have && !have->empty()) return *have;
  std::string id = "inst_" + RandomHex(8);
  RETURN_IF_ERROR(meta.Put(kKey, id));
  return id;
}

}  // namespace

StatusOr<std::unique_ptr<Store>> OpenRocksStore(const StoreOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<rocks::RocksDatabase> db, rocks::RocksDatabase::Open(options));
  ASSIGN_OR_RETURN(std::unique_ptr<rocks::RocksAuditLog> audit, rocks::RocksAuditLog::Create(*db));
  RETURN_IF_ERROR(rocks::RocksLeaseStore::IndexLegacyLeases(*db));
  RETURN_IF_ERROR(rocks::RocksEscalationStore::IndexLegacyResolved(*db));
  RETURN_IF_ERROR(rocks::RocksPlanStore::IndexLegacyFinished(*db));
  ASSIGN_OR_RETURN(std::string instance_id, InstanceId(*db));
  return std::unique_ptr<Store>(
      new RocksStore(std::move(db), std::move(audit), std::move(instance_id)));
}

}  // namespace idem
