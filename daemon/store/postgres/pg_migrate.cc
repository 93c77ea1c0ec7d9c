// Versioned schema migrations, applied at start-up (and by `idem migrate`).
#include <string>
#include <vector>

#include "daemon/store/postgres/pg_store.h"

namespace idem::pg {

const std::vector<Migration>& Migrations() {
  static const auto* all = [] {
    auto* m = new std::vector<Migration>;
    std::string v1;
    for (std::string_view part :
         {kSchemaMeta, kSchemaDecisions, kSchemaIdemKeys, kSchemaJournal, kSchemaPlans,
          kSchemaAudit, kSchemaLeases, kSchemaEscalations, kSchemaOutbox, kSchemaTraces}) {
      v1 += part;
      v1 += "\n";
    }
    m->push_back(Migration{1, "initial schema", std::move(v1)});
    m->push_back(Migration{2, "decision traces apart", std::string(kSchemaDecisionTraces)});
    m->push_back(Migration{3, "run members", std::string(kSchemaRunMembers)});
    m->push_back(Migration{4, "journal call ids", std::string(kSchemaJournalCallId)});
    m->push_back(Migration{5, "finished plans by finish time", std::string(kSchemaPlansFinished)});
    return m;
  }();
  return *all;
}

StatusOr<std::vector<int>> Migrate(Pool& pool) {
  ASSIGN_OR_RETURN(Pool::Lease lease, pool.Acquire());
  Conn& c = *lease;
  // One lock per schema: daemons starting together wait for the first.
  const std::vector<Param> lock_key = {P("idem.migrate." + pool.options().schema)};
  RETURN_IF_ERROR(c.Exec("SELECT pg_advisory_lock(hashtext($1))", lock_key).status());
  auto migrate = [&]() -> StatusOr<std::vector<int>> {
    RETURN_IF_ERROR(
        c.ExecScript("CREATE TABLE IF NOT EXISTS schema_migrations ("
                     " version integer PRIMARY KEY, name text NOT NULL,"
                     " applied_at timestamptz NOT NULL DEFAULT now())"));
    ASSIGN_OR_RETURN(Result have,
                     c.Exec("SELECT coalesce(max(version), 0) FROM schema_migrations"));
    const int64_t current = have.i64(0, 0);
    const std::vector<Migration>& all = Migrations();
    if (!all.empty() && current > all.back().version) {
      return FailedPrecondition("the database schema is at version " + std::to_string(current) +
                                ", newer than this idem knows (" +
                                std::to_string(all.back().version) + "); upgrade idem");
    }
    std::vector<int> applied;
    for (const Migration& m : all) {
      if (m.version <= current) continue;
      RETURN_IF_ERROR(c.ExecScript("BEGIN"));
      Status s = c.ExecScript(m.sql);
      if (s.ok()) {
        s = c.Exec("INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                   {P(m.version), P(m.name)})
                .status();
      }
      if (s.ok()) s = c.ExecScript("COMMIT");
      if (!s.ok()) {
        (void)c.ExecScript("ROLLBACK");
        return s.Annotate("migration " + std::to_string(m.version) + " (" + m.name + ")");
      }
      applied.push_back(m.version);
    }
    return applied;
  };
  StatusOr<std::vector<int>> out = migrate();
  (void)c.Exec("SELECT pg_advisory_unlock(hashtext($1))", lock_key);
  return out;
}

}  // namespace idem::pg
