#include "daemon/http/daemon.h"

#include <chrono>
#include <filesystem>
#include <limits>

#include "daemon/core/crypto.h"
#include "daemon/core/env.h"
#include "daemon/core/failpoints.h"
#include "daemon/core/json.h"
#include "daemon/core/version.h"
#include "daemon/http/api.h"
#include "daemon/http/decision_fallback.h"
#include "daemon/http/request_guard.h"
#include "daemon/obs/log.h"
#include "daemon/obs/trace.h"
#include "daemon/plans/journal_notifier.h"
#include "daemon/store/retention.h"
#include "providers/registry.h"
#include "providers/schema_lint.h"

namespace idem {

constexpr int kApplyWorkers = 4;
// postgres: decisions kept in memory to answer reads while the database is
// unreachable (daemon/http/decision_fallback.h).
constexpr size_t kRememberedDecisions = 4096;
// Resolved escalations, finished plans and trace entries are history once
// their decision and work exist; kept store.finished_retention for people to
// look back at, then swept. Below 0: kept (forever).
static int64_t FinishedCutoff(const StoreConfig& store, int64_t now_ms) {
  return store.finished_retention_ms == 0 ? -1 : now_ms - store.finished_retention_ms;
}
// The scheduler wakes every second for approval timeouts; the sweeps run
// every 30 passes, reconciliation every 20 sweeps (10 min).
constexpr int kSweepEveryPasses = 30;
constexpr int kReconcileEverySweeps = 20;

Status CheckPromptVersions(const Config& config, MetaStore& meta, bool allow_change) {
  std::vector<std::pair<std::string, std::string>> to_record;
  for (const auto& [name, step] : config.steps) {
    // "prompt/": the template's own hash, all that idem before decision keys
    // v2 recorded, still checked so an upgraded store keeps its guard;
    // "prompt_hash/": the hash of every prompt part (template, system, tools).
    const std::string suffix = name + "/" + step.prompt.version;
    bool changed = false;
    for (const auto& [key, hash] : {std::pair{"prompt/" + suffix, step.prompt.sha256},
                                    std::pair{"prompt_hash/" + suffix, step.prompt.hash}}) {
      ASSIGN_OR_RETURN(std::optional<std::string> stored, meta.Get(key));
      if (stored && *stored != hash) changed = true;
      if (!stored || *stored != hash) to_record.emplace_back(key, hash);
    }
    if (!changed) continue;
    if (!allow_change) {
      return FailedPrecondition(
          "step " + name + ": its prompt (the template " + step.prompt.template_path +
          ", the system text or the tools) changed while its version stayed " +
          step.prompt.version +
          "; cached decisions would no longer match their prompt. Bump prompt.version, or "
          "start with --allow-prompt-change to accept the new prompt under the old version");
    }
    LogEvent(LogLevel::kWarn, "prompt_changed_under_same_version",
             {{"step", name}, {"version", step.prompt.version}});
  }
  // Other prompt versions (replays only) are checked against what a version
  // of that name was when it was the default, never recorded: a replay
  // "with v1" must run the v1 that the v1 decisions were made with.
  for (const auto& [name, step] : config.steps) {
    for (const auto& [version, other] : step.other_prompts) {
      ASSIGN_OR_RETURN(std::optional<std::string> stored,
                       meta.Get("prompt_hash/" + name + "/" + version));
      if (!stored || *stored == other.hash) continue;
      if (!allow_change) {
        return FailedPrecondition(
            "step " + name + ": prompts." + version + " (the template " + other.template_path +
            ", the system text or the tools) differs from the prompt that version " + version +
            " was when decisions were made with it; name it another version, or start with "
            "--allow-prompt-change");
      }
      LogEvent(LogLevel::kWarn, "prompt_changed_under_same_version",
               {{"step", name}, {"version", version}});
    }
  }
  for (const auto& [k, v] : to_record) RETURN_IF_ERROR(meta.Put(k, v));
  return Status::Ok();
}

Status LintOutputSchemas(const Config& config) {
  std::string report;
  for (const auto& [name, step] : config.steps) {
    std::vector<std::string> providers = {step.provider};
    for (const auto& f : step.fallback) {
      if (f.is_object()) providers.push_back(f.value("provider", step.provider));
    }
    for (const auto& pname : providers) {
      auto pit = config.providers.find(pname);
      if (pit == config.providers.end()) continue;
      std::string type = pit->second.type;
      // Anthropic's default forced tool use takes any schema; only its
      // native structured output is strict.
      if (type == "anthropic" && pit->second.raw.value("structured_output", "tool") != "native") {
        continue;
      }
      for (const LintIssue& issue : LintForStrictMode(type, step.output_schema)) {
        report += "\n  step " + name + " (provider " + pname + ", " + type +
                  " strict mode): " + step.output_schema_path + " at " +
                  (issue.pointer.empty() ? "/" : issue.pointer) + ": " + issue.problem +
                  "; fix: " + issue.fix;
      }
    }
  }
  if (report.empty()) return Status::Ok();
  return FailedPrecondition("output schemas the provider's strict mode would refuse:" + report);
}

PgStoreOptions PgStoreOptionsFor(const StoreConfig& config) {
  PgStoreOptions o;
  if (!config.url_env.empty()) {
    const char* url = std::getenv(config.url_env.c_str());
    if (url != nullptr) o.conninfo = url;  // unset or empty: libpq's PG* variables
  }
  o.schema = config.schema;
  o.pool_size = config.pool_size;
  o.statement_timeout_ms = config.statement_timeout_ms;
  return o;
}

StatusOr<std::unique_ptr<StableClock>> AnchoredClock(Env& env, Store& store) {
  int64_t local_ms = env.WallMillis();
  // Tests only: this daemon runs as if its host's clock were an hour ahead.
  if (!Failpoints::Hit("clock.local_plus_1h").ok()) local_ms += 3'600'000;
  const int64_t before_ns = env.MonoNanos();
  StatusOr<int64_t> shared = store.ClockMillis();
  if (!shared.ok()) {
    if (shared.status().code() == Code::kNotFound) {
      return std::make_unique<StableClock>(env, local_ms);  // embedded store: the local clock
    }
    return shared.status().Annotate("reading the database's clock");
  }
  // The database read its clock about halfway through the round trip.
  const int64_t half_trip_ms = (env.MonoNanos() - before_ns) / 2'000'000;
  const int64_t skew_ms = *shared - local_ms;
  LogEvent(skew_ms > 1'000 || skew_ms < -1'000 ? LogLevel::kWarn : LogLevel::kInfo,
           "clock_anchored_to_database",
           {{"skew_ms", skew_ms},
            {"detail", "leases, windows and expiries follow the database's clock"}});
  return std::make_unique<StableClock>(env, *shared + half_trip_ms);
}

Daemon::~Daemon() { Stop(); }

StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const DaemonOptions& options) {
  Failpoints::InitFromEnv();
  std::unique_ptr<Daemon> d(new Daemon());
  Env& env = options.env != nullptr ? *options.env : Env::Real();

  ASSIGN_OR_RETURN(d->config_, LoadConfig(options.config_path));
  // What is wrong with the config but found only by the components built
  // from it is told as LoadConfig tells its own errors: file, line, pointer.
  if (Status s = Init(d, options, env); !s.ok()) return LocateConfigError(d->config_, std::move(s));
  return d;
}

Status Daemon::Init(std::unique_ptr<Daemon>& d, const DaemonOptions& options, Env& env) {
  if (!d->config_.log.level.empty()) SetLogLevel(d->config_.log.level);
  SetAccessLog(d->config_.log.access);
  if (!options.listen_override.empty()) d->config_.server.listen = options.listen_override;
  if (!options.data_override.empty()) d->config_.store.path = options.data_override;
  if (!options.unix_socket_override.empty()) {
    // Relative to the working directory at start, as typed: held absolute,
    // so that the stop removes the same file whatever the directory then.
    std::error_code ec;
    const std::filesystem::path abs = std::filesystem::absolute(options.unix_socket_override, ec);
    d->config_.server.unix_socket = ec ? options.unix_socket_override : abs.string();
  }
  auto parsed_listen = ParseListen(d->config_.server.listen);
  if (!parsed_listen.ok() && !options.listen_override.empty()) {
    // The flag's value, not the config's line: no file position to blame.
    return InvalidArgument("--listen: " + parsed_listen.status().message());
  }
  ASSIGN_OR_RETURN(auto listen, std::move(parsed_listen));
  for (const auto& [name, src] : d->config_.inbox) {
    if (src.signature_header.empty() && !IsLoopbackHost(listen.first)) {
      return Status(Code::kFailedPrecondition,
                    "inbox." + name +
                        " has no signature, and the daemon listens beyond loopback: anyone could "
                        "post events; configure inbox." +
                        name + ".signature",
                    "/inbox/" + JsonPointerToken(name));
    }
    if (!src.signature_env.empty()) {
      const char* secret = std::getenv(src.signature_env.c_str());
      if (secret == nullptr || *secret == '\0') {
        return Status(Code::kFailedPrecondition,
                      "the environment variable " + src.signature_env + " is not set",
                      "/inbox/" + JsonPointerToken(name) + "/signature/secret_env");
      }
    }
  }
  if (!IsLoopbackHost(listen.first) && d->config_.auth.tokens.empty()) {
    // Without tokens every caller may do everything: only this machine may be a caller.
    const std::string what = options.listen_override.empty()
                                 ? "server.listen " + d->config_.server.listen
                                 : "--listen " + options.listen_override;
    return InvalidArgument(what +
                               " is not a loopback address and auth.tokens is empty, so anyone "
                               "who can reach it could call every route; configure auth.tokens "
                               "(and server.allowed_hosts for the names clients use), or listen "
                               "on 127.0.0.1",
                           options.listen_override.empty() ? "/server/listen" : "");
  }

  auto on_write = [metrics = &d->metrics_](int64_t us) { metrics->store_write.ObserveMicros(us); };
  std::string store_name;  // for the log: a folder, or the schema (never the URL)
  if (d->config_.store.engine == "postgres") {
    PgStoreOptions po = PgStoreOptionsFor(d->config_.store);
    po.on_write_micros = on_write;
    store_name = "postgres schema " + po.schema;
    auto store = OpenPostgresStore(po);
    if (!store.ok()) return store.status().Annotate("opening the store (" + store_name + ")");
    // While the database is unreachable, decisions this daemon has seen are
    // still answered; everything else is 503 (and /readyz says so).
    d->store_ = WithDecisionFallback(std::move(store).value(), kRememberedDecisions);
  } else {
    StoreOptions so;
    so.path = d->config_.store.path;
    so.sync = d->config_.store.sync;
    so.min_free_bytes = static_cast<uint64_t>(d->config_.store.min_free_mb) << 20;
    so.trace_budget_bytes = static_cast<uint64_t>(d->config_.store.trace_budget_mb) << 20;
    // As the sweep below; forever leaves only the trace budget.
    so.trace_retention_ms = d->config_.store.finished_retention_ms == 0
                                ? std::numeric_limits<int64_t>::max()
                                : d->config_.store.finished_retention_ms;
    so.on_write_micros = on_write;
    store_name = so.path;
    auto store = OpenRocksStore(so);
    if (!store.ok()) return store.status().Annotate("opening the store at " + so.path);
    d->store_ = std::move(store).value();
  }
  ASSIGN_OR_RETURN(d->clock_, AnchoredClock(env, *d->store_));
  // Keys this store's previous process held when it died: nobody runs them
  // any more, so a retry need not wait out their lease.
  ASSIGN_OR_RETURN(size_t orphans, d->store_->idem_keys().ReleaseOwnInProgress());
  if (orphans > 0) {
    LogEvent(LogLevel::kInfo, "idempotency_keys_released", {{"count", orphans}});
  }

  RETURN_IF_ERROR(LintOutputSchemas(d->config_));
  RETURN_IF_ERROR(CheckPromptVersions(d->config_, d->store_->meta(), options.allow_prompt_change));

  d->http_client_ = MakeCurlHttpClient();
  // Every provider and effector call carries the trace of what caused it.
  d->traced_client_ = MakeTracingHttpClient(*d->http_client_);
  SetTraceSink([traces = &d->store_->traces(), clock = d->clock_.get()](
                   const std::string& trace_id, std::string_view type, std::string_view ref,
                   std::string detail) {
    (void)traces->Record(trace_id, clock->NowMillis(), type, ref, std::move(detail));
  });
  // Daemons sharing one store (issue 13) hold named leases as this holder:
  // one daemon delivers each outbox subscriber's events, and one provider
  // call answers identical concurrent misses across daemons.
  const std::string holder = "idem-" + RandomHex(8);
  // On a store one process owns (RocksDB) there is nobody to share with,
  // and a lease left by a killed process would only delay its restart.
  OutboxCoordination outbox_coordination;
  outbox_coordination.leases = d->store_->shared() ? &d->store_->leases() : nullptr;
  outbox_coordination.holder = holder;
  ASSIGN_OR_RETURN(
      d->outbox_, OutboxDispatcher::Create(d->config_.outbox, d->store_->outbox(), *d->http_client_,
                                           *d->clock_, outbox_coordination, &d->metrics_));
  std::map<std::string, std::unique_ptr<Provider>> providers;
  for (const auto& [name, pc] : d->config_.providers) {
    if (pc.type != "scripted" && pc.type != "replay") {
      // An LLM over HTTP: libcurl is needed at once, so a missing one stops
      // the start (effectors load it on their first call: an idle daemon on
      // the default config never maps it).
      if (Status curl = LoadLibcurl(); !curl.ok()) return curl.Annotate("provider " + name);
    }
    auto p = MakeProvider(pc, *d->traced_client_, env);
    if (!p.ok()) {
      // Told as a config error (file, line, pointer) when it points into
      // the provider's keys; a pointer relative to them is made whole.
      const Status& s = p.status();
      const std::string at = "/providers/" + JsonPointerToken(name);
      if (s.field().starts_with(at + "/")) return s;
      if (s.field().starts_with("/")) {
        return Status(s.code(), "provider " + name + ": " + s.message(), at + s.field());
      }
      return s.Annotate("provider " + name);
    }
    providers.emplace(name, std::move(p).value());
  }
  // Notifications are journal work of idem's own kinds, delivered by the
  // apply workers (daemon/plans/journal_notifier.h).
  ApplyOptions apply_options;
  if (d->config_.notifications.any()) {
    ASSIGN_OR_RETURN(
        std::unique_ptr<JournalNotifier> notifier,
        JournalNotifier::Create(d->config_.notifications, d->store_->journal(), *d->clock_));
    apply_options.internal_kinds = notifier->kinds();
    d->notifier_ = std::move(notifier);
  } else {
    d->notifier_ = std::make_unique<NullNotifier>();
  }
  apply_options.notifier = d->notifier_.get();
  apply_options.shared_journal = d->store_->shared();

  CostLedgerSharing cost_sharing;
  if (d->store_->shared()) {
    cost_sharing.leases = &d->store_->leases();
    cost_sharing.clock = d->clock_.get();
    cost_sharing.holder = holder;
  }
  d->costs_ = std::make_unique<CostLedger>(d->store_->meta(), cost_sharing);
  // One process owning the store needs no cross-daemon guard (its flight
  // table is exact) and no memory of its own (the store's cache is exact).
  DecideCoordination decide_coordination;
  decide_coordination.leases = d->store_->shared() ? &d->store_->leases() : nullptr;
  decide_coordination.holder = holder;
  decide_coordination.shared_store = d->store_->shared();
  ASSIGN_OR_RETURN(
      d->decide_, DecideEngine::Create(d->config_, d->store_->decisions(), d->store_->escalations(),
                                       std::move(providers), *d->clock_, d->metrics_,
                                       d->notifier_.get(), d->costs_.get(), decide_coordination));

  ASSIGN_OR_RETURN(d->apply_,
                   ApplyEngine::Create(d->config_, d->store_->journal(), *d->traced_client_,
                                       *d->clock_, d->metrics_, apply_options));
  // Work left running by a crashed process, and failed work whose retry time
  // came, is picked up by the workers.
  d->apply_->StartWorkers(kApplyWorkers);

  ASSIGN_OR_RETURN(d->plans_, PlanEngine::Create(d->config_, *d->store_, *d->apply_, *d->clock_,
                                                 d->metrics_, *d->notifier_));

  d->replays_ =
      std::make_unique<ReplayJobs>(d->config_, d->store_->decisions(), *d->decide_, *d->clock_);
  ApiDeps api{d->config_,        *d->store_,      *d->decide_,  *d->apply_,
              d->metrics_,       *d->clock_,      *d->plans_,   *d->notifier_,
              d->replays_.get(), d->costs_.get(), &d->draining_};
  ServerDeps sd{d->config_, d->store_->idem_keys(), d->store_->journal(), *d->clock_, d->metrics_};
  ASSIGN_OR_RETURN(d->server_, HttpServer::Create(sd, BuildApiRoutes(api)));
  ASSIGN_OR_RETURN(d->port_, d->server_->Start(listen.first, listen.second));
  d->host_ = listen.first;
  d->sweeper_ = std::thread([raw = d.get()] {
    NameThread("sweeper");
    raw->SweepLoop();
  });
  d->outbox_->Start();
  d->metrics_.build_info.Declare({kVersion}).Set(1);
  LogEvent(LogLevel::kInfo, "started",
           {{"version", kVersion},
            {"listen", d->host_ + ":" + std::to_string(d->port_)},
            {"unix_socket", d->config_.server.unix_socket},
            {"store", store_name},
            {"config", d->config_.source_path}});
  return Status::Ok();
}

void Daemon::SweepLoop() {
  // One series per kind, at zero from the start.
  std::vector<Counter*> swept_by_kind;
  for (const auto& [kind, zero] : RetentionCounts{}.ByKind()) {
    swept_by_kind.push_back(&metrics_.retention_swept.Declare({kind}));
  }
  std::unique_lock<std::mutex> lock(sweep_mu_);
  int pass = 0;
  bool sweep_behind = false;
  while (!stopping_) {
    sweep_cv_.wait_for(lock, std::chrono::seconds(1), [this] { return stopping_; });
    if (stopping_) break;
    lock.unlock();
    // Cost counts (GET /v1/stats/cost) reach the store about once a second.
    if (Status flushed = costs_->Flush(); !flushed.ok()) {
      LogEvent(LogLevel::kWarn, "cost_flush_failed", {{"error", flushed.ToString()}});
    }
    auto expired = plans_->ExpireDue();
    if (!expired.ok()) {
      LogEvent(LogLevel::kWarn, "approval_timeouts_failed",
               {{"error", expired.status().ToString()}});
    }
    auto settled = plans_->SettleFromJournal();
    if (!settled.ok()) {
      LogEvent(LogLevel::kWarn, "plan_settle_failed", {{"error", settled.status().ToString()}});
    }
    // Tests only: the failpoint "daemon.sweep_every_second" sweeps every pass.
    // A pass that ran out of time before the backlog did is followed by
    // another on the next second.
    if (++pass % kSweepEveryPasses != 0 && !sweep_behind &&
        Failpoints::Hit("daemon.sweep_every_second").ok()) {
      lock.lock();
      continue;
    }
    RetentionPass retention;
    retention.now_ms = clock_->NowMillis();
    retention.finished_cutoff_ms = FinishedCutoff(config_.store, retention.now_ms);
    retention.monotonic_ms = [] {
      return std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::steady_clock::now().time_since_epoch())
          .count();
    };
    retention.plan_of_decision = &PlanEngine::DecisionPlanId;
    retention.outbox = [this](int64_t now_ms, size_t limit) {
      return outbox_->Sweep(now_ms, limit);
    };
    const RetentionCounts swept = SweepRetention(*store_, retention);
    sweep_behind = swept.behind;
    if (swept.behind) metrics_.retention_behind.Inc();
    Json fields = Json::object();
    for (size_t i = 0; const auto& [kind, n] : swept.ByKind()) {
      swept_by_kind[i++]->Inc(n);
      fields[kind] = n;
    }
    if (!swept.first_error.ok()) {
      LogEvent(LogLevel::kWarn, "sweep_failed", {{"error", swept.first_error.ToString()}});
    }
    if (pass % (kSweepEveryPasses * kReconcileEverySweeps) == 0) {
      auto report = apply_->Reconcile();
      if (report.ok() && !report->findings.empty()) {
        LogEvent(LogLevel::kWarn, "reconcile_findings", {{"count", report->findings.size()}});
      }
    }
    // Hand what a burst of requests freed back to the system, so that RSS
    // comes down after load instead of staying at its peak.
    ReleaseFreeMemory();
    if (swept.total() > 0) {
      fields["rounds"] = swept.rounds;
      fields["behind"] = swept.behind;
      LogEvent(swept.behind ? LogLevel::kInfo : LogLevel::kDebug, "swept", fields);
    }
    lock.lock();
  }
}

void Daemon::Stop() {
  // The front door first: from here every new request (on an open
  // connection too, /readyz included) is 503, and long handlers start no
  // more work; then the sweeper and the outbox stop.
  draining_.store(true, std::memory_order_release);
  const bool drained = server_ == nullptr || server_->Drain(config().server.drain_timeout_ms);
  if (!drained) {
    LogEvent(LogLevel::kWarn, "drain_timeout",
             {{"detail",
               "handlers still running after server.drain_timeout; their answers "
               "are dropped"}});
  }
  {
    std::lock_guard<std::mutex> lock(sweep_mu_);
    stopping_ = true;
  }
  sweep_cv_.notify_all();
  if (sweeper_.joinable()) sweeper_.join();
  if (outbox_) outbox_->Stop();
  if (server_) server_->Stop();
  if (replays_) replays_->Stop();  // running bulk replays end "failed: cancelled"
  if (apply_) apply_->Stop();
  if (costs_) {
    if (Status flushed = costs_->Flush(); !flushed.ok()) {
      LogEvent(LogLevel::kWarn, "cost_flush_failed", {{"error", flushed.ToString()}});
    }
  }
  SetTraceSink(nullptr);  // the store it writes to goes with this daemon
}

}  // namespace idem
