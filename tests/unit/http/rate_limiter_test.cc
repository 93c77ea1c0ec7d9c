#include "daemon/http/rate_limiter.h"

#include <doctest/doctest.h>

namespace idem {
namespace {

TEST_CASE("a caller gets its burst at once, then one request per refill interval") {
  RateLimiter limiter(/*per_second=*/2, /*burst=*/3);
  int64_t now = 1'000'000;  // the fake clock, in ms
  for (int i = 0; i < 3; ++i) CHECK(limiter.Take("alice", now).allowed);
  RateLimiter::Verdict refused = limiter.Take("alice", now);
  CHECK_FALSE(refused.allowed);
  CHECK(refused.retry_after_ms == 500);  // 2 per second: the next token in 500 ms

  now += 499;
  CHECK_FALSE(limiter.Take("alice", now).allowed);
  now += 1;
  CHECK(limiter.Take("alice", now).allowed);
  CHECK_FALSE(limiter.Take("alice", now).allowed);
}

TEST_CASE("the retry hint counts the fraction of a token already refilled") {
  RateLimiter limiter(/*per_second=*/1, /*burst=*/1);
  CHECK(limiter.Take("a", 0).allowed);
  CHECK(limiter.Take("a", 300).retry_after_ms == 700);
}

TEST_CASE("a rate too slow to wait for gives a day's wait, not an overflowed one") {
  RateLimiter limiter(/*per_second=*/1e-300, /*burst=*/1);
  CHECK(limiter.Take("a", 0).allowed);
  CHECK(limiter.Take("a", 0).retry_after_ms == 86'400'000);
}

TEST_CASE("an idle caller's bucket refills only up to the burst") {
  RateLimiter limiter(/*per_second=*/10, /*burst=*/2);
  CHECK(limiter.Take("a", 0).allowed);
  int64_t later = 3'600'000;  // an hour idle is still only two tokens
  CHECK(limiter.Take("a", later).allowed);
  CHECK(limiter.Take("a", later).allowed);
  CHECK_FALSE(limiter.Take("a", later).allowed);
}

TEST_CASE("one caller's burst does not slow another caller") {
  RateLimiter limiter(/*per_second=*/1, /*burst=*/2);
  CHECK(limiter.Take("alice", 0).allowed);
  CHECK(limiter.Take("alice", 0).allowed);
  CHECK_FALSE(limiter.Take("alice", 0).allowed);
  CHECK(limiter.Take("bob", 0).allowed);
  CHECK(limiter.Take("bob", 0).allowed);
  CHECK_FALSE(limiter.Take("bob", 0).allowed);
}

TEST_CASE("past max_callers refilled buckets are dropped and newcomers share one overflow bucket") {
  RateLimiter limiter(/*per_second=*/1, /*burst=*/1, /*max_callers=*/2);
  CHECK(limiter.Take("a", 0).allowed);
  CHECK(limiter.Take("b", 0).allowed);
  // Neither a nor b has refilled: c and d share the overflow bucket.
  CHECK(limiter.Take("c", 0).allowed);
  CHECK_FALSE(limiter.Take("d", 0).allowed);
  CHECK(limiter.callers() == 2);
  // A second later a and b are full again, as good as new: dropped for e.
  CHECK(limiter.Take("e", 1000).allowed);
  CHECK(limiter.callers() == 1);
}

}  // namespace
}  // namespace idem
