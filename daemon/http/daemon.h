// Daemon: the whole idem process wired together — config, store, providers,
// engines, HTTP server and the background sweeper — so that `idem serve`
// and the integration tests start exactly the same thing.
//
// Start-up refuses (non-OK Status, nothing served) when the config is
// invalid, the listen address (after --listen) is not loopback while
// auth.tokens is empty, the store cannot be opened, a provider cannot be
// built (store.engine postgres: the database cannot be reached, or its
// schema is newer than this binary), or a step's prompt (template text, system text or tools:
// prompt.hash) changed while its version did not (the store keeps the hash
// per step and version) unless allow_prompt_change is set.
//
// Thread-safety: Start and Stop from one thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "daemon/apply/apply_engine.h"
#include "daemon/config/config.h"
#include "daemon/core/env.h"
#include "daemon/core/http_client.h"
#include "daemon/decide/decide_engine.h"
#include "daemon/http/server.h"
#include "daemon/obs/metrics.h"
#include "daemon/outbox/outbox.h"
#include "daemon/plans/notifier.h"
#include "daemon/plans/plan_engine.h"
#include "daemon/replay/replay_jobs.h"
#include "daemon/store/store.h"

namespace idem {

struct DaemonOptions {
  std::string config_path = "config/idem.yaml";
  std::string listen_override;       // "host:port"; port 0 picks a free port
  std::string unix_socket_override;  // also serve on a Unix socket at this path
  std::string data_override;         // store folder
  bool allow_prompt_change = false;
  Env* env = nullptr;  // null: the real Env
};

class Daemon {
 public:
  ~Daemon();
  static StatusOr<std::unique_ptr<Daemon>> Start(const DaemonOptions& options);

  int port() const { return port_; }
  const std::string& host() const { return host_; }
  const Config& config() const { return config_; }
  Store& store() { return *store_; }
  Metrics& metrics() { return metrics_; }
  // Tells humans what waits for them (config `notifications`; a
  // NullNotifier without it). Valid until the Daemon is destroyed.
  Notifier& notifier() { return *notifier_; }
  void Stop();

 private:
  // Start after the config is loaded: everything built from it.
  static Status Init(std::unique_ptr<Daemon>& d, const DaemonOptions& options, Env& env);

  Daemon() = default;
  void SweepLoop();

  Config config_;
  std::unique_ptr<StableClock> clock_;
  Metrics metrics_;  // outlives the store, which reports its write times to it
  std::unique_ptr<Store> store_;
  std::unique_ptr<HttpClient> http_client_;    // outlives the providers that use it
  std::unique_ptr<HttpClient> traced_client_;  // http_client_ plus the trace headers
  std::unique_ptr<Notifier> notifier_;         // outlives the engines that call it
  std::unique_ptr<CostLedger> costs_;          // outlives the engine that records in it
  std::unique_ptr<DecideEngine> decide_;
  std::unique_ptr<ApplyEngine> apply_;
  std::unique_ptr<PlanEngine> plans_;
  std::unique_ptr<ReplayJobs> replays_;  // destroyed (threads joined) before decide_
  std::unique_ptr<HttpServer> server_;
  std::unique_ptr<OutboxDispatcher> outbox_;  // pushes outbox events to subscribers
  std::string host_;
  int port_ = 0;
  std::mutex sweep_mu_;
  std::condition_variable sweep_cv_;
  bool stopping_ = false;
  std::atomic<bool> draining_{false};  // ApiDeps::stopping
  std::thread sweeper_;
};

// The PostgreSQL store's options from the config: the URL read from the
// environment variable store.url_env names (unset or empty: libpq's PG*
// variables); never logged.
PgStoreOptions PgStoreOptionsFor(const StoreConfig& config);

// The daemon's clock: anchored to the store's shared clock when it has one
// (postgres: the database's, so daemons on skewed hosts agree), else to
// env's wall clock. Unavailable if the database cannot tell its time.
// Failpoint "clock.local_plus_1h" (error; tests only) moves the local wall
// clock an hour ahead.
StatusOr<std::unique_ptr<StableClock>> AnchoredClock(Env& env, Store& store);

// Every step's output schema against the strict structured-output mode of
// each provider in its chain (providers/schema_lint.h): FailedPrecondition
// listing each problem with its pointer and fix.
Status LintOutputSchemas(const Config& config);

// Checks (and records) the hash of every step's prompt per version; checks
// (never records) each of a step's other prompt versions against the hash
// recorded when that version was the default.
Status CheckPromptVersions(const Config& config, MetaStore& meta, bool allow_change);

}  // namespace idem
