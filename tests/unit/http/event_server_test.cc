#include "daemon/http/event_server.h"

#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <latch>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "daemon/http/http1.h"
#include "tests/unit/http/event_server_test_util.h"

namespace idem {
namespace {

using namespace std::chrono_literals;
using testing::Client;
using testing::EchoCallbacks;
using testing::Get;
using testing::Head;
using testing::Post;
using testing::Reply;
using testing::Running;
using testing::TestOptions;

// -------------------------------------------------------------- batch lane

struct LaneState {
  std::string body;
  int begun = 0;  // batches this exchange was part of
};

// Wants POST /lane. Prepare refuses the body "refuse" at once and throws on
// "prepare-throws"; Begin throws on "begin-throws"; Finish leaves an exchange
// whose body is "defer" unanswered the first time.
class TestLane : public BatchLane {
 public:
  // Ready a few milliseconds after Begin, on its own thread.
  class DelayedTicket : public Ticket {
   public:
    explicit DelayedTicket(std::function<void()> wake)
        : thread_([this, wake = std::move(wake)] {
            std::this_thread::sleep_for(3ms);
            ready_.store(true, std::memory_order_release);
            wake();
          }) {}
    ~DelayedTicket() override { Wait(); }
    bool Ready() const override { return ready_.load(std::memory_order_acquire); }
    void Wait() {
      if (thread_.joinable()) thread_.join();
    }

   private:
    std::atomic<bool> ready_{false};
    std::thread thread_;
  };

  bool Wants(const http1::Request& req) const override { return req.path == "/lane"; }

  void Prepare(Exchange& ex) override {
    prepared_.fetch_add(1);
    const std::string& body = ex.request.body;
    if (body == "refuse") {
      ex.response.status = 409;
      ex.response.SetContent("refused by prepare", "text/plain");
      ex.answered = true;
      return;
    }
    if (body == "prepare-throws") throw std::runtime_error("prepare failed");
    auto state = std::make_shared<LaneState>();
    state->body = body;
    ex.state = std::move(state);
  }

  std::unique_ptr<Ticket> Begin(std::span<Exchange*> batch, std::function<void()> wake,
                                bool /*others_pending*/) override {
    begins_.fetch_add(1);
    begun_exchanges_.fetch_add(batch.size());
    size_t seen = max_batch_.load();
    while (seen < batch.size() && !max_batch_.compare_exchange_weak(seen, batch.size())) {
    }
    bool fail = false;
    for (Exchange* ex : batch) {
      if (ex->answered || ex->state == nullptr) {
        violations_.fetch_add(1);
        continue;
      }
      auto* state = static_cast<LaneState*>(ex->state.get());
      ++state->begun;
      fail = fail || state->body == "begin-throws";
    }
    if (fail) throw std::runtime_error("begin failed");
    return std::make_unique<DelayedTicket>(std::move(wake));
  }

  void Finish(std::unique_ptr<Ticket> ticket, std::span<Exchange*> batch) override {
    finishes_.fetch_add(1);
    static_cast<DelayedTicket&>(*ticket).Wait();  // Finish may block on the write
    for (Exchange* ex : batch) {
      if (ex->answered || ex->state == nullptr) {
        violations_.fetch_add(1);
        continue;
      }
      auto* state = static_cast<LaneState*>(ex->state.get());
      if (state->body == "defer" && state->begun == 1) {
        deferred_.fetch_add(1);
        continue;  // begun again in a later batch
      }
      ex->response.status = 200;
      ex->response.SetContent("lane batch=" + std::to_string(batch.size()) +
                                  " begun=" + std::to_string(state->begun) + " body=" + state->body,
                              "text/plain");
      ex->answered = true;
    }
  }

  int prepared() const { return prepared_.load(); }
  int begins() const { return begins_.load(); }
  int finishes() const { return finishes_.load(); }
  size_t begun_exchanges() const { return begun_exchanges_.load(); }
  size_t max_batch() const { return max_batch_.load(); }
  int deferred() const { return deferred_.load(); }
  int violations() const { return violations_.load(); }

 private:
  std::atomic<int> prepared_{0};
  std::atomic<int> begins_{0};
  std::atomic<int> finishes_{0};
  std::atomic<size_t> begun_exchanges_{0};
  std::atomic<size_t> max_batch_{0};
  std::atomic<int> deferred_{0};
  std::atomic<int> violations_{0};
};

// The lane answer's body for `body` begun `begun` times, without the batch size.
bool IsLaneAnswer(const std::string& answer, const std::string& body, int begun = 1) {
  return answer.starts_with("lane batch=") &&
         answer.ends_with(" begun=" + std::to_string(begun) + " body=" + body);
}

// ------------------------------------------------------------------- basics

TEST_CASE("a GET is answered by the handler") {
  Running s(EchoCallbacks());
  Client c(s.port());
  REQUIRE(c.ok());
  REQUIRE(c.Send(Get("/hello?x=1")));
  std::optional<Reply> r = c.Read();
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(r->body == "GET /hello ");
  CHECK(r->Header("X-Path") == "/hello");
  CHECK(r->Header("Content-Type") == "text/plain");
  CHECK(r->Header("Content-Length") == "11");
  CHECK_FALSE(r->HasHeader("Connection"));
}

TEST_CASE("a HEAD is answered with the handler's fields and no body, and the connection goes on") {
  Running s(EchoCallbacks());
  Client c(s.port());
  REQUIRE(c.ok());
  // Pipelined: a body after the HEAD's head would be read as the GET's answer.
  REQUIRE(c.Send(Head("/hello") + Get("/next")));
  std::optional<Reply> head = c.Read(/*head_request=*/true);
  REQUIRE(head);
  CHECK(head->status == 200);
  CHECK(head->body.empty());
  CHECK(head->Header("X-Path") == "/hello");
  CHECK(head->Header("Content-Length") == "12");  // what "HEAD /hello " would take
  std::optional<Reply> next = c.Read();
  REQUIRE(next);
  CHECK(next->status == 200);
  CHECK(next->body == "GET /next ");
}

TEST_CASE("every answer carries Date, the time it was written") {
  Running s(EchoCallbacks());
  Client c(s.port());
  REQUIRE(c.ok());
  const int64_t before = std::time(nullptr);
  REQUIRE(c.Send(Get("/hello")));
  std::optional<Reply> r = c.Read();
  const int64_t after = std::time(nullptr);
  REQUIRE(r);
  // The coarse clock may lag by a tick; a second either side is the field's own precision.
  const std::string date = r->Header("Date");
  CHECK((date == http1::HttpDate(before) || date == http1::HttpDate(after) ||
         date == http1::HttpDate(before - 1)));
  // A refusal too: the 400 for a request framed two ways.
  REQUIRE(
      c.Send("GET /x HTTP/1.1\r\nHost: test\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"));
  std::optional<Reply> bad = c.Read();
  REQUIRE(bad);
  CHECK(bad->status == 400);
  CHECK(bad->HasHeader("Date"));
}

TEST_CASE("Start reports Unavailable when the port is already bound") {
  Running first(EchoCallbacks());
  EventServer second(TestOptions(), EchoCallbacks());
  StatusOr<int> port = second.Start("127.0.0.1", first.port());
  CHECK_FALSE(port.ok());
}

// ------------------------------------------------------------- Unix socket

// A fresh folder for socket files, removed afterwards.
struct SocketDir {
  SocketDir() {
    char tmpl[] = "/tmp/idem-sock-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~SocketDir() { std::filesystem::remove_all(path); }
  std::string path;
};

// Whether `c` is connected and its GET of `path` gets the echo handler's answer.
bool Echoes(Client& c, const std::string& path) {
  if (!c.ok() || !c.Send(Get(path))) return false;
  std::optional<Reply> r = c.Read();
  return r && r->status == 200 && r->body == "GET " + path + " ";
}

EventServerOptions UnixOptions(const std::string& path, int mode = 0600) {
  EventServerOptions o = TestOptions();
  o.unix_socket = path;
  o.unix_socket_mode = mode;
  return o;
}

TEST_CASE("the Unix socket serves the same requests as the TCP port, lane included") {
  SocketDir dir;
  const std::string path = dir.path + "/idem.sock";
  TestLane lane;
  Running s(EchoCallbacks(&lane), UnixOptions(path));
  Client c(path);
  CHECK(Echoes(c, "/hello"));
  REQUIRE(c.Send(Post("/lane", "x")));
  std::optional<Reply> laned = c.Read();
  REQUIRE(laned);
  CHECK(IsLaneAnswer(laned->body, "x"));
  Client tcp(s.port());
  CHECK(Echoes(tcp, "/also"));
}

TEST_CASE("a request that came over the Unix socket says so, whichever loop serves it") {
  SocketDir dir;
  const std::string path = dir.path + "/idem.sock";
  EventServer::Callbacks cb = EchoCallbacks();
  cb.handler = [](const http1::Request& req, http1::Response& res) {
    res.SetContent(req.local_socket ? "local" : "tcp", "text/plain");
  };
  Running s(cb, UnixOptions(path));
  // Several connections at once: accepted by one loop, handed to the others.
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 6; ++i) clients.push_back(std::make_unique<Client>(path));
  for (auto& c : clients) {
    REQUIRE(c->ok());
    REQUIRE(c->Send(Get("/which")));
    std::optional<Reply> r = c->Read();
    REQUIRE(r);
    CHECK(r->body == "local");
  }
  Client tcp(s.port());
  REQUIRE(tcp.Send(Get("/which")));
  std::optional<Reply> r = tcp.Read();
  REQUIRE(r);
  CHECK(r->body == "tcp");
}

TEST_CASE("the Unix socket file gets the configured mode whatever the umask") {
  SocketDir dir;
  for (int mode : {0600, 0660}) {
    const std::string path = dir.path + "/m" + std::to_string(mode) + ".sock";
    const mode_t old = umask(0);
    Running s(EchoCallbacks(), UnixOptions(path, mode));
    umask(old);
    struct stat st {};
    REQUIRE(lstat(path.c_str(), &st) == 0);
    CHECK(S_ISSOCK(st.st_mode));
    CHECK((st.st_mode & 0777) == static_cast<mode_t>(mode));
  }
}

TEST_CASE("a socket file left by a server that is gone is replaced, and Stop removes its own") {
  SocketDir dir;
  const std::string path = dir.path + "/idem.sock";
  {
    // What a killed daemon leaves: a bound socket file nobody accepts on.
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    path.copy(addr.sun_path, path.size());
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    ::close(fd);
    CHECK(Client(path).connect_errno() == ECONNREFUSED);
  }
  {
    Running s(EchoCallbacks(), UnixOptions(path));
    Client c(path);
    CHECK(Echoes(c, "/x"));
    s.server().Stop();
    CHECK_FALSE(std::filesystem::exists(std::filesystem::symlink_status(path)));
  }
}

TEST_CASE("Start refuses a Unix socket path another server serves, or that is not a socket") {
  SocketDir dir;
  const std::string path = dir.path + "/idem.sock";
  Running first(EchoCallbacks(), UnixOptions(path));
  EventServer second(UnixOptions(path), EchoCallbacks());
  StatusOr<int> port = second.Start("127.0.0.1", 0);
  REQUIRE_FALSE(port.ok());
  CHECK(port.status().code() == Code::kFailedPrecondition);
  CHECK(port.status().message().find("another process serves") != std::string::npos);
  // The first still serves on it.
  Client c(path);
  CHECK(Echoes(c, "/still"));

  const std::string file = dir.path + "/notes.txt";
  { std::ofstream(file) << "keep me"; }
  EventServer third(UnixOptions(file), EchoCallbacks());
  StatusOr<int> refused = third.Start("127.0.0.1", 0);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().message().find("is not a socket") != std::string::npos);
  std::ifstream in(file);
  std::string kept;
  std::getline(in, kept);
  CHECK(kept == "keep me");
}

TEST_CASE("Stop leaves a socket file that another server has put in its place") {
  SocketDir dir;
  const std::string path = dir.path + "/idem.sock";
  Running first(EchoCallbacks(), UnixOptions(path));
  // Someone removes the file and another server binds the path (an
  // operator's restart racing the old process's exit).
  REQUIRE(::unlink(path.c_str()) == 0);
  Running second(EchoCallbacks(), UnixOptions(path));
  first.server().Stop();
  Client c(path);
  CHECK(Echoes(c, "/second"));
}

TEST_CASE("a Unix socket path longer than sun_path is refused, and the TCP port is let go") {
  const std::string path = "/tmp/" + std::string(200, 'a');
  EventServerOptions o = UnixOptions(path);
  int port = 0;
  {
    EventServer s(o, EchoCallbacks());
    StatusOr<int> started = s.Start("127.0.0.1", 0);
    REQUIRE_FALSE(started.ok());
    CHECK(started.status().code() == Code::kInvalidArgument);
  }
  // Nothing kept the port: a server with no Unix socket starts on a free one.
  Running s(EchoCallbacks());
  port = s.port();
  CHECK(port > 0);
}

TEST_CASE("a kept-alive connection serves several requests one after another") {
  Running s(EchoCallbacks());
  Client c(s.port());
  REQUIRE(c.ok());
  for (int i = 0; i < 5; ++i) {
    const std::string body = "n" + std::to_string(i);
    REQUIRE(c.Send(Post("/echo", body)));
    std::optional<Reply> r = c.Read();
    REQUIRE(r);
    CHECK(r->status == 200);
    CHECK(r->body == "POST /echo " + body);
  }
  CHECK(c.Quiet(20ms));  // and the connection stays open
}

TEST_CASE("two pipelined requests in one write are answered in order") {
  Running s(EchoCallbacks());
  Client c(s.port());
  REQUIRE(c.ok());
  // The first one is slower: its answer must still come first.
  REQUIRE(c.Send(Get("/slow") + Post("/fast", "quick") + Get("/third")));
  std::optional<Reply> a = c.Read();
  std::optional<Reply> b = c.Read();
  std::optional<Reply> d = c.Read();
  REQUIRE(a);
  REQUIRE(b);
  REQUIRE(d);
  CHECK(a->body == "GET /slow ");
  CHECK(b->body == "POST /fast quick");
  CHECK(d->body == "GET /third ");
}

TEST_CASE("a request arriving in pieces is answered once it is complete") {
  Running s(EchoCallbacks());
  Client c(s.port());
  REQUIRE(c.ok());
  const std::string req = Post("/pieces", "abcdef");
  for (size_t i = 0; i < req.size(); i += 7) {
    REQUIRE(c.Send(std::string_view(req).substr(i, 7)));
    if (i == 14) std::this_thread::sleep_for(5ms);
  }
  std::optional<Reply> r = c.Read();
  REQUIRE(r);
  CHECK(r->body == "POST /pieces abcdef");
}

TEST_CASE("a handler that throws gets a 500 and the connection goes on") {
  Running s(EchoCallbacks());
  Client c(s.port());
  REQUIRE(c.ok());
  REQUIRE(c.Send(Get("/throw")));
  std::optional<Reply> r = c.Read();
  REQUIRE(r);
  CHECK(r->status == 500);
  CHECK(r->Header("Content-Type") == "application/problem+json");
  REQUIRE(c.Send(Get("/after")));
  std::optional<Reply> next = c.Read();
  REQUIRE(next);
  CHECK(next->body == "GET /after ");
}

TEST_CASE("32 concurrent connections on the worker path are all answered") {
  Running s(EchoCallbacks());
  constexpr int kClients = 32;
  constexpr int kPerClient = 3;
  std::latch start(kClients);
  std::vector<int> good(kClients, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      Client c(s.port());
      start.arrive_and_wait();
      if (!c.ok()) return;
      for (int k = 0; k < kPerClient; ++k) {
        const std::string body = std::to_string(i) + "-" + std::to_string(k);
        if (!c.Send(Post("/w", body))) return;
        std::optional<Reply> r = c.Read();
        if (r && r->status == 200 && r->body == "POST /w " + body) ++good[i];
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kClients; ++i) CHECK_MESSAGE(good[i] == kPerClient, "client ", i);
}

// ------------------------------------------------------- Expect: continue

TEST_CASE("Expect: 100-continue gets the interim answer before the body is sent") {
  Running s(EchoCallbacks());
  Client c(s.port());
  REQUIRE(c.ok());
  for (int round = 0; round < 2; ++round) {  // again on the same connection
    CAPTURE(round);
    REQUIRE(c.Send(
        "POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"));
    std::optional<Reply> interim = c.Read();
    REQUIRE(interim);
    CHECK(interim->status == 100);
    CHECK(interim->body.empty());
    REQUIRE(c.Send("hello"));
    std::optional<Reply> r = c.Read();
    REQUIRE(r);
    CHECK(r->status == 200);
    CHECK(r->body == "POST /upload hello");
  }
}

TEST_CASE("Expect: 100-continue with a body over the limit gets the 413 instead") {
  Running s(EchoCallbacks());
  Client c(s.port());
  REQUIRE(c.ok());
  REQUIRE(c.Send(
      "POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: 5000\r\nExpect: 100-continue\r\n\r\n"));
  std::optional<Reply> r = c.Read();
  REQUIRE(r);
  CHECK(r->status == 413);
  CHECK(r->body.starts_with("error 413: "));
  CHECK(r->Header("Connection") == "close");
  CHECK(c.Closed());
}

TEST_CASE("an HTTP/1.0 request's Expect: 100-continue gets no interim answer") {
  Running s(EchoCallbacks());
  Client c(s.port());
  REQUIRE(c.ok());
  REQUIRE(c.Send("POST /old HTTP/1.0\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n"));
  CHECK(c.Quiet(30ms));
  REQUIRE(c.Send("hi"));
  std::optional<Reply> r = c.Read();
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(r->body == "POST /old hi");
  CHECK(c.Closed());
}

// ----------------------------------------------------------- framing errors

TEST_CASE("a malformed request gets 400 from the error handler and the connection closes") {
  Running s(EchoCallbacks());
  Client c(s.port());
  REQUIRE(c.ok());
  REQUIRE(c.Send("THIS IS NOT HTTP\r\n\r\n"));
  std::optional<Reply> r = c.Read();
  REQUIRE(r);
  CHECK(r->status == 400);
  CHECK(r->body.starts_with("error 400: "));
  CHECK(r->Header("Connection") == "close");
  CHECK(c.Closed());
}

TEST_CASE("a good request pipelined before a malformed one is answered before the 400") {
  Running s(EchoCallbacks());
  Client c(s.port());
  REQUIRE(c.ok());
  REQUIRE(c.Send(Get("/slow") + "GET / HTTP/9.9\r\n\r\n" + Get("/never")));
  std::optional<Reply> first = c.Read();
  REQUIRE(first);
  CHECK(first->status == 200);
  CHECK(first->body == "GET /slow ");
  std::optional<Reply> second = c.Read();
  REQUIRE(second);
  CHECK(second->status == 505);
  CHECK(c.Closed());
}

TEST_CASE("a body over max_body_bytes sent in full still lets the client read the 413") {
  Running s(EchoCallbacks());  // max_body_bytes = 1024
  Client c(s.port());
  REQUIRE(c.ok());
  const std::string body(256 << 10, 'x');
  // Head and body in one go: the server refuses after the head, with most
  // of the body unread; closing at once would reset the connection and
  // the client would lose the answer.
  REQUIRE(c.Send("POST /big HTTP/1.1\r\nHost: t\r\nContent-Length: " + std::to_string(body.size()) +
                 "\r\n\r\n" + body));
  std::optional<Reply> r = c.Read();
  REQUIRE(r);
  CHECK(r->status == 413);
  CHECK(r->Header("Connection") == "close");
  CHECK(c.Closed());
}

TEST_CASE("the rest of a refused body sent after the 413 is drained, not reset") {
  Running s(EchoCallbacks());
  Client c(s.port());
  REQUIRE(c.ok());
  REQUIRE(c.Send("POST /big HTTP/1.1\r\nHost: t\r\nContent-Length: 300000\r\n\r\n"));
  std::optional<Reply> r = c.Read();
  REQUIRE(r);
  CHECK(r->status == 413);
  // The peer goes on sending the body it announced.
  const std::string piece(100000, 'y');
  for (int i = 0; i < 3; ++i) CHECK(c.Send(piece));
  CHECK(c.Closed());
}

TEST_CASE("a head over max_head_bytes gets 431 and the connection closes") {
  Running s(EchoCallbacks());  // max_head_bytes = 4096
  Client c(s.port());
  REQUIRE(c.ok());
  REQUIRE(c.Send("GET / HTTP/1.1\r\nX-Big: " + std::string(5000, 'h')));
  std::optional<Reply> r = c.Read();
  REQUIRE(r);
  CHECK(r->status == 431);
  CHECK(c.Closed());
}

TEST_CASE("an endless chunked trailer section gets 431 instead of being buffered") {
  Running s(EchoCallbacks());  // max_head_bytes = 4096
  Client c(s.port());
  REQUIRE(c.ok());
  std::string trailers;
  for (int i = 0; i < 1000; ++i) trailers += "X-Trailer: value\r\n";
  REQUIRE(
      c.Send("POST /t HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n" + trailers));
  std::optional<Reply> r = c.Read();
  REQUIRE(r);
  CHECK(r->status == 431);
  CHECK(c.Closed());
}

// ------------------------------------------------------------------ bodies

TEST_CASE("a chunked request body reaches the handler decoded") {
  Running s(EchoCallbacks());
  Client c(s.port());
  REQUIRE(c.ok());
  REQUIRE(
      c.Send("POST /chunked HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
             "5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n"));
  std::optional<Reply> r = c.Read();
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(r->body == "POST /chunked hello world");
}

TEST_CASE("a chunked request body sent in pieces reaches the handler decoded") {
  Running s(EchoCallbacks());
  Client c(s.port());
  REQUIRE(c.ok());
  REQUIRE(c.Send("POST /chunked HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"));
  std::this_thread::sleep_for(5ms);
  REQUIRE(c.Send("3\r\nab"));
  std::this_thread::sleep_for(5ms);
  REQUIRE(c.Send("c\r\n2\r\nde\r\n0\r\n"));
  std::this_thread::sleep_for(5ms);
  REQUIRE(c.Send("\r\n"));
  std::optional<Reply> r = c.Read();
  REQUIRE(r);
  CHECK(r->body == "POST /chunked abcde");
}

TEST_CASE("a body at the limit in one-byte chunks, trickling in, reaches the handler whole") {
  Running s(EchoCallbacks());  // max_body_bytes = 1024: framing up to 64 KiB + 256 bytes
  Client c(s.port());
  REQUIRE(c.ok());
  REQUIRE(c.Send("POST /chunked HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"));
  std::string data;
  for (int i = 0; i < 1024; ++i) {
    const char byte = static_cast<char>('a' + i % 26);
    data += byte;
    REQUIRE(c.Send(std::string("1\r\n") + byte + "\r\n"));
    if (i % 128 == 0) std::this_thread::sleep_for(1ms);  // read after read, resumed each time
  }
  REQUIRE(c.Send("0\r\n\r\n"));
  std::optional<Reply> r = c.Read();
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(r->body == "POST /chunked " + data);
}

// -------------------------------------------------------------- keep-alive

TEST_CASE("an HTTP/1.0 request without keep-alive is answered, then the connection closes") {
  Running s(EchoCallbacks());
  Client c(s.port());
  REQUIRE(c.ok());
  REQUIRE(c.Send("GET /old HTTP/1.0\r\n\r\n"));
  std::optional<Reply> r = c.Read();
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(r->body == "GET /old ");
  CHECK(r->Header("Connection") == "close");
  CHECK(c.Closed());
}

TEST_CASE("an HTTP/1.0 request with Connection: keep-alive keeps the connection") {
  Running s(EchoCallbacks());
  Client c(s.port());
  REQUIRE(c.ok());
  REQUIRE(c.Send("GET /old HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
  std::optional<Reply> r = c.Read();
  REQUIRE(r);
  CHECK(r->Header("Connection") == "keep-alive");
  REQUIRE(c.Send("GET /again HTTP/1.0\r\n\r\n"));
  std::optional<Reply> again = c.Read();
  REQUIRE(again);
  CHECK(again->body == "GET /again ");
  CHECK(again->Header("Connection") == "close");
  CHECK(c.Closed());
}

TEST_CASE("an HTTP/1.1 request with Connection: close is answered, then the connection closes") {
  Running s(EchoCallbacks());
  Client c(s.port());
  REQUIRE(c.ok());
  REQUIRE(c.Send(Get("/bye", "Connection: close\r\n") + Get("/ignored")));
  std::optional<Reply> r = c.Read();
  REQUIRE(r);
  CHECK(r->body == "GET /bye ");
  CHECK(r->Header("Connection") == "close");
  CHECK(c.Closed());
}

// -------------------------------------------------------------- batch lane

TEST_CASE("requests sent before the client half-closes are still answered, then it closes") {
  TestLane lane;
  Running s(EchoCallbacks(&lane));
  Client c(s.port());
  REQUIRE(c.ok());
  REQUIRE(c.Send(Get("/first") + Post("/lane", "two")));
  c.ShutdownWrite();
  std::optional<Reply> first = c.Read();
  REQUIRE(first);
  CHECK(first->body == "GET /first ");
  std::optional<Reply> second = c.Read();
  REQUIRE(second);
  CHECK(second->body == "lane batch=1 begun=1 body=two");
  CHECK(c.Closed());
}

TEST_CASE("an incomplete request followed by a half-close is closed without an answer") {
  Running s(EchoCallbacks());
  Client c(s.port());
  REQUIRE(c.ok());
  REQUIRE(c.Send("GET /never HTTP/1.1\r\nHost: x\r\n"));
  c.ShutdownWrite();
  CHECK(c.Closed());
}

TEST_CASE("a lane request is prepared, begun and finished by the batch lane") {
  TestLane lane;
  Running s(EchoCallbacks(&lane));
  Client c(s.port());
  REQUIRE(c.ok());
  REQUIRE(c.Send(Post("/lane", "one")));
  std::optional<Reply> r = c.Read();
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(r->body == "lane batch=1 begun=1 body=one");
  // Other paths still go to the handler.
  REQUIRE(c.Send(Post("/other", "two")));
  std::optional<Reply> other = c.Read();
  REQUIRE(other);
  CHECK(other->body == "POST /other two");
  CHECK(lane.prepared() == 1);
  CHECK(lane.begins() == 1);
  CHECK(lane.violations() == 0);
}

TEST_CASE("32 concurrent connections posting to the batch lane all get their answers") {
  TestLane lane;
  Running s(EchoCallbacks(&lane));
  constexpr int kClients = 32;
  constexpr int kPerClient = 3;
  std::latch start(kClients);
  std::vector<int> good(kClients, 0);
  std::vector<std::string> bad(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      Client c(s.port());
      start.arrive_and_wait();
      if (!c.ok()) return;
      for (int k = 0; k < kPerClient; ++k) {
        const std::string body = "c" + std::to_string(i) + "-" + std::to_string(k);
        if (!c.Send(Post("/lane", body))) return;
        std::optional<Reply> r = c.Read();
        if (r && r->status == 200 && IsLaneAnswer(r->body, body)) {
          ++good[i];
        } else if (r) {
          bad[i] = r->body;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kClients; ++i) {
    CHECK_MESSAGE(good[i] == kPerClient, "client ", i, " ", bad[i]);
  }
  CHECK(lane.prepared() == kClients * kPerClient);
  CHECK(lane.begun_exchanges() == static_cast<size_t>(kClients * kPerClient));
  CHECK(lane.violations() == 0);
  MESSAGE("lane batches: ", lane.begins(), ", largest: ", lane.max_batch());
}

// Answers every POST /lane in Prepare, on the loop thread that serves the
// connection, and counts the requests each loop thread prepared.
class LoopCountingLane : public BatchLane {
 public:
  bool Wants(const http1::Request& req) const override { return req.path == "/lane"; }
  void Prepare(Exchange& ex) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      by_loop_[std::this_thread::get_id()].push_back(ex.request.body);
    }
    ex.response.status = 200;
    ex.response.SetContent("prepared", "text/plain");
    ex.answered = true;
  }
  std::unique_ptr<Ticket> Begin(std::span<Exchange*>, std::function<void()>, bool) override {
    throw std::logic_error("every request is answered in Prepare");
  }
  void Finish(std::unique_ptr<Ticket>, std::span<Exchange*>) override {}
  // The bodies each loop prepared, loop by loop.
  std::vector<std::vector<std::string>> bodies() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::vector<std::string>> out;
    for (const auto& [id, b] : by_loop_) out.push_back(b);
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::map<std::thread::id, std::vector<std::string>> by_loop_;
};

TEST_CASE("connections opened at once are spread evenly over the loops") {
  LoopCountingLane lane;
  Running s(EchoCallbacks(&lane));  // two loops
  constexpr int kClients = 64;
  // All connect first (the kernel completes the handshakes before anyone
  // accepts), as a load generator or a pool opening its connections does.
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<Client>(s.port()));
    REQUIRE(clients.back()->ok());
  }
  auto each_asks_once = [&] {
    for (int i = 0; i < kClients; ++i) {
      REQUIRE(clients[i]->Send(Post("/lane", std::to_string(i))));
      std::optional<Reply> r = clients[i]->Read();
      REQUIRE(r);
      CHECK(r->status == 200);
    }
  };
  each_asks_once();
  std::vector<std::vector<std::string>> round1 = lane.bodies();
  REQUIRE(round1.size() == 2);  // one loop serving all of them fails here
  const int a1 = static_cast<int>(round1[0].size()), b1 = static_cast<int>(round1[1].size());
  MESSAGE("connections per loop: ", a1, " and ", b1);
  CHECK(std::abs(a1 - b1) <= 2);

  // Closed connections no longer count: every connection of the first loop
  // closes, as many open, and they all go to that loop.
  std::vector<int> closed;
  for (const std::string& body : round1[0]) closed.push_back(std::stoi(body));
  for (int i : closed) clients[i] = nullptr;
  std::this_thread::sleep_for(50ms);  // the loop sees the closes
  for (int i : closed) {
    clients[i] = std::make_unique<Client>(s.port());
    REQUIRE(clients[i]->ok());
  }
  each_asks_once();
  std::vector<std::vector<std::string>> total = lane.bodies();
  REQUIRE(total.size() == 2);
  // Every connection asked once per round: a loop's share of the second
  // round is the connections it serves now.
  const int a2 = static_cast<int>(total[0].size()) - a1;
  const int b2 = static_cast<int>(total[1].size()) - b1;
  MESSAGE("after the first loop's connections closed and as many opened: ", a2, " and ", b2);
  CHECK(std::abs(a2 - b2) <= 2);
}

TEST_CASE("an exchange Finish leaves unanswered is answered by a later batch") {
  TestLane lane;
  Running s(EchoCallbacks(&lane));
  Client c(s.port());
  REQUIRE(c.ok());
  REQUIRE(c.Send(Post("/lane", "defer")));
  std::optional<Reply> r = c.Read();
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(r->body == "lane batch=1 begun=2 body=defer");
  CHECK(lane.deferred() == 1);
  CHECK(lane.begins() == 2);
  CHECK(lane.finishes() == 2);
  CHECK(lane.violations() == 0);
}

TEST_CASE("a deferred exchange does not hold up other connections' lane requests") {
  TestLane lane;
  Running s(EchoCallbacks(&lane));
  Client deferred(s.port());
  Client other(s.port());
  REQUIRE(deferred.ok());
  REQUIRE(other.ok());
  REQUIRE(deferred.Send(Post("/lane", "defer")));
  REQUIRE(other.Send(Post("/lane", "plain")));
  std::optional<Reply> a = deferred.Read();
  std::optional<Reply> b = other.Read();
  REQUIRE(a);
  REQUIRE(b);
  CHECK(IsLaneAnswer(a->body, "defer", 2));
  CHECK(IsLaneAnswer(b->body, "plain", 1));
  CHECK(lane.violations() == 0);
}

// A lane whose "hold" request keeps a lock until Release(), as a batch
// waiting for its fsync keeps its store locks; a "wait" request needs that
// lock. Begun while other batches are in flight, a "wait" whose lock is
// held is left for later (as the journal's kSkipBusy does), its ticket
// ready at once; begun with none in flight, it waits for the lock.
class LockLane : public BatchLane {
 public:
  class Gate : public Ticket {
   public:
    explicit Gate(const std::atomic<bool>& open) : open_(open) {}
    bool Ready() const override { return open_.load(); }

   private:
    const std::atomic<bool>& open_;
  };

  bool Wants(const http1::Request& req) const override { return req.path == "/lane"; }
  void Prepare(Exchange& ex) override {
    auto state = std::make_shared<LaneState>();
    state->body = ex.request.body;
    ex.state = std::move(state);
  }
  std::unique_ptr<Ticket> Begin(std::span<Exchange*> batch, std::function<void()> wake,
                                bool others_pending) override {
    for (Exchange* ex : batch) {
      if (static_cast<LaneState*>(ex->state.get())->body == "hold") {
        std::lock_guard<std::mutex> lock(mu_);
        hold_wake_ = wake;
        hold_begun_ = true;
        return std::make_unique<Gate>(released_);
      }
    }
    ++wait_begins_;
    if (!others_pending) {  // may wait for the lock
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return released_.load(); });
    }
    wake();  // the journal too reports a batch that writes nothing at once
    return std::make_unique<Gate>(always_);
  }
  void Finish(std::unique_ptr<Ticket>, std::span<Exchange*> batch) override {
    for (Exchange* ex : batch) {
      auto* state = static_cast<LaneState*>(ex->state.get());
      if (state->body == "wait" && !released_.load()) continue;  // its lock was busy
      ex->response.status = 200;
      ex->response.SetContent("done " + state->body, "text/plain");
      ex->answered = true;
    }
  }

  void Release() {
    std::function<void()> wake;
    {
      std::lock_guard<std::mutex> lock(mu_);
      released_ = true;
      wake = hold_wake_;
    }
    cv_.notify_all();
    if (wake) wake();
  }
  bool hold_begun() {
    std::lock_guard<std::mutex> lock(mu_);
    return hold_begun_;
  }
  int wait_begins() const { return wait_begins_.load(); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> hold_wake_;
  bool hold_begun_ = false;
  std::atomic<bool> released_{false};
  std::atomic<bool> always_{true};
  std::atomic<int> wait_begins_{0};
};

TEST_CASE(
    "a lane request whose lock a batch in flight holds is begun again after it, not in a loop") {
  LockLane lane;
  EventServerOptions options = TestOptions();
  options.loops = 1;  // both requests on the loop whose batch holds the lock
  Running s(EchoCallbacks(&lane), options);
  Client holder(s.port());
  Client waiter(s.port());
  REQUIRE(holder.ok());
  REQUIRE(waiter.ok());
  REQUIRE(holder.Send(Post("/lane", "hold")));
  auto deadline = std::chrono::steady_clock::now() + 2s;
  while (!lane.hold_begun() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
  }
  REQUIRE(lane.hold_begun());
  REQUIRE(waiter.Send(Post("/lane", "wait")));
  // The hold batch's "fsync" takes 200 ms; beginning the waiter again
  // meanwhile only finds the lock still held (the old loop did it
  // hundreds of thousands of times a second).
  std::this_thread::sleep_for(200ms);
  CHECK(lane.wait_begins() == 1);
  lane.Release();
  std::optional<Reply> held = holder.Read();
  std::optional<Reply> waited = waiter.Read();
  REQUIRE(held);
  REQUIRE(waited);
  CHECK(held->body == "done hold");
  CHECK(waited->body == "done wait");
  CHECK(lane.wait_begins() == 2);  // once skipped, once after the hold batch
}

TEST_CASE("a Prepare that answers at once is answered without Begin") {
  TestLane lane;
  Running s(EchoCallbacks(&lane));
  Client c(s.port());
  REQUIRE(c.ok());
  REQUIRE(c.Send(Post("/lane", "refuse")));
  std::optional<Reply> r = c.Read();
  REQUIRE(r);
  CHECK(r->status == 409);
  CHECK(r->body == "refused by prepare");
  CHECK(lane.prepared() == 1);
  CHECK(lane.begins() == 0);
  CHECK(lane.finishes() == 0);
}

TEST_CASE("a request pipelined after one Prepare answered at once goes on to the lane") {
  TestLane lane;
  Running s(EchoCallbacks(&lane));
  Client c(s.port());
  REQUIRE(c.ok());
  REQUIRE(c.Send(Post("/lane", "refuse") + Post("/lane", "next") + Get("/tail")));
  std::optional<Reply> a = c.Read();
  std::optional<Reply> b = c.Read();
  std::optional<Reply> d = c.Read();
  REQUIRE(a);
  REQUIRE(b);
  REQUIRE(d);
  CHECK(a->status == 409);
  CHECK(b->body == "lane batch=1 begun=1 body=next");
  CHECK(d->body == "GET /tail ");
  CHECK(lane.begins() == 1);
  CHECK(lane.violations() == 0);
}

TEST_CASE("a Prepare that throws answers 500 and a Begin that throws answers 500") {
  TestLane lane;
  Running s(EchoCallbacks(&lane));
  Client c(s.port());
  REQUIRE(c.ok());
  REQUIRE(c.Send(Post("/lane", "prepare-throws")));
  std::optional<Reply> a = c.Read();
  REQUIRE(a);
  CHECK(a->status == 500);
  CHECK(lane.begins() == 0);
  REQUIRE(c.Send(Post("/lane", "begin-throws")));
  std::optional<Reply> b = c.Read();
  REQUIRE(b);
  CHECK(b->status == 500);
  CHECK(lane.begins() == 1);
  CHECK(lane.finishes() == 0);
  // The connection still serves the lane.
  REQUIRE(c.Send(Post("/lane", "fine")));
  std::optional<Reply> d = c.Read();
  REQUIRE(d);
  CHECK(d->body == "lane batch=1 begun=1 body=fine");
}

TEST_CASE("a lane request with Connection: close is answered, then the connection closes") {
  TestLane lane;
  Running s(EchoCallbacks(&lane));
  Client c(s.port());
  REQUIRE(c.ok());
  REQUIRE(c.Send(
      "POST /lane HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: 3\r\n\r\nend"));
  std::optional<Reply> r = c.Read();
  REQUIRE(r);
  CHECK(r->body == "lane batch=1 begun=1 body=end");
  CHECK(r->Header("Connection") == "close");
  CHECK(c.Closed());
}

// -------------------------------------------------------------------- Stop

TEST_CASE("Stop returns promptly while connections are open and closes them") {
  auto s = std::make_unique<Running>(EchoCallbacks());
  Client idle(s->port());
  Client partial(s->port());
  REQUIRE(idle.ok());
  REQUIRE(partial.ok());
  // A first exchange on each makes sure both are accepted.
  for (Client* c : {&idle, &partial}) {
    REQUIRE(c->Send(Get("/warm")));
    REQUIRE(c->Read());
  }
  REQUIRE(partial.Send("GET /half HTTP/1.1\r\nHo"));
  std::this_thread::sleep_for(10ms);

  auto t0 = std::chrono::steady_clock::now();
  s->server().Stop();
  auto took = std::chrono::steady_clock::now() - t0;
  CHECK(took < 1s);
  CHECK(idle.Closed());
  CHECK(partial.Closed(/*reset_ok=*/true));
  s.reset();  // a second Stop from the destructor is harmless
}

// ------------------------------------------------------------------ limits

// A handler that holds every request until released, counting them.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  std::atomic<int> started{0};

  EventServer::Callbacks Callbacks() {
    EventServer::Callbacks cb = EchoCallbacks();
    cb.handler = [this](const http1::Request& req, http1::Response& res) {
      started.fetch_add(1);
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return open; });
      res.SetContent("passed " + req.path, "text/plain");
    };
    return cb;
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu);
    open = true;
    cv.notify_all();
  }
  // One worker, one queue slot: /a on `running` holds the worker and /b on
  // `queued` takes the slot.
  void Hold(Client& running, Client& queued) {
    REQUIRE(running.Send(Get("/a")));
    REQUIRE(WaitStarted(1));
    REQUIRE(queued.Send(Get("/b")));
    std::this_thread::sleep_for(20ms);  // /b is queued now
  }
  // Opens the gate; both held requests are answered.
  void Release(Client& running, Client& queued) {
    Open();
    std::optional<Reply> a = running.Read();
    std::optional<Reply> b = queued.Read();
    REQUIRE((a && b));
    CHECK(a->body == "passed /a");
    CHECK(b->body == "passed /b");
  }
  bool WaitStarted(int n) {
    auto deadline = std::chrono::steady_clock::now() + 2s;
    while (started.load() < n && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(1ms);
    }
    return started.load() >= n;
  }
};

EventServerOptions OneWorker(int max_queue) {
  EventServerOptions o = TestOptions();
  o.workers = 1;
  o.max_queue = max_queue;
  return o;
}

TEST_CASE("a request past a full handler queue gets 503 with Retry-After at once") {
  Gate gate;
  Running s(gate.Callbacks(), OneWorker(/*max_queue=*/1));
  Client running(s.port()), queued(s.port()), refused(s.port());
  REQUIRE((running.ok() && queued.ok() && refused.ok()));
  gate.Hold(running, queued);
  REQUIRE(refused.Send(Get("/c")));
  std::optional<Reply> r = refused.Read();
  REQUIRE(r);
  CHECK(r->status == 503);
  CHECK(r->Header("Retry-After") == "1");
  CHECK(s.server().stats().queue_full == 1);
  gate.Release(running, queued);
  // The refused connection stays usable once there is room.
  REQUIRE(refused.Send(Get("/c")));
  std::optional<Reply> again = refused.Read();
  REQUIRE(again);
  CHECK(again->status == 200);
}

TEST_CASE("with no queue every worker still serves: max_queue 0 refuses only past the workers") {
  // Workers start as requests need them; a request that a worker yet to
  // start will take is not waiting for a busy one, so it is not refused.
  Gate gate;
  EventServerOptions o = TestOptions();
  o.workers = 4;
  o.max_queue = 0;
  Running s(gate.Callbacks(), o);
  struct OpenOnExit {  // a failed REQUIRE must not leave handlers blocked in Stop
    Gate& gate;
    ~OpenOnExit() { gate.Open(); }
  } open_on_exit{gate};
  std::vector<std::unique_ptr<Client>> held;
  for (int i = 0; i < 4; ++i) {
    held.push_back(std::make_unique<Client>(s.port()));
    REQUIRE(held.back()->ok());
    REQUIRE(held.back()->Send(Get("/h" + std::to_string(i))));
    REQUIRE(gate.WaitStarted(i + 1));
  }
  Client refused(s.port());
  REQUIRE(refused.ok());
  REQUIRE(refused.Send(Get("/past")));
  std::optional<Reply> r = refused.Read();
  REQUIRE(r);
  CHECK(r->status == 503);
  CHECK(s.server().stats().queue_full == 1);
  gate.Open();
  for (int i = 0; i < 4; ++i) {
    std::optional<Reply> a = held[i]->Read();
    REQUIRE(a);
    CHECK(a->body == "passed /h" + std::to_string(i));
  }
}

TEST_CASE("a HEAD refused for a full handler queue gets its 503 without a body") {
  Gate gate;
  Running s(gate.Callbacks(), OneWorker(/*max_queue=*/1));
  Client running(s.port()), queued(s.port()), refused(s.port());
  REQUIRE((running.ok() && queued.ok() && refused.ok()));
  gate.Hold(running, queued);
  REQUIRE(refused.Send(Head("/c")));
  std::optional<Reply> r = refused.Read(/*head_request=*/true);
  REQUIRE(r);
  CHECK(r->status == 503);
  CHECK(r->Header("Retry-After") == "1");
  gate.Release(running, queued);
  // Nothing of the refusal's body is left to be taken for the next answer.
  REQUIRE(refused.Send(Get("/c")));
  std::optional<Reply> again = refused.Read();
  REQUIRE(again);
  CHECK(again->status == 200);
}

TEST_CASE("a request on_loop accepts is answered while every worker is busy and the queue full") {
  Gate gate;
  EventServer::Callbacks cb = gate.Callbacks();
  cb.handler = [held = cb.handler](const http1::Request& req, http1::Response& res) {
    if (req.path == "/live") return res.SetContent("alive", "text/plain");
    held(req, res);
  };
  cb.on_loop = [](const http1::Request& req) { return req.path == "/live"; };
  Running s(std::move(cb), OneWorker(/*max_queue=*/1));
  Client running(s.port()), queued(s.port()), probe(s.port());
  REQUIRE((running.ok() && queued.ok() && probe.ok()));
  gate.Hold(running, queued);
  REQUIRE(probe.Send(Get("/c")));
  std::optional<Reply> refused = probe.Read();
  REQUIRE(refused);
  CHECK(refused->status == 503);
  for (int i = 0; i < 3; ++i) {  // and again on the same connection
    REQUIRE(probe.Send(Get("/live")));
    std::optional<Reply> live = probe.Read();
    REQUIRE(live);
    CHECK(live->status == 200);
    CHECK(live->body == "alive");
  }
  CHECK(s.server().stats().queue_full == 1);
  gate.Release(running, queued);
}

TEST_CASE("a queued request whose client reset the connection is never started") {
  Gate gate;
  Running s(gate.Callbacks(), OneWorker(/*max_queue=*/8));
  Client running(s.port());
  REQUIRE(running.ok());
  REQUIRE(running.Send(Get("/a")));
  REQUIRE(gate.WaitStarted(1));
  {
    Client gone(s.port());
    REQUIRE(gone.ok());
    REQUIRE(gone.Send(Get("/gone")));
    std::this_thread::sleep_for(20ms);  // queued behind /a
    gone.Reset();
  }
  std::this_thread::sleep_for(50ms);  // the loop sees the reset
  gate.Open();
  REQUIRE(running.Read());
  // A later request proves the worker is past the queued one.
  Client later(s.port());
  REQUIRE(later.ok());
  REQUIRE(later.Send(Get("/later")));
  std::optional<Reply> r = later.Read();
  REQUIRE(r);
  CHECK(r->body == "passed /later");
  CHECK(gate.started.load() == 2);  // /a and /later: /gone never ran
}

TEST_CASE("a connection past max_connections gets 503 and is closed") {
  EventServerOptions o = TestOptions();
  o.max_connections = 2;
  Running s(EchoCallbacks(), o);
  Client a(s.port()), b(s.port());
  REQUIRE((a.ok() && b.ok()));
  for (Client* c : {&a, &b}) {  // both accepted and served
    REQUIRE(c->Send(Get("/x")));
    REQUIRE(c->Read());
  }
  Client c(s.port());
  REQUIRE(c.ok());
  std::optional<Reply> r = c.Read();
  REQUIRE(r);
  CHECK(r->status == 503);
  CHECK(r->Header("Retry-After") == "1");
  CHECK(r->Header("Date").ends_with(" GMT"));  // every answer carries Date (RFC 9110 6.6.1)
  CHECK(c.Closed(/*reset_ok=*/true));
  CHECK(s.server().stats().shed_connections == 1);
  // Once one closes there is room again.
  a.Reset();
  std::this_thread::sleep_for(50ms);
  Client d(s.port());
  REQUIRE(d.ok());
  REQUIRE(d.Send(Get("/y")));
  std::optional<Reply> ok = d.Read();
  REQUIRE(ok);
  CHECK(ok->status == 200);
}

// Sends 4 MiB of empty lines, far past head + body limits (4 KiB + 1 KiB
// here), or until the server closes. False if it closed before 64 KiB.
bool SendBlankLines(Client& c) {
  std::string crlf;
  for (int i = 0; i < (32 << 10); ++i) crlf += "\r\n";
  for (int i = 0; i < 64; ++i) {
    if (!c.Send(crlf)) return i > 0;
  }
  return true;
}

// Starts a request's head, then sends a byte every 200 ms for up to 5 s
// while waiting for the answer.
std::optional<Reply> TrickleUntilAnswered(Client& c) {
  if (!c.Send("GET /slow HTTP/1.1\r\nHost: test\r\nX-Pad: ")) return std::nullopt;
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  std::thread trickle([&] {
    while (std::chrono::steady_clock::now() < deadline) {
      if (!c.Send("a")) return;  // closed by the server
      std::this_thread::sleep_for(200ms);
    }
  });
  std::optional<Reply> r = c.Read();
  trickle.join();
  return r;
}

TEST_CASE("endless blank lines on one connection are refused, not buffered") {
  Running s(EchoCallbacks());
  Client c(s.port());
  REQUIRE(c.ok());
  // The server stops buffering, answers 400, and drops the rest it reads.
  REQUIRE(SendBlankLines(c));
  std::optional<Reply> r = c.Read();
  REQUIRE(r);
  CHECK(r->status == 400);
}

TEST_CASE("a request trickling in byte by byte gets 408 once request_timeout_s has passed") {
  EventServerOptions o = TestOptions();
  o.request_timeout_s = 1;
  Running s(EchoCallbacks(), o);
  Client c(s.port());
  REQUIRE(c.ok());
  std::optional<Reply> r = TrickleUntilAnswered(c);
  REQUIRE(r);
  CHECK(r->status == 408);
}

TEST_CASE("a request that stalls halfway gets 408, not a silent close, when both timeouts agree") {
  // The daemon's own settings: idle and request timeouts alike. A stalled
  // request is idle too; the 408 must win, or the client never hears why.
  EventServerOptions o = TestOptions();
  o.request_timeout_s = 1;
  o.idle_timeout_s = 1;
  Running s(EchoCallbacks(), o);
  for (const std::string& part : {std::string("GET /x HTTP/1.1\r\nHost: a\r\n"),
                                  std::string("POST /x HTTP/1.1\r\nHost: a\r\n"
                                              "Content-Length: 10\r\n\r\n12345")}) {
    CAPTURE(part);
    Client c(s.port());
    REQUIRE(c.ok());
    REQUIRE(c.Send(part));
    std::optional<Reply> r = c.Read();  // nothing more is sent
    REQUIRE(r);
    CHECK(r->status == 408);
  }
}

TEST_CASE("a client on the Unix socket is held to the same limits as one on the TCP port") {
  SocketDir dir;
  const std::string path = dir.path + "/idem.sock";
  EventServerOptions o = UnixOptions(path);
  o.max_connections = 3;
  o.request_timeout_s = 1;
  Running s(EchoCallbacks(), o);
  // max_connections counts both listeners' connections together.
  Client tcp(s.port()), trickling(path), flooding(path);
  REQUIRE((tcp.ok() && trickling.ok() && flooding.ok()));
  CHECK(Echoes(tcp, "/tcp"));
  Client shed(path);
  REQUIRE(shed.ok());
  std::optional<Reply> refused = shed.Read();
  REQUIRE(refused);
  CHECK(refused->status == 503);
  CHECK(shed.Closed(/*reset_ok=*/true));
  // Endless blank lines: refused, not buffered.
  REQUIRE(SendBlankLines(flooding));
  std::optional<Reply> flooded = flooding.Read();
  REQUIRE(flooded);
  CHECK(flooded->status == 400);
  // A request trickling in byte by byte: 408 once request_timeout_s passed.
  std::optional<Reply> slow = TrickleUntilAnswered(trickling);
  REQUIRE(slow);
  CHECK(slow->status == 408);
  CHECK(s.server().stats().shed_connections == 1);
}

TEST_CASE("Drain answers queued requests 503, lets the running one finish, and refuses new ones") {
  Gate gate;
  Running s(gate.Callbacks(), OneWorker(/*max_queue=*/8));
  Client running(s.port()), queued(s.port()), idle(s.port());
  REQUIRE((running.ok() && queued.ok() && idle.ok()));
  REQUIRE(idle.Send(Get("/warm")));  // accepted before the drain begins
  REQUIRE(gate.WaitStarted(1));
  gate.Open();
  REQUIRE(idle.Read());
  {
    std::lock_guard<std::mutex> lock(gate.mu);
    gate.open = false;
  }
  REQUIRE(running.Send(Get("/a")));
  REQUIRE(gate.WaitStarted(2));
  REQUIRE(queued.Send(Get("/b")));
  std::this_thread::sleep_for(20ms);
  std::thread opener([&] {
    std::this_thread::sleep_for(100ms);
    gate.Open();
  });
  bool idle_at_end = s.server().Drain(/*timeout_ms=*/2000);
  opener.join();
  CHECK(idle_at_end);
  std::optional<Reply> b = queued.Read();
  REQUIRE(b);
  CHECK(b->status == 503);
  std::optional<Reply> a = running.Read();
  REQUIRE(a);
  CHECK(a->body == "passed /a");  // the running handler's answer still goes out
  REQUIRE(idle.Send(Get("/late")));
  std::optional<Reply> late = idle.Read();
  REQUIRE(late);
  CHECK(late->status == 503);
  CHECK(gate.started.load() == 2);
  s.server().Stop();
}

TEST_CASE("once Drain begins a new connection is refused at once, on TCP and the Unix socket") {
  SocketDir dir;
  const std::string path = dir.path + "/idem.sock";
  Gate gate;
  EventServerOptions o = UnixOptions(path);
  o.workers = 1;
  Running s(gate.Callbacks(), o);
  Client running(s.port());
  REQUIRE(running.ok());
  REQUIRE(running.Send(Get("/a")));
  REQUIRE(gate.WaitStarted(1));  // a handler runs, so the drain lasts
  std::thread drainer([&] { s.server().Drain(/*timeout_ms=*/3000); });
  // Not left waiting in a backlog until the process ends: refused.
  auto refused = [](auto make) {
    for (int i = 0; i < 200; ++i) {
      auto c = make();
      if (!c->ok()) return c->connect_errno();
      std::this_thread::sleep_for(5ms);  // the drain has not begun yet
    }
    return 0;
  };
  CHECK(refused([&] { return std::make_unique<Client>(s.port()); }) == ECONNREFUSED);
  const int unix_errno = refused([&] { return std::make_unique<Client>(path); });
  CHECK((unix_errno == ENOENT || unix_errno == ECONNREFUSED));
  CHECK_FALSE(std::filesystem::exists(path));
  gate.Open();
  std::optional<Reply> a = running.Read();
  REQUIRE(a);
  CHECK(a->body == "passed /a");  // the running handler's answer still goes out
  drainer.join();
  s.server().Stop();
}

TEST_CASE("Stop waits for a handler already running") {
  std::atomic<bool> started{false}, finished{false};
  EventServer::Callbacks cb = EchoCallbacks();
  cb.handler = [&](const http1::Request&, http1::Response& res) {
    started.store(true);
    std::this_thread::sleep_for(50ms);
    finished.store(true);
    res.SetContent("late", "text/plain");
  };
  Running s(std::move(cb));
  Client c(s.port());
  REQUIRE(c.ok());
  REQUIRE(c.Send(Get("/block")));
  auto deadline = std::chrono::steady_clock::now() + 2s;
  while (!started.load() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
  }
  REQUIRE(started.load());
  s.server().Stop();
  CHECK(finished.load());
  CHECK_FALSE(c.Read());  // the answer is dropped; the connection is closed
}

TEST_CASE("Stop settles a lane batch in flight") {
  TestLane lane;
  auto s = std::make_unique<Running>(EchoCallbacks(&lane));
  Client c(s->port());
  REQUIRE(c.ok());
  REQUIRE(c.Send(Post("/lane", "x")));
  auto deadline = std::chrono::steady_clock::now() + 2s;
  while (lane.begins() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  REQUIRE(lane.begins() == 1);
  s->server().Stop();
  CHECK(lane.finishes() == 1);
  CHECK(lane.violations() == 0);
  s.reset();
}

}  // namespace
}  // namespace idem

// ------------------------------------------------------------ long polls

namespace idem {
namespace {

using testing::EchoHandler;

// Parks every request to /park (its Resume kept for the test), echoes the
// rest.
struct Parker {
  std::mutex mu;
  std::vector<Deferral::Resume> resumes;
  bool throw_after_park = false;

  EventServer::Callbacks Callbacks() {
    EventServer::Callbacks cb = EchoCallbacks();
    cb.deferring_handler = [this](const http1::Request& req, http1::Response& res,
                                  Deferral& deferral) {
      if (req.path != "/park") return EchoHandler(req, res);
      Deferral::Resume resume = deferral.Park();
      std::lock_guard<std::mutex> lock(mu);
      resumes.push_back(std::move(resume));
      if (throw_after_park) throw std::runtime_error("after parking");
    };
    return cb;
  }
  bool WaitParked(size_t n) {
    auto deadline = std::chrono::steady_clock::now() + 2s;
    while (std::chrono::steady_clock::now() < deadline) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (resumes.size() >= n) return true;
      }
      std::this_thread::sleep_for(1ms);
    }
    return false;
  }
  void Resume(size_t i, const std::string& text) {
    Deferral::Resume r;
    {
      std::lock_guard<std::mutex> lock(mu);
      r = resumes.at(i);
    }
    r([text](http1::Response& res) {
      res.status = 200;
      res.SetContent(text, "text/plain");
    });
  }
};

TEST_CASE("a request answered on its loop cannot park: it gets a 500 and the connection goes on") {
  Parker parker;
  EventServer::Callbacks cb = parker.Callbacks();
  cb.on_loop = [](const http1::Request&) { return true; };
  Running s(std::move(cb), OneWorker(/*max_queue=*/4));
  Client c(s.port());
  REQUIRE(c.ok());
  REQUIRE(c.Send(Get("/park")));
  auto parked = c.Read();
  REQUIRE(parked);
  CHECK(parked->status == 500);
  REQUIRE(c.Send(Get("/other")));
  auto other = c.Read();
  REQUIRE(other);
  CHECK(other->status == 200);
  CHECK(other->body == "GET /other ");
}

TEST_CASE("a parked request frees its worker and is answered when resumed") {
  Parker parker;
  Running s(parker.Callbacks(), OneWorker(/*max_queue=*/4));
  Client a(s.port()), b(s.port()), c(s.port());
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(c.ok());
  REQUIRE(a.Send(Get("/park")));
  // a parks first (so it is parked request 0): the two connections race
  // otherwise. b then needs the only worker, which a's parking gave back.
  REQUIRE(parker.WaitParked(1));
  REQUIRE(b.Send(Get("/park")));
  REQUIRE(parker.WaitParked(2));
  // Both are parked and the only worker is free: another request is served.
  REQUIRE(c.Send(Get("/other")));
  auto other = c.Read();
  REQUIRE(other);
  CHECK(other->status == 200);
  CHECK(other->body == "GET /other ");
  parker.Resume(1, "second");
  parker.Resume(0, "first");
  parker.Resume(0, "again");  // only the first resume counts
  auto first = a.Read();
  auto second = b.Read();
  REQUIRE(first);
  REQUIRE(second);
  CHECK(first->body == "first");
  CHECK(second->body == "second");
  // The connection goes on after a parked answer.
  REQUIRE(a.Send(Get("/after")));
  auto after = a.Read();
  REQUIRE(after);
  CHECK(after->body == "GET /after ");
}

TEST_CASE("a parked request gets 503 when the server drains, and a later resume is ignored") {
  Parker parker;
  Running s(parker.Callbacks());
  Client a(s.port());
  REQUIRE(a.ok());
  REQUIRE(a.Send(Get("/park")));
  REQUIRE(parker.WaitParked(1));
  CHECK(s.server().Drain(/*timeout_ms=*/1000));
  auto got = a.Read();
  REQUIRE(got);
  CHECK(got->status == 503);
  CHECK(got->Header("Retry-After") == "1");
  parker.Resume(0, "too late");  // answered already: nothing happens
  s.server().Stop();
  parker.Resume(0, "after stop");  // the Resume outlives the server harmlessly
}

TEST_CASE("a handler that throws after parking gets its 500") {
  Parker parker;
  parker.throw_after_park = true;
  Running s(parker.Callbacks());
  Client a(s.port());
  REQUIRE(a.ok());
  REQUIRE(a.Send(Get("/park")));
  auto got = a.Read();
  REQUIRE(got);
  CHECK(got->status == 500);
  parker.Resume(0, "ignored");  // the 500 took the entry
}

}  // namespace
}  // namespace idem
