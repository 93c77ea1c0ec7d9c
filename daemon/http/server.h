// HttpServer: the daemon's HTTP front (cpp-httplib), dispatching the route
// table (router.h) through one pipeline:
//
//   request id (X-Request-Id accepted when sane, else generated; echoed)
//   -> auth (Bearer token; caller name scopes Idempotency-Keys)
//   -> Idempotency-Key header syntax (400 before anything else)
//   -> body: size limit (413), JSON with depth limit (400/413), schema (400)
//   -> Idempotency-Key record: replay / 422 / 409 / wait / new
//   -> handler -> response stored under the key (5xx included) unless it is
//      a validation failure (400, 404, 413, 415, 422), which forgets the key
//      so a corrected retry can reuse it.
//
// Every error is problem+json (problem.h).
//
// Thread-safety: Start/Stop from one thread; handlers run on the server's
// pool (ServerConfig.threads).
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "daemon/config/config.h"
#include "daemon/core/env.h"
#include "daemon/http/router.h"
#include "daemon/obs/metrics.h"
#include "daemon/store/store.h"

namespace httplib {
class Server;
}

namespace idem {

struct ServerDeps {
  const Config& config;
  IdemKeyStore& idem_keys;
  StableClock& clock;
  Metrics& metrics;
};

class HttpServer {
 public:
  ~HttpServer();
  static StatusOr<std::unique_ptr<HttpServer>> Create(ServerDeps deps, std::vector<Route> routes);

  // Binds `host:port` (port 0: any free port) and serves on a background
  // thread. Returns the bound port. Unavailable if the address is taken.
  StatusOr<int> Start(const std::string& host, int port);
  void Stop();
  const std::vector<Route>& routes() const { return routes_; }

 private:
  HttpServer(ServerDeps deps, std::vector<Route> routes);
  void Install();

  ServerDeps deps_;
  std::vector<Route> routes_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int listen_fd_ = -1;
};

// "host:port" -> parts. InvalidArgument when malformed.
StatusOr<std::pair<std::string, int>> ParseListen(const std::string& listen);

}  // namespace idem
