// The libcurl HttpClient against the fake provider server (it lives with the
// provider tests because it needs tests/fakes).
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "daemon/core/http_client.h"
#include "tests/fakes/fake_provider.h"

namespace idem {
namespace {

using fakes::FakeProviderServer;
using fakes::FakeReply;
using fakes::Json;

HttpRequest Post(const FakeProviderServer& server, std::string body = "{}") {
  HttpRequest r;
  r.method = "POST";
  r.url = server.base_url() + "/v1/chat/completions";
  r.headers = {{"Authorization", "Bearer header-secret-123456"},
               {"Content-Type", "application/json"}};
  r.body = std::move(body);
  r.timeout_ms = 5'000;
  return r;
}

TEST_CASE("a POST reaches the server with its headers and body; response names are lower-case") {
  auto server = FakeProviderServer::Start();
  REQUIRE(server);
  auto http = MakeCurlHttpClient();
  server->Enqueue(FakeReply::Output({{"ok", true}}).WithHeader("X-Custom-Thing", "  v1 "));
  auto response = http->Send(Post(*server, R"({"model":"m"})"));
  REQUIRE(response.ok());
  CHECK(response->status == 200);
  REQUIRE(response->FindHeader("x-custom-thing") != nullptr);
  CHECK(*response->FindHeader("x-custom-thing") == "v1");
  REQUIRE(response->FindHeader("content-type") != nullptr);
  CHECK(response->FindHeader("X-Custom-Thing") == nullptr);  // lookups are by lower-case name
  auto recorded = server->last_request();
  CHECK(recorded.method == "POST");
  CHECK(recorded.Header("authorization") == "Bearer header-secret-123456");
  CHECK(recorded.json == Json{{"model", "m"}});
  CHECK(recorded.Header("expect").empty());
}

TEST_CASE("an HTTP error status is a response, not a failed exchange") {
  auto server = FakeProviderServer::Start();
  REQUIRE(server);
  auto http = MakeCurlHttpClient();
  server->Enqueue(FakeReply::HttpError(503));
  auto response = http->Send(Post(*server));
  REQUIRE(response.ok());
  CHECK(response->status == 503);
}

TEST_CASE("sequential requests reuse one connection") {
  auto server = FakeProviderServer::Start();
  REQUIRE(server);
  auto http = MakeCurlHttpClient();
  server->SetDefault(FakeReply::Output({{"ok", true}}));
  for (int i = 0; i < 3; ++i) REQUIRE(http->Send(Post(*server)).ok());
  auto requests = server->requests();
  REQUIRE(requests.size() == 3);
  CHECK(requests[0].remote_port == requests[1].remote_port);
  CHECK(requests[1].remote_port == requests[2].remote_port);
}

TEST_CASE("concurrent sends from many threads all complete") {
  auto server = FakeProviderServer::Start();
  REQUIRE(server);
  auto http = MakeCurlHttpClient();
  server->SetDefault(FakeReply::Output({{"ok", true}}));
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10; ++i) {
        auto r = http->Send(Post(*server));
        if (r.ok() && r->status == 200) ++ok;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(ok.load() == 40);
  CHECK(server->calls() == 40);
}

TEST_CASE("a slow answer past the timeout is DeadlineExceeded and retryable") {
  auto server = FakeProviderServer::Start();
  REQUIRE(server);
  auto http = MakeCurlHttpClient();
  server->Enqueue(FakeReply::Output({{"ok", true}}).WithLatency(3'000));
  HttpRequest request = Post(*server);
  request.timeout_ms = 150;
  auto response = http->Send(request);
  REQUIRE_FALSE(response.ok());
  CHECK(response.status().code() == Code::kDeadlineExceeded);
  CHECK(response.status().retryable());
}

namespace {
// A loopback port a server just closed: nothing listens there now.
int ClosedPort() {
  auto server = FakeProviderServer::Start();
  REQUIRE(server);
  return server->port();
}
}  // namespace

TEST_CASE("connection refused is Unavailable and retryable, without header values") {
  const int port = ClosedPort();
  auto http = MakeCurlHttpClient();
  HttpRequest request;
  request.url = "http://127.0.0.1:" + std::to_string(port) + "/v1/x?key=query-secret";
  request.headers = {{"Authorization", "Bearer header-secret-123456"}};
  request.timeout_ms = 2'000;
  auto response = http->Send(request);
  REQUIRE_FALSE(response.ok());
  CHECK(response.status().code() == Code::kUnavailable);
  CHECK(response.status().retryable());
  CHECK(response.status().message().find("header-secret") == std::string::npos);
  CHECK(response.status().message().find("query-secret") == std::string::npos);
  CHECK(response.status().message().find("/v1/x") != std::string::npos);
}

TEST_CASE("a webhook's secret in the URL path stays out of error messages") {
  const int port = ClosedPort();
  auto http = MakeCurlHttpClient();
  HttpRequest request;
  request.url = "http://hook:pw@127.0.0.1:" + std::to_string(port) +
                "/services/T0001/B0002/xoxbSecretPathToken24ch";
  request.timeout_ms = 2'000;
  auto response = http->Send(request);
  REQUIRE_FALSE(response.ok());
  const std::string& message = response.status().message();
  CHECK(message.find("xoxbSecretPathToken24ch") == std::string::npos);
  CHECK(message.find("pw") == std::string::npos);
  CHECK(message.find("127.0.0.1:" + std::to_string(port) + "/services/T0001/B0002/…") !=
        std::string::npos);
}

TEST_CASE("a connection cut mid-body is Unavailable and retryable") {
  auto server = FakeProviderServer::Start();
  REQUIRE(server);
  auto http = MakeCurlHttpClient();
  server->Enqueue(FakeReply::CutMidBody());
  auto response = http->Send(Post(*server));
  REQUIRE_FALSE(response.ok());
  CHECK(response.status().code() == Code::kUnavailable);
  CHECK(response.status().retryable());
  // The client recovers: the next request opens a fresh connection.
  server->Enqueue(FakeReply::Output({{"ok", true}}));
  CHECK(http->Send(Post(*server)).ok());
}

// A server that answers every request "ok" on a kept-alive connection,
// except one whose body is "die": that one it reads, counts and closes the
// connection on without a byte of answer (a target that crashed, or reset,
// after it acted).
class DyingServer {
 public:
  DyingServer() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    REQUIRE(::listen(fd_, 16) == 0);
    socklen_t len = sizeof(a);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~DyingServer() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/effect"; }
  int dying_requests() const { return dying_.load(); }

 private:
  void Serve() {
    std::vector<int> conns;
    std::vector<std::string> bufs;
    while (!stop_) {
      std::vector<pollfd> fds = {{fd_, POLLIN, 0}};
      for (int c : conns) fds.push_back({c, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), 20) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        conns.push_back(::accept(fd_, nullptr, nullptr));
        bufs.emplace_back();
      }
      for (size_t i = 1; i < fds.size(); ++i) {
        if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
        const size_t k = i - 1;
        char chunk[4096];
        const ssize_t n = ::recv(conns[k], chunk, sizeof(chunk), 0);
        bool close_it = n <= 0;
        if (n > 0) bufs[k].append(chunk, static_cast<size_t>(n));
        const size_t head = bufs[k].find("\r\n\r\n");
        const size_t cl = bufs[k].find("Content-Length: ");
        if (!close_it && head != std::string::npos && cl != std::string::npos) {
          const size_t body_len = std::strtoul(bufs[k].c_str() + cl + 16, nullptr, 10);
          if (bufs[k].size() >= head + 4 + body_len) {
            const std::string body = bufs[k].substr(head + 4, body_len);
            bufs[k].erase(0, head + 4 + body_len);
            if (body == "die") {
              ++dying_;
              close_it = true;
            } else {
              const std::string ok = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
              (void)!::send(conns[k], ok.data(), ok.size(), MSG_NOSIGNAL);
            }
          }
        }
        if (close_it) {
          ::close(conns[k]);
          conns[k] = -1;
        }
      }
      for (size_t k = conns.size(); k-- > 0;) {
        if (conns[k] < 0) {
          conns.erase(conns.begin() + static_cast<long>(k));
          bufs.erase(bufs.begin() + static_cast<long>(k));
        }
      }
    }
    for (int c : conns) ::close(c);
  }

  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> dying_{0};
  std::thread thread_;
};

TEST_CASE(
    "a request on a fresh connection reaches the server once even when the connection dies "
    "unanswered; libcurl sends one on a reused connection again") {
  DyingServer server;
  auto http = MakeCurlHttpClient();
  auto request = [&](const std::string& body, bool fresh) {
    HttpRequest r;
    r.method = "POST";
    r.url = server.url();
    r.headers = {{"Content-Type", "text/plain"}};
    r.body = body;
    r.timeout_ms = 5'000;
    r.fresh_connection = fresh;
    return http->Send(r);
  };
  // A kept-alive connection in the pool, then a fresh-connection request
  // that the server acts on and dies: it got there once, and the caller
  // is told the exchange failed.
  REQUIRE(request("warm", false).ok());
  auto once = request("die", true);
  CHECK_FALSE(once.ok());
  CHECK(server.dying_requests() == 1);
  // Why it matters: on the reused connection libcurl sends it again unasked.
  REQUIRE(request("warm", false).ok());
  (void)request("die", false);
  MESSAGE("a reused connection's dying request reached the server " << server.dying_requests() - 1
                                                                    << " time(s)");
  CHECK(server.dying_requests() - 1 >= 1);
}

TEST_CASE("a body above max_response_bytes is ResourceExhausted") {
  auto server = FakeProviderServer::Start();
  REQUIRE(server);
  auto http = MakeCurlHttpClient();
  server->Enqueue(FakeReply::Output({{"blob", std::string(10'000, 'x')}}));
  HttpRequest request = Post(*server);
  request.max_response_bytes = 1'000;
  auto response = http->Send(request);
  REQUIRE_FALSE(response.ok());
  CHECK(response.status().code() == Code::kResourceExhausted);
  CHECK_FALSE(response.status().retryable());
}

// `n` headers of about 1 KiB each, named apart.
FakeReply WithKibHeaders(FakeReply reply, int n) {
  for (int i = 0; i < n; ++i)
    reply = reply.WithHeader("X-Filler-" + std::to_string(i), std::string(1'000, 'h'));
  return reply;
}

TEST_CASE("response headers past kMaxResponseHeaderBytes are ResourceExhausted") {
  auto server = FakeProviderServer::Start();
  REQUIRE(server);
  auto http = MakeCurlHttpClient();
  // 32 KiB of headers is an answer; 96 KiB is cut off, whatever libcurl's
  // own limit (300 KiB since 8.3) lets through.
  server->Enqueue(WithKibHeaders(FakeReply::Output({{"ok", true}}), 32));
  auto fine = http->Send(Post(*server));
  REQUIRE_MESSAGE(fine.ok(), fine.status().ToString());
  CHECK(fine->status == 200);
  CHECK(fine->FindHeader("x-filler-31") != nullptr);
  server->Enqueue(WithKibHeaders(FakeReply::Output({{"ok", true}}), 96));
  auto cut = http->Send(Post(*server));
  REQUIRE_FALSE(cut.ok());
  CHECK(cut.status().code() == Code::kResourceExhausted);
  CHECK_FALSE(cut.status().retryable());
  CHECK(cut.status().message().find("headers") != std::string::npos);
  // The client goes on: the next exchange is whole.
  server->Enqueue(FakeReply::Output({{"ok", true}}));
  CHECK(http->Send(Post(*server)).ok());
}

TEST_CASE("one response header line past libcurl's own limit is ResourceExhausted and says so") {
  auto server = FakeProviderServer::Start();
  REQUIRE(server);
  auto http = MakeCurlHttpClient();
  // libcurl refuses a 200 KB line before our header callback sees any of
  // it, with CURLE_OUT_OF_MEMORY; it read "Internal: Out of memory".
  server->Enqueue(FakeReply::Output({{"ok", true}}).WithHeader("X-Big", std::string(200'000, 'h')));
  auto cut = http->Send(Post(*server));
  REQUIRE_FALSE(cut.ok());
  CHECK(cut.status().code() == Code::kResourceExhausted);
  CHECK_FALSE(cut.status().retryable());
  CHECK(cut.status().message().find("header line past libcurl's 100 KiB limit") !=
        std::string::npos);
  server->Enqueue(FakeReply::Output({{"ok", true}}));
  CHECK(http->Send(Post(*server)).ok());
}

TEST_CASE("bad requests are rejected before anything is sent") {
  auto server = FakeProviderServer::Start();
  REQUIRE(server);
  auto http = MakeCurlHttpClient();
  HttpRequest request = Post(*server);
  request.headers.emplace_back("X-Injected", "secret-value\r\nEvil: 1");
  auto r1 = http->Send(request);
  REQUIRE_FALSE(r1.ok());
  CHECK(r1.status().code() == Code::kInvalidArgument);
  CHECK(r1.status().message().find("secret-value") == std::string::npos);

  HttpRequest bad_method = Post(*server);
  bad_method.method = "BREW";
  CHECK(http->Send(bad_method).status().code() == Code::kInvalidArgument);

  HttpRequest bad_scheme = Post(*server);
  bad_scheme.url = "ftp://127.0.0.1/x";
  CHECK(http->Send(bad_scheme).status().code() == Code::kInvalidArgument);
  CHECK(server->calls() == 0);
}

}  // namespace
}  // namespace idem
