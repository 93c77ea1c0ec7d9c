// PostgreSQL OutboxStore: not implemented yet beyond staging (placeholder).
#include "daemon/store/postgres/pg_store.h"

namespace idem::pg {

// Events are inserted with seq NULL by the transaction that makes the state
// change; a seq is given only to committed rows, in order, so a reader that
// continues after the last seq it saw never skips one that commits late.
extern const std::string_view kSchemaOutbox = R"sql(
CREATE TABLE outbox (
  id    bigserial PRIMARY KEY,
  seq   bigint UNIQUE,
  type  text NOT NULL,
  key   text NOT NULL,
  at_ms bigint NOT NULL,
  data  jsonb NOT NULL
);
CREATE INDEX outbox_unsequenced ON outbox (id) WHERE seq IS NULL;
)sql";

Status StageOutboxEvent(Conn& c, const std::string& type, const std::string& key, int64_t at_ms,
                        const Json& data) {
  return c
      .Exec("INSERT INTO outbox (type, key, at_ms, data) VALUES ($1, $2, $3, $4)",
            {P(type), P(key), P(at_ms), P(data.dump())})
      .status();
}

std::unique_ptr<OutboxStore> MakePgOutboxStore(PgContext&) { return nullptr; }

}  // namespace idem::pg
