#include "daemon/obs/metrics.h"

#include <cstdio>
#include <string_view>

namespace idem {
namespace {

// `field`: a Metrics member; a leading "idem_" is dropped, the exposition adds the one prefix.
void Line(std::string& out, std::string_view field, const char* help, const Counter& c) {
  if (field.substr(0, 5) == "idem_") field.remove_prefix(5);
  std::string name = std::string(field) + "_total";
  out += "# HELP idem_";
  out += name;
  out += ' ';
  out += help;
  out += "\n# TYPE idem_";
  out += name;
  out += " counter\nidem_";
  out += name;
  out += ' ';
  out += std::to_string(c.Get());
  out += '\n';
}

}  // namespace

std::string Metrics::RenderPrometheus() const {
  std::string out;
  out.reserve(4096);
#define IDEM_METRIC(field, help) Line(out, #field, help, field)
  IDEM_METRIC(http_requests, "HTTP requests received.");
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
  {
    char sum[32];
    std::snprintf(sum, sizeof sum, "%.3f",
                  static_cast<double>(idem_in_progress_ms_sum.Get()) / 1000.0);
    out +=
        "# HELP idem_key_in_progress_seconds Time keys spent in_progress before their outcome "
        "was stored.\n# TYPE idem_key_in_progress_seconds summary\n"
        "idem_key_in_progress_seconds_sum ";
    out += sum;
    out += "\nidem_key_in_progress_seconds_count ";
    out += std::to_string(idem_in_progress_count.Get());
    out += '\n';
  }
  IDEM_METRIC(decide_cache_hits, "Decisions answered from the cache.");
  IDEM_METRIC(decide_cache_misses, "Decisions that needed a provider call.");
  IDEM_METRIC(decide_single_flight_joined, "Misses answered by a concurrent identical request.");
  IDEM_METRIC(provider_calls, "Calls to model providers.");
  IDEM_METRIC(provider_errors, "Failed calls to model providers.");
  IDEM_METRIC(decide_invalid_outputs, "Model outputs that failed the schema or value checks.");
  IDEM_METRIC(decide_escalations, "Decisions escalated to a human.");
  IDEM_METRIC(work_claimed, "Journal claims granted.");
  IDEM_METRIC(work_duplicates, "Claims of work already done (blocked duplicates).");
  IDEM_METRIC(work_busy, "Claims refused because another holder has a live lease.");
  IDEM_METRIC(work_completed, "Work items completed.");
  IDEM_METRIC(work_failed, "Work item failures recorded.");
  IDEM_METRIC(work_dead, "Work items that became dead letters.");
  IDEM_METRIC(effector_calls, "Calls to effectors.");
  IDEM_METRIC(plans_proposed, "Plans made that need no approval.");
  IDEM_METRIC(plans_awaiting_approval, "Plans made that wait for a human's approval.");
  IDEM_METRIC(plans_approved, "Plans approved by an operator.");
  IDEM_METRIC(plans_rejected, "Plans rejected by an operator.");
  IDEM_METRIC(plans_expired, "Plans whose approval timed out.");
  IDEM_METRIC(plans_applied, "Plans whose every action is done.");
  IDEM_METRIC(plans_partially_failed, "Plans applied with some action failed or dead.");
  IDEM_METRIC(inbox_events, "Webhook events processed (new event ids).");
  IDEM_METRIC(inbox_duplicates, "Webhook deliveries of an event already processed or running.");
  IDEM_METRIC(store_errors, "Store errors.");
#undef IDEM_METRIC
  return out;
}

}  // namespace idem
