#include "daemon/http/request_guard.h"

#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

namespace idem {
namespace {

http1::Request With(std::vector<http1::Field> headers) {
  http1::Request req;
  req.method = "POST";
  req.path = req.target = "/v1/decide";
  req.headers = std::move(headers);
  return req;
}

std::unique_ptr<RequestGuard> Guard(std::vector<std::string> hosts = {},
                                    std::vector<std::string> origins = {},
                                    const std::string& listen = "127.0.0.1", int port = 7411) {
  ServerConfig sc;
  sc.allowed_hosts = std::move(hosts);
  sc.allowed_origins = std::move(origins);
  auto g = std::make_unique<RequestGuard>();
  g->Configure(sc, listen, port);
  return g;
}

int StatusOf(const std::optional<Refusal>& r) { return r ? r->http_status : 0; }
std::string PointerOf(const std::optional<Refusal>& r) { return r ? r->status.field() : ""; }

}  // namespace

TEST_CASE("the Host must name this daemon: a DNS-rebinding name is refused") {
  auto g = Guard();
  CHECK(StatusOf(g->CheckSource(With({{"Host", "127.0.0.1:7411"}}))) == 0);
  CHECK(StatusOf(g->CheckSource(With({{"Host", "LOCALHOST:7411"}}))) == 0);
  CHECK(StatusOf(g->CheckSource(With({{"Host", "[::1]:7411"}}))) == 0);
  CHECK(StatusOf(g->CheckSource(With({{"Host", "localhost"}}))) == 0);
  auto rebound = g->CheckSource(With({{"Host", "evil.example:7411"}}));
  CHECK(StatusOf(rebound) == 403);
  CHECK(PointerOf(rebound) == "header:Host");
  // A loopback name with another port is a request meant for another server.
  CHECK(StatusOf(g->CheckSource(With({{"Host", "127.0.0.1:8080"}}))) == 403);
}

TEST_CASE("a missing, doubled or malformed Host is 400") {
  auto g = Guard();
  CHECK(StatusOf(g->CheckSource(With({}))) == 400);
  CHECK(PointerOf(g->CheckSource(With({}))) == "header:Host");
  CHECK(StatusOf(g->CheckSource(With({{"Host", "localhost:7411"}, {"Host", "localhost:7411"}}))) ==
        400);
  CHECK(StatusOf(g->CheckSource(With({{"Host", "localhost:x"}}))) == 400);
  CHECK(StatusOf(g->CheckSource(With({{"Host", "[::1"}}))) == 400);
  CHECK(StatusOf(g->CheckSource(With({{"Host", ""}}))) == 400);
}

TEST_CASE("on the Unix socket any one Host passes, and only there; Origin is still checked") {
  auto g = Guard();
  for (const char* host : {"unix", "%2Frun%2Fidem%2Fidem.sock", "evil.example:7411"}) {
    CAPTURE(host);
    http1::Request req = With({{"Host", host}});
    CHECK(StatusOf(g->CheckSource(req)) == 403);  // over TCP: a rebinding name
    req.local_socket = true;
    CHECK(StatusOf(g->CheckSource(req)) == 0);
  }
  http1::Request doubled = With({{"Host", "unix"}, {"Host", "unix"}});
  doubled.local_socket = true;
  CHECK(StatusOf(g->CheckSource(doubled)) == 400);  // RFC 9112 3.2 holds on any transport
  http1::Request none = With({});
  none.local_socket = true;
  CHECK(StatusOf(g->CheckSource(none)) == 400);
  http1::Request cross_site = With({{"Host", "unix"}, {"Origin", "https://evil.example"}});
  cross_site.local_socket = true;
  CHECK(StatusOf(g->CheckSource(cross_site)) == 403);
  CHECK(PointerOf(g->CheckSource(cross_site)) == "header:Origin");
}

TEST_CASE("the Host check follows the port bound at start and the configured names") {
  auto g = Guard({"idem.internal", "[fd00::1]"}, {}, "0.0.0.0", 0);
  g->SetBoundPort(40123);
  CHECK(StatusOf(g->CheckSource(With({{"Host", "127.0.0.1:40123"}}))) == 0);
  CHECK(StatusOf(g->CheckSource(With({{"Host", "127.0.0.1:0"}}))) == 403);
  CHECK(StatusOf(g->CheckSource(With({{"Host", "IDEM.internal:443"}}))) == 0);
  CHECK(StatusOf(g->CheckSource(With({{"Host", "idem.internal"}}))) == 0);
  CHECK(StatusOf(g->CheckSource(With({{"Host", "[fd00::1]:40123"}}))) == 0);
  CHECK(StatusOf(g->CheckSource(With({{"Host", "idem.internal.evil.example"}}))) == 403);
}

TEST_CASE("a browser Origin must be on the allow-list; no Origin is a non-browser client") {
  auto g = Guard({}, {"https://console.example.com"});
  const http1::Field host{"Host", "127.0.0.1:7411"};
  CHECK(StatusOf(g->CheckSource(With({host}))) == 0);
  CHECK(StatusOf(g->CheckSource(With({host, {"Origin", "https://console.example.com"}}))) == 0);
  CHECK(StatusOf(g->CheckSource(With({host, {"Origin", "HTTPS://Console.Example.com"}}))) == 0);
  auto evil = g->CheckSource(With({host, {"Origin", "https://evil.example"}}));
  CHECK(StatusOf(evil) == 403);
  CHECK(PointerOf(evil) == "header:Origin");
  CHECK(StatusOf(g->CheckSource(With({host, {"Origin", "null"}}))) == 403);
  CHECK(StatusOf(g->CheckSource(With({host,
                                      {"Origin", "https://console.example.com"},
                                      {"Origin", "https://evil.example"}}))) == 403);
  // Without a configured list every other Origin is refused.
  CHECK(StatusOf(Guard()->CheckSource(With({host, {"Origin", "https://console.example.com"}}))) ==
        403);
}

TEST_CASE("the daemon's own origin passes: the /ui/ page posts same-origin") {
  auto g = Guard({"idem.internal"});
  const http1::Field host{"Host", "127.0.0.1:7411"};
  CHECK(StatusOf(g->CheckSource(With({host, {"Origin", "http://127.0.0.1:7411"}}))) == 0);
  CHECK(StatusOf(g->CheckSource(
            With({{"Host", "Localhost:7411"}, {"Origin", "http://localhost:7411"}}))) == 0);
  CHECK(StatusOf(g->CheckSource(
            With({{"Host", "idem.internal"}, {"Origin", "https://idem.internal"}}))) == 0);
  // Another port of the same machine is another origin (another server's page).
  auto other_port = g->CheckSource(With({host, {"Origin", "http://127.0.0.1:8080"}}));
  CHECK(StatusOf(other_port) == 403);
  CHECK(PointerOf(other_port) == "header:Origin");
  CHECK(StatusOf(g->CheckSource(With({host, {"Origin", "http://localhost:7411"}}))) == 403);
  CHECK(StatusOf(g->CheckSource(With({host, {"Origin", "ftp://127.0.0.1:7411"}}))) == 403);
  // A rebinding page sends its own name as Host and Origin: the Host check refuses it.
  auto rebound =
      g->CheckSource(With({{"Host", "evil.example:7411"}, {"Origin", "http://evil.example:7411"}}));
  CHECK(StatusOf(rebound) == 403);
  CHECK(PointerOf(rebound) == "header:Host");
  // Two Origins stay refused even when one is the daemon's.
  CHECK(StatusOf(g->CheckSource(With(
            {host, {"Origin", "http://127.0.0.1:7411"}, {"Origin", "https://evil.example"}}))) ==
        403);
}

TEST_CASE("a JSON body must come as application/json, else 415") {
  CHECK(StatusOf(RequestGuard::CheckContentType(With({{"Content-Type", "application/json"}}))) ==
        0);
  CHECK(StatusOf(RequestGuard::CheckContentType(
            With({{"Content-Type", "Application/JSON; charset=UTF-8"}}))) == 0);
  CHECK(StatusOf(RequestGuard::CheckContentType(
            With({{"Content-Type", "application/json;charset=\"utf-8\""}}))) == 0);
  // What a cross-site form or fetch can send without a preflight.
  auto plain = RequestGuard::CheckContentType(With({{"Content-Type", "text/plain"}}));
  CHECK(StatusOf(plain) == 415);
  CHECK(PointerOf(plain) == "header:Content-Type");
  CHECK(StatusOf(RequestGuard::CheckContentType(
            With({{"Content-Type", "application/x-www-form-urlencoded"}}))) == 415);
  CHECK(StatusOf(RequestGuard::CheckContentType(
            With({{"Content-Type", "multipart/form-data; boundary=x"}}))) == 415);
  CHECK(StatusOf(RequestGuard::CheckContentType(With({}))) == 415);
  CHECK(StatusOf(RequestGuard::CheckContentType(
            With({{"Content-Type", "application/json; charset=latin1"}}))) == 415);
  CHECK(StatusOf(RequestGuard::CheckContentType(
            With({{"Content-Type", "application/merge-patch+json"}}))) == 415);
}

TEST_CASE("loopback addresses are told apart from addresses others can reach") {
  for (const char* h : {"127.0.0.1", "127.1.2.3", "localhost", "LocalHost", "::1", "[::1]"}) {
    CHECK_MESSAGE(IsLoopbackHost(h), h);
  }
  for (const char* h : {"0.0.0.0", "::", "[::]", "10.0.0.1", "128.0.0.1", "127.0.0", "127.0.0.1.5",
                        "127.0.0.256", "example.com", "localhost.evil.example", "", "127.0.0.x"}) {
    CHECK_MESSAGE(!IsLoopbackHost(h), h);
  }
}

TEST_CASE("the Bearer scheme is matched case-insensitively") {
  CHECK(BearerCredentials("Bearer abc") == std::optional<std::string>("abc"));
  CHECK(BearerCredentials("bearer abc") == std::optional<std::string>("abc"));
  CHECK(BearerCredentials("BEARER   abc") == std::optional<std::string>("abc"));
  CHECK(!BearerCredentials("Basic YWxhZGRpbjpvcGVuc2VzYW1l").has_value());
  CHECK(!BearerCredentials("Bearer").has_value());
  CHECK(!BearerCredentials("Bearer ").has_value());
  CHECK(!BearerCredentials("Bearerabc").has_value());
  CHECK(!BearerCredentials("Bearer a b").has_value());
  CHECK(!BearerCredentials("").has_value());
}

TEST_CASE("Idem-Caller names a caller or is refused with its header as the pointer") {
  CHECK(!IdemCaller(With({})).value().has_value());
  CHECK(IdemCaller(With({{"Idem-Caller", "billing-cron"}})).value() ==
        std::optional<std::string>("billing-cron"));
  CHECK(IdemCaller(With({{"Idem-Caller", "svc:a.b_c"}})).value() ==
        std::optional<std::string>("svc:a.b_c"));
  for (const char* bad : {"", "-x", "a b", "a/b", "é"}) {
    auto r = IdemCaller(With({{"Idem-Caller", bad}}));
    CHECK_MESSAGE(r.status().code() == Code::kInvalidArgument, bad);
    CHECK(r.status().field() == "header:Idem-Caller");
  }
  CHECK(!IdemCaller(With({{"Idem-Caller", std::string(65, 'a')}})).ok());
  CHECK(IdemCaller(With({{"Idem-Caller", std::string(64, 'a')}})).ok());
  CHECK(!IdemCaller(With({{"Idem-Caller", "a"}, {"Idem-Caller", "b"}})).ok());
}

}  // namespace idem
