// The audit routes: the hash-chained log, paged, and its verification.
#include <cstdlib>
#include <string>
#include <vector>

#include "daemon/http/api.h"
#include "daemon/http/problem.h"

namespace idem {
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

}  // namespace

void AddAuditRoutes(ApiDeps deps, std::vector<Route>& routes) {
  routes.push_back(Route{
      .method = "GET",
      .pattern = "/v1/audit",
      .summary = "The hash-chained audit log in seq order (?from_seq=1&limit=100); "
                 "next_from_seq is null on the last page.",
      .responses = {{200, "audit.list"}, {400, "problem"}},
      .roles = {"operator"},
      .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
        ASSIGN_OR_RETURN(uint64_t from_seq, FromSeqParam(ctx));
        ASSIGN_OR_RETURN(size_t limit, LimitParam(ctx, 100, 1000));
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
}

}  // namespace idem
