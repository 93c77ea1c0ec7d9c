// PostgreSQL Journal: not implemented yet (placeholder).
#include "daemon/store/postgres/pg_store.h"

namespace idem::pg {

extern const std::string_view kSchemaJournal = "";

std::unique_ptr<Journal> MakePgJournal(PgContext&) { return nullptr; }

}  // namespace idem::pg
