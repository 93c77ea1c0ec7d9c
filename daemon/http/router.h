// The route table: every HTTP endpoint of the daemon, declared once with
// its method, path pattern, Idempotency-Key policy, body schemas and roles.
// The server dispatches from it and /openapi.json is generated from it, so
// an endpoint cannot exist undocumented.
//
// Thread-safety: a built table is immutable; handlers are called
// concurrently and must be thread-safe.
#pragma once

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "daemon/core/status.h"

namespace idem {

using Json = nlohmann::json;

enum class KeyPolicy { kNone, kOptional, kRequired };

struct RequestContext {
  std::string method;
  std::string path;
  std::string caller;                        // auth token name, or "anonymous"
  std::string request_id;                    // X-Request-Id (accepted or generated)
  std::vector<std::string> params;           // path parameters, in pattern order
  std::map<std::string, std::string> query;  // query parameters (last wins)
  Json body;                                 // parsed body (null when none)
  std::string idempotency_key;               // "" when absent
};

struct RouteResponse {
  int status = 200;
  Json body;
  std::vector<std::pair<std::string, std::string>> headers;
};

using RouteHandler = std::function<StatusOr<RouteResponse>(RequestContext&)>;

struct Route {
  std::string method;   // GET, POST, DELETE
  std::string pattern;  // "/v1/decisions/{id}"
  std::string summary;
  KeyPolicy key_policy = KeyPolicy::kNone;
  std::string request_schema;            // schemas/api name, "" for none
  std::map<int, std::string> responses;  // status -> schemas/api name ("" for none)
  std::vector<std::string> roles;        // any of these (or admin); empty: anyone
  bool raw_text = false;                 // response body is text (metrics)
  bool is_public = false;                // no auth (health probes, the API description)
  RouteHandler handler;

  std::regex compiled;  // built by CompileRoute
  std::vector<std::string> param_names;
};

// Fills route.compiled and route.param_names from route.pattern.
void CompileRoute(Route& route);

// The OpenAPI 3.1 document of `routes`, with every schemas/api file as a
// component schema.
Json BuildOpenApi(const std::vector<Route>& routes);

}  // namespace idem
