// A small closed-loop HTTP/1.1 load generator for the benchmarks: each
// connection is one thread with one keep-alive socket, sending the next
// request as soon as the previous answer is read. Latencies are recorded
// per request; the figures are requests/s and percentiles.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace idem::bench {

struct LoadResult {
  double requests_per_s = 0;
  double p50_us = 0, p99_us = 0, max_us = 0;
  long requests = 0;
  long errors = 0;  // non-2xx or broken connections
};

inline int Connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

// Reads one response; returns its status or -1.
inline int ReadResponse(int fd, std::string& buf) {
  buf.clear();
  char tmp[16384];
  size_t header_end = std::string::npos;
  size_t need = 0;
  for (;;) {
    ssize_t n = recv(fd, tmp, sizeof(tmp), 0);
    if (n <= 0) return -1;
    buf.append(tmp, static_cast<size_t>(n));
    if (header_end == std::string::npos) {
      header_end = buf.find("\r\n\r\n");
      if (header_end == std::string::npos) continue;
      size_t cl = buf.find("Content-Length: ");
      if (cl == std::string::npos || cl > header_end) cl = buf.find("content-length: ");
      size_t len = cl == std::string::npos ? 0 : std::strtoul(buf.c_str() + cl + 16, nullptr, 10);
      need = header_end + 4 + len;
    }
    if (buf.size() >= need) break;
  }
  return std::atoi(buf.c_str() + 9);
}

inline LoadResult RunLoad(int port, const std::string& request, int connections,
                          double seconds) {
  std::atomic<bool> stop{false};
  std::vector<std::vector<float>> lat(connections);
  std::vector<long> errors(connections, 0);
  std::vector<std::thread> threads;
  for (int c = 0; c < connections; ++c) {
    threads.emplace_back([&, c] {
      int fd = Connect(port);
      std::string buf;
      lat[c].reserve(1 << 20);
      while (!stop.load(std::memory_order_relaxed)) {
        if (fd < 0) {
          errors[c]++;
          fd = Connect(port);
          continue;
        }
        auto t0 = std::chrono::steady_clock::now();
        if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
            static_cast<ssize_t>(request.size())) {
          close(fd);
          fd = -1;
          continue;
        }
        int status = ReadResponse(fd, buf);
        auto t1 = std::chrono::steady_clock::now();
        if (status < 200 || status >= 300) {
          errors[c]++;
          if (status < 0) {
            close(fd);
            fd = -1;
          }
          continue;
        }
        lat[c].push_back(
            std::chrono::duration<float, std::micro>(t1 - t0).count());
      }
      if (fd >= 0) close(fd);
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& t : threads) t.join();
  std::vector<float> all;
  LoadResult r;
  for (int c = 0; c < connections; ++c) {
    all.insert(all.end(), lat[c].begin(), lat[c].end());
    r.errors += errors[c];
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

inline std::string PostRequest(const std::string& path, const std::string& body) {
  return "POST " + path +
         " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

inline std::string GetRequest(const std::string& path) {
  return "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
}

}  // namespace idem::bench
