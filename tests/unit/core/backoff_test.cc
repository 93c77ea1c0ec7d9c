#include "daemon/core/backoff.h"

#include <doctest/doctest.h>

#include <limits>

namespace idem {

TEST_CASE("full-jitter backoff stays within min(cap, base * 2^(attempt-1))") {
  struct Case {
    int attempt;
    int64_t base, cap;
    double unit;
    int64_t want;
  };
  const Case cases[] = {
      {1, 200, 30'000, 0.0, 0},
      {1, 200, 30'000, 0.5, 100},
      {1, 200, 30'000, 0.999999, 200},
      {2, 200, 30'000, 0.5, 200},
      {3, 200, 30'000, 0.5, 400},
      {5, 200, 30'000, 0.999999, 3'200},
      {9, 200, 30'000, 0.999999, 30'000},
      {9, 200, 30'000, 0.5, 15'000},
      {1000, 200, 30'000, 0.5, 15'000},
      {std::numeric_limits<int>::max(), 1, 5, 0.999999, 5},
      {0, 200, 30'000, 0.5, 100},  // treated as the first attempt
      {3, 0, 30'000, 0.7, 0},
  };
  for (const Case& c : cases) {
    CAPTURE(c.attempt);
    CAPTURE(c.unit);
    CHECK(FullJitterBackoffMs(c.attempt, c.base, c.cap, c.unit) == c.want);
  }
}

TEST_CASE("Retry-After raises the delay but never beyond the cap") {
  const int64_t base = 200, cap = 30'000;
  CHECK(RetryDelayMs(1, base, cap, 0.5, 0) == 100);
  CHECK(RetryDelayMs(1, base, cap, 0.5, 5'000) == 5'000);
  CHECK(RetryDelayMs(1, base, cap, 0.5, 50) == 100);  // the backoff is longer already
  CHECK(RetryDelayMs(1, base, cap, 0.5, 3'600'000) == 30'000);
}

}  // namespace idem
