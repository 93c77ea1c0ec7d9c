// Retention: one pass of the sweeper over every record family a window
// covers (expired Idempotency-Keys, done work past its window, decisions
// past their cache window with their plans nobody approved, applied or
// rejected, expired named leases, resolved escalations, finished plans,
// trace entries, outbox events).
//
// Each family is swept a page at a time (its store's Sweep* call with
// limit `page`), round by round, and a family is asked again while its last
// call deleted anything: a backlog of many pages is deleted in one pass, so
// the store stays bounded however many records expire between two passes.
// (One page per family per pass, as before, deleted at most 10,000 records
// of a kind every 30 s, 333 a second: a single daemon writes decisions at
// ten times that, and its store then grew for as long as the traffic
// lasted; bench/bench_soak.cc measures it.) The pass ends when no family
// has anything left, or when `budget_ms` of `monotonic_ms` is spent (every
// family still gets its first page; null: no budget); it then reports `behind`, and
// the caller runs the next pass soon instead of a whole interval later.
//
// A family whose call fails is left for this pass (`first_error` holds the
// first failure): the others go on, and the next pass tries it again.
//
// Thread-safety: as the store's Sweep* calls (any thread); one pass at a
// time is the caller's to arrange.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "daemon/core/status.h"
#include "daemon/store/store.h"

namespace idem {

struct RetentionPass {
  int64_t now_ms = 0;  // what has expired: windows ending at or before it
  // Resolved escalations, finished plans and trace entries at or before it
  // go; below 0 they are all kept (store.finished_retention: forever).
  int64_t finished_cutoff_ms = 0;
  size_t page = 10'000;                   // records per Sweep* call
  int64_t budget_ms = 2'000;              // after the first round, at most this long
  std::function<int64_t()> monotonic_ms;  // the budget's clock
  // The plan id of a decision (PlanEngine::DecisionPlanId): a decision's
  // plan still `proposed` goes with the decision. Null: plans are left.
  std::function<std::string(const std::string& decision_id)> plan_of_decision;
  // The outbox's retention (OutboxDispatcher::Sweep: it knows how far each
  // subscriber has read); null: no outbox sweep.
  std::function<StatusOr<size_t>(int64_t now_ms, size_t limit)> outbox;
};

struct RetentionCounts {
  size_t idempotency_keys = 0, work = 0, decisions = 0, leases = 0, escalations = 0, plans = 0,
         traces = 0, outbox_events = 0;
  size_t rounds = 0;    // Sweep* calls of the busiest family
  bool behind = false;  // the budget ran out while a family was still deleting
  Status first_error = Status::Ok();
  // Each kind's name (as metrics and logs spell it) and count, in one order.
  std::array<std::pair<const char*, size_t>, 8> ByKind() const {
    return {{{"idempotency_keys", idempotency_keys},
             {"work", work},
             {"decisions", decisions},
             {"leases", leases},
             {"escalations", escalations},
             {"plans", plans},
             {"traces", traces},
             {"outbox_events", outbox_events}}};
  }
  size_t total() const {
    size_t n = 0;
    for (const auto& [kind, count] : ByKind()) n += count;
    return n;
  }
};

RetentionCounts SweepRetention(Store& store, const RetentionPass& pass);

}  // namespace idem
