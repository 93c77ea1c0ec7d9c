// Metrics: the daemon's counters, gauges and histograms, rendered in the
// Prometheus text format (version 0.0.4) at GET /metrics. Every name, type
// and label is listed in the README's metrics reference; a unit test checks
// that nothing rendered is missing from it and the e2e test
// (tests/e2e/metrics_scrape.mjs) that everything in it is rendered.
//
// Cost on a hot path: one or two relaxed atomic adds, no lock and no
// allocation. Labelled series are resolved once into handles (a Counter& or
// Histogram&) when a component starts (Declare), never per observation.
//
// Label cardinality is bounded: label values come only from config-known
// sets (routes, steps, action kinds, providers, models, plan states) or
// fixed enums (status classes, error classes), never from request data; and
// a family holds at most kMaxSeries series. Declare past that, or Find with
// values never declared, returns the family's one overflow series, whose
// label values are all "other".
//
// Names follow the Prometheus conventions: one `idem_` prefix, `_total` on
// counters only, base units (seconds, USD).
//
// R37: Idempotency-Key replays, key/fingerprint conflicts, in-flight
// duplicates, requests without a key, time spent in_progress, store errors.
//
// Thread-safety: all members may be used concurrently. Declare/Find take
// the family's mutex (start-up and rare paths); Counter/Gauge/Histogram
// observations are lock-free.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "daemon/core/mutex.h"
#include "daemon/core/status.h"

namespace idem {

struct Counter {
  std::atomic<uint64_t> value{0};
  void Inc(uint64_t n = 1) { value.fetch_add(n, std::memory_order_relaxed); }
  // For a count a component keeps itself (it only grows): mirrored when read.
  void Mirror(uint64_t total) { value.store(total, std::memory_order_relaxed); }
  uint64_t Get() const { return value.load(std::memory_order_relaxed); }
};

struct Gauge {
  // A value nobody could read yet (a store count while the store is down):
  // rendered as NaN, which no comparison in an alert rule matches, rather
  // than as a 0 that says "none".
  static constexpr int64_t kUnknown = INT64_MIN;
  std::atomic<int64_t> value{0};
  void Set(int64_t v) { value.store(v, std::memory_order_relaxed); }
  void SetUnknown() { Set(kUnknown); }
  int64_t Get() const { return value.load(std::memory_order_relaxed); }
};

// Durations in fixed buckets (upper bounds in seconds, ascending). Observe
// is one relaxed add on a bucket and one on the sum: lock-free, no
// allocation. A reader may see a bucket and the sum of different instants
// (never a count that goes down).
class Histogram {
 public:
  explicit Histogram(std::span<const double> upper_bounds_s);
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  void ObserveSeconds(double s);
  void ObserveMicros(int64_t us);  // negative counts as 0

  struct Snapshot {
    std::vector<uint64_t> cumulative;  // one per bound, then +Inf (== count)
    uint64_t count = 0;
    double sum_s = 0;
  };
  Snapshot Read() const;
  const std::vector<double>& bounds() const { return bounds_; }

 private:
  void ObserveNanos(uint64_t ns);
  std::vector<double> bounds_;
  std::vector<uint64_t> bounds_ns_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds + 1 (+Inf), not cumulative
  std::atomic<uint64_t> sum_ns_{0};
};

// Bucket sets (seconds).
inline constexpr double kRequestBuckets[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                             0.25,   0.5,   1,      2.5,   5,    10,    30,   60};
inline constexpr double kProviderBuckets[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                                              2.5,  5,     10,   20,  30,   60,  120};
inline constexpr double kStoreWriteBuckets[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                0.01,   0.025,   0.05,   0.1,   0.25,   1};

// Prometheus text-format pieces (exposed for the tests).
std::string EscapeLabelValue(std::string_view v);  // \ " and newline escaped
std::string EscapeHelp(std::string_view v);        // \ and newline escaped
std::string FormatNumber(double v);                // shortest round-trip form; +Inf, NaN

namespace metrics_detail {
void AppendHeader(std::string& out, const std::string& name, const std::string& help,
                  const char* type);
// {a="x",b="y"}; `extra` (e.g. le="0.5") appended last; "" when no labels.
std::string LabelSet(const std::vector<std::string>& names, const std::vector<std::string>& values,
                     std::string_view extra = {});
void AppendSeries(std::string& out, const std::string& name, const std::string& labels,
                  const Counter& c, double divisor);
void AppendSeries(std::string& out, const std::string& name, const std::string& labels,
                  const Gauge& g, double divisor);
void AppendHistogram(std::string& out, const std::string& name,
                     const std::vector<std::string>& label_names,
                     const std::vector<std::string>& values, const Histogram& h);
template <class T>
struct TypeName;
template <>
struct TypeName<Counter> {
  static constexpr const char* kValue = "counter";
};
template <>
struct TypeName<Gauge> {
  static constexpr const char* kValue = "gauge";
};
template <>
struct TypeName<Histogram> {
  static constexpr const char* kValue = "histogram";
};
}  // namespace metrics_detail

// A metric with labels: one series per combination of label values.
// `divisor` divides counter and gauge values when rendered (a counter kept
// in nano-dollars is rendered in dollars with 1e9).
template <class T>
class Family {
 public:
  static constexpr size_t kMaxSeries = 512;

  Family(std::string name, std::string help, std::vector<std::string> label_names,
         std::span<const double> bounds = {}, double divisor = 1.0)
      : name_(std::move(name)),
        help_(std::move(help)),
        label_names_(std::move(label_names)),
        bounds_(bounds.begin(), bounds.end()),
        divisor_(divisor) {}
  Family(const Family&) = delete;
  Family& operator=(const Family&) = delete;

  // The series for `values` (one per label name), created at zero the first
  // time. Values must come from config-known or fixed sets. Keep the
  // reference: it is valid as long as the family.
  T& Declare(const std::vector<std::string>& values) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    auto it = series_.find(values);
    if (it != series_.end()) return *it->second;
    if (values.size() != label_names_.size() || series_.size() >= kMaxSeries) {
      return OverflowLocked();
    }
    return *series_.emplace(values, Make()).first->second;
  }

  // The declared series for `values`, or the overflow series: never creates
  // one from the values (safe with values that came from a request).
  T& Find(const std::vector<std::string>& values) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    auto it = series_.find(values);
    if (it != series_.end()) return *it->second;
    return OverflowLocked();
  }

  void Render(std::string& out) const EXCLUDES(mu_) {
    metrics_detail::AppendHeader(out, name_, help_, metrics_detail::TypeName<T>::kValue);
    MutexLock lock(mu_);
    for (const auto& [values, series] : series_) {
      if constexpr (std::is_same_v<T, Histogram>) {
        metrics_detail::AppendHistogram(out, name_, label_names_, values, *series);
      } else {
        metrics_detail::AppendSeries(out, name_, metrics_detail::LabelSet(label_names_, values),
                                     *series, divisor_);
      }
    }
  }

  const std::string& name() const { return name_; }

 private:
  std::unique_ptr<T> Make() const {
    if constexpr (std::is_same_v<T, Histogram>) {
      return std::make_unique<T>(bounds_);
    } else {
      return std::make_unique<T>();
    }
  }
  T& OverflowLocked() REQUIRES(mu_) {
    std::vector<std::string> other(label_names_.size(), "other");
    auto it = series_.find(other);
    if (it != series_.end()) return *it->second;
    return *series_.emplace(std::move(other), Make()).first->second;
  }

  const std::string name_;
  const std::string help_;
  const std::vector<std::string> label_names_;
  const std::vector<double> bounds_;
  const double divisor_;
  mutable Mutex mu_;
  // Node-based: a series never moves, so handles stay valid.
  std::map<std::vector<std::string>, std::unique_ptr<T>> series_ GUARDED_BY(mu_);
};

// HTTP status classes, the `code` label of idem_http_requests_total.
inline constexpr const char* kStatusClasses[] = {"1xx", "2xx", "3xx", "4xx", "5xx"};
// Provider error classes, the `class` label of idem_provider_errors_total.
inline constexpr const char* kProviderErrorClasses[] = {"timeout", "rate_limited", "unavailable",
                                                        "auth",    "bad_request",  "other"};
// Token kinds, the `type` label of idem_provider_tokens_total.
inline constexpr const char* kTokenTypes[] = {"input", "output", "cached_input"};

// Handles of one route's series.
struct RouteMetrics {
  Histogram* latency = nullptr;
  Counter* by_class[5] = {};                       // kStatusClasses order
  void Observe(int status, int64_t micros) const;  // a request answered
  void Count(int status) const;                    // the same without a duration
};

// Handles of one (provider, model) pair's series.
struct ProviderMetrics {
  Histogram* latency = nullptr;
  Counter* errors[6] = {};  // kProviderErrorClasses order
  Counter* tokens[3] = {};  // kTokenTypes order
  Counter* cost_nano_usd = nullptr;
  void AddCostUsd(double usd) const;
};

struct Metrics {
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
  // decide
  Counter decide_single_flight_joined;  // misses answered by another request's provider call
  Counter provider_calls;
  Counter decide_invalid_outputs;
  Counter decide_escalations;
  // journal / apply
  Counter work_claimed;
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
  Counter trace_entries_dropped;  // the trace index's queue was full (mirrored at /metrics)
  Counter retention_behind;       // sweep passes that ran out of time with records left

  // Labelled families. Route label: "METHOD /pattern" from the route table,
  // or "unmatched" (no route: 404/405, or a request that did not parse).
  Family<Counter> http_requests{"idem_http_requests_total",
                                "HTTP requests answered, by route and status class.",
                                {"route", "code"}};
  Family<Histogram> http_request_seconds{"idem_http_request_duration_seconds",
                                         "Time from a parsed request to its answer, by route.",
                                         {"route"},
                                         kRequestBuckets};
  Family<Histogram> idem_key_in_progress{
      "idem_key_in_progress_seconds",
      "Time Idempotency-Keys spent in_progress before their outcome was stored.",
      {},
      kRequestBuckets};
  Family<Histogram> store_write_seconds{
      "idem_store_write_seconds",
      "Time of one store write (one WAL append and fsync, shared by a group of callers).",
      {},
      kStoreWriteBuckets};
  Family<Counter> decide_cache_hits{
      "idem_decide_cache_hits_total", "Decisions answered from the cache, by step.", {"step"}};
  Family<Counter> decide_cache_misses{"idem_decide_cache_misses_total",
                                      "Decisions that needed a provider call, by step.",
                                      {"step"}};
  Family<Histogram> provider_seconds{"idem_provider_latency_seconds",
                                     "Time of one model provider call, by provider and model.",
                                     {"provider", "model"},
                                     kProviderBuckets};
  Family<Counter> provider_errors{"idem_provider_errors_total",
                                  "Failed model provider calls, by provider, model and class.",
                                  {"provider", "model", "class"}};
  Family<Counter> provider_tokens{
      "idem_provider_tokens_total",
      "Tokens reported by model providers, by provider, model and type (input includes "
      "cached_input).",
      {"provider", "model", "type"}};
  Family<Counter> provider_cost{"idem_provider_cost_usd_total",
                                "Cost of model provider calls in USD (from config prices), by "
                                "provider and model.",
                                {"provider", "model"},
                                {},
                                1e9};
  Family<Counter> outbox_deliveries{
      "idem_outbox_deliveries_total",
      "Outbox POSTs to webhook subscribers, by subscriber and result (delivered, failed: an "
      "attempt that will be retried or dead-lettered, dead_lettered, replay_delivered, "
      "replay_failed).",
      {"subscriber", "result"}};
  Family<Gauge> outbox_cursor{
      "idem_outbox_cursor",
      "The seq of the last outbox event each subscriber took (its durable cursor), as this "
      "daemon moved it.",
      {"subscriber"}};
  Family<Counter> retention_swept{
      "idem_retention_swept_total",
      "Records the sweeper deleted past their window, by kind (idempotency_keys, work, "
      "decisions, leases, escalations, plans, traces, outbox_events).",
      {"kind"}};
  Family<Counter> work_duplicates{
      "idem_work_duplicates_total",
      "Claims of work already done (blocked duplicate effects), by action kind.",
      {"kind"}};
  // Store counts, refreshed by a bounded scan at most every few seconds
  // (StoreGauges in daemon/http/api.cc).
  Family<Gauge> store_memory{"idem_store_memory_bytes",
                             "Memory the store holds in this process, by part (memtables, "
                             "block_cache, block_cache_pinned, table_readers, decision_cache).",
                             {"part"}};
  Family<Gauge> store_disk{"idem_store_disk_bytes",
                           "What the store takes on disk, by part (rocksdb: each column family's "
                           "table files, wal, other; postgres: each table with its indexes); the "
                           "parts add up to the store's size.",
                           {"part"}};
  // Declared once read (never on postgres, whose disk is the server's).
  Family<Gauge> store_disk_free{"idem_store_disk_free_bytes",
                                "Free bytes on the filesystem under the store (rocksdb); writes "
                                "are refused below store.min_free_mb.",
                                {}};
  // Declared once read (never on postgres, which reports damage its own way).
  Family<Counter> store_corruptions{
      "idem_store_corruptions_total",
      "Reads and writes that met damaged data in the store (rocksdb: a checksum mismatch, a "
      "truncated file; background flushes and compactions included), each answered 500.",
      {}};
  Family<Gauge> dead_letters{
      "idem_dead_letters", "Dead work items (bounded count, see README).", {}};
  Family<Gauge> plans_by_state{
      "idem_plans", "Plans in each state (bounded count, see README).", {"state"}};
  Family<Gauge> escalations_open{
      "idem_escalations_open", "Open escalations (bounded count, see README).", {}};
  // 1, with this build's version as its label (set when the daemon starts).
  Family<Gauge> build_info{
      "idem_build_info", "Always 1; the version label names this build.", {"version"}};

  // The one series of each unlabelled family.
  Histogram& key_in_progress = idem_key_in_progress.Declare({});
  Histogram& store_write = store_write_seconds.Declare({});
  Gauge& dead_letter_count = dead_letters.Declare({});
  Gauge& escalations_open_count = escalations_open.Declare({});

  // Handles, creating the series (at zero) on first use.
  RouteMetrics ForRoute(const std::string& route);
  ProviderMetrics ForProvider(const std::string& provider, const std::string& model);
  Counter& Duplicates(const std::string& kind) { return work_duplicates.Declare({kind}); }

  std::string RenderPrometheus() const;
};

// The index in kProviderErrorClasses of a failed provider call's status code.
size_t ProviderErrorClass(Code code);

}  // namespace idem
