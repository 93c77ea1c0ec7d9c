// PostgreSQL IdemKeyStore: not implemented yet (placeholder).
#include "daemon/store/postgres/pg_store.h"

namespace idem::pg {

extern const std::string_view kSchemaIdemKeys = "";

std::unique_ptr<IdemKeyStore> MakePgIdemKeyStore(PgContext&) { return nullptr; }

}  // namespace idem::pg
