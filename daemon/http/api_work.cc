// The apply half of the v1 API.
#include <algorithm>

#include "daemon/apply/work_identity.h"
#include "daemon/core/backoff.h"
#include "daemon/core/hidden_text.h"
#include "daemon/core/identity.h"
#include "daemon/core/json.h"
#include "daemon/http/api.h"
#include "daemon/http/problem.h"
#include "daemon/obs/log.h"
#include "daemon/obs/trace.h"
#include "daemon/plans/plan_engine.h"
#include "daemon/store/journal_rules.h"

namespace idem {
namespace {

constexpr PageSize kRunPage{1000, 10000};

constexpr PageSize kPlansPage{50, 500};
constexpr PageSize kDeadLettersPage{100, 1000};

}  // namespace
namespace {

constexpr int64_t kMaxLeaseMs = 24LL * 3600 * 1000;

// What a work answer adds to the item's members (WorkBodyText).
struct WorkExtras {
  std::string_view lease_token;  // the claimer's ("": none)
  const Json* args = nullptr;    // a gated kind's approved args, for its claimer
  bool duplicate = false;        // a duplicate of done work (R3)
  bool without_result = false;   // leaves out result and external_ref (on_duplicate: ignore)
};

// A work item's answer as JSON text, its members in name order (the order
// Json::dump writes an object in), written without building a Json value:
// claims and completes answer with it on the hot path.
std::string WorkBodyText(const WorkItem& w, const WorkExtras& extras = {}) {
  JsonObjectWriter out;
  std::string text;  // a member that is a JSON value, dumped
  auto dumped = [&text](const Json& j) -> std::string_view {
    text = j.dump(-1, ' ', false, Json::error_handler_t::replace);
    return text;
  };
  const bool done = w.state == WorkState::kDone;
  if (extras.args != nullptr) out.Raw("args", dumped(*extras.args));
  out.Int("attempt", w.attempt);
  if (done) out.Int("completed_at_ms", w.updated_at_ms);
  if (extras.duplicate) out.Bool("duplicate", true);
  const bool result = done && !extras.without_result;
  if (result && !w.external_ref.empty()) out.Str("external_ref", w.external_ref);
  out.Str("kind", w.kind);
  if (!w.last_error.empty()) out.Str("last_error", w.last_error);
  if (!extras.lease_token.empty()) out.Str("lease_token", extras.lease_token);
  if (w.state == WorkState::kRunning) out.Int("locked_until_ms", w.locked_until_ms);
  if (w.state == WorkState::kFailed || w.state == WorkState::kPending) {
    out.Int("next_attempt_at_ms", w.next_attempt_at_ms);
  }
  if (result) out.Raw("result", dumped(w.result));
  if (!w.run_id.empty()) out.Str("run_id", w.run_id);
  out.Str("state", WorkStateName(w.state));
  out.Str("work_id", w.work_id);
  return out.Take();
}

// The same as a Json value, for answers that add to it.
Json WorkBody(const WorkItem& w) { return Json::parse(WorkBodyText(w), nullptr, false); }

// An answer whose body is WorkBodyText's, sent as it is.
RouteResponse WorkAnswer(int status, std::string text) {
  RouteResponse r{status, Json(std::move(text)), {}};
  r.content_type = "application/json";
  return r;
}

// A problem body that also carries the work's state (409 busy / dead / done).
RouteResponse Conflict(const Status& st, const WorkItem& w, const std::string& request_id) {
  Json body = ProblemBody(409, st, request_id);
  Json work = WorkBody(w);
  for (auto it = work.begin(); it != work.end(); ++it) body[it.key()] = it.value();
  return RouteResponse{409, std::move(body), {}};
}

// Retry-After's value for a time `at_ms`: whole seconds from `now_ms`,
// rounded up, at least 1.
std::string RetryAfterSeconds(int64_t at_ms, int64_t now_ms) {
  return std::to_string(std::max<int64_t>(1, (at_ms - now_ms + 999) / 1000));
}

StatusOr<const ActionConfig*> FindKind(const Config& config, const std::string& kind,
                                       const std::string& field) {
  auto it = config.actions.find(kind);
  if (it == config.actions.end()) {
    return Status(
        Code::kNotFound,
        "unknown action kind '" + kind + "'; kinds are declared under actions: in the config",
        field);
  }
  return &it->second;
}

// The answer to a duplicate of done work, as the kind's on_duplicate says
// (R3), to the call `call_id` (CallId; "" for a call without a key). The
// call that made the work, retried, is told what it did whatever the kind
// says: its first answer may have been a 202 (retrying, awaiting approval),
// which was not kept under its key.
RouteResponse Duplicate(const ActionConfig& kind, const WorkItem& w, const std::string& rid,
                        const std::string& call_id) {
  const bool same_call = !call_id.empty() && w.call_id == call_id;
  if (kind.on_duplicate == "conflict" && !same_call) {
    return Conflict(AlreadyExists("this work was already done"), w, rid);
  }
  return WorkAnswer(
      200, WorkBodyText(w, {.duplicate = true,
                            .without_result = kind.on_duplicate == "ignore" && !same_call}));
}

// A caller's lease name: 1 to 200 bytes of printable UTF-8, and none of
// the daemon's own (IsInternalLeaseName).
constexpr size_t kMaxLeaseNameBytes = 200;
Status CheckLeaseName(const std::string& name) {
  if (name.empty() || name.size() > kMaxLeaseNameBytes) {
    return InvalidArgument("a lease name is 1 to " + std::to_string(kMaxLeaseNameBytes) +
                               " bytes; this one is " + std::to_string(name.size()),
                           "path:name");
  }
  if (!IsPrintableText(name)) {
    return InvalidArgument("a lease name is printable UTF-8 text (no control characters)",
                           "path:name");
  }
  if (IsInternalLeaseName(name)) {
    return InvalidArgument(
        "lease names that start with decide:, outbox:, cost: or idem. are the "
        "daemon's own (its daemons coordinate on them); choose another name",
        "path:name");
  }
  return Status::Ok();
}

// A caller's run_id (claims, actions, runs): none that starts "plan_",
// the run a plan's actions are applied under (its plan id), so that a run of
// the caller's cannot mix its items, counts and dead letters into a plan's.
Status CheckCallersRunId(const Json& body) {
  auto it = body.find("run_id");
  if (it == body.end() || !it->is_string()) return Status::Ok();
  if (it->get_ref<const std::string&>().rfind("plan_", 0) == 0) {
    return InvalidArgument(
        "run ids that start with plan_ are the daemon's own (a plan's actions run under the "
        "plan's id); choose another",
        "/run_id");
  }
  return Status::Ok();
}

StatusOr<int64_t> DurationField(const Json& body, const std::string& name, int64_t def, int64_t max,
                                int64_t min = 1) {
  if (!body.contains(name)) return def;
  const Json& v = body[name];
  int64_t ms = 0;
  if (v.is_number_integer()) {
    // Whole seconds: range-checked before scaling, so 2^61 does not wrap.
    bool in_range = v.is_number_unsigned()
                        ? v.get<uint64_t>() <= static_cast<uint64_t>(max / 1000)
                        : v.get<int64_t>() >= 0 && v.get<int64_t>() <= max / 1000;
    ms = in_range ? v.get<int64_t>() * 1000 : -1;
  } else if (v.is_string()) {
    auto parsed = ParseDuration(v.get<std::string>());
    if (!parsed.ok()) return InvalidArgument(parsed.status().message(), "/" + name);
    ms = *parsed;
  } else {
    return InvalidArgument(name + " must be a duration (\"30s\") or seconds", "/" + name);
  }
  if (ms < min || ms > max) {
    return InvalidArgument(name + " must be between " + std::to_string(min) + "ms and " +
                               std::to_string(max / 1000) + "s",
                           "/" + name);
  }
  return ms;
}

Json Outcome(const ActionConfig& kind, const ActionOutcome& o, const std::string& rid,
             const std::string& call_id, int* status) {
  switch (o.kind) {
    case ActionOutcomeKind::kExecuted:
      *status = 201;
      return WorkBody(o.item);
    case ActionOutcomeKind::kDuplicate: {
      RouteResponse r = Duplicate(kind, o.item, rid, call_id);
      *status = r.status;
      return BodyJson(r);
    }
    case ActionOutcomeKind::kRetrying:
      *status = 202;
      return WorkBody(o.item);
    case ActionOutcomeKind::kBusy: {
      RouteResponse r =
          Conflict(Aborted("another worker holds this work under a live lease"), o.item, rid);
      *status = 409;
      return r.body;
    }
    case ActionOutcomeKind::kDead: {
      RouteResponse r =
          Conflict(FailedPrecondition("this work is a dead letter: " + o.item.last_error +
                                      "; replay it with POST /v1/dead-letters/{id}/replay"),
                   o.item, rid);
      *status = 409;
      return r.body;
    }
  }
  *status = 500;
  return Json::object();
}

// Work still moving (retrying, or held by someone else): an answer about it
// is not a final outcome (RouteResponse::transient).
bool StillMoving(ActionOutcomeKind k) {
  return k == ActionOutcomeKind::kRetrying || k == ActionOutcomeKind::kBusy;
}

// 202: the call's work waits for an operator's approval (plan_engine.h).
RouteResponse AwaitingApproval(const Plan& plan) {
  Json body = {{"plan_id", plan.plan_id},
               {"state", plan.state},
               {"reasons", plan.approval.value("reasons", Json::array())},
               {"status_url", "/v1/plans/" + plan.plan_id}};
  if (plan.approval.contains("expires_at_ms")) {
    body["expires_at_ms"] = plan.approval["expires_at_ms"];
  }
  RouteResponse out{202, std::move(body), {{"Location", "/v1/plans/" + plan.plan_id}}};
  out.transient = true;
  return out;
}

// A plan and what applying it did, for /apply and /approve.
Json AppliedBody(const std::map<std::string, ActionConfig>& kinds, const PlanApplyResult& r,
                 const std::string& rid, Json detail) {
  Json results = Json::array();
  for (const PlanActionResult& a : r.actions) {
    Json one;
    if (!a.outcome.ok()) {
      one = {{"error", a.outcome.status().ToString()}};
    } else {
      auto kit = kinds.find(a.kind);
      int status = 0;
      one = kit == kinds.end() ? WorkBody(a.outcome->item)
                               : Outcome(kit->second, *a.outcome, rid, "", &status);
    }
    one["index"] = a.index;
    one["kind"] = a.kind;
    results.push_back(std::move(one));
  }
  detail["results"] = std::move(results);
  return detail;
}

Json ReportBody(const ReconcileReport& r) {
  Json findings = Json::array();
  for (const auto& f : r.findings) {
    findings.push_back({{"work_id", f.work_id},
                        {"kind", f.kind},
                        {"external_ref", f.external_ref},
                        {"problem", f.problem},
                        {"detail", f.detail}});
  }
  return {{"ran_at_ms", r.ran_at_ms},
          {"checked", r.checked},
          {"findings", findings},
          {"errors", r.errors}};
}

// POST /v1/work/claim, /complete and /fail in two halves each, so that the
// ordinary handler and the batch lane (router.h, JournalLane) share them:
// the request as a JournalOp, and the answer for the journal's outcome.
struct ClaimRoute {
  const Config& config;
  StableClock& clock;
  Metrics& metrics;
  PlanEngine& plans;
  Journal& journal;
  Notifier& notifier;
  // Each configured kind's blocked-duplicate series, resolved once (metrics.h).
  std::shared_ptr<const std::map<std::string, Counter*>> duplicates;

  // A kind whose policy may need approval: the claim waits (202) for it,
  // and then claims with the approved args.
  std::optional<StatusOr<RouteResponse>> gate(RequestContext& ctx) const {
    auto kit = config.actions.find(ctx.body.value("kind", ""));
    if (Status run = CheckCallersRunId(ctx.body); !run.ok()) return StatusOr<RouteResponse>(run);
    if (kit == config.actions.end()) return std::nullopt;  // prepare names the unknown kind
    if (Status args = CheckClaimArgs(kit->second, ctx.body); !args.ok()) {
      return StatusOr<RouteResponse>(args);
    }
    if (!kit->second.approval) return std::nullopt;
    // The policy judges the args the claim stores (CheckClaimArgs filled in
    // their identity fields), and only the identity's fields beside them:
    // never other members of `identity`, which no one stores or runs (an
    // "amount" there must not pass the rule for the amount in the args).
    const bool has_args = ctx.body.contains("args");
    Json args = has_args ? ctx.body["args"] : Json::object();
    const Json& identity = ctx.body["identity"];
    for (const std::string& field : kit->second.identity_fields) {
      Json::json_pointer ptr(field);
      if (identity.is_object() && identity.contains(ptr) && !args.contains(ptr)) {
        args[ptr] = identity.at(ptr);
      }
    }
    StatusOr<Gate> g =
        plans.GateAction(kit->second, args, "claim", ctx.caller, ctx.body.value("run_id", ""),
                         CallId(ctx.caller, ctx.idempotency_key));
    // A refused plan is about the work the identity names.
    if (!g.ok()) {
      const Status& s = g.status();
      return StatusOr<RouteResponse>(
          s.code() == Code::kFailedPrecondition ? s.WithField("/identity") : s);
    }
    if (!g->allowed) return StatusOr<RouteResponse>(AwaitingApproval(g->plan));
    if (!g->plan.plan_id.empty()) ctx.body["args"] = g->args;
    return std::nullopt;
  }

  // The args a claim brings must be the work its identity names, and what
  // the kind's args_schema takes: a kind with an effector runs them itself
  // when the claimer's lease runs out (a takeover), as /v1/actions would
  // after the same checks. Identity fields the args leave out are filled in
  // from the identity. Client-only work claimed without args is the
  // client's to know; nothing is checked or added then.
  Status CheckClaimArgs(const ActionConfig& kind, Json& body) const {
    const bool has_args = body.contains("args");
    if (!has_args && kind.effector.empty()) return Status::Ok();
    Json args = has_args ? body["args"] : Json::object();
    if (!args.is_object()) return InvalidArgument("args must be an object", "/args");
    const Json& identity = body["identity"];
    for (const std::string& field : kind.identity_fields) {
      Json::json_pointer ptr(field);
      // nlohmann throws where a value on the pointer's way is no object
      // ({"b": 5} for /b/c): that is the caller's args, not a bug.
      try {
        if (!identity.is_object() || !identity.contains(ptr)) continue;  // prepare says so
        if (!args.contains(ptr)) {
          args[ptr] = identity.at(ptr);
        } else if (args.at(ptr) != identity.at(ptr)) {
          return InvalidArgument(
              "args" + field + " is not the identity's " + field +
                  ": the args must describe the work the identity names (the work_id is the "
                  "identity's)",
              "/args" + field);
        }
      } catch (const Json::exception&) {
        return InvalidArgument("args" + field + " cannot hold the identity's " + field +
                                   ": a value on its way is not an object",
                               "/args" + field);
      }
    }
    RETURN_IF_ERROR(plans.CheckArgs(kind, args, "/args"));
    body["args"] = std::move(args);
    return Status::Ok();
  }

  // The lease a claim asks for (Route::grant_ms): its Idempotency-Key
  // replays "you own it" no longer than that. 0 when the body cannot say
  // (prepare refuses it then).
  int64_t grant_ms(const RequestContext& ctx) const {
    if (!ctx.body.is_object() || !ctx.body.contains("kind") || !ctx.body["kind"].is_string()) {
      return 0;
    }
    StatusOr<const ActionConfig*> kind =
        FindKind(config, ctx.body["kind"].get<std::string>(), "/kind");
    if (!kind.ok()) return 0;
    StatusOr<int64_t> lease =
        DurationField(ctx.body, "lease", (*kind)->retry.timeout_ms, kMaxLeaseMs);
    return lease.ok() ? *lease : 0;
  }

  StatusOr<JournalOp> prepare(RequestContext& ctx) const {
    ASSIGN_OR_RETURN(const ActionConfig* kind,
                     FindKind(config, ctx.body["kind"].get<std::string>(), "/kind"));
    const Json& identity = ctx.body["identity"];
    Json ident = identity;
    if (!kind->identity_fields.empty()) {
      auto extracted = ExtractIdentity(identity, kind->identity_fields);
      if (!extracted.ok()) {
        return extracted.status().WithField("/identity" +
                                            extracted.status().field().substr(std::min<size_t>(
                                                5, extracted.status().field().size())));
      }
      ident = std::move(extracted).value();
    }
    Normalizers trim;
    ASSIGN_OR_RETURN(Json normalized, NormalizeInput(ident, trim));
    ASSIGN_OR_RETURN(KeyMaterial id, ComputeWorkId(kind->name, kind->identity_version, normalized));
    ASSIGN_OR_RETURN(int64_t lease_ms,
                     DurationField(ctx.body, "lease", kind->retry.timeout_ms, kMaxLeaseMs));
    ClaimRequest req;
    req.work_id = id.key;
    req.kind = kind->name;
    req.identity = std::move(normalized);
    req.args = ctx.body.value("args", Json::object());
    req.run_id = ctx.body.value("run_id", "");
    req.request_id = ctx.request_id;
    req.trace_id = ctx.trace.trace_id;
    req.call_id = CallId(ctx.caller, ctx.idempotency_key);
    req.lease_ms = lease_ms;
    req.window_ms = kind->window_ms;
    req.max_attempts = kind->retry.attempts;
    req.now_ms = clock.NowMillis();
    ctx.op_now_ms = req.now_ms;
    return JournalOp::Claim(std::move(req));
  }

  StatusOr<RouteResponse> respond(RequestContext& ctx, StatusOr<JournalOpResult> claimed) const {
    ASSIGN_OR_RETURN(JournalOpResult r, std::move(claimed));
    ASSIGN_OR_RETURN(const ActionConfig* kind, FindKind(config, r.item.kind, "/kind"));
    // Work another run made (or none) is this run's too: GET /v1/runs/{id}
    // counts it. A failure here leaves the claim's answer as it is.
    if (const std::string run = ctx.body.value("run_id", "");
        !run.empty() && run != r.item.run_id) {
      if (Status joined = journal.AddToRun(r.item.work_id, run); !joined.ok()) {
        metrics.store_errors.Inc();
        LogEvent(LogLevel::kWarn, "work.run_join_failed",
                 {{"work_id", r.item.work_id}, {"run_id", run}, {"error", joined.ToString()}});
      }
    }
    switch (r.outcome) {
      case ClaimOutcome::kClaimed: {
        metrics.work_claimed.Inc();
        if (r.item.attempt == 1) {
          RecordTraceEvent(
              "work", r.item.work_id,
              JsonObjectWriter().Str("kind", r.item.kind).Str("run_id", r.item.run_id).Take());
        }
        // A gated kind's claimer executes the args an operator approved.
        return WorkAnswer(201,
                          WorkBodyText(r.item, {.lease_token = r.item.lease_token,
                                                .args = kind->approval ? &r.item.args : nullptr}));
      }
      case ClaimOutcome::kDone:
        if (auto d = duplicates->find(kind->name); d != duplicates->end()) d->second->Inc();
        return Duplicate(*kind, r.item, ctx.request_id, CallId(ctx.caller, ctx.idempotency_key));
      case ClaimOutcome::kBusy: {
        metrics.work_busy.Inc();
        RouteResponse busy = Conflict(Aborted("another caller holds this work under a live lease"),
                                      r.item, ctx.request_id);
        busy.transient = true;  // the holder is still at it
        busy.headers.emplace_back("Retry-After",
                                  RetryAfterSeconds(r.item.locked_until_ms, clock.NowMillis()));
        return busy;
      }
      case ClaimOutcome::kBackoff: {
        metrics.work_busy.Inc();
        RouteResponse wait =
            Conflict(Aborted("this work failed (attempt " + std::to_string(r.item.attempt) + ": " +
                             r.item.last_error +
                             ") and its next attempt is not due yet; claim it again from "
                             "next_attempt_at_ms"),
                     r.item, ctx.request_id);
        wait.transient = true;  // it will be claimable
        wait.headers.emplace_back("Retry-After",
                                  RetryAfterSeconds(r.item.next_attempt_at_ms, clock.NowMillis()));
        return wait;
      }
      case ClaimOutcome::kDead:
        if (r.buried) {
          // This claim buried it (a crashed holder had used the last
          // attempt): a new dead letter, counted and told as any other.
          metrics.work_dead.Inc();
          notifier.Notify(DeadLetterNotification(r.item, config));
        }
        return Conflict(FailedPrecondition("this work is a dead letter: " + r.item.last_error),
                        r.item, ctx.request_id);
    }
    return Internal("unreachable claim outcome");
  }
};

// The answer to a complete or fail that changed nothing and is refused
// (journal_rules::Refusal), with the work as it is; nullopt if not refused.
std::optional<RouteResponse> Refused(const JournalOpResult& r, const std::string& request_id) {
  Status why = journal_rules::Refusal(r);
  if (why.ok()) return std::nullopt;
  return Conflict(why, r.item, request_id);
}

// A client's report on claimed work, as an attempt under the work's trace
// (the claim's request may be in another trace than this report's).
void RecordClientAttempt(const WorkItem& item, const RequestContext& ctx, bool ok,
                         const std::string& error) {
  if (!ValidTraceId(item.trace_id)) return;
  RecordTraceEventIn(item.trace_id, "attempt", item.work_id,
                     JsonObjectWriter()
                         .Str("kind", item.kind)
                         .Int("attempt", item.attempt)
                         .Bool("ok", ok)
                         .Str("error", error)
                         .Str("by", "client")
                         .Str("request_id", ctx.request_id)
                         .Take());
}

struct CompleteRoute {
  StableClock& clock;
  Metrics& metrics;

  StatusOr<JournalOp> prepare(RequestContext& ctx) const {
    JournalOp op;
    op.type = JournalOp::Type::kComplete;
    op.work_id = ctx.params[0];
    op.lease_token = ctx.body["lease_token"];
    op.result = ctx.body.value("result", Json());
    op.external_ref = ctx.body.value("external_ref", "");
    op.now_ms = clock.NowMillis();
    return op;
  }

  StatusOr<RouteResponse> respond(RequestContext& ctx, StatusOr<JournalOpResult> done) const {
    ASSIGN_OR_RETURN(JournalOpResult r, std::move(done));
    if (std::optional<RouteResponse> refused = Refused(r, ctx.request_id)) return *refused;
    // A repeated complete by the holder that finished it is not an error.
    if (!r.repeated) {
      metrics.work_completed.Inc();
      RecordClientAttempt(r.item, ctx, true, "");
    }
    return WorkAnswer(200, WorkBodyText(r.item));
  }
};

struct FailRoute {
  const Config& config;
  StableClock& clock;
  Metrics& metrics;
  Notifier& notifier;

  StatusOr<JournalOp> prepare(RequestContext& ctx) const {
    JournalOp op;
    op.type = JournalOp::Type::kFail;
    op.work_id = ctx.params[0];
    op.lease_token = ctx.body["lease_token"];
    op.error = ctx.body.value("error", "failed");
    op.retryable = ctx.body.value("retryable", true);
    op.now_ms = clock.NowMillis();
    if (ctx.body.contains("retry_after")) {
      ASSIGN_OR_RETURN(int64_t delay, DurationField(ctx.body, "retry_after", 0, kMaxLeaseMs, 0));
      op.retry_delay_ms = [delay](const WorkItem&) { return delay; };
    } else {
      // The kind's backoff, from the attempt of the record being failed.
      const Config* cfg = &config;
      StableClock* clk = &clock;
      op.retry_delay_ms = [cfg, clk](const WorkItem& w) -> int64_t {
        auto kit = cfg->actions.find(w.kind);
        if (kit == cfg->actions.end()) return 0;
        return FullJitterBackoffMs(w.attempt, kit->second.retry.base_ms, kit->second.retry.cap_ms,
                                   clk->env().RandomUnit());
      };
    }
    return op;
  }

  StatusOr<RouteResponse> respond(RequestContext& ctx, StatusOr<JournalOpResult> failed) const {
    ASSIGN_OR_RETURN(JournalOpResult r, std::move(failed));
    if (std::optional<RouteResponse> refused = Refused(r, ctx.request_id)) return *refused;
    // A repeated fail by the holder that failed it changes nothing. One
    // that made the work dead counts there instead (README, Metrics).
    if (!r.repeated) {
      if (r.item.state != WorkState::kDead) metrics.work_failed.Inc();
      RecordClientAttempt(r.item, ctx, false, r.item.last_error);
    }
    if (r.item.state == WorkState::kDead && !r.repeated) {
      metrics.work_dead.Inc();
      // One journal write, on a rare path (the work's last failure).
      notifier.Notify(DeadLetterNotification(r.item, config));
    }
    return WorkAnswer(200, WorkBodyText(r.item));
  }
};

// The handler and the batch lane of a route made of one journal op.
template <typename R>
JournalLane LaneOf(const R& route) {
  return JournalLane{
      .gate = {},
      .prepare = [route](RequestContext& ctx) { return route.prepare(ctx); },
      .respond = [route](RequestContext& ctx,
                         StatusOr<JournalOpResult> r) { return route.respond(ctx, std::move(r)); }};
}

RouteHandler HandlerOf(const JournalLane& lane, Journal& journal) {
  return [lane, &journal](RequestContext& ctx) { return lane.RunAlone(ctx, journal); };
}

}  // namespace

void AddWorkRoutes(ApiDeps deps, std::vector<Route>& routes) {
  Journal& journal = deps.store.journal();
  auto duplicates = std::make_shared<std::map<std::string, Counter*>>();
  for (const auto& entry : deps.config.actions) {
    (*duplicates)[entry.first] = &deps.metrics.Duplicates(entry.first);
  }
  const ClaimRoute claim_route{deps.config,          deps.clock,           deps.metrics,
                               deps.plans,           deps.store.journal(), deps.notifier,
                               std::move(duplicates)};
  JournalLane claim = LaneOf(claim_route);
  claim.gate = [claim_route](RequestContext& ctx) { return claim_route.gate(ctx); };
  routes.push_back(Route{
      .method = "POST",
      .pattern = "/v1/work/claim",
      .summary = "Claim client-executed work: 201 you own it, 200 already done (the original "
                 "result), 409 someone else holds it.",
      .key_policy = KeyPolicy::kOptional,
      .request_schema = "work.claim.request",
      .responses = {{201, "work.claimed"},
                    {200, "work.item"},
                    {202, "plan.awaiting"},
                    {400, "problem"},
                    {404, "problem"},
                    {409, "work.conflict"}},
      .roles = {"agent"},
      .handler = HandlerOf(claim, journal),
      .journal_lane = claim,
      .grant_ms = [claim_route](const RequestContext& ctx) { return claim_route.grant_ms(ctx); },
      .grant_holds =
          [&journal = deps.store.journal(), &clock = deps.clock](int status,
                                                                 const std::string& body) {
            if (status != 201) return true;  // not a grant: an outcome, replayed
            StatusOr<Json> granted = ParseJson(body, JsonLimits{});
            if (!granted.ok() || !granted->is_object()) return false;
            // The journal never gives a token back: the lease is the
            // grant's while the work runs under the same attempt until the
            // same time.
            StatusOr<WorkItem> now = journal.Get(granted->value("work_id", ""));
            return now.ok() && now->state == WorkState::kRunning &&
                   now->attempt == granted->value("attempt", -1) &&
                   now->locked_until_ms == granted->value("locked_until_ms", int64_t{-1}) &&
                   now->locked_until_ms > clock.NowMillis();
          }});

  const JournalLane complete = LaneOf(CompleteRoute{deps.clock, deps.metrics});
  routes.push_back(
      Route{.method = "POST",
            .pattern = "/v1/work/{id}/complete",
            .summary = "Record that claimed work is done, with its result and external_ref.",
            .key_policy = KeyPolicy::kOptional,
            .request_schema = "work.complete.request",
            .responses = {{200, "work.item"}, {404, "problem"}, {409, "work.conflict"}},
            .roles = {"agent"},
            .handler = HandlerOf(complete, journal),
            .journal_lane = complete});

  const JournalLane fail = LaneOf(FailRoute{deps.config, deps.clock, deps.metrics, deps.notifier});
  routes.push_back(
      Route{.method = "POST",
            .pattern = "/v1/work/{id}/fail",
            .summary = "Record that claimed work failed: retried later (retryable) or dead.",
            .key_policy = KeyPolicy::kOptional,
            .request_schema = "work.fail.request",
            .responses = {{200, "work.item"}, {404, "problem"}, {409, "work.conflict"}},
            .roles = {"agent"},
            .handler = HandlerOf(fail, journal),
            .journal_lane = fail});

  routes.push_back(
      Route{.method = "GET",
            .pattern = "/v1/work/{id}",
            .summary = "One journal record: state, attempts, result, external_ref, lease.",
            .responses = {{200, "work.item"}, {404, "problem"}},
            .roles = {"agent", "operator"},
            .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
              ASSIGN_OR_RETURN(WorkItem item, deps.store.journal().Get(ctx.params[0]));
              Json body = WorkBody(item);
              body["args"] = item.args;
              body["identity"] = item.identity;
              body["created_at_ms"] = item.created_at_ms;
              body["updated_at_ms"] = item.updated_at_ms;
              if (!item.request_id.empty()) body["request_id"] = item.request_id;
              return RouteResponse{200, std::move(body), {}};
            }});

  routes.push_back(Route{
      .method = "POST",
      .pattern = "/v1/actions/{kind}",
      .summary = "Execute an action kind exactly once per unit of work: 201 executed now, 200 "
                 "the original result of a duplicate, 202 retrying, 409 busy or dead.",
      .key_policy = KeyPolicy::kRequired,
      .request_schema = "action.request",
      .responses = {{201, "work.item"},
                    {200, "work.item"},
                    {202, "action.accepted"},
                    {400, "problem"},
                    {404, "problem"},
                    {409, "work.conflict"}},
      .roles = {"agent"},
      .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
        ASSIGN_OR_RETURN(const ActionConfig* kind,
                         FindKind(deps.config, ctx.params[0], "path:kind"));
        RETURN_IF_ERROR(deps.plans.CheckArgs(*kind, ctx.body["args"], "/args"));
        RETURN_IF_ERROR(CheckCallersRunId(ctx.body));
        const std::string call_id = CallId(ctx.caller, ctx.idempotency_key);
        ASSIGN_OR_RETURN(Gate gate,
                         deps.plans.GateAction(*kind, ctx.body["args"], "action", ctx.caller,
                                               ctx.body.value("run_id", ""), call_id));
        if (!gate.allowed) return AwaitingApproval(gate.plan);
        ASSIGN_OR_RETURN(ActionOutcome o,
                         deps.apply.Submit(kind->name, gate.args, ctx.body.value("run_id", ""),
                                           ctx.request_id, call_id));
        int status = 200;
        Json body = Outcome(*kind, o, ctx.request_id, call_id, &status);
        RouteResponse out{status, std::move(body), {}};
        out.transient = StillMoving(o.kind);
        // Busy: when the holder's lease ends, as a claim's 409 says.
        if (o.kind == ActionOutcomeKind::kBusy && o.item.locked_until_ms > 0) {
          out.headers.emplace_back(
              "Retry-After", RetryAfterSeconds(o.item.locked_until_ms, deps.clock.NowMillis()));
        }
        return out;
      }});

  routes.push_back(Route{
      .method = "POST",
      .pattern = "/v1/runs",
      .summary = "Submit a batch under a run_id; resubmitting resumes it (done items are not "
                 "redone).",
      // It executes effects, so a retry must be recognisable as one (R37),
      // as for /v1/actions: the run_id names the batch, not one attempt.
      .key_policy = KeyPolicy::kRequired,
      .request_schema = "run.request",
      .responses = {{200, "run.response"}, {400, "problem"}, {404, "problem"}, {409, "problem"}},
      .roles = {"agent"},
      .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
        const std::string run_id = ctx.body["run_id"];
        RETURN_IF_ERROR(CheckCallersRunId(ctx.body));
        ASSIGN_OR_RETURN(const ActionConfig* kind,
                         FindKind(deps.config, ctx.body["kind"].get<std::string>(), "/kind"));
        if (kind->effector.empty()) {
          // Every item would fail alike: refuse the run as /v1/actions does.
          return Status(Code::kFailedPrecondition,
                        "action kind '" + kind->name +
                            "' has no effector: its work is executed by clients (POST "
                            "/v1/work/claim for each item)",
                        "/kind");
        }
        Json items = Json::array();
        std::map<std::string, int> counts;
        const Json& batch = ctx.body["items"];
        bool passing_error = false;  // an item met an error that may pass (a store outage)
        // A failed item: a bad one refuses the whole run, its field ("/args/x")
        // moved under "/items/<i>/x"; any other failure is that item's alone,
        // named with its work_id when it has one.
        auto failed = [&](size_t i, const Status& s) -> Status {
          if (s.code() == Code::kInvalidArgument) {
            return s.WithField("/items/" + std::to_string(i) +
                               s.field().substr(std::min<size_t>(5, s.field().size())));
          }
          Json item = {{"index", i}, {"error", s.ToString()}};
          if (auto id = ActionWorkId(*kind, batch[i]); id.ok()) item["work_id"] = id->key;
          if (s.retryable()) {
            item["retryable"] = true;
            passing_error = true;
          }
          items.push_back(std::move(item));
          counts["error"]++;
          return Status::Ok();
        };
        // Every item is checked before any runs: a bad one refuses the run whole.
        for (size_t i = 0; i < batch.size(); ++i) {
          RETURN_IF_ERROR(deps.plans.CheckArgs(*kind, batch[i], "/items/" + std::to_string(i)));
          auto identity = ActionWorkId(*kind, batch[i]);
          if (!identity.ok()) return failed(i, identity.status());
        }
        bool waiting = false;
        const std::string call_id = CallId(ctx.caller, ctx.idempotency_key);
        for (size_t i = 0; i < batch.size(); ++i) {
          if (deps.stopping != nullptr && deps.stopping->load(std::memory_order_acquire)) {
            // SIGTERM: what is started finishes; the rest waits for the
            // run to be sent again (done items are not redone).
            RouteResponse stop{
                503,
                ProblemBody(503,
                            Unavailable("the daemon is stopping: " + std::to_string(i) + " of " +
                                        std::to_string(batch.size()) +
                                        " items were submitted; send the run again (the same "
                                        "run_id) to go on, done items are not redone"),
                            ctx.request_id),
                {{"Retry-After", "1"}}};
            stop.transient = true;  // not the run's outcome: never stored under its key
            return stop;
          }
          auto gate = deps.plans.GateAction(*kind, batch[i], "run", ctx.caller, run_id, call_id);
          if (!gate.ok()) {
            // A refused plan is about this item, not about an "/args" it
            // does not have.
            const Status& s = gate.status();
            RETURN_IF_ERROR(failed(i, s.code() == Code::kFailedPrecondition
                                          ? s.WithField("/items/" + std::to_string(i))
                                          : s));
            continue;
          }
          if (!gate->allowed) {
            items.push_back(
                {{"index", i}, {"outcome", "awaiting_approval"}, {"plan_id", gate->plan.plan_id}});
            counts["awaiting_approval"]++;
            waiting = true;
            continue;
          }
          auto o = deps.apply.Submit(kind->name, gate->args, run_id, ctx.request_id, call_id);
          if (!o.ok()) {
            RETURN_IF_ERROR(failed(i, o.status()));
            continue;
          }
          int status = 0;
          Json body = Outcome(*kind, *o, ctx.request_id, call_id, &status);
          const char* label = o->kind == ActionOutcomeKind::kExecuted    ? "executed"
                              : o->kind == ActionOutcomeKind::kDuplicate ? "already_done"
                              : o->kind == ActionOutcomeKind::kRetrying  ? "retrying"
                              : o->kind == ActionOutcomeKind::kBusy      ? "busy"
                                                                         : "dead";
          counts[label]++;
          items.push_back({{"index", i},
                           {"outcome", label},
                           {"work_id", o->item.work_id},
                           {"state", WorkStateName(o->item.state)}});
        }
        RouteResponse out{200, {{"run_id", run_id}, {"counts", counts}, {"items", items}}, {}};
        // Not final while an item waits, retries, is busy, or met an error
        // that may pass: a retry with the key runs again (done items are
        // not redone) instead of replaying this answer for the key's window.
        out.transient =
            waiting || passing_error || counts.count("retrying") > 0 || counts.count("busy") > 0;
        return out;
      }});

  routes.push_back(
      Route{.method = "GET",
            .pattern = "/v1/runs/{id}",
            .summary = "The work items of a run and their states, oldest first, ?limit= per "
                       "page and ?cursor= from the previous page's next_cursor (404: no item "
                       "carries the run_id).",
            .responses = {{200, "run.response"}, {400, "problem"}, {404, "problem"}},
            .roles = {"agent", "operator"},
            .query = {CursorDoc(), LimitDoc(kRunPage)},
            .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
              ASSIGN_OR_RETURN(size_t limit, LimitParam(ctx, kRunPage));
              const std::string cursor = QueryParam(ctx, "cursor");
              RunPosition after;
              if (!cursor.empty()) {
                // The last listed item's created_at_ms and work_id (ByRun's order).
                ASSIGN_OR_RETURN(auto at, ParseTimeIdCursor(cursor));
                after = RunPosition{at.first, std::move(at.second)};
              }
              Journal& journal = deps.store.journal();
              // Counts cover the whole run (up to kRunPage.max items, a
              // run's size), whatever the page lists: "are all done?" must
              // not be answered from one page.
              ASSIGN_OR_RETURN(std::vector<WorkItem> items,
                               journal.ByRun(ctx.params[0], kRunPage.max + 1));
              // A mistyped run_id is not a run with nothing in it.
              if (items.empty()) {
                return NotFound("no work item carries run_id '" + ctx.params[0] +
                                "' (a run is the items POST /v1/runs claimed under it)");
              }
              const bool truncated = items.size() > kRunPage.max;
              const size_t total = std::min(items.size(), kRunPage.max);
              std::map<std::string, int> counts;
              for (size_t i = 0; i < total; ++i) {
                counts[std::string(WorkStateName(items[i].state))]++;
              }
              // The page: the first items, or those after the cursor (one
              // more than listed tells whether another page follows).
              std::vector<WorkItem> after_cursor;
              if (!after.start()) {
                ASSIGN_OR_RETURN(after_cursor, journal.ByRun(ctx.params[0], limit + 1, after));
              }
              const std::vector<WorkItem>& page = after.start() ? items : after_cursor;
              Json list = Json::array();
              for (size_t i = 0; i < std::min(page.size(), limit); ++i) {
                list.push_back(WorkBody(page[i]));
              }
              Json body = {
                  {"run_id", ctx.params[0]}, {"counts", counts}, {"total", total}, {"items", list}};
              if (page.size() > limit) {
                body["more_items"] = true;
                body["next_cursor"] =
                    TimeIdCursor(page[limit - 1].created_at_ms, page[limit - 1].work_id);
              }
              if (truncated) body["counts_truncated"] = true;
              return RouteResponse{200, std::move(body), {}};
            }});

  routes.push_back(
      Route{.method = "GET",
            .pattern = "/v1/plans",
            .summary = "Plans in one state (?state=, default awaiting_approval), newest first, "
                       "?limit= per page and ?cursor= from the previous page's next_cursor.",
            .responses = {{200, "plan.list"}, {400, "problem"}},
            .roles = {"agent", "operator"},
            .query = {OneOfDoc("state", kPlanStates,
                               "the plans in this state (default awaiting_approval)"),
                      CursorDoc(), LimitDoc(kPlansPage)},
            .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
              ASSIGN_OR_RETURN(std::string state, OneOfParam(ctx, "state", kPlanStates));
              if (state.empty()) state = "awaiting_approval";
              ASSIGN_OR_RETURN(size_t limit, LimitParam(ctx, kPlansPage));
              ASSIGN_OR_RETURN(PlanPage page,
                               deps.store.plans().List(state, limit, QueryParam(ctx, "cursor")));
              Json items = Json::array();
              for (const Plan& p : page.items) items.push_back(PlanJson(p));
              Json body = {{"items", std::move(items)}};
              if (!page.next_cursor.empty()) body["next_cursor"] = page.next_cursor;
              return RouteResponse{200, std::move(body), {}};
            }});

  routes.push_back(Route{
      .method = "GET",
      .pattern = "/v1/plans/{id}",
      .summary = "A plan with its decision and each action's journal state; ?wait=30s answers "
                 "when its state changes (at most 60 s).",
      .responses = {{200, "plan"}, {400, "problem"}, {404, "problem"}},
      .roles = {"agent", "operator"},
      .query = {{"wait",
                 {{"type", "string"}, {"pattern", "^[0-9]+(ms|s|m)$"}},
                 "answer when the plan's state changes, waiting at most this long (at most "
                 "60s; 400 past it)"}},
      .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
        std::string wait = QueryParam(ctx, "wait");
        int64_t wait_ms = 0;
        if (!wait.empty()) {
          auto ms = ParseDuration(wait);
          if (!ms.ok() || *ms > 60'000) {
            return InvalidArgument("wait is a duration of at most 60s, such as 30s", "query:wait");
          }
          wait_ms = *ms;
        }
        const uint64_t seen = deps.plans.Generation();  // before the read: no change is missed
        ASSIGN_OR_RETURN(Plan p, deps.store.plans().Get(ctx.params[0]));
        auto answer = [deps, id = p.plan_id]() -> StatusOr<RouteResponse> {
          ASSIGN_OR_RETURN(Plan now, deps.store.plans().Get(id));
          ASSIGN_OR_RETURN(Json body, deps.plans.Detail(now));
          return RouteResponse{200, std::move(body), {}};
        };
        if (wait_ms <= 0) return answer();
        // A long poll: answered when the plan changes or the wait ends,
        // without a handler thread waiting (past the engine's bound on
        // polls, at once).
        auto poll = std::make_shared<LongPoll>();
        poll->answer = answer;
        poll->arm = [deps, id = p.plan_id, seen, at = p.updated_at_ms,
                     wait_ms](std::function<void()> resume) {
          if (!deps.plans.Watch(id, seen, at, wait_ms, resume)) resume();
        };
        RouteResponse out;
        out.long_poll = std::move(poll);
        return out;
      }});

  routes.push_back(Route{
      .method = "POST",
      .pattern = "/v1/plans/{id}/apply",
      .summary = "Apply a plan (id: the plan's or its decision's): each action becomes a work "
                 "item executed exactly once; 202 while it awaits approval.",
      .key_policy = KeyPolicy::kRequired,
      .responses = {{200, "plan"}, {202, "plan"}, {404, "problem"}, {409, "problem"}},
      .roles = {"agent", "operator"},
      .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
        ASSIGN_OR_RETURN(PlanApplyResult r,
                         deps.plans.Apply(ctx.params[0], ctx.caller, ctx.request_id));
        if (r.plan.state == "awaiting_approval") {
          RouteResponse out{202, PlanJson(r.plan), {}};
          out.transient = true;
          return out;
        }
        RouteResponse out{
            200, AppliedBody(deps.config.actions, r, ctx.request_id, PlanJson(r.plan)), {}};
        out.transient = r.moving;
        return out;
      }});

  routes.push_back(Route{
      .method = "POST",
      .pattern = "/v1/plans/{id}/approve",
      .summary = "Approve a plan awaiting approval, optionally with edited args "
                 "(edits: [{path: /0/args/amount, value: 90}]); it is applied at once.",
      .key_policy = KeyPolicy::kOptional,
      .request_schema = "plan.approve.request",
      .responses =
          {{200, "plan"}, {400, "problem"}, {403, "problem"}, {404, "problem"}, {409, "problem"}},
      .roles = {"operator"},
      .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
        ASSIGN_OR_RETURN(
            PlanApplyResult r,
            deps.plans.Approve(
                ctx.params[0], ctx.caller, ctx.body.value("comment", ""),
                ctx.body.value("edits", Json()), ctx.request_id,
                ctx.body.contains("expect_updated_at_ms")
                    ? std::optional<int64_t>(ctx.body["expect_updated_at_ms"].get<int64_t>())
                    : std::nullopt));
        ASSIGN_OR_RETURN(Json detail, deps.plans.Detail(r.plan));
        RouteResponse out{200, AppliedBody(deps.config.actions, r, ctx.request_id, detail), {}};
        return out;
      }});

  routes.push_back(Route{
      .method = "POST",
      .pattern = "/v1/plans/{id}/reject",
      .summary = "Reject a plan not yet applied, with a reason: it never touches the outside "
                 "world.",
      .key_policy = KeyPolicy::kOptional,
      .request_schema = "plan.reject.request",
      .responses = {{200, "plan"}, {400, "problem"}, {404, "problem"}, {409, "problem"}},
      .roles = {"operator"},
      .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
        ASSIGN_OR_RETURN(
            Plan p, deps.plans.Reject(ctx.params[0], ctx.caller, ctx.body.value("reason", "")));
        ASSIGN_OR_RETURN(Json detail, deps.plans.Detail(p));
        return RouteResponse{200, std::move(detail), {}};
      }});

  routes.push_back(
      Route{.method = "GET",
            .pattern = "/v1/dead-letters",
            .summary = "Work whose attempts ran out: work_id, kind, attempts, last error, args.",
            .responses = {{200, "dead_letter.list"}},
            .roles = {"operator"},
            .query = {LimitDoc(kDeadLettersPage)},
            .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
              ASSIGN_OR_RETURN(size_t limit, LimitParam(ctx, kDeadLettersPage));
              ASSIGN_OR_RETURN(std::vector<WorkItem> dead, deps.store.journal().DeadLetters(limit));
              Json items = Json::array();
              for (const auto& w : dead) {
                items.push_back({{"work_id", w.work_id},
                                 {"kind", w.kind},
                                 {"attempts", w.attempt},
                                 {"last_error", w.last_error},
                                 {"args", w.args},
                                 {"updated_at_ms", w.updated_at_ms},
                                 {"run_id", w.run_id}});
              }
              return RouteResponse{200, {{"items", items}}, {}};
            }});

  routes.push_back(Route{
      .method = "POST",
      .pattern = "/v1/dead-letters/{id}/replay",
      .summary = "Replay one dead letter (not the batch): it becomes due now with a fresh "
                 "attempt budget.",
      .key_policy = KeyPolicy::kRequired,
      .responses =
          {{200, "work.item"}, {202, "work.item"}, {404, "problem"}, {409, "work.conflict"}},
      .roles = {"operator"},
      .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
        // The audit record goes first: the replay runs an effect, and a
        // crash between the effect and a record written after it would
        // leave an operator's effect without its actor. A replay that then
        // loses a race (another replay requeued it) leaves its event, with
        // its request_id, and answers that race.
        ASSIGN_OR_RETURN(WorkItem dead, deps.store.journal().Get(ctx.params[0]));
        if (dead.state == WorkState::kDead) {
          AuditEvent event;
          event.at_ms = deps.clock.NowMillis();
          event.actor = ctx.caller;
          event.action = "dead_letter.replayed";
          event.detail = {{"work_id", dead.work_id},      {"kind", dead.kind},
                          {"attempts", dead.attempt},     {"last_error", dead.last_error},
                          {"request_id", ctx.request_id}, {"trace_id", ctx.trace.trace_id}};
          RETURN_IF_ERROR(deps.store.audit().Append(std::move(event)).status());
        }
        // Requeue, and run it now when the daemon executes the kind.
        ASSIGN_OR_RETURN(ActionOutcome o, deps.apply.Replay(ctx.params[0]));
        if (o.kind == ActionOutcomeKind::kBusy) {
          // Another replay of it runs now: as a replay sent after that one
          // is answered (409, not dead), not an accepted second replay.
          RouteResponse busy = Conflict(Aborted("work " + o.item.work_id +
                                                " is being replayed by another request now; its "
                                                "state is in GET /v1/work/" +
                                                o.item.work_id),
                                        o.item, ctx.request_id);
          busy.transient = true;  // a moment's answer: never stored under the key
          return busy;
        }
        if (o.item.state == WorkState::kDead) {
          // Its one attempt failed for good again: a dead letter still, not
          // an accepted request a script would take for success.
          return Conflict(Aborted("the replay's attempts failed: work " + o.item.work_id +
                                  " is a dead letter again (" + o.item.last_error + ")"),
                          o.item, ctx.request_id);
        }
        return RouteResponse{o.item.state == WorkState::kDone ? 200 : 202, WorkBody(o.item), {}};
      }});

  routes.push_back(Route{
      .method = "POST",
      .pattern = "/v1/leases/{name}",
      .summary = "Take or renew a named lease (cron overlap): 201 acquired (with its token), "
                 "200 renewed (the holder sends the token), 409 held by another holder or a "
                 "wrong token.",
      .key_policy = KeyPolicy::kOptional,
      .request_schema = "lease.request",
      .responses = {{201, "lease"}, {200, "lease"}, {400, "problem"}, {409, "lease.conflict"}},
      .roles = {"agent"},
      .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
        RETURN_IF_ERROR(CheckLeaseName(ctx.params[0]));
        if (!IsPrintableText(ctx.body["holder"].get_ref<const std::string&>())) {
          // Shown in a 409 to the next caller and on the operator's screens.
          return InvalidArgument("a holder is printable text (no control characters)", "/holder");
        }
        ASSIGN_OR_RETURN(int64_t ttl, DurationField(ctx.body, "ttl", 60'000, kMaxLeaseMs));
        ASSIGN_OR_RETURN(
            LeaseResult r,
            deps.store.leases().Acquire(ctx.params[0], ctx.body["holder"],
                                        ctx.body.value("token", ""), ttl, deps.clock.NowMillis()));
        Json body = {{"name", r.lease.name},
                     {"holder", r.lease.holder},
                     {"acquired_at_ms", r.lease.acquired_at_ms},
                     {"expires_at_ms", r.lease.expires_at_ms}};
        // Only the holder learns the token: it is what renews and releases.
        if (r.outcome != LeaseOutcome::kHeld) body["token"] = r.lease.token;
        if (r.outcome == LeaseOutcome::kHeld) {
          Json p =
              ProblemBody(409, Aborted("lease '" + r.lease.name + "' is held by " + r.lease.holder),
                          ctx.request_id);
          for (auto it = body.begin(); it != body.end(); ++it) p[it.key()] = it.value();
          // Another holder's live lease is a moment, not an outcome: a
          // retry with the key asks again (README, Idempotency-Key contract).
          RouteResponse held{409, std::move(p), {}};
          held.transient = true;
          return held;
        }
        return RouteResponse{r.outcome == LeaseOutcome::kAcquired ? 201 : 200, std::move(body), {}};
      },
      // A grant is replayed under its key only while it lasts: after it, a
      // retry asks again (another holder may have it by then).
      .grant_ms = [](const RequestContext& ctx) -> int64_t {
        StatusOr<int64_t> ttl = DurationField(ctx.body, "ttl", 60'000, kMaxLeaseMs);
        return ttl.ok() ? *ttl : 0;
      },
      .grant_holds =
          [&leases = deps.store.leases(), &clock = deps.clock](int status,
                                                               const std::string& body) {
            if (status != 201 && status != 200) return true;
            StatusOr<Json> granted = ParseJson(body, JsonLimits{});
            if (!granted.ok() || !granted->is_object()) return false;
            StatusOr<NamedLease> now = leases.Get(granted->value("name", ""), clock.NowMillis());
            // The same holder's lease from the same acquisition (renewals
            // keep it; a lapse and a new acquire do not).
            return now.ok() && now->holder == granted->value("holder", "") &&
                   now->acquired_at_ms == granted->value("acquired_at_ms", int64_t{-1});
          }});

  routes.push_back(Route{
      .method = "DELETE",
      .pattern = "/v1/leases/{name}",
      .summary = "Release a named lease (?holder=&token=, the token its acquire returned).",
      .responses = {{200, "lease"}, {400, "problem"}, {409, "problem"}},
      .roles = {"agent"},
      .query = {TextDoc("holder", "the holder that acquired it", true),
                TextDoc("token", "the token its acquire returned", true)},
      .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
        RETURN_IF_ERROR(CheckLeaseName(ctx.params[0]));
        std::string holder = QueryParam(ctx, "holder");
        if (holder.empty()) return InvalidArgument("holder is required", "query:holder");
        std::string token = QueryParam(ctx, "token");
        if (token.empty()) return InvalidArgument("token is required", "query:token");
        // A lease that lapsed before its release was free already:
        // the holder's run outlived its ttl (nobody took it, or this
        // release would be refused), and should hear so.
        StatusOr<NamedLease> live = deps.store.leases().Get(ctx.params[0], deps.clock.NowMillis());
        if (!live.ok() && live.status().code() != Code::kNotFound) return live.status();
        Status released = deps.store.leases().Release(ctx.params[0], holder, token);
        if (released.code() == Code::kFailedPrecondition) {
          // A release sent again (its answer was lost) finds the lease
          // free: that is what it asked for. Held by another, it is not.
          auto now = deps.store.leases().Get(ctx.params[0], deps.clock.NowMillis());
          if (!now.ok() && now.status().code() == Code::kNotFound) {
            return RouteResponse{
                200, {{"name", ctx.params[0]}, {"released", true}, {"was_free", true}}, {}};
          }
        }
        if (!released.ok() && released.field() == "/token") {
          return released.WithField("query:token");
        }
        RETURN_IF_ERROR(released);
        Json body = {{"name", ctx.params[0]}, {"released", true}};
        if (!live.ok()) body["was_free"] = true;
        return RouteResponse{200, std::move(body), {}};
      }});

  routes.push_back(Route{.method = "POST",
                         .pattern = "/v1/reconcile",
                         .summary = "Compare done work with the target systems now.",
                         .key_policy = KeyPolicy::kOptional,
                         .responses = {{200, "reconcile.report"}},
                         .roles = {"operator"},
                         .handler = [deps](RequestContext&) -> StatusOr<RouteResponse> {
                           ASSIGN_OR_RETURN(ReconcileReport r, deps.apply.Reconcile());
                           return RouteResponse{200, ReportBody(r), {}};
                         }});

  routes.push_back(Route{.method = "GET",
                         .pattern = "/v1/reconcile/report",
                         .summary = "The last reconciliation report (periodic or on demand).",
                         .responses = {{200, "reconcile.report"}, {404, "problem"}},
                         .roles = {"operator"},
                         .handler = [deps](RequestContext&) -> StatusOr<RouteResponse> {
                           ASSIGN_OR_RETURN(ReconcileReport r, deps.apply.LastReconcile());
                           return RouteResponse{200, ReportBody(r), {}};
                         }});
}

}  // namespace idem
