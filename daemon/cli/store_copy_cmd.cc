// `idem store copy` (cli.h): a stopped daemon's RocksDB store into a
// PostgreSQL schema (store_copy.h), with the counts per family.
#include <cstdio>
#include <string>

#include "daemon/cli/cli.h"
#include "daemon/store/store_copy.h"

namespace idem::cli {

std::string RenderCopyCounts(const CopyCounts& c, const Style& style) {
  Table t({"FAMILY", "RECORDS"});
  auto row = [&](const char* name, uint64_t n) { t.AddRow({name, std::to_string(n)}); };
  row("decisions", c.decisions);
  row("cached decision keys", c.cached_decision_keys);
  row("idempotency keys", c.idem_keys);
  row("  of which released (were in progress)", c.idem_keys_released);
  row("journal (work items)", c.work_items);
  row("plans", c.plans);
  row("audit events", c.audit_events);
  row("escalations", c.escalations);
  row("outbox events", c.outbox_events);
  row("outbox cursors", c.outbox_cursors);
  row("outbox dead letters", c.outbox_dead_letters);
  row("meta", c.meta);
  row("traces", c.traces);
  t.AddRow({Table::Cell("leases (not copied: transient)", Color::kDim),
            Table::Cell(std::to_string(c.leases_skipped), Color::kDim)});
  return t.Render(style);
}

int StoreCopy(const Output& o, const std::string& rocks_path, const PgStoreOptions& to) {
  StatusOr<CopyCounts> counts = CopyRocksToPostgres(rocks_path, to);
  if (!counts.ok()) {
    const Status& s = counts.status();
    std::fprintf(o.err, "idem store copy: %s\n", s.message().c_str());
    switch (s.code()) {
      case Code::kNotFound:
        return kExitNotFound;
      case Code::kFailedPrecondition:
        return kExitConflict;
      case Code::kUnavailable:
        return kExitUnreachable;
      case Code::kInvalidArgument:
        return kExitUsage;
      default:
        return kExitFailed;
    }
  }
  if (o.json) {
    std::fprintf(o.out, "%s\n", counts->ToJson().dump().c_str());
  } else {
    std::fprintf(o.out, "copied %s into PostgreSQL schema %s:\n", rocks_path.c_str(),
                 to.schema.c_str());
    std::fputs(RenderCopyCounts(*counts, o.style).c_str(), o.out);
  }
  return kExitOk;
}

}  // namespace idem::cli
