// The daemon's front door under resource limits and signals: running out
// of file descriptors, SIGHUP, SIGTERM.
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <future>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/fakes/fake_effector.h"
#include "tests/integration/harness.h"

namespace idem::testing {
namespace {

using namespace std::chrono_literals;
using fakes::FakeEffectorServer;

// A TCP connection to 127.0.0.1:port that only connects; -1 on failure.
int RawConnect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A daemon on the question-only rules, in `dir`.
std::unique_ptr<DaemonProcess> StartPlainDaemon(const TempDir& dir) {
  std::string config = WriteTestConfig(dir, kQuestionRules);
  std::string err;
  auto daemon = DaemonProcess::Start({config, dir.path() + "/data", {}, {}}, &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);
  return daemon;
}

bool Healthy(const DaemonProcess& d) {
  auto c = d.Client();
  c->set_connection_timeout(1);
  c->set_read_timeout(1);
  auto r = c->Get("/healthz");
  return r && r->status == 200;
}

// Everything the daemon answers to `bytes` on a new connection, until it closes.
std::string RawExchange(int port, const std::string& bytes) {
  const int fd = RawConnect(port);
  REQUIRE(fd >= 0);
  REQUIRE(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(bytes.size()));
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;)
    out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

TEST_CASE("a request refused for a header names it in the problem's pointer") {
  TempDir dir;
  auto daemon = StartPlainDaemon(dir);
  const std::pair<std::string, std::string> cases[] = {
      {"GET /v1/dead-letters HTTP/1.1\r\nConnection: close\r\n\r\n", "header:Host"},
      {"GET /v1/dead-letters HTTP/1.1\r\nHost: localhost\r\nHost: localhost\r\n\r\n",
       "header:Host"},
      {"POST /v1/decide HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1x\r\n\r\n",
       "header:Content-Length"},
      {"POST /v1/decide HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\n"
       "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
       "header:Transfer-Encoding"},
  };
  for (const auto& c : cases) {
    const std::string& request = c.first;  // not a binding: clang 14's CAPTURE cannot take one
    const std::string& pointer = c.second;
    CAPTURE(request);
    const std::string answer = RawExchange(daemon->port(), request);
    CHECK(answer.starts_with("HTTP/1.1 400 "));
    CHECK(answer.find("\"pointer\":\"" + pointer + "\"") != std::string::npos);
  }
}

TEST_CASE("the serving process keeps its name and runs on its allocator with its settings") {
  TempDir dir;
  auto daemon = StartPlainDaemon(dir);
  const std::string proc = "/proc/" + std::to_string(daemon->pid());
  // ps, top and pgrep show the daemon as idem, not as "exe" (the re-exec's
  // path), and so do its threads that name themselves after it.
  CHECK(ReadFile(proc + "/comm") == "idem\n");
  // Its threads carry their role (top -H, perf, gdb): per-thread CPU tells
  // the event loops from the store's writer without a profiler.
  // A thread names itself once it runs, which on a loaded machine can be
  // after /healthz answers: read the names until all are there, or 10 s.
  const std::vector<std::string> wanted = {"idem-loop",    "idem-handler", "idem-commit",
                                           "idem-trace",   "idem-sweeper", "idem-apply",
                                           "idem-recovery"};
  std::set<std::string> roles;
  WaitFor(
      [&] {
        roles.clear();
        for (const auto& task : std::filesystem::directory_iterator(proc + "/task")) {
          std::string name = ReadFile(task.path().string() + "/comm");
          if (!name.empty() && name.back() == '\n') name.pop_back();
          roles.insert(name);
        }
        return std::all_of(wanted.begin(), wanted.end(),
                           [&](const std::string& r) { return roles.count(r) == 1; });
      },
      10'000);
  for (const std::string& role : wanted) {
    CHECK_MESSAGE(roles.count(role) == 1, role);
  }
  const std::string environ_text = ReadFile(proc + "/environ");
  const bool tuned_glibc =
      environ_text.find(std::string("GLIBC_TUNABLES=glibc.malloc.tcache_count=128") + '\0') !=
      std::string::npos;
#if IDEM_DAEMON_JEMALLOC
  // The binary allocates through jemalloc (CMakeLists.txt), and so does
  // not re-execute itself for glibc's tunables.
  CHECK(ReadFile(proc + "/maps").find("/libjemalloc.so") != std::string::npos);
  CHECK_FALSE(tuned_glibc);
#elif !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  // The re-exec gave the process glibc's thread-cache size (main.cc).
  CHECK(tuned_glibc);
#endif
}

TEST_CASE("out of file descriptors the daemon pauses accepting instead of spinning") {
  TempDir dir;
  std::string config = WriteTestConfig(dir, kQuestionRules);
  DaemonArgs args{config, dir.path() + "/data", {}, {}};
  args.max_open_files = 96;  // soft and hard: the daemon cannot raise it
  // Under clang's UBSan the vptr check reads a vtable through a pipe, and
  // with no descriptor free it reports a sound call as "invalid vptr"
  // (CMakeLists.txt). That check is built recoverable; here, and only here,
  // it may report and go on. Other builds ignore the variable.
  args.env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=0";
  std::string err;
  auto daemon = DaemonProcess::Start(args, &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);

  // More connections than the daemon has descriptors: the rest wait in the
  // listen backlog with the listening socket readable all along.
  std::vector<int> held;
  for (int i = 0; i < 160; ++i) {
    int fd = RawConnect(daemon->port());
    if (fd >= 0) held.push_back(fd);
  }
  CHECK(held.size() >= 120);
  std::this_thread::sleep_for(300ms);
  long before = daemon->CpuMillis();
  std::this_thread::sleep_for(2s);
  long used = daemon->CpuMillis() - before;
  MESSAGE("daemon CPU over 2 s with descriptors exhausted: ", used, " ms");
  CHECK(used < 500);  // a loop spinning on accept() burns ~2000 ms here

  for (int fd : held) ::close(fd);
  auto deadline = std::chrono::steady_clock::now() + 10s;
  bool healthy = false;
  while (!healthy && std::chrono::steady_clock::now() < deadline) {
    healthy = Healthy(*daemon);
    if (!healthy) std::this_thread::sleep_for(100ms);
  }
  CHECK_MESSAGE(healthy, ReadFile(daemon->log_path()));  // serves again once descriptors free up
  auto c = daemon->Client();
  CHECK(MetricValue(*c, "idem_http_accept_paused_total") > 0);
}

// A daemon whose every decide waits `delay_ms` for its (scripted) model,
// holding a handler, with `server_lines` in place of the test config's
// "  threads: 96" line.
std::unique_ptr<DaemonProcess> StartSlowDecideDaemon(const TempDir& dir, int delay_ms,
                                                     const std::string& server_lines) {
  const std::string slow = R"(default:
  output: '{"category":"question","priority":"normal","summary":"q","actions":[]}'
  delay_ms: )" + std::to_string(delay_ms) +
                           "\n";
  std::string text = ReadFile(WriteTestConfig(dir, slow));
  const std::string from = "  threads: 96\n";
  REQUIRE(text.find(from) != std::string::npos);
  text.replace(text.find(from), from.size(), server_lines);
  std::string err;
  auto daemon =
      DaemonProcess::Start({dir.File("idem-slow.yaml", text), dir.path() + "/data", {}, {}}, &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);
  return daemon;
}

// A decide of ticket `i` on another thread; its status, -1 without answer.
std::future<int> SlowDecide(const DaemonProcess& daemon, int i) {
  return std::async(std::launch::async, [&daemon, i] {
    auto c = daemon.Client();
    c->set_read_timeout(20);
    auto r = c->Post("/v1/decide",
                     R"({"step":"triage_ticket","input":{"ticket_id":)" + std::to_string(i) +
                         R"(,"text":"slow"}})",
                     "application/json");
    return r ? r->status : -1;
  });
}

TEST_CASE("liveness answers 200 while every handler is busy and the handler queue is full") {
  TempDir dir;
  // Every decide waits 3 s for its model, holding a handler.
  auto daemon = StartSlowDecideDaemon(dir, 3000, "  threads: 2\n  max_queue: 1\n");

  // Two decides on the two handlers, a third in the one queue slot.
  std::vector<std::future<int>> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(SlowDecide(*daemon, i));
    std::this_thread::sleep_for(100ms);
  }
  std::this_thread::sleep_for(200ms);
  auto c = daemon->Client();
  c->set_read_timeout(2);
  // The queue is full: a further request is shed, readiness included (a
  // balancer sends traffic elsewhere for now)...
  auto shed = c->Get("/readyz", {{"X-Request-Id", "shed-readyz-1"}});
  REQUIRE(shed);
  CHECK(shed->status == 503);
  CHECK(shed->get_header_value("Retry-After") == "1");
  CHECK(Json::parse(shed->body)["type"] == "urn:idem:problem:Unavailable");
  CHECK(Json::parse(shed->body)["retryable"] == true);
  // It is counted under its route and logged with the id it came with, so
  // a per-route error rate sees it and its request_id can be found.
  CHECK(shed->get_header_value("X-Request-Id") == "shed-readyz-1");
  // ...but the process is alive, and says so at once: an orchestrator's
  // liveness probe must not restart a daemon for being busy.
  const auto asked = std::chrono::steady_clock::now();
  auto live = c->Get("/healthz");
  REQUIRE(live);
  CHECK(live->status == 200);
  CHECK(live->body == R"({"status":"ok"})");
  CHECK(std::chrono::steady_clock::now() - asked < 1s);
  for (auto& h : held) CHECK(h.get() == 200);
  CHECK(MetricValue(*c, "idem_http_queue_full_total") == 1);
  CHECK(MetricValue(*c, R"(idem_http_requests_total{route="GET /readyz",code="5xx"})") == 1);
  const std::string log = ReadFile(daemon->log_path());
  const size_t line = log.find(R"("request_id":"shed-readyz-1")");
  REQUIRE(line != std::string::npos);
  const std::string access =
      log.substr(log.rfind('\n', line) + 1, log.find('\n', line) - log.rfind('\n', line) - 1);
  CHECK(access.find(R"("event":"access")") != std::string::npos);
  CHECK(access.find(R"("route":"/readyz")") != std::string::npos);
  CHECK(access.find(R"("status":503)") != std::string::npos);
}

// How many of the daemon's threads carry `name` (their comm).
int ThreadsNamed(int pid, const std::string& name) {
  int n = 0;
  const std::string task = "/proc/" + std::to_string(pid) + "/task";
  for (const auto& t : std::filesystem::directory_iterator(task)) {
    if (ReadFile(t.path().string() + "/comm") == name + "\n") ++n;
  }
  return n;
}

TEST_CASE("handler threads start as requests need them, up to server.threads") {
  TempDir dir;
  auto daemon = StartSlowDecideDaemon(dir, 1500, "  threads: 6\n");
  // Idle, the daemon holds two handler threads, not server.threads.
  WaitFor([&] { return ThreadsNamed(daemon->pid(), "idem-handler") == 2; }, 5'000);
  CHECK(ThreadsNamed(daemon->pid(), "idem-handler") == 2);

  // Five at once: three more threads start, one for each that found none idle.
  std::vector<std::future<int>> held;
  for (int i = 0; i < 5; ++i) held.push_back(SlowDecide(*daemon, i));
  WaitFor([&] { return ThreadsNamed(daemon->pid(), "idem-handler") == 5; }, 5'000);
  CHECK(ThreadsNamed(daemon->pid(), "idem-handler") == 5);
  // Four more: the pool stops at six; the rest wait their turn in the queue
  // and are still answered.
  for (int i = 5; i < 9; ++i) held.push_back(SlowDecide(*daemon, i));
  std::this_thread::sleep_for(300ms);
  CHECK(ThreadsNamed(daemon->pid(), "idem-handler") == 6);
  for (auto& h : held) CHECK(h.get() == 200);
  CHECK(ThreadsNamed(daemon->pid(), "idem-handler") == 6);
}

TEST_CASE("server.threads is how many requests run at once, with no queue as with one") {
  TempDir dir;
  // threads: 1 runs one request at a time (it ran two); max_queue: 0 still
  // lets every handler thread serve (it stopped at the two that start
  // with the daemon).
  auto one = StartSlowDecideDaemon(dir, 1500, "  threads: 1\n  max_queue: 0\n");
  std::future<int> held = SlowDecide(*one, 0);
  WaitFor([&] { return ThreadsNamed(one->pid(), "idem-handler") == 1; }, 5'000);
  std::this_thread::sleep_for(200ms);
  CHECK(SlowDecide(*one, 1).get() == 503);
  CHECK(held.get() == 200);
  one.reset();

  TempDir dir4;
  auto four = StartSlowDecideDaemon(dir4, 1500, "  threads: 4\n  max_queue: 0\n");
  std::vector<std::future<int>> four_held;
  for (int i = 0; i < 4; ++i) {
    four_held.push_back(SlowDecide(*four, i));
    std::this_thread::sleep_for(100ms);
  }
  std::this_thread::sleep_for(200ms);
  CHECK(SlowDecide(*four, 9).get() == 503);  // the fifth finds all four busy
  for (auto& h : four_held) CHECK(h.get() == 200);
}

TEST_CASE(
    "SIGTERM during a long run: open connections get 503, the run starts no more items, the "
    "daemon exits within drain_timeout, and the run resumes after a restart with each effect "
    "once") {
  auto target = FakeEffectorServer::Start();
  REQUIRE(target != nullptr);
  target->SetLatencyMs(1500);  // an item takes 1.5 s: the signal lands mid-item
  TempDir dir;
  std::string config =
      WriteTestConfig(dir, kQuestionRules,
                      "actions:\n"
                      "  ship:\n"
                      "    identity: {fields: [/n], version: v1}\n"
                      "    window: 24h\n"
                      "    on_duplicate: return_original\n"
                      "    effector: {http: {method: POST, url: \"" +
                          target->base_url() + "/records\", idempotency: header}}\n");
  std::string text = ReadFile(config);
  text.replace(text.find("  threads: 96\n"), 14, "  threads: 96\n  drain_timeout: 2s\n");
  config = dir.File("drain.yaml", text);
  std::string err;
  auto daemon = DaemonProcess::Start({config, dir.path() + "/data", {}, {}}, &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);

  Json items = Json::array();
  for (int i = 0; i < 40; ++i) items.push_back({{"n", i}});
  const std::string run = Json{{"run_id", "nightly"}, {"kind", "ship"}, {"items", items}}.dump();
  auto submit = [&](const DaemonProcess& d) {
    auto c = d.Client();
    c->set_read_timeout(60);
    return c->Post("/v1/runs", {{"Idempotency-Key", "\"run-1\""}}, run, "application/json");
  };
  auto open = daemon->Client();  // a keep-alive connection opened before the signal
  open->set_keep_alive(true);
  REQUIRE(open->Get("/readyz")->status == 200);

  auto first = std::async(std::launch::async, [&] { return submit(*daemon); });
  REQUIRE(WaitFor([&] { return target->Records("records").size() >= 1; }, 10'000));
  // The first item is recorded as its answer leaves; the second is then
  // 300 ms into its 1.5 s when the signal lands.
  std::this_thread::sleep_for(300ms);
  const auto signalled = std::chrono::steady_clock::now();
  daemon->Signal(SIGTERM);
  std::this_thread::sleep_for(200ms);
  auto during = open->Get("/readyz");
  REQUIRE_MESSAGE(during, httplib::to_string(during.error()));
  CHECK(during->status == 503);
  CHECK(during->get_header_value("Retry-After") == "1");

  auto answered = first.get();
  REQUIRE(answered);
  CHECK(answered->status == 503);  // not the run's outcome: the key is free again
  CHECK(answered->body.find("items were submitted") != std::string::npos);
  CHECK(daemon->WaitExit(5'000));
  CHECK(std::chrono::steady_clock::now() - signalled < 3s);  // drain_timeout 2 s, not 40 items
  const size_t before = target->Records("records").size();
  CHECK(before < 40);

  auto again = DaemonProcess::Start({config, dir.path() + "/data", {}, {}}, &err);
  REQUIRE_MESSAGE(again != nullptr, err);
  target->SetLatencyMs(0);
  auto resumed = submit(*again);
  REQUIRE(resumed);
  REQUIRE(resumed->status == 200);
  Json counts = Json::parse(resumed->body)["counts"];
  CHECK(counts.value("executed", 0) + counts.value("already_done", 0) == 40);
  CHECK(counts.value("already_done", 0) >= static_cast<int>(before));
  CHECK(target->Records("records").size() == 40);
  CHECK(target->stats().duplicates_by_key == 0);
}

TEST_CASE(
    "a handler that outlives drain_timeout: its caller gets 503 at the timeout, and the daemon "
    "leaves within a grace instead of waiting for it") {
  TempDir dir;
  std::string config = WriteTestConfig(dir, R"(rules:
  - match:
      input:
        /text: {contains: glacial}
    delay_ms: 25000
    output: '{"category":"bug","priority":"low","summary":"slow","actions":[]}'
default:
  output: '{"category":"question","priority":"normal","summary":"q","actions":[]}'
)");
  std::string text = ReadFile(config);
  text.replace(text.find("  threads: 96\n"), 14, "  threads: 96\n  drain_timeout: 1s\n");
  config = dir.File("drain.yaml", text);
  std::string err;
  auto daemon = DaemonProcess::Start({config, dir.path() + "/data", {}, {}}, &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);
  auto slow = std::async(std::launch::async, [&] {
    auto c = daemon->Client();
    c->set_read_timeout(60);
    return c->Post(
        "/v1/decide", {{"Idempotency-Key", "\"glacial-1\""}, {"X-Request-Id", "req-glacial-1"}},
        R"({"step":"triage_ticket","input":{"ticket_id":1,"text":"glacial"}})", "application/json");
  });
  std::this_thread::sleep_for(500ms);
  const auto signalled = std::chrono::steady_clock::now();
  daemon->Signal(SIGTERM);
  auto answered = slow.get();
  REQUIRE_MESSAGE(answered, httplib::to_string(answered.error()));
  CHECK(answered->status == 503);
  CHECK(answered->get_header_value("Retry-After") == "1");
  CHECK(answered->body.find("drain_timeout") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - signalled < 3s);  // drain_timeout 1 s, not 25 s
  CHECK(daemon->WaitExit(15'000));
  CHECK(std::chrono::steady_clock::now() - signalled < 10s);  // 1 s + the 5 s grace
  const std::string log = ReadFile(daemon->log_path());
  CHECK(log.find("\"stop_abandoned\"") != std::string::npos);
  // Its access line names the request the caller sent, as any other does.
  bool access_line = false;
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    Json j = Json::parse(line, nullptr, false);
    if (!j.is_object() || j.value("event", "") != "access" || j.value("status", 0) != 503) continue;
    access_line = j.value("method", "") == "POST" && j.value("route", "") == "/v1/decide" &&
                  j.value("request_id", "") == "req-glacial-1";
  }
  CHECK(access_line);
  // The next start is healthy and the key is free to run again.
  auto again = DaemonProcess::Start({config, dir.path() + "/data", {}, {}}, &err);
  REQUIRE_MESSAGE(again != nullptr, err);
  CHECK(Healthy(*again));
}

TEST_CASE("SIGHUP does not stop the daemon; SIGTERM stops it cleanly") {
  TempDir dir;
  auto daemon = StartPlainDaemon(dir);
  daemon->Signal(SIGHUP);
  std::this_thread::sleep_for(200ms);
  CHECK(Healthy(*daemon));
  CHECK(daemon->Stop() == 0);
  // A clean stop says so last: a log without the line ended in a crash.
  const std::string log = ReadFile(daemon->log_path());
  CHECK(log.find(R"("event":"stopped")") != std::string::npos);
}

}  // namespace
}  // namespace idem::testing
