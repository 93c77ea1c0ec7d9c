// HttpServer: the daemon's HTTP front (event_server.h), dispatching the route
// table (router.h) through one pipeline:
//
//   request id (X-Request-Id accepted when sane, else generated; echoed)
//   -> Host and Origin (request_guard.h; every route but the public ones)
//   -> auth (Bearer token; the token's name scopes Idempotency-Keys, or
//      without tokens the Idem-Caller header's name, else one shared scope)
//   -> rate limit (server.rate_limit: a token bucket per caller, 429 with
//      Retry-After; not the public routes nor /metrics)
//   -> Idempotency-Key header syntax (400 before anything else)
//   -> body: Content-Type application/json (415), size limit (413), JSON with depth limit
//   (400/413), schema (400)
//   -> Idempotency-Key record: replay / 422 / 409 / wait / new
//   -> handler (its key's lease renewed every lease/3 while it runs, so a
//      retry of a long request is 409 or waits instead of running it twice)
//   -> response stored under the key (5xx included) unless it is
//      a validation failure (400, 404, 413, 415, 422), which forgets the key
//      so a corrected retry can reuse it, or not final (202, or
//      RouteResponse::transient: the work still moves), which releases the
//      key so a retry runs again and reports the work's state then.
//
// Every error is problem+json (problem.h): unknown paths 404, a known path
// with another method 405 (with Allow), framing errors as http1.h says.
// HEAD is answered by the path's GET route (its roles, limits and
// handler), with the GET answer's fields and no body.
//
// Journal claims, completes and fails without an Idempotency-Key take the
// batch lane: the same pipeline up to the handler, then one
// Journal::BeginOps per event-loop round (router.h, JournalLane), answered
// once the merged write is durable.
//
// Thread-safety: Start/Stop from one thread; handlers run on the server's
// pool (ServerConfig.threads), journal batches on its event loops.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "daemon/config/config.h"
#include "daemon/core/env.h"
#include "daemon/http/event_server.h"
#include "daemon/http/rate_limiter.h"
#include "daemon/http/request_guard.h"
#include "daemon/http/router.h"
#include "daemon/obs/metrics.h"
#include "daemon/store/store.h"

namespace idem {

struct ServerDeps {
  const Config& config;
  IdemKeyStore& idem_keys;
  Journal& journal;  // the batch lane's BeginOps
  StableClock& clock;
  Metrics& metrics;
};

class HttpServer : private BatchLane {
 public:
  ~HttpServer();
  // The API schemas are those of schemas/api (ApiSchemaTexts()). Internal
  // when a route names a schema that is not there, or when any schema does
  // not parse or compile: the daemon must not start with a route it cannot
  // validate.
  static StatusOr<std::unique_ptr<HttpServer>> Create(ServerDeps deps, std::vector<Route> routes);
  // The same with the schema texts given (name -> JSON Schema text).
  static StatusOr<std::unique_ptr<HttpServer>> Create(
      ServerDeps deps, std::vector<Route> routes,
      const std::map<std::string, std::string>& schema_texts);

  // Binds `host:port` (port 0: any free port) and serves on background
  // threads. Returns the bound port. Unavailable if the address is taken.
  StatusOr<int> Start(const std::string& host, int port);
  // Stops accepting, answers queued requests 503 and waits up to
  // `timeout_ms` for running ones (EventServer::Drain). True if none runs.
  bool Drain(int64_t timeout_ms);
  void Stop();
  const std::vector<Route>& routes() const { return routes_; }

 private:
  struct CompiledSchemas;
  class KeyWaiters;
  class LeaseRenewer;

  HttpServer(ServerDeps deps, std::vector<Route> routes, std::unique_ptr<CompiledSchemas> schemas);
  // The route for the request's method and path (params filled; a HEAD
  // takes the GET route), or null with `res` holding the 404/405 answer.
  const Route* Find(const http1::Request& req, std::vector<std::string>& params,
                    http1::Response& res) const;
  // The pipeline up to the handler: request id, auth, Idempotency-Key
  // syntax, body and schema. False with `res` holding the error answer.
  bool Admit(const Route& route, const http1::Request& req, http1::Response& res,
             RequestContext& ctx, std::string& canonical_body) const;
  // The handler's result as a RouteResponse (errors as problem bodies).
  RouteResponse Finish(const Route& route, const RequestContext& ctx,
                       StatusOr<RouteResponse> out) const;
  void Respond(const Route& route, const RouteResponse& r, http1::Response& res) const;
  void Fail(http1::Response& res, const Status& st, const std::string& request_id,
            int status_override = 0) const;

  // For the request metrics: the request's route (null: none matched),
  // when it arrived, and whether Handle parked it (observed when answered).
  struct Timing {
    const Route* route;
    std::chrono::steady_clock::time_point started;
    bool parked;
  };
  // On a worker; `deferral` parks a long poll (RouteResponse::long_poll).
  void Handle(const http1::Request& req, http1::Response& res, Deferral& deferral, Timing& timing);
  // The route's metric handles (metrics.h); null: the "unmatched" series.
  const RouteMetrics& MetricsFor(const Route* route) const;

  // BatchLane: journal ops without an Idempotency-Key, on the event loops.
  bool Wants(const http1::Request& req) const override;
  void Prepare(Exchange& ex) override;
  std::unique_ptr<BatchLane::Ticket> Begin(std::span<Exchange*> batch, std::function<void()> wake,
                                           bool others_pending) override;
  void Finish(std::unique_ptr<BatchLane::Ticket> ticket, std::span<Exchange*> batch) override;

  ServerDeps deps_;
  std::vector<Route> routes_;
  std::unique_ptr<CompiledSchemas> schemas_;
  RequestGuard guard_;  // configured by Start, before the first request
  std::unique_ptr<EventServer> server_;
  std::unique_ptr<KeyWaiters> waiters_;      // Prefer: wait on a key in flight
  std::unique_ptr<LeaseRenewer> renewer_;    // the keys of running handlers
  std::unique_ptr<RateLimiter> limiter_;     // null: server.rate_limit is off
  std::vector<RouteMetrics> route_metrics_;  // by index in routes_
  RouteMetrics unmatched_metrics_;
  // routes_ by their number of path segments, in routes_' order: a path
  // only ever matches a route of its own depth (MatchPath), so a lookup
  // tries those alone (a claim was a walk over every route, twice).
  std::vector<std::vector<const Route*>> by_depth_;
  std::span<const Route* const> RoutesOfDepth(std::string_view path) const;
};

}  // namespace idem
