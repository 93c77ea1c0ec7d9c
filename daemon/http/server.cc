#include "daemon/http/server.h"

#include <httplib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <chrono>
#include <thread>

#include "daemon/core/crypto.h"
#include "daemon/core/failpoints.h"
#include "daemon/core/json.h"
#include "daemon/core/json_schema.h"
#include "daemon/http/api_schemas.h"
#include "daemon/http/idempotency_key.h"
#include "daemon/http/problem.h"
#include "daemon/obs/log.h"

namespace idem {
namespace {

constexpr int64_t kMaxPreferWaitMs = 60'000;
constexpr int kListenBacklog = 4096;

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

// RFC 7240 "Prefer: wait=N" (seconds). 0 when absent.
int64_t PreferWaitMs(const httplib::Request& req) {
  if (!req.has_header("Prefer")) return 0;
  std::string v = req.get_header_value("Prefer");
  size_t pos = v.find("wait=");
  if (pos == std::string::npos) return 0;
  int64_t secs = std::atoll(v.c_str() + pos + 5);
  return std::clamp<int64_t>(secs * 1000, 0, kMaxPreferWaitMs);
}

void WriteJson(httplib::Response& res, int status, const Json& body, const char* type) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, Json::error_handler_t::replace), type);
}

void WriteProblem(httplib::Response& res, const Status& st, const std::string& request_id,
                  int status_override = 0) {
  int status = status_override != 0 ? status_override : HttpStatusFor(st.code());
  WriteJson(res, status, ProblemBody(status, st, request_id), kProblemContentType);
}

struct CompiledSchemas {
  std::map<std::string, std::unique_ptr<JsonSchema>> by_name;
};

}  // namespace

StatusOr<std::pair<std::string, int>> ParseListen(const std::string& listen) {
  size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= listen.size()) {
    return InvalidArgument("listen address '" + listen + "' is not host:port", "/server/listen");
  }
  std::string host = listen.substr(0, colon);
  if (host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  int port = 0;
  for (char c : listen.substr(colon + 1)) {
    if (c < '0' || c > '9') {
      return InvalidArgument("listen port in '" + listen + "' is not a number", "/server/listen");
    }
    port = port * 10 + (c - '0');
    if (port > 65535) return InvalidArgument("listen port out of range", "/server/listen");
  }
  return std::make_pair(host, port);
}

HttpServer::HttpServer(ServerDeps deps, std::vector<Route> routes)
    : deps_(deps), routes_(std::move(routes)), server_(std::make_unique<httplib::Server>()) {}

HttpServer::~HttpServer() { Stop(); }

StatusOr<std::unique_ptr<HttpServer>> HttpServer::Create(ServerDeps deps,
                                                         std::vector<Route> routes) {
  for (Route& r : routes) {
    CompileRoute(r);
    if (!r.request_schema.empty() && ApiSchemaTexts().count(r.request_schema) == 0) {
      return Internal("route " + r.method + " " + r.pattern + " names schema " + r.request_schema +
                      " which is not in schemas/api");
    }
  }
  std::unique_ptr<HttpServer> server(new HttpServer(deps, std::move(routes)));
  server->Install();
  return server;
}

void HttpServer::Install() {
  httplib::Server& srv = *server_;
  const ServerConfig& sc = deps_.config.server;
  const size_t threads = static_cast<size_t>(std::max(2, sc.threads));
  srv.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  srv.set_keep_alive_max_count(100000);
  srv.set_keep_alive_timeout(30);
  srv.set_payload_max_length(sc.max_body_bytes);
  // httplib listens with a backlog of 5 (compiled into Debian's library):
  // a burst of connections then overflows the accept queue and clients see
  // resets. We keep the socket to listen() again with a real backlog, and
  // use SO_REUSEADDR only (not SO_REUSEPORT, so a second daemon on the same
  // port fails to bind instead of silently sharing it).
  srv.set_socket_options([this](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    // Accepted sockets inherit it: httplib writes headers and body
    // separately, and Nagle plus delayed ACKs would add 40 ms to each answer.
    setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));
    listen_fd_ = sock;
  });
  srv.set_read_timeout(30, 0);
  srv.set_write_timeout(30, 0);

  // Errors produced by httplib itself (unknown path, 413) get problem bodies too.
  srv.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string rid = res.get_header_value("X-Request-Id");
    if (rid.empty()) {
      rid = SaneRequestId(req.get_header_value("X-Request-Id"))
                ? req.get_header_value("X-Request-Id")
                : RandomHex(8);
      res.set_header("X-Request-Id", rid);
    }
    Status st =
        res.status == 404 ? NotFound("no route for " + req.method + " " + req.path)
        : res.status == 413
            ? ResourceExhausted("the body is larger than " +
                                std::to_string(deps_.config.server.max_body_bytes) + " bytes")
            : InvalidArgument("the request could not be handled");
    deps_.metrics.http_errors_4xx.Inc();
    WriteProblem(res, st, rid, res.status);
  });

  auto schemas = std::make_shared<CompiledSchemas>();  // shared: captured by every handler
  for (const auto& [name, text] : ApiSchemaTexts()) {
    Json j = Json::parse(text, nullptr, false);
    if (j.is_discarded()) continue;
    auto s = JsonSchema::Create(j);
    if (s.ok()) schemas->by_name[name] = std::move(s).value();
  }

  for (size_t index = 0; index < routes_.size(); ++index) {
    const Route* route = &routes_[index];
    std::string re = route->pattern;
    // httplib matches with std::regex on the path; turn {x} into a group.
    std::string pattern;
    for (size_t i = 0; i < re.size(); ++i) {
      if (re[i] == '{') {
        i = re.find('}', i);
        pattern += "([^/]+)";
      } else {
        pattern += re[i];
      }
    }
    auto handler = [this, route, schemas](const httplib::Request& req, httplib::Response& res) {
      Metrics& m = deps_.metrics;
      m.http_requests.Inc();
      RequestContext ctx;
      ctx.method = req.method;
      ctx.path = req.path;
      std::string rid = req.get_header_value("X-Request-Id");
      ctx.request_id = SaneRequestId(rid) ? rid : RandomHex(8);
      res.set_header("X-Request-Id", ctx.request_id);
      auto fail = [&](const Status& st, int status_override = 0) {
        int status = status_override != 0 ? status_override : HttpStatusFor(st.code());
        if (status >= 500) {
          m.http_errors_5xx.Inc();
        } else {
          m.http_errors_4xx.Inc();
        }
        WriteProblem(res, st, ctx.request_id, status);
      };

      // Auth: a Bearer token whose sha256 is configured; the token's name is the caller.
      ctx.caller = "anonymous";
      const auto& tokens = deps_.config.auth.tokens;
      if (!tokens.empty() && !route->is_public) {
        std::string auth = req.get_header_value("Authorization");
        const AuthToken* who = nullptr;
        if (auth.rfind("Bearer ", 0) == 0) {
          std::string digest = Sha256Hex(auth.substr(7));
          for (const auto& t : tokens) {
            if (ConstantTimeEquals(digest, t.sha256)) who = &t;
          }
        }
        if (who == nullptr) {
          return fail(Status(Code::kUnauthenticated, "a valid Bearer token is required"));
        }
        if (!route->roles.empty()) {
          bool allowed = false;
          for (const auto& have : who->roles) {
            if (have == "admin") allowed = true;
            for (const auto& need : route->roles) allowed = allowed || have == need;
          }
          if (!allowed) {
            return fail(Status(Code::kPermissionDenied,
                               "token '" + who->name + "' lacks the role for this route"));
          }
        }
        ctx.caller = who->name;
      }

      // Idempotency-Key syntax first: a malformed or missing key is refused
      // before the body is even read.
      if (route->key_policy != KeyPolicy::kNone) {
        std::vector<std::string> values;
        size_t n = req.get_header_value_count("Idempotency-Key");
        for (size_t i = 0; i < n; ++i) values.push_back(req.get_header_value("Idempotency-Key", i));
        auto key = ParseIdempotencyKey(values);
        if (!key.ok()) return fail(key.status());
        ctx.idempotency_key = std::move(key).value();
        if (ctx.idempotency_key.empty()) {
          if (route->key_policy == KeyPolicy::kRequired) {
            m.idem_key_missing.Inc();
            return fail(InvalidArgument("this route requires an Idempotency-Key header",
                                        "header:Idempotency-Key"));
          }
          m.idem_key_optional_absent.Inc();
        }
      }

      for (size_t i = 1; i < req.matches.size(); ++i) ctx.params.push_back(req.matches[i]);
      for (const auto& [k, v] : req.params) ctx.query[k] = v;

      std::string canonical_body;
      if (!route->request_schema.empty()) {
        JsonLimits limits;
        limits.max_bytes = deps_.config.server.max_body_bytes;
        limits.max_depth = deps_.config.server.max_json_depth;
        if (req.body.empty()) return fail(InvalidArgument("a JSON body is required", ""));
        auto body = ParseJson(req.body, limits);
        if (!body.ok()) return fail(body.status());
        ctx.body = std::move(body).value();
        auto sit = schemas->by_name.find(route->request_schema);
        if (sit != schemas->by_name.end()) {
          Status valid = sit->second->Validate(ctx.body);
          if (!valid.ok()) return fail(valid);
        }
        if (!ctx.idempotency_key.empty()) {
          auto canon = CanonicalJson(ctx.body);
          if (!canon.ok()) return fail(canon.status());
          canonical_body = std::move(canon).value();
        }
      }

      auto respond = [&](const RouteResponse& r) {
        for (const auto& [k, v] : r.headers) res.set_header(k, v);
        if (r.status >= 500) m.http_errors_5xx.Inc();
        if (r.status >= 400 && r.status < 500) m.http_errors_4xx.Inc();
        if (route->raw_text && r.body.is_string()) {
          res.status = r.status;
          res.set_content(r.body.get<std::string>(), "text/plain; version=0.0.4");
        } else {
          WriteJson(res, r.status, r.body,
                    r.status >= 400 ? kProblemContentType : "application/json");
        }
      };
      auto run = [&]() -> RouteResponse {
        auto out = route->handler(ctx);
        if (out.ok()) return std::move(out).value();
        int status = HttpStatusFor(out.status().code());
        RouteResponse r;
        r.status = status;
        r.body = ProblemBody(status, out.status(), ctx.request_id);
        if (status >= 500) {
          LogEvent(LogLevel::kWarn, "request_failed",
                   {{"request_id", ctx.request_id},
                    {"route", route->method + " " + route->pattern},
                    {"error", out.status().ToString()}});
        }
        return r;
      };

      if (ctx.idempotency_key.empty()) {
        respond(run());
        return;
      }

      // The key record: created atomically before any side effect.
      const auto& cfg = deps_.config.idempotency;
      int64_t ttl = cfg.window_ms;
      auto wit = cfg.route_windows_ms.find(route->method + " " + route->pattern);
      if (wit != cfg.route_windows_ms.end()) ttl = wit->second;
      const std::string fingerprint = RequestFingerprint(req.method, req.path, canonical_body);
      const std::string& scope = ctx.caller;
      const int64_t begun_ms = deps_.clock.NowMillis();
      auto begun = deps_.idem_keys.Begin(scope, ctx.idempotency_key, fingerprint, ctx.request_id,
                                         begun_ms, ttl, cfg.lease_ms);
      if (!begun.ok()) {
        m.idem_key_store_errors.Inc();
        return fail(begun.status());
      }
      auto replay = [&](const IdemRecord& rec) {
        res.status = rec.response_status;
        res.set_header("Idempotent-Replayed", "true");
        res.set_content(rec.response_body, rec.response_content_type.c_str());
      };
      if (begun->outcome == BeginOutcome::kInFlight) {
        int64_t wait_ms = PreferWaitMs(req);
        int64_t until = deps_.clock.NowMillis() + wait_ms;
        while (wait_ms > 0 && deps_.clock.NowMillis() < until) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
          auto again =
              deps_.idem_keys.Begin(scope, ctx.idempotency_key, fingerprint, ctx.request_id,
                                    deps_.clock.NowMillis(), ttl, cfg.lease_ms);
          if (!again.ok()) break;
          begun = std::move(again);
          if (begun->outcome != BeginOutcome::kInFlight) break;
        }
        if (begun->outcome == BeginOutcome::kReplay) m.idem_key_waited.Inc();
      }
      switch (begun->outcome) {
        case BeginOutcome::kReplay:
          m.idem_key_replayed.Inc();
          return replay(begun->record);
        case BeginOutcome::kMismatch:
          m.idem_key_mismatch.Inc();
          return fail(Status(Code::kAborted,
                             "this Idempotency-Key was used with a different request payload",
                             "header:Idempotency-Key"),
                      422);
        case BeginOutcome::kInFlight:
          m.idem_key_in_flight.Inc();
          res.set_header("Retry-After", "1");
          return fail(Status(Code::kAborted,
                             "a request with this Idempotency-Key is still in progress; retry "
                             "later or send Prefer: wait=N",
                             "header:Idempotency-Key"),
                      409);
        case BeginOutcome::kNew:
          break;
      }
      m.idem_key_new.Inc();
      if (Status fp = Failpoints::Hit("http.after_key_begin"); !fp.ok()) return fail(fp);

      RouteResponse out = run();
      if (IsValidationFailure(out.status)) {
        (void)deps_.idem_keys.Abandon(scope, ctx.idempotency_key, fingerprint);
      } else {
        const char* type = out.status >= 400 ? kProblemContentType : "application/json";
        Status fin =
            deps_.idem_keys.Finish(scope, ctx.idempotency_key, fingerprint, out.status,
                                   out.body.dump(-1, ' ', false, Json::error_handler_t::replace),
                                   type, deps_.clock.NowMillis());
        if (!fin.ok()) {
          m.idem_key_store_errors.Inc();
          LogEvent(LogLevel::kError, "idempotency_finish_failed",
                   {{"request_id", ctx.request_id}, {"error", fin.ToString()}});
        }
        m.idem_in_progress_ms_sum.Inc(
            static_cast<uint64_t>(std::max<int64_t>(0, deps_.clock.NowMillis() - begun_ms)));
        m.idem_in_progress_count.Inc();
      }
      respond(out);
    };
    if (route->method == "GET") {
      srv.Get(pattern, handler);
    } else if (route->method == "POST") {
      srv.Post(pattern, handler);
    } else if (route->method == "DELETE") {
      srv.Delete(pattern, handler);
    } else if (route->method == "PUT") {
      srv.Put(pattern, handler);
    }
  }
}

StatusOr<int> HttpServer::Start(const std::string& host, int port) {
  int bound = port;
  if (port == 0) {
    bound = server_->bind_to_any_port(host);
    if (bound <= 0) return Unavailable("cannot bind " + host + ":0", false);
  } else if (!server_->bind_to_port(host, port)) {
    return Unavailable(
        "cannot bind " + host + ":" + std::to_string(port) + " (in use, or not a local address)",
        false);
  }
  if (listen_fd_ >= 0) ::listen(listen_fd_, kListenBacklog);
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  // httplib's stop() does nothing until the accept loop runs: wait for it,
  // so that a Stop right after Start cannot leave the thread in accept().
  for (int i = 0; i < 5000 && !server_->is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!server_->is_running()) return Unavailable("the HTTP server did not start", false);
  return bound;
}

void HttpServer::Stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace idem
