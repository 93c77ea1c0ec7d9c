#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <utility>

#include "daemon/core/backoff.h"
#include "daemon/core/crypto.h"
#include "daemon/core/env.h"
#include "daemon/core/env_vars.h"
#include "daemon/core/failpoints.h"
#include "daemon/core/json.h"
#include "daemon/obs/log.h"
#include "daemon/outbox/outbox.h"

namespace idem {
namespace {

constexpr size_t kBatch = 64;
constexpr int64_t kReplayScanMs = 1'000;
// Dead letters read by one scan for replays: kReplayScanPages pages of
// kReplayScanPage (4,000 a second at most, only while dead letters exist).
constexpr size_t kReplayScanPage = 1'000;
constexpr int kReplayScanPages = 4;

int64_t RetryAfterMs(const HttpResponse& r) {
  const std::string* v = r.FindHeader("retry-after");
  if (v == nullptr || v->empty()) return 0;
  char* end = nullptr;
  long long s = std::strtoll(v->c_str(), &end, 10);
  if (end == v->c_str() || *end != '\0' || s < 0) return 0;
  return std::min<long long>(s, 3600) * 1000;
}

}  // namespace

OutboxDispatcher::OutboxDispatcher(const OutboxConfig& config, OutboxStore& store, HttpClient& http,
                                   StableClock& clock, OutboxCoordination coordination)
    : config_(config),
      store_(store),
      http_(http),
      clock_(clock),
      leases_(coordination.leases),
      holder_(coordination.holder.empty() ? "outbox-" + RandomHex(8) : coordination.holder),
      lease_ms_(std::max<int64_t>(1'000, coordination.lease_ms)) {}

StatusOr<std::unique_ptr<OutboxDispatcher>> OutboxDispatcher::Create(
    const OutboxConfig& config, OutboxStore& store, HttpClient& http, StableClock& clock,
    OutboxCoordination coordination, Metrics* metrics) {
  std::unique_ptr<OutboxDispatcher> d(
      new OutboxDispatcher(config, store, http, clock, std::move(coordination)));
  for (const auto& [name, sub] : config.subscribers) {
    auto s = std::make_unique<Subscriber>();
    s->config = sub;
    s->lease_ttl_ms = std::max(d->lease_ms_, 2 * (sub.retry.timeout_ms + 5'000));
    if (metrics != nullptr) {
      const std::string& subscriber = name;  // clang 14 cannot capture a structured binding
      auto count = [&](const char* result) {
        return &metrics->outbox_deliveries.Declare({subscriber, result});
      };
      s->delivered = count("delivered");
      s->failed = count("failed");
      s->dead_lettered = count("dead_lettered");
      s->replay_delivered = count("replay_delivered");
      s->replay_failed = count("replay_failed");
      s->cursor = &metrics->outbox_cursor.Declare({name});
    }
    for (const auto& [hname, value] : sub.headers) {
      ASSIGN_OR_RETURN(std::string v,
                       ExpandEnv(value, "/outbox/subscribers/" + JsonPointerToken(name) +
                                            "/headers/" + JsonPointerToken(hname)));
      s->headers.emplace_back(hname, std::move(v));
    }
    if (!sub.signature_env.empty()) {
      const char* key = std::getenv(sub.signature_env.c_str());
      if (key == nullptr || *key == '\0') {
        return Status(Code::kFailedPrecondition,
                      "the environment variable " + sub.signature_env +
                          " (the signature's secret) is not set",
                      "/outbox/subscribers/" + JsonPointerToken(name) + "/signature/secret_env");
      }
      s->signing_key = key;
    }
    d->subscribers_.push_back(std::move(s));
  }
  return d;
}

OutboxDispatcher::~OutboxDispatcher() { Stop(); }

void OutboxDispatcher::Start() {
  for (auto& s : subscribers_) {
    // The gauge shows the durable cursor from the start, not 0 until the
    // next delivery (a false lag after every restart).
    if (s->cursor != nullptr) {
      if (StatusOr<uint64_t> c = store_.Cursor(s->config.name); c.ok()) {
        s->cursor->Set(static_cast<int64_t>(*c));
      }
    }
    Subscriber* raw = s.get();
    s->thread = std::thread([this, raw] {
      NameThread("outbox");
      Run(*raw);
    });
  }
}

void OutboxDispatcher::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cancel_.store(true, std::memory_order_relaxed);
  cv_.notify_all();
  for (auto& s : subscribers_) {
    if (s->thread.joinable()) s->thread.join();
  }
}

bool OutboxDispatcher::Wait(int64_t ms) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::milliseconds(ms), [this] { return stopping_; });
  return !stopping_;
}

bool OutboxDispatcher::Hold(Subscriber& s) {
  if (leases_ == nullptr) return true;
  const int64_t now = clock_.NowMillis();
  if (!s.lease_token.empty() && s.lease_until_ms - now > s.lease_ttl_ms / 2) return true;
  StatusOr<LeaseResult> r =
      leases_->Acquire("outbox:" + s.config.name, holder_, s.lease_token, s.lease_ttl_ms, now);
  if (r.ok() && r->outcome != LeaseOutcome::kHeld) {
    if (s.lease_token.empty()) {
      LogEvent(LogLevel::kInfo, "outbox_lease_acquired",
               {{"subscriber", s.config.name}, {"holder", holder_}});
    }
    s.lease_token = r->lease.token;
    s.lease_until_ms = r->lease.expires_at_ms;
    return true;
  }
  if (!s.lease_token.empty()) {
    // Lost (it expired and another daemon took it), or unknown (the store
    // failed): either way this dispatcher must not deliver now.
    LogEvent(LogLevel::kWarn, "outbox_lease_lost",
             {{"subscriber", s.config.name},
              {"holder", holder_},
              {"error", r.ok() ? "held by " + r->lease.holder : r.status().ToString()}});
  }
  s.lease_token.clear();
  return false;
}

void OutboxDispatcher::ReleaseLease(Subscriber& s) {
  if (leases_ == nullptr || s.lease_token.empty()) return;
  // Released at once, so that another daemon takes over without waiting
  // for the TTL.
  (void)leases_->Release("outbox:" + s.config.name, holder_, s.lease_token);
  s.lease_token.clear();
}

OutboxDispatcher::Delivered OutboxDispatcher::WaitHolding(Subscriber& s, int64_t ms) {
  // In slices: the lease is renewed, and a replay asked for meanwhile is
  // posted, while an event's retries wait out their backoff.
  int64_t slice = std::min<int64_t>(ms, kReplayScanMs);
  if (leases_ != nullptr)
    slice = std::min<int64_t>(slice, std::max<int64_t>(1, s.lease_ttl_ms / 4));
  while (ms > 0) {
    const int64_t step = std::min(ms, std::max<int64_t>(1, slice));
    if (!Wait(step)) return Delivered::kStopping;
    ms -= step;
    if (!Hold(s)) return Delivered::kLost;
    ReplayRequested(s);
  }
  return Delivered::kDone;
}

Status OutboxDispatcher::Post(const Subscriber& s, const OutboxEvent& e, bool* final,
                              int64_t* retry_after_ms) {
  *final = false;
  *retry_after_ms = 0;
  HttpRequest req;
  req.method = "POST";
  req.url = s.config.url;
  req.headers = s.headers;
  req.headers.emplace_back("Content-Type", "application/json");
  req.headers.emplace_back("Idempotency-Key", e.event_id);
  req.headers.emplace_back("Idem-Event-Id", e.event_id);
  req.body = e.ToJson().dump();
  if (!s.signing_key.empty()) {
    const std::string t = std::to_string(clock_.NowMillis() / 1000);
    req.headers.emplace_back("Idem-Signature",
                             "t=" + t + ",v1=" + HmacSha256Hex(s.signing_key, t + "." + req.body));
  }
  req.timeout_ms = s.config.retry.timeout_ms;
  req.connect_timeout_ms = std::min<int64_t>(req.timeout_ms, 10'000);
  // Only the status counts: a 2xx with a long body (an echo) is delivered.
  req.max_response_bytes = 64 << 10;
  req.truncate_response = true;
  req.cancel = &cancel_;
  StatusOr<HttpResponse> r = http_.Send(req);
  if (!r.ok()) return r.status();
  if (r->status >= 200 && r->status < 300) return Status::Ok();
  *retry_after_ms = RetryAfterMs(*r);
  const int st = r->status;
  *final = st >= 400 && st < 500 && st != 408 && st != 409 && st != 425 && st != 429;
  return Unavailable("subscriber " + s.config.name + " answered HTTP " + std::to_string(st));
}

OutboxDispatcher::Delivered OutboxDispatcher::Deliver(Subscriber& s, const OutboxEvent& e) {
  const int max_attempts = std::max(1, s.config.retry.attempts);
  std::string error;
  int attempt = 1;
  for (;; ++attempt) {
    if (Status fp = Failpoints::Hit("outbox.deliver"); !fp.ok()) {
      error = fp.message();
      Count(s.failed);
      if (attempt >= max_attempts) break;
      if (Delivered w = WaitHolding(s, s.config.retry.base_ms); w != Delivered::kDone) return w;
      continue;
    }
    // Only the lease's holder posts: another daemon may have taken over.
    if (!Hold(s)) return Delivered::kLost;
    bool final = false;
    int64_t retry_after = 0;
    Status sent = Post(s, e, &final, &retry_after);
    if (sent.ok()) {
      (void)Failpoints::Hit("outbox.delivered");
      Count(s.delivered);
      // Until this is written, a restart delivers the event again (at least once).
      while (true) {
        Status moved = store_.Advance(s.config.name, e.seq);
        if (moved.ok()) {
          if (s.cursor != nullptr) s.cursor->Set(static_cast<int64_t>(e.seq));
          return Delivered::kDone;
        }
        LogEvent(LogLevel::kWarn, "outbox_cursor_failed",
                 {{"subscriber", s.config.name}, {"error", moved.ToString()}});
        if (!Wait(1'000)) return Delivered::kStopping;
      }
    }
    // Stopped mid-POST: not an attempt; the restart delivers it again.
    if (cancel_.load(std::memory_order_relaxed)) return Delivered::kStopping;
    error = sent.message();
    Count(s.failed);
    if (final || attempt >= max_attempts) break;
    int64_t delay = RetryDelayMs(attempt, s.config.retry.base_ms, s.config.retry.cap_ms,
                                 clock_.env().RandomUnit(), retry_after);
    if (Delivered w = WaitHolding(s, delay); w != Delivered::kDone) return w;
  }
  if (!Hold(s)) return Delivered::kLost;
  OutboxDeadLetter dl;
  dl.subscriber = s.config.name;
  dl.event = e;
  dl.attempts = attempt;
  dl.last_error = error;
  dl.dead_at_ms = clock_.NowMillis();
  while (true) {
    Status stored = store_.AddDeadLetter(dl);
    if (stored.ok()) break;
    LogEvent(LogLevel::kWarn, "outbox_dead_letter_failed",
             {{"subscriber", s.config.name}, {"error", stored.ToString()}});
    if (!Wait(1'000)) return Delivered::kStopping;
  }
  Count(s.dead_lettered);
  if (s.cursor != nullptr) s.cursor->Set(static_cast<int64_t>(e.seq));  // AddDeadLetter moved it
  LogEvent(LogLevel::kWarn, "outbox_dead_letter",
           {{"subscriber", s.config.name},
            {"event_id", e.event_id},
            {"type", e.type},
            {"attempts", attempt},
            {"error", error}});
  return Delivered::kDone;
}

void OutboxDispatcher::ReplayRequested(Subscriber& s) {
  // Replays are rare and operator-made: look for them about once a second,
  // not at every poll.
  const int64_t now = clock_.NowMillis();
  if (now < s.next_replay_scan_ms) return;
  s.next_replay_scan_ms = now + kReplayScanMs;
  // Every dead letter is looked at, a few pages a scan, continued at the
  // next scan and begun again after the last: a replay asked for any of
  // them is posted within a scan per kReplayScanPages pages before it.
  std::vector<OutboxDeadLetter> dead;
  for (int page = 0; page < kReplayScanPages; ++page) {
    StatusOr<std::vector<OutboxDeadLetter>> more =
        store_.DeadLetters(s.config.name, s.replay_scan_after, kReplayScanPage);
    if (!more.ok()) break;
    const bool last = more->size() < kReplayScanPage;
    s.replay_scan_after = last ? 0 : more->back().event.seq;
    for (OutboxDeadLetter& d : *more) {
      if (d.state == "replaying") dead.push_back(std::move(d));
    }
    if (last) break;
  }
  for (const OutboxDeadLetter& d : dead) {
    if (!Hold(s)) return;
    bool final = false;
    int64_t retry_after = 0;
    Status sent = Post(s, d.event, &final, &retry_after);
    if (cancel_.load(std::memory_order_relaxed)) return;  // still replaying after the restart
    Status noted = store_.FinishReplay(s.config.name, d.event.seq, sent.ok(),
                                       sent.ok() ? "" : sent.message(), clock_.NowMillis());
    Count(sent.ok() ? s.replay_delivered : s.replay_failed);
    LogEvent(sent.ok() ? LogLevel::kInfo : LogLevel::kWarn, "outbox_replay",
             {{"subscriber", s.config.name},
              {"event_id", d.event.event_id},
              {"delivered", sent.ok()},
              {"error", sent.ok() ? std::string() : sent.message()},
              {"recorded", noted.ok()}});
  }
}

void OutboxDispatcher::Run(Subscriber& s) {
  struct Releaser {
    OutboxDispatcher* d;
    Subscriber& s;
    ~Releaser() { d->ReleaseLease(s); }
  } releaser{this, s};
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
    }
    // Another daemon delivers this subscriber's events: look again later.
    if (!Hold(s)) {
      if (!Wait(config_.poll_ms)) return;
      continue;
    }
    ReplayRequested(s);
    StatusOr<uint64_t> cursor = store_.Cursor(s.config.name);
    StatusOr<std::vector<OutboxEvent>> events =
        cursor.ok() ? store_.After(*cursor, kBatch)
                    : StatusOr<std::vector<OutboxEvent>>(cursor.status());
    if (!events.ok()) {
      LogEvent(LogLevel::kWarn, "outbox_read_failed",
               {{"subscriber", s.config.name}, {"error", events.status().ToString()}});
    }
    if (!events.ok() || events->empty()) {
      if (!Wait(config_.poll_ms)) return;
      continue;
    }
    for (const OutboxEvent& e : *events) {
      ReplayRequested(s);  // between events too, not once a batch
      Delivered d = Deliver(s, e);
      if (d == Delivered::kStopping) return;
      if (d == Delivered::kLost) break;  // the new holder starts from the cursor
    }
  }
}

StatusOr<size_t> OutboxDispatcher::Sweep(int64_t now_ms, size_t limit) {
  uint64_t through = std::numeric_limits<uint64_t>::max() - 1;
  for (const auto& s : subscribers_) {
    ASSIGN_OR_RETURN(uint64_t c, store_.Cursor(s->config.name));
    through = std::min(through, c);
  }
  return store_.Sweep(through, now_ms - config_.retention_ms, limit);
}

}  // namespace idem
