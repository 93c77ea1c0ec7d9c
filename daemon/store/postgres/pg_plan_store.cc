// PostgreSQL PlanStore: not implemented yet (placeholder).
#include "daemon/store/postgres/pg_store.h"

namespace idem::pg {

extern const std::string_view kSchemaPlans = "";

std::unique_ptr<PlanStore> MakePgPlanStore(PgContext&) { return nullptr; }

}  // namespace idem::pg
