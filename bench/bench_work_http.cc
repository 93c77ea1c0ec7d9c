// bench_work_http: durable journal claims over HTTP against the real daemon
// binary (default config, kind send_reply, store sync=true): new-work claims
// (each one a durable, fsynced write) at 1, 16 and 64 connections, claim +
// complete operations (two requests, two durable writes) at 1, 16 and 64,
// and duplicate claims of done work (a read, no fsync) at 1 and 64, beside
// the bare HTTP reference route; then the claim + complete row at 64 again
// over the daemon's Unix socket (server.unix_socket), the same HTTP without
// TCP's loopback path.
//
//   build/bench/bench_work_http [--seconds 5] [--conns N] [--only TEXT] [--by-thread]
//                               [--tcp-only]
//
// --tcp-only: no Unix socket rows (and no --unix-socket for the daemon: a
// binary from before it, given as IDEM_BENCH_BINARY, still starts).
// --only TEXT: only the rows whose name contains TEXT (e.g. "complete"),
// for profiling one row with perf record -p <daemon pid>.
// --by-thread: under each row, the daemon's CPU per operation by thread
// role (event loops, group-commit writer, trace log, RocksDB's flushes and
// compactions), read from /proc, with no profiler; the load generator's
// own CPU per operation, which shares the machine; both split into user
// and system time; the CPU per operation of everything but the event
// loops' own (user) code, and the rate that alone would allow on this
// machine's cores at that row's batching (the ceiling no work on the loops'
// code can lift); and the store writes (group-commit DB::Write calls) per
// operation with their mean time, read from the daemon's /metrics.
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench/loadgen.h"

using namespace idem::bench;

namespace {

// `cpu_ms`: the daemon's CPU time over the row.
void Row(const char* name, int conns, const LoadResult& r, double cpu_ms) {
  const double cpu_us_per_op =
      r.requests > 0 ? cpu_ms * 1000.0 / static_cast<double>(r.requests) : 0;
  std::printf("%-40s %5d %12.0f %10.0f %10.0f %8ld %10.1f\n", name, conns, r.requests_per_s,
              r.p50_us, r.p99_us, r.errors, cpu_us_per_op);
}

// The daemon's store writes so far (idem_store_write_seconds: one per
// group-commit DB::Write, each shared by the batches of its group), from
// its own /metrics; {0, 0} if unreadable.
struct StoreWrites {
  double count = 0;
  double seconds = 0;
};

StoreWrites ReadStoreWrites(int port) {
  httplib::Client c("127.0.0.1", port);
  auto res = c.Get("/metrics");
  StoreWrites out;
  if (!res || res->status != 200) return out;
  auto value = [&res](std::string_view name) {
    const size_t at = res->body.find("\n" + std::string(name) + " ");
    return at == std::string::npos ? 0.0 : std::atof(res->body.c_str() + at + name.size() + 2);
  };
  out.count = value("idem_store_write_seconds_count");
  out.seconds = value("idem_store_write_seconds_sum");
  return out;
}

std::string Claim(const std::string& identity) {
  return PostRequest("/v1/work/claim",
                     R"({"kind":"send_reply","identity":)" + identity + R"(,"lease":"60s"})");
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 5;
  int only_conns = 0;  // --conns N: only the rows at N connections
  std::string only;    // --only TEXT: only the rows whose name holds TEXT
  bool by_thread = false;
  bool tcp_only = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--by-thread") by_thread = true;
    if (std::string(argv[i]) == "--tcp-only") tcp_only = true;
    if (i + 1 == argc) break;
    if (std::string(argv[i]) == "--seconds") seconds = std::atof(argv[i + 1]);
    if (std::string(argv[i]) == "--conns") only_conns = std::atoi(argv[i + 1]);
    if (std::string(argv[i]) == "--only") only = argv[i + 1];
  }
  auto wanted = [only_conns](int conns) { return only_conns == 0 || only_conns == conns; };
  BenchDaemon daemon;
  daemon.unix_socket = !tcp_only;
  if (!daemon.Start()) return 1;
  const int port = daemon.port;
  std::printf("idem bench_work_http: %.0f s per row, %u cores, store sync=true\n\n", seconds,
              std::thread::hardware_concurrency());
  std::printf("%-40s %5s %12s %10s %10s %8s %10s\n", "row", "conns", "req/s", "p50 us", "p99 us",
              "errors", "cpu us/op");
  // Runs one row and prints it with the daemon's CPU time per operation.
  auto measured = [&](const char* name, int conns, const std::function<LoadResult()>& load) {
    if (!only.empty() && std::string(name).find(only) == std::string::npos) return LoadResult{};
    const double cpu_before = daemon.CpuMillis();
    const auto threads_before = daemon.CpuByThread();
    const auto self_before = BenchDaemon::ProcCpu("/proc/self/stat");
    const StoreWrites writes_before = by_thread ? ReadStoreWrites(port) : StoreWrites{};
    LoadResult r = load();
    const auto self_after = BenchDaemon::ProcCpu("/proc/self/stat");
    const StoreWrites writes_after = by_thread ? ReadStoreWrites(port) : StoreWrites{};
    Row(name, conns, r, daemon.CpuMillis() - cpu_before);
    if (by_thread && r.requests > 0) {
      const double ops = static_cast<double>(r.requests);
      auto per_op = [ops](double ms) { return ms * 1000.0 / ops; };
      std::vector<std::pair<double, std::string>> parts;
      double user_us = 0, system_us = 0, loops_user_us = 0;
      for (const auto& [thread, cpu] : daemon.CpuByThread()) {
        auto before = threads_before.find(thread);
        const BenchDaemon::Cpu was =
            before == threads_before.end() ? BenchDaemon::Cpu{} : before->second;
        const double user = per_op(cpu.user_ms - was.user_ms);
        const double system = per_op(cpu.system_ms - was.system_ms);
        user_us += user;
        system_us += system;
        if (thread == "idem-loop") loops_user_us = user;
        if (user + system >= 0.05) parts.emplace_back(user + system, thread);
      }
      std::sort(parts.rbegin(), parts.rend());
      std::printf("    cpu us/op by thread:");
      for (const auto& [us, thread] : parts) std::printf(" %s %.1f", thread.c_str(), us);
      // The load generator shares the machine: what it takes is not the daemon's.
      BenchDaemon::Cpu self;
      if (self_before && self_after) {
        self = {self_after->user_ms - self_before->user_ms,
                self_after->system_ms - self_before->system_ms};
      }
      std::printf(" (load generator %.1f)\n", per_op(self.total()));
      // The kernel's share (system calls, the loopback's delivery, fsync)
      // and what is left once the event loops' own code is taken out: the
      // most this row could reach on this machine if that code cost nothing.
      const double rest_us = user_us + system_us - loops_user_us + per_op(self.total());
      std::printf(
          "    cpu us/op: daemon user %.1f, system %.1f; load generator user %.1f, "
          "system %.1f\n",
          user_us, system_us, per_op(self.user_ms), per_op(self.system_ms));
      if (rest_us > 0) {
        std::printf(
            "    all but the event loops' user time: %.1f us/op, at most %.0f ops/s on "
            "%u cores\n",
            rest_us, std::thread::hardware_concurrency() * 1e6 / rest_us,
            std::thread::hardware_concurrency());
      }
      // How well the group commit shares its writes: DB::Write calls per
      // operation and how long each took (fsync included).
      const double writes = writes_after.count - writes_before.count;
      if (writes > 0) {
        std::printf("    store writes: %.3f per op, %.0f us each\n",
                    writes / static_cast<double>(r.requests),
                    (writes_after.seconds - writes_before.seconds) * 1e6 / writes);
      }
    }
    return r;
  };
  if (wanted(64)) {
    measured("GET /healthz (bare HTTP reference)", 64,
             [&] { return RunLoad(port, GetRequest("/healthz"), 64, seconds); });
  }
  // New work at 1, 16 and 64 connections: every operation claims a unique
  // identity (one durable write), then, with `follow_up`, completes it.
  uint64_t base = 0;
  auto new_work_rows = [&](const char* name, const char* text, const FollowUp& follow_up,
                           const Endpoint& to, std::vector<int> conns_list) {
    for (int conns : conns_list) {
      if (!wanted(conns)) continue;
      const uint64_t offset = base;
      LoadResult r = measured(name, conns, [&] {
        return RunLoadGen(
            to,
            [offset, text](uint64_t seq) {
              return Claim(R"({"ticket_id":)" + std::to_string(offset + seq) + R"(,"text":")" +
                           text + R"("})");
            },
            conns, seconds, 2, follow_up);
      });
      base += static_cast<uint64_t>(r.requests + r.errors) + 1'000'000;
    }
  };
  new_work_rows("POST /v1/work/claim (new work, fsync)", "bench", nullptr, port, {1, 16, 64});
  // Claim + complete: the whole client-executed unit of work, two durable
  // writes (the complete goes through a worker and the shared group commit).
  // The load generator shares the two cores with the daemon: it picks the
  // two ids out of the claim's answer (hex, never escaped) rather than
  // parsing and re-encoding JSON (README, session 10).
  const FollowUp complete = [](std::string_view claimed) {
    auto member = [claimed](std::string_view name) {
      const std::string quoted = "\"" + std::string(name) + "\":\"";
      const size_t at = claimed.find(quoted);
      if (at == std::string_view::npos) return std::string_view();
      const size_t from = at + quoted.size();
      const size_t to = claimed.find('"', from);
      return to == std::string_view::npos ? std::string_view() : claimed.substr(from, to - from);
    };
    const std::string_view work_id = member("work_id");
    const std::string_view token = member("lease_token");
    if (work_id.empty() || token.empty()) return std::string("BAD");
    std::string body = R"({"lease_token":")" + std::string(token) + R"(","result":{"sent":true}})";
    return PostRequest("/v1/work/" + std::string(work_id) + "/complete", body);
  };
  new_work_rows("claim + complete (2 fsynced writes), ops", "cc", complete, port, {1, 16, 64});
  // Duplicates of done work: answered 200 with the original result from a
  // read, without a write or an fsync.
  {
    httplib::Client c("127.0.0.1", port);
    const std::string body = R"({"kind":"send_reply","identity":{"ticket_id":-1,"text":"dup"}})";
    auto claimed = c.Post("/v1/work/claim", body, "application/json");
    if (!claimed || claimed->status != 201) {
      std::fprintf(stderr, "claim for the duplicate row failed\n");
      return 1;
    }
    auto j = nlohmann::json::parse(claimed->body);
    std::string done =
        nlohmann::json{{"lease_token", j["lease_token"]}, {"result", {{"ok", true}}}}.dump();
    c.Post(("/v1/work/" + j["work_id"].get<std::string>() + "/complete").c_str(), done,
           "application/json");
  }
  const std::string dup = Claim(R"({"ticket_id":-1,"text":"dup"})");
  for (int conns : {1, 64})
    if (wanted(conns))
      measured("POST /v1/work/claim (duplicate of done)", conns,
               [&] { return RunLoad(port, dup, conns, seconds); });
  // The same HTTP over the Unix socket: what TCP's loopback path costs.
  if (!tcp_only) {
    new_work_rows("claim + complete, Unix socket, ops", "cu", complete,
                  Endpoint(daemon.socket_path()), {64});
  }
  return 0;
}
