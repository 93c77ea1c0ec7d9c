// The decision cache (store.h, class DecisionStore) on RocksDB.
//
// Family "decisions" holds every decision by id (superseded ones too);
// "decision_keys" maps a decision_key to the id of the cached one;
// "decisions_by_time" and "decisions_by_step" order ids newest first for
// List. PutIfAbsent and Replace hold the decision_key's lock stripe.
//
// List cursors are opaque (hex of the position after the last item).
//
// Thread-safety: all methods may be called concurrently.
#pragma once

#include <optional>
#include <string>

#include "daemon/store/rocksdb/rocksdb_database.h"
#include "daemon/store/store.h"

namespace idem::rocks {

class RocksDecisionStore final : public DecisionStore {
 public:
  // `db` must outlive this object.
  explicit RocksDecisionStore(RocksDatabase& db) : db_(db) {}

  StatusOr<Decision> GetByKey(const std::string& decision_key, int64_t now_ms) override;
  StatusOr<Decision> Get(const std::string& decision_id) override;
  StatusOr<Decision> PutIfAbsent(const Decision& d, int64_t now_ms) override;
  Status Replace(const Decision& d) override;
  StatusOr<DecisionPage> List(const std::string& step, const std::string& status,
                              const std::string& cursor, size_t limit) override;

 private:
  StatusOr<std::optional<Decision>> Load(const std::string& decision_id);
  // The decision currently cached under the key (expired or not).
  StatusOr<std::optional<Decision>> Current(const std::string& decision_key);
  // Stages `d` as the cached decision for its key. REQUIRES: the key's stripe.
  Status Store(const Decision& d);

  RocksDatabase& db_;
};

}  // namespace idem::rocks
