// Decisions as JSON Lines (export / import) and the cost statistics.
//
// Export: GET /v1/decisions/export?step=&since=&cursor=&limit= answers
// application/x-ndjson, one Decision::ToJson() per line (the same form as GET
// /v1/decisions/{id}: key, key material, output, trace), newest first, one
// page per call; the next page's cursor is in the Idem-Next-Cursor header.
//
// Import: POST /v1/decisions/import takes such lines (Content-Type
// application/x-ndjson or application/json, else 415; the
// body is bounded by server.max_body_bytes, and at most kMaxImportLines
// lines) and answers one verdict per non-blank line:
//   imported  stored as the cached decision for its key, with its own id;
//   exists    this decision id is stored already, or another decision is
//             cached for the key (the store keeps the one it has);
//   expired   its cache window ended: not stored;
//   refused   with the reason and its field: not JSON, not a decision, or its
//             decision_key is not the key of its material (recomputed with
//             DecisionKeyOfMaterial, the decide engine's own function).
// The key covers the question (step, provider, model, prompt, schema, tools,
// input), not the answer: an edited output under a matching key is imported
// like any other, as long as it passes the step's output schema and value
// checks where this daemon's decides would serve it. Import is an operator's act and is audited
// ("decisions.imported", with the counts).
#include <charconv>

#include "daemon/core/identity.h"
#include "daemon/core/json.h"
#include "daemon/http/api.h"

namespace idem {
namespace {

constexpr size_t kMaxImportLines = 10'000;
// A page holds at most 1000 decisions (each up to ~16 KiB of raw output in
// its trace), so one answer stays within tens of MiB.
constexpr PageSize kExportPage{500, 1000};
constexpr const char* kCostBy[] = {"step", "model", "day"};
constexpr int64_t kDefaultCostRangeMs = int64_t{30} * 86'400'000;

bool IsDecisionId(const std::string& id) {
  if (id.size() != 36 || id.rfind("dec_", 0) != 0) return false;
  for (size_t i = 4; i < id.size(); ++i) {
    const char c = id[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// The next line of `rest` (without its "\r\n"), which moves past it.
// How many imported decision ids the audit event names (an import may
// carry 10,000 lines; the event stays small, the count says the rest).
constexpr size_t kAuditedIds = 100;

std::string_view NextLine(std::string_view& rest) {
  const size_t nl = rest.find('\n');
  std::string_view line = rest.substr(0, nl);
  rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return line;
}

bool IsBlank(std::string_view line) {
  return line.find_first_not_of(" \t") == std::string_view::npos;
}

// Why `d` may not be imported (a refusal), or OK. A decision this daemon's
// decides would serve (its step is configured and computes the same key:
// same model, prompt, schema and tools) must also hold an output its step
// accepts, checked as a model's output is.
// A line as a Decision; a line that is not one is refused naming the field.
StatusOr<Decision> ImportedDecision(const Json& line) {
  if (!line.is_object()) return InvalidArgument("a line is one exported decision object", "");
  for (const char* name : {"decision_id", "decision_key"}) {
    if (!line.contains(name) || !line[name].is_string()) {
      return InvalidArgument(std::string(name) + " is missing or not a string",
                             std::string("/") + name);
    }
  }
  StatusOr<Decision> d = Decision::FromJson(line);
  if (!d.ok()) {
    // FromJson speaks of stored records; say what is wrong with the line.
    // FromJson names the member it refused as "field 'NAME'".
    const std::string& why = d.status().message();
    const size_t colon = why.find(": ");
    std::string pointer;
    if (const size_t at = why.find("field '"); at != std::string::npos) {
      const size_t end = why.find('\'', at + 7);
      if (end != std::string::npos)
        pointer = "/" + JsonPointerToken(why.substr(at + 7, end - at - 7));
    }
    return InvalidArgument(
        "the line is not an exported decision" +
            (colon == std::string::npos ? std::string() : ": " + why.substr(colon + 2)),
        pointer);
  }
  return d;
}

// That `d`'s id is its own here: a decision of another key under that id,
// or a plan of other work under the plan id it would get, is refused (an
// import must not take over a plan, least of all a gate plan awaiting its
// operator). `known` is what the store holds under the id.
Status CheckIdFree(const Decision& d, const StatusOr<Decision>& known, PlanStore& plans) {
  if (known.ok() && known->decision_key != d.decision_key) {
    return InvalidArgument("decision_id " + d.decision_id + " is a decision of another key here",
                           "/decision_id");
  }
  StatusOr<Plan> plan = plans.Get(PlanEngine::DecisionPlanId(d.decision_id));
  if (!plan.ok()) return plan.status().code() == Code::kNotFound ? Status::Ok() : plan.status();
  if (plan->decision_id != d.decision_id) {
    return InvalidArgument("decision_id " + d.decision_id + " would plan under " + plan->plan_id +
                               ", which belongs to other work here",
                           "/decision_id");
  }
  return Status::Ok();
}

// How far ahead of this daemon's clock an imported decision may say it was
// made (another machine's clock): the outbox event it writes carries that
// time, and retention sweeps events in time order, so one decision dated
// years ahead held every later event for years.
constexpr int64_t kImportClockSkewMs = 5 * 60 * 1000;

Status CheckImported(const Decision& d, const DecideEngine& decide, int64_t now_ms) {
  if (!IsDecisionId(d.decision_id)) {
    return InvalidArgument("decision_id must be dec_ and 32 lower-case hex digits", "/decision_id");
  }
  if (d.status != "decided") return InvalidArgument("status must be decided", "/status");
  if (d.decided_by != "model" && d.decided_by != "human") {
    return InvalidArgument("decided_by must be model or human", "/decided_by");
  }
  StatusOr<KeyMaterial> key = DecisionKeyOfMaterial(d.material);
  if (!key.ok()) return key.status();
  if (key->key != d.decision_key) {
    return InvalidArgument("decision_key is not the key of this material (the line was edited)",
                           "/decision_key");
  }
  if (d.step != d.material["step"].get<std::string>()) {
    return InvalidArgument("step is not the step of the key material", "/step");
  }
  const Json& prompt_version = d.material.value("prompt_version", Json());
  if (prompt_version.is_string() && d.prompt_version != prompt_version) {
    return InvalidArgument("prompt_version is not the prompt version of the key material",
                           "/prompt_version");
  }
  const Json& input = d.material.value("input", Json());
  if (StatusOr<StepKey> here = decide.KeyFor(d.step, input);
      here.ok() && here->key.key == d.decision_key) {
    RETURN_IF_ERROR(decide.CheckOutput(d.step, d.output, input));
  }
  if (!d.trace.is_object()) return InvalidArgument("trace must be an object", "/trace");
  for (const char* n : {"cost_usd", "input_tokens", "output_tokens"}) {
    auto it = d.trace.find(n);
    if (it != d.trace.end() && (!it->is_number() || it->get<double>() < 0)) {
      return InvalidArgument(std::string(n) + " must be a non-negative number",
                             std::string("/trace/") + n);
    }
  }
  if (d.created_at_ms < 0 || d.expires_at_ms < 0) {
    return InvalidArgument("times must be non-negative", "/created_at_ms");
  }
  if (d.created_at_ms > now_ms + kImportClockSkewMs) {
    return InvalidArgument(
        "created_at_ms is more than 5 minutes ahead of this daemon's clock: a decision cannot "
        "have been made in the future",
        "/created_at_ms");
  }
  return Status::Ok();
}

}  // namespace

void AddDecisionIoRoutes(ApiDeps deps, std::vector<Route>& routes) {
  routes.push_back(Route{
      .method = "GET",
      .pattern = "/v1/decisions/export",
      .summary = "Decisions as JSON Lines (application/x-ndjson), one per line with key material "
                 "and trace, newest first (?step=&since=ms&cursor=&limit=); the next page's "
                 "cursor is in the Idem-Next-Cursor header.",
      .responses = {{200, ""}, {400, "problem"}, {404, "problem"}},
      .media = {{200, {{"application/x-ndjson", ""}}}},
      .roles = {"operator"},
      .query = {TextDoc("step", "only this step's decisions (404 for one not configured)"),
                MillisDoc("since", "only decisions created at or after this time"), CursorDoc(),
                LimitDoc(kExportPage)},
      .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
        ASSIGN_OR_RETURN(size_t limit, LimitParam(ctx, kExportPage));
        ASSIGN_OR_RETURN(int64_t since, MillisParam(ctx, "since", 0));
        ASSIGN_OR_RETURN(std::string step, ConfiguredParam(ctx, "step", deps.config.steps, "step"));
        ASSIGN_OR_RETURN(DecisionPage page,
                         deps.store.decisions().List(step, "", QueryParam(ctx, "cursor"), limit));
        std::string body;
        bool older = false;  // newest first: past `since`, nothing newer follows
        for (const Decision& d : page.items) {
          if (d.created_at_ms < since) {
            older = true;
            break;
          }
          body += d.ToJson().dump(-1, ' ', false, Json::error_handler_t::replace);
          body += '\n';
        }
        RouteResponse r{200, std::move(body), {}};
        r.content_type = "application/x-ndjson";
        if (!older && !page.next_cursor.empty()) {
          r.headers.emplace_back("Idem-Next-Cursor", page.next_cursor);
        }
        return r;
      }});

  routes.push_back(Route{
      .method = "POST",
      .pattern = "/v1/decisions/import",
      .summary = "Loads exported decisions (JSON Lines body): every key is recomputed from its "
                 "material; one verdict per line (imported, exists, expired, refused with the "
                 "reason). Audited.",
      .responses = {{200, "decision.import"}, {400, "problem"}, {413, "problem"}, {415, "problem"}},
      .roles = {"operator"},
      .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
        // A line is an exported record: as deep as the deepest value a
        // request may carry plus the record's own levels around it (the
        // material wraps the input), as a stored answer is read back.
        const JsonLimits limits =
            StoredAnswerLimits(deps.config, deps.config.server.max_body_bytes);
        std::string_view rest = ctx.raw_body;
        Json results = Json::array();
        std::vector<std::string> imported_ids;  // for the audit event
        std::map<std::string, int64_t> counts = {
            {"imported", 0}, {"exists", 0}, {"expired", 0}, {"refused", 0}};
        // Counted before anything is stored: a refused import stores nothing.
        size_t lines = 0;
        for (std::string_view scan = rest; !scan.empty();) lines += !IsBlank(NextLine(scan));
        if (lines > kMaxImportLines) {
          return InvalidArgument("an import takes at most " + std::to_string(kMaxImportLines) +
                                     " lines; send the rest in another request",
                                 "");
        }
        size_t line_no = 0;
        const int64_t now = deps.clock.NowMillis();
        while (!rest.empty()) {
          ++line_no;
          std::string_view line = NextLine(rest);
          if (IsBlank(line)) continue;
          Json verdict = {{"line", line_no}};
          auto refuse = [&](const Status& s) {
            verdict["verdict"] = "refused";
            verdict["reason"] = s.message();
            if (!s.field().empty()) verdict["field"] = s.field();
          };
          StatusOr<Json> parsed = ParseJson(line, limits);
          StatusOr<Decision> d =
              parsed.ok() ? ImportedDecision(*parsed) : StatusOr<Decision>(parsed.status());
          if (d.ok()) verdict["decision_id"] = d->decision_id;
          Status valid = d.ok() ? CheckImported(*d, deps.decide, now) : d.status();
          StatusOr<Decision> known = valid.ok() ? deps.store.decisions().Get(d->decision_id)
                                                : StatusOr<Decision>(NotFound(""));
          if (!known.ok() && known.status().code() != Code::kNotFound) return known.status();
          if (valid.ok()) {
            valid = CheckIdFree(*d, known, deps.store.plans());
            if (!valid.ok() && valid.code() != Code::kInvalidArgument) return valid;
          }
          if (!valid.ok()) {
            refuse(valid);
          } else if (d->expires_at_ms != 0 && d->expires_at_ms <= now) {
            verdict["verdict"] = "expired";
          } else if (known.ok()) {
            verdict["verdict"] = "exists";
          } else {
            // Provenance no line can forge: who imported it, and when (a
            // plan from it cannot be approved by its importer).
            d->trace["imported_by"] = ctx.caller;
            d->trace["imported_at_ms"] = now;
            // A promoter is a token of the daemon it was promoted on; a
            // line naming one here could bar that token from the plan.
            d->trace.erase("promoted_by");
            // Stored by this call, not only present: of two imports of one
            // line at once, the other one says exists (and audits nothing).
            bool stored = false;
            ASSIGN_OR_RETURN(Decision cached, deps.store.decisions().PutIfAbsent(*d, now, &stored));
            if (stored) {
              verdict["verdict"] = "imported";
              if (imported_ids.size() < kAuditedIds) imported_ids.push_back(d->decision_id);
            } else {
              verdict["verdict"] = "exists";
              if (cached.decision_id != d->decision_id) {
                verdict["cached_decision_id"] = cached.decision_id;
              }
            }
          }
          counts[verdict["verdict"].get<std::string>()]++;
          results.push_back(std::move(verdict));
        }
        Json body = {{"imported", counts["imported"]},
                     {"exists", counts["exists"]},
                     {"expired", counts["expired"]},
                     {"refused", counts["refused"]},
                     {"results", std::move(results)}};
        AuditEvent event;
        event.at_ms = now;
        event.actor = ctx.caller;
        event.action = "decisions.imported";
        event.detail = {{"imported", counts["imported"]},
                        {"exists", counts["exists"]},
                        {"expired", counts["expired"]},
                        {"refused", counts["refused"]},
                        {"decision_ids", imported_ids}};  // the first kAuditedIds
        RETURN_IF_ERROR(deps.store.audit().Append(std::move(event)).status());
        return RouteResponse{200, std::move(body), {}};
      },
      .raw_body = true,
      // JSON Lines as the export sends them; a page's form, a text/plain
      // post (what a page may send cross-site without a preflight), is 415.
      .raw_body_types = {"application/x-ndjson", "application/json"}});

  routes.push_back(Route{
      .method = "GET",
      .pattern = "/v1/stats/cost",
      .summary = "Tokens and USD spent on provider calls, and USD saved by cache hits, per step, "
                 "model or UTC day (?by=step|model|day&since=ms&until=ms; default the last 30 "
                 "days).",
      .responses = {{200, "stats.cost"}, {400, "problem"}, {503, "problem"}},
      .roles = {"operator"},
      .query = {OneOfDoc("by", kCostBy, "one row per step (default), model or UTC day"),
                MillisDoc("since", "from this time (default: 30 days before until)"),
                MillisDoc("until", "up to this time (default: now, or since when later)")},
      .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
        if (deps.costs == nullptr) return Unavailable("cost statistics are not kept here");
        ASSIGN_OR_RETURN(std::string by, OneOfParam(ctx, "by", kCostBy));
        if (by.empty()) by = "step";
        // until defaults to now, or to since when that is later (a range
        // that starts tomorrow holds nothing yet; it does not end before it
        // starts); since defaults to 30 days before until.
        ASSIGN_OR_RETURN(const int64_t since_given, MillisParam(ctx, "since", -1));
        ASSIGN_OR_RETURN(int64_t until,
                         MillisParam(ctx, "until", std::max(deps.clock.NowMillis(), since_given)));
        const int64_t since =
            since_given >= 0 ? since_given : std::max<int64_t>(0, until - kDefaultCostRangeMs);
        ASSIGN_OR_RETURN(std::vector<CostRow> rows, deps.costs->Rows(since, until));
        std::map<std::string, CostCounts> grouped;
        CostCounts total;
        for (const CostRow& r : rows) {
          const std::string& key = by == "step" ? r.step : by == "model" ? r.model : r.day;
          grouped[key].Add(r.counts);
          total.Add(r.counts);
        }
        Json items = Json::array();
        for (const auto& [key, c] : grouped) {
          Json j = c.ToJson();
          j[by] = key;
          items.push_back(std::move(j));
        }
        Json body = {{"by", by},
                     {"since_ms", since},
                     {"until_ms", until},
                     {"from_day", CostLedger::DayOf(since)},
                     {"to_day", CostLedger::DayOf(until)},
                     {"items", std::move(items)},
                     {"total", total.ToJson()}};
        return RouteResponse{200, std::move(body), {}};
      }});
}

}  // namespace idem
