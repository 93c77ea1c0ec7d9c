// idem: the daemon (`idem serve`) and its command-line tools.
//
// Tools that must work with the daemon down read the config or stdin
// directly: canon, key, contracts. The rest talk to the daemon's HTTP API.
#include <malloc.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <future>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <thread>

#include "daemon/apply/work_identity.h"
#include "daemon/cli/cli.h"
#include "daemon/core/crypto.h"
#include "daemon/core/file_read.h"
#include "daemon/core/http_client.h"
#include "daemon/core/json.h"
#include "daemon/core/version.h"
#include "daemon/decide/decide_engine.h"
#include "daemon/http/daemon.h"
#include "daemon/obs/log.h"

#if IDEM_JEMALLOC
// jemalloc's settings, read when it starts (MALLOC_CONF in the environment
// still overrides them). Two arenas, as glibc had (M_ARENA_MAX in Serve):
// the daemon's allocations are small and short, and each arena keeps what
// its threads freed. Freed pages go back to the system after a second
// (dirty_decay_ms) and then at once (muzzy_decay_ms: 0), so RSS comes down
// after a burst; the sweeper purges the rest (ReleaseFreeMemory, env.h).
// Measured: idle RSS 28.7-28.9 MB (with handler threads started on
// demand) against glibc's 28.5, after a 50k-decision fill 81.6 MB against
// 86.4 (README, "Session 29").
extern "C" const char* malloc_conf;
const char* malloc_conf = "narenas:2,dirty_decay_ms:1000,muzzy_decay_ms:0";
#endif

namespace idem {
namespace {

// What a stop may take beyond server.drain_timeout (the sweeper, the outbox,
// the store's last flush) before the process leaves without it; more when
// an effector's attempt can take longer (Serve).
constexpr int64_t kStopGraceMs = 5'000;

// Stdin, at most `max_bytes` of it: `idem canon < /dev/zero` or a folder
// given as stdin is an error, not all memory or an empty document.
StatusOr<std::string> ReadStdin(size_t max_bytes) {
  return ReadDescriptorAtMost(STDIN_FILENO, max_bytes, "stdin");
}

int Fail(const Status& s) {
  std::fprintf(stderr, "idem: %s\n", s.ToString().c_str());
  return 1;
}

// glibc's per-thread cache holds 7 chunks per size class by default; with
// one handler thread per connection, request-sized allocations then fall
// through to the shared arenas and their locks. A larger cache measured
// +25% cache-hit decides/s at 32 connections on 2 cores (README,
// "Benchmarks"). 128 gives the same throughput as 1000, which held ~12 MB
// of freed chunks in the sixty-odd threads' caches after a 300k fill
// (RSS 98.7 MB against 86.9 MB). Tunables are read only at process start, so
// `serve` re-executes itself once with them, unless the operator set
// GLIBC_TUNABLES already.
[[maybe_unused]] void ReexecWithMallocTunables(char** argv) {
  if (std::getenv("GLIBC_TUNABLES") != nullptr) return;
  setenv("GLIBC_TUNABLES", "glibc.malloc.tcache_count=128", 1);
  execv("/proc/self/exe", argv);
  unsetenv("GLIBC_TUNABLES");  // exec failed: carry on with the defaults
}

// Started through /proc/self/exe, the process would be called "exe" in ps,
// top and pgrep: it takes its own name back (at most 15 bytes, the
// kernel's limit), which the threads it starts inherit.
void NameProcess(const char* argv0) {
  const char* slash = std::strrchr(argv0, '/');
  prctl(PR_SET_NAME, slash != nullptr ? slash + 1 : argv0, 0, 0, 0);
}

// Connections and store files are descriptors: take the hard limit the
// operator allows instead of the common soft default of 1024.
void RaiseDescriptorLimit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur >= lim.rlim_max) return;
  lim.rlim_cur = lim.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &lim) != 0) {
    LogEvent(LogLevel::kWarn, "rlimit_nofile", {{"detail", "could not raise RLIMIT_NOFILE"}});
  }
}

int Serve(const DaemonOptions& options, const std::string& port_file) {
  // Block the stop signals before any thread starts, then wait for them here.
  // SIGHUP (a closed terminal, or an operator expecting a reload) does not
  // stop the daemon: the config is read at start-up only, so it is logged
  // and ignored.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // glibc gives threads that contend for malloc arenas of their own, up to
  // eight per core, and each keeps what its threads freed: with dozens of
  // handler threads that idle memory was most of the RSS after a burst. The
  // daemon's allocations are small and short; two arenas serve them.
  // MALLOC_ARENA_MAX in the environment still decides.
#if !IDEM_JEMALLOC
  if (std::getenv("MALLOC_ARENA_MAX") == nullptr) mallopt(M_ARENA_MAX, 2);
  // glibc's moving mmap threshold rises to the largest block freed, after
  // which large short-lived blocks are carved from the heap, leaving holes it
  // never returns. A fixed threshold keeps blocks of 128 KiB and more in
  // mappings of their own. RocksDB's memtable blocks and file buffers are
  // kept below it on purpose (64 KiB, rocksdb_database.cc): they come and go
  // with every memtable and file, and reused heap costs no page faults.
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") == nullptr) mallopt(M_MMAP_THRESHOLD, 128 << 10);
#endif
  RaiseDescriptorLimit();

  auto daemon = Daemon::Start(options);
  if (!daemon.ok()) return Fail(daemon.status());
  const std::string url = HttpUrl((*daemon)->host(), (*daemon)->port());
  if (!port_file.empty()) {
    // A supervisor waits for this file: one that cannot be written fails
    // the start, rather than leaving it waiting for ever.
    const std::string tmp = port_file + ".tmp";
    std::ofstream out(tmp);
    out << (*daemon)->port() << "\n";
    out.close();
    const bool written = static_cast<bool>(out);
    const int err = written && std::rename(tmp.c_str(), port_file.c_str()) == 0 ? 0 : errno;
    if (!written || err != 0) {
      std::remove(tmp.c_str());
      (*daemon)->Stop();
      return Fail(InvalidArgument("--port-file " + port_file + ": cannot write it (" +
                                  std::strerror(err != 0 ? err : EIO) + ")"));
    }
  }
  const Config& config = (*daemon)->config();
  const StoreConfig& sc = config.store;
  const std::string store_name = sc.engine == "postgres" ? "postgres schema " + sc.schema : sc.path;
  const std::string& sock = config.server.unix_socket;
  std::printf("idem listening on %s%s%s (store: %s)\ntry:\n", url.c_str(),
              sock.empty() ? "" : " and ", sock.c_str(), store_name.c_str());
  if (config.steps.empty() && config.actions.empty()) {
    // Started, but with nothing to decide or do: most likely the wrong file.
    LogEvent(LogLevel::kWarn, "config_declares_nothing",
             {{"config", config.source_path},
              {"detail",
               "no steps and no action kinds: every decide and action is 404; only leases, "
               "health and the API description are served (see config/idem.yaml for a config "
               "that declares them)"}});
  } else if (config.steps.count("triage_ticket") != 0) {
    std::printf(
        "  curl -s %s/v1/decide -H 'Idempotency-Key: \"t-1\"' \\\n"
        "    --json '{\"step\":\"triage_ticket\",\"input\":{\"ticket_id\":42,\"text\":\"refund "
        "please\",\"received_at\":\"...\"}}'\n",
        url.c_str());
  } else if (!config.steps.empty()) {
    std::printf("  curl -s %s/v1/decide --json '{\"step\":\"%s\",\"input\":{…}}'\n", url.c_str(),
                config.steps.begin()->first.c_str());
  }
  if (!sock.empty())
    std::printf("  curl -s --unix-socket %s http://localhost/healthz\n", sock.c_str());
  std::printf("  curl -s %s/openapi.json | head -c 300; echo\n", url.c_str());
  std::fflush(stdout);
  int sig = 0;
  for (;;) {
    sigwait(&set, &sig);
    if (sig != SIGHUP) break;
    LogEvent(LogLevel::kInfo, "sighup_ignored",
             {{"detail", "the config is read at start-up; restart the daemon to apply changes"}});
  }
  LogEvent(LogLevel::kInfo, "stopping", {{"signal", sig}});
  const auto stop_began = std::chrono::steady_clock::now();
  // The stop is bounded: a handler that outlives server.drain_timeout (a
  // slow provider, an effector's long timeout) has had its caller answered
  // 503 by then, and the process does not wait for it past a grace for the
  // rest of the stop. Leaving then is what a crash does, which the journal
  // and the keys are built for: the next start takes the work over.
  std::promise<void> stopped;
  std::future<void> stop_done = stopped.get_future();
  std::thread stopper([&] {
    (*daemon)->Stop();
    stopped.set_value();
  });
  // The grace covers an effector call in flight (a check-then-act attempt
  // is two calls): leaving in the middle of one would let the takeover make
  // the effect again at a target that does not dedupe. A provider call is
  // only tokens: the drain's 503 already told its caller to retry.
  int64_t grace_ms = kStopGraceMs;
  for (const auto& [name, kind] : config.actions) {
    if (!kind.effector.empty()) grace_ms = std::max(grace_ms, 2 * kind.retry.timeout_ms + 1'000);
  }
  const int64_t budget_ms = config.server.drain_timeout_ms + grace_ms;
  if (stop_done.wait_for(std::chrono::milliseconds(budget_ms)) != std::future_status::ready) {
    LogEvent(LogLevel::kWarn, "stop_abandoned",
             {{"signal", sig},
              {"took_ms", std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::steady_clock::now() - stop_began)
                              .count()},
              {"detail",
               "handlers or background work (effector calls, sweeps) still running past "
               "server.drain_timeout and a grace of " +
                   std::to_string(grace_ms) +
                   " ms; leaving without them, as after a crash: their callers were answered "
                   "503, and the next start releases their keys and takes their work over"}});
    std::fflush(nullptr);
    std::_Exit(1);  // not a clean stop, and a supervisor should know
  }
  stopper.join();
  // The last line of a clean stop: a log without it ended in a crash.
  LogEvent(LogLevel::kInfo, "stopped",
           {{"signal", sig},
            {"took_ms", std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now() - stop_began)
                            .count()}});
  return 0;
}

int Canon() {
  JsonLimits limits;
  limits.max_bytes = 64 << 20;
  limits.max_depth = 512;
  StatusOr<std::string> text = ReadStdin(limits.max_bytes);
  if (!text.ok()) return Fail(text.status());
  auto parsed = ParseJson(*text, limits);
  if (!parsed.ok()) return Fail(parsed.status());
  auto canon = CanonicalJson(*parsed);
  if (!canon.ok()) return Fail(canon.status());
  std::fwrite(canon->data(), 1, canon->size(), stdout);
  std::fputc('\n', stdout);
  return 0;
}

int Key(const std::string& config_path, const std::string& step, const std::string& kind) {
  auto config = LoadConfig(config_path);
  if (!config.ok()) return Fail(config.status());
  StatusOr<std::string> text = ReadStdin(JsonLimits{}.max_bytes);
  if (!text.ok()) return Fail(text.status());
  auto input = ParseJson(*text);
  if (!input.ok()) return Fail(input.status());
  if (!step.empty()) {
    auto sit = config->steps.find(step);
    if (sit == config->steps.end()) return Fail(NotFound("no step '" + step + "' in the config"));
    auto pit = config->providers.find(sit->second.provider);
    if (pit == config->providers.end()) return Fail(NotFound("provider missing"));
    auto key = ComputeStepKey(sit->second, pit->second, *input);
    if (!key.ok()) return Fail(key.status());
    std::printf("decision_key %s\nmaterial %s\n", key->key.key.c_str(), key->key.canonical.c_str());
    return 0;
  }
  auto ait = config->actions.find(kind);
  if (ait == config->actions.end()) return Fail(NotFound("no action kind '" + kind + "'"));
  auto key = ActionWorkId(ait->second, *input);
  if (!key.ok()) return Fail(key.status());
  std::printf("work_id %s\nmaterial %s\n", key->key.c_str(), key->canonical.c_str());
  return 0;
}

// `idem migrate`: the schema migrations the daemon applies at start-up, by
// hand (e.g. before rolling out a new version to every daemon at once).
int Migrate(const std::string& config_path) {
  auto config = LoadConfig(config_path);
  if (!config.ok()) return Fail(config.status());
  if (config->store.engine != "postgres") {
    std::printf("store.engine is %s: nothing to migrate (only postgres has a schema)\n",
                config->store.engine.c_str());
    return cli::kExitOk;
  }
  const PgStoreOptions options = PgStoreOptionsFor(config->store);
  auto applied = MigratePostgres(options);
  if (!applied.ok()) {
    Fail(applied.status().Annotate("migrating postgres schema " + options.schema));
    return applied.status().code() == Code::kUnavailable ? cli::kExitUnreachable : cli::kExitFailed;
  }
  if (applied->empty()) {
    std::printf("postgres schema %s: up to date, no migration applied\n", options.schema.c_str());
    return cli::kExitOk;
  }
  std::string versions;
  for (int v : *applied) versions += (versions.empty() ? "" : ", ") + std::to_string(v);
  std::printf("postgres schema %s: applied migration%s %s\n", options.schema.c_str(),
              applied->size() == 1 ? "" : "s", versions.c_str());
  return cli::kExitOk;
}

}  // namespace
}  // namespace idem

int main(int argc, char** argv) {
  using namespace idem;
  CLI::App app{"idem: makes LLM-driven automation safe to retry"};
  app.set_version_flag("--version", std::string("idem ") + kVersion);
  app.require_subcommand(1);

  DaemonOptions serve_opts;
  std::string port_file, log_level = "info";
  auto* serve = app.add_subcommand("serve", "Run the daemon");
  serve->add_option("--config", serve_opts.config_path, "Config file")
      ->default_val("config/idem.yaml");
  serve->add_option("--listen", serve_opts.listen_override, "host:port (overrides the config)");
  serve->add_option("--data", serve_opts.data_override, "Store folder (overrides the config)");
  serve->add_option("--unix-socket", serve_opts.unix_socket_override,
                    "Also serve on a Unix socket at this path (overrides the config)");
  serve->add_flag("--allow-prompt-change", serve_opts.allow_prompt_change,
                  "Accept a prompt text that changed under the same version");
  serve->add_option("--port-file", port_file, "Write the bound port to this file");
  serve->add_option("--log-level", log_level, "debug, info, warn or error")
      ->check(CLI::IsMember({"debug", "info", "warn", "error"}));

  app.add_subcommand("canon", "Print the RFC 8785 canonical form of the JSON on stdin");

  std::string migrate_config = "config/idem.yaml";
  auto* migrate = app.add_subcommand(
      "migrate",
      "Apply the store's schema migrations (store.engine postgres; the daemon also does at "
      "start-up) and print the versions applied");
  migrate->add_option("--config", migrate_config, "Config file")->default_val("config/idem.yaml");

  std::string key_config = "config/idem.yaml", key_step, key_kind;
  auto* key = app.add_subcommand(
      "key", "Print the decision_key (--step) or work_id (--kind) of the JSON input on stdin");
  key->add_option("--config", key_config, "Config file")->default_val("config/idem.yaml");
  auto* step_opt = key->add_option("--step", key_step, "Step name");
  auto* kind_opt = key->add_option("--kind", key_kind, "Action kind");
  step_opt->excludes(kind_opt);
  key->require_option(1, 2);

  std::string contracts_config = "config/idem.yaml";
  auto* contracts = app.add_subcommand(
      "contracts", "Print each step's and action kind's identity, window and duplicate response");
  contracts->add_option("--config", contracts_config, "Config file")
      ->default_val("config/idem.yaml");

  // Client subcommands: the daemon's URL from --url or IDEM_URL, the token
  // from IDEM_TOKEN only (flags show up in `ps`). Global options may follow
  // the subcommand (`idem plans ls --json`).
  std::string url = "http://127.0.0.1:7411";
  bool json_out = false;
  app.fallthrough();
  app.add_option("--url", url, "The daemon's URL, for the client subcommands")
      ->envname("IDEM_URL")
      ->default_val("http://127.0.0.1:7411");
  app.add_flag("--json", json_out, "Client subcommands: print the daemon's JSON, for scripts");
  app.footer(
      "Client subcommands send the bearer token in IDEM_TOKEN. Exit codes: 0 ok, 1 usage, "
      "2 unreachable or busy (429, 503), 3 not found, 4 conflict, 5 forbidden, 6 audit chain "
      "broken, "
      "7 other error.");

  auto* dlq = app.add_subcommand("dlq", "Dead letters: work whose attempts ran out");
  dlq->require_subcommand(1);
  auto* dlq_ls = dlq->add_subcommand("ls", "List dead letters");
  size_t dlq_limit = 100;
  dlq_ls->add_option("--limit", dlq_limit, "At most this many (the daemon allows 1000)")
      ->check(CLI::Range(1, 1000));
  std::string dlq_id;
  auto* dlq_replay = dlq->add_subcommand("replay", "Replay one dead letter (not the batch)");
  dlq_replay->add_option("work_id", dlq_id, "The work_id")->required();

  std::string work_id;
  auto* work = app.add_subcommand("work", "Show one journal record");
  work->add_option("work_id", work_id, "The work_id")->required();

  std::string decision_id;
  auto* decision = app.add_subcommand("decision", "Show one decision with its trace");
  decision->add_option("decision_id", decision_id, "The decision_id")->required();

  auto* escalations = app.add_subcommand("escalations", "List open escalations");
  size_t escalations_limit = 100;
  escalations
      ->add_option("--limit", escalations_limit, "At most this many (the daemon allows 1000)")
      ->check(CLI::Range(1, 1000));

  auto* plans = app.add_subcommand("plans", "Plans: the actions a decision proposed");
  plans->require_subcommand(1);
  std::string plans_state = "awaiting_approval";
  size_t plans_limit = 50;
  auto* plans_ls = plans->add_subcommand("ls", "List plans, newest first");
  plans_ls
      ->add_option("--state", plans_state,
                   "proposed, awaiting_approval (default), approved, rejected, expired, applying, "
                   "applied or partially_failed")
      ->default_val("awaiting_approval");
  plans_ls->add_option("--limit", plans_limit, "At most this many")
      ->default_val(50)
      ->check(CLI::Range(1, 10000));
  std::string plan_id;
  auto* plans_show = plans->add_subcommand("show", "One plan: actions, decision, work, history");
  plans_show->add_option("plan_id", plan_id, "The plan_id")->required();

  std::vector<std::string> approve_edits;
  std::string approve_comment;
  auto* approve = app.add_subcommand("approve", "Approve a plan awaiting approval (it is applied)");
  approve->add_option("plan_id", plan_id, "The plan_id")->required();
  approve
      ->add_option("--edit", approve_edits,
                   "PATH=VALUE: change an argument first; PATH is a JSON pointer into the "
                   "actions (/0/args/amount), VALUE JSON or else a string. Repeatable")
      ->take_all()
      ->allow_extra_args(false);
  approve->add_option("--comment", approve_comment, "Recorded with the approval");

  std::string reject_reason;
  auto* reject = app.add_subcommand("reject", "Reject a plan awaiting approval (never applied)");
  reject->add_option("plan_id", plan_id, "The plan_id")->required();
  reject->add_option("--reason", reject_reason, "Why (shown to the agent, kept in the audit)")
      ->required();

  // `idem replay ID` (one decision, its diff) or `idem replay --step S` (a bulk job).
  std::string replay_id, replay_step, replay_since, replay_provider, replay_model, replay_prompt;
  double replay_temperature = -1;
  size_t replay_limit = 1000;
  int replay_concurrency = 4;
  auto* replay = app.add_subcommand(
      "replay",
      "Decide again with the recorded input and show what changes: one decision (ID) or a "
      "step's decisions (--step), the cache untouched");
  replay->add_option("decision_id", replay_id, "One decision to replay");
  replay->add_option("--step", replay_step, "Bulk: replay this step's decisions");
  replay->add_option("--since", replay_since,
                     "Bulk: only decisions since (24h, 2026-11-30T14:05:00Z, 2026-11-30)");
  replay->add_option("--limit", replay_limit, "Bulk: at most this many, newest first")
      ->default_val(1000)
      ->check(CLI::Range(1, 10000));
  replay->add_option("--concurrency", replay_concurrency, "Bulk: replays at once")
      ->default_val(4)
      ->check(CLI::Range(1, 16));
  replay->add_option("--prompt-version", replay_prompt,
                     "A prompt version the step has loaded (prompt or prompts:)");
  replay->add_option("--model", replay_model, "Another model");
  replay->add_option("--provider", replay_provider, "Another configured provider");
  replay->add_option("--temperature", replay_temperature, "Another temperature")
      ->check(CLI::Range(0.0, 2.0));

  auto* audit = app.add_subcommand("audit", "The hash-chained audit log");
  audit->require_subcommand(1);
  auto* audit_verify = audit->add_subcommand(
      "verify",
      "Check the chain: asks the daemon and recomputes every event here (exit 6 if broken)");

  // Decisions as JSON Lines, and what deciding cost (daemon/cli/decisions_io.cc).
  auto* decisions = app.add_subcommand("decisions", "Decisions as JSON Lines: export and import");
  decisions->require_subcommand(1);
  std::string export_step, export_since;
  auto* decisions_export = decisions->add_subcommand(
      "export", "Write decisions (key material, output, trace) to stdout, one per line");
  decisions_export->add_option("--step", export_step, "Only this step");
  decisions_export->add_option("--since", export_since,
                               "Only decisions made since: ms, a date (2026-11-30) or 24h / 7d");
  std::string import_file;
  size_t import_batch_kib = 512;
  auto* decisions_import = decisions->add_subcommand(
      "import", "Load an export; every key is recomputed, edited lines are refused (exit 1)");
  decisions_import->add_option("file", import_file, "The JSONL file ('-': stdin)")->required();
  decisions_import
      ->add_option("--batch-kib", import_batch_kib,
                   "Send at most this many KiB per request (under server.max_body_bytes)")
      ->default_val(512)
      ->check(CLI::Range(1, 1 << 20));
  // `idem store copy`: local, no daemon (it must be stopped).
  auto* store_cmd = app.add_subcommand("store", "The store itself (the daemon stopped)");
  store_cmd->require_subcommand(1);
  std::string copy_config = "config/idem.yaml", copy_data, copy_url_env = "IDEM_PG_URL",
              copy_schema = "idem";
  auto* store_copy = store_cmd->add_subcommand(
      "copy", "Copy the RocksDB store into an empty PostgreSQL schema (leases are not copied)");
  store_copy->add_option("--config", copy_config, "Config file (its store.path is the source)")
      ->default_val("config/idem.yaml");
  store_copy->add_option("--data", copy_data, "RocksDB store folder (overrides the config)");
  store_copy
      ->add_option("--to-url-env", copy_url_env,
                   "Environment variable holding the PostgreSQL URL (never a flag: it may hold "
                   "a password)")
      ->default_val("IDEM_PG_URL");
  store_copy->add_option("--schema", copy_schema, "PostgreSQL schema to fill")->default_val("idem");

  std::string cost_by = "step", cost_since, cost_until;
  auto* cost = app.add_subcommand(
      "cost", "Tokens and USD spent, and USD saved by cache hits (default: the last 30 days)");
  cost->add_option("--by", cost_by, "step, model or day")
      ->default_val("step")
      ->check(CLI::IsMember({"step", "model", "day"}));
  cost->add_option("--since", cost_since, "From: ms, a date (2026-11-30) or 24h / 7d back");
  cost->add_option("--until", cost_until, "To (default now)");

  // Usage errors exit 1 (README, "CLI"); --help exits 0.
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? cli::kExitOk : cli::kExitUsage;
  }

  if (store_copy->parsed()) {
    std::string rocks_path = copy_data;
    if (rocks_path.empty()) {
      auto config = LoadConfig(copy_config);
      if (!config.ok()) return Fail(config.status());
      rocks_path = config->store.path;
    }
    const char* conninfo = std::getenv(copy_url_env.c_str());
    if (conninfo == nullptr || *conninfo == '\0') {
      std::fprintf(stderr, "idem store copy: %s is not set (the PostgreSQL URL)\n",
                   copy_url_env.c_str());
      return cli::kExitUsage;
    }
    PgStoreOptions to;
    to.conninfo = conninfo;
    to.schema = copy_schema;
    cli::Output out;
    out.json = json_out;
    out.style.color = !json_out && cli::UseColor(stdout);
    return cli::StoreCopy(out, rocks_path, to);
  }

  if (decisions->parsed() || cost->parsed()) {
    std::unique_ptr<HttpClient> http = MakeCurlHttpClient();
    const char* token = std::getenv("IDEM_TOKEN");
    cli::DaemonClient api(url, token == nullptr ? "" : token, *http);
    cli::Output out;
    out.json = json_out;
    out.style.color = !json_out && cli::UseColor(stdout);
    out.now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
    if (cost->parsed()) return cli::Cost(api, out, cost_by, cost_since, cost_until);
    if (decisions_export->parsed()) {
      int64_t since_ms = 0;
      if (!export_since.empty()) {
        auto t = cli::ParseTimeArg(export_since, out.now_ms);
        if (!t.ok()) {
          std::fprintf(stderr, "idem: --since: %s\n", t.status().message().c_str());
          return cli::kExitUsage;
        }
        since_ms = *t;
      }
      return cli::DecisionsExport(api, out, stdout, export_step, since_ms);
    }
    StatusOr<std::string> text = cli::ReadImportFile(import_file);
    if (!text.ok()) {
      std::fprintf(stderr, "idem: %s\n", text.status().message().c_str());
      return cli::kExitUsage;
    }
    return cli::DecisionsImport(api, out, *text, import_batch_kib * 1024);
  }

  const bool client_command = dlq->parsed() || work->parsed() || decision->parsed() ||
                              escalations->parsed() || plans->parsed() || approve->parsed() ||
                              reject->parsed() || audit->parsed() || replay->parsed();
  if (client_command) {
    std::unique_ptr<HttpClient> http = MakeCurlHttpClient();
    const char* token = std::getenv("IDEM_TOKEN");
    cli::DaemonClient api(url, token == nullptr ? "" : token, *http);
    cli::Output out;
    out.json = json_out;
    out.style.color = !json_out && cli::UseColor(stdout);
    out.now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
    if (plans_ls->parsed()) return cli::PlansLs(api, out, plans_state, plans_limit);
    if (plans_show->parsed()) return cli::PlansShow(api, out, plan_id);
    if (approve->parsed()) return cli::Approve(api, out, plan_id, approve_edits, approve_comment);
    if (reject->parsed()) return cli::Reject(api, out, plan_id, reject_reason);
    if (audit_verify->parsed()) return cli::AuditVerify(api, out);
    if (replay->parsed()) {
      if (replay_id.empty() == replay_step.empty()) {
        std::fprintf(stderr, "idem replay: give a decision id or --step (not both)\n");
        return cli::kExitUsage;
      }
      Json body = Json::object();
      if (!replay_provider.empty()) body["provider"] = replay_provider;
      if (!replay_model.empty()) body["model"] = replay_model;
      if (!replay_prompt.empty()) body["prompt_version"] = replay_prompt;
      if (replay_temperature >= 0) body["temperature"] = replay_temperature;
      if (!replay_id.empty()) {
        if (!replay_since.empty() || replay->count("--limit") > 0 ||
            replay->count("--concurrency") > 0) {
          std::fprintf(stderr, "idem replay: --since, --limit and --concurrency go with --step\n");
          return cli::kExitUsage;
        }
        return cli::ReplayDecision(api, out, replay_id, body);
      }
      body["step"] = replay_step;
      if (!replay_since.empty()) body["since"] = replay_since;
      body["limit"] = replay_limit;
      body["concurrency"] = replay_concurrency;
      return cli::BulkReplay(api, out, body, isatty(STDERR_FILENO) != 0);
    }
    if (dlq_ls->parsed()) return cli::DlqLs(api, out, dlq_limit);
    if (dlq_replay->parsed()) {
      // Each invocation is a new operator intention, so it gets its own key: a
      // second replay of an item that died again must replay it again, not
      // get the first one's answer back.
      const std::string replay_key = "cli-replay-" + RandomHex(8);
      auto answer = api.Call("POST", "/v1/dead-letters/" + PercentEncode(dlq_id) + "/replay",
                             Json::object(), "\"" + replay_key + "\"");
      if (!answer.ok()) {
        std::fprintf(stderr, "idem: %s\n", answer.status().message().c_str());
        return cli::kExitUnreachable;
      }
      std::string text =
          answer->body.is_null() ? cli::Printable(answer->text) : cli::JsonText(answer->body, 2);
      std::fprintf(answer->status < 300 || json_out ? stdout : stderr, "%s\n", text.c_str());
      std::string state = answer->body.is_object() ? answer->body.value("state", "") : "";
      std::fprintf(stderr, "idem: replay of %s (Idempotency-Key %s): HTTP %d%s%s\n", dlq_id.c_str(),
                   replay_key.c_str(), answer->status, state.empty() ? "" : ", state ",
                   state.c_str());
      return cli::ExitCodeForHttp(answer->status);
    }
    if (work->parsed())
      return cli::PrintCall(api, out, "GET", "/v1/work/" + PercentEncode(work_id));
    if (decision->parsed())
      return cli::PrintCall(api, out, "GET", "/v1/decisions/" + PercentEncode(decision_id));
    if (escalations->parsed()) return cli::EscalationsLs(api, out, escalations_limit);
  }

  if (serve->parsed()) {
#if !IDEM_JEMALLOC && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
    ReexecWithMallocTunables(argv);
#endif
    NameProcess(argv[0]);
    SetLogLevel(log_level);
    return Serve(serve_opts, port_file);
  }
  if (app.got_subcommand("canon")) return Canon();
  if (migrate->parsed()) return Migrate(migrate_config);
  if (key->parsed()) {
    if (key_step.empty() && key_kind.empty()) {
      std::fprintf(stderr, "idem key: give --step or --kind\n");
      return cli::kExitUsage;
    }
    return Key(key_config, key_step, key_kind);
  }
  if (contracts->parsed()) {
    auto config = LoadConfig(contracts_config);
    if (!config.ok()) return Fail(config.status());
    std::fputs(DescribeContracts(*config).c_str(), stdout);
    return 0;
  }
  return cli::kExitUsage;
}
