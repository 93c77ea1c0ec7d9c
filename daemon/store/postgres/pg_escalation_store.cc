// PostgreSQL EscalationStore: not implemented yet (placeholder).
#include "daemon/store/postgres/pg_store.h"

namespace idem::pg {

extern const std::string_view kSchemaEscalations = "";

std::unique_ptr<EscalationStore> MakePgEscalationStore(PgContext&) { return nullptr; }

}  // namespace idem::pg
