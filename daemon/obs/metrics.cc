#include "daemon/obs/metrics.h"

namespace idem {
namespace {

void Line(std::string& out, const char* name, const char* help, const Counter& c) {
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
#define IDEM_METRIC(field, help) Line(out, #field "_total", help, field)
  IDEM_METRIC(http_requests, "HTTP requests received.");
  IDEM_METRIC(http_errors_4xx, "HTTP responses with a 4xx status.");
  IDEM_METRIC(http_errors_5xx, "HTTP responses with a 5xx status.");
  IDEM_METRIC(idem_key_new, "Idempotency-Keys seen for the first time.");
  IDEM_METRIC(idem_key_replayed,
              "Requests answered with a stored response (same key, same payload).");
  IDEM_METRIC(idem_key_mismatch, "Same Idempotency-Key with another payload (422).");
  IDEM_METRIC(idem_key_in_flight, "Same Idempotency-Key while the first request ran (409).");
  IDEM_METRIC(idem_key_waited, "Duplicates that waited (Prefer: wait) for the first's answer.");
  IDEM_METRIC(idem_key_missing, "Requests missing a required Idempotency-Key (400).");
  IDEM_METRIC(idem_key_optional_absent, "Requests without a key where it is optional.");
  IDEM_METRIC(idem_key_store_errors, "Idempotency-Key store errors.");
  IDEM_METRIC(idem_in_progress_ms_sum, "Milliseconds keys spent in_progress, summed.");
  IDEM_METRIC(idem_in_progress_count, "Keys that went from in_progress to completed.");
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
  IDEM_METRIC(store_errors, "Store errors.");
#undef IDEM_METRIC
  return out;
}

}  // namespace idem
