// bench_work_http: durable journal claims over HTTP against the real daemon
// binary (default config, kind send_reply, store sync=true): new-work claims
// (each one a durable, fsynced write) at 1, 16 and 64 connections, claim +
// complete operations (two requests, two durable writes) at 1, 16 and 64,
// and duplicate claims of done work (a read, no fsync) at 1 and 64, beside
// the bare HTTP reference route.
//
//   build/bench/bench_work_http [--seconds 5]
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "bench/loadgen.h"

using namespace idem::bench;

namespace {

void Row(const char* name, int conns, const LoadResult& r) {
  std::printf("%-40s %5d %12.0f %10.0f %10.0f %8ld\n", name, conns, r.requests_per_s, r.p50_us,
              r.p99_us, r.errors);
}

std::string Claim(const std::string& identity) {
  return PostRequest("/v1/work/claim",
                     R"({"kind":"send_reply","identity":)" + identity + R"(,"lease":"60s"})");
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 5;
  int only_conns = 0;  // --conns N: only the rows at N connections
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--seconds") seconds = std::atof(argv[i + 1]);
    if (std::string(argv[i]) == "--conns") only_conns = std::atoi(argv[i + 1]);
  }
  auto wanted = [only_conns](int conns) { return only_conns == 0 || only_conns == conns; };
  BenchDaemon daemon;
  if (!daemon.Start()) return 1;
  const int port = daemon.port;
  std::printf("idem bench_work_http: %.0f s per row, %u cores, store sync=true\n\n", seconds,
              std::thread::hardware_concurrency());
  std::printf("%-40s %5s %12s %10s %10s %8s\n", "row", "conns", "req/s", "p50 us", "p99 us",
              "errors");
  if (wanted(64)) {
    Row("GET /healthz (bare HTTP reference)", 64,
        RunLoad(port, GetRequest("/healthz"), 64, seconds));
  }
  // New work at 1, 16 and 64 connections: every operation claims a unique
  // identity (one durable write), then, with `follow_up`, completes it.
  uint64_t base = 0;
  auto new_work_rows = [&](const char* name, const char* text, const FollowUp& follow_up) {
    for (int conns : {1, 16, 64}) {
      if (!wanted(conns)) continue;
      const uint64_t offset = base;
      LoadResult r = RunLoadGen(
          port,
          [offset, text](uint64_t seq) {
            return Claim(R"({"ticket_id":)" + std::to_string(offset + seq) + R"(,"text":")" + text +
                         R"("})");
          },
          conns, seconds, 2, follow_up);
      base += static_cast<uint64_t>(r.requests + r.errors) + 1'000'000;
      Row(name, conns, r);
    }
  };
  new_work_rows("POST /v1/work/claim (new work, fsync)", "bench", nullptr);
  // Claim + complete: the whole client-executed unit of work, two durable
  // writes (the complete goes through a worker and the shared group commit).
  new_work_rows("claim + complete (2 fsynced writes), ops", "cc", [](std::string_view claimed) {
    auto j = nlohmann::json::parse(claimed, nullptr, false);
    if (j.is_discarded() || !j.contains("work_id")) return std::string("BAD");
    std::string body =
        nlohmann::json{{"lease_token", j["lease_token"]}, {"result", {{"sent", true}}}}.dump();
    return PostRequest("/v1/work/" + j["work_id"].get<std::string>() + "/complete", body);
  });
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
      Row("POST /v1/work/claim (duplicate of done)", conns, RunLoad(port, dup, conns, seconds));
  return 0;
}
