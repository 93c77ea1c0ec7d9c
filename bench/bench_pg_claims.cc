// bench_pg_claims: durable claims of new work at 64 connections on
// PostgreSQL, side by side in one run:
//   - pgbench running idem's claim statement directly (one statement per
//     transaction, 64 clients), the raw-PostgreSQL reference;
//   - one idem daemon (store.engine: postgres) driven over HTTP;
//   - two idem daemons on the same database, 32 connections each.
// The database comes from the PG* variables (run it under pg_virtualenv, as
// scripts/bench_pg.sh does) or IDEM_BENCH_PG_URL; each run uses its own
// schema.
//
//   pg_virtualenv -- build/bench/bench_pg_claims [--seconds 5] [--conns 64]
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/loadgen.h"
#include "daemon/store/postgres/pg_store.h"

using namespace idem::bench;

namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The repository's default config with its store block pointed at
// PostgreSQL; written beside it so its relative paths still resolve.
std::string WriteConfig(const std::string& schema) {
  const std::string dir = std::string(IDEM_SOURCE_DIR) + "/config";
  std::string text = ReadFile(dir + "/idem.yaml");
  std::regex store_block(R"(store:\n(  [^\n]*\n)+)");
  text =
      std::regex_replace(text, store_block,
                         "store:\n  engine: postgres\n  url_env: IDEM_PG_URL\n  schema: " + schema +
                             "\n  pool_size: 16\n",
                         std::regex_constants::format_first_only);
  const std::string path = dir + "/.bench_pg_" + std::to_string(getpid()) + ".yaml";
  std::ofstream(path) << text;
  return path;
}

std::string Claim(uint64_t n) {
  return PostRequest("/v1/work/claim", R"({"kind":"send_reply","identity":{"ticket_id":)" +
                                           std::to_string(n) + R"(,"text":"pg"},"lease":"60s"})");
}

// Runs `cmd` and returns its standard output.
std::string Capture(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

// idem's claim statement with its 15 request arrays filled by pgbench
// variables: one new work item per transaction, as one HTTP claim makes.
std::string PgbenchClaimScript() {
  const char* values[] = {
      "ARRAY['bench-' || :n]",                                      // work_id
      "ARRAY['send_reply']",                                        // kind
      "ARRAY[5]",                                                   // max_attempts
      "ARRAY['{\"ticket_id\":' || :n || '}']",                      // args
      "ARRAY['{\"ticket_id\":' || :n || '}']",                      // identity
      "ARRAY['']",                                                  // run_id
      "ARRAY['pgbench']",                                           // request_id
      "ARRAY['']",                                                  // trace_id
      "ARRAY[86400000]",                                            // window_ms
      "ARRAY[(extract(epoch FROM now()) * 1000)::bigint]",          // now_ms
      "ARRAY[(extract(epoch FROM now()) * 1000)::bigint + 60000]",  // locked_until_ms
      "ARRAY[md5(random()::text)]",                                 // lease_token
      "ARRAY['running']",                                           // state
      "ARRAY[1]",                                                   // attempt
      "ARRAY[0]",                                                   // next_attempt_at_ms
  };
  std::string sql = idem::pg::JournalClaimSql();
  std::string out;
  for (size_t i = 0; i < sql.size(); ++i) {
    if (sql[i] == '$' && i + 1 < sql.size() &&
        std::isdigit(static_cast<unsigned char>(sql[i + 1]))) {
      size_t j = i + 1;
      while (j < sql.size() && std::isdigit(static_cast<unsigned char>(sql[j]))) ++j;
      const int k = std::atoi(sql.substr(i + 1, j - i - 1).c_str());
      out += std::string("(") + values[k - 1] + ")";
      i = j - 1;
    } else {
      out += sql[i];
    }
  }
  // pgbench reads one statement per line.
  for (char& c : out) {
    if (c == '\n') c = ' ';
  }
  return "\\set n random(1, 2000000000)\n" + out + ";\n";
}

void Row(const char* name, int conns, double per_s, double p50_us, double p99_us, long errors) {
  std::printf("%-46s %5d %10.0f %10.0f %10.0f %8ld\n", name, conns, per_s, p50_us, p99_us, errors);
}

}  // namespace

int main(int argc, char** argv) {
  // Line-buffered: the daemons are forked children, and a buffer still
  // pending at fork would be written twice.
  setvbuf(stdout, nullptr, _IOLBF, 0);
  double seconds = 5;
  int conns = 64;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--seconds") seconds = std::atof(argv[i + 1]);
    if (std::string(argv[i]) == "--conns") conns = std::atoi(argv[i + 1]);
  }
  const char* url = std::getenv("IDEM_BENCH_PG_URL");
  setenv("IDEM_PG_URL", url ? url : "", 1);
  const std::string schema = "bench_" + std::to_string(getpid());
  const std::string config = WriteConfig(schema);

  std::printf("idem bench_pg_claims: %.0f s per row, %u cores, schema %s\n\n", seconds,
              std::thread::hardware_concurrency(), schema.c_str());
  std::printf("%-46s %5s %10s %10s %10s %8s\n", "row", "conns", "claims/s", "p50 us", "p99 us",
              "errors");

  // One daemon first: it applies the schema the pgbench row then uses.
  double one = 0;
  {
    BenchDaemon d;
    d.config = config;
    if (!d.Start()) return 1;
    LoadResult r = RunLoadGen(
        d.port, [](uint64_t s) { return Claim(1'000'000'000 + s); }, conns, seconds, 2);
    one = r.requests_per_s;
    Row("idem, 1 daemon, POST /v1/work/claim", conns, r.requests_per_s, r.p50_us, r.p99_us,
        r.errors);
  }
  // Two daemons on the same schema, half the connections each.
  double two = 0;
  {
    BenchDaemon a, b;
    a.config = b.config = config;
    if (!a.Start() || !b.Start()) return 1;
    LoadResult ra, rb;
    std::thread ta([&] {
      ra = RunLoadGen(
          a.port, [](uint64_t s) { return Claim(2'000'000'000 + 2 * s); }, conns / 2, seconds, 1);
    });
    std::thread tb([&] {
      rb = RunLoadGen(
          b.port, [](uint64_t s) { return Claim(2'000'000'000 + 2 * s + 1); }, conns - conns / 2,
          seconds, 1);
    });
    ta.join();
    tb.join();
    two = ra.requests_per_s + rb.requests_per_s;
    Row("idem, 2 daemons, POST /v1/work/claim", conns, two, std::max(ra.p50_us, rb.p50_us),
        std::max(ra.p99_us, rb.p99_us), ra.errors + rb.errors);
  }
  // pgbench: idem's claim statement, one per transaction.
  double raw = 0;
  {
    const std::string script = "/tmp/bench_pg_claim_" + std::to_string(getpid()) + ".sql";
    std::ofstream(script) << PgbenchClaimScript();
    std::string conninfo = url ? std::string(" '") + url + "'" : "";
    std::string out =
        Capture("PGOPTIONS='-c search_path=" + schema + "' pgbench -n -M prepared -c " +
                std::to_string(conns) + " -j 2 -T " + std::to_string(static_cast<int>(seconds)) +
                " -f " + script + conninfo + " 2>&1");
    std::smatch m;
    std::regex tps(R"(tps = ([0-9.]+))");
    std::regex lat(R"(latency average = ([0-9.]+) ms)");
    if (std::regex_search(out, m, tps)) raw = std::atof(m[1].str().c_str());
    double avg_ms = 0;
    if (std::regex_search(out, m, lat)) avg_ms = std::atof(m[1].str().c_str());
    if (raw == 0) std::fprintf(stderr, "pgbench failed:\n%s\n", out.c_str());
    Row("pgbench, the claim statement (avg latency)", conns, raw, avg_ms * 1000, 0, 0);
    std::filesystem::remove(script);
  }
  std::filesystem::remove(config);
  if (raw > 0) {
    std::printf("\nidem / pgbench: 1 daemon %.2f, 2 daemons %.2f\n", one / raw, two / raw);
  }
  return 0;
}
