// Shared by the HTTP server tests (event_server_test.cc, smuggling_test.cc):
// a blocking raw-socket client that reads answers framed as idem writes
// them, and an EventServer with an echo handler on a free loopback port.
#pragma once

#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "daemon/http/event_server.h"
#include "daemon/http/http1.h"

namespace idem::testing {

using namespace std::chrono_literals;

// ------------------------------------------------------------------ client

struct Reply {
  int status = 0;
  std::vector<http1::Field> headers;
  std::string body;

  std::string Header(std::string_view name) const {
    for (const http1::Field& f : headers) {
      if (http1::NameEquals(f.name, name)) return f.value;
    }
    return "";
  }
  bool HasHeader(std::string_view name) const {
    return std::any_of(headers.begin(), headers.end(),
                       [&](const http1::Field& f) { return http1::NameEquals(f.name, name); });
  }
};

// A blocking HTTP/1.1 client on 127.0.0.1 (or on a Unix-domain socket);
// every receive times out after 5 s so that a failing test cannot hang. No
// doctest assertions inside: it is used from many threads.
class Client {
 public:
  explicit Client(int port) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    Connect(reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  }
  explicit Client(const std::string& unix_path) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (unix_path.size() >= sizeof(addr.sun_path)) return;
    unix_path.copy(addr.sun_path, unix_path.size());
    Connect(reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  }
  ~Client() {
    if (fd_ >= 0) ::close(fd_);
  }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  bool ok() const { return connected_; }
  // The errno of a failed connect (0 once connected).
  int connect_errno() const { return connect_errno_; }
  // A half-close: the client sends nothing more but still reads.
  void ShutdownWrite() { ::shutdown(fd_, SHUT_WR); }
  // Closes with a reset (SO_LINGER 0), as a client that gave up does.
  void Reset() {
    linger l{1, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    ::close(fd_);
    fd_ = -1;
  }

  bool Send(std::string_view data) {
    while (!data.empty()) {
      ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      data.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  // Reads one response, framed by Content-Length (a 1xx has no body).
  // nullopt on EOF, error or timeout before a whole response.
  // `head_request`: the answer to a HEAD, which has no body whatever its
  // Content-Length says (RFC 9110 9.3.2); bytes after its head belong to
  // the next answer.
  std::optional<Reply> Read(bool head_request = false) {
    for (;;) {
      size_t head_end = buf_.find("\r\n\r\n");
      if (head_end != std::string::npos) {
        std::optional<Reply> r = TryParse(head_end, head_request);
        if (r) return r;
      }
      if (!Fill()) return std::nullopt;
    }
  }

  // True when the server has closed the connection: recv reports EOF (or,
  // when `reset_ok`, a reset) with no further bytes. False on a timeout or
  // when more data arrives.
  bool Closed(bool reset_ok = false) {
    if (!buf_.empty()) return false;
    char c;
    for (;;) {
      ssize_t n = ::recv(fd_, &c, 1, 0);
      if (n == 0) return true;
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == ECONNRESET) return reset_ok;
      return false;
    }
  }

  // True when nothing arrives within `wait` (the connection stays open).
  bool Quiet(std::chrono::milliseconds wait) {
    timeval tv{};
    tv.tv_usec = static_cast<suseconds_t>(wait.count() * 1000);
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char c;
    ssize_t n = ::recv(fd_, &c, 1, MSG_PEEK);
    bool quiet = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    tv.tv_sec = 5;
    tv.tv_usec = 0;
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return quiet;
  }

 private:
  void Connect(const sockaddr* addr, socklen_t len) {
    fd_ = ::socket(addr->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return;
    timeval tv{};
    tv.tv_sec = 5;
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    connected_ = ::connect(fd_, addr, len) == 0;
    connect_errno_ = connected_ ? 0 : errno;
  }

  bool Fill() {
    char chunk[16384];
    for (;;) {
      ssize_t n = ::recv(fd_, chunk, sizeof(chunk), 0);
      if (n > 0) {
        buf_.append(chunk, static_cast<size_t>(n));
        return true;
      }
      if (n < 0 && errno == EINTR) continue;
      return false;
    }
  }

  std::optional<Reply> TryParse(size_t head_end, bool head_request) {
    std::string_view head(buf_.data(), head_end);
    size_t eol = head.find("\r\n");
    std::string_view status_line = head.substr(0, eol);
    if (!status_line.starts_with("HTTP/1.1 ") || status_line.size() < 12) {
      return Reply{-1, {}, std::string(status_line)};
    }
    Reply r;
    r.status = std::atoi(std::string(status_line.substr(9, 3)).c_str());
    size_t pos = eol == std::string_view::npos ? head.size() : eol + 2;
    while (pos < head.size()) {
      size_t end = head.find("\r\n", pos);
      if (end == std::string_view::npos) end = head.size();
      std::string_view line = head.substr(pos, end - pos);
      pos = end + 2;
      size_t colon = line.find(':');
      if (colon == std::string_view::npos) continue;
      std::string_view value = line.substr(colon + 1);
      while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
      r.headers.push_back(http1::Field{std::string(line.substr(0, colon)), std::string(value)});
    }
    size_t length = 0;
    if (r.status >= 200 && !head_request)
      length = static_cast<size_t>(std::atol(r.Header("Content-Length").c_str()));
    if (buf_.size() < head_end + 4 + length) return std::nullopt;
    r.body = buf_.substr(head_end + 4, length);
    buf_.erase(0, head_end + 4 + length);
    return r;
  }

  int fd_ = -1;
  bool connected_ = false;
  int connect_errno_ = 0;
  std::string buf_;
};

// ------------------------------------------------------------------ server

inline EventServerOptions TestOptions() {
  EventServerOptions o;
  o.loops = 2;
  o.workers = 4;
  o.limits.max_head_bytes = 4096;
  o.limits.max_headers = 32;
  o.limits.max_body_bytes = 1024;
  o.idle_timeout_s = 30;
  o.listen_backlog = 128;
  return o;
}

// Answers "<method> <path> <body>".
inline void EchoHandler(const http1::Request& req, http1::Response& res) {
  if (req.path == "/slow") std::this_thread::sleep_for(30ms);
  if (req.path == "/throw") throw std::runtime_error("handler failed");
  res.status = 200;
  res.SetHeader("X-Path", req.path);
  res.SetContent(req.method + " " + req.path + " " + req.body, "text/plain");
}

inline void ErrorBody(int status, const std::string& message, std::string_view field,
                      http1::Response& res, const http1::Request* /*request*/) {
  res.SetContent("error " + std::to_string(status) + ": " + message +
                     (field.empty() ? "" : " at " + std::string(field)),
                 "text/plain");
}

inline EventServer::Callbacks EchoCallbacks(BatchLane* lane = nullptr) {
  EventServer::Callbacks cb;
  cb.handler = EchoHandler;
  cb.batch_lane = lane;
  cb.error_handler = ErrorBody;
  return cb;
}

// An EventServer started on 127.0.0.1 and an any free port.
class Running {
 public:
  explicit Running(EventServer::Callbacks cb, EventServerOptions o = TestOptions())
      : server_(std::move(o), std::move(cb)) {
    StatusOr<int> port = server_.Start("127.0.0.1", 0);
    REQUIRE_MESSAGE(port.ok(), port.status().ToString());
    port_ = *port;
    REQUIRE(port_ > 0);
  }

  EventServer& server() { return server_; }
  int port() const { return port_; }

 private:
  EventServer server_;
  int port_ = 0;
};

inline std::string Get(std::string_view path, std::string_view extra_headers = "") {
  return "GET " + std::string(path) + " HTTP/1.1\r\nHost: test\r\n" + std::string(extra_headers) +
         "\r\n";
}

inline std::string Head(std::string_view path) {
  return "HEAD " + std::string(path) + " HTTP/1.1\r\nHost: test\r\n\r\n";
}

inline std::string Post(std::string_view path, std::string_view body) {
  return "POST " + std::string(path) +
         " HTTP/1.1\r\nHost: test\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" +
         std::string(body);
}

}  // namespace idem::testing
