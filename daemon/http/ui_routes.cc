// The operator page's routes: /ui/ and its files (public: the page holds no
// data, every call it makes carries the operator's token), /ui redirecting
// to /ui/, and GET /v1/steps/{name}, which the escalation form reads to
// check a human's answer against the step's output schema before sending.
#include "daemon/http/api.h"
#include "daemon/ui/ui.h"

namespace idem {
namespace {

RouteResponse UiAnswer(const UiFile& f) {
  RouteResponse r{200, std::string(f.body), UiHeaders()};
  r.content_type = std::string(f.content_type);
  return r;
}

}  // namespace

void AddUiRoutes(ApiDeps deps, std::vector<Route>& routes) {
  routes.push_back(Route{.method = "GET",
                         .pattern = "/ui",
                         .summary = "Redirects to the operator page, /ui/.",
                         .responses = {{308, ""}},
                         .media = {{308, {{"text/plain", ""}}}},
                         .raw_text = true,
                         .is_public = true,
                         .handler = [](RequestContext&) -> StatusOr<RouteResponse> {
                           RouteResponse r{308, std::string("/ui/\n"), UiHeaders()};
                           r.headers.emplace_back("Location", "/ui/");
                           r.content_type = "text/plain; charset=utf-8";
                           return r;
                         }});

  routes.push_back(Route{.method = "GET",
                         .pattern = "/ui/",
                         .summary = "The operator page: approval queue, plans, dead letters, "
                                    "escalations (HTML; asks for a token).",
                         .responses = {{200, ""}, {404, "problem"}},
                         .media = {{200, {{"text/html", ""}}}},
                         .raw_text = true,
                         .is_public = true,
                         .handler = [](RequestContext&) -> StatusOr<RouteResponse> {
                           const UiFile* f = FindUiFile("index.html");
                           if (f == nullptr) return NotFound("the page is not built in");
                           return UiAnswer(*f);
                         }});

  routes.push_back(Route{
      .method = "GET",
      .pattern = "/ui/{file}",
      .summary = "A file of the operator page (app.js, style.css).",
      .responses = {{200, ""}, {404, "problem"}},
      .media =
          {{200,
            {{"text/html", ""}, {"text/javascript", ""}, {"text/css", ""}, {"image/svg+xml", ""}}}},
      .raw_text = true,
      .is_public = true,
      .handler = [](RequestContext& ctx) -> StatusOr<RouteResponse> {
        const UiFile* f = FindUiFile(ctx.params[0]);
        if (f == nullptr) {
          return NotFound("the operator page has no file '" + ctx.params[0] + "'");
        }
        return UiAnswer(*f);
      }});

  routes.push_back(
      Route{.method = "GET",
            .pattern = "/v1/steps/{name}",
            .summary = "A configured step: its provider, model and output schema (what a human's "
                       "answer to an escalation must satisfy).",
            .responses = {{200, "step"}, {404, "problem"}},
            .roles = {"agent", "operator"},
            .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
              auto it = deps.config.steps.find(ctx.params[0]);
              if (it == deps.config.steps.end()) {
                return NotFound("no step named '" + ctx.params[0] + "'");
              }
              const StepConfig& s = it->second;
              return RouteResponse{200,
                                   {{"name", it->first},
                                    {"provider", s.provider},
                                    {"model", s.model},
                                    {"output_schema", s.output_schema}},
                                   {}};
            }});
}

}  // namespace idem
