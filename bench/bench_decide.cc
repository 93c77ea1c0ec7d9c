// bench_decide: cache-hit decide over HTTP on loopback, against the real
// daemon binary in its own process, beside a trivial route on the same
// server (GET /healthz) as the bare-HTTP reference; then in-process key
// derivation + cache lookup; and the daemon's idle and peak RSS.
//
//   build/bench/bench_decide [--seconds 5]
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "bench/loadgen.h"
#include "daemon/config/config.h"
#include "daemon/decide/decide_engine.h"
#include "daemon/store/store.h"

namespace fs = std::filesystem;
using namespace idem;
using namespace idem::bench;

namespace {

void Row(const char* name, int conns, const LoadResult& r) {
  std::printf("%-34s %5d %12.0f %10.0f %10.0f %10.0f %8ld\n", name, conns, r.requests_per_s,
              r.p50_us, r.p99_us, r.max_us, r.errors);
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 5;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--seconds") seconds = std::atof(argv[i + 1]);
  }
  BenchDaemon daemon;
  if (!daemon.Start()) return 1;
  const int port = daemon.port;
  const pid_t pid = daemon.pid;
  const std::string dir = daemon.dir;
  const std::string config = std::string(IDEM_SOURCE_DIR) + "/config/idem.yaml";
  std::this_thread::sleep_for(std::chrono::seconds(1));
  long idle_rss = StatusKb(pid, "VmRSS:");

  const std::string body =
      R"({"step":"triage_ticket","input":{"ticket_id":42,"text":"refund please","received_at":"x"}})";
  const std::string decide = PostRequest("/v1/decide", body);
  const std::string health = GetRequest("/healthz");
  // Prime the cache with one miss.
  RunLoad(port, decide, 1, 0.2);

  std::printf("idem bench_decide: %.0f s per row, %u cores, daemon pid %d\n\n", seconds,
              std::thread::hardware_concurrency(), pid);
  std::printf("%-34s %5s %12s %10s %10s %10s %8s\n", "row", "conns", "req/s", "p50 us", "p99 us",
              "max us", "errors");
  for (int conns : {1, 32}) {
    Row("GET /healthz (bare HTTP reference)", conns, RunLoad(port, health, conns, seconds));
    Row("POST /v1/decide (cache hit)", conns, RunLoad(port, decide, conns, seconds));
  }
  long peak_rss = StatusKb(pid, "VmHWM:");
  daemon.Stop();

  // In-process: key derivation + cache lookup, the work a cache hit does
  // besides HTTP and JSON parsing.
  auto cfg = LoadConfig(config);
  if (!cfg.ok()) {
    std::fprintf(stderr, "%s\n", cfg.status().ToString().c_str());
    return 1;
  }
  StoreOptions so;
  so.path = dir + "/data";
  auto store = OpenRocksStore(so);
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
    return 1;
  }
  const StepConfig& step = cfg->steps.at("triage_ticket");
  const ProviderConfig& prov = cfg->providers.at(step.provider);
  Json input = Json::parse(body)["input"];
  const int iters = 200'000;
  auto per_op = [&](auto&& fn) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) fn();
    auto t1 = std::chrono::steady_clock::now();
    return std::chrono::duration<double, std::nano>(t1 - t0).count() / iters;
  };
  size_t hits = 0;
  // As the engine does it: the step's half of the key material once.
  DecisionKeyer keyer = std::move(MakeStepKeyer(step, prov)).value();
  const std::string key = StepKeyOf(step, keyer, input)->key.key;
  double both = per_op([&] {
    auto k = StepKeyOf(step, keyer, input);
    hits += (*store)->decisions().GetByKey(k->key.key, 0).ok() ? 1 : 0;
  });
  double derive = per_op([&] { (void)StepKeyOf(step, keyer, input); });
  double lookup = per_op([&] { (void)(*store)->decisions().GetByKey(key, 0); });
  std::printf("\nin-process key derivation + cache lookup: %.0f ns/op (%zu/%d hits)\n", both, hits,
              iters);
  std::printf("  key derivation alone: %.0f ns/op; cache lookup alone: %.0f ns/op\n", derive,
              lookup);
  std::printf("daemon RSS: idle %.1f MB, peak %.1f MB\n", idle_rss / 1024.0, peak_rss / 1024.0);
  return 0;
}
