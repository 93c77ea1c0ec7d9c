// Retry timing: full-jitter exponential backoff, the one policy for the
// decide engine's provider retries, the apply engine's effector retries and
// client-reported failures alike (R20, R32).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

namespace idem {

// A uniform delay in [0, min(cap_ms, base_ms * 2^(attempt-1))], drawn from
// `unit` (a uniform number in [0, 1), e.g. Env::RandomUnit()).
// REQUIRES: attempt >= 1 (the attempt that just failed), base_ms >= 0,
// cap_ms >= 0. Never overflows, whatever the attempt.
int64_t FullJitterBackoffMs(int attempt, int64_t base_ms, int64_t cap_ms, double unit);

// The delay before the next attempt: the jittered backoff, raised to the
// upstream's Retry-After (`retry_after_ms`, 0 when it said nothing) when that
// is longer, but never beyond cap_ms.
int64_t RetryDelayMs(int attempt, int64_t base_ms, int64_t cap_ms, double unit,
                     int64_t retry_after_ms);

}  // namespace idem
