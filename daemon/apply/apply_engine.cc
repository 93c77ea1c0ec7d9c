#include "daemon/apply/apply_engine.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "daemon/apply/effector.h"
#include "daemon/apply/work_identity.h"
#include "daemon/core/backoff.h"
#include "daemon/core/env.h"
#include "daemon/core/failpoints.h"
#include "daemon/core/json.h"
#include "daemon/core/mutex.h"
#include "daemon/obs/log.h"
#include "daemon/obs/trace.h"

namespace idem {
namespace {

// One action kind as the engine runs it.
struct KindRuntime {
  const ActionConfig* action = nullptr;
  std::unique_ptr<Effector> effector;  // null: client-executed work
  int64_t lease_ms = 0;
  bool internal = false;          // idem's own kind: run by the workers, refused by Submit
  Counter* duplicates = nullptr;  // this kind's blocked-duplicate series (metrics.h)
};

WorkItem Scrubbed(WorkItem item) {
  item.lease_token.clear();
  return item;
}

// Whether a worker may start an attempt on `item` at `now_ms`. Due() lists
// are stale the moment they are read; this re-check on a fresh read keeps a
// worker from spending an attempt on work another one just rescheduled.
bool IsDue(const WorkItem& item, int64_t now_ms) {
  switch (item.state) {
    case WorkState::kPending:
    case WorkState::kFailed:
      return item.next_attempt_at_ms <= now_ms;
    case WorkState::kRunning:
      return item.locked_until_ms <= now_ms;
    case WorkState::kDone:
    case WorkState::kDead:
      return false;
  }
  return false;
}

// The lease holder's view of the journal for one attempt.
class JournalEffectContext final : public EffectContext {
 public:
  JournalEffectContext(Journal& journal, StableClock& clock, const WorkItem& item)
      : journal_(journal), clock_(clock), item_(item) {}
  Status RecordExternalRef(const std::string& external_ref) override {
    return journal_.RecordExternalRef(item_.work_id, item_.lease_token, external_ref,
                                      clock_.NowMillis());
  }

 private:
  Journal& journal_;
  StableClock& clock_;
  const WorkItem& item_;
};

class ApplyEngineImpl final : public ApplyEngine {
 public:
  ApplyEngineImpl(const Config& config, Journal& journal, StableClock& clock, Metrics& metrics,
                  ApplyOptions options,
                  std::unique_ptr<std::map<std::string, ActionConfig>> internal_actions,
                  std::map<std::string, KindRuntime> kinds)
      : config_(config),
        journal_(journal),
        clock_(clock),
        metrics_(metrics),
        options_(std::move(options)),
        internal_actions_(std::move(internal_actions)),
        kinds_(std::move(kinds)) {
    for (const auto& [name, kind] : kinds_) {
      if (!kind.effector) client_kinds_.push_back(name);
    }
  }
  ~ApplyEngineImpl() override { Stop(); }

  using ApplyEngine::Submit;
  StatusOr<ActionOutcome> Submit(const std::string& kind, const Json& args,
                                 const std::string& run_id, const std::string& request_id,
                                 const std::string& call_id) override;
  StatusOr<ActionOutcome> Replay(const std::string& work_id) override;
  void StartWorkers(int n) override;
  StatusOr<size_t> RunDueOnce(size_t max_items) override;
  void Stop() override;
  StatusOr<ReconcileReport> Reconcile() override;
  StatusOr<ReconcileReport> LastReconcile() const override;

 private:
  const KindRuntime* FindKind(const std::string& kind) const {
    auto it = kinds_.find(kind);
    return it == kinds_.end() ? nullptr : &it->second;
  }
  // A claim request for `item` (from Due, or a requeued dead letter).
  ClaimRequest ClaimFor(const KindRuntime& kind, const WorkItem& item) const;
  // Claims and, when granted, runs one attempt.
  StatusOr<ActionOutcome> ClaimAndRun(const KindRuntime& kind, const ClaimRequest& request);
  // Takes existing work into run `run_id` (Journal::AddToRun); a failure
  // is logged and counted, not the caller's: its work's outcome stands.
  void JoinRun(const std::string& work_id, const std::string& run_id);
  // Completes `claimed` with the effect's result, retrying a retryable store
  // error until shortly before its lease ends (kRecordMarginMs).
  Status RecordCompletion(const WorkItem& claimed, const EffectResult& effect, int64_t now);
  static constexpr int64_t kRecordMarginMs = 100;
  // One attempt under the lease of `claimed`: the effect, then its record.
  StatusOr<ActionOutcome> RunAttempt(const KindRuntime& kind, const WorkItem& claimed);
  // After Complete was refused (a stale lease): what the journal holds now.
  StatusOr<ActionOutcome> AfterLostLease(const std::string& work_id, Status refused);
  // Marks dead an item whose kind this daemon cannot run (not configured).
  void BuryUnknownKind(const WorkItem& item);
  void PassOverForeignKind(const std::string& kind) EXCLUDES(mu_);
  void ReconcileKind(const std::string& name, const KindRuntime& kind, ReconcileReport& report);
  // Tells options_.notifier that `dead` became a dead letter.
  void NotifyDead(const WorkItem& dead);

  bool TryMarkInFlight(const std::string& work_id) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return in_flight_.insert(work_id).second;
  }
  void ClearInFlight(const std::string& work_id) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    in_flight_.erase(work_id);
  }
  size_t in_flight_size() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return in_flight_.size();
  }
  bool stopping() {
    std::lock_guard<std::mutex> lock(workers_mu_);
    return stopping_;
  }
  // Which due work a worker runs: everything (RunDueOnce), the caller's
  // action kinds, or idem's own kinds ("idem.", the notifications). Own
  // kinds have a worker of their own, so a notification channel that hangs
  // (each attempt may take its timeout) never holds up a refund's retry,
  // and a flood of actions never delays the message a human waits for.
  enum class Lane { kAll, kActions, kOwn };
  StatusOr<size_t> RunDue(size_t max_items, Lane lane);
  // Client-executed work whose last attempt's holder stopped (crashed)
  // before finishing it: no one may claim it again, so no claim would bury
  // it; it is made a dead letter here, as such a claim would (about once a
  // second, a bounded page, by whichever worker comes first).
  void BuryLapsedClientWork();
  void WorkerLoop(Lane lane);
  // The kinds a Due() listing passes over: the configured kinds `skip`
  // names, and every kind met in a shared journal that this config lacks.
  std::vector<std::string> SkippedKinds(
      const std::function<bool(const std::string& name, const KindRuntime& kind)>& skip);

  const Config& config_;
  Journal& journal_;
  StableClock& clock_;
  Metrics& metrics_;
  const ApplyOptions options_;
  // The internal kinds' configs, which kinds_ points into (map nodes are stable).
  const std::unique_ptr<std::map<std::string, ActionConfig>> internal_actions_;
  const std::map<std::string, KindRuntime> kinds_;
  std::vector<std::string> client_kinds_;  // kinds without an effector: clients run them
  // Kinds met in a shared journal that this config lacks: another daemon's.
  std::vector<std::string> foreign_kinds_ GUARDED_BY(mu_);

  mutable Mutex mu_;
  // Work this process is running now (workers and Replay), so that two
  // workers reading the same Due() list do not both try it.
  std::set<std::string> in_flight_ GUARDED_BY(mu_);
  std::optional<ReconcileReport> last_report_ GUARDED_BY(mu_);

  // Worker lifecycle; a plain std::mutex because the condition variable needs it.
  std::mutex workers_mu_;
  std::condition_variable workers_cv_;
  bool stopping_ = false;             // guarded by workers_mu_
  bool started_ = false;              // guarded by workers_mu_
  std::vector<std::thread> workers_;  // guarded by workers_mu_
  // Attempts that ended in an error (not an effect's failure: a claim or
  // record the store refused), counted so a worker's pass can tell.
  std::atomic<uint64_t> failed_passes_{0};
  std::atomic<int64_t> next_client_sweep_ms_{0};  // BuryLapsedClientWork's pace
};

// How long a worker waits after a pass whose attempts failed on the store:
// the store's own recovery probe runs once a second (rocksdb_database.h).
constexpr int64_t kStoreRetryMs = 1'000;

ClaimRequest ApplyEngineImpl::ClaimFor(const KindRuntime& kind, const WorkItem& item) const {
  ClaimRequest req;
  req.work_id = item.work_id;
  req.kind = item.kind;
  req.identity = item.identity;
  req.args = item.args;
  req.run_id = item.run_id;
  req.request_id = item.request_id;
  req.trace_id = item.trace_id;
  req.call_id = item.call_id;
  req.lease_ms = kind.lease_ms;
  req.window_ms = kind.action->window_ms;
  req.max_attempts = std::max(1, kind.action->retry.attempts);
  req.now_ms = clock_.NowMillis();
  return req;
}

StatusOr<ActionOutcome> ApplyEngineImpl::Submit(const std::string& kind_name, const Json& args,
                                                const std::string& run_id,
                                                const std::string& request_id,
                                                const std::string& call_id) {
  const KindRuntime* kind = FindKind(kind_name);
  if (kind == nullptr || kind->internal) {
    return Status(Code::kNotFound, "unknown action kind '" + kind_name + "'", "/kind");
  }
  if (!kind->effector) {
    return FailedPrecondition("action kind '" + kind_name +
                              "' has no effector: its work is executed by clients "
                              "(POST /v1/work/claim)");
  }
  ASSIGN_OR_RETURN(KeyMaterial work_id, ActionWorkId(*kind->action, args));
  ASSIGN_OR_RETURN(Json identity, ExtractIdentity(args, kind->action->identity_fields));
  RETURN_IF_ERROR(kind->effector->Validate(args));

  ClaimRequest req;
  req.work_id = work_id.key;
  req.kind = kind_name;
  req.identity = std::move(identity);
  req.args = args;
  req.run_id = run_id;
  req.request_id = request_id;
  req.trace_id = CurrentTraceId();
  req.call_id = call_id;
  req.lease_ms = kind->lease_ms;
  req.window_ms = kind->action->window_ms;
  req.max_attempts = std::max(1, kind->action->retry.attempts);
  req.now_ms = clock_.NowMillis();

  // R20: a caller's retry of work that failed and is waiting out its backoff
  // does not get an attempt of its own; it learns when the next one is due.
  StatusOr<WorkItem> existing = journal_.Get(req.work_id);
  if (!existing.ok() && existing.status().code() != Code::kNotFound) {
    metrics_.store_errors.Inc();
    return existing.status();
  }
  StatusOr<ActionOutcome> out =
      existing.ok() && existing->state == WorkState::kFailed &&
              existing->next_attempt_at_ms > req.now_ms
          ? StatusOr<ActionOutcome>(
                ActionOutcome{ActionOutcomeKind::kRetrying, std::move(existing).value()})
          : ClaimAndRun(*kind, req);
  // Work another run made (or none) is this run's too: GET /v1/runs/{id}
  // counts every item the run submitted.
  if (out.ok() && !run_id.empty() && out->item.run_id != run_id) {
    JoinRun(out->item.work_id, run_id);
  }
  return out;
}

void ApplyEngineImpl::JoinRun(const std::string& work_id, const std::string& run_id) {
  Status joined = journal_.AddToRun(work_id, run_id);
  if (!joined.ok()) {
    metrics_.store_errors.Inc();
    LogEvent(LogLevel::kWarn, "apply.run_join_failed",
             {{"work_id", work_id}, {"run_id", run_id}, {"error", joined.ToString()}});
  }
}

StatusOr<ActionOutcome> ApplyEngineImpl::ClaimAndRun(const KindRuntime& kind,
                                                     const ClaimRequest& request) {
  StatusOr<ClaimResult> claim = journal_.Claim(request);
  if (!claim.ok()) {
    if (claim.status().code() != Code::kInvalidArgument) metrics_.store_errors.Inc();
    return claim.status();
  }
  switch (claim->outcome) {
    case ClaimOutcome::kClaimed:
      metrics_.work_claimed.Inc();
      return RunAttempt(kind, claim->item);
    case ClaimOutcome::kDone:
      kind.duplicates->Inc();
      return ActionOutcome{ActionOutcomeKind::kDuplicate, Scrubbed(std::move(claim->item))};
    case ClaimOutcome::kBusy:
      metrics_.work_busy.Inc();
      return ActionOutcome{ActionOutcomeKind::kBusy, Scrubbed(std::move(claim->item))};
    case ClaimOutcome::kBackoff:  // failed again between the check above and the claim
      return ActionOutcome{ActionOutcomeKind::kRetrying, Scrubbed(std::move(claim->item))};
    case ClaimOutcome::kDead:
      // The claim itself buried it when a crashed holder had used the last attempt.
      if (claim->buried) {
        metrics_.work_dead.Inc();
        NotifyDead(claim->item);
      }
      return ActionOutcome{ActionOutcomeKind::kDead, Scrubbed(std::move(claim->item))};
  }
  return Internal("unknown claim outcome");
}

StatusOr<ActionOutcome> ApplyEngineImpl::RunAttempt(const KindRuntime& kind,
                                                    const WorkItem& claimed) {
  IDEM_FAILPOINT("apply.after_claim");
  // The attempt runs (and calls out) under the trace of the request that
  // made the work, on a worker thread too.
  std::optional<TraceScope> item_trace;
  if (ValidTraceId(claimed.trace_id) ? claimed.trace_id != CurrentTraceId()
                                     : CurrentTrace() == nullptr) {
    item_trace.emplace(TraceContext::Continue(claimed.trace_id, claimed.request_id));
  }
  if (claimed.attempt == 1) {
    RecordTraceEvent(
        "work", claimed.work_id,
        JsonObjectWriter().Str("kind", claimed.kind).Str("run_id", claimed.run_id).Take());
  }
  const int64_t attempt_started_ms = clock_.NowMillis();
  EffectAttempt attempt;
  if (!claimed.external_ref.empty()) {
    // An earlier attempt recorded proof that the effect landed, then died
    // before completing: finish without calling the target again.
    attempt.result.external_ref = claimed.external_ref;
    attempt.result.result = Json{{"external_ref", claimed.external_ref}, {"recovered", true}};
  } else {
    metrics_.effector_calls.Inc();
    JournalEffectContext context(journal_, clock_, claimed);
    attempt = kind.effector->Execute(claimed, context);
  }
  if (attempt.abandoned) {
    LogEvent(LogLevel::kWarn, "apply.attempt_abandoned",
             {{"work_id", claimed.work_id},
              {"kind", claimed.kind},
              {"attempt", claimed.attempt},
              {"error", attempt.status.ToString()}});
    return attempt.status;
  }
  IDEM_FAILPOINT("apply.after_effect");
  const int64_t now = clock_.NowMillis();
  RecordTraceEvent("attempt", claimed.work_id,
                   JsonObjectWriter()
                       .Str("kind", claimed.kind)
                       .Int("attempt", claimed.attempt)
                       .Bool("ok", attempt.status.ok())
                       .Str("error", attempt.status.ok() ? "" : attempt.status.ToString())
                       .Int("started_at_ms", attempt_started_ms)
                       .Int("duration_ms", now - attempt_started_ms)
                       .Take());

  if (attempt.status.ok()) {
    Status completed = RecordCompletion(claimed, attempt.result, now);
    if (completed.code() == Code::kFailedPrecondition) {
      return AfterLostLease(claimed.work_id, completed);
    }
    if (!completed.ok()) {
      metrics_.store_errors.Inc();
      return completed.Annotate("recording the completion of " + claimed.work_id);
    }
    metrics_.work_completed.Inc();
    IDEM_FAILPOINT("apply.after_record");
    StatusOr<WorkItem> done = journal_.Get(claimed.work_id);
    if (done.ok()) return ActionOutcome{ActionOutcomeKind::kExecuted, std::move(done).value()};
    WorkItem local = Scrubbed(claimed);  // the completion is durable; answer from memory
    local.state = WorkState::kDone;
    local.result = attempt.result.result;
    if (!attempt.result.external_ref.empty()) local.external_ref = attempt.result.external_ref;
    local.locked_until_ms = 0;
    local.updated_at_ms = now;
    return ActionOutcome{ActionOutcomeKind::kExecuted, std::move(local)};
  }

  const bool retryable = attempt.status.retryable();
  const RetryConfig& retry = kind.action->retry;
  int64_t delay = RetryDelayMs(claimed.attempt, retry.base_ms, retry.cap_ms,
                               clock_.env().RandomUnit(), attempt.retry_after_ms);
  if (attempt.status.code() == Code::kDeadlineExceeded) {
    // The target may still be making what this attempt asked for: the next
    // attempt's lookup must be able to see it (a jittered backoff of ~0 ms
    // made a check-then-act effector create a second record).
    delay = std::max(delay, kind.effector->UnknownOutcomeSettleMs());
  }
  delay = std::max(delay, attempt.settle_ms);
  StatusOr<WorkItem> failed = journal_.Fail(claimed.work_id, claimed.lease_token,
                                            attempt.status.ToString(), retryable, now + delay, now);
  if (!failed.ok()) {
    if (failed.status().code() == Code::kFailedPrecondition) {
      return AfterLostLease(claimed.work_id, failed.status());
    }
    metrics_.store_errors.Inc();
    return failed.status().Annotate("recording the failure of " + claimed.work_id);
  }
  if (failed->state == WorkState::kDead) {
    metrics_.work_dead.Inc();
    LogEvent(LogLevel::kWarn, "apply.dead_letter",
             {{"work_id", claimed.work_id},
              {"kind", claimed.kind},
              {"attempt", claimed.attempt},
              {"error", failed->last_error}});
    NotifyDead(*failed);
    return ActionOutcome{ActionOutcomeKind::kDead, std::move(failed).value()};
  }
  metrics_.work_failed.Inc();
  return ActionOutcome{ActionOutcomeKind::kRetrying, std::move(failed).value()};
}

Status ApplyEngineImpl::RecordCompletion(const WorkItem& claimed, const EffectResult& effect,
                                         int64_t now) {
  // The effect has landed: giving up on recording it would let the next
  // holder, after the lease, run it again (twice, for a kind whose target
  // cannot dedupe). So a store that is briefly unreachable (a database
  // restart, a failover) is tried again while the lease still holds.
  int64_t pause_ms = 50;
  for (;;) {
    Status s = Failpoints::Hit("apply.record_completion");
    if (s.ok()) {
      s = journal_.Complete(claimed.work_id, claimed.lease_token, effect.result,
                            effect.external_ref, now);
    }
    if (s.ok() || !s.retryable() || s.code() == Code::kFailedPrecondition) return s;
    metrics_.store_errors.Inc();
    now = clock_.NowMillis();
    if (now + pause_ms + kRecordMarginMs >= claimed.locked_until_ms) return s;
    LogEvent(LogLevel::kWarn, "apply.record_retry",
             {{"work_id", claimed.work_id}, {"error", s.ToString()}, {"retry_in_ms", pause_ms}});
    clock_.env().SleepMillis(pause_ms);
    now = clock_.NowMillis();
    pause_ms = std::min<int64_t>(pause_ms * 2, 1'000);
  }
}

StatusOr<ActionOutcome> ApplyEngineImpl::AfterLostLease(const std::string& work_id,
                                                        Status refused) {
  // Our lease expired and another holder took the work over (it runs the
  // same effect under the same key). Report what the journal holds now.
  StatusOr<WorkItem> now = journal_.Get(work_id);
  if (!now.ok()) return refused;
  switch (now->state) {
    case WorkState::kDone:
      return ActionOutcome{ActionOutcomeKind::kDuplicate, std::move(now).value()};
    case WorkState::kDead:
      return ActionOutcome{ActionOutcomeKind::kDead, std::move(now).value()};
    case WorkState::kFailed:
    case WorkState::kPending:
      return ActionOutcome{ActionOutcomeKind::kRetrying, std::move(now).value()};
    case WorkState::kRunning:
      return ActionOutcome{ActionOutcomeKind::kBusy, std::move(now).value()};
  }
  return refused;
}

StatusOr<ActionOutcome> ApplyEngineImpl::Replay(const std::string& work_id) {
  if (!TryMarkInFlight(work_id)) {
    StatusOr<WorkItem> item = journal_.Get(work_id);
    if (!item.ok()) return item.status();
    return ActionOutcome{ActionOutcomeKind::kBusy, std::move(item).value()};
  }
  struct Unmark {
    ApplyEngineImpl* self;
    const std::string& id;
    ~Unmark() { self->ClearInFlight(id); }
  } unmark{this, work_id};
  ASSIGN_OR_RETURN(WorkItem requeued, journal_.Requeue(work_id, clock_.NowMillis()));
  LogEvent(LogLevel::kInfo, "apply.dead_letter_replayed",
           {{"work_id", work_id}, {"kind", requeued.kind}});
  const KindRuntime* kind = FindKind(requeued.kind);
  if (kind == nullptr || !kind->effector) {
    // Pending again; a client (or a later config with the kind) runs it.
    return ActionOutcome{ActionOutcomeKind::kRetrying, std::move(requeued)};
  }
  IDEM_FAILPOINT("apply.replay_after_requeue");
  ASSIGN_OR_RETURN(ActionOutcome ran, ClaimAndRun(*kind, ClaimFor(*kind, requeued)));
  if (ran.kind == ActionOutcomeKind::kBusy) {
    // This replay requeued it and a worker (here, or another daemon's on a
    // shared store) claimed it first: under way because of this replay,
    // not another one.
    ran.kind = ActionOutcomeKind::kRetrying;
  }
  return ran;
}

void ApplyEngineImpl::PassOverForeignKind(const std::string& kind) {
  {
    MutexLock lock(mu_);
    if (std::find(foreign_kinds_.begin(), foreign_kinds_.end(), kind) != foreign_kinds_.end()) {
      return;
    }
    foreign_kinds_.push_back(kind);
  }
  LogEvent(LogLevel::kWarn, "apply.unknown_kind_skipped",
           {{"kind", kind},
            {"why",
             "the shared journal holds work of a kind this daemon's config does not name; its "
             "workers leave that work to the daemons that have the kind (every daemon on one "
             "database should have the same actions:)"}});
}

void ApplyEngineImpl::BuryUnknownKind(const WorkItem& item) {
  ClaimRequest req;
  req.work_id = item.work_id;
  req.kind = item.kind;
  req.lease_ms = options_.lease_margin_ms > 0 ? options_.lease_margin_ms : 1'000;
  req.max_attempts = std::max(1, item.max_attempts);
  req.now_ms = clock_.NowMillis();
  StatusOr<ClaimResult> claim = journal_.Claim(req);
  if (!claim.ok() || claim->outcome != ClaimOutcome::kClaimed) return;
  StatusOr<WorkItem> dead =
      journal_.Fail(item.work_id, claim->item.lease_token,
                    "action kind '" + item.kind + "' is not configured in this daemon",
                    /*retryable=*/false, 0, req.now_ms);
  if (dead.ok()) {
    metrics_.work_dead.Inc();
    NotifyDead(*dead);
  }
}

void ApplyEngineImpl::NotifyDead(const WorkItem& dead) {
  if (options_.notifier == nullptr) return;
  const KindRuntime* kind = FindKind(dead.kind);
  // A notification that died must not notify about itself (a channel that
  // is down would otherwise feed itself); its death is logged instead.
  if ((kind != nullptr && kind->internal) || dead.kind.starts_with("idem.")) return;
  options_.notifier->Notify(DeadLetterNotification(dead, config_));
}

}  // namespace

Notification DeadLetterNotification(const WorkItem& dead, const Config& config) {
  Notification n;
  n.event_id = "dead_letter:" + dead.work_id + ":" + std::to_string(dead.updated_at_ms);
  n.kind = "dead_letter";
  n.subject_id = dead.work_id;
  std::string error = dead.last_error;
  if (error.size() > 500) error = error.substr(0, 500) + "...";
  n.reason = "work of kind " + dead.kind + " failed after " + std::to_string(dead.attempt) +
             " attempt(s): " + error;
  n.command = "idem dlq replay " + dead.work_id;
  const std::string& base = config.notifications.link_base;
  if (!base.empty()) n.link = base + "/ui/#/dead-letters";
  n.detail = {{"work_kind", dead.kind}, {"attempts", dead.attempt}, {"last_error", error}};
  if (!dead.run_id.empty()) n.detail["run_id"] = dead.run_id;
  return n;
}

namespace {

StatusOr<size_t> ApplyEngineImpl::RunDueOnce(size_t max_items) {
  return RunDue(max_items, Lane::kAll);
}

bool IsOwnKind(const std::string& kind) { return kind.starts_with("idem."); }

StatusOr<size_t> ApplyEngineImpl::RunDue(size_t max_items, Lane lane) {
  if (max_items == 0) return size_t{0};
  // Client-executed kinds are not this process's to run: the store passes
  // over them, however many wait (they filled every pass), and over the
  // kinds of the other lane. In-flight work is read past here.
  std::vector<std::string> skipped =
      SkippedKinds([lane](const std::string& name, const KindRuntime& kind) {
        return !kind.effector ||
               (lane != Lane::kAll && IsOwnKind(name) == (lane == Lane::kActions));
      });
  ASSIGN_OR_RETURN(std::vector<WorkItem> due,
                   journal_.Due(clock_.NowMillis(), max_items * 4 + in_flight_size(), skipped));
  size_t handled = 0;
  for (const WorkItem& listed : due) {
    if (handled >= max_items) break;
    if (stopping()) break;  // Stop() should not wait for a whole batch
    const KindRuntime* kind = FindKind(listed.kind);
    if (kind != nullptr && !kind->effector) continue;     // clients claim their own work
    if (lane == Lane::kOwn && kind == nullptr) continue;  // the actions' lane buries those
    if (kind == nullptr && options_.shared_journal) {
      PassOverForeignKind(listed.kind);
      continue;
    }
    if (!TryMarkInFlight(listed.work_id)) continue;
    StatusOr<WorkItem> fresh = journal_.Get(listed.work_id);
    if (fresh.ok() && IsDue(*fresh, clock_.NowMillis())) {
      if (kind == nullptr) {
        BuryUnknownKind(*fresh);
      } else {
        StatusOr<ActionOutcome> outcome = ClaimAndRun(*kind, ClaimFor(*kind, *fresh));
        if (!outcome.ok()) {
          LogEvent(LogLevel::kWarn, "apply.worker_attempt_error",
                   {{"work_id", listed.work_id},
                    {"kind", listed.kind},
                    {"error", outcome.status().ToString()}});
          // Not handled: the item is as due as before (its claim or record
          // failed, e.g. the store refuses writes), and a pass that only
          // meets such items must not start again at once (WorkerLoop).
          failed_passes_.fetch_add(1, std::memory_order_relaxed);
          ClearInFlight(listed.work_id);
          continue;
        }
      }
      ++handled;
    }
    ClearInFlight(listed.work_id);
  }
  return handled;
}

std::vector<std::string> ApplyEngineImpl::SkippedKinds(
    const std::function<bool(const std::string& name, const KindRuntime& kind)>& skip) {
  std::vector<std::string> out;
  for (const auto& [name, kind] : kinds_) {
    if (skip(name, kind)) out.push_back(name);
  }
  MutexLock lock(mu_);
  out.insert(out.end(), foreign_kinds_.begin(), foreign_kinds_.end());
  return out;
}

void ApplyEngineImpl::BuryLapsedClientWork() {
  if (client_kinds_.empty()) return;
  const int64_t now = clock_.NowMillis();
  int64_t next = next_client_sweep_ms_.load(std::memory_order_relaxed);
  if (now < next || !next_client_sweep_ms_.compare_exchange_strong(next, now + 1'000)) return;
  // Due lists only the client kinds here: every other kind is skipped.
  std::vector<std::string> skipped = SkippedKinds(
      [](const std::string&, const KindRuntime& kind) { return kind.effector != nullptr; });
  StatusOr<std::vector<WorkItem>> due = journal_.Due(now, 100, skipped);
  if (!due.ok()) return;
  for (const WorkItem& item : *due) {
    if (item.state != WorkState::kRunning || item.attempt < item.max_attempts ||
        item.locked_until_ms > now) {
      continue;
    }
    const KindRuntime* kind = FindKind(item.kind);
    if (kind == nullptr || kind->effector) continue;
    const ClaimRequest request = ClaimFor(*kind, item);
    StatusOr<ClaimResult> claim = journal_.Claim(request);
    if (claim.ok() && claim->outcome == ClaimOutcome::kDead && claim->buried) {
      metrics_.work_dead.Inc();
      NotifyDead(claim->item);
      LogEvent(LogLevel::kWarn, "apply.client_work_buried",
               {{"work_id", item.work_id},
                {"kind", item.kind},
                {"attempts", item.attempt},
                {"detail", "the last attempt's lease ran out without a complete or a fail"}});
    }
  }
}

void ApplyEngineImpl::WorkerLoop(Lane lane) {
  while (true) {
    if (stopping()) return;
    if (lane != Lane::kOwn) BuryLapsedClientWork();
    const uint64_t failed_before = failed_passes_.load(std::memory_order_relaxed);
    StatusOr<size_t> handled = RunDue(options_.batch, lane);
    if (!handled.ok()) {
      LogEvent(LogLevel::kWarn, "apply.worker_pass_error",
               {{"error", handled.status().ToString()}});
    }
    const bool failing =
        !handled.ok() || failed_passes_.load(std::memory_order_relaxed) != failed_before;
    if (!failing && *handled > 0) continue;  // more may be due right away
    // Attempts that fail on the store (a full disk, a database down) are
    // tried again at the store's recovery pace, not in a loop that fills
    // the log and a core.
    const int64_t wait_ms = failing ? std::max<int64_t>(options_.poll_interval_ms, kStoreRetryMs)
                                    : options_.poll_interval_ms;
    std::unique_lock<std::mutex> lock(workers_mu_);
    workers_cv_.wait_for(lock, std::chrono::milliseconds(wait_ms), [this] { return stopping_; });
    if (stopping_) return;
  }
}

void ApplyEngineImpl::StartWorkers(int n) {
  std::lock_guard<std::mutex> lock(workers_mu_);
  if (started_ || stopping_) return;
  started_ = true;
  bool own = false;
  for (const auto& [name, unused] : kinds_) own = own || IsOwnKind(name);
  for (int i = 0; i < n; ++i)
    workers_.emplace_back([this, own] {
      NameThread("apply");
      WorkerLoop(own ? Lane::kActions : Lane::kAll);
    });
  if (own) {
    workers_.emplace_back([this] {
      NameThread("apply-own");
      WorkerLoop(Lane::kOwn);
    });
  }
}

void ApplyEngineImpl::Stop() {
  std::vector<std::thread> workers;
  {
    std::lock_guard<std::mutex> lock(workers_mu_);
    stopping_ = true;
    workers.swap(workers_);
  }
  workers_cv_.notify_all();
  for (std::thread& t : workers) t.join();
}

void ApplyEngineImpl::ReconcileKind(const std::string& name, const KindRuntime& kind,
                                    ReconcileReport& report) {
  Effector& effector = *kind.effector;
  if (effector.CanLookup()) {
    StatusOr<std::vector<WorkItem>> done = journal_.DoneWithRef(name, options_.reconcile_limit);
    if (!done.ok()) {
      report.errors.push_back(name + ": reading the journal: " + done.status().ToString());
      return;
    }
    for (const WorkItem& item : *done) {
      StatusOr<LookupResult> found = effector.Lookup(item);
      if (!found.ok()) {
        // The target is down or refuses: the rest of this kind would fail alike.
        report.errors.push_back(name + ": lookup of " + item.work_id +
                                " failed: " + found.status().ToString());
        return;
      }
      ++report.checked;
      if (!found->found) {
        report.findings.push_back({item.work_id, name, item.external_ref, "missing",
                                   "the target's lookup finds no record with this fingerprint"});
      } else if (found->matches > 1) {
        report.findings.push_back({item.work_id, name, item.external_ref, "duplicate",
                                   "the target holds " + std::to_string(found->matches) +
                                       " records with this fingerprint"});
      } else if (!found->external_ref.empty() && found->external_ref != item.external_ref) {
        report.findings.push_back({item.work_id, name, item.external_ref, "ref_mismatch",
                                   "the target's record has id " + found->external_ref});
      }
    }
  }
  if (effector.CanList()) {
    StatusOr<std::vector<ListedRecord>> listed = effector.List();
    if (!listed.ok()) {
      report.errors.push_back(name + ": listing the target failed: " + listed.status().ToString());
      return;
    }
    std::map<std::string, size_t> seen;  // fingerprint -> records listed with it
    for (const ListedRecord& record : *listed) {
      if (!record.fingerprint.empty()) ++seen[record.fingerprint];
    }
    for (const ListedRecord& record : *listed) {
      if (record.fingerprint.empty()) continue;
      if (size_t n = seen[record.fingerprint]; n > 1) {
        // Once per fingerprint, unless its lookup said so already.
        bool reported = false;
        for (const auto& f : report.findings) {
          reported = reported || (f.work_id == record.fingerprint && f.problem == "duplicate");
        }
        if (!reported) {
          report.findings.push_back(
              {record.fingerprint, name, record.external_ref, "duplicate",
               "the target lists " + std::to_string(n) + " records with this fingerprint"});
        }
      }
      StatusOr<WorkItem> item = journal_.Get(record.fingerprint);
      if (item.ok()) {
        if (item->kind == name && item->state == WorkState::kDead) {
          report.findings.push_back({record.fingerprint, name, record.external_ref, "extra",
                                     "the journal has this work as dead"});
        }
      } else if (item.status().code() == Code::kNotFound) {
        // Done records are forgotten after their window; only a kind that
        // remembers forever can call an unknown fingerprint extra.
        if (kind.action->window_ms == 0) {
          report.findings.push_back({record.fingerprint, name, record.external_ref, "extra",
                                     "the journal has no such work"});
        }
      } else {
        report.errors.push_back(name + ": reading the journal: " + item.status().ToString());
        return;
      }
    }
  }
}

StatusOr<ReconcileReport> ApplyEngineImpl::Reconcile() {
  ReconcileReport report;
  report.ran_at_ms = clock_.NowMillis();
  for (const auto& [name, kind] : kinds_) {
    if (!kind.effector || !(kind.effector->CanLookup() || kind.effector->CanList())) continue;
    ReconcileKind(name, kind, report);
  }
  if (!report.findings.empty() || !report.errors.empty()) {
    LogEvent(LogLevel::kWarn, "apply.reconcile",
             {{"checked", report.checked},
              {"findings", report.findings.size()},
              {"errors", report.errors.size()}});
  }
  MutexLock lock(mu_);
  last_report_ = report;
  return report;
}

StatusOr<ReconcileReport> ApplyEngineImpl::LastReconcile() const {
  MutexLock lock(mu_);
  if (!last_report_) return NotFound("no reconciliation has run yet");
  return *last_report_;
}

}  // namespace

StatusOr<std::unique_ptr<ApplyEngine>> ApplyEngine::Create(const Config& config, Journal& journal,
                                                           HttpClient& http, StableClock& clock,
                                                           Metrics& metrics) {
  return Create(config, journal, http, clock, metrics, ApplyOptions{});
}

StatusOr<std::unique_ptr<ApplyEngine>> ApplyEngine::Create(const Config& config, Journal& journal,
                                                           HttpClient& http, StableClock& clock,
                                                           Metrics& metrics,
                                                           const ApplyOptions& options) {
  if (options.poll_interval_ms <= 0 || options.batch == 0 || options.lease_margin_ms < 0) {
    return InvalidArgument("apply options: poll interval and batch must be positive");
  }
  std::map<std::string, KindRuntime> kinds;
  auto add = [&](const ActionConfig& action, bool internal) -> Status {
    KindRuntime kind;
    kind.action = &action;
    kind.internal = internal;
    kind.duplicates = &metrics.Duplicates(action.name);
    ASSIGN_OR_RETURN(kind.effector, MakeEffector(action, http, clock.env()));
    int64_t budget = kind.effector ? kind.effector->AttemptBudgetMs() : action.retry.timeout_ms;
    kind.lease_ms = std::max<int64_t>(1, budget + options.lease_margin_ms);
    kinds.emplace(action.name, std::move(kind));
    return Status::Ok();
  };
  for (const auto& entry : config.actions) RETURN_IF_ERROR(add(entry.second, false));
  auto internal = std::make_unique<std::map<std::string, ActionConfig>>();
  for (const ActionConfig& action : options.internal_kinds) {
    if (config.actions.count(action.name) > 0 || internal->count(action.name) > 0) {
      return InvalidArgument("action kind '" + action.name + "' is one of idem's own kinds",
                             "/actions/" + action.name);
    }
    const ActionConfig& stored = internal->emplace(action.name, action).first->second;
    RETURN_IF_ERROR(add(stored, true));
  }
  return std::unique_ptr<ApplyEngine>(new ApplyEngineImpl(config, journal, clock, metrics, options,
                                                          std::move(internal), std::move(kinds)));
}

}  // namespace idem
