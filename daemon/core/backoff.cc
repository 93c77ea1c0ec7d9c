#include "daemon/core/backoff.h"

#include <algorithm>
#include <cmath>

namespace idem {

int64_t FullJitterBackoffMs(int attempt, int64_t base_ms, int64_t cap_ms, double unit) {
  base_ms = std::max<int64_t>(base_ms, 0);
  cap_ms = std::max<int64_t>(cap_ms, 0);
  int exponent = std::clamp(attempt - 1, 0, 62);
  // In double: base * 2^62 would overflow int64 long before the cap applies.
  double ceiling =
      std::min(static_cast<double>(cap_ms), std::ldexp(static_cast<double>(base_ms), exponent));
  unit = std::clamp(unit, 0.0, 1.0);
  // unit < 1 never reaches the ceiling; rounding up lets the full range occur.
  auto delay = static_cast<int64_t>(std::llround(unit * ceiling));
  return std::clamp<int64_t>(delay, 0, cap_ms);
}

int64_t RetryDelayMs(int attempt, int64_t base_ms, int64_t cap_ms, double unit,
                     int64_t retry_after_ms) {
  int64_t delay = FullJitterBackoffMs(attempt, base_ms, cap_ms, unit);
  if (retry_after_ms > 0) {
    delay = std::max(delay, std::min(retry_after_ms, std::max<int64_t>(cap_ms, 0)));
  }
  return delay;
}

}  // namespace idem
