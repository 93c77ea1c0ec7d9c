// CopyRocksToPostgres and CopyCounts (store_copy.h).
#include "daemon/store/store_copy.h"

#include <filesystem>
#include <memory>

namespace idem {

Json CopyCounts::ToJson() const {
  return Json{{"decisions", decisions},
              {"cached_decision_keys", cached_decision_keys},
              {"idem_keys", idem_keys},
              {"idem_keys_released", idem_keys_released},
              {"work_items", work_items},
              {"plans", plans},
              {"audit_events", audit_events},
              {"escalations", escalations},
              {"outbox_events", outbox_events},
              {"outbox_cursors", outbox_cursors},
              {"outbox_dead_letters", outbox_dead_letters},
              {"meta", meta},
              {"traces", traces},
              {"leases_skipped", leases_skipped}};
}

StatusOr<CopyCounts> CopyRocksToPostgres(const std::string& rocks_path,
                                         const PgStoreOptions& options) {
  // Before anything is created on the server.
  std::error_code ec;
  if (rocks_path.empty() ||
      !std::filesystem::exists(std::filesystem::path(rocks_path) / "CURRENT", ec)) {
    return NotFound("no RocksDB store at '" + rocks_path + "'");
  }
  // The server is touched only once the folder is open: a copy refused
  // because a daemon holds it leaves no schema behind.
  std::unique_ptr<PgImporter> importer;
  RETURN_IF_ERROR(VisitRocksStore(rocks_path, [&]() -> StatusOr<StoreRecordVisitor*> {
    ASSIGN_OR_RETURN(importer, PgImporter::Open(options));
    return importer.get();
  }));
  return importer->Commit();
}

}  // namespace idem
