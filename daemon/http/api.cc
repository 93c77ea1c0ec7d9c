#include "daemon/http/api.h"

#include <memory>

namespace idem {
namespace {

const char* CacheName(const DecideResult& r) {
  if (r.cache_hit) return "hit";
  if (r.joined) return "joined";
  return "miss";
}

Json DecisionSummary(const Decision& d) {
  return {{"decision_id", d.decision_id},   {"decision_key", d.decision_key},
          {"step", d.step},                 {"status", d.status},
          {"decided_by", d.decided_by},     {"output", d.output},
          {"provider", d.provider},         {"model", d.model},
          {"prompt_version", d.prompt_version}, {"created_at_ms", d.created_at_ms}};
}

}  // namespace

StatusOr<size_t> LimitParam(const RequestContext& ctx, size_t def, size_t max) {
  auto it = ctx.query.find("limit");
  if (it == ctx.query.end()) return def;
  char* end = nullptr;
  long v = std::strtol(it->second.c_str(), &end, 10);
  if (end == it->second.c_str() || *end != '\0' || v < 1 || static_cast<size_t>(v) > max) {
    return InvalidArgument("limit must be a number from 1 to " + std::to_string(max),
                           "query:limit");
  }
  return static_cast<size_t>(v);
}

std::string QueryParam(const RequestContext& ctx, const std::string& name) {
  auto it = ctx.query.find(name);
  return it == ctx.query.end() ? std::string() : it->second;
}

std::vector<Route> BuildApiRoutes(ApiDeps deps) {
  std::vector<Route> routes;

  routes.push_back(Route{
      .method = "GET",
      .pattern = "/healthz",
      .summary = "Liveness: the process answers.",
      .responses = {{200, "health"}},
      .is_public = true,
      .handler = [](RequestContext&) -> StatusOr<RouteResponse> {
        return RouteResponse{200, {{"status", "ok"}}, {}};
      }});

  routes.push_back(Route{
      .method = "GET",
      .pattern = "/readyz",
      .summary = "Readiness: the store answers reads.",
      .responses = {{200, "health"}, {503, "problem"}},
      .is_public = true,
      .handler = [deps](RequestContext&) -> StatusOr<RouteResponse> {
        auto probe = deps.store.decisions().Get("dec_readiness_probe");
        if (!probe.ok() && probe.status().code() != Code::kNotFound) {
          return Unavailable("store: " + probe.status().message());
        }
        return RouteResponse{200, {{"status", "ready"}}, {}};
      }});

  routes.push_back(Route{
      .method = "GET",
      .pattern = "/metrics",
      .summary = "Prometheus metrics (text format).",
      .responses = {{200, ""}},
      .raw_text = true,
      .handler = [deps](RequestContext&) -> StatusOr<RouteResponse> {
        return RouteResponse{200, deps.metrics.RenderPrometheus(), {}};
      }});

  routes.push_back(Route{
      .method = "POST",
      .pattern = "/v1/decide",
      .summary = "Decide a step for an input: the cached decision, or a new validated one.",
      .key_policy = KeyPolicy::kOptional,
      .request_schema = "decide.request",
      .responses = {{200, "decide.response"},
                    {400, "problem"},
                    {404, "problem"},
                    {409, "problem"},
                    {422, "problem"},
                    {503, "problem"}},
      .roles = {"agent"},
      .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
        DecideRequest req;
        req.step = ctx.body.value("step", "");
        req.input = ctx.body.contains("input") ? ctx.body["input"] : Json::object();
        std::string cache = ctx.body.value("cache", "default");
        req.cache = cache == "refresh" ? CacheMode::kRefresh
                    : cache == "only"  ? CacheMode::kOnly
                                       : CacheMode::kDefault;
        req.request_id = ctx.request_id;
        ASSIGN_OR_RETURN(DecideResult r, deps.decide.Decide(req));
        Json body = DecisionSummary(r.decision);
        body["cache"] = CacheName(r);
        return RouteResponse{200, std::move(body), {}};
      }});

  routes.push_back(Route{
      .method = "GET",
      .pattern = "/v1/decisions/{id}",
      .summary = "A stored decision with its trace (attempts, raw output, tokens).",
      .responses = {{200, "decision"}, {404, "problem"}},
      .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
        ASSIGN_OR_RETURN(Decision d, deps.store.decisions().Get(ctx.params[0]));
        return RouteResponse{200, d.ToJson(), {}};
      }});

  routes.push_back(Route{
      .method = "GET",
      .pattern = "/v1/decisions",
      .summary = "Decisions, newest first (?step=&status=&cursor=&limit=).",
      .responses = {{200, "decision.list"}, {400, "problem"}},
      .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
        ASSIGN_OR_RETURN(size_t limit, LimitParam(ctx, 50, 500));
        ASSIGN_OR_RETURN(DecisionPage page,
                         deps.store.decisions().List(QueryParam(ctx, "step"), QueryParam(ctx, "status"),
                                                     QueryParam(ctx, "cursor"), limit));
        Json items = Json::array();
        for (const auto& d : page.items) items.push_back(DecisionSummary(d));
        Json body = {{"items", items}};
        if (!page.next_cursor.empty()) body["next_cursor"] = page.next_cursor;
        return RouteResponse{200, std::move(body), {}};
      }});

  AddWorkRoutes(deps, routes);

  // /openapi.json documents every route, itself included.
  auto doc = std::make_shared<Json>();  // shared: filled after the table is complete
  routes.push_back(Route{
      .method = "GET",
      .pattern = "/openapi.json",
      .summary = "This API as an OpenAPI 3.1 document.",
      .responses = {{200, ""}},
      .is_public = true,
      .handler = [doc](RequestContext&) -> StatusOr<RouteResponse> {
        return RouteResponse{200, *doc, {}};
      }});
  for (Route& r : routes) CompileRoute(r);
  *doc = BuildOpenApi(routes);
  return routes;
}

}  // namespace idem
