// PostgreSQL DecisionStore: not implemented yet (placeholder).
#include "daemon/store/postgres/pg_store.h"

namespace idem::pg {

extern const std::string_view kSchemaDecisions = "";

std::unique_ptr<DecisionStore> MakePgDecisionStore(PgContext&) { return nullptr; }

}  // namespace idem::pg
