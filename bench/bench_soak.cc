// bench_soak: whether the daemon stays the same size under traffic that does
// not stop. bench_scale fills a store once and restarts it; here the real
// daemon binary runs the default config with its windows shortened to
// --window (a decision's cache window, Idempotency-Keys, work kinds, the
// outbox's retention), a --trace-mb trace budget, and one extra work kind
// with no effector, so that within a few windows every record family that
// retention covers reaches the point where the sweeper deletes what traffic
// adds. A mixed load runs for --minutes at --conns connections:
//
//   of every 20 operations: 8 decides with a new input (cache misses),
//   3 decides of an earlier input (hits, or misses once its window passed),
//   1 decide with a new Idempotency-Key, 3 claim + complete of new work,
//   1 claim + retryable fail + claim again + complete, 1 duplicate claim of
//   earlier work, 1 named lease (half released, half left to expire),
//   1 list of dead letters (none may be there), 1 list of recent decisions.
//
// Every --every seconds it prints the daemon's RSS (and its peak so far),
// open descriptors, threads, store on disk (WAL apart), and the interval's
// operations, unexpected answers, CPU (the daemon's and its sweeper
// thread's) and records swept; at the end, how each moved over the second
// half of the run (the first half is the fill: records are not due for
// sweeping before a window has passed, and the sweeper runs every 30 s),
// and, with the daemon stopped, the store's bytes and keys per column
// family.
//
//   build/bench/bench_soak [--minutes 20] [--window 2m] [--trace-mb 16]
//                          [--conns 16] [--every 30]
//
// Not part of the test run: a soak is long by nature. Run it by hand and put
// its figures in the notes (README, "Benchmarks").
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/loadgen.h"
#include "bench/store_families.h"

namespace fs = std::filesystem;
using namespace idem::bench;
using Clock = std::chrono::steady_clock;

namespace {

// The default config, written where the soak runs: relative paths spelled
// out (they resolve against config/), every 24h window and `forever` cache
// window shortened, a trace budget, an outbox retention, and the kind
// soak_note (no effector: left to clients alone, so a failed attempt waits
// for the client's next claim instead of a daemon worker's).
std::string SoakConfig(const std::string& window, int trace_mb) {
  const std::string config_dir = std::string(IDEM_SOURCE_DIR) + "/config";
  std::ifstream in(config_dir + "/idem.yaml");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = std::regex_replace(
      ss.str(),
      std::regex(
          R"((\b(?:rules|template|output_schema|checks|args_schema|path):[ ]*)(?![/"])([\w.][^\s,}#]*))"),
      "$1" + config_dir + "/$2");
  text = std::regex_replace(text, std::regex(R"(\b24h\b)"), window);
  text = std::regex_replace(text, std::regex(R"(window: forever)"), "window: " + window);
  text = std::regex_replace(text, std::regex(R"(\n  sync: true)"),
                            "\n  sync: true\n  trace_budget_mb: " + std::to_string(trace_mb));
  text = std::regex_replace(text, std::regex(R"(\nactions:\n)"),
                            "\nactions:\n  soak_note:\n    identity:\n      fields: [/n]\n"
                            "      version: v1\n    window: " +
                                window + "\n    on_duplicate: return_original\n");
  text += "\noutbox:\n  retention: " + window + "\n";
  return text;
}

std::string Request(const std::string& method, const std::string& path, const std::string& body,
                    const std::string& extra_headers = "") {
  std::string r = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" + extra_headers;
  if (!body.empty()) {
    r +=
        "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  }
  return r + "\r\n" + body;
}

std::string DecideBody(uint64_t ticket) {
  return R"({"step":"triage_ticket","input":{"ticket_id":)" + std::to_string(ticket) +
         R"(,"text":"refund please, order )" + std::to_string(ticket) + R"("}})";
}

std::string ClaimBody(uint64_t n) {
  return R"({"kind":"soak_note","identity":{"n":)" + std::to_string(n) + R"(},"lease":"60s"})";
}

std::string Member(const std::string& body, const char* name) {
  auto j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.contains(name) || !j[name].is_string()) return "";
  return j[name].get<std::string>();
}

enum Op {
  kMiss,
  kHit,
  kKeyed,
  kComplete,
  kFailThenComplete,
  kDuplicate,
  kLease,
  kDeadLetters,
  kListDecisions,
  kOps
};
constexpr const char* kOpNames[kOps] = {"decide miss",    "decide hit",   "decide + key",
                                        "claim+complete", "fail+retry",   "dup claim",
                                        "lease",          "dead letters", "list decisions"};
// Which operation the seq-th one is (of every 20).
Op OpOf(uint64_t seq) {
  const uint64_t r = seq % 20;
  if (r < 8) return kMiss;
  if (r < 11) return kHit;
  if (r < 12) return kKeyed;
  if (r < 15) return kComplete;
  if (r < 16) return kFailThenComplete;
  if (r < 17) return kDuplicate;
  if (r < 18) return kLease;
  if (r < 19) return kDeadLetters;
  return kListDecisions;
}

// Claims `n`'s work and completes it; true when both were answered as the
// contract says (a claim of work that is already done answers 200 with it).
bool ClaimAndComplete(BlockingClient& c, uint64_t n) {
  std::string answer;
  int status = c.Call(Request("POST", "/v1/work/claim", ClaimBody(n)), &answer);
  if (status == 200) return Member(answer, "state") == "done";
  if (status != 201) return false;
  const std::string done =
      nlohmann::json{{"lease_token", Member(answer, "lease_token")}, {"result", {{"n", n}}}}.dump();
  return c.Call(Request("POST", "/v1/work/" + Member(answer, "work_id") + "/complete", done),
                nullptr) == 200;
}

// One operation; true when the daemon answered as its contract says.
bool RunOp(BlockingClient& c, uint64_t seq) {
  // An earlier seq, far enough back to have been answered (in the first
  // 2,000 operations: this one, so a hit or duplicate is a miss or new work).
  const uint64_t back = seq >= 2000 ? seq - 2000 : seq;
  std::string answer;
  switch (OpOf(seq)) {
    case kMiss:
    case kHit: {
      const uint64_t ticket = OpOf(seq) == kMiss || seq < 2000 ? seq : back - back % 20;
      const int status = c.Call(Request("POST", "/v1/decide", DecideBody(ticket)), nullptr);
      return status == 200 || status == 201;
    }
    case kKeyed: {
      const int status =
          c.Call(Request("POST", "/v1/decide", DecideBody(seq),
                         "Idempotency-Key: \"soak-" + std::to_string(seq) + "\"\r\n"),
                 nullptr);
      return status == 200 || status == 201;
    }
    case kComplete:
      return ClaimAndComplete(c, seq);
    case kFailThenComplete: {
      int status = c.Call(Request("POST", "/v1/work/claim", ClaimBody(seq)), &answer);
      if (status != 201) return false;
      const std::string id = Member(answer, "work_id");
      const std::string fail = nlohmann::json{
          {"lease_token", Member(answer, "lease_token")},
          {"error", "soak: try again"},
          {"retryable", true},
          {"retry_after", "1ms"}}.dump();
      if (c.Call(Request("POST", "/v1/work/" + id + "/fail", fail), nullptr) != 200) return false;
      // Due again after 1 ms; a claim before that is 409 with the time.
      for (int tries = 0; tries < 100; ++tries) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        status = c.Call(Request("POST", "/v1/work/claim", ClaimBody(seq)), &answer);
        if (status != 409) break;
      }
      if (status != 201) return false;
      const std::string done = nlohmann::json{
          {"lease_token", Member(answer, "lease_token")},
          {"result", {{"n", seq}}}}.dump();
      return c.Call(Request("POST", "/v1/work/" + id + "/complete", done), nullptr) == 200;
    }
    case kDuplicate:
      return ClaimAndComplete(c, seq < 2000 ? seq : back - back % 20 + 12);  // an earlier one
    case kLease: {
      const std::string path = "/v1/leases/soak-" + std::to_string(seq);
      if (c.Call(Request("POST", path, R"({"holder":"soak","ttl":"2s"})"), &answer) != 201) {
        return false;
      }
      if (seq % 40 == 17) return true;  // left to expire: the sweeper's to delete
      return c.Call(Request("DELETE", path + "?holder=soak&token=" + Member(answer, "token"), ""),
                    nullptr) == 200;
    }
    case kDeadLetters:
      // Every failure here is retryable and retried: none may be dead.
      return c.Call(Request("GET", "/v1/dead-letters?limit=20", ""), &answer) == 200 &&
             answer.find("\"items\":[]") != std::string::npos;
    case kListDecisions:
      return c.Call(Request("GET", "/v1/decisions?limit=20", ""), nullptr) == 200;
    default:
      return false;
  }
}

int OpenFds(pid_t pid) {
  int n = 0;
  std::error_code ec;
  for (auto it = fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
       !ec && it != fs::end(it); it.increment(ec)) {
    ++n;
  }
  return n;
}

// The sum of every series of `name` in the daemon's /metrics (-1 if none).
double MetricSum(int port, const std::string& name) {
  BlockingClient c(port);
  std::string text;
  if (c.Call(Request("GET", "/metrics", ""), &text) != 200) return -1;
  double sum = -1;
  for (size_t at = text.find("\n" + name); at != std::string::npos;
       at = text.find("\n" + name, at + 1)) {
    const size_t after = at + 1 + name.size();
    if (after >= text.size() || (text[after] != ' ' && text[after] != '{')) continue;
    const size_t value_at = text.find(' ', text.find_first_of(" }", after));
    if (value_at == std::string::npos) break;
    sum = std::max(sum, 0.0) + std::atof(text.c_str() + value_at + 1);
  }
  return sum;
}

// The sweeper thread's CPU time so far (bench/loadgen.h names the threads).
double SweeperCpuMillis(const BenchDaemon& d) {
  const std::map<std::string, double> by_thread = d.CpuMillisByThread();
  auto it = by_thread.find("idem-sweeper");
  return it == by_thread.end() ? 0 : it->second;
}

struct Sample {
  double at_s = 0;
  double rss_mb = 0;
  int fds = 0;
  long threads = 0;
  double store_mb = 0, wal_mb = 0;
};

}  // namespace

int main(int argc, char** argv) {
  double minutes = 20;
  std::string window = "2m";
  int trace_mb = 16;
  int conns = 16;
  double every_s = 30;
  for (int i = 1; i + 1 < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--minutes") minutes = std::atof(argv[++i]);
    if (a == "--window") window = argv[++i];
    if (a == "--trace-mb") trace_mb = std::atoi(argv[++i]);
    if (a == "--conns") conns = std::atoi(argv[++i]);
    if (a == "--every") every_s = std::atof(argv[++i]);
  }

  char tmpl[] = "/tmp/idem-soak-config-XXXXXX";
  const std::string config_dir = mkdtemp(tmpl);
  BenchDaemon d;
  d.config = config_dir + "/idem.yaml";
  std::ofstream(d.config) << SoakConfig(window, trace_mb);
  if (!d.Start()) return 1;
  const std::string data = d.dir + "/data";
  std::printf(
      "idem bench_soak: %.0f min, windows %s, trace budget %d MB, %d connections, %u cores, "
      "dir %s\n",
      minutes, window.c_str(), trace_mb, conns, std::thread::hardware_concurrency(), d.dir.c_str());

  std::atomic<uint64_t> next{0};
  std::atomic<bool> stop{false};
  std::atomic<long> done[kOps] = {}, failed[kOps] = {};
  std::vector<std::thread> threads;
  for (int i = 0; i < conns; ++i) {
    threads.emplace_back([&] {
      auto client = std::make_unique<BlockingClient>(d.port);
      while (!stop.load(std::memory_order_relaxed)) {
        const uint64_t seq = next.fetch_add(1);
        if (RunOp(*client, seq)) {
          done[OpOf(seq)]++;
        } else {
          failed[OpOf(seq)]++;
          if (failed[OpOf(seq)].load() <= 3) {
            std::fprintf(stderr, "unexpected answer to %s (seq %lu)\n", kOpNames[OpOf(seq)],
                         static_cast<unsigned long>(seq));
          }
          client = std::make_unique<BlockingClient>(d.port);  // the answer may be half-read
        }
      }
    });
  }

  // CPU %: the daemon's user + system time over the interval, of one core;
  // sweeper %: its sweeper thread's alone (the deletes it stages are written
  // by the commit thread, counted in the first).
  // swept/s: records the sweeper deleted (idem_retention_swept_total);
  // behind: its passes that ran out of time (idem_retention_behind_total;
  // "-" for a daemon from before those metrics).
  std::printf("\n%8s %9s %8s %6s %8s %9s %8s %9s %8s %7s %9s %9s %7s\n", "minute", "RSS MB",
              "peak MB", "fds", "threads", "store MB", "WAL MB", "ops/s", "errors", "CPU %",
              "sweeper %", "swept/s", "behind");
  std::vector<Sample> samples;
  const auto t0 = Clock::now();
  long last_ops = 0, last_errors = 0;
  double last_at = 0, last_swept = 0;
  double last_cpu_ms = d.CpuMillis(), last_sweeper_ms = SweeperCpuMillis(d);
  while (true) {
    const double next_at = (samples.size() + 1) * every_s;
    std::this_thread::sleep_until(t0 + std::chrono::duration<double>(next_at));
    Sample s;
    s.at_s = std::chrono::duration<double>(Clock::now() - t0).count();
    s.rss_mb = Mb(StatusKb(d.pid, "VmRSS:"));
    s.fds = OpenFds(d.pid);
    s.threads = StatusKb(d.pid, "Threads:");
    s.store_mb = DirBytes(data) / 1048576.0;
    s.wal_mb = WalBytes(data) / 1048576.0;
    long ops = 0, errors = 0;
    for (int k = 0; k < kOps; ++k) ops += done[k].load(), errors += failed[k].load();
    const double swept = MetricSum(d.port, "idem_retention_swept_total");
    const double behind = MetricSum(d.port, "idem_retention_behind_total");
    const double cpu_ms = d.CpuMillis(), sweeper_ms = SweeperCpuMillis(d);
    const double interval_ms = (s.at_s - last_at) * 1000;
    std::printf("%8.1f %9.1f %8.1f %6d %8ld %9.1f %8.1f %9.0f %8ld %7.1f %9.1f ", s.at_s / 60,
                s.rss_mb, Mb(StatusKb(d.pid, "VmHWM:")), s.fds, s.threads, s.store_mb, s.wal_mb,
                (ops - last_ops) / (s.at_s - last_at), errors - last_errors,
                100 * (cpu_ms - last_cpu_ms) / interval_ms,
                100 * (sweeper_ms - last_sweeper_ms) / interval_ms);
    last_cpu_ms = cpu_ms, last_sweeper_ms = sweeper_ms;
    if (swept < 0) {
      std::printf("%9s %7s\n", "-", "-");
    } else {
      std::printf("%9.0f %7.0f\n", (swept - last_swept) / (s.at_s - last_at), behind);
      last_swept = swept;
    }
    std::fflush(stdout);
    last_ops = ops, last_errors = errors, last_at = s.at_s;
    samples.push_back(s);
    if (s.at_s >= minutes * 60) break;
  }
  stop = true;
  for (auto& t : threads) t.join();

  std::printf("\n%-16s %12s %12s\n", "operation", "answered", "unexpected");
  long errors = 0;
  for (int k = 0; k < kOps; ++k) {
    std::printf("%-16s %12ld %12ld\n", kOpNames[k], done[k].load(), failed[k].load());
    errors += failed[k].load();
  }
  // The second half against its first sample: what a long run adds.
  const Sample& from = samples[samples.size() / 2];
  const Sample& to = samples.back();
  double rss_max = 0, store_max = 0;
  int fds_max = 0;
  for (size_t i = samples.size() / 2; i < samples.size(); ++i) {
    rss_max = std::max(rss_max, samples[i].rss_mb);
    store_max = std::max(store_max, samples[i].store_mb);
    fds_max = std::max(fds_max, samples[i].fds);
  }
  std::printf(
      "\nsecond half (minute %.1f to %.1f): RSS %.1f -> %.1f MB (max %.1f), store %.1f -> %.1f MB "
      "(max %.1f), fds %d -> %d (max %d), threads %ld -> %ld\n",
      from.at_s / 60, to.at_s / 60, from.rss_mb, to.rss_mb, rss_max, from.store_mb, to.store_mb,
      store_max, from.fds, to.fds, fds_max, from.threads, to.threads);
  std::printf("peak RSS over the run %.1f MB\n", Mb(StatusKb(d.pid, "VmHWM:")));
  d.Stop();
  PrintFamilies(data);
  std::error_code ec;
  fs::remove_all(config_dir, ec);
  return errors == 0 ? 0 : 1;
}
