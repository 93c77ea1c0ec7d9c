// PostgreSQL OutboxStore: not implemented yet (placeholder).
#include "daemon/store/postgres/pg_store.h"

namespace idem::pg {

extern const std::string_view kSchemaOutbox = "";

std::unique_ptr<OutboxStore> MakePgOutboxStore(PgContext&) { return nullptr; }

Status StageOutboxEvent(Conn&, const std::string&, const std::string&, int64_t, const Json&) {
  return Internal("postgres outbox: not implemented yet");
}

}  // namespace idem::pg
