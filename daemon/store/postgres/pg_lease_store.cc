// PostgreSQL LeaseStore: not implemented yet (placeholder).
#include "daemon/store/postgres/pg_store.h"

namespace idem::pg {

extern const std::string_view kSchemaLeases = "";

std::unique_ptr<LeaseStore> MakePgLeaseStore(PgContext&) { return nullptr; }

}  // namespace idem::pg
