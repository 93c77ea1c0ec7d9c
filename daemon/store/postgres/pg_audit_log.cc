// PostgreSQL AuditLog: not implemented yet (placeholder).
#include "daemon/store/postgres/pg_store.h"

namespace idem::pg {

extern const std::string_view kSchemaAudit = "";

std::unique_ptr<AuditLog> MakePgAuditLog(PgContext&) { return nullptr; }

StatusOr<uint64_t> AppendAuditTx(Conn&, AuditEvent) {
  return Internal("postgres audit: not implemented yet");
}

}  // namespace idem::pg
