// The outbox dispatcher (R29): pushes the store's outbox events
// (store.h, OutboxStore) to the webhook subscribers of config `outbox`.
//
// Promises:
//   - At least once: an event is delivered (a 2xx answer) before the
//     subscriber's durable cursor moves past it; a crash in between
//     delivers it again after the restart, with the same event id
//     (Idempotency-Key and Idem-Event-Id headers) for the consumer's inbox.
//   - In order: each subscriber takes events one at a time in seq order
//     (commit order, so per key too). An event that exhausts its attempts
//     goes to that subscriber's dead letters and the subscriber moves on:
//     later events of the same key may then arrive before the dead one is
//     replayed (POST /v1/outbox/dead_letters/{subscriber}/{seq}/replay).
//   - Signed when configured: Idem-Signature: t=<unix seconds>,v1=<hex
//     HMAC-SHA256 of "<t>.<body>">, made for each attempt (a consumer
//     rejects old timestamps to refuse a captured request replayed).
//   - Retries: full-jitter backoff (core/backoff.h) up to max_attempts,
//     honouring Retry-After; a 4xx other than 408, 409, 425 and 429 is
//     final at once (retrying the same body cannot help).
//   - Subscribers are independent: one thread each, so a slow or dead
//     subscriber delays only itself.
//   - One daemon per subscriber (issue 13): with a LeaseStore
//     (OutboxCoordination), a subscriber's events are delivered only under
//     the named lease "outbox:<subscriber>". It is checked (and renewed when
//     half its TTL has passed) before every POST, dead letter and replay,
//     and while waiting between retries, so two dispatchers on one store
//     never deliver one subscriber's events concurrently; the other daemons
//     poll the lease every poll_ms and take over when it is released (Stop)
//     or expires (a crash: after at most lease_ms). A dispatcher that finds
//     its lease lost drops what it was doing; the new holder starts from the
//     durable cursor.
//
// Failpoints: "outbox.deliver" before each delivery attempt, and
// "outbox.delivered" after a 2xx and before the cursor moves.
//
// Thread-safety: Start/Stop from one thread; Sweep from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "daemon/config/config.h"
#include "daemon/core/env.h"
#include "daemon/core/http_client.h"
#include "daemon/obs/metrics.h"
#include "daemon/store/store.h"

namespace idem {

// How dispatchers of several daemons on one store share the subscribers.
struct OutboxCoordination {
  LeaseStore* leases = nullptr;  // null: this dispatcher delivers alone
  std::string holder;            // "" : "outbox-" + 16 random hex
  // The lease's TTL; raised to at least 2 * (a subscriber's timeout + 5 s),
  // so that a POST started under the lease ends before it could expire.
  int64_t lease_ms = 30'000;
};

class OutboxDispatcher {
 public:
  // FailedPrecondition (field: the header's config path) if a header, or
  // a signature's secret_env, names an unset environment variable. `coordination.leases` (may be
  // null) must outlive the dispatcher. `metrics` (may be null) counts deliveries and shows cursors
  // (idem_outbox_deliveries_total, idem_outbox_cursor) and must outlive it.
  static StatusOr<std::unique_ptr<OutboxDispatcher>> Create(const OutboxConfig& config,
                                                            OutboxStore& store, HttpClient& http,
                                                            StableClock& clock,
                                                            OutboxCoordination coordination = {},
                                                            Metrics* metrics = nullptr);
  ~OutboxDispatcher();  // Stop()

  void Start();
  // Wakes and joins every subscriber thread. A POST in flight is abandoned
  // at once, its cursor not moved: the event is delivered again after the
  // restart (at least once), so a slow subscriber never holds up a stop.
  void Stop();

  // Retention: deletes up to `limit` events older than the retention window
  // that every subscriber has passed; returns how many.
  StatusOr<size_t> Sweep(int64_t now_ms, size_t limit);

 private:
  struct Subscriber {
    OutboxSubscriberConfig config;
    HttpHeaders headers;      // expanded; held in memory only
    std::string signing_key;  // the signature's secret ("" : unsigned); memory only
    std::thread thread;
    int64_t next_replay_scan_ms = 0;  // its thread only
    uint64_t replay_scan_after = 0;   // where the next scan goes on (its thread only)
    // The subscriber's lease, as this dispatcher holds it (its thread only):
    // empty token: not held.
    std::string lease_token;
    int64_t lease_until_ms = 0;
    int64_t lease_ttl_ms = 0;
    // Its series (null without metrics).
    Counter* delivered = nullptr;
    Counter* failed = nullptr;
    Counter* dead_lettered = nullptr;
    Counter* replay_delivered = nullptr;
    Counter* replay_failed = nullptr;
    Gauge* cursor = nullptr;
  };
  OutboxDispatcher(const OutboxConfig& config, OutboxStore& store, HttpClient& http,
                   StableClock& clock, OutboxCoordination coordination);

  // How a delivery ended.
  enum class Delivered { kDone, kStopping, kLost };

  void Run(Subscriber& s);
  // One POST; OK on 2xx. *final: retrying cannot help. *retry_after_ms: the
  // upstream's Retry-After, 0 if none.
  Status Post(const Subscriber& s, const OutboxEvent& e, bool* final, int64_t* retry_after_ms);
  // Delivers `e` with retries; kStopping / kLost: nothing recorded.
  Delivered Deliver(Subscriber& s, const OutboxEvent& e);
  void ReplayRequested(Subscriber& s);
  // Sleeps up to ms; false when stopping.
  bool Wait(int64_t ms);
  // Sleeps up to ms while keeping the subscriber's lease.
  Delivered WaitHolding(Subscriber& s, int64_t ms);
  // True if this dispatcher holds s's lease for at least half its TTL more
  // (acquiring or renewing it when needed); always true without leases.
  bool Hold(Subscriber& s);
  void ReleaseLease(Subscriber& s);
  static void Count(Counter* c) {
    if (c != nullptr) c->Inc();
  }

  const OutboxConfig config_;
  OutboxStore& store_;
  HttpClient& http_;
  StableClock& clock_;
  std::vector<std::unique_ptr<Subscriber>> subscribers_;
  LeaseStore* const leases_;  // may be null
  const std::string holder_;
  const int64_t lease_ms_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;            // guarded by mu_
  std::atomic<bool> cancel_{false};  // set by Stop: ends a POST in flight
};

}  // namespace idem
