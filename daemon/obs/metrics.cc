#include "daemon/obs/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace idem {

Histogram::Histogram(std::span<const double> upper_bounds_s)
    : bounds_(upper_bounds_s.begin(), upper_bounds_s.end()),
      buckets_(std::make_unique<std::atomic<uint64_t>[]>(upper_bounds_s.size() + 1)) {
  std::sort(bounds_.begin(), bounds_.end());
  bounds_.erase(std::unique(bounds_.begin(), bounds_.end()), bounds_.end());
  for (double b : bounds_) bounds_ns_.push_back(static_cast<uint64_t>(std::llround(b * 1e9)));
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0, std::memory_order_relaxed);
}

void Histogram::ObserveNanos(uint64_t ns) {
  // le: the first bound the value does not exceed.
  size_t i = std::lower_bound(bounds_ns_.begin(), bounds_ns_.end(), ns) - bounds_ns_.begin();
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(ns, std::memory_order_relaxed);
}

void Histogram::ObserveSeconds(double s) {
  if (!(s > 0)) s = 0;  // NaN and negatives count as 0
  if (s > 1e9) s = 1e9;
  ObserveNanos(static_cast<uint64_t>(std::llround(s * 1e9)));
}

void Histogram::ObserveMicros(int64_t us) {
  ObserveNanos(us <= 0 ? 0 : static_cast<uint64_t>(us) * 1000);
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot s;
  s.cumulative.reserve(bounds_.size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    running += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative.push_back(running);
  }
  s.count = running;
  s.sum_s = static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) / 1e9;
  return s;
}

std::string EscapeLabelValue(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string EscapeHelp(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatNumber(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  if (ec != std::errc()) return "NaN";
  return std::string(buf, end);
}

namespace metrics_detail {

void AppendHeader(std::string& out, const std::string& name, const std::string& help,
                  const char* type) {
  out += "# HELP ";
  out += name;
  out += ' ';
  out += EscapeHelp(help);
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

std::string LabelSet(const std::vector<std::string>& names, const std::vector<std::string>& values,
                     std::string_view extra) {
  if (names.empty() && extra.empty()) return {};
  std::string out = "{";
  for (size_t i = 0; i < names.size() && i < values.size(); ++i) {
    if (i > 0) out += ',';
    out += names[i];
    out += "=\"";
    out += EscapeLabelValue(values[i]);
    out += '"';
  }
  if (!extra.empty()) {
    if (out.size() > 1) out += ',';
    out += extra;
  }
  out += '}';
  return out;
}

void AppendSeries(std::string& out, const std::string& name, const std::string& labels,
                  const Counter& c, double divisor) {
  out += name;
  out += labels;
  out += ' ';
  out += divisor == 1.0 ? std::to_string(c.Get())
                        : FormatNumber(static_cast<double>(c.Get()) / divisor);
  out += '\n';
}

void AppendSeries(std::string& out, const std::string& name, const std::string& labels,
                  const Gauge& g, double divisor) {
  out += name;
  out += labels;
  out += ' ';
  out += g.Get() == Gauge::kUnknown ? "NaN"
         : divisor == 1.0           ? std::to_string(g.Get())
                                    : FormatNumber(static_cast<double>(g.Get()) / divisor);
  out += '\n';
}

void AppendHistogram(std::string& out, const std::string& name,
                     const std::vector<std::string>& label_names,
                     const std::vector<std::string>& values, const Histogram& h) {
  Histogram::Snapshot s = h.Read();
  const std::vector<double>& bounds = h.bounds();
  for (size_t i = 0; i <= bounds.size(); ++i) {
    std::string le = "le=\"" + (i < bounds.size() ? FormatNumber(bounds[i]) : "+Inf") + "\"";
    out += name;
    out += "_bucket";
    out += LabelSet(label_names, values, le);
    out += ' ';
    out += std::to_string(s.cumulative[i]);
    out += '\n';
  }
  const std::string labels = LabelSet(label_names, values);
  out += name;
  out += "_sum";
  out += labels;
  out += ' ';
  out += FormatNumber(s.sum_s);
  out += '\n';
  out += name;
  out += "_count";
  out += labels;
  out += ' ';
  out += std::to_string(s.count);
  out += '\n';
}

}  // namespace metrics_detail

namespace {

// `field`: a Metrics member; a leading "idem_" is dropped, the exposition adds the one prefix.
void Line(std::string& out, std::string_view field, const char* help, const Counter& c) {
  if (field.substr(0, 5) == "idem_") field.remove_prefix(5);
  std::string name = "idem_" + std::string(field) + "_total";
  metrics_detail::AppendHeader(out, name, help, "counter");
  metrics_detail::AppendSeries(out, name, "", c, 1.0);
}

}  // namespace

void RouteMetrics::Observe(int status, int64_t micros) const {
  if (latency != nullptr) latency->ObserveMicros(micros);
  Count(status);
}

void RouteMetrics::Count(int status) const {
  int cls = status / 100 - 1;
  if (cls >= 0 && cls < 5 && by_class[cls] != nullptr) by_class[cls]->Inc();
}

void ProviderMetrics::AddCostUsd(double usd) const {
  if (cost_nano_usd == nullptr || !(usd > 0)) return;
  cost_nano_usd->Inc(static_cast<uint64_t>(std::llround(std::min(usd, 1e9) * 1e9)));
}

RouteMetrics Metrics::ForRoute(const std::string& route) {
  RouteMetrics r;
  r.latency = &http_request_seconds.Declare({route});
  for (size_t i = 0; i < 5; ++i) r.by_class[i] = &http_requests.Declare({route, kStatusClasses[i]});
  return r;
}

ProviderMetrics Metrics::ForProvider(const std::string& provider, const std::string& model) {
  ProviderMetrics p;
  p.latency = &provider_seconds.Declare({provider, model});
  for (size_t i = 0; i < std::size(kProviderErrorClasses); ++i) {
    p.errors[i] = &provider_errors.Declare({provider, model, kProviderErrorClasses[i]});
  }
  for (size_t i = 0; i < std::size(kTokenTypes); ++i) {
    p.tokens[i] = &provider_tokens.Declare({provider, model, kTokenTypes[i]});
  }
  p.cost_nano_usd = &provider_cost.Declare({provider, model});
  return p;
}

size_t ProviderErrorClass(Code code) {
  switch (code) {
    case Code::kDeadlineExceeded:
      return 0;  // timeout
    case Code::kResourceExhausted:
      return 1;  // rate_limited
    case Code::kUnavailable:
      return 2;  // unavailable
    case Code::kUnauthenticated:
    case Code::kPermissionDenied:
      return 3;  // auth
    case Code::kInvalidArgument:
    case Code::kFailedPrecondition:
    case Code::kNotFound:
      return 4;  // bad_request
    default:
      return 5;  // other
  }
}

std::string Metrics::RenderPrometheus() const {
  std::string out;
  out.reserve(16384);
#define IDEM_METRIC(field, help) Line(out, #field, help, field)
  http_requests.Render(out);
  http_request_seconds.Render(out);
  IDEM_METRIC(http_errors_4xx, "HTTP responses with a 4xx status.");
  IDEM_METRIC(http_errors_5xx, "HTTP responses with a 5xx status.");
  IDEM_METRIC(http_connections_shed, "Connections refused past server.max_connections.");
  IDEM_METRIC(http_queue_full, "Requests answered 503: every handler busy and the queue full.");
  IDEM_METRIC(http_accept_paused, "Times accepting paused because descriptors ran out.");
  IDEM_METRIC(http_rate_limited, "Requests answered 429: the caller was past server.rate_limit.");
  IDEM_METRIC(idem_key_new, "Idempotency-Keys seen for the first time.");
  IDEM_METRIC(idem_key_replayed,
              "Requests answered with a stored response (same key, same payload).");
  IDEM_METRIC(idem_key_mismatch, "Same Idempotency-Key with another payload (422).");
  IDEM_METRIC(idem_key_in_flight, "Same Idempotency-Key while the first request ran (409).");
  IDEM_METRIC(idem_key_waited, "Duplicates that waited (Prefer: wait) for the first's answer.");
  IDEM_METRIC(idem_key_missing, "Requests missing a required Idempotency-Key (400).");
  IDEM_METRIC(idem_key_optional_absent, "Requests without a key where it is optional.");
  IDEM_METRIC(idem_key_store_errors, "Idempotency-Key store errors.");
  IDEM_METRIC(idem_key_released,
              "Keyed answers not stored because the work was still moving (202, 409 busy).");
  idem_key_in_progress.Render(out);
  decide_cache_hits.Render(out);
  decide_cache_misses.Render(out);
  IDEM_METRIC(decide_single_flight_joined, "Misses answered by a concurrent identical request.");
  IDEM_METRIC(provider_calls, "Calls to model providers.");
  provider_seconds.Render(out);
  provider_errors.Render(out);
  provider_tokens.Render(out);
  provider_cost.Render(out);
  IDEM_METRIC(decide_invalid_outputs, "Model outputs that failed the schema or value checks.");
  IDEM_METRIC(decide_escalations, "Decisions escalated to a human.");
  escalations_open.Render(out);
  IDEM_METRIC(work_claimed, "Journal claims granted.");
  work_duplicates.Render(out);
  IDEM_METRIC(work_busy, "Claims refused because another holder has a live lease.");
  IDEM_METRIC(work_completed, "Work items completed.");
  IDEM_METRIC(work_failed, "Work item failures recorded.");
  IDEM_METRIC(work_dead, "Work items that became dead letters.");
  dead_letters.Render(out);
  store_memory.Render(out);
  store_disk.Render(out);
  store_disk_free.Render(out);
  store_corruptions.Render(out);
  IDEM_METRIC(effector_calls, "Calls to effectors.");
  IDEM_METRIC(plans_proposed, "Plans made that need no approval.");
  IDEM_METRIC(plans_awaiting_approval, "Plans made that wait for a human's approval.");
  IDEM_METRIC(plans_approved, "Plans approved by an operator.");
  IDEM_METRIC(plans_rejected, "Plans rejected by an operator.");
  IDEM_METRIC(plans_expired, "Plans whose approval timed out.");
  IDEM_METRIC(plans_applied, "Plans whose every action is done.");
  IDEM_METRIC(plans_partially_failed, "Plans applied with some action failed or dead.");
  plans_by_state.Render(out);
  IDEM_METRIC(inbox_events, "Webhook events processed (new event ids).");
  IDEM_METRIC(inbox_duplicates, "Webhook deliveries of an event already processed or running.");
  outbox_deliveries.Render(out);
  outbox_cursor.Render(out);
  IDEM_METRIC(store_errors, "Store errors.");
  retention_swept.Render(out);
  IDEM_METRIC(retention_behind,
              "Sweep passes that ran out of time with records left to delete (the next pass "
              "follows a second later).");
  store_write_seconds.Render(out);
  IDEM_METRIC(trace_entries_dropped,
              "Trace entries dropped because the trace index's queue was full.");
  build_info.Render(out);
#undef IDEM_METRIC
  return out;
}

}  // namespace idem
