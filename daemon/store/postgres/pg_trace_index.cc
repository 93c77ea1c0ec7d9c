// PostgreSQL TraceIndex: not implemented yet (placeholder).
#include "daemon/store/postgres/pg_store.h"

namespace idem::pg {

extern const std::string_view kSchemaTraces = "";

std::unique_ptr<TraceIndex> MakePgTraceIndex(PgContext&) { return nullptr; }

}  // namespace idem::pg
