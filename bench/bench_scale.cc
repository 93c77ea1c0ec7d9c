// bench_scale: how memory, disk and restart time grow with the store. Runs
// the real daemon binary on the default config in a temp folder, fills N
// distinct decisions (POST /v1/decide, scripted provider, every one a cache
// miss) and N work items (claim + complete), at 16 connections, then prints
// the daemon's RSS, the store's size on disk and where its bytes go (per
// column family), the time from a restart after SIGTERM to GET /healthz 200,
// and the same after kill -9.
//
//   build/bench/bench_scale [--n 100000] [--work N] [--conns 16] [--keep]
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "bench/loadgen.h"
#include "bench/store_families.h"

namespace fs = std::filesystem;
using namespace idem::bench;
using Clock = std::chrono::steady_clock;

namespace {

// Runs `op(i, client)` for i in [0, n) over `conns` connections, one thread
// each; returns the number of failed operations.
template <typename Op>
long Fill(const char* what, int port, uint64_t n, int conns, Op op) {
  std::atomic<uint64_t> next{0};
  std::atomic<long> errors{0};
  std::vector<std::thread> threads;
  auto t0 = Clock::now();
  for (int c = 0; c < conns; ++c) {
    threads.emplace_back([&] {
      auto client = std::make_unique<BlockingClient>(port);
      for (uint64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) {
        if (!op(i, *client)) {
          errors++;
          client = std::make_unique<BlockingClient>(port);
        }
        if (i > 0 && i % (n / 10 == 0 ? 1 : n / 10) == 0) {
          std::fprintf(stderr, "  %s: %lu/%lu\n", what, static_cast<unsigned long>(i),
                       static_cast<unsigned long>(n));
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  std::fflush(stderr);
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("%-28s %10lu in %7.1f s (%7.0f /s), %ld errors\n", what,
              static_cast<unsigned long>(n), s, n / s, errors.load());
  return errors.load();
}

struct Daemon {
  std::string dir;
  pid_t pid = -1;
  int port = 0;

  // Starts the daemon on `port` (0: any, read from the port file) and
  // returns the seconds from fork to the first GET /healthz 200, or -1.
  double Start() {
    const std::string port_file = dir + "/port";
    fs::remove(port_file);
    const std::string config = std::string(IDEM_SOURCE_DIR) + "/config/idem.yaml";
    const std::string listen = "127.0.0.1:" + std::to_string(port);
    // IDEM_BENCH_BINARY: another build of the daemon (a copy of the old one,
    // to compare), as for the other bench programs (loadgen.h).
    const char* env_bin = std::getenv("IDEM_BENCH_BINARY");
    const std::string bin = env_bin != nullptr ? env_bin : IDEM_BINARY;
    // Built before fork(): the child makes system calls only.
    const std::string log = dir + "/daemon.log";
    const std::string data = dir + "/data";
    std::fflush(stdout);  // the child must not inherit unwritten output
    auto t0 = Clock::now();
    pid = fork();
    if (pid == 0) {
      int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd < 0) _exit(127);
      dup2(fd, 1);
      dup2(fd, 2);
      execl(bin.c_str(), bin.c_str(), "serve", "--config", config.c_str(), "--listen",
            listen.c_str(), "--data", data.c_str(), "--port-file", port_file.c_str(), "--log-level",
            "warn", static_cast<char*>(nullptr));
      _exit(127);
    }
    const std::string health = GetRequest("/healthz");
    while (std::chrono::duration<double>(Clock::now() - t0).count() < 120) {
      if (port == 0) {
        std::ifstream pf(port_file);
        if (!(pf >> port)) port = 0;
      }
      if (port != 0) {
        BlockingClient c(port);
        if (c.Call(health, nullptr) == 200) {
          return std::chrono::duration<double>(Clock::now() - t0).count();
        }
      }
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    std::fprintf(stderr, "daemon did not come up; see %s/daemon.log\n", dir.c_str());
    return -1;
  }

  // Sends `sig`; returns the seconds until the process exited.
  double Stop(int sig) {
    auto t0 = Clock::now();
    kill(pid, sig);
    int status = 0;
    waitpid(pid, &status, 0);
    pid = -1;
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }
};

// The store's memory by part, from the daemon's /metrics
// (idem_store_memory_bytes{part=...}).
void PrintStoreMemory(int port) {
  BlockingClient c(port);
  std::string text;
  if (c.Call(GetRequest("/metrics"), &text) != 200) return;
  const std::string prefix = "idem_store_memory_bytes{part=\"";
  std::printf("  of it, the store's parts:");
  for (size_t at = text.find(prefix); at != std::string::npos; at = text.find(prefix, at + 1)) {
    size_t name_end = text.find('"', at + prefix.size());
    size_t value_at = text.find(' ', name_end);
    if (name_end == std::string::npos || value_at == std::string::npos) break;
    std::printf(" %s %.1f MB",
                text.substr(at + prefix.size(), name_end - at - prefix.size()).c_str(),
                std::atof(text.c_str() + value_at + 1) / 1048576.0);
  }
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t n = 100'000;
  int64_t work = -1;
  int conns = 16;
  bool keep = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--n" && i + 1 < argc) n = std::strtoull(argv[++i], nullptr, 10);
    if (a == "--work" && i + 1 < argc) work = std::strtoll(argv[++i], nullptr, 10);
    if (a == "--conns" && i + 1 < argc) conns = std::atoi(argv[++i]);
    if (a == "--keep") keep = true;
  }
  const uint64_t n_work = work < 0 ? n : static_cast<uint64_t>(work);

  char tmpl[] = "/tmp/idem-scale-XXXXXX";
  Daemon d;
  d.dir = mkdtemp(tmpl);
  const std::string data = d.dir + "/data";
  std::printf("idem bench_scale: %lu decisions, %lu work items, %d connections, %u cores, dir %s\n",
              static_cast<unsigned long>(n), static_cast<unsigned long>(n_work), conns,
              std::thread::hardware_concurrency(), d.dir.c_str());
  std::fflush(stdout);
  if (d.Start() < 0) return 1;
  std::this_thread::sleep_for(std::chrono::seconds(1));
  std::printf("idle RSS (empty store)       %10.1f MB\n\n", Mb(StatusKb(d.pid, "VmRSS:")));

  // Distinct ticket ids give distinct decision keys (received_at is dropped
  // from the key, ticket_id and text are not).
  Fill("decide (cache misses)", d.port, n, conns, [](uint64_t i, BlockingClient& c) {
    const std::string body = R"({"step":"triage_ticket","input":{"ticket_id":)" +
                             std::to_string(i) + R"(,"text":"refund please, order )" +
                             std::to_string(i) + R"("}})";
    int status = c.Call(PostRequest("/v1/decide", body), nullptr);
    return status == 200 || status == 201;
  });
  Fill("work claim + complete", d.port, n_work, conns, [](uint64_t i, BlockingClient& c) {
    std::string answer;
    const std::string claim = R"({"kind":"send_reply","identity":{"ticket_id":)" +
                              std::to_string(i) + R"(,"text":"scale"},"lease":"60s"})";
    int status = c.Call(PostRequest("/v1/work/claim", claim), &answer);
    if (status != 200 && status != 201) return false;
    auto j = nlohmann::json::parse(answer, nullptr, false);
    if (j.is_discarded() || !j.contains("work_id")) return false;
    std::string done =
        nlohmann::json{{"lease_token", j["lease_token"]}, {"result", {{"sent", true}}}}.dump();
    status = c.Call(PostRequest("/v1/work/" + j["work_id"].get<std::string>() + "/complete", done),
                    nullptr);
    return status == 200;
  });

  std::printf(
      "\nRSS after fill               %10.1f MB (peak %.1f MB; RssAnon %.1f MB, RssFile %.1f MB)\n",
      Mb(StatusKb(d.pid, "VmRSS:")), Mb(StatusKb(d.pid, "VmHWM:")), Mb(StatusKb(d.pid, "RssAnon:")),
      Mb(StatusKb(d.pid, "RssFile:")));
  PrintStoreMemory(d.port);
  std::printf("store on disk after fill     %10.1f MB (WAL %.1f MB)\n", DirBytes(data) / 1048576.0,
              WalBytes(data) / 1048576.0);
  std::fflush(stdout);

  double stop_s = d.Stop(SIGTERM);
  std::printf("SIGTERM to exit              %10.3f s; store %.1f MB (WAL %.1f MB)\n", stop_s,
              DirBytes(data) / 1048576.0, WalBytes(data) / 1048576.0);
  double up = d.Start();
  if (up < 0) return 1;
  std::printf("restart after SIGTERM        %10.3f s to /healthz 200\n", up);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  std::printf("RSS after restart (idle)     %10.1f MB\n", Mb(StatusKb(d.pid, "VmRSS:")));
  std::fflush(stdout);

  // Writes after the restart sit in the WAL and memtables: what kill -9
  // leaves for recovery to replay.
  Fill("decide after restart", d.port, std::min<uint64_t>(n, 50'000), conns,
       [n](uint64_t i, BlockingClient& c) {
         const std::string body = R"({"step":"triage_ticket","input":{"ticket_id":)" +
                                  std::to_string(n + i) + R"(,"text":"refund please"}})";
         int status = c.Call(PostRequest("/v1/decide", body), nullptr);
         return status == 200 || status == 201;
       });
  std::printf("WAL before kill -9           %10.1f MB\n", WalBytes(data) / 1048576.0);
  d.Stop(SIGKILL);
  up = d.Start();
  if (up < 0) return 1;
  std::printf("restart after kill -9        %10.3f s to /healthz 200\n", up);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  std::printf("RSS after restart (idle)     %10.1f MB\n", Mb(StatusKb(d.pid, "VmRSS:")));
  d.Stop(SIGTERM);
  std::printf("store on disk at the end     %10.1f MB\n", DirBytes(data) / 1048576.0);
  std::fflush(stdout);
  PrintFamilies(data);
  if (!keep) {
    std::error_code ec;
    fs::remove_all(d.dir, ec);
  }
  return 0;
}
