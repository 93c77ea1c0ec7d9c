#include "daemon/http/server.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "daemon/core/crypto.h"
#include "daemon/core/env.h"
#include "daemon/core/failpoints.h"
#include "daemon/core/json.h"
#include "daemon/core/json_schema.h"
#include "daemon/http/api_schemas.h"
#include "daemon/http/idempotency_key.h"
#include "daemon/http/problem.h"
#include "daemon/obs/log.h"
#include "daemon/obs/trace.h"

namespace idem {
namespace {

constexpr int64_t kMaxPreferWaitMs = 60'000;
// How often a Prefer: wait request looks at its key again on a shared store.
constexpr int64_t kSharedKeyPollMs = 200;

bool SaneRequestId(const std::string& id) {
  if (id.empty() || id.size() > 128) return false;
  for (char c : id) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.' || c == ':';
    if (!ok) return false;
  }
  return true;
}

// Responses that mean "the request was not acceptable": nothing ran, so the
// key is forgotten and a corrected retry may reuse it.
bool IsValidationFailure(int status) {
  return status == 400 || status == 404 || status == 413 || status == 415 || status == 422;
}

// Not a final outcome: the work is still moving (see RouteResponse::transient),
// or a 503 that tells the caller to retry (a provider or store outage): a
// retry with the key after its Retry-After runs again, instead of replaying
// "retry later" for the key's whole window.
bool IsTransient(const RouteResponse& r) {
  return r.transient || r.status == 202 ||
         (r.status == 503 && r.body.is_object() && r.body.value("retryable", false));
}

int64_t MicrosSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               t0)
      .count();
}

void WriteJson(http1::Response& res, int status, const Json& body, const char* type) {
  res.status = status;
  res.SetContent(body.dump(-1, ' ', false, Json::error_handler_t::replace), type);
}

using SteadyTime = std::chrono::steady_clock::time_point;

const std::string kAnonymous = "anonymous";
// The rate limiter's bucket for requests whose token is missing or wrong
// (not a token name: names cannot hold parentheses).
const std::string kUnauthenticated = "(unauthenticated)";

// The access log line of one answered request (log.h LogAccess), and its
// trace index entry (a request that may change something: not a GET).
// `route` is null when no route matched; `ctx` is as far as Admit got.
// Never a header value, a query or a body: those may carry secrets.
void LogRequest(const std::string& method, const std::string& path, const http1::Response& res,
                const Route* route, const RequestContext& ctx, std::string_view idempotency,
                SteadyTime start, bool lane) {
  const bool traced =
      route != nullptr && !ctx.trace.trace_id.empty() && method != "GET" && method != "HEAD";
  const bool logged = AccessLogEnabled();
  if (!traced && !logged) return;
  const auto elapsed = std::chrono::steady_clock::now() - start;
  const double duration_ms =
      static_cast<double>(
          static_cast<int64_t>(std::chrono::duration<double, std::milli>(elapsed).count() * 1000)) /
      1000.0;
  const std::string& request_id =
      ctx.request_id.empty() ? res.HeaderValue("X-Request-Id") : ctx.request_id;
  const std::string& caller = ctx.caller.empty() ? kAnonymous : ctx.caller;
  if (logged) {
    Json fields = {{"method", method},         {"route", route != nullptr ? route->pattern : ""},
                   {"status", res.status},     {"duration_ms", duration_ms},
                   {"request_id", request_id}, {"trace_id", ctx.trace.trace_id},
                   {"caller", caller},         {"idempotency", idempotency}};
    if (lane) fields["lane"] = "batch";
    LogAccess(fields);
  }
  if (!traced) return;
  RecordTraceEventIn(
      ctx.trace.trace_id, "request", request_id,
      JsonObjectWriter()
          .Str("method", method)
          .Str("route", route->pattern)
          .Str("path", path)
          .Int("status", res.status)
          .Str("caller", caller)
          .Double("duration_ms", duration_ms)
          .Int("started_at_ms", std::chrono::duration_cast<std::chrono::milliseconds>(
                                    (std::chrono::system_clock::now() - elapsed).time_since_epoch())
                                    .count())
          .Str("idempotency", idempotency)
          .Take());
}

// LogRequest when it goes out of scope (every return of Handle).
class AccessLine {
 public:
  AccessLine(const http1::Request& req, const http1::Response& res, const RequestContext& ctx)
      : req_(req), res_(res), ctx_(ctx), start_(std::chrono::steady_clock::now()) {}
  ~AccessLine() {
    if (!deferred)
      LogRequest(req_.method, req_.path, res_, route, ctx_, idempotency, start_, false);
  }
  AccessLine(const AccessLine&) = delete;
  AccessLine& operator=(const AccessLine&) = delete;

  const Route* route = nullptr;
  std::string_view idempotency = "none";
  bool deferred = false;  // a parked long poll: logged when it is answered

 private:
  const http1::Request& req_;
  const http1::Response& res_;
  const RequestContext& ctx_;
  SteadyTime start_;
};

}  // namespace

struct HttpServer::CompiledSchemas {
  std::map<std::string, std::unique_ptr<JsonSchema>> by_name;
};

// Requests waiting (Prefer: wait) for an Idempotency-Key that another
// request holds. The holder calls Ended once it has stored, released or
// forgotten the key, which wakes the key's waiters of this process to look
// at the record again; a waiter thread sleeps meanwhile instead of
// re-reading the store. On a shared store (PostgreSQL) the holder may be
// another daemon, whose end wakes nobody here: waiters look again every
// kSharedKeyPollMs. Shutdown (the drain) wakes every waiter at once: a
// request that only waits has nothing to finish.
class HttpServer::KeyWaiters {
  struct Entry {
    uint64_t ends = 0;
    int watchers = 0;
    std::condition_variable cv;
  };

 public:
  // Registered before the waiter's first Begin, so that an end between that
  // Begin and the wait is not missed.
  class Watch {
   public:
    Watch(KeyWaiters& owner, std::string id) : owner_(owner), id_(std::move(id)) {
      std::lock_guard<std::mutex> lock(owner_.mu_);
      entry_ = &owner_.entries_[id_];
      ++entry_->watchers;
      seen_ = entry_->ends;
    }
    ~Watch() {
      std::lock_guard<std::mutex> lock(owner_.mu_);
      if (--entry_->watchers == 0) owner_.entries_.erase(id_);
    }
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;

    // Sleeps until the key's holder ends (true), `timeout` passes or the
    // server drains (false).
    bool WaitForEnd(std::chrono::milliseconds timeout) {
      std::unique_lock<std::mutex> lock(owner_.mu_);
      bool ended = entry_->cv.wait_for(lock, timeout,
                                       [&] { return entry_->ends != seen_ || owner_.stopping_; });
      ended = entry_->ends != seen_;
      seen_ = entry_->ends;
      return ended;
    }

   private:
    KeyWaiters& owner_;
    std::string id_;
    Entry* entry_ = nullptr;
    uint64_t seen_ = 0;
  };

  void Shutdown() {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (auto& [id, entry] : entries_) entry.cv.notify_all();
  }
  bool Stopping() {
    std::lock_guard<std::mutex> lock(mu_);
    return stopping_;
  }

  void Ended(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end()) return;  // nobody waits: the usual case
    ++it->second.ends;
    it->second.cv.notify_all();
  }

  static std::string Id(const std::string& scope, const std::string& key) {
    return scope + '\n' + key;  // neither a caller name nor a key has a newline
  }

 private:
  std::mutex mu_;
  std::map<std::string, Entry> entries_;  // node-based: an Entry never moves
  bool stopping_ = false;
};

// Keeps the Idempotency-Keys of running handlers theirs: a handler that
// runs longer than idempotency.lease (a long /v1/runs) would otherwise lose
// its key to a retry, which would start the same work a second time. One
// thread for the whole server wakes every lease/3 and extends the lease of
// each key held for at least that long (IdemKeyStore::ExtendLease), so a
// lease is renewed while a third of it is still left. A key whose holder
// stops renewing (the process hangs, the disk refuses the write) can still
// be taken over once its lease runs out.
class HttpServer::LeaseRenewer {
  struct Held {
    std::string scope;
    std::string key;
    std::string fingerprint;
    std::string request_id;
    int64_t lease_until_ms = 0;
  };

 public:
  LeaseRenewer(IdemKeyStore& keys, StableClock& clock, Metrics& metrics, int64_t lease_ms)
      : keys_(keys),
        clock_(clock),
        metrics_(metrics),
        lease_ms_(lease_ms),
        interval_ms_(std::max<int64_t>(1, lease_ms / 3)) {}
  ~LeaseRenewer() { Stop(); }
  LeaseRenewer(const LeaseRenewer&) = delete;
  LeaseRenewer& operator=(const LeaseRenewer&) = delete;

  // The caller holds (scope, key) until `lease_until_ms` (its Begin was
  // kNew). Returns the ticket to Drop once the handler has returned.
  uint64_t Hold(const RequestContext& ctx, const std::string& fingerprint, int64_t lease_until_ms) {
    return Hold(ctx.caller, ctx.idempotency_key, fingerprint, ctx.request_id, lease_until_ms);
  }
  uint64_t Hold(const std::string& scope, const std::string& key, const std::string& fingerprint,
                const std::string& request_id, int64_t lease_until_ms) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!thread_.joinable() && !stopped_)
      thread_ = std::thread([this] {
        NameThread("key-lease");
        Loop();
      });
    uint64_t ticket = ++next_ticket_;
    held_[ticket] = Held{scope, key, fingerprint, request_id, lease_until_ms};
    return ticket;
  }

  // Before the key is finished, released or forgotten. A renewal already on
  // its way is then refused by the store (the key is no longer in progress).
  void Drop(uint64_t ticket) {
    std::lock_guard<std::mutex> lock(mu_);
    held_.erase(ticket);
  }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopped_ = true;
      cv_.notify_all();
    }
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopped_) {
      cv_.wait_for(lock, std::chrono::milliseconds(interval_ms_), [&] { return stopped_; });
      if (stopped_) break;
      const int64_t now = clock_.NowMillis();
      std::vector<std::pair<uint64_t, Held>> due;
      for (const auto& entry : held_) {
        // Held for an interval or more since its lease was last set.
        if (entry.second.lease_until_ms - now <= lease_ms_ - interval_ms_) due.push_back(entry);
      }
      if (due.empty()) continue;
      lock.unlock();
      for (auto& entry : due) {
        const Held& h = entry.second;
        Status st = keys_.ExtendLease(h.scope, h.key, h.fingerprint, h.request_id, now, lease_ms_);
        if (st.ok()) {
          entry.second.lease_until_ms = now + lease_ms_;
        } else if (st.code() != Code::kFailedPrecondition) {  // that one: the handler ended
          metrics_.idem_key_store_errors.Inc();
          LogEvent(LogLevel::kWarn, "idempotency_lease_renewal_failed",
                   {{"request_id", h.request_id}, {"error", st.ToString()}});
        }
      }
      lock.lock();
      for (const auto& entry : due) {
        auto it = held_.find(entry.first);
        if (it != held_.end()) it->second.lease_until_ms = entry.second.lease_until_ms;
      }
    }
  }

  IdemKeyStore& keys_;
  StableClock& clock_;
  Metrics& metrics_;
  const int64_t lease_ms_;
  const int64_t interval_ms_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Held> held_;
  uint64_t next_ticket_ = 0;
  bool stopped_ = false;
  std::thread thread_;
};

HttpServer::HttpServer(ServerDeps deps, std::vector<Route> routes,
                       std::unique_ptr<CompiledSchemas> schemas)
    : deps_(deps),
      routes_(std::move(routes)),
      schemas_(std::move(schemas)),
      waiters_(std::make_unique<KeyWaiters>()),
      renewer_(std::make_unique<LeaseRenewer>(deps_.idem_keys, deps_.clock, deps_.metrics,
                                              deps_.config.idempotency.lease_ms)) {
  // Each route's series, resolved once: a request's observation is two
  // atomic adds (metrics.h).
  for (const Route& r : routes_) {
    route_metrics_.push_back(deps_.metrics.ForRoute(r.method + " " + r.pattern));
    if (by_depth_.size() <= r.segments.size()) by_depth_.resize(r.segments.size() + 1);
    by_depth_[r.segments.size()].push_back(&r);
  }
  unmatched_metrics_ = deps_.metrics.ForRoute("unmatched");
  const ServerConfig& sc = deps_.config.server;
  if (sc.rate_limit.requests_per_s > 0) {
    limiter_ = std::make_unique<RateLimiter>(sc.rate_limit.requests_per_s,
                                             std::max(1, sc.rate_limit.burst));
  }
  EventServerOptions options;
  options.workers = sc.threads;
  // Two loops keep both cores busy while one of them waits for a batch's fsync.
  options.loops = 2;
  options.limits.max_body_bytes = sc.max_body_bytes;
  options.max_connections = sc.max_connections;
  options.max_queue = sc.max_queue;
  options.idle_timeout_s = 30;
  options.unix_socket = sc.unix_socket;
  options.unix_socket_mode = sc.unix_socket_mode;
  EventServer::Callbacks callbacks;
  callbacks.deferring_handler = [this](const http1::Request& req, http1::Response& res,
                                       Deferral& deferral) {
    Timing timing{nullptr, std::chrono::steady_clock::now(), false};
    Handle(req, res, deferral, timing);
    // A parked request is observed when its answer is written.
    if (!timing.parked) MetricsFor(timing.route).Observe(res.status, MicrosSince(timing.started));
  };
  callbacks.batch_lane = this;
  // Liveness is answered by the event loop itself: a daemon whose handlers
  // are all busy is alive, and an orchestrator's probe must not restart it
  // for that (the handler is a constant; it neither blocks nor parks).
  callbacks.on_loop = [](const http1::Request& req) {
    return (req.method == "GET" || req.method == "HEAD") && req.path == "/healthz";
  };
  callbacks.on_refusal = [this](EventServer::Refusal r) {
    switch (r) {
      case EventServer::Refusal::kConnectionShed:
        deps_.metrics.http_connections_shed.Inc();
        break;
      case EventServer::Refusal::kQueueFull:
        deps_.metrics.http_queue_full.Inc();
        break;
      case EventServer::Refusal::kAcceptPaused:
        deps_.metrics.http_accept_paused.Inc();
        break;
    }
  };
  callbacks.error_handler = [this](int status, const std::string& message, std::string_view field,
                                   http1::Response& res, const http1::Request* req) {
    // A request refused whole (a full queue, a drain) counts under its
    // route and keeps the id it came with; one that did not parse has
    // neither. Either way it gets its access line, so the request_id in
    // the problem can be found in the log.
    const Route* route = nullptr;
    std::string rid = req != nullptr ? req->HeaderValue("X-Request-Id") : "";
    if (!SaneRequestId(rid)) rid = RandomHex(8);
    if (req != nullptr) {
      std::vector<std::string> params;
      for (const Route* r : RoutesOfDepth(req->path)) {
        if (MatchPath(*r, req->path, &params) &&
            (r->method == req->method || (req->method == "HEAD" && r->method == "GET"))) {
          route = r;
          break;
        }
        params.clear();
      }
    }
    Fail(res, StatusForRefusal(status, message).WithField(std::string(field)), rid, status);
    MetricsFor(route).Count(status);
    if (AccessLogEnabled()) {
      LogAccess({{"method", req != nullptr ? req->method : ""},
                 {"route", route != nullptr ? route->pattern : ""},
                 {"status", status},
                 {"duration_ms", 0},
                 {"request_id", rid},
                 {"refused", message}});
    }
  };
  server_ = std::make_unique<EventServer>(options, std::move(callbacks));
}

HttpServer::~HttpServer() { Stop(); }

StatusOr<std::unique_ptr<HttpServer>> HttpServer::Create(ServerDeps deps,
                                                         std::vector<Route> routes) {
  return Create(deps, std::move(routes), ApiSchemaTexts());
}

StatusOr<std::unique_ptr<HttpServer>> HttpServer::Create(
    ServerDeps deps, std::vector<Route> routes,
    const std::map<std::string, std::string>& schema_texts) {
  auto schemas = std::make_unique<CompiledSchemas>();
  for (const auto& [name, text] : schema_texts) {
    Json j = Json::parse(text, nullptr, false);
    if (j.is_discarded()) return Internal("API schema " + name + " is not valid JSON");
    auto compiled = JsonSchema::Create(j);
    if (!compiled.ok()) {
      return Internal("API schema " + name + " does not compile: " + compiled.status().ToString());
    }
    schemas->by_name[name] = std::move(compiled).value();
  }
  for (Route& r : routes) {
    CompileRoute(r);
    if (!r.request_schema.empty() && schemas->by_name.count(r.request_schema) == 0) {
      return Internal("route " + r.method + " " + r.pattern + " names schema " + r.request_schema +
                      " which is not in schemas/api");
    }
  }
  // A window for a route that takes no Idempotency-Key (a typo, a GET)
  // would apply to nothing, silently: the config names it wrongly.
  for (const auto& [name, window] : deps.config.idempotency.route_windows_ms) {
    std::string keyed;
    bool found = false;
    for (const Route& r : routes) {
      if (r.key_policy == KeyPolicy::kNone) continue;
      found = found || r.method + " " + r.pattern == name;
      keyed += (keyed.empty() ? "" : ", ") + r.method + " " + r.pattern;
    }
    if (!found) {
      return InvalidArgument(
          "\"" + name + "\" is no route that takes an Idempotency-Key (those are: " + keyed + ")",
          "/idempotency/routes/" + JsonPointerToken(name));
    }
  }
  return std::unique_ptr<HttpServer>(new HttpServer(deps, std::move(routes), std::move(schemas)));
}

StatusOr<int> HttpServer::Start(const std::string& host, int port) {
  guard_.Configure(deps_.config.server, host, port);
  StatusOr<int> bound = server_->Start(host, port);
  if (bound.ok()) guard_.SetBoundPort(*bound);
  return bound;
}

bool HttpServer::Drain(int64_t timeout_ms) {
  waiters_->Shutdown();  // a Prefer: wait request answers now (409, in progress)
  return server_ == nullptr || server_->Drain(timeout_ms);
}

void HttpServer::Stop() {
  if (server_) server_->Stop();
  if (renewer_) renewer_->Stop();  // after the handlers: their keys stay theirs until then
}

void HttpServer::Fail(http1::Response& res, const Status& st, const std::string& request_id,
                      int status_override) const {
  int status = status_override != 0 ? status_override : HttpStatusFor(st.code());
  if (status >= 500) {
    deps_.metrics.http_errors_5xx.Inc();
  } else {
    deps_.metrics.http_errors_4xx.Inc();
  }
  if (res.HeaderValue("X-Request-Id").empty()) res.SetHeader("X-Request-Id", request_id);
  if (status == 503 && st.retryable() && res.HeaderValue("Retry-After").empty()) {
    res.SetHeader("Retry-After", "1");
  }
  WriteJson(res, status, ProblemBody(status, st, request_id), kProblemContentType);
}

const Route* HttpServer::Find(const http1::Request& req, std::vector<std::string>& params,
                              http1::Response& res) const {
  std::string allow;
  // HEAD is answered by the GET route, whose roles and limits it takes; the
  // event server leaves the body out (RFC 9110 9.3.2: a server that serves
  // GET serves HEAD).
  const bool head = req.method == "HEAD";
  for (const Route* r : RoutesOfDepth(req.path)) {
    if (!MatchPath(*r, req.path, &params)) continue;
    if (r->method == req.method || (head && r->method == "GET")) return r;
    params.clear();
    // A route that only documents its own 405 (GET /mcp: no server stream)
    // is not a method the path takes.
    if (r->responses.size() == 1 && r->responses.begin()->first == 405) continue;
    auto add = [&allow](std::string_view m) {
      if (allow.find(m) != std::string::npos) return;
      if (!allow.empty()) allow += ", ";
      allow += m;
    };
    add(r->method);
    if (r->method == "GET") add("HEAD");
  }
  std::string rid = req.HeaderValue("X-Request-Id");
  if (!SaneRequestId(rid)) rid = RandomHex(8);
  if (allow.empty()) {
    Fail(res, NotFound("no route for " + req.method + " " + req.path), rid, 404);
  } else {
    res.SetHeader("Allow", allow);
    Fail(res, InvalidArgument(req.path + " does not take " + req.method + "; it takes " + allow),
         rid, 405);
  }
  return nullptr;
}

bool HttpServer::Admit(const Route& route, const http1::Request& req, http1::Response& res,
                       RequestContext& ctx, std::string& canonical_body) const {
  ctx.method = req.method;
  ctx.path = req.path;
  std::string rid = req.HeaderValue("X-Request-Id");
  ctx.request_id = SaneRequestId(rid) ? rid : RandomHex(8);
  res.SetHeader("X-Request-Id", ctx.request_id);
  // W3C Trace Context: the caller's trace, or a new one; never refused.
  std::string tracestate;
  for (size_t i = 0; i < req.HeaderCount("tracestate") && i < kMaxTracestateMembers; ++i) {
    tracestate += (tracestate.empty() ? "" : ",") + req.HeaderValue("tracestate", i);
  }
  // Two traceparent headers name no one parent: the request starts a new
  // trace, as for an invalid one (W3C Trace Context's test suite,
  // test_traceparent_duplicated).
  const std::string traceparent =
      req.HeaderCount("traceparent") == 1 ? req.HeaderValue("traceparent") : std::string();
  ctx.trace = TraceContext::FromHeaders(traceparent, tracestate, ctx.request_id);
  res.SetHeader("traceresponse",
                FormatTraceparent(ctx.trace.trace_id, ctx.trace.span_id, ctx.trace.flags));

  // Browsers: cross-site requests and DNS rebinding (request_guard.h).
  std::optional<Refusal> refused;
  if (!route.is_public) {
    refused = guard_.CheckSource(req);
  } else if (route.browser_origin_checked) {
    refused = guard_.CheckOrigin(req);
  }
  if (refused) {
    Fail(res, refused->status, ctx.request_id, refused->http_status);
    return false;
  }

  // Auth: a Bearer token whose sha256 is configured; the token's name is the caller.
  ctx.caller = "anonymous";
  const auto& tokens = deps_.config.auth.tokens;
  if (tokens.empty() && !route.is_public) {
    // No identities: a caller may still name itself to get its own
    // Idempotency-Key scope (with tokens, the token's name does that).
    auto named = IdemCaller(req);
    if (!named.ok()) {
      Fail(res, named.status(), ctx.request_id);
      return false;
    }
    if (named->has_value()) ctx.caller = **named;
  }
  if (!tokens.empty() && !route.is_public) {
    // Two credentials: a proxy in front and this daemon might each read
    // another one.
    if (req.HeaderCount("Authorization") > 1) {
      Fail(res, InvalidArgument("send one Authorization header", "header:Authorization"),
           ctx.request_id);
      return false;
    }
    const AuthToken* who = nullptr;
    const bool credentials_sent = !req.HeaderValue("Authorization").empty();
    if (auto credentials = BearerCredentials(req.HeaderValue("Authorization"))) {
      std::string digest = Sha256Hex(*credentials);
      for (const auto& t : tokens) {
        if (ConstantTimeEquals(digest, t.sha256)) who = &t;
      }
    }
    if (who == nullptr) {
      // Guesses share one bucket of server.rate_limit: they cannot be
      // told apart, and a caller with a valid token never draws from it.
      if (limiter_ != nullptr) {
        RateLimiter::Verdict v = limiter_->Take(kUnauthenticated, deps_.clock.NowMillis());
        if (!v.allowed) {
          deps_.metrics.http_rate_limited.Inc();
          res.SetHeader("Retry-After", std::to_string((v.retry_after_ms + 999) / 1000));
          Fail(res,
               Status(Code::kResourceExhausted,
                      "too many requests without a valid token; retry after " +
                          std::to_string(v.retry_after_ms) + " ms",
                      "", /*retryable=*/true),
               ctx.request_id, 429);
          return false;
        }
      }
      Fail(res, Status(Code::kUnauthenticated, "a valid Bearer token is required"), ctx.request_id);
      // RFC 9110 11.6.1: a 401 names its scheme; RFC 6750 3.1: and says a
      // token that was sent is not valid.
      res.SetHeader("WWW-Authenticate", credentials_sent
                                            ? R"(Bearer realm="idem", error="invalid_token")"
                                            : R"(Bearer realm="idem")");
      return false;
    }
    if (!route.roles.empty()) {
      if (!AuthConfig::TokenHolds(*who, route.roles)) {
        Fail(res,
             Status(Code::kPermissionDenied,
                    "token '" + who->name + "' lacks the role for this route"),
             ctx.request_id);
        return false;
      }
    }
    ctx.caller = who->name;
  }

  // Per caller, after auth named it; probes and scrapes are never limited.
  if (limiter_ != nullptr && !route.is_public && route.pattern != "/metrics") {
    RateLimiter::Verdict v = limiter_->Take(ctx.caller, deps_.clock.NowMillis());
    if (!v.allowed) {
      deps_.metrics.http_rate_limited.Inc();
      res.SetHeader("Retry-After", std::to_string((v.retry_after_ms + 999) / 1000));
      Fail(res,
           Status(Code::kResourceExhausted,
                  "caller '" + ctx.caller + "' is past server.rate_limit; retry after " +
                      std::to_string(v.retry_after_ms) + " ms",
                  "", /*retryable=*/true),
           ctx.request_id, 429);
      return false;
    }
    ctx.take_rate_token = [this, caller = ctx.caller] {
      const bool allowed = limiter_->Take(caller, deps_.clock.NowMillis()).allowed;
      if (!allowed) deps_.metrics.http_rate_limited.Inc();
      return allowed;
    };
  }

  // Handlers that take keys of their own (the inbox's event ids: routes
  // that take the body raw) keep them renewed while they run.
  if (route.raw_body) {
    ctx.hold_key = [this, request_id = ctx.request_id](
                       const std::string& scope, const std::string& key,
                       const std::string& fingerprint, int64_t lease_until_ms) {
      return renewer_->Hold(scope, key, fingerprint, request_id, lease_until_ms);
    };
    ctx.drop_key = [this](uint64_t ticket) { renewer_->Drop(ticket); };
  }

  // Idempotency-Key syntax first: a malformed or missing key is refused
  // before the body is even looked at.
  if (route.key_policy != KeyPolicy::kNone) {
    std::vector<std::string> values;
    size_t n = req.HeaderCount("Idempotency-Key");
    for (size_t i = 0; i < n; ++i) values.push_back(req.HeaderValue("Idempotency-Key", i));
    auto key = ParseIdempotencyKey(values);
    if (!key.ok()) {
      Fail(res, key.status(), ctx.request_id);
      return false;
    }
    ctx.idempotency_key = std::move(key).value();
    if (ctx.idempotency_key.empty()) {
      if (route.key_policy == KeyPolicy::kRequired) {
        deps_.metrics.idem_key_missing.Inc();
        Fail(res,
             InvalidArgument("this route requires an Idempotency-Key header",
                             "header:Idempotency-Key"),
             ctx.request_id);
        return false;
      }
      deps_.metrics.idem_key_optional_absent.Inc();
    }
  }

  for (const auto& [k, v] : req.query) {
    // A parameter sent twice (?state=a&state=b): one of them would filter
    // silently, and a proxy in front might take the other.
    if (!ctx.query.emplace(k, v).second) {
      Fail(res, InvalidArgument("send one " + k + " parameter", "query:" + k), ctx.request_id);
      return false;
    }
  }
  for (const std::string& h : route.request_headers) {
    // A header the route reads (an inbox's event id or signature) sent
    // twice: a proxy and this daemon might each take another one.
    if (req.HeaderCount(h) > 1) {
      Fail(res, InvalidArgument("send one " + h + " header", "header:" + h), ctx.request_id);
      return false;
    }
    if (req.HasHeader(h)) ctx.headers[h] = req.HeaderValue(h);
  }
  if (route.raw_body && !route.raw_body_types.empty()) {
    if (auto refused = RequestGuard::CheckContentType(req, route.raw_body_types)) {
      Fail(res, refused->status, ctx.request_id, refused->http_status);
      return false;
    }
  }
  if (route.raw_body) ctx.raw_body = req.body;

  if (!route.request_schema.empty()) {
    if (auto refused = RequestGuard::CheckContentType(req)) {
      Fail(res, refused->status, ctx.request_id, refused->http_status);
      return false;
    }
    JsonLimits limits;
    limits.max_bytes = deps_.config.server.max_body_bytes;
    limits.max_depth = deps_.config.server.max_json_depth;
    limits.exact_integer_literals = true;
    // A refused body, as problem+json or in the route's own terms.
    // One that names no field is about the body as a whole: pointer ""
    // (RFC 6901: the whole document).
    auto refuse_body = [&](const Status& refused, bool not_json) {
      const Status why = refused.field().empty() ? refused.WithField(kWholeBody) : refused;
      if (!route.body_refusal) return Fail(res, why, ctx.request_id);
      Fail(res, why, ctx.request_id);  // counts it, sets X-Request-Id
      res.SetContent(route.body_refusal(why, not_json), "application/json");
    };
    if (req.body.empty()) {
      refuse_body(InvalidArgument("a JSON body is required", ""), /*not_json=*/true);
      return false;
    }
    auto body = ParseJson(req.body, limits);
    if (!body.ok()) {
      // Nesting too deep is JSON all the same (MCP's -32600, not -32700).
      const Status why = BodyParseError(body.status(), req.body.size(), limits.max_bytes);
      const bool too_deep = why.code() != body.status().code();
      refuse_body(why, /*not_json=*/!too_deep);
      return false;
    }
    ctx.body = std::move(body).value();
    auto sit = schemas_->by_name.find(route.request_schema);
    if (sit != schemas_->by_name.end()) {
      Status valid = sit->second->Validate(ctx.body);
      if (!valid.ok()) {
        refuse_body(valid, /*not_json=*/false);
        return false;
      }
    }
    if (!ctx.idempotency_key.empty()) {
      auto canon = CanonicalJson(ctx.body);
      if (!canon.ok()) {
        Fail(res, canon.status(), ctx.request_id);
        return false;
      }
      canonical_body = std::move(canon).value();
    }
  }
  return true;
}

RouteResponse HttpServer::Finish(const Route& route, const RequestContext& ctx,
                                 StatusOr<RouteResponse> out) const {
  if (out.ok()) return std::move(out).value();
  int status = HttpStatusFor(out.status().code());
  Status why = out.status();
  // A 404 that names nothing is about what the path names: its last
  // parameter, the most specific (/v1/work/{id}/complete: path:id).
  if (why.code() == Code::kNotFound && why.field().empty() && !route.param_names.empty()) {
    why = why.WithField("path:" + route.param_names.back());
  }
  RouteResponse r;
  r.status = status;
  r.body = ProblemBody(status, why, ctx.request_id);
  // A 503 the caller may retry says when (RFC 9110 10.2.3): a provider or
  // store outage, as the server's own overload answers do.
  if (status == 503 && why.retryable()) r.headers.emplace_back("Retry-After", "1");
  if (status >= 500) {
    LogEvent(LogLevel::kWarn, "request_failed",
             {{"request_id", ctx.request_id},
              {"route", route.method + " " + route.pattern},
              {"error", out.status().ToString()}});
  }
  return r;
}

void HttpServer::Respond(const Route& route, const RouteResponse& r, http1::Response& res) const {
  for (const auto& [k, v] : r.headers) res.SetHeader(k, v);
  if (r.status >= 500) deps_.metrics.http_errors_5xx.Inc();
  if (r.status >= 400 && r.status < 500) deps_.metrics.http_errors_4xx.Inc();
  if (!r.content_type.empty() && r.body.is_string()) {
    res.status = r.status;
    res.SetContent(r.body.get<std::string>(), r.content_type);
  } else if (route.raw_text && r.body.is_string()) {
    res.status = r.status;
    res.SetContent(r.body.get<std::string>(), "text/plain; version=0.0.4");
  } else {
    WriteJson(res, r.status, r.body, r.status >= 400 ? kProblemContentType : "application/json");
  }
}

bool HttpServer::Wants(const http1::Request& req) const {
  if (req.method != "POST" || req.HasHeader("Idempotency-Key")) return false;
  std::vector<std::string> params;
  for (const Route* r : RoutesOfDepth(req.path)) {
    if (r->method == "POST" && MatchPath(*r, req.path, &params)) return r->journal_lane.has_value();
  }
  return false;
}

std::span<const Route* const> HttpServer::RoutesOfDepth(std::string_view path) const {
  // MatchPath's segments: what follows the leading slash, split at every
  // slash (a path without one matches nothing).
  if (!path.starts_with('/')) return {};
  const size_t depth = static_cast<size_t>(std::count(path.begin(), path.end(), '/'));
  if (depth >= by_depth_.size()) return {};
  return by_depth_[depth];
}

namespace {

// A batch-lane request between Prepare and Finish.
struct LaneState {
  const Route* route = nullptr;
  std::chrono::steady_clock::time_point started;
  RequestContext ctx;
  JournalOp op;
};

class LaneTicket final : public BatchLane::Ticket {
 public:
  bool Ready() const override { return pending == nullptr || pending->Ready(); }
  std::unique_ptr<Journal::PendingOps> pending;
  std::vector<size_t> index;  // batch position of each op
};

}  // namespace

void HttpServer::Prepare(Exchange& ex) {
  const auto t0 = std::chrono::steady_clock::now();
  auto st = std::make_shared<LaneState>();
  st->started = t0;
  // Logged here unless the request goes on to Begin (then Finish logs it).
  struct AnsweredNow {
    Exchange& ex;
    LaneState& st;
    ~AnsweredNow() {
      if (ex.answered) {
        LogRequest(ex.request.method, ex.request.path, ex.response, st.route, st.ctx, "none",
                   st.started, true);
      }
    }
  } log_if_answered{ex, *st};
  std::vector<std::string> params;
  const Route* route = Find(ex.request, params, ex.response);
  ex.answered = true;
  // Answered here (refused, gated): observed now; else when Finish answers.
  struct ObserveIfAnswered {
    const HttpServer& server;
    const Route* route;
    const Exchange& ex;
    std::chrono::steady_clock::time_point t0;
    ~ObserveIfAnswered() {
      if (ex.answered) server.MetricsFor(route).Observe(ex.response.status, MicrosSince(t0));
    }
  } observe{*this, route, ex, t0};
  if (route == nullptr) return;
  st->route = route;
  st->started = t0;
  st->ctx.params = std::move(params);
  std::string canonical_body;
  if (!Admit(*route, ex.request, ex.response, st->ctx, canonical_body)) return;
  TraceScope scope(st->ctx.trace);
  if (!st->ctx.idempotency_key.empty()) {
    // Wants() saw no key, so this cannot happen; the ordinary path if it does.
    Respond(*route, Finish(*route, st->ctx, RunHandler(*route, st->ctx)), ex.response);
    return;
  }
  if (route->journal_lane->gate) {
    // Only kinds that need approval do any work here (a plan read).
    std::optional<StatusOr<RouteResponse>> answer =
        RunGuardedStep([&] { return route->journal_lane->gate(st->ctx); });
    if (answer) {
      Respond(*route, Finish(*route, st->ctx, std::move(*answer)), ex.response);
      return;
    }
  }
  StatusOr<JournalOp> op = RunGuardedStep([&] { return route->journal_lane->prepare(st->ctx); });
  if (!op.ok()) {
    Respond(*route, Finish(*route, st->ctx, op.status()), ex.response);
    return;
  }
  st->op = std::move(op).value();
  ex.state = std::move(st);
  ex.answered = false;
}

std::unique_ptr<BatchLane::Ticket> HttpServer::Begin(std::span<Exchange*> batch,
                                                     std::function<void()> wake,
                                                     bool others_pending) {
  auto ticket = std::make_unique<LaneTicket>();
  std::vector<JournalOp> ops;
  ops.reserve(batch.size());
  // Moved, not copied (a claim's op holds its identity and args), and
  // moved back below: a skipped op is begun again.
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i]->answered) continue;
    ops.push_back(std::move(static_cast<LaneState*>(batch[i]->state.get())->op));
    ticket->index.push_back(i);
  }
  if (!ops.empty()) {
    ticket->pending = deps_.journal.BeginOps(
        ops, std::move(wake),
        others_pending ? Journal::LockWait::kSkipBusy : Journal::LockWait::kBlock);
  }
  for (size_t k = 0; k < ops.size(); ++k) {
    static_cast<LaneState*>(batch[ticket->index[k]]->state.get())->op = std::move(ops[k]);
  }
  return ticket;
}

void HttpServer::Finish(std::unique_ptr<BatchLane::Ticket> ticket, std::span<Exchange*> batch) {
  auto& t = static_cast<LaneTicket&>(*ticket);
  if (t.pending == nullptr) return;
  std::vector<size_t> skipped = t.pending->Skipped();
  std::vector<StatusOr<JournalOpResult>> results = deps_.journal.FinishOps(std::move(t.pending));
  size_t next_skipped = 0;  // Skipped() is in ascending order
  for (size_t k = 0; k < t.index.size(); ++k) {
    Exchange& ex = *batch[t.index[k]];
    if (next_skipped < skipped.size() && skipped[next_skipped] == k) {
      ++next_skipped;  // left unanswered: the event loop begins it again
      continue;
    }
    ex.answered = true;
    auto st = std::static_pointer_cast<LaneState>(ex.state);
    const Route& route = *st->route;
    {
      TraceScope scope(st->ctx.trace);
      Respond(route, Finish(route, st->ctx, RunGuardedStep([&] {
                              return route.journal_lane->respond(st->ctx, std::move(results[k]));
                            })),
              ex.response);
    }
    MetricsFor(&route).Observe(ex.response.status, MicrosSince(st->started));
    LogRequest(ex.request.method, ex.request.path, ex.response, st->route, st->ctx, "none",
               st->started, true);
  }
}

const RouteMetrics& HttpServer::MetricsFor(const Route* route) const {
  if (route == nullptr) return unmatched_metrics_;
  return route_metrics_[static_cast<size_t>(route - routes_.data())];
}

void HttpServer::Handle(const http1::Request& req, http1::Response& res, Deferral& deferral,
                        Timing& timing) {
  Metrics& m = deps_.metrics;
  RequestContext ctx;
  AccessLine line(req, res, ctx);
  std::vector<std::string> params;
  const Route* found = Find(req, params, res);
  timing.route = found;
  if (found == nullptr) return;
  const Route& route = *found;
  line.route = found;
  ctx.params = std::move(params);
  std::string canonical_body;
  if (!Admit(route, req, res, ctx, canonical_body)) return;
  TraceScope trace_scope(ctx.trace);  // log lines, provider and effector calls, records

  auto run = [&]() -> RouteResponse { return Finish(route, ctx, RunHandler(route, ctx)); };
  if (ctx.idempotency_key.empty()) {
    RouteResponse out = run();
    if (out.long_poll == nullptr) return Respond(route, out, res);
    // Parked: no worker waits. The answer is built when the poll resumes.
    std::shared_ptr<const LongPoll> poll = std::move(out.long_poll);
    Deferral::Resume resume = deferral.Park();
    timing.parked = true;
    line.deferred = true;
    poll->arm([this, r = &route, ctx, poll, resume, started = timing.started] {
      resume([this, r, ctx, poll, started](http1::Response& answer) {
        {
          TraceScope scope(ctx.trace);
          Respond(*r, Finish(*r, ctx, poll->answer()), answer);
        }
        MetricsFor(r).Observe(answer.status, MicrosSince(started));
        LogRequest(ctx.method, ctx.path, answer, r, ctx, "none", started, false);
      });
    });
    return;
  }

  // The key record: created atomically before any side effect.
  const auto& cfg = deps_.config.idempotency;
  int64_t ttl = cfg.window_ms;
  auto wit = cfg.route_windows_ms.find(route.method + " " + route.pattern);
  if (wit != cfg.route_windows_ms.end()) ttl = wit->second;
  if (route.grant_ms) ttl = ShorterWindow(ttl, route.grant_ms(ctx));
  const std::string fingerprint = RequestFingerprint(req.method, req.path, canonical_body);
  const std::string& scope = ctx.caller;
  // A malformed Prefer is refused before the key is taken.
  std::vector<std::string> prefer;
  for (size_t i = 0; i < req.HeaderCount("Prefer"); ++i) {
    prefer.push_back(req.HeaderValue("Prefer", i));
  }
  StatusOr<int64_t> asked_wait_ms = ParsePreferWait(prefer, kMaxPreferWaitMs);
  if (!asked_wait_ms.ok()) return Fail(res, asked_wait_ms.status(), ctx.request_id);
  const std::string waiter_id = KeyWaiters::Id(scope, ctx.idempotency_key);
  std::optional<KeyWaiters::Watch> watch;
  if (*asked_wait_ms > 0) watch.emplace(*waiters_, waiter_id);
  const int64_t begun_ms = deps_.clock.NowMillis();
  auto begun = deps_.idem_keys.Begin(scope, ctx.idempotency_key, fingerprint, ctx.request_id,
                                     begun_ms, ttl, cfg.lease_ms);
  if (!begun.ok()) {
    m.idem_key_store_errors.Inc();
    return Fail(res, begun.status(), ctx.request_id);
  }
  if (begun->outcome == BeginOutcome::kInFlight && watch) {
    const int64_t until = begun_ms + *asked_wait_ms;
    const bool shared = deps_.config.store.engine == "postgres";
    for (;;) {
      const int64_t now = deps_.clock.NowMillis();
      if (now >= until || waiters_->Stopping()) break;
      // The holder's lease running out lets this request take the key over
      // (a holder stuck past it): look again then, even without an end.
      int64_t wake = until;
      if (begun->record.lease_until_ms > now) wake = std::min(wake, begun->record.lease_until_ms);
      if (shared) wake = std::min(wake, now + kSharedKeyPollMs);  // another daemon's end
      watch->WaitForEnd(std::chrono::milliseconds(std::max<int64_t>(1, wake - now)));
      if (waiters_->Stopping()) break;  // draining: answer in flight now
      // Looked at again at the deadline too: an end that came just then.
      auto again = deps_.idem_keys.Begin(scope, ctx.idempotency_key, fingerprint, ctx.request_id,
                                         deps_.clock.NowMillis(), ttl, cfg.lease_ms);
      if (!again.ok()) break;
      begun = std::move(again);
      if (begun->outcome != BeginOutcome::kInFlight) break;
    }
    if (begun->outcome == BeginOutcome::kReplay) m.idem_key_waited.Inc();
  }
  switch (begun->outcome) {
    case BeginOutcome::kReplay: {
      const IdemRecord& rec = begun->record;
      if (route.grant_holds && !route.grant_holds(rec.response_status, rec.response_body)) {
        // "Yours" would be false now: the answer of the request as it runs now.
        line.idempotency = "grant_ended";
        return Respond(route, run(), res);
      }
      line.idempotency = "replayed";
      m.idem_key_replayed.Inc();
      res.status = rec.response_status;
      // A replayed failure is a failure answered, as the first one was.
      if (res.status >= 500) {
        deps_.metrics.http_errors_5xx.Inc();
      } else if (res.status >= 400) {
        deps_.metrics.http_errors_4xx.Inc();
      }
      res.SetHeader("Idempotent-Replayed", "true");
      res.SetContent(rec.response_body, rec.response_content_type);
      return;
    }
    case BeginOutcome::kMismatch:
      line.idempotency = "mismatch";
      m.idem_key_mismatch.Inc();
      return Fail(
          res,
          Status(Code::kAborted, "this Idempotency-Key was used with a different request payload",
                 "header:Idempotency-Key"),
          ctx.request_id, 422);
    case BeginOutcome::kInFlight:
      line.idempotency = "in_flight";
      m.idem_key_in_flight.Inc();
      res.SetHeader("Retry-After", "1");
      return Fail(res,
                  Status(Code::kAborted,
                         "a request with this Idempotency-Key is still in progress; retry "
                         "later or send Prefer: wait=N",
                         "header:Idempotency-Key"),
                  ctx.request_id, 409);
    case BeginOutcome::kNew:
      line.idempotency = "new";
      break;
  }
  m.idem_key_new.Inc();
  if (Status fp = Failpoints::Hit("http.after_key_begin"); !fp.ok()) {
    return Fail(res, fp, ctx.request_id);
  }

  const uint64_t held = renewer_->Hold(ctx, fingerprint, begun->record.lease_until_ms);
  RouteResponse out = run();
  if (out.long_poll != nullptr) out = Finish(route, ctx, out.long_poll->answer());  // no parking
  renewer_->Drop(held);
  // Abandon and Release end only this request's hold, so a store blip (a
  // connection the database dropped) is tried again rather than leaving
  // the key held, its retries refused, until its lease runs out.
  auto ending = [](const std::function<Status()>& end) {
    Status s;
    for (int attempt = 0; attempt < 3; ++attempt) {
      s = Failpoints::Hit("http.key_end");  // a test's store blip
      if (s.ok()) s = end();
      if (s.ok() || !s.retryable()) break;
    }
    return s;
  };
  if (IsValidationFailure(out.status)) {
    (void)ending([&] { return deps_.idem_keys.Abandon(scope, ctx.idempotency_key, fingerprint); });
  } else if (IsTransient(out)) {
    // Stripe and the IETF draft store final outcomes only: a retry with this
    // key runs the (journal-idempotent) handler again and sees the work's
    // state then, instead of this answer replayed for the whole window.
    Status rel =
        ending([&] { return deps_.idem_keys.Release(scope, ctx.idempotency_key, fingerprint); });
    if (!rel.ok()) {
      m.idem_key_store_errors.Inc();
      LogEvent(LogLevel::kError, "idempotency_release_failed",
               {{"request_id", ctx.request_id}, {"error", rel.ToString()}});
    }
    m.idem_key_released.Inc();
  } else {
    // Stored as Respond sends it: a text body as it is.
    const bool text = !out.content_type.empty() && out.body.is_string();
    const std::string type = text                ? out.content_type
                             : out.status >= 400 ? kProblemContentType
                                                 : "application/json";
    Status fin =
        deps_.idem_keys.Finish(scope, ctx.idempotency_key, fingerprint, out.status,
                               text ? out.body.get<std::string>()
                                    : out.body.dump(-1, ' ', false, Json::error_handler_t::replace),
                               type, deps_.clock.NowMillis());
    if (!fin.ok()) {
      m.idem_key_store_errors.Inc();
      LogEvent(LogLevel::kError, "idempotency_finish_failed",
               {{"request_id", ctx.request_id}, {"error", fin.ToString()}});
    }
    m.key_in_progress.ObserveMicros(std::max<int64_t>(0, deps_.clock.NowMillis() - begun_ms) *
                                    1000);
  }
  waiters_->Ended(waiter_id);  // stored, released or forgotten: waiters look again
  Respond(route, out, res);
}

}  // namespace idem
