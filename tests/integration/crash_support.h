// Shared by the crash tests: crash_test.cc (one daemon on RocksDB) and
// pg_crash_test.cc (two daemons on one PostgreSQL schema). The fake effector
// runs as its own process, so that it outlives every kill and counts the
// effects of all daemons; the items are N actions over three kinds, one per
// idempotency level of the HTTP effector.
#pragma once

#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "daemon/apply/work_identity.h"
#include "tests/integration/harness.h"

namespace idem::testing {

inline constexpr char kCrashRules[] = R"(rules: []
default:
  output: '{"category":"question","priority":"normal","summary":"a question","actions":[]}'
)";

inline int EnvInt(const char* name, int def) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : def;
}

// idem_fake_effector as a child process.
class FakeEffectorProcess {
 public:
  ~FakeEffectorProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      waitpid(pid_, &status, 0);
    }
  }

  bool Start() {
    int fds[2];
    if (pipe(fds) != 0) return false;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], 1);
      close(fds[0]);
      close(fds[1]);
      execl(IDEM_FAKE_EFFECTOR, IDEM_FAKE_EFFECTOR, "--port", "0", "--threads", "96",
            static_cast<char*>(nullptr));
      _exit(127);
    }
    close(fds[1]);
    FILE* out = fdopen(fds[0], "r");
    if (out == nullptr) return false;
    bool ok = std::fscanf(out, "port %d", &port_) == 1 && port_ > 0;
    std::fclose(out);
    return ok;
  }

  // Every request waits this long first: keeps effects in flight when the
  // kills land.
  bool SetLatencyMs(int ms) const {
    httplib::Client c("127.0.0.1", port_);
    auto res = c.Post("/_faults", Json{{"latency_ms", ms}}.dump(), "application/json");
    return res && res->status == 200;
  }

  int port() const { return port_; }
  std::string url(const std::string& path) const {
    return "http://127.0.0.1:" + std::to_string(port_) + path;
  }
  Json Get(const std::string& path) const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(10, 0);
    auto res = c.Get(path);
    if (!res || res->status != 200) return nullptr;
    return Json::parse(res->body, nullptr, false);
  }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

struct CrashItem {
  std::string kind;
  Json args;
  std::string work_id;
  // 0: not yet; 1: done; 2: dead (what the clients saw; a test may add its own).
  std::atomic<int> settled{0};
};

// The three kinds (header, upsert, check_then_act), `timeout` per HTTP call.
inline std::string CrashActionsYaml(const FakeEffectorProcess& fake,
                                    const std::string& timeout = "1s") {
  auto kind = [&](const std::string& name, const std::string& effector) {
    return "  " + name +
           ":\n"
           "    identity: {fields: [/n], version: v1}\n"
           "    window: forever\n"
           "    on_duplicate: return_original\n"
           "    effector: {http: " +
           effector +
           "}\n"
           "    retry: {attempts: 100, base: 50ms, cap: 400ms, timeout: " +
           timeout + "}\n";
  };
  return "actions:\n" +
         kind("crash_header",
              "{method: POST, url: \"" + fake.url("/replies") + "\", idempotency: header}") +
         kind("crash_upsert", "{method: PUT, url: \"" + fake.url("/items/{key}") +
                                  "\", idempotency: upsert, upsert_key: /n}") +
         kind("crash_cta", "{method: POST, url: \"" + fake.url("/records") +
                               "\", idempotency: check_then_act, lookup: {url: \"" +
                               fake.url("/records?fingerprint={fingerprint}") + "\"}}");
}

// Fills `items` (sized N) round-robin over the three kinds, with their work_ids.
inline void InitCrashItems(std::vector<CrashItem>& items) {
  const std::vector<std::string> kinds = {"crash_header", "crash_upsert", "crash_cta"};
  for (size_t i = 0; i < items.size(); ++i) {
    CrashItem& it = items[i];
    it.kind = kinds[i % kinds.size()];
    it.args = {{"n", it.kind + "-" + std::to_string(i)}, {"text", "invoice #" + std::to_string(i)}};
    ActionConfig action;
    action.name = it.kind;
    action.identity_fields = {"/n"};
    action.identity_version = "v1";
    auto id = ActionWorkId(action, it.args);
    REQUIRE(id.ok());
    it.work_id = id->key;
  }
}

// The end state, read through a crash-free daemon and the fake effector.
struct CrashTally {
  int done = 0, dead = 0, other = 0;
  Json stats;
  size_t target_records = 0;  // replies + upserted items + records at the target
};

inline CrashTally TallyCrashTest(DaemonProcess& daemon, const FakeEffectorProcess& fake,
                                 const std::vector<CrashItem>& items) {
  CrashTally t;
  auto client = daemon.Client();
  for (const CrashItem& it : items) {
    auto res = client->Get("/v1/work/" + it.work_id);
    REQUIRE(res);
    REQUIRE(res->status == 200);
    const std::string state = Json::parse(res->body).value("state", "");
    if (state == "done") {
      ++t.done;
    } else if (state == "dead") {
      ++t.dead;
    } else {
      ++t.other;
    }
  }
  t.stats = fake.Get("/_stats");
  REQUIRE(t.stats.is_object());
  t.target_records =
      fake.Get("/replies").size() + fake.Get("/items").size() + fake.Get("/records").size();
  return t;
}

// Exactly N effects, none twice, every item done (100 attempts each: none
// runs out), none lost.
inline void CheckExactlyOnce(const CrashTally& t, size_t n) {
  CHECK(t.other == 0);
  CHECK(static_cast<size_t>(t.done + t.dead) == n);
  CHECK(t.dead == 0);
  CHECK(t.stats["effects"] == n);
  CHECK(t.stats["duplicates_by_key"] == 0);
  CHECK(t.target_records == n);
}

}  // namespace idem::testing
