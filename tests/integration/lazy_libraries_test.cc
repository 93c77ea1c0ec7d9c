// libcurl and libpq are loaded only when first needed (issue 9, idle RSS):
// the real daemon's /proc/<pid>/maps shows which shared libraries it mapped.
#include <dlfcn.h>
#include <doctest/doctest.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "daemon/core/crypto.h"
#include "daemon/store/postgres/pg_client.h"
#include "tests/fakes/fake_effector.h"
#include "tests/fakes/fake_provider.h"
#include "tests/integration/harness.h"

namespace idem::testing {
namespace {

using fakes::FakeEffectorServer;
using fakes::FakeProviderServer;
using fakes::FakeReply;

// True if the process maps a file whose name contains `library`
// ("/libcurl.so", "/libpq.so").
bool Maps(const DaemonProcess& daemon, const std::string& library) {
  std::ifstream in("/proc/" + std::to_string(daemon.pid()) + "/maps");
  REQUIRE(in.good());
  std::string line;
  while (std::getline(in, line)) {
    if (line.find(library) != std::string::npos) return true;
  }
  return false;
}

// The file the dynamic loader finds for `soname` ("libcurl.so.4" ->
// "/usr/lib/x86_64-linux-gnu/libcurl.so.4.8.0"), or "".
std::string LibraryFile(const char* soname) {
  void* handle = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return "";
  link_map* map = nullptr;
  std::string path;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr) {
    char* real = realpath(map->l_name, nullptr);
    if (real != nullptr) path = real;
    free(real);
  }
  dlclose(handle);
  return path;
}

struct Run {
  bool possible = false;  // false: this machine cannot hide a library
  int exit_code = -1;
  std::string out;  // stdout and stderr
};

// Runs `env_prefix idem args` (a shell line) in a private mount namespace
// where the file of `soname` is empty, as if its Debian package were not
// installed: dlopen then fails ("file too short"). Needs unprivileged user
// namespaces (unshare -rm); without them, possible is false.
Run RunIdemWithout(const char* soname, const std::string& env_prefix, const std::string& args) {
  Run run;
  if (std::system("unshare -rm true >/dev/null 2>&1") != 0) return run;
  const std::string file = LibraryFile(soname);
  REQUIRE_MESSAGE(!file.empty(), soname);
  run.possible = true;
  std::string cmd =
      env_prefix + " timeout 60 unshare -rm sh -c 'mount --bind /dev/null \"$0\" && exec \"$@\"' " +
      file + " " + IDEM_BINARY + " " + args + " 2>&1";
  CliResult r = RunShell(cmd);
  run.exit_code = r.exit_code;
  run.out = std::move(r.out);
  return run;
}

const char* kDecide =
    R"({"step":"triage_ticket","input":{"ticket_id":"T-1","text":"where is my refund"}})";

TEST_CASE("a daemon on RocksDB and a scripted provider maps neither libcurl nor libpq") {
  TempDir dir;
  std::string config = WriteTestConfig(dir, kQuestionRules);
  std::string err;
  auto daemon = DaemonProcess::Start({config, dir.path() + "/data", {}, {}}, &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);
  // Serving and deciding need neither.
  auto decided = daemon->Client()->Post("/v1/decide", kDecide, "application/json");
  REQUIRE(decided);
  CHECK(decided->status == 200);
  CHECK_FALSE(Maps(*daemon, "/libcurl.so"));
  CHECK_FALSE(Maps(*daemon, "/libpq.so"));
  // The process does map shared libraries (the check can see them).
  CHECK(Maps(*daemon, "/libcrypto.so"));
}

TEST_CASE("an HTTP effector loads libcurl on its first call, not when the daemon starts") {
  auto target = FakeEffectorServer::Start();
  REQUIRE(target != nullptr);
  TempDir dir;
  std::string config =
      WriteTestConfig(dir, kQuestionRules,
                      "actions:\n"
                      "  send_invoice:\n"
                      "    identity: {fields: [/invoice_id], version: v1}\n"
                      "    window: forever\n"
                      "    on_duplicate: return_original\n"
                      "    effector: {http: {method: POST, url: \"" +
                          target->base_url() +
                          "/records\", idempotency: header}}\n"
                          "    retry: {attempts: 2, base: 10ms, cap: 20ms, timeout: 5s}\n");
  std::string err;
  auto daemon = DaemonProcess::Start({config, dir.path() + "/data", {}, {}}, &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);
  CHECK_FALSE(Maps(*daemon, "/libcurl.so"));

  auto done = daemon->Client()->Post("/v1/actions/send_invoice", {{"Idempotency-Key", "\"l-1\""}},
                                     R"({"args":{"invoice_id":"INV-1"}})", "application/json");
  REQUIRE(done);
  CHECK(done->status == 201);
  CHECK(target->stats().effects == 1);
  CHECK(Maps(*daemon, "/libcurl.so"));
  CHECK_FALSE(Maps(*daemon, "/libpq.so"));
}

TEST_CASE("an LLM provider over HTTP has libcurl loaded when the daemon starts, and decides") {
  auto model = FakeProviderServer::Start();
  REQUIRE(model != nullptr);
  model->SetDefault(FakeReply::Output({{"category", "question"},
                                       {"priority", "normal"},
                                       {"summary", "q"},
                                       {"actions", Json::array()}}));
  TempDir dir;
  const std::string src = IDEM_SOURCE_DIR;
  std::string config = dir.File("idem.yaml",
                                "server:\n  listen: 127.0.0.1:0\n  threads: 8\n"
                                "store:\n  engine: rocksdb\n  path: " +
                                    dir.path() +
                                    "/data\n"
                                    "providers:\n"
                                    "  fake:\n"
                                    "    type: openai_compatible\n"
                                    "    base_url: " +
                                    model->base_url() +
                                    "/v1\n"
                                    "    api_key_env: IDEM_TEST_LAZY_KEY\n"
                                    "steps:\n"
                                    "  triage_ticket:\n"
                                    "    provider: fake\n"
                                    "    model: m-1\n"
                                    "    prompt:\n"
                                    "      template: " +
                                    src +
                                    "/config/prompts/triage_ticket.mustache\n"
                                    "      version: v1\n"
                                    "    output_schema: " +
                                    src +
                                    "/schemas/examples/triage_ticket.v1.json\n"
                                    "    attempts: 1\n");
  std::string err;
  auto daemon = DaemonProcess::Start(
      {config, dir.path() + "/data", {}, {{"IDEM_TEST_LAZY_KEY", "sk-lazy"}}}, &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);
  // Loaded at start, so that a missing libcurl stops the start instead of
  // failing every decision.
  CHECK(Maps(*daemon, "/libcurl.so"));
  CHECK(model->calls() == 0);
  auto decided = daemon->Client()->Post("/v1/decide", kDecide, "application/json");
  REQUIRE(decided);
  CHECK(decided->status == 200);
  CHECK(model->calls() == 1);
  CHECK_FALSE(Maps(*daemon, "/libpq.so"));
}

}  // namespace

TEST_CASE("without libcurl a daemon with an LLM provider does not start, and names the package") {
  TempDir dir;
  const std::string src = IDEM_SOURCE_DIR;
  std::string config = dir.File("idem.yaml",
                                "server:\n  listen: 127.0.0.1:0\n"
                                "store:\n  engine: rocksdb\n  path: " +
                                    dir.path() +
                                    "/data\n"
                                    "providers:\n"
                                    "  llm:\n"
                                    "    type: openai_compatible\n"
                                    "    base_url: http://127.0.0.1:1/v1\n"
                                    "steps:\n"
                                    "  triage_ticket:\n"
                                    "    provider: llm\n"
                                    "    model: m-1\n"
                                    "    prompt:\n"
                                    "      template: " +
                                    src +
                                    "/config/prompts/triage_ticket.mustache\n"
                                    "      version: v1\n"
                                    "    output_schema: " +
                                    src + "/schemas/examples/triage_ticket.v1.json\n");
  Run run = RunIdemWithout("libcurl.so.4", "", "serve --config " + config);
  if (!run.possible) {
    MESSAGE("skipped: unshare -rm is not allowed here");
    return;
  }
  INFO(run.out);
  CHECK(run.exit_code == 1);
  CHECK(run.out.find("provider llm: libcurl.so.4 cannot be loaded") != std::string::npos);
  CHECK(run.out.find("install the Debian package libcurl4") != std::string::npos);
}

TEST_CASE("without libcurl a client command fails naming libcurl.so.4 and its package") {
  Run run = RunIdemWithout("libcurl.so.4", "", "plans ls --url http://127.0.0.1:1");
  if (!run.possible) {
    MESSAGE("skipped: unshare -rm is not allowed here");
    return;
  }
  INFO(run.out);
  CHECK(run.exit_code != 0);
  CHECK(run.out.find("libcurl.so.4 cannot be loaded") != std::string::npos);
  CHECK(run.out.find("install the Debian package libcurl4") != std::string::npos);
}

TEST_CASE("without libpq a daemon on PostgreSQL does not start, and names the package") {
  TempDir dir;
  std::string config = OnPostgres(dir, WriteTestConfig(dir, kQuestionRules),
                                  "  url_env: IDEM_LAZY_PG_URL\n  schema: lazy_none\n");
  // No server is needed: the library is missing before any connection.
  Run run = RunIdemWithout("libpq.so.5", "IDEM_LAZY_PG_URL='host=127.0.0.1 port=1'",
                           "serve --config " + config);
  if (!run.possible) {
    MESSAGE("skipped: unshare -rm is not allowed here");
    return;
  }
  INFO(run.out);
  CHECK(run.exit_code == 1);
  CHECK(run.out.find("libpq.so.5 cannot be loaded") != std::string::npos);
  CHECK(run.out.find("install the Debian package libpq5") != std::string::npos);
}

// On the PostgreSQL server of IDEM_TEST_PG_URL (or the PG* variables), like
// tests/integration/postgres_cluster_test.cc.
TEST_SUITE("postgres") {
  TEST_CASE("a daemon on PostgreSQL loads libpq when it opens the store, and not libcurl") {
    const char* env_url = std::getenv("IDEM_TEST_PG_URL");
    const std::string url = env_url != nullptr ? env_url : "";
    const std::string schema = "lazy_" + RandomHex(6);
    TempDir dir;
    std::string config = OnPostgres(dir, WriteTestConfig(dir, kQuestionRules),
                                    "  url_env: IDEM_PG_URL\n  schema: " + schema + "\n");
    std::string err;
    auto daemon =
        DaemonProcess::Start({config, dir.path() + "/data", {}, {{"IDEM_PG_URL", url}}}, &err);
    REQUIRE_MESSAGE(daemon != nullptr, err);
    auto decided = daemon->Client()->Post("/v1/decide", kDecide, "application/json");
    REQUIRE(decided);
    CHECK(decided->status == 200);
    CHECK(Maps(*daemon, "/libpq.so"));
    CHECK_FALSE(Maps(*daemon, "/libcurl.so"));
    daemon.reset();
    pg::PoolOptions po;
    po.conninfo = url;
    po.schema = schema;
    po.size = 1;
    auto pool = pg::Pool::Open(po);
    if (pool.ok()) {
      (void)(*pool)->Exec("DROP SCHEMA IF EXISTS " + pg::QuoteIdent(schema) + " CASCADE");
    }
  }
}

}  // namespace idem::testing
