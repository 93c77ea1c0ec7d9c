// bench_journal: what a durable journal claim costs, and what group commit
// buys, on this machine.
//
//   bench_journal [--dir=PATH] [--seconds=N] [--rows=fsync,cc,claim,dup]
//
// Rows (each runs for --seconds, default 3):
//   fdatasync loop       write 100 bytes + fdatasync, one thread: the disk's
//                        physical rate of durable writes (the reference);
//   claim+complete       new work: a durable Claim then a durable Complete
//                        (sync=true), at 1, 16 and 64 threads;
//   claim (new work)     a durable Claim only, 64 threads;
//   duplicate claim      Claim of work that is already done: a read, no write
//                        and no fsync, at 1 and 2 threads.
// Columns: ops/s is wall-clock throughput; ops/cpu-s divides by the CPU time
// the process used, which stays meaningful when other jobs share the cores.
// The data folder defaults to a fresh one under /tmp and is removed at the end.
#include <fcntl.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <latch>
#include <string>
#include <thread>
#include <vector>

#include "daemon/core/crypto.h"
#include "daemon/core/env.h"
#include "daemon/store/store.h"

namespace idem {
namespace {

struct RowResult {
  uint64_t ops = 0;
  double seconds = 0;
  double p50_us = 0;
  double p99_us = 0;
  double cpu_seconds = 0;  // user + system time of the whole process
  uint64_t errors = 0;
};

double ProcessCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// Runs `op(thread_index, iteration)` on `threads` threads until `seconds`
// pass; op returns false on an error.
RowResult RunRow(int threads, double seconds, const std::function<bool(int, uint64_t)>& op) {
  Env& env = Env::Real();
  std::atomic<bool> stop{false};
  std::vector<std::vector<int64_t>> latencies(threads);
  std::vector<uint64_t> errors(threads, 0);
  std::latch start(threads + 1);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      latencies[t].reserve(1 << 16);
      start.arrive_and_wait();
      for (uint64_t i = 0; !stop.load(std::memory_order_relaxed); ++i) {
        int64_t begin = env.MonoNanos();
        bool ok = op(t, i);
        latencies[t].push_back(env.MonoNanos() - begin);
        if (!ok) ++errors[t];
      }
    });
  }
  start.arrive_and_wait();
  int64_t t0 = env.MonoNanos();
  double cpu0 = ProcessCpuSeconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
  stop = true;
  for (std::thread& th : pool) th.join();
  int64_t t1 = env.MonoNanos();
  double cpu1 = ProcessCpuSeconds();

  RowResult r;
  std::vector<int64_t> all;
  for (int t = 0; t < threads; ++t) {
    all.insert(all.end(), latencies[t].begin(), latencies[t].end());
    r.errors += errors[t];
  }
  r.ops = all.size();
  r.seconds = static_cast<double>(t1 - t0) / 1e9;
  r.cpu_seconds = cpu1 - cpu0;
  if (!all.empty()) {
    std::sort(all.begin(), all.end());
    r.p50_us = static_cast<double>(all[all.size() / 2]) / 1e3;
    r.p99_us = static_cast<double>(all[std::min(all.size() - 1, all.size() * 99 / 100)]) / 1e3;
  }
  return r;
}

void PrintRow(const char* name, int threads, const RowResult& r) {
  double per_cpu = r.cpu_seconds > 0 ? static_cast<double>(r.ops) / r.cpu_seconds : 0;
  std::printf("%-34s %7d %10llu %12.0f %12.0f %10.1f %10.1f %7llu\n", name, threads,
              static_cast<unsigned long long>(r.ops), static_cast<double>(r.ops) / r.seconds,
              per_cpu, r.p50_us, r.p99_us, static_cast<unsigned long long>(r.errors));
  std::fflush(stdout);
}

ClaimRequest NewWork(const std::string& work_id, int64_t now_ms) {
  ClaimRequest req;
  req.work_id = work_id;
  req.kind = "bench";
  req.identity = Json{{"id", work_id}};
  req.args = Json{{"to", "someone@example.com"}, {"subject", "hello"}};
  req.lease_ms = 30'000;
  req.now_ms = now_ms;
  return req;
}

int Main(int argc, char** argv) {
  std::string dir;
  double seconds = 3;
  std::string rows = "fsync,cc,claim,dup";
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--dir=", 0) == 0) {
      dir = arg.substr(6);
    } else if (arg.rfind("--seconds=", 0) == 0) {
      seconds = std::atof(arg.substr(10).c_str());
    } else if (arg.rfind("--rows=", 0) == 0) {
      rows = "," + arg.substr(7) + ",";
    } else {
      std::fprintf(stderr, "usage: %s [--dir=PATH] [--seconds=N] [--rows=fsync,cc,claim,dup]\n",
                   argv[0]);
      return 2;
    }
  }
  if (seconds <= 0 || seconds > 30) {
    std::fprintf(stderr, "--seconds must be in (0, 30]\n");
    return 2;
  }
  rows = "," + rows + ",";
  auto want = [&](const char* row) {
    return rows.find("," + std::string(row) + ",") != std::string::npos;
  };
  bool remove_dir = false;
  if (dir.empty()) {
    std::string tmpl = "/tmp/idem-bench-journal-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) {
      std::perror("mkdtemp");
      return 1;
    }
    dir = tmpl;
    remove_dir = true;
  }
  std::filesystem::create_directories(dir);

  double load[3] = {0, 0, 0};
  getloadavg(load, 3);
  std::printf("bench_journal  dir=%s  seconds/row=%.1f  hardware threads=%u  load average=%.2f\n",
              dir.c_str(), seconds, std::thread::hardware_concurrency(), load[0]);
  // ops/cpu-s: operations per second of CPU time used by this process (all
  // its threads, RocksDB's included): the rate one idle core would sustain
  // for CPU-bound rows, and an honest figure on a shared machine.
  std::printf("%-34s %7s %10s %12s %12s %10s %10s %7s\n", "row", "threads", "ops", "ops/s",
              "ops/cpu-s", "p50 us", "p99 us", "errors");

  // Physical reference: one durable 100-byte write at a time.
  if (want("fsync")) {
    std::string path = dir + "/fdatasync.bin";
    int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
    if (fd < 0) {
      std::perror("open");
      return 1;
    }
    char buf[100];
    std::memset(buf, 'x', sizeof(buf));
    RowResult r = RunRow(1, seconds, [&](int, uint64_t) {
      return ::write(fd, buf, sizeof(buf)) == static_cast<ssize_t>(sizeof(buf)) &&
             ::fdatasync(fd) == 0;
    });
    ::close(fd);
    std::filesystem::remove(path);
    PrintRow("fdatasync loop (100 B)", 1, r);
  }

  StatusOr<std::unique_ptr<Store>> opened = OpenRocksStore(StoreOptions{dir + "/db", true});
  if (!opened.ok()) {
    std::fprintf(stderr, "open: %s\n", opened.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<Store> store = std::move(opened).value();
  Journal& journal = store->journal();
  StableClock clock(Env::Real());
  const std::string run = RandomHex(4);  // unique ids even when --dir is reused

  // Done work ids, kept from the 1-thread row for the duplicate rows.
  std::vector<std::string> done_ids;
  for (int threads : {1, 16, 64}) {
    if (!want("cc")) break;
    std::vector<std::vector<std::string>> ids(threads);
    std::string prefix = run + "-cc" + std::to_string(threads) + "-";
    RowResult r = RunRow(threads, seconds, [&](int t, uint64_t i) {
      std::string id = prefix + std::to_string(t) + "-" + std::to_string(i);
      StatusOr<ClaimResult> c = journal.Claim(NewWork(id, clock.NowMillis()));
      if (!c.ok() || c->outcome != ClaimOutcome::kClaimed) return false;
      Status s = journal.Complete(id, c->item.lease_token, Json{{"message_id", i}}, "ext-" + id,
                                  clock.NowMillis());
      if (!s.ok()) return false;
      if (ids[t].size() < 10'000) ids[t].push_back(id);
      return true;
    });
    PrintRow("claim+complete, sync (new work)", threads, r);
    for (auto& v : ids) done_ids.insert(done_ids.end(), v.begin(), v.end());
  }

  if (want("claim")) {
    std::string prefix = run + "-c64-";
    RowResult r = RunRow(64, seconds, [&](int t, uint64_t i) {
      std::string id = prefix + std::to_string(t) + "-" + std::to_string(i);
      StatusOr<ClaimResult> c = journal.Claim(NewWork(id, clock.NowMillis()));
      return c.ok() && c->outcome == ClaimOutcome::kClaimed;
    });
    PrintRow("claim only, sync (new work)", 64, r);
  }

  if (want("dup") && done_ids.empty()) {
    for (int i = 0; i < 1'000; ++i) {  // the claim+complete rows did not run
      std::string id = run + "-dup-" + std::to_string(i);
      StatusOr<ClaimResult> c = journal.Claim(NewWork(id, clock.NowMillis()));
      if (c.ok() && journal.Complete(id, c->item.lease_token, i, "ext", clock.NowMillis()).ok()) {
        done_ids.push_back(id);
      }
    }
  }
  if (want("dup")) {
    // Let RocksDB finish flushing and compacting what the write rows left
    // behind (at most 10 s), so that the read rows measure reads.
    for (int i = 0; i < 20; ++i) {
      double before = ProcessCpuSeconds();
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      if (ProcessCpuSeconds() - before < 0.025) break;
    }
  }
  for (int threads : {1, 2}) {
    if (!want("dup") || done_ids.empty()) break;
    // Requests are built beforehand (one set per thread): the row measures
    // the store, not the caller assembling its request.
    std::vector<std::vector<ClaimRequest>> requests(threads);
    for (auto& per_thread : requests) {
      for (const std::string& id : done_ids) per_thread.push_back(NewWork(id, 0));
    }
    RowResult r = RunRow(threads, seconds, [&](int t, uint64_t i) {
      ClaimRequest& req = requests[t][(i * 7 + t) % done_ids.size()];
      req.now_ms = clock.NowMillis();
      StatusOr<ClaimResult> c = journal.Claim(req);
      return c.ok() && c->outcome == ClaimOutcome::kDone;
    });
    PrintRow("duplicate claim of done work", threads, r);
  }

  store.reset();
  if (remove_dir) std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace idem

int main(int argc, char** argv) { return idem::Main(argc, argv); }
