#include "daemon/plans/plan_engine.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <regex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "daemon/apply/work_identity.h"
#include "daemon/core/crypto.h"
#include "daemon/core/json_schema.h"
#include "daemon/core/mutex.h"
#include "daemon/decide/jsonlogic.h"
#include "daemon/obs/log.h"
#include "daemon/obs/trace.h"
#include "daemon/store/journal_rules.h"

namespace idem {
namespace {

constexpr const char* kSystemActor = "idem";
// Waiting plans an identity-changing edit is checked against (CheckRetarget).
constexpr size_t kRetargetScan = 10'000;

// A waiting plan whose policy expires it, at or past its deadline.
bool PastDeadline(const Plan& p, int64_t now_ms) {
  if (!p.approval.is_object() || p.approval.value("on_timeout", "expire") != "expire") return false;
  const int64_t deadline = p.approval.value("expires_at_ms", int64_t{0});
  return deadline > 0 && now_ms >= deadline;
}

// An action's kind, "" when it names none (ActionKind): such an action
// matches no configured kind and is reported as naming none.
std::string KindOf(const Json& action) { return ActionKind(action).value_or(""); }

// What an action of an unconfigured kind is told.
Status UnknownKind(const std::string& kind) {
  if (kind.empty()) {
    return NotFound(
        "the action names no kind: \"kind\" is a string, one of the kinds under "
        "actions: in the config");
  }
  return NotFound("unknown action kind '" + kind + "'");
}

bool IsState(const Plan& p, std::initializer_list<std::string_view> states) {
  for (std::string_view s : states) {
    if (p.state == s) return true;
  }
  return false;
}

// Why a plan needs a human: one entry per action a policy gates.
struct Verdict {
  Json reasons = Json::array();
  int64_t timeout_ms = 0;  // the shortest timeout among the gating policies
  std::string on_timeout = "expire";
  bool required() const { return !reasons.empty(); }
};

// Long polls on plans (PlanEngine::Watch), fired by a change of their plan,
// by their deadline (a timer thread of their own), or at destruction. On a
// shared store another daemon's change calls no Changed here: with
// `updated_at` (a plan's updated_at_ms as stored), the timer thread reads
// each watched plan every kSharedPollMs and fires the polls of those that
// moved since they were read.
class PlanWatches {
 public:
  using Clock = std::chrono::steady_clock;
  using UpdatedAt = std::function<StatusOr<int64_t>(const std::string& plan_id)>;
  static constexpr std::chrono::milliseconds kSharedPollMs{500};

  explicit PlanWatches(UpdatedAt updated_at = nullptr)
      : updated_at_(std::move(updated_at)), timer_([this] { RunTimer(); }) {}
  ~PlanWatches() {
    std::vector<std::function<void()>> left;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      for (auto& [id, w] : all_) left.push_back(std::move(w.fire));
      all_.clear();
      by_plan_.clear();
      deadlines_.clear();
    }
    cv_.notify_all();
    timer_.join();
    for (auto& f : left) f();
  }

  uint64_t Generation() const {
    std::lock_guard<std::mutex> lock(mu_);
    return generation_;
  }

  bool Add(const std::string& plan_id, uint64_t seen, int64_t seen_updated_at_ms,
           Clock::time_point deadline, size_t max, std::function<void()> fire) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (all_.size() >= max) return false;
      if (generation_ == seen && !stopping_) {
        const uint64_t id = next_id_++;
        all_.emplace(id, Entry{plan_id, seen_updated_at_ms, std::move(fire)});
        by_plan_.emplace(plan_id, id);
        const bool earliest = deadlines_.empty() || deadline < deadlines_.begin()->first;
        deadlines_.emplace(deadline, id);
        if (earliest) cv_.notify_all();
        return true;
      }
    }
    fire();  // changed since the caller looked (or stopping): answer now
    return true;
  }

  void Changed(const std::string& plan_id) {
    std::vector<std::function<void()>> due;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++generation_;
      auto [lo, hi] = by_plan_.equal_range(plan_id);
      for (auto it = lo; it != hi; ++it) {
        auto w = all_.find(it->second);
        if (w == all_.end()) continue;
        due.push_back(std::move(w->second.fire));
        all_.erase(w);  // its deadline entry is skipped when it comes up
      }
      by_plan_.erase(lo, hi);
    }
    for (auto& f : due) f();
  }

 private:
  struct Entry {
    std::string plan_id;
    int64_t seen_updated_at_ms = 0;  // the plan as the poller read it
    std::function<void()> fire;
  };

  // Fires the polls whose plan another daemon changed (shared stores).
  // Called with `lock` held; releases it while it reads the store.
  void PollShared(std::unique_lock<std::mutex>& lock) {
    std::map<std::string, int64_t> plans;  // plan_id -> the oldest version a poll saw
    for (const auto& [id, e] : all_) {
      auto [it, fresh] = plans.emplace(e.plan_id, e.seen_updated_at_ms);
      if (!fresh) it->second = std::min(it->second, e.seen_updated_at_ms);
    }
    lock.unlock();
    std::map<std::string, int64_t> now;
    for (const auto& [plan_id, seen] : plans) {
      StatusOr<int64_t> at = updated_at_(plan_id);
      if (at.ok() && *at != seen) now[plan_id] = *at;  // errors: the next round looks again
    }
    lock.lock();
    std::vector<std::function<void()>> due;
    for (auto it = all_.begin(); it != all_.end();) {
      auto moved = now.find(it->second.plan_id);
      if (moved == now.end() || moved->second == it->second.seen_updated_at_ms) {
        ++it;
        continue;
      }
      due.push_back(std::move(it->second.fire));
      auto [lo, hi] = by_plan_.equal_range(it->second.plan_id);
      for (auto b = lo; b != hi; ++b) {
        if (b->second == it->first) {
          by_plan_.erase(b);
          break;
        }
      }
      it = all_.erase(it);  // its deadline entry is skipped when it comes up
    }
    if (due.empty()) return;
    lock.unlock();
    for (auto& f : due) f();
    lock.lock();
  }

  void RunTimer() {
    std::unique_lock<std::mutex> lock(mu_);
    Clock::time_point next_poll = Clock::now() + kSharedPollMs;
    while (!stopping_) {
      if (updated_at_ && !all_.empty() && Clock::now() >= next_poll) {
        PollShared(lock);
        next_poll = Clock::now() + kSharedPollMs;
        continue;
      }
      if (deadlines_.empty()) {
        if (updated_at_ && !all_.empty()) {
          cv_.wait_until(lock, next_poll);
        } else {
          cv_.wait(lock);
          next_poll = Clock::now() + kSharedPollMs;
        }
        continue;
      }
      auto first = deadlines_.begin();
      if (Clock::now() < first->first) {
        // A copy: the node may be gone (cleared by the destructor) when the
        // wait reads its deadline again.
        Clock::time_point when = first->first;
        if (updated_at_ && !all_.empty()) when = std::min(when, next_poll);
        cv_.wait_until(lock, when);
        continue;
      }
      const uint64_t id = first->second;
      deadlines_.erase(first);
      auto w = all_.find(id);
      if (w == all_.end()) continue;  // fired by a change already
      std::function<void()> fire = std::move(w->second.fire);
      auto [lo, hi] = by_plan_.equal_range(w->second.plan_id);
      for (auto it = lo; it != hi; ++it) {
        if (it->second == id) {
          by_plan_.erase(it);
          break;
        }
      }
      all_.erase(w);
      lock.unlock();
      fire();
      lock.lock();
    }
  }

  const UpdatedAt updated_at_;  // null: one process owns the store
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  uint64_t generation_ = 0;
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, Entry> all_;
  std::unordered_multimap<std::string, uint64_t> by_plan_;
  std::multimap<Clock::time_point, uint64_t> deadlines_;  // may name fired polls
  std::thread timer_;                                     // last: started once the rest is built
};

// The plan that gates one unit of work of a kind with an approval rule (one
// plan per unit of work: the same call again finds it).
std::string GatePlanId(const std::string& work_id) {
  return "plan_" + Sha256Hex("gate:" + work_id).substr(0, 32);
}

}  // namespace

struct PlanEngine::Impl {
  Impl(const Config& config, Store& store, ApplyEngine& apply, StableClock& clock, Metrics& metrics,
       Notifier& notifier, PlanEngineOptions options)
      : config(config),
        store(store),
        apply(apply),
        clock(clock),
        metrics(metrics),
        notifier(notifier),
        options(options),
        watches(store.shared()
                    ? PlanWatches::UpdatedAt([&store](const std::string& id) -> StatusOr<int64_t> {
                        ASSIGN_OR_RETURN(Plan p, store.plans().Get(id));
                        return p.updated_at_ms;
                      })
                    : PlanWatches::UpdatedAt()) {}

  const Config& config;
  Store& store;
  ApplyEngine& apply;
  StableClock& clock;
  Metrics& metrics;
  Notifier& notifier;
  PlanEngineOptions options;
  std::map<std::string, std::unique_ptr<JsonSchema>> args_schemas;  // kind -> compiled

  PlanWatches watches;  // long polls on plans

  // Where the sweeps' walks over the plans of a state resume (List cursors
  // by state; empty: from the newest).
  Mutex walk_mu;
  std::map<std::string, std::string> walk_cursors GUARDED_BY(walk_mu);

  // The next plans in `state` for a sweep: up to `pages` pages of `batch`,
  // newest first, resuming where the last walk over that state stopped, so
  // every plan in it is looked at within a few passes however many there
  // are (and plans that never end cannot hide the ones behind them).
  StatusOr<std::vector<Plan>> Walk(const std::string& state, size_t batch, size_t pages) {
    std::vector<Plan> out;
    MutexLock lock(walk_mu);
    std::string& cursor = walk_cursors[state];
    for (size_t n = 0; n < pages; ++n) {
      auto page = store.plans().List(state, batch, cursor);
      if (!page.ok()) {
        cursor.clear();  // a cursor the store no longer takes: start over
        return page.status();
      }
      for (Plan& p : page->items) out.push_back(std::move(p));
      cursor = page->next_cursor;
      if (cursor.empty()) break;  // the walk is complete: the next one starts anew
    }
    return out;
  }

  void Changed(const std::string& plan_id) { watches.Changed(plan_id); }

  bool AuthEnabled() const { return !config.auth.tokens.empty(); }

  // Applies one policy to one action; a rule that fails to evaluate, or
  // that lets the action through with a doubt EvalJsonLogic reports (a var
  // absent or null without a default, a comparison with a value that is no
  // number: a missing amount is not "not over 100"), gates the action
  // (fail closed) and says why.
  void Judge(const ApprovalPolicy& policy, const Json& data, size_t index, const std::string& kind,
             Verdict& v) const {
    bool needs = policy.require == "always";
    std::string reason = policy.reason;
    if (policy.require == "when") {
      std::vector<std::string> unresolved;
      auto result = EvalJsonLogic(policy.when, data, JsonLogicLimits{}, &unresolved);
      if (!result.ok()) {
        needs = true;
        reason = "the approval rule of " + policy.source +
                 " could not be evaluated: " + result.status().message();
      } else if (JsonLogicTruthy(*result)) {
        needs = true;
      } else if (!unresolved.empty()) {
        needs = true;
        reason = "the approval rule of " + policy.source +
                 " cannot judge this action: " + unresolved.front() +
                 " (a var with a default says what its absence means)";
      }
    }
    if (needs) Gate(v, index, kind, reason, policy);
  }

  // Action `index` needs a human, for `reason`, within `policy`'s timeout.
  static void Gate(Verdict& v, size_t index, const std::string& kind, const std::string& reason,
                   const ApprovalPolicy& policy) {
    v.reasons.push_back({{"index", index}, {"kind", kind}, {"reason", reason}});
    if (v.timeout_ms == 0 || policy.timeout_ms < v.timeout_ms) {
      v.timeout_ms = policy.timeout_ms;
      v.on_timeout = policy.on_timeout;
    }
  }

  // Every action of `plan` against its step's and its kind's policies.
  Verdict Judge(const Plan& plan, const Decision* decision) const {
    Verdict v;
    const ApprovalPolicy* step_policy = nullptr;
    if (!plan.step.empty()) {
      auto sit = config.steps.find(plan.step);
      if (sit != config.steps.end() && sit->second.approval) step_policy = &*sit->second.approval;
    }
    Json plan_view = {{"plan_id", plan.plan_id},
                      {"origin", plan.origin},
                      {"step", plan.step},
                      {"actions", plan.actions}};
    Json decision_view;
    Json input;
    if (decision != nullptr) {
      decision_view = {{"decision_id", decision->decision_id},
                       {"step", decision->step},
                       {"output", decision->output},
                       {"provider", decision->provider},
                       {"model", decision->model},
                       {"decided_by", decision->decided_by}};
      if (decision->material.is_object()) input = decision->material.value("input", Json());
    }
    for (size_t i = 0; i < plan.actions.size(); ++i) {
      const Json& a = plan.actions[i];
      std::string kind = KindOf(a);
      Json args = a.is_object() ? a.value("args", Json::object()) : Json::object();
      Json data = {{"plan", plan_view},
                   {"action", {{"index", i}, {"kind", kind}, {"args", args}}},
                   {"args", args},
                   {"decision", decision_view},
                   {"input", input}};
      if (step_policy != nullptr) Judge(*step_policy, data, i, kind, v);
      auto kit = config.actions.find(kind);
      if (kit != config.actions.end() && kit->second.approval) {
        Judge(*kit->second.approval, data, i, kind, v);
      }
      // Args the kind's schema refuses (a model's output that a ticket can
      // steer) go to a human, who edits or rejects them: a rule over them
      // may not mean what its author meant (a missing amount is not > 100).
      if (Status valid = CheckActionArgs(kind, args, "/" + std::to_string(i) + "/args");
          !valid.ok()) {
        ApprovalPolicy fallback;  // its timeout and on_timeout are the defaults
        const ApprovalPolicy& p = kit != config.actions.end() && kit->second.approval
                                      ? *kit->second.approval
                                      : (step_policy != nullptr ? *step_policy : fallback);
        Gate(v, i, kind, valid.message() + " (at " + valid.field() + ")", p);
      }
    }
    return v;
  }

  // That `p`, found at GatePlanId(work_id), is the gate plan of that work:
  // no decision's, one action of `kind` whose args as proposed (before an
  // operator's edits) name that work, and whose args as they stand pass the
  // kind's schema (it may have changed since the plan was made). Anything
  // else is refused, never run.
  Status CheckGatePlan(const Plan& p, const ActionConfig& kind, const std::string& work_id) const {
    const Json& proposed = p.original_actions.is_array() && !p.original_actions.empty()
                               ? p.original_actions
                               : p.actions;
    auto one_of_kind = [&](const Json& actions) {
      return actions.is_array() && actions.size() == 1 && KindOf(actions[0]) == kind.name;
    };
    const bool gate = p.decision_id.empty() && one_of_kind(proposed) && one_of_kind(p.actions);
    StatusOr<KeyMaterial> named =
        gate ? ActionWorkId(kind, proposed[0].value("args", Json()))
             : StatusOr<KeyMaterial>(FailedPrecondition("not a gate plan"));
    if (!named.ok() || named->key != work_id) {
      return Status(Code::kFailedPrecondition,
                    "plan " + p.plan_id + " is not the approval plan of this work; it is not run",
                    "/args");
    }
    if (!IsState(p, {"approved", "applying", "applied", "partially_failed", "proposed"})) {
      return Status::Ok();  // nothing of it runs
    }
    return CheckActionArgs(kind.name, p.actions[0].value("args", Json()), "/args");
  }

  // `args` of an action of `kind` against the kind's args_schema (OK when it
  // has none or the kind is unknown): InvalidArgument at `at` + the pointer.
  Status CheckActionArgs(const std::string& kind, const Json& args, const std::string& at) const {
    auto it = args_schemas.find(kind);
    if (it == args_schemas.end()) return Status::Ok();
    std::vector<SchemaError> errors = it->second->Errors(args);
    if (errors.empty()) return Status::Ok();
    return InvalidArgument("args do not match the args_schema of " + kind + ": " +
                               (errors[0].pointer.empty() ? "" : errors[0].pointer + ": ") +
                               errors[0].message,
                           at + errors[0].pointer);
  }

  void ApplyVerdict(Plan& plan, const Verdict& v, int64_t now) const {
    plan.state = v.required() ? "awaiting_approval" : "proposed";
    plan.approval = {{"required", v.required()}, {"reasons", v.reasons}};
    if (v.required()) {
      plan.approval["expires_at_ms"] = now + v.timeout_ms;
      plan.approval["on_timeout"] = v.on_timeout;
    }
  }

  // Stores a new plan (with its audit event when it waits for a human) and
  // notifies; a concurrent creator's plan wins and is returned.
  StatusOr<Plan> Create(Plan plan) {
    const bool waits = plan.state == "awaiting_approval";
    if (plan.trace_id.empty()) plan.trace_id = CurrentTraceId();
    AuditEvent event;
    event.at_ms = plan.created_at_ms;
    event.actor = plan.created_by;
    event.action = "plan.awaiting_approval";
    event.detail = {{"origin", plan.origin},
                    {"reasons", plan.approval.value("reasons", Json::array())},
                    {"actions", plan.actions}};
    if (!plan.decision_id.empty()) event.detail["decision_id"] = plan.decision_id;
    if (!plan.trace_id.empty()) event.detail["trace_id"] = plan.trace_id;
    Status put = store.plans().Put(plan, waits ? &event : nullptr);
    if (put.code() == Code::kAlreadyExists) return store.plans().Get(plan.plan_id);
    RETURN_IF_ERROR(put);
    RecordTraceEvent(
        "plan", plan.plan_id,
        TraceDetail({{"state", plan.state}, {"origin", plan.origin}, {"step", plan.step}}));
    if (waits) {
      metrics.plans_awaiting_approval.Inc();
      NotifyAwaiting(plan);
    } else {
      metrics.plans_proposed.Inc();
    }
    Changed(plan.plan_id);
    return plan;
  }

  // A waiting plan's notification. Each wait is its own event (a gate plan
  // waits again for the next call after its window): `kind` and the time
  // the wait began name it, so the notifier's journal sends each once.
  static Notification PlanNotification(const Plan& plan, const std::string& kind, int64_t wait_ms) {
    Notification n;
    n.event_id = plan.plan_id + ":" + kind + ":" + std::to_string(wait_ms);
    n.kind = kind;
    n.subject_id = plan.plan_id;
    std::string reasons;
    for (const Json& r : plan.approval.value("reasons", Json::array())) {
      if (!reasons.empty()) reasons += "; ";
      reasons += r.value("kind", "") + ": " + r.value("reason", "");
    }
    n.reason = reasons;
    n.command =
        "idem approve " + plan.plan_id + "   (or: idem reject " + plan.plan_id + " --reason TEXT)";
    n.link = "/ui/#/plans/" + plan.plan_id;
    n.detail = {{"plan_id", plan.plan_id},
                {"origin", plan.origin},
                {"created_by", plan.created_by},
                {"actions", plan.actions}};
    return n;
  }

  void NotifyAwaiting(const Plan& plan) {
    notifier.Notify(PlanNotification(plan, "awaiting_approval", plan.updated_at_ms));
  }

  StatusOr<Plan> Transition(const std::string& plan_id, const std::string& from,
                            const std::string& to, const std::string& actor,
                            const std::string& note, Json detail,
                            std::function<Status(Plan&)> mutate = {},
                            const std::string& action = "") {
    AuditEvent event;
    event.at_ms = clock.NowMillis();
    event.actor = actor;
    event.action = action.empty() ? "plan." + to : action;
    event.detail = std::move(detail);
    if (!note.empty()) event.detail["note"] = note;
    if (const TraceContext* trace = CurrentTrace()) event.detail["trace_id"] = trace->trace_id;
    PlanChange change{.from = from,
                      .to = to,
                      .actor = actor,
                      .note = note,
                      .now_ms = event.at_ms,
                      .mutate = std::move(mutate),
                      .audit = &event};
    ASSIGN_OR_RETURN(Plan p, store.plans().Change(plan_id, change));
    Changed(plan_id);
    return p;
  }

  // Whether gate plan `p` approved one execution of work `work_id` that is
  // over: applied, and the work's done record has outlived its window (or
  // was swept). The same identity is then new work, which no earlier
  // approval covers.
  StatusOr<bool> ApprovalSpent(const Plan& p, const std::string& work_id) {
    if (!IsState(p, {"applied", "partially_failed"})) return false;
    auto w = store.journal().Get(work_id);
    if (!w.ok()) {
      if (w.status().code() == Code::kNotFound) return true;
      return w.status();
    }
    return journal_rules::Expired(*w, clock.NowMillis());
  }

  // Gate plan `spent` (ApprovalSpent) waits again, for `fresh`'s action:
  // made by `caller`, with verdict `v`; its earlier life stays in its history
  // and the audit log. A concurrent call that re-gated it first wins.
  StatusOr<Plan> Regate(const Plan& spent, Plan fresh, const Verdict& v,
                        const std::string& caller) {
    const int64_t now = clock.NowMillis();
    ApplyVerdict(fresh, v, now);
    auto waiting = Transition(
        spent.plan_id, spent.state, "awaiting_approval", caller,
        "its work ran and its window ended: the same identity is new work, which needs its "
        "own approval",
        {{"origin", fresh.origin},
         {"reasons", fresh.approval.value("reasons", Json::array())},
         {"actions", fresh.actions}},
        [&](Plan& p) {
          p.origin = fresh.origin;
          p.actions = fresh.actions;
          p.original_actions = Json();
          p.approval = fresh.approval;
          p.created_by = caller;
          p.approved_by.clear();
          p.rejected_by.clear();
          p.comment.clear();
          p.reason.clear();
          p.trace_id = CurrentTraceId();
          return Status::Ok();
        });
    if (!waiting.ok()) {
      if (waiting.status().code() != Code::kFailedPrecondition) return waiting.status();
      return store.plans().Get(spent.plan_id);  // another call re-gated it
    }
    metrics.plans_awaiting_approval.Inc();
    NotifyAwaiting(*waiting);
    return waiting;
  }

  // The decision that took the place of plan `p`'s: a promote, a decide
  // with cache=refresh, or a decide after its window stored another
  // answer under the same key. Its id, or "" while p's decision is still
  // its key's (or the key holds none, or p is not a decision's plan).
  StatusOr<std::string> SupersededBy(const Plan& p) {
    if (p.decision_id.empty()) return std::string();
    auto d = store.decisions().Get(p.decision_id);
    if (!d.ok()) {
      if (d.status().code() == Code::kNotFound) return std::string();  // swept
      return d.status();
    }
    auto current = store.decisions().GetByKey(d->decision_key, clock.NowMillis());
    if (!current.ok()) {
      if (current.status().code() == Code::kNotFound) return std::string();
      return current.status();
    }
    return current->decision_id == p.decision_id ? std::string() : current->decision_id;
  }

  // Moves plan `p` (proposed or awaiting approval) to rejected by `actor`
  // for `reason`, with `detail` in its audit event; FailedPrecondition when
  // another call moved it first.
  StatusOr<Plan> MarkRejected(const Plan& p, const std::string& actor, const std::string& reason,
                              Json detail) {
    auto rejected =
        Transition(p.plan_id, p.state, "rejected", actor, reason, std::move(detail), [&](Plan& q) {
          q.rejected_by = actor;
          q.reason = reason;
          return Status::Ok();
        });
    if (rejected.ok()) metrics.plans_rejected.Inc();
    return rejected;
  }

  // Ends plan `p` (proposed or awaiting approval, nothing submitted) whose
  // decision `by` superseded: rejected, by `actor`, without the holds a
  // human's rejection leaves (the new decision's plan may run the same
  // work). `p` becomes the plan as stored afterwards; the error for a
  // caller who wanted it to run. `moved`, if given, says whether this call
  // made the change (false: another call moved the plan first).
  Status RetireSuperseded(Plan& p, const std::string& by, const std::string& actor,
                          bool* moved = nullptr) {
    const std::string reason = "superseded: decision " + by + " now answers the input of " +
                               p.decision_id + " (a promote, or a new decide of that input); " +
                               "its plan is " + PlanEngine::DecisionPlanId(by);
    auto retired = MarkRejected(p, actor, reason, {{"reason", reason}, {"superseded_by", by}});
    if (moved != nullptr) *moved = retired.ok();
    if (retired.ok()) {
      p = std::move(retired).value();
    } else if (retired.status().code() == Code::kFailedPrecondition) {
      ASSIGN_OR_RETURN(p, store.plans().Get(p.plan_id));  // another call moved it first
    } else {
      return retired.status();
    }
    return FailedPrecondition("plan " + p.plan_id + " is " + p.state + " (" + p.reason +
                              "); it will never be applied");
  }

  // OK while plan `p`, not yet applied, may still run; otherwise retires it
  // (RetireSuperseded) and answers why it will not.
  Status CheckCurrent(Plan& p, const std::string& actor) {
    if (!IsState(p, {"proposed", "awaiting_approval"})) return Status::Ok();
    ASSIGN_OR_RETURN(std::string by, SupersededBy(p));
    if (by.empty()) return Status::Ok();
    return RetireSuperseded(p, by, actor);
  }

  // The plan `id` names: a plan id, or a decision id (its plan is proposed
  // now if the decision predates plans at decide time).
  StatusOr<Plan> Resolve(const std::string& id, const std::string& actor, PlanEngine& engine) {
    if (id.rfind("dec_", 0) == 0) {
      ASSIGN_OR_RETURN(Decision d, store.decisions().Get(id));
      return engine.ProposeFromDecision(d, actor);
    }
    return store.plans().Get(id);
  }

  // The action's work as the journal knows it (NotFound before any claim).
  StatusOr<WorkItem> WorkOf(const Json& action) const {
    std::string kind = KindOf(action);
    auto kit = config.actions.find(kind);
    if (kit == config.actions.end()) return UnknownKind(kind);
    ASSIGN_OR_RETURN(KeyMaterial id, ActionWorkId(kit->second, action.value("args", Json())));
    return store.journal().Get(id.key);
  }

  bool ClientExecuted(const std::string& kind) const {
    auto kit = config.actions.find(kind);
    return kit != config.actions.end() && kit->second.effector.empty();
  }

  // Why action `a` of a decision's plan may not run: its work has a gate
  // plan of its own (a direct call, a run, or a rejected decision plan
  // left one) that a human has not let through: waiting, refused or
  // expired. That plan is where the work is decided. OK otherwise.
  Status HeldElsewhere(const Json& a, const std::string& plan_id) const {
    auto kit = config.actions.find(KindOf(a));
    if (kit == config.actions.end() || !kit->second.approval) return Status::Ok();
    auto work = ActionWorkId(kit->second, a.value("args", Json()));
    if (!work.ok()) return Status::Ok();  // its args are checked (and refused) elsewhere
    auto gate = store.plans().Get(GatePlanId(work->key));
    if (!gate.ok()) return gate.status().code() == Code::kNotFound ? Status::Ok() : gate.status();
    if (gate->plan_id == plan_id || !IsState(*gate, {"awaiting_approval", "rejected", "expired"})) {
      return Status::Ok();
    }
    std::string why = gate->state == "rejected"
                          ? "was rejected by " + gate->rejected_by + ": " + gate->reason
                      : gate->state == "expired" ? "expired before anyone approved it"
                                                 : "is waiting for an operator";
    return FailedPrecondition("its work (" + kit->first + " " + work->key.substr(0, 12) +
                              "…) has a plan of its own, " + gate->plan_id + ", which " + why +
                              "; no other plan runs it");
  }

  // A decision plan refused by a human leaves its approval-gated work
  // refused too: a gate plan in state rejected for each such action whose
  // work has none, so a direct call, a run or another decision's plan for
  // the same work is refused as after a gate plan's own rejection.
  void HoldRejected(const Plan& rejected, const std::string& actor, const std::string& reason,
                    int64_t now) {
    for (const Json& a : rejected.actions) {
      auto kit = config.actions.find(KindOf(a));
      if (kit == config.actions.end() || !kit->second.approval) continue;
      auto work = ActionWorkId(kit->second, a.value("args", Json()));
      if (!work.ok()) continue;
      Plan hold;
      hold.plan_id = GatePlanId(work->key);
      hold.origin = "action";
      hold.state = "rejected";
      hold.actions = Json::array({{{"kind", kit->first}, {"args", a.value("args", Json())}}});
      hold.approval = {
          {"required", true},
          {"reasons", Json::array({{{"index", 0},
                                    {"kind", kit->first},
                                    {"reason", "rejected with plan " + rejected.plan_id}}})}};
      hold.created_by = actor;
      hold.rejected_by = actor;
      hold.reason = reason + " (plan " + rejected.plan_id + ")";
      hold.history = Json::array({{{"from", "proposed"},
                                   {"to", "rejected"},
                                   {"actor", actor},
                                   {"note", hold.reason},
                                   {"at_ms", now}}});
      hold.created_at_ms = now;
      hold.updated_at_ms = now;
      Status put = store.plans().Put(hold);  // AlreadyExists: the work has its own plan
      if (put.ok()) Changed(hold.plan_id);
    }
  }

  // A decision plan's approval-gated action that a client executes: the
  // plan's verdict (approved by a human, or let through by the rule) is
  // written as that work's gate plan, with the plan's args (an operator's
  // edits included). The client's claim then finds its work let through,
  // with those args, instead of opening an approval of its own with
  // whatever args it brings. A work that has a gate plan keeps it.
  void MirrorVerdict(const Plan& from, const Json& a, int64_t now) {
    auto kit = config.actions.find(KindOf(a));
    if (kit == config.actions.end() || !kit->second.approval) return;
    auto work = ActionWorkId(kit->second, a.value("args", Json()));
    if (!work.ok()) return;
    const bool approved = !from.approved_by.empty();
    const std::string note =
        (approved ? "approved with plan " : "let through with plan ") + from.plan_id;
    Plan gate;
    gate.plan_id = GatePlanId(work->key);
    gate.origin = "action";
    gate.state = approved ? "approved" : "proposed";
    gate.actions = Json::array({{{"kind", kit->first}, {"args", a.value("args", Json())}}});
    gate.approval = {
        {"required", approved},
        {"reasons", Json::array({{{"index", 0}, {"kind", kit->first}, {"reason", note}}})}};
    gate.created_by = from.created_by;
    gate.approved_by = from.approved_by;
    gate.history = Json::array({{{"from", "proposed"},
                                 {"to", gate.state},
                                 {"actor", approved ? from.approved_by : kSystemActor},
                                 {"note", note},
                                 {"at_ms", now}}});
    gate.created_at_ms = now;
    gate.updated_at_ms = now;
    Status put = store.plans().Put(gate);  // AlreadyExists: the work has its own plan
    if (put.ok()) Changed(gate.plan_id);
  }

  // An edit that changes an action's identity makes it another unit of
  // work. When that work has a gate plan of its own still waiting for a
  // human, or refused by one, approving this plan must not run it: that
  // would approve it without its own approval (and past separation of
  // duties), or run what was rejected. That plan is the place to decide it.
  //
  // The same holds for a decision's plan that holds that work and waits:
  // its creator could otherwise run it through another's plan. Those are
  // found among the waiting plans (up to kRetargetScan of them; an edit
  // that changes identity is rare, an operator's act).
  Status CheckRetarget(const ActionConfig& kind, const Json& original, const std::string& work_id,
                       size_t index, const std::string& at) const {
    auto before = ActionWorkId(kind, original.value("args", Json()));
    if (before.ok() && before->key == work_id) return Status::Ok();
    auto held_by = [&](const Plan& other) {
      return Status(Code::kFailedPrecondition,
                    "the edited args of action " + std::to_string(index) + " name other work (" +
                        kind.name + " " + work_id.substr(0, 12) + "…), whose own plan " +
                        other.plan_id + " is " + other.state +
                        ": decide that plan there, or edit only what keeps this action's identity",
                    at);
    };
    if (kind.approval) {
      auto other = store.plans().Get(GatePlanId(work_id));
      if (!other.ok() && other.status().code() != Code::kNotFound) return other.status();
      if (other.ok() && IsState(*other, {"awaiting_approval", "rejected", "expired"})) {
        return held_by(*other);
      }
    }
    ASSIGN_OR_RETURN(std::vector<Plan> waiting,
                     store.plans().ByState("awaiting_approval", kRetargetScan));
    for (const Plan& other : waiting) {
      for (const Json& a : other.actions) {
        if (KindOf(a) != kind.name) continue;
        auto theirs = ActionWorkId(kind, a.value("args", Json()));
        if (theirs.ok() && theirs->key == work_id) return held_by(other);
      }
    }
    return Status::Ok();
  }

  // Edits [{path, value}] applied to a copy of `actions`; each edited
  // action is checked against its kind's args schema and identity, and
  // each other one against its schema (it runs as it is).
  StatusOr<Json> Edit(const Json& actions, const Json& edits) const {
    if (edits.is_null()) return Edit(actions, Json::array());
    if (!edits.is_array())
      return InvalidArgument("edits must be a list of {path, value}", "/edits");
    static const std::regex kPath(R"(^/(0|[1-9][0-9]{0,5})/args(/.*)?$)");
    Json out = actions;
    std::vector<int> touched(actions.size(), -1);  // the last edit of each action
    for (size_t i = 0; i < edits.size(); ++i) {
      const std::string at = "/edits/" + std::to_string(i);
      const Json& e = edits[i];
      if (!e.is_object() || !e.contains("path") || !e["path"].is_string() || !e.contains("value")) {
        return InvalidArgument("an edit is {path, value}", at);
      }
      std::string path = e["path"];
      std::smatch m;
      if (!std::regex_match(path, m, kPath)) {
        return InvalidArgument("an edit's path points into an action's args: /<index>/args/...",
                               at + "/path");
      }
      // RFC 6901: a '~' is the start of ~0 ('~') or ~1 ('/'), nothing else.
      for (size_t t = path.find('~'); t != std::string::npos; t = path.find('~', t + 1)) {
        if (t + 1 >= path.size() || (path[t + 1] != '0' && path[t + 1] != '1')) {
          return InvalidArgument("an edit's path writes '~' as ~0 and '/' as ~1 (RFC 6901); " +
                                     path + " has a '~' followed by neither",
                                 at + "/path");
        }
      }
      size_t index = std::stoul(m[1].str());
      if (index >= out.size()) {
        return InvalidArgument("the plan has no action " + m[1].str(), at + "/path");
      }
      try {
        Json::json_pointer ptr(path);
        Json::json_pointer parent = ptr.parent_pointer();
        if (path != "/" + m[1].str() + "/args") {
          if (!out.contains(parent)) {
            return InvalidArgument("no such place in the action: " + parent.to_string(),
                                   at + "/path");
          }
          // Into an object or a list only (writing into a null would make
          // it one), and in a list at an item or just past the last one:
          // an index further on would fill the list with nulls up to it
          // (one 57-byte edit made a list of two million).
          const Json& holder = out.at(parent);
          if (!holder.is_object() && !holder.is_array()) {
            return InvalidArgument("no such place in the action: " + path + " goes into " +
                                       parent.to_string() + ", which is not an object or a list",
                                   at + "/path");
          }
          const std::string last = ptr.back();
          if (holder.is_array() && last != "-" &&
              (last.empty() || last.size() > 9 ||
               last.find_first_not_of("0123456789") != std::string::npos ||
               (last.size() > 1 && last[0] == '0') || std::stoul(last) > holder.size())) {
            return InvalidArgument("in the list at " + parent.to_string() + " (" +
                                       std::to_string(holder.size()) +
                                       " items) an edit changes an item or adds one at its end "
                                       "(index " +
                                       std::to_string(holder.size()) + " or -)",
                                   at + "/path");
          }
        }
        out[ptr] = e["value"];
      } catch (const std::exception&) {
        // nlohmann refuses a step into a string or number, or an array
        // index that is not one: say where, not the library's words.
        return InvalidArgument("no such place in the action: " + path +
                                   " goes into a value that is not an object or array, or uses "
                                   "an index that is not a number",
                               at + "/path");
      }
      touched[index] = static_cast<int>(i);
    }
    for (size_t i = 0; i < out.size(); ++i) {
      if (touched[i] < 0) {
        // Not edited: it runs as it is, so it too must fit its schema.
        const std::string kind = KindOf(out[i]);
        Status valid =
            CheckActionArgs(kind, out[i].is_object() ? out[i].value("args", Json()) : Json(),
                            "/" + std::to_string(i) + "/args");
        if (!valid.ok()) {
          return InvalidArgument(
              valid.message() + "; edit " + valid.field() + " (an edit's path) or reject the plan",
              "/edits");
        }
        continue;
      }
      const std::string at = "/edits/" + std::to_string(touched[i]) + "/value";
      const std::string kind = KindOf(out[i]);
      auto kit = config.actions.find(kind);
      if (kit == config.actions.end()) continue;  // reported when applied
      const Json& args = out[i]["args"];
      if (!args.is_object()) {
        return InvalidArgument("action " + std::to_string(i) + "'s args must be an object", at);
      }
      auto sit = args_schemas.find(kind);
      if (sit != args_schemas.end()) {
        Status valid = sit->second->Validate(args);
        if (!valid.ok()) {
          return InvalidArgument("the edited args of action " + std::to_string(i) + " (" + kind +
                                     ") break its args_schema: " + valid.message(),
                                 at);
        }
      }
      auto id = ActionWorkId(kit->second, args);
      if (!id.ok()) {
        return InvalidArgument("the edited args of action " + std::to_string(i) +
                                   " lack the kind's identity: " + id.status().message(),
                               at);
      }
      RETURN_IF_ERROR(CheckRetarget(kit->second, actions[i], id->key, i, at));
    }
    return out;
  }
};

PlanEngine::PlanEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PlanEngine::~PlanEngine() = default;

StatusOr<std::unique_ptr<PlanEngine>> PlanEngine::Create(const Config& config, Store& store,
                                                         ApplyEngine& apply, StableClock& clock,
                                                         Metrics& metrics, Notifier& notifier,
                                                         PlanEngineOptions options) {
  auto check = [&config](const std::optional<ApprovalPolicy>& p, const std::string& at) -> Status {
    if (!p || p->require != "when") return Status::Ok();
    Status s = CheckJsonLogicRule(p->when);
    if (!s.ok()) {
      const std::string where = s.field().empty() ? "" : " (at " + s.field() + ")";
      // The daemon tells it as a config error: file, line, this pointer
      // (the rule itself when it is inline, else the key naming its file).
      if (p->source == config.source_path) {
        return InvalidArgument("the rule is not usable: " + s.message() + where, at + "/when");
      }
      return InvalidArgument("the rule in " + p->source + " is not usable: " + s.message() + where,
                             at);
    }
    return Status::Ok();
  };
  auto impl = std::make_unique<Impl>(config, store, apply, clock, metrics, notifier, options);
  for (const auto& [name, step] : config.steps) {
    RETURN_IF_ERROR(check(step.approval, "/steps/" + name + "/approval"));
  }
  for (const auto& [name, kind] : config.actions) {
    RETURN_IF_ERROR(check(kind.approval, "/actions/" + name + "/approval"));
    if (kind.args_schema.is_object()) {
      auto compiled = JsonSchema::Create(kind.args_schema);
      if (!compiled.ok()) return compiled.status().WithField("/actions/" + name + "/args_schema");
      impl->args_schemas[name] = std::move(compiled).value();
    }
  }
  return std::unique_ptr<PlanEngine>(new PlanEngine(std::move(impl)));
}

std::string PlanEngine::DecisionPlanId(const std::string& decision_id) {
  return "plan_" + decision_id.substr(decision_id.rfind("dec_", 0) == 0 ? 4 : 0);
}

StatusOr<Plan> PlanEngine::ProposeFromDecision(const Decision& d, const std::string& caller) {
  Impl& m = *impl_;
  auto sit = m.config.steps.find(d.step);
  if (sit == m.config.steps.end() || sit->second.plan_pointer.empty()) {
    return FailedPrecondition("step " + d.step + " declares no plan (plan.pointer)");
  }
  Json::json_pointer ptr(sit->second.plan_pointer);
  if (!d.output.contains(ptr) || !d.output.at(ptr).is_array() || d.output.at(ptr).empty()) {
    return NotFound("the decision's output has no actions at " + sit->second.plan_pointer);
  }
  const std::string plan_id = DecisionPlanId(d.decision_id);
  auto existing = m.store.plans().Get(plan_id);
  if (existing.ok() && existing->decision_id != d.decision_id) {
    // Only an imported decision can name its own id; one that lands on
    // another's plan (a gate plan, say) must not take it over.
    return Status(Code::kFailedPrecondition,
                  "plan " + plan_id + " belongs to other work; decision " + d.decision_id +
                      " cannot be planned under it",
                  "path:decision_id");
  }
  if (existing.ok() || existing.status().code() != Code::kNotFound) return existing;

  const int64_t now = m.clock.NowMillis();
  Plan plan;
  plan.plan_id = plan_id;
  plan.decision_id = d.decision_id;
  plan.origin = "decision";
  plan.step = d.step;
  plan.actions = d.output.at(ptr);
  plan.created_by = caller;
  plan.created_at_ms = now;
  plan.updated_at_ms = now;
  m.ApplyVerdict(plan, m.Judge(plan, &d), now);
  // An imported decision's actions were written by whoever imported it:
  // the operator sees it, and that token may not approve them either.
  // So are a promoted decision's, by whoever chose that answer for the key.
  for (const char* by : {"imported_by", "promoted_by"}) {
    if (d.trace.is_object() && d.trace.contains(by) && d.trace[by].is_string()) {
      plan.approval[std::string("decision_") + by] = d.trace[by];
    }
  }
  return m.Create(std::move(plan));
}

StatusOr<Gate> PlanEngine::GateAction(const ActionConfig& kind, const Json& args,
                                      const std::string& origin, const std::string& caller,
                                      const std::string& run_id, const std::string& call_id) {
  Impl& m = *impl_;
  Gate gate;
  gate.args = args;
  if (!kind.approval) return gate;
  ASSIGN_OR_RETURN(KeyMaterial work, ActionWorkId(kind, args));
  const std::string plan_id = GatePlanId(work.key);
  auto existing = m.store.plans().Get(plan_id);
  if (!existing.ok() && existing.status().code() != Code::kNotFound) return existing.status();
  if (existing.ok()) {
    gate.plan = std::move(existing).value();
    RETURN_IF_ERROR(m.CheckGatePlan(gate.plan, kind, work.key));
    ASSIGN_OR_RETURN(bool spent, m.ApprovalSpent(gate.plan, work.key));
    if (spent) {
      // The approved work ran and its window is over: this call is new
      // work, judged as if the first, with its own args.
      Plan fresh;
      fresh.origin = origin;
      Json action = {{"kind", kind.name}, {"args", args}};
      if (!run_id.empty()) action["run_id"] = run_id;
      if (!call_id.empty()) action["call_id"] = call_id;
      fresh.actions = Json::array({std::move(action)});
      Verdict v = m.Judge(fresh, nullptr);
      if (!v.required()) return gate;  // the rule lets this one through
      ASSIGN_OR_RETURN(gate.plan, m.Regate(gate.plan, std::move(fresh), v, caller));
    }
  } else {
    const int64_t now = m.clock.NowMillis();
    Plan plan;
    plan.plan_id = plan_id;
    plan.origin = origin;
    Json action = {{"kind", kind.name}, {"args", args}};
    if (!run_id.empty()) action["run_id"] = run_id;
    if (!call_id.empty()) action["call_id"] = call_id;
    plan.actions = Json::array({std::move(action)});
    plan.created_by = caller;
    plan.created_at_ms = now;
    plan.updated_at_ms = now;
    Verdict v = m.Judge(plan, nullptr);
    if (!v.required()) return gate;  // the rule lets this one through
    m.ApplyVerdict(plan, v, now);
    ASSIGN_OR_RETURN(gate.plan, m.Create(std::move(plan)));
  }
  const Plan& p = gate.plan;
  if (IsState(p, {"rejected", "expired"})) {
    std::string why = p.state == "rejected" ? "rejected by " + p.rejected_by + ": " + p.reason
                                            : "expired before anyone approved it";
    return Status(Code::kFailedPrecondition, "plan " + p.plan_id + " for this work was " + why,
                  "/args");
  }
  gate.allowed = IsState(p, {"approved", "applying", "applied", "partially_failed", "proposed"});
  if (gate.allowed && p.actions.is_array() && !p.actions.empty()) {
    gate.args = p.actions[0].value("args", args);
  }
  return gate;
}

Status PlanEngine::CheckArgs(const ActionConfig& kind, const Json& args,
                             const std::string& at) const {
  return impl_->CheckActionArgs(kind.name, args, at);
}

StatusOr<PlanApplyResult> PlanEngine::Apply(const std::string& id, const std::string& actor,
                                            const std::string& request_id) {
  Impl& m = *impl_;
  PlanApplyResult out;
  ASSIGN_OR_RETURN(out.plan, m.Resolve(id, actor, *this));
  const std::string plan_id = out.plan.plan_id;
  // The plan's work belongs to the trace that made the plan (its decide),
  // whoever applies it: an approval, a timeout, a retry.
  std::optional<TraceScope> plan_trace;
  if (ValidTraceId(out.plan.trace_id) && out.plan.trace_id != CurrentTraceId()) {
    plan_trace.emplace(TraceContext::Continue(out.plan.trace_id, request_id));
  }
  // A plan whose decision another took the place of never runs (the new
  // one's plan is the input's now), whoever asks.
  RETURN_IF_ERROR(m.CheckCurrent(out.plan, kSystemActor));
  if (out.plan.state == "awaiting_approval") return out;  // the caller answers 202
  if (IsState(out.plan, {"rejected", "expired"})) {
    return FailedPrecondition("plan " + plan_id + " is " + out.plan.state +
                              "; it will never be applied");
  }
  // proposed / approved -> applying. A proposed plan moves before its work
  // is submitted (a reject racing the apply must lose). An approved one
  // moves after: nothing can reject it, and a daemon that dies between the
  // approval and the submit leaves it `approved`, which the settle sweep
  // applies (were it `applying` already, the sweep could not tell work
  // never submitted from work done and forgotten after its window).
  auto begin = [&]() -> Status {
    if (!IsState(out.plan, {"proposed", "approved"})) return Status::Ok();
    auto started = m.Transition(plan_id, out.plan.state, "applying", actor, "apply",
                                {{"request_id", request_id}});
    if (started.ok()) {
      out.plan = std::move(started).value();
    } else if (started.status().code() == Code::kFailedPrecondition) {
      ASSIGN_OR_RETURN(out.plan, m.store.plans().Get(plan_id));  // another apply began it
      if (!IsState(out.plan, {"applying", "applied", "partially_failed"})) {
        return FailedPrecondition("plan " + plan_id + " is " + out.plan.state);
      }
    } else {
      return started.status();
    }
    return Status::Ok();
  };
  const bool approved = out.plan.state == "approved";
  if (!approved) RETURN_IF_ERROR(begin());
  // applying, applied, partially_failed: submitting again redoes nothing.
  bool all_done = true;
  // Two actions of one plan that name one unit of work (their identity
  // fields match) with other args: the journal runs the work once, with
  // the first one's args, and the second would report that effect as its
  // own. It is not run, and says so.
  std::map<std::string, size_t> first_of_work;
  auto twin = [&](size_t i, const Json& a) -> Status {
    auto kit = m.config.actions.find(KindOf(a));
    if (kit == m.config.actions.end()) return Status::Ok();
    auto id = ActionWorkId(kit->second, a.value("args", Json::object()));
    if (!id.ok()) return Status::Ok();  // Submit names what is missing
    auto [first, fresh] = first_of_work.emplace(id->key, i);
    if (fresh) return Status::Ok();
    const Json& other = out.plan.actions[first->second];
    if (other.value("args", Json::object()) == a.value("args", Json::object())) {
      return Status::Ok();  // the same effect asked twice: done once, both say so
    }
    return Status(Code::kFailedPrecondition,
                  "action " + std::to_string(i) + " names the same unit of work as action " +
                      std::to_string(first->second) +
                      " (its identity fields match) with other args: a "
                      "unit of work runs once, with action " +
                      std::to_string(first->second) + "'s args, so this one was not run",
                  "/actions/" + std::to_string(i) + "/args");
  };
  for (size_t i = 0; i < out.plan.actions.size(); ++i) {
    const Json& a = out.plan.actions[i];
    PlanActionResult r;
    r.index = i;
    r.kind = KindOf(a);
    if (m.ClientExecuted(r.kind)) {
      // Client-executed work: its client claims it (the gate lets it).
      auto w = m.WorkOf(a);
      if (w.ok()) {
        ActionOutcomeKind k = w->state == WorkState::kDone   ? ActionOutcomeKind::kDuplicate
                              : w->state == WorkState::kDead ? ActionOutcomeKind::kDead
                                                             : ActionOutcomeKind::kBusy;
        r.outcome = ActionOutcome{k, *w};
      } else {
        if (!out.plan.decision_id.empty()) m.MirrorVerdict(out.plan, a, m.clock.NowMillis());
        r.outcome = Status(Code::kFailedPrecondition,
                           "client-executed kind: waiting for a client to claim it with POST "
                           "/v1/work/claim");
      }
    } else if (m.config.actions.count(r.kind) == 0) {
      r.outcome = UnknownKind(r.kind);
    } else if (Status valid = m.CheckActionArgs(r.kind, a.value("args", Json::object()),
                                                "/actions/" + std::to_string(i) + "/args");
               !valid.ok()) {
      // Never executed: a plan made before its kind had this schema, or
      // approved unedited by an older daemon.
      r.outcome = valid;
    } else if (Status held =
                   out.plan.decision_id.empty() ? Status::Ok() : m.HeldElsewhere(a, plan_id);
               !held.ok()) {
      r.outcome = held;
    } else if (Status same = twin(i, a); !same.ok()) {
      r.outcome = same;
    } else {
      // A gated call's work stays in its run (GateAction wrote it; a
      // model's output does not choose one).
      const bool own_run = out.plan.origin != "decision" && a.contains("run_id") &&
                           a["run_id"].is_string() && !a["run_id"].get<std::string>().empty();
      r.outcome = m.apply.Submit(r.kind, a.value("args", Json::object()),
                                 own_run ? a["run_id"].get<std::string>() : plan_id, request_id,
                                 out.plan.origin != "decision" ? ActionCallId(a) : "");
    }
    bool moving = !r.outcome.ok() ? r.outcome.status().code() == Code::kFailedPrecondition &&
                                        m.ClientExecuted(r.kind)
                                  : r.outcome->kind == ActionOutcomeKind::kRetrying ||
                                        r.outcome->kind == ActionOutcomeKind::kBusy;
    out.moving = out.moving || moving;
    all_done = all_done && r.outcome.ok() && r.outcome->item.state == WorkState::kDone;
    out.actions.push_back(std::move(r));
  }
  if (approved) RETURN_IF_ERROR(begin());
  // A partially_failed plan whose dead letters were replayed and done is
  // applied now.
  const bool settles =
      out.plan.state == "applying" || (out.plan.state == "partially_failed" && all_done);
  if (out.moving || !settles) return out;
  const std::string to = all_done ? "applied" : "partially_failed";
  Json detail = {{"request_id", request_id}};
  auto finished = m.Transition(plan_id, out.plan.state, to, actor, "", detail);
  if (finished.ok()) {
    out.plan = std::move(finished).value();
    (all_done ? m.metrics.plans_applied : m.metrics.plans_partially_failed).Inc();
  } else if (finished.status().code() == Code::kFailedPrecondition) {
    ASSIGN_OR_RETURN(out.plan, m.store.plans().Get(plan_id));  // a concurrent apply finished it
  } else {
    return finished.status();
  }
  return out;
}

StatusOr<PlanApplyResult> PlanEngine::Approve(const std::string& plan_id, const std::string& actor,
                                              const std::string& comment, const Json& edits,
                                              const std::string& request_id,
                                              std::optional<int64_t> expect_updated_at_ms) {
  Impl& m = *impl_;
  ASSIGN_OR_RETURN(Plan plan, m.store.plans().Get(plan_id));
  auto changed_since = [&](const Plan& now) {
    return Status(
        Code::kFailedPrecondition,
        "plan " + plan_id + " changed since it was read (updated_at_ms " +
            std::to_string(now.updated_at_ms) +
            (expect_updated_at_ms ? ", not " + std::to_string(*expect_updated_at_ms) : "") +
            "): read it again and approve what it holds now",
        "/expect_updated_at_ms");
  };
  if (expect_updated_at_ms && plan.updated_at_ms != *expect_updated_at_ms) {
    return changed_since(plan);
  }
  if (plan.state != "awaiting_approval") {
    return FailedPrecondition("plan " + plan_id + " is " + plan.state + ", not awaiting_approval");
  }
  if (m.AuthEnabled() && actor == plan.created_by) {
    return Status(Code::kPermissionDenied, "separation of duties: " + actor + " created plan " +
                                               plan_id +
                                               " and cannot approve it; another operator must");
  }
  for (const char* how : {"imported", "promoted"}) {
    if (m.AuthEnabled() && plan.approval.is_object() &&
        plan.approval.value(std::string("decision_") + how + "_by", "") == actor) {
      return Status(Code::kPermissionDenied,
                    "separation of duties: " + actor + " " + how + " the decision plan " + plan_id +
                        " comes from (its actions are the " + how +
                        " answer) and cannot approve it; another operator must");
    }
  }
  // Approving a superseded decision's plan could run both its actions and
  // those of the decision now cached for the same input.
  RETURN_IF_ERROR(m.CheckCurrent(plan, kSystemActor));
  ASSIGN_OR_RETURN(Json edited, m.Edit(plan.actions, edits));
  const bool changed = edited != plan.actions;
  Json detail = {{"comment", comment}};
  if (changed) {
    detail["edits"] = edits;
    detail["original_actions"] = plan.actions;
    detail["actions"] = edited;
  }
  if (!m.AuthEnabled()) {
    detail["separation_of_duties"] = "not enforced: no auth tokens are configured";
  }
  const int64_t now = m.clock.NowMillis();
  bool late = false;
  std::optional<Plan> moved;  // changed between the read above and this write
  auto approved =
      m.Transition(plan_id, "awaiting_approval", "approved", actor, comment, detail, [&](Plan& p) {
        // Inside the write: past its deadline a plan that expires is not
        // approvable, whether or not a sweep has expired it yet.
        if (PastDeadline(p, now)) {
          late = true;
          return FailedPrecondition("past its deadline");
        }
        // What was read (and edited) is what is approved: a plan that
        // waits again with another call's args needs its own verdict.
        if (p.actions != plan.actions ||
            (expect_updated_at_ms && p.updated_at_ms != *expect_updated_at_ms)) {
          moved = p;
          return FailedPrecondition("changed since read");
        }
        if (changed) {
          if (p.original_actions.is_null()) {
            p.original_actions = p.actions;
          }
          p.actions = edited;
        }
        p.approved_by = actor;
        p.comment = comment;
        return Status::Ok();
      });
  if (late) {
    auto expired = m.Transition(plan_id, "awaiting_approval", "expired", kSystemActor,
                                "approval timed out", {});
    if (expired.ok()) m.metrics.plans_expired.Inc();
    return FailedPrecondition("plan " + plan_id + " expired before anyone approved it (its " +
                              "deadline, expires_at_ms " +
                              std::to_string(plan.approval.value("expires_at_ms", int64_t{0})) +
                              ", has passed); it will never be applied");
  }
  if (moved) return changed_since(*moved);
  RETURN_IF_ERROR(approved.status());
  m.metrics.plans_approved.Inc();
  return Apply(plan_id, actor, request_id);
}

StatusOr<Plan> PlanEngine::Reject(const std::string& plan_id, const std::string& actor,
                                  const std::string& reason) {
  Impl& m = *impl_;
  // The reason is what the agent and the audit read: blanks say nothing.
  if (reason.find_first_not_of(" \t\r\n") == std::string::npos) {
    return InvalidArgument("a rejection needs a reason (not only blanks)", "/reason");
  }
  ASSIGN_OR_RETURN(Plan plan, m.store.plans().Get(plan_id));
  if (!IsState(plan, {"awaiting_approval", "proposed"})) {
    return FailedPrecondition("plan " + plan_id + " is " + plan.state +
                              "; only a plan not yet applied can be rejected");
  }
  auto rejected = m.MarkRejected(plan, actor, reason, {{"reason", reason}});
  if (rejected.ok() && !rejected->decision_id.empty()) {
    m.HoldRejected(*rejected, actor, reason, rejected->updated_at_ms);
  }
  return rejected;
}

StatusOr<std::string> PlanEngine::RetireSupersededPlan(const std::string& decision_id,
                                                       const std::string& actor) {
  Impl& m = *impl_;
  auto plan = m.store.plans().Get(DecisionPlanId(decision_id));
  if (!plan.ok()) {
    if (plan.status().code() == Code::kNotFound) return std::string();
    return plan.status();
  }
  if (!IsState(*plan, {"proposed", "awaiting_approval"})) return std::string();
  ASSIGN_OR_RETURN(std::string by, m.SupersededBy(*plan));
  if (by.empty()) return std::string();
  // Only the call that retired it says so: of two promotes at once, the
  // one that found it already moved retired nothing.
  bool moved = false;
  Status retired = m.RetireSuperseded(*plan, by, actor, &moved);
  if (!retired.ok() && retired.code() != Code::kFailedPrecondition) return retired;
  return moved ? plan->plan_id : std::string();
}

bool PlanEngine::Watch(const std::string& plan_id, uint64_t seen, int64_t seen_updated_at_ms,
                       int64_t wait_ms, std::function<void()> fire) {
  Impl& m = *impl_;
  wait_ms = std::clamp<int64_t>(wait_ms, 0, m.options.max_wait_ms);
  return m.watches.Add(plan_id, seen, seen_updated_at_ms,
                       std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms),
                       static_cast<size_t>(std::max(0, m.options.max_waiters)), std::move(fire));
}

uint64_t PlanEngine::Generation() const { return impl_->watches.Generation(); }

StatusOr<Json> PlanEngine::Detail(const Plan& plan) {
  Impl& m = *impl_;
  Json j = PlanJson(plan);
  if (!plan.decision_id.empty()) {
    auto d = m.store.decisions().Get(plan.decision_id);
    if (d.ok()) {
      const Json& t = d->trace;
      j["decision"] = {
          {"decision_id", d->decision_id},
          {"step", d->step},
          {"input", d->material.is_object() ? d->material.value("input", Json()) : Json()},
          {"output", d->output},
          {"provider", d->provider},
          {"model", d->model},
          {"prompt_version", d->prompt_version},
          {"status", d->status},
          {"decided_by", d->decided_by},
          {"cost_usd", t.is_object() ? t.value("cost_usd", 0.0) : 0.0},
          {"attempts", t.is_object() && t.contains("attempts") && t["attempts"].is_array()
                           ? t["attempts"].size()
                           : 0},
          {"created_at_ms", d->created_at_ms}};
    }
  }
  Json work = Json::array();
  for (size_t i = 0; i < plan.actions.size(); ++i) {
    const Json& a = plan.actions[i];
    Json w = {{"index", i}, {"kind", KindOf(a)}};
    auto item = m.WorkOf(a);
    if (item.ok()) {
      w["work_id"] = item->work_id;
      w["state"] = WorkStateName(item->state);
      w["attempt"] = item->attempt;
      if (item->state == WorkState::kDone) w["result"] = item->result;
      if (!item->external_ref.empty()) w["external_ref"] = item->external_ref;
      if (!item->last_error.empty()) w["last_error"] = item->last_error;
    } else {
      w["state"] = "not_started";
    }
    work.push_back(std::move(w));
  }
  j["work"] = std::move(work);
  return j;
}

StatusOr<size_t> PlanEngine::SettleFromJournal() {
  Impl& m = *impl_;
  size_t changed = 0;
  const int64_t now = m.clock.NowMillis();
  // Approved and never moved on: the apply that follows an approval never
  // ran (the daemon died between the approval's write and the submit; the
  // plan leaves `approved` only after its work is submitted). It runs now;
  // the work ids are the plan's, so a submit that did happen is not
  // repeated. Not at once: the apply that follows the approval may be
  // running.
  auto stranded = [&](const Plan& p) {
    return p.state == "approved" && now - p.updated_at_ms >= m.options.resume_after_ms;
  };
  for (const char* state : {"approved", "applying", "partially_failed"}) {
    ASSIGN_OR_RETURN(std::vector<Plan> plans, m.Walk(state, m.options.settle_batch, 1));
    for (const Plan& p : plans) {
      if (!p.actions.is_array()) continue;
      if (stranded(p)) {
        LogEvent(LogLevel::kWarn, "plan_resumed", {{"plan_id", p.plan_id}, {"state", p.state}});
        auto resumed = Apply(p.plan_id, kSystemActor, "resume:" + p.plan_id);
        if (resumed.ok() && resumed->plan.state != p.state) ++changed;
        continue;
      }
      if (p.state == "approved") continue;
      bool all_done = true;
      bool ended = true;
      for (const Json& a : p.actions) {
        StatusOr<WorkItem> w = a.is_object() ? m.WorkOf(a) : StatusOr<WorkItem>(NotFound(""));
        // Not in the journal yet (not submitted, or a client's not claimed)
        // or still pending, running or failed and due again: not ended.
        if (!w.ok() || (w->state != WorkState::kDone && w->state != WorkState::kDead)) {
          ended = false;
          break;
        }
        all_done = all_done && w->state == WorkState::kDone;
      }
      if (!ended) continue;
      const std::string to = all_done ? "applied" : "partially_failed";
      if (to == p.state) continue;
      auto settled = m.Transition(p.plan_id, p.state, to, kSystemActor,
                                  "every action has ended in the journal", {});
      if (!settled.ok()) continue;  // changed meanwhile (an apply, another daemon)
      (all_done ? m.metrics.plans_applied : m.metrics.plans_partially_failed).Inc();
      ++changed;
    }
  }
  return changed;
}

StatusOr<size_t> PlanEngine::ExpireDue() {
  Impl& m = *impl_;
  // Deadlines differ by kind: neither end of the queue holds all due plans.
  ASSIGN_OR_RETURN(std::vector<Plan> waiting,
                   m.Walk("awaiting_approval", m.options.expiry_batch, 4));
  const int64_t now = m.clock.NowMillis();
  size_t changed = 0;
  for (const Plan& p : waiting) {
    int64_t deadline = p.approval.value("expires_at_ms", int64_t{0});
    if (deadline <= 0 || deadline > now) continue;
    if (p.approval.value("on_timeout", "expire") == "escalate") {
      if (p.approval.value("escalated", false)) continue;
      auto esc = m.Transition(
          p.plan_id, "awaiting_approval", "awaiting_approval", kSystemActor, "approval overdue",
          {{"escalated", true}},
          [](Plan& q) -> Status {
            // Inside the write: another daemon's sweep (or this one's, a
            // pass earlier) may have escalated it since it was listed.
            if (q.approval.value("escalated", false)) {
              return FailedPrecondition("the plan's approval is escalated already");
            }
            q.approval["escalated"] = true;
            return Status::Ok();
          },
          "plan.escalated");
      if (!esc.ok()) continue;  // changed meanwhile
      Notification n = Impl::PlanNotification(p, "approval_overdue", deadline);
      n.reason = "plan " + p.plan_id + " has waited past its approval timeout (" + n.reason + ")";
      m.notifier.Notify(n);
      ++changed;
      continue;
    }
    auto expired = m.Transition(p.plan_id, "awaiting_approval", "expired", kSystemActor,
                                "approval timed out", {});
    if (expired.ok()) {
      m.metrics.plans_expired.Inc();
      ++changed;
    }
  }
  return changed;
}

Json PlanJson(const Plan& plan) {
  Json j = plan.ToJson();
  j["run_id"] = plan.plan_id;
  return j;
}

}  // namespace idem
