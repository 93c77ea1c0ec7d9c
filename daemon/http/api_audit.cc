// The audit routes: the hash-chained log, paged, and its verification.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "daemon/core/json.h"
#include "daemon/http/api.h"
#include "daemon/http/problem.h"
#include "daemon/obs/trace.h"

namespace idem {
namespace {

constexpr PageSize kAuditPage{100, 1000};

}  // namespace
namespace {

StatusOr<uint64_t> FromSeqParam(const RequestContext& ctx) {
  std::string v = QueryParam(ctx, "from_seq");
  if (v.empty()) return 1;
  char* end = nullptr;
  unsigned long long n = std::strtoull(v.c_str(), &end, 10);
  if (end == v.c_str() || *end != '\0' || v[0] == '-' || n < 1) {
    return InvalidArgument("from_seq must be a number from 1", "query:from_seq");
  }
  return static_cast<uint64_t>(n);
}

constexpr size_t kMaxTraceEntries = 10'000;

// The events of one trace: each index entry, with the record it names as
// stored now; a plan's history adds its approvals and other transitions.
StatusOr<Json> TraceEvents(Store& store, const std::string& trace_id) {
  ASSIGN_OR_RETURN(std::vector<TraceEntry> entries,
                   store.traces().List(trace_id, kMaxTraceEntries));
  std::vector<Json> events;
  for (const TraceEntry& e : entries) {
    StatusOr<Json> parsed = ParseJson(e.detail);
    Json detail = parsed.ok() && parsed->is_object() ? std::move(*parsed) : Json::object();
    // A request is indexed when it ends, after what it caused: place it at
    // its start.
    int64_t at_ms = e.at_ms;
    if (e.type == "request" && detail.contains("started_at_ms") &&
        detail["started_at_ms"].is_number_integer()) {
      at_ms = std::min(e.at_ms, detail["started_at_ms"].get<int64_t>());
    }
    Json ev = {{"at_ms", at_ms}, {"type", e.type}, {"ref", e.ref}, {"detail", std::move(detail)}};
    std::vector<Json> history;
    if (e.type == "decision") {
      auto d = store.decisions().Get(e.ref);
      if (d.ok()) {
        Json j = d->ToJson();
        j.erase("material");
        ev["record"] = std::move(j);
      } else if (d.status().code() == Code::kNotFound) {
        ev["missing"] = true;
      } else {
        return d.status();
      }
    } else if (e.type == "work") {
      auto w = store.journal().Get(e.ref);
      if (w.ok()) {
        ev["record"] = w->ToJson();
        ev["record"].erase("lease_token");
      } else if (w.status().code() == Code::kNotFound) {
        ev["missing"] = true;
      } else {
        return w.status();
      }
    } else if (e.type == "plan") {
      auto p = store.plans().Get(e.ref);
      if (p.ok()) {
        for (const Json& h : p->history) {
          if (!h.is_object()) continue;
          std::string to = h.value("to", "");
          std::string type = to == "approved"   ? "approval"
                             : to == "rejected" ? "rejection"
                                                : "plan_transition";
          history.push_back({{"at_ms", h.value("at_ms", int64_t{0})},
                             {"type", type},
                             {"ref", e.ref},
                             {"detail", h}});
        }
        ev["record"] = p->ToJson();
      } else if (p.status().code() == Code::kNotFound) {
        ev["missing"] = true;
      } else {
        return p.status();
      }
    }
    events.push_back(std::move(ev));
    for (Json& h : history) events.push_back(std::move(h));
  }
  // Time order; in the same millisecond a request comes first, the rest in
  // the index's (arrival) order, a plan's history after the plan.
  std::stable_sort(events.begin(), events.end(), [](const Json& a, const Json& b) {
    auto key = [](const Json& e) {
      return std::make_pair(e["at_ms"].get<int64_t>(), e["type"] == "request" ? 0 : 1);
    };
    return key(a) < key(b);
  });
  return Json(std::move(events));
}

}  // namespace

void AddAuditRoutes(ApiDeps deps, std::vector<Route>& routes) {
  routes.push_back(Route{
      .method = "GET",
      .pattern = "/v1/audit",
      .summary = "The hash-chained audit log in seq order (?from_seq=1&limit=100); "
                 "next_from_seq is null on the last page.",
      .responses = {{200, "audit.list"}, {400, "problem"}},
      .roles = {"operator"},
      .query = {{"from_seq",
                 {{"type", "integer"}, {"minimum", 1}, {"default", 1}},
                 "the first seq to answer (a page's next_from_seq)"},
                LimitDoc(kAuditPage)},
      .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
        ASSIGN_OR_RETURN(uint64_t from_seq, FromSeqParam(ctx));
        ASSIGN_OR_RETURN(size_t limit, LimitParam(ctx, kAuditPage));
        ASSIGN_OR_RETURN(std::vector<AuditEvent> events, deps.store.audit().Scan(from_seq, limit));
        Json items = Json::array();
        for (const AuditEvent& e : events) items.push_back(e.ToJson());
        Json body = {{"items", std::move(items)}, {"next_from_seq", nullptr}};
        // A full page may have a next one; a short page is the end.
        if (events.size() == limit) body["next_from_seq"] = events.back().seq + 1;
        return RouteResponse{200, std::move(body), {}};
      }});

  routes.push_back(Route{
      .method = "GET",
      .pattern = "/v1/audit/verify",
      .summary = "Recomputes the audit chain: 200 intact, 409 with the first broken seq "
                 "(a modified, removed or reordered event, or events removed from the end).",
      .responses = {{200, "audit.verify"}, {409, "audit.broken"}, {503, "problem"}},
      .roles = {"operator"},
      .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
        ASSIGN_OR_RETURN(AuditVerification v, deps.store.audit().Check());
        if (v.ok) {
          return RouteResponse{200,
                               {{"ok", true},
                                {"checked", v.checked},
                                {"head_seq", v.head_seq},
                                {"head_hash", v.head_hash}},
                               {}};
        }
        Status broken =
            Aborted("audit chain broken at seq " + std::to_string(v.broken_seq) + ": " + v.detail);
        Json body = ProblemBody(409, broken, ctx.request_id);
        body["ok"] = false;
        body["broken_seq"] = v.broken_seq;
        body["checked"] = v.checked;
        body["head_seq"] = v.head_seq;
        return RouteResponse{409, std::move(body), {}};
      }});

  routes.push_back(Route{
      .method = "GET",
      .pattern = "/v1/traces/{trace_id}",
      .summary = "Everything under one W3C trace id (traceparent), in time order: requests, "
                 "decisions, plans with their approvals, work items and their attempts.",
      .responses = {{200, "trace"}, {400, "problem"}, {404, "problem"}},
      .roles = {"operator"},
      .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
        const std::string& trace_id = ctx.params[0];
        if (!ValidTraceId(trace_id)) {
          return InvalidArgument("a trace id is 32 lower-case hex digits, not all zero",
                                 "path:trace_id");
        }
        ASSIGN_OR_RETURN(Json events, TraceEvents(deps.store, trace_id));
        if (events.empty()) return NotFound("nothing is recorded under trace " + trace_id);
        return RouteResponse{200, {{"trace_id", trace_id}, {"events", std::move(events)}}, {}};
      }});
}

}  // namespace idem
