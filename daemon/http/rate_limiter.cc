#include "daemon/http/rate_limiter.h"

#include <algorithm>
#include <cmath>

namespace idem {

RateLimiter::RateLimiter(double per_second, double burst, size_t max_callers)
    : per_ms_(per_second / 1000.0),
      burst_(std::max(1.0, burst)),
      max_callers_(std::max<size_t>(1, max_callers)) {}

void RateLimiter::Refill(Bucket& b, int64_t now_ms) const {
  if (now_ms > b.at_ms) {
    b.tokens = std::min(burst_, b.tokens + static_cast<double>(now_ms - b.at_ms) * per_ms_);
    b.at_ms = now_ms;
  }
}

void RateLimiter::DropRefilled(int64_t now_ms) {
  for (auto it = buckets_.begin(); it != buckets_.end();) {
    Refill(it->second, now_ms);
    it = it->second.tokens >= burst_ ? buckets_.erase(it) : std::next(it);
  }
}

RateLimiter::Verdict RateLimiter::Take(const std::string& caller, int64_t now_ms) {
  MutexLock lock(mu_);
  Bucket* b = nullptr;
  auto it = buckets_.find(caller);
  if (it != buckets_.end()) {
    b = &it->second;
  } else {
    if (buckets_.size() >= max_callers_) DropRefilled(now_ms);
    if (buckets_.size() < max_callers_) {
      b = &buckets_.emplace(caller, Bucket{burst_, now_ms}).first->second;
    } else {
      if (!overflow_started_) overflow_ = Bucket{burst_, now_ms};
      overflow_started_ = true;
      b = &overflow_;
    }
  }
  Refill(*b, now_ms);
  if (b->tokens >= 1.0) {
    b->tokens -= 1.0;
    return {};
  }
  // Clamped before the cast (a double past int64 is undefined behaviour):
  // the config's slowest rate waits 1,000 s; a day is past anything real.
  constexpr double kMaxWaitMs = 86'400'000.0;
  const double missing_ms = std::min((1.0 - b->tokens) / per_ms_, kMaxWaitMs);
  return {false, std::max<int64_t>(1, static_cast<int64_t>(std::ceil(missing_ms)))};
}

size_t RateLimiter::callers() {
  MutexLock lock(mu_);
  return buckets_.size();
}

}  // namespace idem
