// PostgreSQL MetaStore: small durable facts, one row each.
#include "daemon/store/postgres/pg_store.h"

namespace idem::pg {

extern const std::string_view kSchemaMeta = R"sql(
CREATE TABLE meta (
  key   text PRIMARY KEY,
  value text NOT NULL
);
)sql";

namespace {

class PgMetaStore final : public MetaStore {
 public:
  explicit PgMetaStore(PgContext& ctx) : ctx_(ctx) {}

  StatusOr<std::optional<std::string>> Get(const std::string& key) override {
    ASSIGN_OR_RETURN(Result r, ctx_.pool.Exec("SELECT value FROM meta WHERE key = $1", {P(key)}));
    if (r.rows() == 0) return std::optional<std::string>();
    return std::optional<std::string>(r.str(0, 0));
  }

  Status Put(const std::string& key, const std::string& value) override {
    return ctx_.pool
        .Exec(
            "INSERT INTO meta (key, value) VALUES ($1, $2)"
            " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
            {P(key), P(value)})
        .status();
  }

 private:
  PgContext& ctx_;
};

}  // namespace

std::unique_ptr<MetaStore> MakePgMetaStore(PgContext& ctx) {
  return std::make_unique<PgMetaStore>(ctx);
}

}  // namespace idem::pg
