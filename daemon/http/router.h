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
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "daemon/core/status.h"
#include "daemon/obs/trace.h"
#include "daemon/store/store.h"

namespace idem {

using Json = nlohmann::json;

enum class KeyPolicy { kNone, kOptional, kRequired };

struct RequestContext {
  std::string method;
  std::string path;
  std::string caller;                        // auth token name, or "anonymous"
  std::string request_id;                    // X-Request-Id (accepted or generated)
  std::vector<std::string> params;           // path parameters, in pattern order
  std::map<std::string, std::string> query;  // query parameters (each at most once: 400 otherwise)
  Json body;                                 // parsed body (null when none)
  std::string idempotency_key;               // "" when absent
  std::map<std::string, std::string> headers;  // the route's request_headers (lower-case names)
  std::string raw_body;                        // Route::raw_body routes only: the bytes as sent
  int64_t op_now_ms = 0;  // a journal lane's op: the time it was prepared for (its now_ms)
  TraceContext trace;  // the caller's traceparent/tracestate, or a new trace (daemon/obs/trace.h)
  // Takes one more of the caller's server.rate_limit tokens, for a request
  // that is several calls (an MCP batch); false when none is left. Empty
  // when no limit applies.
  std::function<bool()> take_rate_token;
  // Keeps a key a handler took in the key store itself (the inbox's event
  // ids) its own while the handler runs, as the server does for a route's
  // Idempotency-Key: its lease is renewed until drop_key(ticket). Set on
  // routes that take the body raw (the inbox); empty elsewhere and outside
  // the server.
  std::function<uint64_t(const std::string& scope, const std::string& key,
                         const std::string& fingerprint, int64_t lease_until_ms)>
      hold_key;
  std::function<void(uint64_t ticket)> drop_key;
};

struct RouteResponse {
  int status = 200;
  Json body;
  std::vector<std::pair<std::string, std::string>> headers;
  // The answer reports work that is still moving (409 busy, a run with
  // items retrying): not a final outcome, so it is never stored under an
  // Idempotency-Key; a retry with the key runs again and reports the work's
  // state then. A 202 is always treated so.
  bool transient = false;
  // Non-empty: `body` is a string sent as it is, with this Content-Type
  // (MCP's JSON-RPC and SSE answers, the operator page's files). A raw_text
  // route leaving it empty sends the metrics exposition format.
  std::string content_type = {};
  // Set: a long poll. The answer waits for an event without holding a
  // handler thread: the server parks the request and calls
  // `long_poll->arm(resume)`, which must see that `resume` is called once,
  // from any thread, at the event or at a deadline; `long_poll->answer`
  // then builds the response on a handler thread. Routes without an
  // Idempotency-Key only; elsewhere answer() runs at once.
  std::shared_ptr<const struct LongPoll> long_poll = {};
};

// The answer's body as a JSON value: a JSON answer the route wrote as text
// (content_type "application/json", the work routes') is parsed back (a
// discarded value if it does not parse); any other body as it is.
Json BodyJson(const RouteResponse& r);

struct LongPoll {
  std::function<void(std::function<void()> resume)> arm;
  std::function<StatusOr<RouteResponse>()> answer;
};

using RouteHandler = std::function<StatusOr<RouteResponse>(RequestContext&)>;

// The batch lane (event_server.h) for a route whose whole work is one
// journal write (a claim, a complete, a fail): `prepare` turns the request
// into a JournalOp, the server begins every such op of one event-loop round
// with Journal::BeginOps (one write, one fsync, answered once durable), and
// `respond` builds each answer. The route's handler must be prepare ->
// the same op alone -> respond, so both paths answer alike; requests with
// an Idempotency-Key take the handler.
struct JournalLane {
  // Runs before prepare; an answer it returns is the request's answer and
  // no journal op is made (a claim of work that waits for approval). May
  // edit the context (the approved args). Empty: no gate.
  std::function<std::optional<StatusOr<RouteResponse>>(RequestContext&)> gate;
  std::function<StatusOr<JournalOp>(RequestContext&)> prepare;
  std::function<StatusOr<RouteResponse>(RequestContext&, StatusOr<JournalOpResult>)> respond;

  // The handler equivalent of the lane: one op, alone.
  StatusOr<RouteResponse> RunAlone(RequestContext& ctx, Journal& journal) const;
};

// A query parameter a route reads, for /openapi.json (the handler checks it).
struct QueryDoc {
  std::string name;
  Json schema;  // JSON Schema of its value
  std::string description;
  bool required = false;
};

// The shorter of two windows (0: forever).
inline int64_t ShorterWindow(int64_t a_ms, int64_t b_ms) {
  if (a_ms == 0) return b_ms;
  if (b_ms == 0) return a_ms;
  return a_ms < b_ms ? a_ms : b_ms;
}

struct Route {
  std::string method;   // GET, POST, DELETE
  std::string pattern;  // "/v1/decisions/{id}"
  std::string summary;
  KeyPolicy key_policy = KeyPolicy::kNone;
  std::string request_schema;            // schemas/api name, "" for none
  std::map<int, std::string> responses;  // status -> schemas/api name ("" for none)
  // Per status, what the route answers besides the schema above (that one
  // is application/json, problem+json from 400 on): media type (no
  // parameters) -> schemas/api name, "" for a body that is not JSON (SSE,
  // the operator page's files, metrics text). Documented in /openapi.json.
  std::map<int, std::map<std::string, std::string>> media;
  std::vector<std::string> roles;  // any of these (or admin); none: any token
  std::vector<QueryDoc> query;     // the query parameters it reads
  bool raw_text = false;           // response body is text (metrics)
  bool is_public = false;          // no auth (health probes, the API description)
  // A public route that runs something (the inbox): a browser's foreign
  // Origin is refused on it all the same (RequestGuard::CheckOrigin).
  bool browser_origin_checked = false;
  RouteHandler handler;
  std::optional<JournalLane> journal_lane;
  // Request headers the handler reads (lower-case names), copied into
  // RequestContext::headers.
  std::vector<std::string> request_headers;
  // The handler takes the body as sent (RequestContext::raw_body), in the
  // sender's content type: no Content-Type check, no JSON parsing here
  // (webhook senders sign the exact bytes).
  bool raw_body = false;
  // With raw_body: the media types it takes (415 for another, as for a JSON
  // body); empty: any (webhook senders choose theirs).
  std::vector<std::string> raw_body_types;
  // Set: a JSON body this pipeline refuses (not JSON, too deep, against the
  // request schema) is answered with this text as application/json, with
  // the same HTTP status, instead of problem+json (MCP's JSON-RPC errors:
  // -32700 for `not_json`, -32600 otherwise).
  std::function<std::string(const Status& why, bool not_json)> body_refusal;
  // Set: the route grants something that lasts a while (a claim's lease, a
  // named lease): how long the request asks for, in ms (0: unknown). Its
  // Idempotency-Key then lives no longer than that, so a retry after the
  // grant ended asks again instead of replaying "yours" to a caller whose
  // lease another has taken over since.
  std::function<int64_t(const RequestContext&)> grant_ms;
  // With grant_ms: whether a stored answer (status, body) is a grant that
  // still holds: its lease live and still its holder's. One its holder
  // ended (completed, failed, released) or lost is not replayed: the
  // request runs again, its answer not stored.
  std::function<bool(int status, const std::string& body)> grant_holds;

  std::vector<std::string> segments;  // built by CompileRoute; "{name}" is a parameter
  std::vector<std::string> param_names;
};

// Runs the route's handler. Handlers report errors as a Status; an
// exception one lets out (a bug, e.g. a JSON value of an unexpected type)
// becomes Internal here, so the request still gets a problem+json with its
// request_id, its access line says 500 and the error is logged.
StatusOr<RouteResponse> RunHandler(const Route& route, RequestContext& ctx);

// The same for one step of a journal lane (gate, prepare, respond), whose
// answer type `fn` returns is built from the Internal status.
template <typename Fn>
auto RunGuardedStep(Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return decltype(fn())(Internal(std::string("the request's handler failed: ") + e.what()));
  }
}

// Fills route.segments and route.param_names from route.pattern.
void CompileRoute(Route& route);

// Does `path` match the route's pattern? Parameters (non-empty, no '/') are
// appended to *params in pattern order.
bool MatchPath(const Route& route, std::string_view path, std::vector<std::string>* params);

// The OpenAPI 3.1 document of `routes`, with every schemas/api file as a
// component schema.
Json BuildOpenApi(const std::vector<Route>& routes);

}  // namespace idem
