// EventServer: the daemon's HTTP/1.1 listener. A few epoll loops own the
// connections (read, parse with http1.h, write); a pool of worker threads
// runs the handlers, which may block (a provider call takes seconds).
//
// A "batch lane" lets requests that only need a durable store write skip the
// worker hand-off. Each is prepared (parsed, validated) by the loop as it
// arrives; every prepared request of a round is then handed to the lane's
// Begin at once (one group commit, one fsync), and the loop goes on serving
// other connections while that write is in flight. When it is durable the
// lane's Finish fills the answers. Requests arriving meanwhile are prepared
// and begun as the next batch, which may join the same group commit; a few
// batches per loop may be in flight at once.
//
// Promises:
//   - one request at a time per connection: a pipelined request is read
//     only after the answer to the previous one is queued, so answers keep
//     the order of requests (RFC 9112 9.3.2);
//   - every answer written for a request carries Date (RFC 9110 6.6.1);
//   - the answer to a HEAD request is written without its body, whichever
//     path answers it (handler, lane, loop, refusal), so the connection can
//     go on (RFC 9110 9.3.2; the handler sees the request as it came);
//   - framing errors (http1.h) are answered with their status and a problem
//     body, then the connection is closed;
//   - `Expect: 100-continue` gets its interim answer unless the head is
//     already refused (then the final error is sent instead);
//   - a connection idle (or stuck mid-request) for longer than
//     idle_timeout_s is closed; a request not whole within
//     request_timeout_s of its first byte gets 408 and the connection
//     closes (slowloris);
//   - input is bounded in every state: while a request is read, to the head
//     and body limits plus one read (past it: 400 and close); while a
//     request runs, reading stops past that bound; once the last answer is
//     queued, input is dropped;
//   - each accepted connection is served by the loop with the fewest
//     connections, whichever loop accepted it (a client opening many at
//     once has them spread over every loop);
//   - at most max_connections connections (past it: 503 and close), at
//     most max_queue requests waiting for a worker (past it: 503 with
//     Retry-After); a queued request whose client reset the connection is
//     never started;
//   - when accept() fails for lack of descriptors (EMFILE, ENFILE) the
//     loops stop watching the listening sockets for 100 ms instead of
//     spinning on them; the connection waits in the backlog;
//   - with options.unix_socket, connections accepted on that Unix-domain
//     socket are served exactly as TCP ones (same loops, limits and lane);
//   - a request Callbacks::on_loop accepts is answered by its loop at once,
//     however busy the workers are;
//   - a handler may park its request (Deferral) instead of holding its
//     worker while it waits for an event (a long poll): the worker goes
//     back to the pool, the connection stays busy (it reads no further
//     request, and is not timed out as idle), and the answer is built on a
//     worker when the handler's Resume is called;
//   - Drain(timeout) stops listening (a new connection is refused at once,
//     TCP and Unix socket, whose file it removes), answers queued and parked
//     requests and new ones on open connections 503 (Retry-After, then
//     close), and waits up to
//     `timeout` for the handlers already running, whose answers still go
//     out; Stop() then closes every connection, and returns after handlers
//     still running have finished (their answers are dropped).
//
// Thread-safety: Start/Stop from one thread. Handler and batch handler run
// concurrently on many threads and must be thread-safe.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "daemon/core/status.h"
#include "daemon/http/http1.h"

namespace idem {

struct EventServerOptions {
  int loops = 2;     // epoll threads
  int workers = 64;  // handler threads
  // Requests waiting for a worker; past it a request is answered 503 with
  // Retry-After at once instead of queueing without bound.
  int max_queue = 1024;
  // Open connections; past it a new connection gets a 503 with Retry-After
  // and is closed.
  int max_connections = 4096;
  http1::Limits limits;
  int idle_timeout_s = 30;
  // A request must arrive whole within this long of its first byte, or it
  // is answered 408 and the connection closed (a peer trickling bytes keeps
  // the connection active but gets no further).
  int request_timeout_s = 30;
  int listen_backlog = 4096;
  // Besides host:port, a Unix-domain socket at this path (empty: none),
  // with these permission bits. Start replaces a socket file no process
  // serves (a daemon killed before it could remove it), and refuses a live
  // one or any other kind of file; Stop removes the socket it made.
  std::string unix_socket;
  int unix_socket_mode = 0600;
};

// Counters of what the server refused (for metrics).
struct EventServerStats {
  uint64_t shed_connections = 0;  // over max_connections
  uint64_t queue_full = 0;        // requests refused: the handler queue was full
  uint64_t accept_pauses = 0;     // times accepting paused: no file descriptors left
  int open_connections = 0;
};

struct Exchange {
  http1::Request request;
  http1::Response response;
  bool answered = false;        // the response is final (e.g. Prepare refused it)
  std::shared_ptr<void> state;  // the batch lane's own data for this request
};

// The batch lane's contract. Every method runs on an event-loop thread.
class BatchLane {
 public:
  // A batch between Begin and Finish.
  class Ticket {
   public:
    virtual ~Ticket() = default;
    virtual bool Ready() const = 0;  // Finish will not block
  };

  virtual ~BatchLane() = default;
  // Does this request take the lane?
  virtual bool Wants(const http1::Request& req) const = 0;
  // On arrival: validate and keep what Begin needs in `ex.state`, or answer
  // (ex.answered) at once.
  virtual void Prepare(Exchange& ex) = 0;
  // Starts the durable step for the unanswered exchanges; `wake` may be
  // called from any thread when the ticket becomes Ready. `others_pending`:
  // this loop has other batches in flight, so Begin must not wait for
  // anything they might hold (it may leave such requests for later).
  virtual std::unique_ptr<Ticket> Begin(std::span<Exchange*> batch, std::function<void()> wake,
                                        bool others_pending) = 0;
  // Fills the answers of the batch Begin was given (answered = true). An
  // exchange left unanswered is begun again in a later batch.
  virtual void Finish(std::unique_ptr<Ticket> ticket, std::span<Exchange*> batch) = 0;
};

// Lets a handler answer later without holding its worker (a long poll).
class Deferral {
 public:
  // Fills the answer; runs on a worker thread.
  using Answer = std::function<void(http1::Response&)>;
  // Sends the answer: runs `answer` on a worker (when every worker is busy
  // and the queue is full, the request gets 503 with Retry-After instead)
  // and writes what it filled. Callable from any thread; only the first
  // call counts. After Drain (the request was answered 503 then) or Stop it
  // does nothing, so it may outlive the server.
  using Resume = std::function<void(Answer)>;

  virtual ~Deferral() = default;
  // At most once, by the handler on its worker thread: whatever the handler
  // leaves in its response is dropped, the worker goes back to the pool when
  // the handler returns, and the request waits for Resume. Whoever holds
  // Resume must call it (at a deadline at the latest): until then the
  // connection stays busy.
  virtual Resume Park() = 0;
};

class EventServer {
 public:
  // Runs on a worker thread; fills the response.
  using Handler = std::function<void(const http1::Request&, http1::Response&)>;
  // The same, able to park the request (used instead of Handler when set).
  using DeferringHandler = std::function<void(const http1::Request&, http1::Response&, Deferral&)>;
  // Builds the answer to a framing error or a refusal (status from
  // http1.h); `field` names the header at fault ("header:Host"), if one is;
  // `request` is the request refused when it was read whole (a full queue,
  // a drain), else null.
  using ErrorHandler =
      std::function<void(int status, const std::string& message, std::string_view field,
                         http1::Response&, const http1::Request* request)>;

  // What the server refused, for metrics (called on a loop thread).
  enum class Refusal { kConnectionShed, kQueueFull, kAcceptPaused };

  struct Callbacks {
    Handler handler;
    DeferringHandler deferring_handler;  // optional; replaces handler
    BatchLane* batch_lane = nullptr;     // optional; must outlive the server
    ErrorHandler error_handler;
    std::function<void(Refusal)> on_refusal;  // optional
    // Optional: the requests it accepts run their handler on the loop thread
    // itself, never queued, so never refused for a full queue. Only for
    // handlers that neither block nor park (a liveness probe); one that
    // tries to park gets a 500.
    std::function<bool(const http1::Request&)> on_loop;
  };

  EventServer(EventServerOptions options, Callbacks callbacks);
  ~EventServer();
  EventServer(const EventServer&) = delete;
  EventServer& operator=(const EventServer&) = delete;

  // Binds host:port (0: any free port) and options.unix_socket, starts the
  // loops and workers, and returns the bound port. Unavailable when an
  // address cannot be bound; FailedPrecondition when the Unix socket's path
  // is taken (see EventServerOptions::unix_socket).
  StatusOr<int> Start(const std::string& host, int port);
  // See the promises above. True if no handler was running at the end.
  bool Drain(int64_t timeout_ms);
  void Stop();

  struct UnixSocket {
    int fd = -1;
    std::string path;
    dev_t dev = 0;  // the socket file's identity, so that Stop removes only its own
    ino_t ino = 0;
  };
  EventServerStats stats() const {
    return EventServerStats{shed_connections_.load(), queue_full_.load(), accept_pauses_.load(),
                            open_conns_.load()};
  }

 private:
  class Loop;
  class WorkerPool;
  struct Parking;
  class WorkerDeferral;

  // Removes the Unix socket's file if it is still the one this server bound.
  void UnlinkOwnSocket();
  // Deferral::Resume's work: the parked request `token` answered by
  // `answer` on a worker (or refused when no worker can take it).
  static void ResumeParked(const std::shared_ptr<Parking>& parking, uint64_t token,
                           Deferral::Answer answer);

  // The loop serving the fewest connections (each accepted connection
  // goes to it, whichever loop accepted it).
  Loop& LeastLoaded() const;

  void Refused(Refusal r) const {
    if (callbacks_.on_refusal) callbacks_.on_refusal(r);
  }

  EventServerOptions options_;
  Callbacks callbacks_;
  int listen_fd_ = -1;
  UnixSocket unix_socket_;  // fd -1: none
  std::unique_ptr<WorkerPool> workers_;
  std::shared_ptr<Parking> parking_;  // parked requests; shared with their Resumes
  std::vector<std::unique_ptr<Loop>> loops_;
  std::vector<std::thread> threads_;
  std::atomic<bool> running_{false};
  std::atomic<bool> draining_{false};
  std::atomic<int> open_conns_{0};
  std::atomic<uint64_t> shed_connections_{0};
  std::atomic<uint64_t> queue_full_{0};
  std::atomic<uint64_t> accept_pauses_{0};
};

}  // namespace idem
