// The libcurl HttpClient against the fake provider server (it lives with the
// provider tests because it needs tests/fakes).
#include <doctest/doctest.h>

#include <atomic>
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
