#include "daemon/http/router.h"

#include "daemon/http/api_schemas.h"
#include "daemon/http/http1.h"

namespace idem {

namespace {

// A pattern segment that takes a value: "{id}".
bool IsParam(std::string_view segment) {
  return segment.size() >= 2 && segment.front() == '{' && segment.back() == '}';
}

}  // namespace

void CompileRoute(Route& route) {
  route.segments.clear();
  route.param_names.clear();
  std::string_view rest(route.pattern);
  if (rest.starts_with('/')) rest.remove_prefix(1);
  for (;;) {
    size_t slash = rest.find('/');
    std::string seg(rest.substr(0, slash));
    if (IsParam(seg)) {
      route.param_names.push_back(seg.substr(1, seg.size() - 2));
    }
    route.segments.push_back(std::move(seg));
    if (slash == std::string_view::npos) break;
    rest.remove_prefix(slash + 1);
  }
}

bool MatchPath(const Route& route, std::string_view path, std::vector<std::string>* params) {
  if (!path.starts_with('/')) return false;
  path.remove_prefix(1);
  // First the literal segments and the count, without decoding or
  // allocating anything: most routes a lookup tries are not the one.
  std::string_view rest = path;
  for (size_t i = 0; i < route.segments.size(); ++i) {
    const size_t slash = rest.find('/');
    const bool last = i + 1 == route.segments.size();
    if (last != (slash == std::string_view::npos)) return false;
    const std::string_view seg = rest.substr(0, slash);
    const std::string& want = route.segments[i];
    if (IsParam(want)) {
      if (seg.empty()) return false;
    } else if (seg != want) {
      return false;
    }
    if (!last) rest.remove_prefix(slash + 1);
  }
  // A match: the parameters, in order.
  for (size_t i = 0; i < route.segments.size(); ++i) {
    const size_t slash = path.find('/');
    if (IsParam(route.segments[i])) {
      params->push_back(http1::DecodePathSegment(path.substr(0, slash)));  // %2F: a slash inside
    }
    if (slash != std::string_view::npos) path.remove_prefix(slash + 1);
  }
  return true;
}

Json BodyJson(const RouteResponse& r) {
  if (r.content_type == "application/json" && r.body.is_string()) {
    return Json::parse(r.body.get<std::string>(), nullptr, false);
  }
  return r.body;
}

namespace {

Json Ref(const std::string& name) { return {{"$ref", "#/components/schemas/" + name}}; }

std::string Lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

Json BuildOpenApi(const std::vector<Route>& routes) {
  Json doc = {
      {"openapi", "3.1.0"},
      {"info",
       {{"title", "idem"},
        {"version", "1"},
        {"description",
         "Makes LLM-driven automation safe to retry: cached decisions and exactly-once "
         "effects. Errors are RFC 9457 problem+json."}}},
      {"paths", Json::object()},
      {"components",
       {{"schemas", Json::object()},
        {"securitySchemes", {{"bearer", {{"type", "http"}, {"scheme", "bearer"}}}}}}},
  };
  Json& schemas = doc["components"]["schemas"];
  for (const auto& [name, text] : ApiSchemaTexts()) {
    Json s = Json::parse(text, nullptr, false);
    if (s.is_discarded()) continue;
    s.erase("$schema");
    s.erase("$id");
    schemas[name] = std::move(s);
  }
  for (const Route& r : routes) {
    Json op = {{"summary", r.summary}, {"responses", Json::object()}};
    Json params = Json::array();
    for (const auto& p : r.param_names) {
      params.push_back(
          {{"name", p}, {"in", "path"}, {"required", true}, {"schema", {{"type", "string"}}}});
    }
    for (const QueryDoc& q : r.query) {
      params.push_back({{"name", q.name},
                        {"in", "query"},
                        {"required", q.required},
                        {"description", q.description},
                        {"schema", q.schema}});
    }
    if (r.key_policy != KeyPolicy::kNone) {
      params.push_back({{"name", "Idempotency-Key"},
                        {"in", "header"},
                        {"required", r.key_policy == KeyPolicy::kRequired},
                        {"description",
                         "An sf-string (\"...\") or token, at most 255 characters. Same key "
                         "and payload replays the stored response (Idempotent-Replayed: "
                         "true); another payload is 422; while the first runs, 409 (or wait "
                         "with Prefer: wait=N)."},
                        {"schema", {{"type", "string"}, {"maxLength", 257}}}});
    }
    if (!params.empty()) op["parameters"] = params;
    // The roles that may call it (OpenAPI 3.1 lets a non-OAuth scheme list
    // role names); they apply when auth.tokens is configured.
    op["security"] = r.is_public ? Json::array() : Json::array({{{"bearer", r.roles}}});
    if (!r.request_schema.empty()) {
      op["requestBody"] = {
          {"required", true},
          {"content", {{"application/json", {{"schema", Ref(r.request_schema)}}}}}};
    }
    for (const auto& [status, schema] : r.responses) {
      Json resp = {{"description", status < 300 ? "success" : "see the body"}};
      std::string type = status >= 400 ? "application/problem+json" : "application/json";
      if (!schema.empty()) resp["content"][type] = {{"schema", Ref(schema)}};
      auto mit = r.media.find(status);
      if (mit != r.media.end()) {
        for (const auto& [media_type, media_schema] : mit->second) {
          // No schema: a body that is not JSON, described by its type only.
          resp["content"][media_type] =
              media_schema.empty() ? Json::object() : Json{{"schema", Ref(media_schema)}};
        }
      }
      op["responses"][std::to_string(status)] = resp;
    }
    // What the pipeline around every handler may answer (server.cc), so a
    // client generated from this document knows every status it can get.
    auto common = [&op](int status, const char* why, bool retry_after = false) {
      std::string key = std::to_string(status);
      Json& resp = op["responses"][key];
      if (!resp.contains("description")) resp["description"] = why;
      Json& problem = resp["content"]["application/problem+json"];
      if (!problem.contains("schema")) problem["schema"] = Ref("problem");
      if (retry_after) {
        resp["headers"]["Retry-After"] = {{"description", "seconds to wait before trying again"},
                                          {"schema", {{"type", "integer"}, {"minimum", 0}}}};
      }
    };
    if (!r.is_public) {
      common(400,
             "a caller header is malformed: two Authorization headers, or an Idem-Caller that is "
             "not a name (pointer header:NAME)");
      common(401, "no valid bearer token (when auth.tokens is configured)");
      common(403, "the token lacks the route's role, or Origin / Host is refused");
    }
    if (!r.query.empty()) {
      common(400, "a query parameter is malformed or out of its bounds (pointer query:NAME)");
    }
    if (!r.request_schema.empty()) {
      common(400, "the body is not JSON or breaks the request schema (pointer names the field)");
      common(413, "the body is larger than server.max_body_bytes");
      common(415, "Content-Type is not application/json");
    }
    if (!r.is_public && r.pattern != "/metrics") {
      common(429, "the caller is past server.rate_limit (Retry-After)", true);
    }
    if (r.key_policy != KeyPolicy::kNone) {
      common(400, "the Idempotency-Key or Prefer header is malformed (pointer header:NAME)");
      common(409, "the same Idempotency-Key is still in progress (Retry-After)", true);
      common(422, "the Idempotency-Key was used with another payload");
    }
    common(500, "an internal error (a store read or write failed); the detail says what");
    common(503,
           "every handler busy and the queue full, draining, or the store refuses writes "
           "(Retry-After)",
           true);
    doc["paths"][r.pattern][Lower(r.method)] = op;
  }
  return doc;
}

StatusOr<RouteResponse> RunHandler(const Route& route, RequestContext& ctx) {
  try {
    return route.handler(ctx);
  } catch (const std::exception& e) {
    return Internal(std::string("the request's handler failed: ") + e.what());
  }
}

StatusOr<RouteResponse> JournalLane::RunAlone(RequestContext& ctx, Journal& journal) const {
  if (gate) {
    std::optional<StatusOr<RouteResponse>> answer = RunGuardedStep([&] { return gate(ctx); });
    if (answer) return std::move(*answer);
  }
  ASSIGN_OR_RETURN(JournalOp op, RunGuardedStep([&] { return prepare(ctx); }));
  std::vector<StatusOr<JournalOpResult>> out =
      journal.FinishOps(journal.BeginOps(std::span<const JournalOp>(&op, 1), nullptr));
  return RunGuardedStep([&] { return respond(ctx, std::move(out[0])); });
}

}  // namespace idem
