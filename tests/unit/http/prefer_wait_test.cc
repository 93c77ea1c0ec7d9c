// Prefer: wait on an Idempotency-Key in flight: the waiter sleeps until the
// key's holder ends (or its deadline), instead of re-reading the store.
// And the holder keeps its key while its handler runs, however long
// (the lease renewal): a retry is never a second run.
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <future>
#include <mutex>
#include <string>
#include <thread>

#include "daemon/http/server.h"
#include "daemon/obs/metrics.h"

namespace idem {
namespace {

using namespace std::chrono_literals;

// The store's keys, counting Begin and ExtendLease calls; renewals can be
// made to fail as a refused disk write would.
class CountingIdemKeys final : public IdemKeyStore {
 public:
  explicit CountingIdemKeys(IdemKeyStore& inner) : inner_(inner) {}
  std::atomic<int> begins{0};
  std::atomic<int> extends{0};
  std::atomic<bool> refuse_renewals{false};

  StatusOr<BeginResult> Begin(const std::string& scope, const std::string& key,
                              const std::string& fingerprint, const std::string& request_id,
                              int64_t now_ms, int64_t ttl_ms, int64_t lease_ms) override {
    ++begins;
    return inner_.Begin(scope, key, fingerprint, request_id, now_ms, ttl_ms, lease_ms);
  }
  Status Finish(const std::string& scope, const std::string& key, const std::string& fingerprint,
                int status, const std::string& body, const std::string& content_type,
                int64_t now_ms) override {
    return inner_.Finish(scope, key, fingerprint, status, body, content_type, now_ms);
  }
  Status Abandon(const std::string& scope, const std::string& key,
                 const std::string& fingerprint) override {
    return inner_.Abandon(scope, key, fingerprint);
  }
  Status Release(const std::string& scope, const std::string& key,
                 const std::string& fingerprint) override {
    return inner_.Release(scope, key, fingerprint);
  }
  Status ExtendLease(const std::string& scope, const std::string& key,
                     const std::string& fingerprint, const std::string& request_id, int64_t now_ms,
                     int64_t lease_ms) override {
    ++extends;
    if (refuse_renewals) return Status(Code::kUnavailable, "the disk refused the write");
    return inner_.ExtendLease(scope, key, fingerprint, request_id, now_ms, lease_ms);
  }
  StatusOr<size_t> ReleaseOwnInProgress() override { return inner_.ReleaseOwnInProgress(); }
  StatusOr<IdemRecord> Get(const std::string& scope, const std::string& key) override {
    return inner_.Get(scope, key);
  }
  StatusOr<size_t> SweepExpired(int64_t now_ms, size_t limit) override {
    return inner_.SweepExpired(now_ms, limit);
  }

 private:
  IdemKeyStore& inner_;
};

struct Reply {
  int status = 0;
  std::string head;
  std::string body;
};

// One request on a fresh connection (Connection: close); the whole answer.
Reply Post(int port, const std::string& key, const std::string& prefer) {
  Reply reply;
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return reply;
  timeval tv{};
  tv.tv_sec = 20;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return reply;
  }
  std::string req = "POST /v1/slow HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) +
                    "\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
                    "Idempotency-Key: \"" +
                    key + "\"\r\n";
  if (!prefer.empty()) req += "Prefer: " + prefer + "\r\n";
  req += "Connection: close\r\n\r\n{}";
  ::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string all;
  char buf[4096];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    all.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  size_t end = all.find("\r\n\r\n");
  if (all.size() < 12 || end == std::string::npos) return reply;
  reply.status = std::atoi(all.substr(9, 3).c_str());
  reply.head = all.substr(0, end);
  reply.body = all.substr(end + 4);
  return reply;
}

// A server with one route whose handler holds until released.
struct SlowServer {
  explicit SlowServer(int64_t lease_ms = 60'000) {
    config.idempotency.lease_ms = lease_ms;
    path = std::filesystem::temp_directory_path() /
           ("idem-prefer-wait-test-" + std::to_string(::getpid()) + "-" + std::to_string(++seq));
    auto opened = OpenRocksStore(StoreOptions{path.string(), false});
    REQUIRE_MESSAGE(opened.ok(), opened.status().ToString());
    store = std::move(opened).value();
    keys = std::make_unique<CountingIdemKeys>(store->idem_keys());
    Route r;
    r.method = "POST";
    r.pattern = "/v1/slow";
    r.key_policy = KeyPolicy::kOptional;
    r.handler = [this](RequestContext&) -> StatusOr<RouteResponse> {
      std::unique_lock<std::mutex> lock(mu);
      entered = true;
      ++runs_started;
      cv.notify_all();
      cv.wait(lock, [&] { return released; });
      return RouteResponse{200, Json{{"run", ++runs}}, {}};
    };
    auto created =
        HttpServer::Create(ServerDeps{config, *keys, store->journal(), clock, metrics}, {r}, {});
    REQUIRE_MESSAGE(created.ok(), created.status().ToString());
    server = std::move(created).value();
    auto bound = server->Start("127.0.0.1", 0);
    REQUIRE_MESSAGE(bound.ok(), bound.status().ToString());
    port = *bound;
  }
  ~SlowServer() {
    Release();
    server->Stop();
    server.reset();
    store.reset();
    std::filesystem::remove_all(path);
  }
  void AwaitEntered() {
    std::unique_lock<std::mutex> lock(mu);
    REQUIRE(cv.wait_for(lock, 5s, [&] { return entered; }));
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu);
    released = true;
    cv.notify_all();
  }

  static inline int seq = 0;
  std::filesystem::path path;
  std::unique_ptr<Store> store;
  std::unique_ptr<CountingIdemKeys> keys;
  Config config;
  StableClock clock{Env::Real()};
  Metrics metrics;
  std::unique_ptr<HttpServer> server;
  int port = 0;
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false;
  bool released = false;
  int runs = 0;
  int runs_started = 0;
};

TEST_CASE(
    "a Prefer: wait duplicate gets the first answer once it ends, without polling the store") {
  SlowServer s;
  auto first = std::async(std::launch::async, [&] { return Post(s.port, "k-wait", ""); });
  s.AwaitEntered();
  auto waiter = std::async(std::launch::async, [&] { return Post(s.port, "k-wait", "wait=10"); });
  // The waiter is parked; with 5 ms polling it would have read the key ~80 times by now.
  std::this_thread::sleep_for(400ms);
  CHECK(waiter.wait_for(0s) == std::future_status::timeout);
  const int begins_while_waiting = s.keys->begins.load();
  CHECK(begins_while_waiting == 2);  // the first request's and the waiter's own

  auto released_at = std::chrono::steady_clock::now();
  s.Release();
  Reply original = first.get();
  Reply waited = waiter.get();
  auto waited_for = std::chrono::steady_clock::now() - released_at;
  CHECK(original.status == 200);
  CHECK(waited.status == 200);
  CHECK(waited.head.find("Idempotent-Replayed: true") != std::string::npos);
  CHECK(waited.body == original.body);
  CHECK(s.runs == 1);
  CHECK(s.keys->begins.load() <= 3);  // one more look once the first one ended
  CHECK(waited_for < 2s);
}

TEST_CASE("a Prefer: wait duplicate is answered 409 at its deadline while the key is in flight") {
  SlowServer s;
  auto first = std::async(std::launch::async, [&] { return Post(s.port, "k-late", ""); });
  s.AwaitEntered();
  auto started = std::chrono::steady_clock::now();
  Reply waited = Post(s.port, "k-late", "wait=1");
  auto took = std::chrono::steady_clock::now() - started;
  CHECK(waited.status == 409);
  CHECK(took >= 950ms);
  CHECK(took < 3s);
  CHECK(s.keys->begins.load() <= 3);
  s.Release();
  CHECK(first.get().status == 200);
}

TEST_CASE("a retry of a request running past its key's lease is in flight, not run again") {
  SlowServer s(/*lease_ms=*/300);
  auto first = std::async(std::launch::async, [&] { return Post(s.port, "k-long", ""); });
  s.AwaitEntered();
  std::this_thread::sleep_for(1000ms);  // more than three leases
  Reply retry = Post(s.port, "k-long", "");
  CHECK(retry.status == 409);
  CHECK(retry.head.find("Retry-After: 1") != std::string::npos);
  {
    std::lock_guard<std::mutex> lock(s.mu);
    CHECK(s.runs_started == 1);
  }
  CHECK(s.keys->extends.load() >= 3);  // renewed about every 100 ms
  s.Release();
  Reply original = first.get();
  CHECK(original.status == 200);
  Reply later = Post(s.port, "k-long", "");
  CHECK(later.status == 200);
  CHECK(later.head.find("Idempotent-Replayed: true") != std::string::npos);
  CHECK(later.body == original.body);
  CHECK(s.runs == 1);
}

TEST_CASE("a Prefer: wait retry of a request running past its key's lease gets its answer") {
  SlowServer s(/*lease_ms=*/300);
  auto first = std::async(std::launch::async, [&] { return Post(s.port, "k-long-wait", ""); });
  s.AwaitEntered();
  auto waiter =
      std::async(std::launch::async, [&] { return Post(s.port, "k-long-wait", "wait=10"); });
  std::this_thread::sleep_for(1000ms);
  CHECK(waiter.wait_for(0s) == std::future_status::timeout);
  {
    std::lock_guard<std::mutex> lock(s.mu);
    CHECK(s.runs_started == 1);
  }
  s.Release();
  Reply original = first.get();
  Reply waited = waiter.get();
  CHECK(original.status == 200);
  CHECK(waited.status == 200);
  CHECK(waited.head.find("Idempotent-Replayed: true") != std::string::npos);
  CHECK(waited.body == original.body);
  CHECK(s.runs == 1);
}

TEST_CASE("a Prefer: wait duplicate takes the key over when the holder's lease is not renewed") {
  SlowServer s(/*lease_ms=*/300);
  s.keys->refuse_renewals = true;  // a holder that cannot renew (disk refused, process hung)
  auto first = std::async(std::launch::async, [&] { return Post(s.port, "k-stuck", ""); });
  s.AwaitEntered();
  auto started = std::chrono::steady_clock::now();
  auto waiter = std::async(std::launch::async, [&] { return Post(s.port, "k-stuck", "wait=10"); });
  // The holder never ends by itself: the waiter runs the handler once the
  // lease is over, not at its deadline.
  auto until = std::chrono::steady_clock::now() + 5s;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(s.mu);
      if (s.runs_started == 2) break;
    }
    REQUIRE(std::chrono::steady_clock::now() < until);
    std::this_thread::sleep_for(10ms);
  }
  auto took = std::chrono::steady_clock::now() - started;
  CHECK(took >= 250ms);
  CHECK(took < 3s);
  CHECK(s.keys->begins.load() <= 4);
  s.Release();
  CHECK(waiter.get().status == 200);
  CHECK(first.get().status == 200);
}

}  // namespace
}  // namespace idem
