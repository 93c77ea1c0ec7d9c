// ApplyEngine: the apply half — executes action kinds' effects exactly once
// per unit of work through the durable journal (store.h Journal).
//
// Submit(kind, args) derives the work_id from the kind's identity fields
// (work_identity.h), claims it (one atomic durable step), calls the kind's
// effector on the calling thread, and records the outcome:
//   kExecuted     the effect ran now; item.result / item.external_ref hold it;
//   kDuplicate    the work was done before: item holds the original result;
//   kBusy         another holder has a live lease (item.locked_until_ms);
//   kDead         attempts exhausted earlier: a dead letter;
//   kRetrying     the effect failed retryably: it stays in the journal, due
//                 at item.next_attempt_at_ms, and the workers retry it.
// A permanent failure, or the last attempt, makes the item dead (kDead).
//
// Effectors (config `effector.http`), by idempotency level (R15-R17):
//   header          POST with `Idempotency-Key: <work_id>` (never per attempt);
//   upsert          PUT to a URL templated with the natural key (or a field);
//   check_then_act  GET lookup by a fingerprint idem embeds; create only if
//                   absent; external_ref recorded at once;
//   none            the journal is the only guard (R18 message guard).
// Config keys: daemon/apply/http_effector.h.
// Errors are classified once for providers and effectors alike
// (providers/errors.h): network errors, 408, 409, 429, 5xx are retryable;
// other 4xx are permanent.
//
// Workers (StartWorkers) pull due work — failed items whose retry time came,
// and running items whose lease expired because a process died mid-effect —
// claim it and run it again with the same work_id.
//
// Leases: one attempt's lease is the effector's budget (retry.timeout per
// HTTP call; two calls for check_then_act) plus ApplyOptions::lease_margin_ms.
// Retries: full-jitter backoff, a uniform delay in [0, min(cap, base *
// 2^(attempt-1))] (Env::RandomUnit), raised to the upstream's Retry-After
// when it asks for longer (never beyond cap). A Submit of work that failed
// and is not yet due answers kRetrying without an attempt: the caller's
// retries and the workers' share one budget (R20).
//
// A failpoint that errors (apply.after_claim, apply.after_lookup,
// apply.after_effect, apply.after_record), or a store error while recording,
// returns that error from Submit and records nothing more: the lease then
// expires and the workers finish the work, as after a crash.
//
// Internal kinds (ApplyOptions::internal_kinds): action kinds idem itself
// runs, such as its notifications (daemon/plans/journal_notifier.h). The
// workers run their work like any other, but Submit refuses them (NotFound,
// as for an unknown kind), so no API caller can run one; their work enters
// the journal through Journal::Enqueue.
//
// Work of a kind the config does not name: alone with its journal, the
// daemon buries it (a dead letter, "action kind 'x' is not configured in
// this daemon"); on a shared journal it leaves it to the daemons that
// know the kind, logs `apply.unknown_kind_skipped` once per kind, and its
// workers pass over that kind from then on.
//
// Dead letters: when an attempt (Submit, Replay or a worker), a claim or the
// burial of an unconfigured kind makes an item dead, the engine calls
// ApplyOptions::notifier with kind "dead_letter" (event_id
// "dead_letter:<work_id>:<time of death>", command `idem dlq replay
// <work_id>`), except for internal kinds (a dead notification must not
// notify about itself). A crash between the death and the call loses that
// one message (the death is durable, the call is not).
//
// All time comes from the StableClock; jitter from its Env.
//
// Thread-safety: all methods may be called concurrently; Stop once (later
// calls are no-ops; the destructor stops too).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "daemon/config/config.h"
#include "daemon/core/env.h"
#include "daemon/core/http_client.h"
#include "daemon/core/status.h"
#include "daemon/obs/metrics.h"
#include "daemon/plans/notifier.h"
#include "daemon/store/store.h"

namespace idem {

enum class ActionOutcomeKind { kExecuted, kDuplicate, kBusy, kDead, kRetrying };

struct ActionOutcome {
  ActionOutcomeKind kind;
  WorkItem item;
};

struct ReconcileFinding {
  std::string work_id;
  std::string kind;
  std::string external_ref;
  // "missing": the journal says done, the target's lookup finds no record;
  // "ref_mismatch": the target's record carries another id than the journal;
  // "extra": the target lists a record (list_url) whose work the journal
  //          has as dead, or (window forever) does not know at all;
  // "duplicate": the target holds more than one record with the work's
  //          fingerprint (its lookup answers, or its list, says so): an
  //          effect made twice.
  std::string problem;
  std::string detail;  // e.g. the id the target reports
};

struct ReconcileReport {
  int64_t ran_at_ms = 0;
  size_t checked = 0;
  std::vector<ReconcileFinding> findings;
  std::vector<std::string> errors;  // kinds that could not be checked, and why
};

struct ApplyOptions {
  int64_t poll_interval_ms = 100;  // workers' real-time sleep when nothing is due
  size_t batch = 64;               // items per Due() read
  int64_t lease_margin_ms = 1'000;
  size_t reconcile_limit = 10'000;  // done items checked per kind and pass
  // Kinds idem runs for itself (see above); their names must not collide
  // with config.actions (InvalidArgument at Create).
  std::vector<ActionConfig> internal_kinds;
  // Told about dead letters; null: nobody is. Must outlive the engine.
  Notifier* notifier = nullptr;
  // Other daemons share the journal (Store::shared()): work of a kind this
  // daemon's config lacks may be another's (a rolling config change, or
  // daemons with different kinds), so its workers pass over it instead of
  // burying it as a dead letter (what a daemon alone with its store does).
  bool shared_journal = false;
};

// The "dead_letter" notification of `dead` (see Dead letters above), for
// every place that makes work dead (the engine; clients' POST
// /v1/work/{id}/fail).
Notification DeadLetterNotification(const WorkItem& dead, const Config& config);

class ApplyEngine {
 public:
  virtual ~ApplyEngine() = default;

  // `config`, `journal`, `http`, `clock` and `metrics` must outlive the engine.
  // InvalidArgument (field "/actions/<kind>/effector/...") for an invalid
  // effector node; FailedPrecondition for a header's unset ${VAR}.
  static StatusOr<std::unique_ptr<ApplyEngine>> Create(const Config& config, Journal& journal,
                                                       HttpClient& http, StableClock& clock,
                                                       Metrics& metrics);
  static StatusOr<std::unique_ptr<ApplyEngine>> Create(const Config& config, Journal& journal,
                                                       HttpClient& http, StableClock& clock,
                                                       Metrics& metrics,
                                                       const ApplyOptions& options);

  // NotFound (field "/kind") for an unknown kind; InvalidArgument (with the
  // field) when args lack an identity field (or the effector's key field);
  // FailedPrecondition when the kind has no effector (client-executed work).
  // Journal errors as the journal returns them.
  // `call_id` (WorkItem::call_id) names the call that asks, "" for none; the
  // work it creates records it, so that the caller can tell its own retry
  // from another call (the kind's on_duplicate).
  virtual StatusOr<ActionOutcome> Submit(const std::string& kind, const Json& args,
                                         const std::string& run_id, const std::string& request_id,
                                         const std::string& call_id) = 0;
  StatusOr<ActionOutcome> Submit(const std::string& kind, const Json& args,
                                 const std::string& run_id, const std::string& request_id) {
    return Submit(kind, args, run_id, request_id, "");
  }

  // R21/R24: requeues the dead letter `work_id` (a fresh attempt budget)
  // and runs it at once on the calling thread. FailedPrecondition unless
  // dead, NotFound if unknown. kBusy: another replay of it runs in this
  // process now; kRetrying also when a worker (here or another daemon's)
  // claimed it between this replay's requeue and its own claim.
  virtual StatusOr<ActionOutcome> Replay(const std::string& work_id) = 0;

  // Starts `n` worker threads that retry due work, plus one of its own for
  // idem's own kinds (notifications, "idem.") when any is registered, so
  // that neither can hold the other up; idempotent.
  virtual void StartWorkers(int n) = 0;
  // Runs one pass over due work on the calling thread; returns the number of
  // items it attempted (claimed, or buried because their kind is unknown).
  // Does nothing after Stop.
  virtual StatusOr<size_t> RunDueOnce(size_t max_items) = 0;
  virtual void Stop() = 0;

  // Compares done records that carry an external_ref with the target
  // (kinds whose effector has a lookup URL) and reports discrepancies; also
  // lists the target (list_url) for "extra" records. A kind whose lookup
  // fails is skipped with a line in `errors`. The report is kept as the last.
  virtual StatusOr<ReconcileReport> Reconcile() = 0;
  // The last report; NotFound before the first Reconcile.
  virtual StatusOr<ReconcileReport> LastReconcile() const = 0;
};

}  // namespace idem
