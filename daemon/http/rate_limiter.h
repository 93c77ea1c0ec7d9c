// RateLimiter: a token bucket per caller (server.rate_limit). Each caller
// name (the bearer token's name, else the Idem-Caller header's, else
// "anonymous") has a bucket of `burst` tokens refilled at `per_second`;
// a request takes one token or is refused with the time until the next
// one (the server answers 429 with Retry-After). One caller's burst never
// slows another.
//
// Bounded: at most `max_callers` buckets. Past it, buckets that have
// refilled (idle callers, indistinguishable from new ones) are dropped; if
// none has, the newcomer shares one overflow bucket with every other
// newcomer until room frees, so a flood of invented Idem-Caller names
// cannot grow memory or escape the limit.
//
// Thread-safety: Take is safe from any thread (one mutex).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "daemon/core/mutex.h"

namespace idem {

class RateLimiter {
 public:
  // per_second > 0, burst >= 1.
  RateLimiter(double per_second, double burst, size_t max_callers = 10'000);

  struct Verdict {
    bool allowed = true;
    int64_t retry_after_ms = 0;  // refused: when the caller's next token is due
  };
  // Takes one token from `caller`'s bucket at `now_ms` (a monotonic clock).
  Verdict Take(const std::string& caller, int64_t now_ms) EXCLUDES(mu_);

  // Buckets held now (tests).
  size_t callers() EXCLUDES(mu_);

 private:
  struct Bucket {
    double tokens = 0;
    int64_t at_ms = 0;  // when `tokens` was last brought up to date
  };
  void Refill(Bucket& b, int64_t now_ms) const;
  void DropRefilled(int64_t now_ms) REQUIRES(mu_);

  const double per_ms_;
  const double burst_;
  const size_t max_callers_;
  Mutex mu_;
  std::map<std::string, Bucket> buckets_ GUARDED_BY(mu_);
  Bucket overflow_ GUARDED_BY(mu_);
  bool overflow_started_ GUARDED_BY(mu_) = false;
};

}  // namespace idem
