// Retry timing for the apply engine (private to the apply component): full
// jitter backoff, as one policy for submissions and workers alike (R20).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#include "daemon/config/config.h"

namespace idem {

// A uniform delay in [0, min(cap_ms, base_ms * 2^(attempt-1))], drawn from
// `unit` (a uniform number in [0, 1), e.g. Env::RandomUnit()).
// REQUIRES: attempt >= 1 (the attempt that just failed), base_ms >= 0,
// cap_ms >= 0. Never overflows, whatever the attempt.
int64_t FullJitterBackoffMs(int attempt, int64_t base_ms, int64_t cap_ms, double unit);

// The delay before the next attempt: the jittered backoff, raised to the
// upstream's Retry-After (`retry_after_ms`, 0 when it said nothing) when that
// is longer, but never beyond retry.cap_ms.
int64_t RetryDelayMs(int attempt, const RetryConfig& retry, double unit, int64_t retry_after_ms);

}  // namespace idem
