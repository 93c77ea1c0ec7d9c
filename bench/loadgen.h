// A small closed-loop HTTP/1.1 load generator for the benchmarks: keep-alive
// connections, each sending its next request as soon as the previous answer
// is read. Latencies are recorded per request; the figures are requests/s
// and percentiles.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace idem::bench {

struct LoadResult {
  double requests_per_s = 0;
  double p50_us = 0, p99_us = 0, max_us = 0;
  long requests = 0;
  long errors = 0;  // non-2xx or broken connections
};

// Where the load goes: the daemon's port on 127.0.0.1, or its Unix socket.
struct Endpoint {
  Endpoint(int port) : port(port) {}  // NOLINT: a port is an endpoint
  explicit Endpoint(std::string unix_path) : unix_path(std::move(unix_path)) {}
  int port = 0;
  std::string unix_path;  // non-empty: connect here instead
};

inline int Connect(const Endpoint& to) {
  sockaddr_storage storage{};
  socklen_t len = 0;
  if (!to.unix_path.empty()) {
    auto* addr = reinterpret_cast<sockaddr_un*>(&storage);
    addr->sun_family = AF_UNIX;
    to.unix_path.copy(addr->sun_path, sizeof(addr->sun_path) - 1);
    len = sizeof(sockaddr_un);
  } else {
    auto* addr = reinterpret_cast<sockaddr_in*>(&storage);
    addr->sin_family = AF_INET;
    addr->sin_port = htons(static_cast<uint16_t>(to.port));
    addr->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    len = sizeof(sockaddr_in);
  }
  int fd = socket(storage.ss_family, SOCK_STREAM, 0);
  if (connect(fd, reinterpret_cast<sockaddr*>(&storage), len) != 0) {
    close(fd);
    return -1;
  }
  if (to.unix_path.empty()) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  return fd;
}

// `make_request(seq)` builds the seq-th request (seq is unique across
// connections), for loads where each request must differ. With `follow_up`,
// one operation is two requests: after a 2xx answer to the first, the
// connection sends follow_up(that answer's body), and the operation's
// latency runs from the first send to the second answer.
using FollowUp = std::function<std::string(std::string_view first_body)>;

inline LoadResult RunLoadGen(const Endpoint& to,
                             const std::function<std::string(uint64_t)>& make_request,
                             int connections, double seconds, int threads = 2,
                             const FollowUp& follow_up = nullptr) {
  std::atomic<uint64_t> seq{0};
  threads = std::max(1, std::min(threads, connections));
  std::atomic<bool> stop{false};
  std::vector<std::vector<float>> lat(threads);
  std::vector<long> errors(threads, 0);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    int mine = connections / threads + (t < connections % threads ? 1 : 0);
    workers.emplace_back([&, t, mine] {
      struct Conn {
        int fd = -1;
        std::string buf;
        size_t need = 0;
        size_t body_at = 0;
        bool second = false;  // waiting for the follow-up's answer
        std::chrono::steady_clock::time_point sent;
      };
      std::vector<Conn> conns(mine);
      int ep = epoll_create1(0);
      lat[t].reserve(1 << 20);
      auto start = [&](Conn& c) {
        if (c.fd < 0) {
          c.fd = Connect(to);
          if (c.fd < 0) return false;
          epoll_event ev{};
          ev.events = EPOLLIN;
          ev.data.ptr = &c;
          epoll_ctl(ep, EPOLL_CTL_ADD, c.fd, &ev);
        }
        c.buf.clear();
        c.need = 0;
        c.second = false;
        const std::string request = make_request(seq.fetch_add(1));
        c.sent = std::chrono::steady_clock::now();
        return send(c.fd, request.data(), request.size(), MSG_NOSIGNAL) ==
               static_cast<ssize_t>(request.size());
      };
      auto send_follow_up = [&](Conn& c) {
        const std::string request = follow_up(std::string_view(c.buf).substr(c.body_at));
        c.buf.clear();
        c.need = 0;
        c.second = true;
        return send(c.fd, request.data(), request.size(), MSG_NOSIGNAL) ==
               static_cast<ssize_t>(request.size());
      };
      auto reset = [&](Conn& c) {
        errors[t]++;
        if (c.fd >= 0) close(c.fd);
        c.fd = -1;
      };
      for (auto& c : conns) {
        if (!start(c)) reset(c);
      }
      epoll_event events[64];
      char tmp[16384];
      while (!stop.load(std::memory_order_relaxed)) {
        int n = epoll_wait(ep, events, 64, 50);
        for (int i = 0; i < n; ++i) {
          Conn& c = *static_cast<Conn*>(events[i].data.ptr);
          ssize_t got = recv(c.fd, tmp, sizeof(tmp), 0);
          if (got <= 0) {
            reset(c);
            if (!start(c)) reset(c);
            continue;
          }
          c.buf.append(tmp, static_cast<size_t>(got));
          if (c.need == 0) {
            size_t header_end = c.buf.find("\r\n\r\n");
            if (header_end == std::string::npos) continue;
            size_t cl = c.buf.find("Content-Length: ");
            if (cl == std::string::npos || cl > header_end) cl = c.buf.find("content-length: ");
            size_t len =
                cl == std::string::npos ? 0 : std::strtoul(c.buf.c_str() + cl + 16, nullptr, 10);
            c.need = header_end + 4 + len;
            c.body_at = header_end + 4;
          }
          if (c.buf.size() < c.need) continue;
          int status = std::atoi(c.buf.c_str() + 9);
          if (status >= 200 && status < 300 && follow_up && !c.second) {
            if (!send_follow_up(c)) reset(c);
            continue;
          }
          if (status >= 200 && status < 300) {
            lat[t].push_back(
                std::chrono::duration<float, std::micro>(std::chrono::steady_clock::now() - c.sent)
                    .count());
          } else {
            errors[t]++;
          }
          if (!start(c)) reset(c);
        }
        for (auto& c : conns) {
          if (c.fd < 0 && !stop.load(std::memory_order_relaxed) && !start(c)) reset(c);
        }
      }
      for (auto& c : conns) {
        if (c.fd >= 0) close(c.fd);
      }
      close(ep);
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& w : workers) w.join();
  std::vector<float> all;
  LoadResult r;
  for (int t = 0; t < threads; ++t) {
    all.insert(all.end(), lat[t].begin(), lat[t].end());
    r.errors += errors[t];
  }
  if (all.empty()) return r;
  std::sort(all.begin(), all.end());
  r.requests = static_cast<long>(all.size());
  r.requests_per_s = static_cast<double>(all.size()) / seconds;
  r.p50_us = all[all.size() / 2];
  r.p99_us = all[std::min(all.size() - 1, all.size() * 99 / 100)];
  r.max_us = all.back();
  return r;
}

inline LoadResult RunLoad(const Endpoint& to, const std::string& request, int connections,
                          double seconds, int threads = 2) {
  return RunLoadGen(
      to, [&request](uint64_t) { return request; }, connections, seconds, threads);
}

inline std::string PostRequest(const std::string& path, const std::string& body) {
  return "POST " + path +
         " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

inline std::string GetRequest(const std::string& path) {
  return "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
}

// A field of /proc/<pid>/status in kB (VmRSS:, VmHWM:, ...); -1 if absent.
inline long StatusKb(pid_t pid, const char* field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::atol(line.c_str() + std::strlen(field) + 1);
  }
  return -1;
}

inline double Mb(long kb) { return kb / 1024.0; }

// Bytes of the regular files under `dir`, and of its WAL files (*.log).
inline uint64_t DirBytes(const std::string& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::end(it); it.increment(ec)) {
    if (it->is_regular_file(ec)) total += it->file_size(ec);
  }
  return total;
}

inline uint64_t WalBytes(const std::string& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(dir, ec);
       !ec && it != std::filesystem::end(it); it.increment(ec)) {
    if (it->path().extension() == ".log") total += it->file_size(ec);
  }
  return total;
}

// One blocking keep-alive connection: send a request, read one answer.
struct BlockingClient {
  int fd = -1;
  std::string buf;
  explicit BlockingClient(const Endpoint& to) : fd(Connect(to)) {}
  ~BlockingClient() {
    if (fd >= 0) close(fd);
  }
  // The status (0 on a broken connection); `body` gets the answer's body.
  int Call(const std::string& request, std::string* body) {
    if (fd < 0 || send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
                      static_cast<ssize_t>(request.size())) {
      return 0;
    }
    buf.clear();
    size_t need = 0, body_at = 0;
    char tmp[16384];
    while (need == 0 || buf.size() < need) {
      ssize_t got = recv(fd, tmp, sizeof(tmp), 0);
      if (got <= 0) return 0;
      buf.append(tmp, static_cast<size_t>(got));
      if (need == 0) {
        size_t end = buf.find("\r\n\r\n");
        if (end == std::string::npos) continue;
        size_t cl = buf.find("Content-Length: ");
        if (cl == std::string::npos || cl > end) cl = buf.find("content-length: ");
        size_t len = cl == std::string::npos ? 0 : std::strtoul(buf.c_str() + cl + 16, nullptr, 10);
        body_at = end + 4;
        need = body_at + len;
      }
    }
    if (body != nullptr) body->assign(buf, body_at, need - body_at);
    return std::atoi(buf.c_str() + 9);
  }
};

// The real daemon binary in its own process on the default config, with a
// fresh store in a temp folder, on a free loopback port. Environment:
// IDEM_BENCH_BINARY runs another daemon binary; IDEM_BENCH_KEEP keeps the
// folder (store and daemon.log) afterwards.
struct BenchDaemon {
  std::string dir;
  pid_t pid = -1;
  int port = 0;
  std::string config;        // empty: the repository's config/idem.yaml
  bool unix_socket = false;  // also serve on socket_path() (--unix-socket)

  std::string socket_path() const { return dir + "/idem.sock"; }

  // Returns false (and says why on stderr) if it did not come up in 20 s.
  bool Start() {
    char tmpl[] = "/tmp/idem-bench-XXXXXX";
    dir = mkdtemp(tmpl);
    const std::string port_file = dir + "/port";
    if (config.empty()) config = std::string(IDEM_SOURCE_DIR) + "/config/idem.yaml";
    // Built before fork(): the child makes system calls only (a malloc
    // there can deadlock on a lock another thread held at the fork).
    const std::string log = dir + "/daemon.log";
    const std::string data = dir + "/data";
    // IDEM_BENCH_BINARY: another build of the daemon, for a before/after.
    const char* binary = std::getenv("IDEM_BENCH_BINARY");
    if (binary == nullptr) binary = IDEM_BINARY;
    const std::string sock = socket_path();
    std::vector<const char*> argv = {
        binary,   "serve",      "--config",    config.c_str(),    "--listen",    "127.0.0.1:0",
        "--data", data.c_str(), "--port-file", port_file.c_str(), "--log-level", "warn"};
    if (unix_socket) {
      argv.push_back("--unix-socket");
      argv.push_back(sock.c_str());
    }
    argv.push_back(nullptr);
    std::fflush(stdout);  // the child must not inherit unwritten output
    pid = fork();
    if (pid == 0) {
      int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd < 0) _exit(127);
      dup2(fd, 1);
      dup2(fd, 2);
      execv(binary, const_cast<char* const*>(argv.data()));
      _exit(127);
    }
    for (int i = 0; i < 2000 && port == 0; ++i) {
      std::ifstream pf(port_file);
      if (!(pf >> port)) port = 0;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (port == 0) std::fprintf(stderr, "daemon did not start; see %s/daemon.log\n", dir.c_str());
    return port != 0;
  }

  // CPU time (user + system) the daemon has used so far, in milliseconds;
  // -1 if unreadable. On a shared machine, CPU per operation varies far less
  // than operations per second.
  double CpuMillis() const { return ProcCpuMillis("/proc/" + std::to_string(pid) + "/stat"); }

  // CPU time of a process or thread in milliseconds, split as the kernel
  // counts it: in our code and the libraries' (user) and in system calls,
  // page faults and the interrupts taken while it ran (system).
  struct Cpu {
    double user_ms = 0;
    double system_ms = 0;
    double total() const { return user_ms + system_ms; }
  };

  // utime and stime of a /proc/.../stat file; nullopt if unreadable.
  static std::optional<Cpu> ProcCpu(const std::string& path) {
    std::ifstream in(path);
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    size_t close = stat.rfind(')');  // the command name may hold spaces
    if (close == std::string::npos) return std::nullopt;
    std::vector<std::string> fields;
    size_t at = close + 2;
    while (at < stat.size() && fields.size() < 13) {
      size_t space = stat.find(' ', at);
      if (space == std::string::npos) space = stat.size();
      fields.push_back(stat.substr(at, space - at));
      at = space + 1;
    }
    if (fields.size() < 13) return std::nullopt;  // fields 14 and 15: utime, stime in ticks
    const double ms_per_tick = 1000.0 / static_cast<double>(sysconf(_SC_CLK_TCK));
    return Cpu{std::atof(fields[11].c_str()) * ms_per_tick,
               std::atof(fields[12].c_str()) * ms_per_tick};
  }

  // utime + stime of a /proc/.../stat file in milliseconds, -1 if unreadable.
  static double ProcCpuMillis(const std::string& path) {
    std::optional<Cpu> cpu = ProcCpu(path);
    return cpu ? cpu->total() : -1;
  }

  // CPU time by thread name so far: the daemon names its threads by role
  // (idem-loop, idem-commit, idem-trace, ...; RocksDB's are rocksdb:high
  // and rocksdb:low). Threads that have exited are not counted.
  std::map<std::string, Cpu> CpuByThread() const {
    std::map<std::string, Cpu> out;
    std::error_code ec;
    const std::string task_dir = "/proc/" + std::to_string(pid) + "/task";
    for (const auto& task : std::filesystem::directory_iterator(task_dir, ec)) {
      std::optional<Cpu> cpu = ProcCpu(task.path().string() + "/stat");
      std::ifstream comm(task.path().string() + "/comm");
      std::string name;
      if (!cpu || !std::getline(comm, name)) continue;
      out[name].user_ms += cpu->user_ms;
      out[name].system_ms += cpu->system_ms;
    }
    return out;
  }

  // The same, user + system, in milliseconds.
  std::map<std::string, double> CpuMillisByThread() const {
    std::map<std::string, double> out;
    for (const auto& [name, cpu] : CpuByThread()) out[name] = cpu.total();
    return out;
  }

  void Stop() {
    if (pid > 0) {
      kill(pid, SIGTERM);
      int status = 0;
      waitpid(pid, &status, 0);
      pid = -1;
    }
  }

  ~BenchDaemon() {
    Stop();
    std::error_code ec;
    if (!dir.empty() && std::getenv("IDEM_BENCH_KEEP") == nullptr)
      std::filesystem::remove_all(dir, ec);
  }
};

}  // namespace idem::bench
