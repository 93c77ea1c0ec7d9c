// Metrics: the daemon's counters, rendered in the Prometheus text format at
// GET /metrics. Fixed, named counters (atomics), so recording on a hot path
// costs one relaxed atomic add and no lock.
//
// R37: Idempotency-Key replays, key/fingerprint conflicts, in-flight
// duplicates, requests without a key, time spent in_progress, store errors.
//
// Names follow the Prometheus conventions: one `idem_` prefix (a field
// named idem_* is not prefixed twice), `_total` on counters only, base
// units (the in-progress time is a summary in seconds).
//
// Thread-safety: all members may be used concurrently.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace idem {

struct Counter {
  std::atomic<uint64_t> value{0};
  void Inc(uint64_t n = 1) { value.fetch_add(n, std::memory_order_relaxed); }
  uint64_t Get() const { return value.load(std::memory_order_relaxed); }
};

struct Metrics {
  Counter http_requests;
  Counter http_errors_4xx;
  Counter http_errors_5xx;
  Counter http_connections_shed;  // past server.max_connections: 503 and closed
  Counter http_queue_full;        // every handler busy and the queue full: 503
  Counter http_accept_paused;     // accept() out of descriptors: accepting paused 100 ms
  Counter http_rate_limited;      // a caller past server.rate_limit: 429
  // Idempotency-Key (R37)
  Counter idem_key_new;
  Counter idem_key_replayed;         // same key, same payload: stored response replayed
  Counter idem_key_mismatch;         // same key, other payload: 422
  Counter idem_key_in_flight;        // same key while the first runs: 409
  Counter idem_key_waited;           // Prefer: wait answered with the first's result
  Counter idem_key_released;         // answered while the work still moved: not stored
  Counter idem_key_missing;          // required but absent: 400
  Counter idem_key_optional_absent;  // optional and absent (decide without a key)
  Counter idem_key_store_errors;
  Counter idem_in_progress_ms_sum;  // time between Begin and Finish; rendered in seconds
  Counter idem_in_progress_count;
  // decide
  Counter decide_cache_hits;
  Counter decide_cache_misses;
  Counter decide_single_flight_joined;  // misses answered by another request's provider call
  Counter provider_calls;
  Counter provider_errors;
  Counter decide_invalid_outputs;
  Counter decide_escalations;
  // journal / apply
  Counter work_claimed;
  Counter work_duplicates;
  Counter work_busy;
  Counter work_completed;
  Counter work_failed;
  Counter work_dead;
  Counter effector_calls;

  Counter plans_proposed;           // plans made that need no human
  Counter plans_awaiting_approval;  // plans made that wait for a human
  Counter plans_approved;
  Counter plans_rejected;
  Counter plans_expired;
  Counter plans_applied;
  Counter plans_partially_failed;

  Counter inbox_events;      // new webhook events processed
  Counter inbox_duplicates;  // repeated deliveries answered without running again
  Counter store_errors;

  std::string RenderPrometheus() const;
};

}  // namespace idem
