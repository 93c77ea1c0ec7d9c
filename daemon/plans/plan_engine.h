// PlanEngine: plans that wait for a human (R14, R21, R35).
//
// A decision whose output carries actions (the step's `plan.pointer`)
// becomes a plan when it is decided, before anything happens. Approval
// policies (config `approval` on a step or an action kind; ApprovalPolicy in
// config.h) decide whether a human must approve it first:
//   require: never | always | when (a JSONLogic rule over
//   {plan, action, args, decision, input}; truthy = needs approval).
// The plan needs approval when any of its actions does; each such action
// adds a reason the operator reads.
//
// Lifecycle (every change is a compare-and-set in the store, recorded in the
// plan's history with actor, time and note, and appended to the audit chain
// in the same atomic write):
//   proposed ----------------------------> applying -> applied
//   awaiting_approval -> approved -------> applying -> partially_failed
//                     -> rejected | expired
// `applying` with work still retrying stays applying until a later apply.
// A decision plan not yet applying whose decision was superseded moves to
// rejected when anyone tries to run it (RetireSupersededPlan).
//
// Every way in is gated: Apply (POST /v1/plans/{id}/apply), GateAction
// (POST /v1/actions/{kind}, each item of /v1/runs, client claims of a kind
// whose policy needs approval). A gated call makes (once, keyed by the
// work_id of its args) a one-action plan awaiting approval and returns it;
// the same call after approval goes on with the approved (possibly edited)
// args; after rejection or expiry it is refused. An approval covers one
// execution: once the approved work ran and its kind's window is over (its
// done record expired or was swept), the same identity is new work, and
// its call makes the gate plan wait again (applied -> awaiting_approval,
// made by that caller, with that call's args) unless the kind's rule lets
// those args through.
//
// Separation of duties: the token that created a plan cannot approve or
// reject it (PermissionDenied), admin included. Without configured tokens
// every caller is "anonymous" and the rule cannot hold; it is then not
// enforced, and the audit event says so.
//
// Errors: NotFound (no such plan), FailedPrecondition (the plan is not in a
// state that allows the call; the message names the state),
// PermissionDenied, InvalidArgument (an edit, with the field "/edits/<i>/...").
//
// Thread-safety: all methods may be called concurrently. Two approvals of
// one plan race on the store's compare-and-set: one wins, the other gets
// FailedPrecondition; the journal applies each action once either way.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/apply/apply_engine.h"
#include "daemon/config/config.h"
#include "daemon/core/env.h"
#include "daemon/core/status.h"
#include "daemon/obs/metrics.h"
#include "daemon/plans/notifier.h"
#include "daemon/store/store.h"

namespace idem {

inline constexpr const char* kPlanStates[] = {"proposed", "awaiting_approval", "approved",
                                              "rejected", "expired",           "applying",
                                              "applied",  "partially_failed"};

// The outcome of one plan action's application.
struct PlanActionResult {
  size_t index = 0;
  std::string kind;
  StatusOr<ActionOutcome> outcome = Status(Code::kInternal, "not run");
};

struct PlanApplyResult {
  Plan plan;
  std::vector<PlanActionResult> actions;
  bool moving = false;  // some action retrying or busy: not a final answer
};

// What GateAction decided for one call.
struct Gate {
  bool allowed = true;  // false: the call must not execute now
  Plan plan;            // set when the kind is gated (plan_id non-empty)
  Json args;            // the args to execute: the approved (edited) ones
};

struct PlanEngineOptions {
  size_t expiry_batch = 1000;  // a page of awaiting plans; ExpireDue reads up to 4
  size_t settle_batch = 200;   // plans of each state per SettleFromJournal
  // An approved plan is applied by SettleFromJournal once unchanged for this
  // long (its approval's apply never ran).
  int64_t resume_after_ms = 5'000;
  int64_t max_wait_ms = 60'000;
  // Long polls (Watch) registered at once; past it Watch refuses and the
  // caller answers at once (the agent polls). A poll holds no thread, only
  // its connection and a few bytes here.
  int max_waiters = 4096;
};

class PlanEngine {
 public:
  // Checks every policy's `when` rule (InvalidArgument with the config
  // pointer of the policy). The references must outlive the engine.
  static StatusOr<std::unique_ptr<PlanEngine>> Create(const Config& config, Store& store,
                                                      ApplyEngine& apply, StableClock& clock,
                                                      Metrics& metrics, Notifier& notifier,
                                                      PlanEngineOptions options = {});
  ~PlanEngine();

  // The plan of a decision whose step has a plan pointer and whose output
  // holds a non-empty action list; NotFound when there is none. Made on the
  // first call (by `caller`) and returned as stored afterwards, under
  // DecisionPlanId(decision.decision_id).
  StatusOr<Plan> ProposeFromDecision(const Decision& decision, const std::string& caller);
  // The id of a decision's plan: "plan_" + the decision id's hex.
  static std::string DecisionPlanId(const std::string& decision_id);

  // Gate for executing `kind` with `args` now (origin "action" or "run").
  // Ungated kinds: allowed, no plan. Gated: the call's plan, allowed only
  // once approved (args then the approved ones); FailedPrecondition once
  // rejected or expired.
  // `run_id` (may be empty): the run the call's work belongs to; the plan's
  // action keeps it, and the approved work is submitted under it (else
  // under the plan id), so GET /v1/runs/{id} lists it either way.
  // `call_id` (may be empty; WorkItem::call_id): the call that makes the
  // plan; the plan's action keeps it and the approved work is submitted
  // with it, so that call's retry gets the work's result even from a kind
  // with on_duplicate conflict or ignore.
  StatusOr<Gate> GateAction(const ActionConfig& kind, const Json& args, const std::string& origin,
                            const std::string& caller, const std::string& run_id = "",
                            const std::string& call_id = "");

  // `args` against `kind`'s args_schema (OK when it has none):
  // InvalidArgument with the field `at` + the failing pointer.
  Status CheckArgs(const ActionConfig& kind, const Json& args, const std::string& at) const;

  // Applies a plan that needs no approval or was approved: each action is
  // submitted to the journal (executed once however often this is called).
  // `id` is a plan id or the decision id it came from.
  StatusOr<PlanApplyResult> Apply(const std::string& id, const std::string& actor,
                                  const std::string& request_id);

  // awaiting_approval -> approved (edits: [{path, value}], a JSON pointer
  // into the actions under /<i>/args), then applied at once (actions of
  // client-executed kinds are left for their clients' claims). With
  // `expect_updated_at_ms` (the plan as the approver read it), a plan
  // changed since (applied and waiting again with another call's args, or
  // edited) is refused: FailedPrecondition at /expect_updated_at_ms. The
  // edits always apply to the actions they were read with, or the
  // approval is refused the same way.
  StatusOr<PlanApplyResult> Approve(const std::string& plan_id, const std::string& actor,
                                    const std::string& comment, const Json& edits,
                                    const std::string& request_id,
                                    std::optional<int64_t> expect_updated_at_ms = std::nullopt);
  // proposed | awaiting_approval -> rejected; `reason` must not be empty.
  StatusOr<Plan> Reject(const std::string& plan_id, const std::string& actor,
                        const std::string& reason);

  // A decision plan not yet applied (proposed or awaiting approval) never
  // runs once another decision answers its input (a promote, a decide with
  // cache=refresh, a decide after the window): Apply and Approve refuse it
  // with FailedPrecondition and move it to rejected (by "idem", reason
  // "superseded: ..."), leaving no holds on its work. This does the same
  // at once for `decision_id`'s plan (the promote, by `actor`): the
  // retired plan's id, or "" when there was nothing to retire (of calls at
  // once for one plan, only the one that retired it returns its id).
  StatusOr<std::string> RetireSupersededPlan(const std::string& decision_id,
                                             const std::string& actor);

  // A long poll on a plan that holds no thread: `fire` is called once, when
  // the plan changes (on the changing thread, after its write), when
  // `wait_ms` (capped by options.max_wait_ms) has passed (on the engine's
  // timer thread), or when the engine is destroyed. `seen` is Generation()
  // read before the caller read the plan: a change since then fires at once,
  // inline. `seen_updated_at_ms` is the plan's updated_at_ms as read: on a
  // shared store (PostgreSQL), where another daemon's change reaches no
  // watch here, the engine reads watched plans every 500 ms and fires when
  // one moved past it. False, with nothing registered and `fire` not
  // called, when options.max_waiters polls are registered already.
  bool Watch(const std::string& plan_id, uint64_t seen, int64_t seen_updated_at_ms, int64_t wait_ms,
             std::function<void()> fire);
  // Counts plan changes made through this engine.
  uint64_t Generation() const;

  // The plan with its decision and each action's journal state (the
  // operator's detail view).
  StatusOr<Json> Detail(const Plan& plan);

  // Approval timeouts: expires (or escalates, once) awaiting plans whose
  // deadline passed; returns how many it changed. Each call walks on from
  // where the last stopped (up to 4 pages of options.expiry_batch), so
  // every waiting plan is looked at within a few calls. (Approve itself
  // refuses a plan past its deadline, and expires it, whether or not a
  // sweep has.) Called by the scheduler.
  StatusOr<size_t> ExpireDue();

  // Plan states follow the journal: a plan `applying` whose actions have
  // all ended (done, or dead after their attempts, often long after the
  // apply call that began them) becomes `applied` or `partially_failed`,
  // and a `partially_failed` one whose dead letters were replayed and done
  // becomes `applied`. A plan left `approved` (the daemon stopped between
  // the approval's write and the submit: Apply moves an approved plan on
  // only after submitting its work) for options.resume_after_ms is applied
  // (as Apply, by "idem"; the work ids are the plan's, so nothing submitted
  // runs twice). Walks `settle_batch` plans of each state per call,
  // resuming where the last call stopped; returns how many it changed.
  // Called by the scheduler.
  StatusOr<size_t> SettleFromJournal();

  struct Impl;

 private:
  explicit PlanEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// JSON of a plan for the API: the stored plan plus its run_id.
Json PlanJson(const Plan& plan);

}  // namespace idem
