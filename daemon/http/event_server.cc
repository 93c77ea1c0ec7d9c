#include "daemon/http/event_server.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include "daemon/core/env.h"

namespace idem {
namespace {

constexpr uint64_t kListenTag = 0;  // the TCP listening socket
constexpr uint64_t kWakeTag = 1;
constexpr uint64_t kUnixListenTag = 2;  // the Unix-domain one (server.unix_socket)
constexpr uint64_t kFirstConnId = 3;
constexpr size_t kReadChunk = 64 << 10;
constexpr int kMaxEvents = 256;
constexpr int64_t kDrainSeconds = 2;  // how long a refused peer may go on sending

constexpr int64_t kAcceptPauseMs = 100;  // after EMFILE/ENFILE

int64_t NowSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t NowMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A handler that throws must not take the daemon down: the request gets a
// bare 500 (handlers turn their own errors into problem bodies).
// False when it threw.
template <typename F>
bool RunGuarded(http1::Response& res, F&& f) {
  try {
    f();
    return true;
  } catch (const std::exception&) {
    res = http1::Response();
    res.status = 500;
    res.SetContent(R"({"type":"about:blank","title":"Internal Server Error","status":500})",
                   "application/problem+json");
    return false;
  }
}

// The deferral of a request answered on its loop (Callbacks::on_loop),
// which has no worker to give back: parking is a bug, answered 500.
class NoPark : public Deferral {
 public:
  Resume Park() override {
    throw std::logic_error("a request answered on its event loop cannot park");
  }
};

}  // namespace

// ------------------------------------------------------------------ workers

// Idle workers form a stack: a task goes to the one that went idle last, so
// under light load a few warm threads (caches, malloc's per-thread cache)
// do the work instead of every thread in turn. Threads start as they are
// needed, up to `threads`: a task that finds none idle starts one unless
// enough are starting already. An idle daemon holds kInitialWorkers, not
// sixty-four stacks (about 18 KB of RSS each, measured).
class EventServer::WorkerPool {
 public:
  struct Task {
    Loop* loop;
    uint64_t conn_id;
    http1::Request request;
    // Set by the loop when the client hangs up while the task waits or
    // runs: a task whose client has gone is not started.
    std::shared_ptr<std::atomic<bool>> gone;
    // Set: a parked request resumed; this builds its answer (the handler
    // is not run again).
    Deferral::Answer resume = {};
  };

  static constexpr int kInitialWorkers = 2;

  WorkerPool(int threads, size_t max_queue, const Callbacks& callbacks,
             std::shared_ptr<Parking> parking)
      : callbacks_(callbacks),
        parking_(std::move(parking)),
        max_queue_(max_queue),
        max_threads_(std::max(1, threads)) {
    std::lock_guard<std::mutex> lock(mu_);
    for (int i = 0; i < std::min(kInitialWorkers, max_threads_); ++i) StartWorker();
  }
  ~WorkerPool() { Stop(); }

  // False (the task is not taken) when every worker is busy, no more may
  // start, and max_queue tasks already wait; or when the pool is stopping.
  bool Submit(Task& task) {
    std::unique_lock<std::mutex> lock(mu_);
    if (stopping_ || rejecting_) return false;
    if (idle_.empty()) {
      // The queue is for tasks that wait for a busy worker; a task that a
      // worker yet to start (or starting) will take does not count in it.
      const int running_threads = static_cast<int>(threads_.size()) - starting_;
      const size_t unstarted = static_cast<size_t>(std::max(0, max_threads_ - running_threads));
      if (tasks_.size() >= max_queue_ + unstarted) return false;
      tasks_.push_back(std::move(task));
      // Each queued task has a thread on its way, up to the limit.
      if (static_cast<size_t>(starting_) < tasks_.size() &&
          static_cast<int>(threads_.size()) < max_threads_) {
        StartWorker();
      }
      return true;
    }
    Worker* w = idle_.back();
    idle_.pop_back();
    w->task = std::move(task);
    w->has_task = true;
    ++running_;
    lock.unlock();
    w->cv.notify_one();
    return true;
  }

  // From now on Submit refuses; the tasks waiting are taken out and
  // returned (their connections are answered 503 by the caller).
  std::deque<Task> RejectQueued() {
    std::lock_guard<std::mutex> lock(mu_);
    rejecting_ = true;
    std::deque<Task> out;
    out.swap(tasks_);
    return out;
  }

  // Waits until no handler runs, or until `deadline_ms` (steady clock).
  // True if none runs.
  bool WaitIdle(int64_t deadline_ms) {
    std::unique_lock<std::mutex> lock(mu_);
    while (running_ > 0 || !tasks_.empty()) {
      int64_t left = deadline_ms - NowMillis();
      if (left <= 0) return false;
      idle_cv_.wait_for(lock, std::chrono::milliseconds(left));
    }
    return true;
  }

  // Runs the tasks already queued, then joins. No thread starts once
  // stopping_ is set, so threads_ and workers_ no longer change.
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    for (auto& w : workers_) w->cv.notify_all();
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
    threads_.clear();
  }

 private:
  // Under mu_. A thread the system refuses (EAGAIN) is not started: the
  // task waits in the queue for a running one, as past the limit. Without
  // any thread the pool could serve nothing: the start fails instead.
  void StartWorker() {
    workers_.push_back(std::make_unique<Worker>());
    ++starting_;
    try {
      threads_.emplace_back([this, w = workers_.back().get()] {
        NameThread("handler");
        {
          std::lock_guard<std::mutex> lock(mu_);
          --starting_;
        }
        Run(*w);
      });
    } catch (const std::system_error&) {
      --starting_;
      workers_.pop_back();
      if (threads_.empty()) throw;
    }
  }

  struct Worker {
    std::condition_variable cv;
    bool has_task = false;
    Task task;
  };

  void Run(Worker& w);
  // The task's request through the handler; false when it was parked.
  bool Serve(Task& task, http1::Response& res);

  const Callbacks& callbacks_;
  const std::shared_ptr<Parking> parking_;
  const size_t max_queue_;
  const int max_threads_;
  std::mutex mu_;
  int starting_ = 0;  // started threads not yet in Run
  std::condition_variable idle_cv_;
  std::deque<Task> tasks_;     // waiting for a worker
  std::vector<Worker*> idle_;  // most recently idle last
  int running_ = 0;            // tasks handed to a worker and not yet answered
  bool stopping_ = false;
  bool rejecting_ = false;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<std::thread> threads_;
};

// Parked requests (Deferral), by token. Shared by the server, its workers
// and every Resume handed out, which may outlive the server.
struct EventServer::Parking {
  struct Entry {
    Loop* loop;
    uint64_t conn_id;
    bool keep_alive;
    int minor_version;
    std::shared_ptr<std::atomic<bool>> gone;
  };
  std::mutex mu;
  bool refusing = false;  // Drain: parked requests get 503, and so do new parks
  bool stopped = false;   // Stop: a Resume does nothing
  uint64_t next = 1;
  std::unordered_map<uint64_t, Entry> entries;
  WorkerPool* pool = nullptr;
};

class EventServer::WorkerDeferral : public Deferral {
 public:
  WorkerDeferral(std::shared_ptr<Parking> parking, const WorkerPool::Task& task)
      : parking_(std::move(parking)), task_(task) {}

  Resume Park() override {
    std::lock_guard<std::mutex> lock(parking_->mu);
    if (token_ == 0) {
      token_ = parking_->next++;
      parking_->entries.emplace(token_,
                                Parking::Entry{task_.loop, task_.conn_id, task_.request.keep_alive,
                                               task_.request.minor_version, task_.gone});
    }
    return [p = parking_, t = token_](Answer answer) { ResumeParked(p, t, std::move(answer)); };
  }
  uint64_t token() const { return token_; }

 private:
  std::shared_ptr<Parking> parking_;
  const WorkerPool::Task& task_;
  uint64_t token_ = 0;
};

// -------------------------------------------------------------------- loops

class EventServer::Loop {
 public:
  Loop(EventServer& server, int listen_fd, int unix_listen_fd)
      : server_(server), listen_fd_(listen_fd), unix_listen_fd_(unix_listen_fd) {
    max_buffered_ = http1::MaxRequestBytes(server_.options_.limits);
    ep_ = epoll_create1(EPOLL_CLOEXEC);
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kWakeTag;
    epoll_ctl(ep_, EPOLL_CTL_ADD, wake_fd_, &ev);
    // Every loop waits on the listening sockets; EPOLLEXCLUSIVE wakes one
    // of them per new connection instead of all.
    listening_ = Watch(true);
  }

  ~Loop() {
    for (auto& [id, conn] : conns_) {
      ::close(conn->fd);
      server_.open_conns_.fetch_sub(1, std::memory_order_acq_rel);
    }
    for (const Accepted& a : handed_) {
      ::close(a.fd);
      server_.open_conns_.fetch_sub(1, std::memory_order_acq_rel);
    }
    ::close(wake_fd_);
    ::close(ep_);
  }

  bool ok() const { return ep_ >= 0 && wake_fd_ >= 0; }

  // Connections owned by this loop or handed to it and not yet adopted.
  int load() const { return load_.load(std::memory_order_relaxed); }

  void Run() {
    epoll_event events[kMaxEvents];
    int64_t last_sweep = NowSeconds();
    while (server_.running_.load(std::memory_order_acquire)) {
      UpdateListening();
      int timeout_ms = 1000;
      if (accept_paused_until_ms_ != 0) {
        timeout_ms = static_cast<int>(
            std::clamp<int64_t>(accept_paused_until_ms_ - NowMillis(), 1, timeout_ms));
      }
      int n = epoll_wait(ep_, events, kMaxEvents, timeout_ms);
      for (int i = 0; i < n; ++i) {
        uint64_t tag = events[i].data.u64;
        if (tag == kListenTag) {
          Accept(listen_fd_, /*tcp=*/true);
        } else if (tag == kUnixListenTag) {
          Accept(unix_listen_fd_, /*tcp=*/false);
        } else if (tag == kWakeTag) {
          Drain();
        } else {
          OnEvent(tag, events[i].events);
        }
      }
      RunBatches();
      int64_t now = NowSeconds();
      if (now != last_sweep) {
        last_sweep = now;
        SweepIdle(now);
      }
    }
    // Answers that came back while stopping still go out (best effort).
    Drain();
    // The batch in flight holds store locks taken on this thread: settle it
    // here, not in the destructor.
    for (Inflight& b : inflight_) FinishBatch(b);
    inflight_.clear();
  }

  void Wake() {
    uint64_t one = 1;
    ssize_t w = ::write(wake_fd_, &one, sizeof(one));
    (void)w;  // a full counter already means "wake up"
  }

  // A task refused when the server began to drain: 503, then close (or,
  // with keep_alive, a 503 for `why` on a connection that goes on).
  void Reject(uint64_t id, int minor_version, const char* why = "the server is shutting down",
              bool keep_alive = false, const http1::Request* request = nullptr) {
    http1::Response res;
    res.status = 503;
    server_.callbacks_.error_handler(503, why, {}, res, request);
    res.SetHeader("Retry-After", "1");
    Complete(id, std::move(res), keep_alive, minor_version);
  }

  // From Drain once its timeout passed: every connection still waiting for
  // a handler gets 503 now and is closed; the handler's answer, if it ever
  // comes, is dropped (Finish).
  void AbandonBusy() {
    abandon_busy_.store(true, std::memory_order_release);
    Wake();
  }

  // From a worker: the answer for connection `id`.
  void Complete(uint64_t id, http1::Response response, bool keep_alive, int minor_version) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_.push_back(Done{id, std::move(response), keep_alive, minor_version});
    }
    Wake();
  }

 private:
  // kClosing: the last answer is being written. kDraining: it is written
  // and our side is shut; what the peer still sends (e.g. the rest of a body
  // refused with 413) is read and dropped until it closes, so that closing
  // with unread input does not reset the connection before the peer has
  // read the answer.
  enum class State { kReading, kBusy, kClosing, kDraining };

  struct Conn {
    int fd = -1;
    uint64_t id = 0;
    std::string in;
    std::string out;
    size_t out_sent = 0;
    State state = State::kReading;
    bool continue_sent = false;
    bool want_write = false;  // EPOLLOUT registered
    bool reading = true;      // EPOLLIN registered
    bool peer_gone = false;   // closed or failed while busy
    bool read_eof = false;    // the peer sends nothing more
    int64_t last_active = 0;
    std::shared_ptr<std::atomic<bool>> gone;  // shared with its worker task
    // The request a worker runs, without its body: what its access line
    // names should the stop answer it (AbandonBusy).
    std::unique_ptr<http1::Request> busy_request;
    int64_t request_started = 0;     // when the request being read began (seconds)
    bool overflow = false;           // read more than any acceptable request
    size_t parse_need = 0;           // do not parse again before `in` holds this much
    http1::ChunkedProgress chunked;  // a chunked body's whole chunks so far
    size_t head_scanned = 0;         // of the head being read (http1::ParseResult)
    // The request being answered is a HEAD: its answer goes without a body,
    // whichever path writes it (worker, batch lane, loop, refusal).
    bool head_request = false;
    bool local_socket = false;  // accepted on the Unix socket
  };

  // A connection just accepted, on its way to the loop that serves it.
  struct Accepted {
    int fd;
    bool local_socket;
  };

  struct Done {
    uint64_t id;
    http1::Response response;
    bool keep_alive;
    int minor_version;
  };

  struct Pending {
    uint64_t id;
    bool keep_alive;
    int minor_version;
    std::unique_ptr<Exchange> exchange;
  };

  // Watches the listening socket unless accepting is paused (descriptors
  // ran out) or the server drains.
  void UpdateListening() {
    bool want = !server_.draining_.load(std::memory_order_acquire);
    if (accept_paused_until_ms_ != 0) {
      if (NowMillis() < accept_paused_until_ms_) {
        want = false;
      } else {
        accept_paused_until_ms_ = 0;
      }
    }
    if (want == listening_) return;
    Watch(want);
    listening_ = want;
  }

  // Adds the listening sockets to ep_ (or removes them); true if every one
  // was added.
  bool Watch(bool on) {
    bool ok = true;
    const std::pair<int, uint64_t> sockets[] = {{listen_fd_, kListenTag},
                                                {unix_listen_fd_, kUnixListenTag}};
    for (auto [fd, tag] : sockets) {
      if (fd < 0) continue;
      if (on) {
        epoll_event ev{};
        ev.events = EPOLLIN | EPOLLEXCLUSIVE;
        ev.data.u64 = tag;
        ok = epoll_ctl(ep_, EPOLL_CTL_ADD, fd, &ev) == 0 && ok;
      } else {
        epoll_ctl(ep_, EPOLL_CTL_DEL, fd, nullptr);
      }
    }
    return ok;
  }

  // Takes the connections waiting on `listen_fd` (TCP, or the Unix socket).
  void Accept(int listen_fd, bool tcp) {
    for (;;) {
      int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          // The pending connection keeps the socket readable: watching it
          // now would spin. Stop watching for a while; the connection waits
          // in the backlog until a descriptor frees.
          accept_paused_until_ms_ = NowMillis() + kAcceptPauseMs;
          UpdateListening();
          server_.accept_pauses_.fetch_add(1, std::memory_order_relaxed);
          server_.Refused(Refusal::kAcceptPaused);
        }
        return;  // EAGAIN (another loop took it), or a transient error
      }
      if (server_.open_conns_.fetch_add(1, std::memory_order_acq_rel) >=
          server_.options_.max_connections) {
        server_.open_conns_.fetch_sub(1, std::memory_order_acq_rel);
        Shed(fd);
        continue;
      }
      if (tcp) {
        int one = 1;
        // Small answers must leave at once, not wait for Nagle and delayed ACKs.
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      }
      // The loop that wakes takes every connection waiting in the backlog:
      // a client opening 64 at once would otherwise have them all served by
      // one loop while the others idle. Each goes to the loop with the
      // fewest connections instead.
      Loop& to = server_.LeastLoaded();
      to.load_.fetch_add(1, std::memory_order_relaxed);
      const Accepted accepted{fd, /*local_socket=*/!tcp};
      if (&to == this) {
        Adopt(accepted);
      } else {
        to.HandOver(accepted);
      }
    }
  }

  // From another loop's Accept: `fd` is this loop's to serve.
  void HandOver(Accepted a) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      handed_.push_back(a);
    }
    Wake();
  }

  // Serves an accepted connection from now on (counted in load_ already).
  void Adopt(Accepted a) {
    const int fd = a.fd;
    auto conn = std::make_unique<Conn>();
    conn->fd = fd;
    conn->local_socket = a.local_socket;
    conn->id = next_id_++;
    conn->last_active = NowSeconds();
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = conn->id;
    if (epoll_ctl(ep_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      ::close(fd);
      server_.open_conns_.fetch_sub(1, std::memory_order_acq_rel);
      load_.fetch_sub(1, std::memory_order_relaxed);
      return;
    }
    conns_.emplace(conn->id, std::move(conn));
  }

  // Over max_connections: a short 503 and close, so the client learns why
  // instead of waiting in the backlog.
  void Shed(int fd) {
    // Counted before the client can read the answer.
    server_.shed_connections_.fetch_add(1, std::memory_order_relaxed);
    server_.Refused(Refusal::kConnectionShed);
    http1::Response res;
    res.status = 503;
    server_.callbacks_.error_handler(503, "too many open connections", {}, res, nullptr);
    res.SetHeader("Retry-After", "1");
    std::string out;
    http1::SerializeResponse(res, /*keep_alive=*/false, 1, out, /*head_request=*/false, Date());
    ssize_t n = ::send(fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)n;  // best effort: the socket buffer of a new connection has room
    ::close(fd);
  }

  Conn* Find(uint64_t id) {
    auto it = conns_.find(id);
    return it == conns_.end() ? nullptr : it->second.get();
  }

  void Close(Conn* c) {
    if (!c->peer_gone) epoll_ctl(ep_, EPOLL_CTL_DEL, c->fd, nullptr);
    ::close(c->fd);
    conns_.erase(c->id);
    server_.open_conns_.fetch_sub(1, std::memory_order_acq_rel);
    load_.fetch_sub(1, std::memory_order_relaxed);
  }

  // The peer is gone while a handler still works for it: stop watching the
  // socket (a hang-up would be reported again and again) and close it when
  // the answer comes back.
  void Abandon(Conn* c) {
    c->peer_gone = true;
    if (c->gone) c->gone->store(true, std::memory_order_release);
    epoll_ctl(ep_, EPOLL_CTL_DEL, c->fd, nullptr);
  }

  void SetInterest(Conn* c, bool read, bool write) {
    if (c->reading == read && c->want_write == write) return;
    c->reading = read;
    c->want_write = write;
    epoll_event ev{};
    ev.events = (read ? EPOLLIN : 0u) | (write ? EPOLLOUT : 0u);
    ev.data.u64 = c->id;
    epoll_ctl(ep_, EPOLL_CTL_MOD, c->fd, &ev);
  }

  void OnEvent(uint64_t id, uint32_t events) {
    Conn* c = Find(id);
    if (c == nullptr) return;
    if ((events & (EPOLLHUP | EPOLLERR)) && c->state == State::kBusy) {
      // Gone for good (not a half-close): a hang-up is reported again and
      // again, so stop watching now; the answer will be dropped.
      Abandon(c);
      return;
    }
    if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
      if (!ReadAvailable(c)) return;  // closed
    }
    if (events & EPOLLOUT) {
      if (!Flush(c)) return;
    }
    if (c->state == State::kReading && c->out.empty()) Process(c);
  }

  // Reads what the socket has. False if the connection was closed here.
  bool ReadAvailable(Conn* c) {
    char buf[kReadChunk];
    for (;;) {
      ssize_t n = ::recv(c->fd, buf, sizeof(buf), 0);
      // Once the last answer is queued nothing more is parsed: drop input.
      if (n > 0 && (c->state == State::kDraining || c->state == State::kClosing)) continue;
      if (n > 0) {
        const int64_t now = NowSeconds();
        if (c->in.empty()) c->request_started = now;
        c->in.append(buf, static_cast<size_t>(n));
        c->last_active = now;
        if (c->state == State::kReading && c->in.size() > max_buffered_ + kReadChunk) {
          // More than any acceptable request (e.g. endless blank lines):
          // stop reading; Process refuses it.
          c->overflow = true;
          SetInterest(c, false, c->want_write);
          return true;
        }
        if (c->state == State::kBusy && c->in.size() > max_buffered_) {
          // A peer pipelining far ahead of its answers: stop reading until
          // the answer is out (Flush turns reading back on).
          SetInterest(c, false, c->want_write);
          return true;
        }
        if (static_cast<size_t>(n) < sizeof(buf)) return true;
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      if (n < 0 && errno == EINTR) continue;
      if (n == 0 && c->state != State::kDraining) {
        // End of input. The peer may only have shut its sending side (a
        // half-close): the requests it sent are still answered, then the
        // connection is closed (Process).
        c->read_eof = true;
        SetInterest(c, false, c->want_write);
        return true;
      }
      // An error, or the end of a drain.
      if (c->state == State::kBusy) {
        Abandon(c);
        return false;
      }
      Close(c);
      return false;
    }
  }

  // Parses and dispatches requests while the connection is idle; closes it
  // once the peer has ended its input and every answer is out.
  void Process(Conn* c) {
    const EventServerOptions& o = server_.options_;
    if (c->read_eof && c->state == State::kReading && c->out.empty()) {
      http1::Request probe;
      if (c->in.empty() ||
          http1::ParseRequest(c->in, o.limits, &probe).status == http1::ParseStatus::kNeedMore) {
        Close(c);  // nothing (complete) left to answer
        return;
      }
    }
    if (c->overflow && c->state == State::kReading && c->out.empty()) {
      // A whole request at the front is still served (and its own error,
      // such as 413 for a body over the limit, still wins).
      http1::Request probe;
      http1::ParseResult r = http1::ParseRequest(c->in, o.limits, &probe);
      if (r.status == http1::ParseStatus::kNeedMore) {
        RefuseAndClose(c, 400, "the request is larger than the head and body limits allow");
        return;
      }
      c->overflow = false;
    }
    while (c->state == State::kReading && c->out.empty() && !c->in.empty()) {
      // A body still arriving: not parsed again until it can be whole.
      if (c->in.size() < c->parse_need) return;
      auto exchange = std::make_unique<Exchange>();
      http1::ParseResult r =
          http1::ParseRequest(c->in, o.limits, &exchange->request, c->head_scanned, &c->chunked);
      if (r.status == http1::ParseStatus::kNeedMore) {
        c->parse_need = r.need;
        c->head_scanned = r.head_scanned;
        if (r.wants_continue && !c->continue_sent) {
          c->continue_sent = true;
          c->out = "HTTP/1.1 100 Continue\r\n\r\n";
          Flush(c);
        }
        return;
      }
      c->chunked.Reset();
      if (r.status == http1::ParseStatus::kError) {
        RefuseAndClose(c, r.error_status, r.error, r.error_field);
        return;
      }
      c->in.erase(0, r.consumed);
      exchange->request.local_socket = c->local_socket;
      c->parse_need = 0;
      c->head_scanned = 0;
      c->request_started = c->in.empty() ? 0 : NowSeconds();
      c->continue_sent = false;
      const http1::Request& req = exchange->request;
      bool keep_alive = req.keep_alive;
      int minor = req.minor_version;
      c->state = State::kBusy;
      c->head_request = req.method == "HEAD";
      if (server_.draining_.load(std::memory_order_acquire)) {
        Refuse(c, 503, "the server is shutting down", minor, &req);
        return;
      }
      BatchLane* lane = server_.callbacks_.batch_lane;
      if (lane != nullptr && lane->Wants(req)) {
        RunGuarded(exchange->response, [&] { lane->Prepare(*exchange); });
        if (!exchange->answered && exchange->state == nullptr) exchange->answered = true;  // threw
        if (exchange->answered) {
          c = AnswerHere(c, exchange->response, keep_alive, minor);
          if (c == nullptr) return;
          continue;
        }
        batch_.push_back(Pending{c->id, keep_alive, minor, std::move(exchange)});
        return;
      }
      if (server_.callbacks_.on_loop && server_.callbacks_.on_loop(req)) {
        http1::Response res;
        RunGuarded(res, [&] {
          const Callbacks& cb = server_.callbacks_;
          if (!cb.deferring_handler) return cb.handler(req, res);
          NoPark no_park;
          cb.deferring_handler(req, res, no_park);
        });
        c = AnswerHere(c, res, keep_alive, minor);
        if (c == nullptr) return;
        continue;
      }
      if (c->gone == nullptr) c->gone = std::make_shared<std::atomic<bool>>(false);
      if (c->busy_request == nullptr) c->busy_request = std::make_unique<http1::Request>();
      c->busy_request->method = req.method;
      c->busy_request->path = req.path;
      c->busy_request->headers.clear();
      if (std::string rid = req.HeaderValue("X-Request-Id"); !rid.empty()) {
        c->busy_request->headers.push_back({"X-Request-Id", std::move(rid)});
      }
      WorkerPool::Task task{this, c->id, std::move(exchange->request), c->gone};
      if (server_.workers_->Submit(task)) return;
      server_.queue_full_.fetch_add(1, std::memory_order_relaxed);
      server_.Refused(Refusal::kQueueFull);
      c = Refuse(c, 503, "every handler is busy and the queue is full", minor, &task.request);
      if (c == nullptr) return;
    }
  }

  // A 503 with Retry-After instead of running the request; the connection
  // stays open (unless draining) since the request was read in full.
  // Null when writing it closed the connection.
  Conn* Refuse(Conn* c, int status, const std::string& why, int minor,
               const http1::Request* request) {
    http1::Response res;
    res.status = status;
    server_.callbacks_.error_handler(status, why, {}, res, request);
    res.SetHeader("Retry-After", "1");
    const bool keep = !server_.draining_.load(std::memory_order_acquire);
    return AnswerHere(c, res, keep, minor);
  }

  // Queues an answer the loop gave itself (no worker ran the request); the
  // connection reads on. Null when writing it closed the connection.
  Conn* AnswerHere(Conn* c, const http1::Response& res, bool keep_alive, int minor) {
    const uint64_t id = c->id;
    c->state = State::kReading;
    Queue(c, res, keep_alive, minor);
    return Find(id);
  }

  // Serializes an answer into the connection's output and writes it.
  // One answer per request: a HEAD's answer is this one.
  void Queue(Conn* c, const http1::Response& res, bool keep_alive, int minor) {
    http1::SerializeResponse(res, keep_alive, minor, c->out, c->head_request, Date());
    c->head_request = false;
    if (!keep_alive) c->state = State::kClosing;
    Flush(c);
  }

  // The Date field of answers written now (RFC 9110 6.6.1: an origin
  // server with a clock sends it), formatted once a second per loop.
  std::string_view Date() {
    timespec now{};
    clock_gettime(CLOCK_REALTIME_COARSE, &now);
    if (now.tv_sec != date_second_) {
      date_second_ = now.tv_sec;
      date_ = http1::HttpDate(now.tv_sec);
    }
    return date_;
  }

  // Writes pending output. False if the connection was closed here.
  bool Flush(Conn* c) {
    while (c->out_sent < c->out.size()) {
      ssize_t n =
          ::send(c->fd, c->out.data() + c->out_sent, c->out.size() - c->out_sent, MSG_NOSIGNAL);
      if (n > 0) {
        c->out_sent += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        SetInterest(c, c->state != State::kBusy, true);
        return true;
      }
      if (c->state == State::kBusy) {
        Abandon(c);
        return false;
      }
      Close(c);
      return false;
    }
    c->out.clear();
    c->out_sent = 0;
    c->last_active = NowSeconds();
    if (c->state == State::kClosing) {
      ::shutdown(c->fd, SHUT_WR);
      c->state = State::kDraining;
      c->in.clear();
      SetInterest(c, true, false);
      return false;
    }
    SetInterest(c, c->state == State::kReading && !c->read_eof, false);
    return true;
  }

  // Answers from workers.
  void Drain() {
    uint64_t count;
    ssize_t r = ::read(wake_fd_, &count, sizeof(count));
    (void)r;
    std::vector<Done> done;
    std::vector<Accepted> handed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      done.swap(done_);
      handed.swap(handed_);
    }
    for (const Accepted& a : handed) Adopt(a);
    for (Done& d : done) Finish(d.id, d.response, d.keep_alive, d.minor_version);
    if (abandon_busy_.exchange(false, std::memory_order_acq_rel)) {
      std::vector<uint64_t> busy;
      for (const auto& [id, conn] : conns_) {
        if (conn->state == State::kBusy && !conn->peer_gone) busy.push_back(id);
      }
      for (uint64_t id : busy) {
        Conn* c = Find(id);
        http1::Response res;
        res.status = 503;
        server_.callbacks_.error_handler(
            503,
            "the server stopped before this request's handler finished (server.drain_timeout); "
            "whether it took effect is unknown: retry with the same Idempotency-Key after the "
            "restart",
            {}, res,
            c->busy_request != nullptr && !c->busy_request->method.empty() ? c->busy_request.get()
                                                                           : nullptr);
        res.SetHeader("Retry-After", "1");
        Queue(c, res, /*keep_alive=*/false, /*minor=*/1);
      }
    }
  }

  void Finish(uint64_t id, const http1::Response& res, bool keep_alive, int minor) {
    Conn* c = Find(id);
    if (c == nullptr) return;
    if (c->state != State::kBusy) return;  // answered already (AbandonBusy): dropped
    if (c->busy_request != nullptr) c->busy_request->method.clear();  // no worker runs it now
    if (c->peer_gone) {
      Close(c);
      return;
    }
    c->state = State::kReading;
    Queue(c, res, keep_alive, minor);
    c = Find(id);
    if (c != nullptr && c->state == State::kReading && c->out.empty()) Process(c);
  }

  // Answers the batches whose write is over, and begins one for the
  // prepared batch-lane requests (one durable write for all of them) while
  // fewer than kMaxInflight are in flight. Never blocks on a write.
  void RunBatches() {
    BatchLane* lane = server_.callbacks_.batch_lane;
    for (;;) {
      bool progress = false;
      for (size_t i = 0; i < inflight_.size();) {
        if (!inflight_[i].ticket->Ready()) {
          ++i;
          continue;
        }
        Inflight done = std::move(inflight_[i]);
        inflight_.erase(inflight_.begin() + static_cast<std::ptrdiff_t>(i));
        // A batch that answered something may have released the locks the
        // skipped requests wait for; with none in flight, the next batch
        // waits for its locks instead of skipping.
        if (FinishBatch(done) > 0 || inflight_.empty()) Requeue();
        progress = true;
      }
      if (!retry_.empty() && inflight_.empty()) {
        Requeue();
        progress = true;
      }
      if (!batch_.empty() && inflight_.size() < kMaxInflight) {
        Inflight next;
        next.round.swap(batch_);
        std::vector<Exchange*> exchanges = Exchanges(next.round);
        try {
          next.ticket = lane->Begin(
              exchanges, [this] { Wake(); }, !inflight_.empty());
          inflight_.push_back(std::move(next));
        } catch (const std::exception&) {
          for (Exchange* ex : exchanges) {
            RunGuarded(ex->response, [] { throw std::runtime_error("batch lane failed"); });
            ex->answered = true;
          }
          Answer(next.round);
        }
        progress = true;
      }
      if (!progress) return;
    }
  }

  struct Inflight {
    std::unique_ptr<BatchLane::Ticket> ticket;
    std::vector<Pending> round;
  };

  static std::vector<Exchange*> Exchanges(std::vector<Pending>& round) {
    std::vector<Exchange*> out;
    out.reserve(round.size());
    for (Pending& p : round) out.push_back(p.exchange.get());
    return out;
  }

  // The skipped requests join the next batch.
  void Requeue() {
    for (Pending& p : retry_) batch_.push_back(std::move(p));
    retry_.clear();
  }

  // Blocks if the write is still in flight. Returns how many requests it
  // answered.
  size_t FinishBatch(Inflight& b) {
    std::vector<Exchange*> exchanges = Exchanges(b.round);
    try {
      server_.callbacks_.batch_lane->Finish(std::move(b.ticket), exchanges);
    } catch (const std::exception&) {
      for (Exchange* ex : exchanges) {
        if (ex->answered) continue;
        RunGuarded(ex->response, [] { throw std::runtime_error("batch lane failed"); });
        ex->answered = true;
      }
    }
    return Answer(b.round);
  }

  // Writes the answers of a finished batch; unanswered requests (skipped:
  // their lock was busy) wait in retry_. Returns how many were answered.
  size_t Answer(std::vector<Pending>& round) {
    size_t answered = 0;
    for (Pending& p : round) {
      if (p.exchange->answered) {
        Finish(p.id, p.exchange->response, p.keep_alive, p.minor_version);
        ++answered;
      } else {
        retry_.push_back(std::move(p));
      }
    }
    return answered;
  }

  // A refused request: its answer, then the connection closes.
  void RefuseAndClose(Conn* c, int status, const std::string& why, std::string_view field = {}) {
    http1::Response res;
    res.status = status;
    server_.callbacks_.error_handler(status, why, field, res, nullptr);
    c->in.clear();
    c->state = State::kClosing;
    Queue(c, res, /*keep_alive=*/false, 1);
  }

  void SweepIdle(int64_t now) {
    std::vector<Conn*> idle;
    std::vector<uint64_t> slow;
    for (auto& [id, c] : conns_) {
      const int64_t limit =
          c->state == State::kDraining ? kDrainSeconds : server_.options_.idle_timeout_s;
      // A request begun and not whole in time gets its 408, whether it
      // trickles in (slowloris) or stalled: checked before the idle
      // timeout, which would close it without a word.
      if (c->state == State::kReading && !c->in.empty() && c->request_started != 0 &&
          now - c->request_started > server_.options_.request_timeout_s) {
        slow.push_back(id);
      } else if (c->state != State::kBusy && now - c->last_active > limit) {
        idle.push_back(c.get());
      }
    }
    for (Conn* c : idle) Close(c);
    for (uint64_t id : slow) {
      if (Conn* c = Find(id)) RefuseAndClose(c, 408, "the request took too long to arrive");
    }
  }

  EventServer& server_;
  int listen_fd_;
  int unix_listen_fd_;  // -1: none
  int ep_ = -1;
  int wake_fd_ = -1;
  uint64_t next_id_ = kFirstConnId;  // below it: the listen and wake tags
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns_;
  static constexpr size_t kMaxInflight = 4;
  std::vector<Pending> batch_;  // prepared, waiting for the next batch
  // Skipped by a batch because a batch in flight held their store lock.
  // They join a batch again once a batch in flight has answered (and may
  // have released it), or none is left in flight; not at once, which only
  // found the lock still held, round after round: 270,000 empty rounds in
  // 8 s of claim + complete, each with its store read and eventfd write.
  std::vector<Pending> retry_;
  std::vector<Inflight> inflight_;  // begun, oldest first
  size_t max_buffered_ = 0;
  bool listening_ = false;              // the listening sockets are in ep_
  int64_t accept_paused_until_ms_ = 0;  // EMFILE: not watching it until then
  int64_t date_second_ = -1;            // the second date_ spells (Date())
  std::string date_;
  std::atomic<int> load_{0};  // see load()
  std::mutex mu_;
  std::vector<Done> done_;  // answers from workers, under mu_
  std::atomic<bool> abandon_busy_{false};
  std::vector<Accepted> handed_;  // connections other loops accepted for this one, under mu_
};

EventServer::Loop& EventServer::LeastLoaded() const {
  Loop* best = loops_.front().get();
  for (const auto& l : loops_) {
    if (l->load() < best->load()) best = l.get();
  }
  return *best;
}

void EventServer::WorkerPool::Run(Worker& w) {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!tasks_.empty()) {
        task = std::move(tasks_.front());
        tasks_.pop_front();
        ++running_;
      } else {
        if (stopping_) return;
        idle_.push_back(&w);
        w.cv.wait(lock, [&] { return w.has_task || stopping_; });
        if (!w.has_task) {
          idle_.erase(std::find(idle_.begin(), idle_.end(), &w));
          continue;  // stopping: drain what is queued, then return
        }
        task = std::move(w.task);  // Submit counted it as running
        w.has_task = false;
      }
    }
    http1::Response res;
    if (Serve(task, res)) {
      task.loop->Complete(task.conn_id, std::move(res), task.request.keep_alive,
                          task.request.minor_version);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      --running_;
    }
    idle_cv_.notify_all();
  }
}

bool EventServer::WorkerPool::Serve(Task& task, http1::Response& res) {
  if (task.gone != nullptr && task.gone->load(std::memory_order_acquire)) {
    return true;  // nobody would read the answer; the loop closes the connection
  }
  if (task.resume) {
    RunGuarded(res, [&] { task.resume(res); });
    return true;
  }
  if (!callbacks_.deferring_handler) {
    RunGuarded(res, [&] { callbacks_.handler(task.request, res); });
    return true;
  }
  WorkerDeferral deferral(parking_, task);
  const bool ok =
      RunGuarded(res, [&] { callbacks_.deferring_handler(task.request, res, deferral); });
  if (deferral.token() == 0) return true;
  // Parked: its Resume answers, unless the handler threw (its 500 goes out)
  // or the server drains (503), whichever takes the entry first.
  std::lock_guard<std::mutex> lock(parking_->mu);
  if (ok && !parking_->refusing) return false;
  if (parking_->entries.erase(deferral.token()) == 0) return false;  // resumed already
  if (ok) {
    task.loop->Reject(task.conn_id, task.request.minor_version, "the server is shutting down",
                      /*keep_alive=*/false, &task.request);
    return false;
  }
  return true;
}

void EventServer::ResumeParked(const std::shared_ptr<Parking>& parking, uint64_t token,
                               Deferral::Answer answer) {
  std::lock_guard<std::mutex> lock(parking->mu);  // Stop waits for this
  if (parking->stopped) return;
  auto it = parking->entries.find(token);
  if (it == parking->entries.end()) return;  // answered already (or refused by Drain)
  const Parking::Entry e = it->second;
  parking->entries.erase(it);
  WorkerPool::Task task{e.loop, e.conn_id, {}, e.gone, std::move(answer)};
  task.request.keep_alive = e.keep_alive;
  task.request.minor_version = e.minor_version;
  if (parking->pool->Submit(task)) return;
  if (parking->refusing) {
    e.loop->Reject(e.conn_id, e.minor_version);
  } else {
    e.loop->Reject(e.conn_id, e.minor_version, "every handler is busy and the queue is full",
                   e.keep_alive);
  }
}

// ------------------------------------------------------------------- server

namespace {

// Binds a Unix-domain stream socket at `path` with permission bits `mode`.
// A socket file left there by a daemon that is gone (nothing accepts on it)
// is replaced; a live one, or any other kind of file, is an error.
StatusOr<EventServer::UnixSocket> BindUnixSocket(const std::string& path, int mode, int backlog) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return InvalidArgument("the Unix socket path must be 1 to " +
                           std::to_string(sizeof(addr.sun_path) - 1) + " bytes long");
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  auto* sa = reinterpret_cast<const sockaddr*>(&addr);
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return Status(Code::kFailedPrecondition,
                    path + " exists and is not a socket; the daemon does not replace it", "");
    }
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (probe < 0) return Unavailable(std::string("socket: ") + std::strerror(errno), false);
    const int rc = connect(probe, sa, sizeof(addr));
    const int err = errno;
    ::close(probe);
    if (rc == 0) {
      return Status(Code::kFailedPrecondition, "another process serves the Unix socket " + path,
                    "");
    }
    if (err != ECONNREFUSED) {
      return Unavailable("cannot probe the Unix socket " + path + ": " + std::strerror(err), false);
    }
    unlink(path.c_str());  // left by a daemon that is gone
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return Unavailable(std::string("socket: ") + std::strerror(errno), false);
  // The mode is set between bind and listen: until listen, a connect is
  // refused, so no one connects under the umask's wider bits.
  if (bind(fd, sa, sizeof(addr)) != 0 || chmod(path.c_str(), static_cast<mode_t>(mode)) != 0 ||
      lstat(path.c_str(), &st) != 0 || listen(fd, backlog) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return Unavailable("cannot listen on the Unix socket " + path + ": " + why, false);
  }
  return EventServer::UnixSocket{fd, path, st.st_dev, st.st_ino};
}

}  // namespace

EventServer::EventServer(EventServerOptions options, Callbacks callbacks)
    : options_(std::move(options)), callbacks_(std::move(callbacks)) {}

EventServer::~EventServer() { Stop(); }

StatusOr<int> EventServer::Start(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  std::string service = std::to_string(port);
  if (getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found) != 0) {
    return Unavailable("cannot resolve listen host " + host, false);
  }
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int yes = 1;
    // SO_REUSEADDR only, not SO_REUSEPORT: a second daemon on the same port
    // must fail to bind instead of silently sharing it.
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, options_.listen_backlog) == 0) {
      listen_fd_ = fd;
    } else {
      why = std::strerror(errno);
      ::close(fd);
    }
  }
  freeaddrinfo(found);
  if (listen_fd_ < 0) {
    return Unavailable("cannot bind " + host + ":" + std::to_string(port) + ": " + why, false);
  }
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  int bound = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                               : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (!options_.unix_socket.empty()) {
    StatusOr<UnixSocket> bound_unix =
        BindUnixSocket(options_.unix_socket, options_.unix_socket_mode, options_.listen_backlog);
    if (!bound_unix.ok()) {
      Stop();
      return bound_unix.status();
    }
    unix_socket_ = *bound_unix;
  }

  running_.store(true, std::memory_order_release);
  draining_.store(false, std::memory_order_release);
  parking_ = std::make_shared<Parking>();
  workers_ = std::make_unique<WorkerPool>(std::max(1, options_.workers),
                                          static_cast<size_t>(std::max(0, options_.max_queue)),
                                          callbacks_, parking_);
  parking_->pool = workers_.get();
  for (int i = 0; i < std::max(1, options_.loops); ++i) {
    auto loop = std::make_unique<Loop>(*this, listen_fd_, unix_socket_.fd);
    if (!loop->ok()) {
      Stop();
      return Unavailable("cannot create the event loops (epoll/eventfd)", true);
    }
    loops_.push_back(std::move(loop));
  }
  for (auto& loop : loops_)
    threads_.emplace_back([l = loop.get()] {
      NameThread("loop");
      l->Run();
    });
  return bound;
}

bool EventServer::Drain(int64_t timeout_ms) {
  if (!running_.load(std::memory_order_acquire) || workers_ == nullptr) return true;
  draining_.store(true, std::memory_order_release);
  for (auto& loop : loops_) loop->Wake();  // stop watching the listening socket
  // Stop listening, not only accepting: a connection the kernel took into
  // the backlog would wait unanswered until the process ends. Shut down, a
  // listening socket refuses new connections (ECONNREFUSED) and resets the
  // ones in its backlog, so a client retries elsewhere or later at once.
  // The Unix socket's file goes too (ENOENT), if it is still this server's.
  if (listen_fd_ >= 0) ::shutdown(listen_fd_, SHUT_RDWR);
  if (unix_socket_.fd >= 0) {
    ::shutdown(unix_socket_.fd, SHUT_RDWR);
    UnlinkOwnSocket();
  }
  for (WorkerPool::Task& t : workers_->RejectQueued()) {
    t.loop->Reject(t.conn_id, t.request.minor_version, "the server is shutting down",
                   /*keep_alive=*/false, &t.request);
  }
  {
    std::lock_guard<std::mutex> lock(parking_->mu);
    parking_->refusing = true;
    for (const auto& [token, e] : parking_->entries) e.loop->Reject(e.conn_id, e.minor_version);
    parking_->entries.clear();
  }
  bool idle = workers_->WaitIdle(NowMillis() + timeout_ms);
  // Past the timeout the callers still waiting get a 503 now, not an empty
  // reply when the process ends.
  if (!idle) {
    for (auto& loop : loops_) loop->AbandonBusy();
  }
  // The loops write the last answers on their next round; give them one.
  for (auto& loop : loops_) loop->Wake();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return idle;
}

void EventServer::Stop() {
  if (parking_ != nullptr) {
    std::lock_guard<std::mutex> lock(parking_->mu);
    parking_->stopped = true;  // Resumes from now on (and after) do nothing
    parking_->entries.clear();
  }
  running_.store(false, std::memory_order_release);
  for (auto& loop : loops_) loop->Wake();
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
  if (workers_) workers_->Stop();  // running handlers finish; their answers are dropped
  workers_.reset();
  loops_.clear();  // closes the connections
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
  if (unix_socket_.fd >= 0) {
    ::close(unix_socket_.fd);
    UnlinkOwnSocket();
  }
  unix_socket_ = UnixSocket{};
}

void EventServer::UnlinkOwnSocket() {
  // Only the socket this server bound: a later daemon may have replaced it.
  struct stat st {};
  if (lstat(unix_socket_.path.c_str(), &st) == 0 && st.st_dev == unix_socket_.dev &&
      st.st_ino == unix_socket_.ino) {
    unlink(unix_socket_.path.c_str());
  }
}

}  // namespace idem
