#include "daemon/store/retention.h"

#include <vector>

namespace idem {

RetentionCounts SweepRetention(Store& store, const RetentionPass& pass) {
  RetentionCounts counts;
  struct Family {
    std::function<StatusOr<size_t>(size_t limit)> sweep;
    size_t* count;
    bool more = true;  // its last call deleted something (or it has not run yet)
  };
  const int64_t now = pass.now_ms;
  const int64_t cutoff = pass.finished_cutoff_ms;
  std::vector<Family> families = {
      {[&](size_t n) { return store.idem_keys().SweepExpired(now, n); }, &counts.idempotency_keys},
      {[&](size_t n) { return store.journal().SweepExpired(now, n); }, &counts.work},
      {[&](size_t n) -> StatusOr<size_t> {
         if (!pass.plan_of_decision) return store.decisions().SweepExpired(now, n);
         std::vector<std::string> ids;
         ASSIGN_OR_RETURN(size_t swept, store.decisions().SweepExpired(now, n, &ids));
         // A plan is its decision's: once the decision is gone, a plan no
         // one has acted on goes too (a decide that makes the decision
         // again proposes it again). Were this write lost, the plans would
         // stay until applied or rejected, as before.
         std::vector<PlanStore::DecisionPlan> plans;
         for (std::string& id : ids) {
           std::string plan_id = pass.plan_of_decision(id);
           plans.push_back({std::move(plan_id), std::move(id)});
         }
         ASSIGN_OR_RETURN(size_t deleted, store.plans().DeleteProposed(plans));
         counts.plans += deleted;
         return swept;
       },
       &counts.decisions},
      {[&](size_t n) { return store.leases().SweepExpired(now, n); }, &counts.leases},
  };
  if (cutoff >= 0) {
    families.push_back({[&](size_t n) { return store.escalations().SweepResolved(cutoff, n); },
                        &counts.escalations});
    families.push_back(
        {[&](size_t n) { return store.plans().SweepFinished(cutoff, n); }, &counts.plans});
    // Trace entries live as long as the finished records they point at.
    families.push_back(
        {[&](size_t n) { return store.traces().SweepBefore(cutoff, n); }, &counts.traces});
  }
  if (pass.outbox) {
    families.push_back({[&](size_t n) { return pass.outbox(now, n); }, &counts.outbox_events});
  }
  const int64_t started = pass.monotonic_ms ? pass.monotonic_ms() : 0;
  for (bool any = true; any;) {
    if (counts.rounds > 0 && pass.monotonic_ms && pass.monotonic_ms() - started >= pass.budget_ms) {
      counts.behind = true;
      break;
    }
    any = false;
    ++counts.rounds;
    for (Family& f : families) {
      if (!f.more) continue;
      StatusOr<size_t> n = f.sweep(pass.page);
      if (!n.ok()) {
        if (counts.first_error.ok()) counts.first_error = n.status();
        f.more = false;
        continue;
      }
      *f.count += *n;
      f.more = *n > 0;
      any = any || f.more;
    }
  }
  return counts;
}

}  // namespace idem
