// server.unix_socket against the real daemon: the same API on a socket
// file only its owner may open, gone after a clean stop, taken back after
// a kill -9.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "tests/integration/harness.h"

namespace idem::testing {
namespace {

struct Answer {
  int status = 0;
  std::string body;
};

// One request over the Unix socket at `path` with Connection: close, read
// to the end; status 0 when the connect or the exchange failed. `host`:
// what curl --unix-socket sends by default.
Answer Exchange(const std::string& path, const std::string& method, const std::string& target,
                const std::string& body = "", const std::string& host = "localhost") {
  Answer out;
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  path.copy(addr.sun_path, sizeof(addr.sun_path) - 1);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return out;
  }
  std::string request = method + " " + target + " HTTP/1.1\r\nHost: " + host +
                        "\r\nConnection: close\r\n"
                        "Content-Type: application/json\r\nContent-Length: " +
                        std::to_string(body.size()) + "\r\n\r\n" + body;
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    ::close(fd);
    return out;
  }
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) got.append(buf, n);
  ::close(fd);
  const size_t head_end = got.find("\r\n\r\n");
  if (got.rfind("HTTP/1.1 ", 0) != 0 || head_end == std::string::npos) return out;
  out.status = std::stoi(got.substr(9, 3));
  out.body = got.substr(head_end + 4);
  return out;
}

// The daemon on the default config, its store in `dir`, also serving on `sock`.
DaemonArgs OnSocket(const TempDir& dir, const std::string& sock) {
  return {IDEM_SOURCE_DIR "/config/idem.yaml", dir.path() + "/data", {"--unix-socket", sock}};
}

bool Exists(const std::string& path) {
  return std::filesystem::exists(std::filesystem::symlink_status(path));
}

}  // namespace

TEST_CASE("a claim and its complete over the Unix socket are the same work as over TCP") {
  TempDir dir;
  const std::string sock = dir.path() + "/idem.sock";
  std::string err;
  auto daemon = DaemonProcess::Start(OnSocket(dir, sock), &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);
  struct stat st {};
  REQUIRE(lstat(sock.c_str(), &st) == 0);
  CHECK(S_ISSOCK(st.st_mode));
  CHECK((st.st_mode & 0777) == 0600);
  // The start-up hint shows how to reach it (printed once the daemon serves).
  const std::string hint = "curl -s --unix-socket " + sock + " http://localhost/healthz\n";
  CHECK(
      WaitFor([&] { return ReadFile(daemon->log_path()).find(hint) != std::string::npos; }, 5000));

  const std::string claim = R"({"kind":"send_reply","identity":{"ticket_id":7,"text":"hi"}})";
  Answer claimed = Exchange(sock, "POST", "/v1/work/claim", claim);
  REQUIRE(claimed.status == 201);
  const Json c = Json::parse(claimed.body);
  const std::string work_id = c["work_id"];
  Answer done =
      Exchange(sock, "POST", "/v1/work/" + work_id + "/complete",
               Json{{"lease_token", c["lease_token"]}, {"result", {{"sent", true}}}}.dump());
  CHECK(done.status == 200);
  // The same claim over TCP finds the work done, with the result given on the socket.
  auto tcp = daemon->Client();
  auto again = tcp->Post("/v1/work/claim", claim, "application/json");
  REQUIRE(again);
  CHECK(again->status == 200);
  CHECK(Json::parse(again->body)["result"] == Json{{"sent", true}});

  // Clients name the socket as they like (Go's http.Client: "unix"); over
  // TCP that name is what a DNS-rebinding page would send.
  const std::string other = R"({"kind":"send_reply","identity":{"ticket_id":8,"text":"go"}})";
  CHECK(Exchange(sock, "POST", "/v1/work/claim", other, "unix").status == 201);
  auto rebound = tcp->Post("/v1/work/claim", {{"Host", "unix"}}, other, "application/json");
  REQUIRE(rebound);
  CHECK(rebound->status == 403);

  CHECK(daemon->Stop() == 0);
  CHECK_FALSE(Exists(sock));  // a clean stop removes it
}

TEST_CASE("after kill -9 the socket file stays, and the next daemon takes it over") {
  TempDir dir;
  const std::string sock = dir.path() + "/idem.sock";
  const DaemonArgs args = OnSocket(dir, sock);
  std::string err;
  auto first = DaemonProcess::Start(args, &err);
  REQUIRE_MESSAGE(first != nullptr, err);
  // While it runs, a second daemon on the same socket (its own store) is refused.
  DaemonArgs other = args;
  other.data_dir = dir.path() + "/data2";
  auto refused = DaemonProcess::Start(other, &err);
  CHECK(refused == nullptr);
  CHECK(err.find("another process serves the Unix socket " + sock) != std::string::npos);
  CHECK(Exchange(sock, "GET", "/healthz").status == 200);

  first->Kill9();
  REQUIRE(Exists(sock));
  CHECK(Exchange(sock, "GET", "/healthz").status == 0);  // refused: nobody accepts
  auto second = DaemonProcess::Start(args, &err);
  REQUIRE_MESSAGE(second != nullptr, err);
  CHECK(Exchange(sock, "GET", "/healthz").status == 200);
}

}  // namespace idem::testing
