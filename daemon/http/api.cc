#include "daemon/http/api.h"

#include <charconv>
#include <memory>
#include <set>
#include <string>

#include "daemon/core/failpoints.h"
#include "daemon/core/hidden_text.h"
#include "daemon/core/json_diff.h"
#include "daemon/core/mutex.h"
#include "daemon/http/http1.h"
#include "daemon/http/problem.h"

namespace idem {
namespace {

constexpr PageSize kDecisionsPage{50, 500};
constexpr const char* kDecisionStatuses[] = {"decided"};
constexpr PageSize kEscalationsPage{100, 1000};
constexpr const char* kEscalationStates[] = {"open", "resolved"};
// How long a promote's lock on its key lasts if its daemon dies holding it.
constexpr int64_t kPromoteLockMs = 30'000;

}  // namespace

namespace {

const char* CacheName(const DecideResult& r) {
  if (r.cache_hit) return "hit";
  if (r.joined) return "joined";
  return "miss";
}

Json DecisionSummary(const Decision& d) {
  return {{"decision_id", d.decision_id},
          {"decision_key", d.decision_key},
          {"step", d.step},
          {"status", d.status},
          {"decided_by", d.decided_by},
          {"output", d.output},
          {"provider", d.provider},
          {"model", d.model},
          {"prompt_version", d.prompt_version},
          {"created_at_ms", d.created_at_ms}};
}

Json EscalationSummary(const Escalation& e) {
  Json j = {{"status", "escalated"},
            {"escalation_id", e.escalation_id},
            {"decision_key", e.decision_key},
            {"step", e.step},
            {"state", e.state},
            {"context", e.context},
            {"created_at_ms", e.created_at_ms}};
  if (!e.decision_id.empty()) j["decision_id"] = e.decision_id;
  if (!e.resolved_by.empty()) j["resolved_by"] = e.resolved_by;
  return j;
}

// The plan a decision's actions make (decided, or resolved by a human),
// summarized for the decide answer; none when its step has no plan pointer
// or its output no actions.
StatusOr<std::optional<Json>> PlanOf(const ApiDeps& deps, const Decision& d,
                                     const std::string& caller) {
  auto sit = deps.config.steps.find(d.step);
  if (sit == deps.config.steps.end() || sit->second.plan_pointer.empty()) {
    return std::optional<Json>();
  }
  StatusOr<Plan> p = deps.plans.ProposeFromDecision(d, caller);
  if (!p.ok() && p.status().code() == Code::kNotFound) return std::optional<Json>();
  RETURN_IF_ERROR(p.status());
  return std::optional<Json>(Json{{"plan_id", p->plan_id},
                                  {"state", p->state},
                                  {"approval_required", p->approval.value("required", false)},
                                  {"reasons", p->approval.value("reasons", Json::array())}});
}

// The gauges that count store records (dead letters, plans by state, open
// escalations), and the store's memory and disk. A scrape never scans the
// store without bound: the counts come from index scans of at most kCap
// keys each (never the records: loading 10,000 plans per state took a
// scrape's RSS up by 7-13 MB, the peaks bench_soak found), redone when a
// scrape finds them older than kMaxAgeMs, so scrapes cost at most a
// handful of bounded scans every few seconds. A count at kCap means "kCap
// or more".
class StoreGauges {
 public:
  static constexpr size_t kCap = 10'000;
  static constexpr int64_t kMaxAgeMs = 5'000;

  explicit StoreGauges(const ApiDeps& deps) : deps_(deps) {}

  void RefreshIfStale() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    const int64_t now = deps_.clock.NowMillis();
    if (refreshed_ && now - refreshed_at_ms_ < kMaxAgeMs) return;
    refreshed_ = true;
    refreshed_at_ms_ = now;
    Metrics& m = deps_.metrics;
    SetCount(m.dead_letter_count, deps_.store.journal().CountDeadLetters(kCap));
    for (const char* state : kPlanStates) {
      SetCount(m.plans_by_state.Declare({state}), deps_.store.plans().CountByState(state, kCap));
    }
    for (const Store::SizePart& part : deps_.store.MemoryUsage()) {
      m.store_memory.Declare({part.name}).Set(static_cast<int64_t>(part.bytes));
    }
    // Sizes that cannot be read keep the last ones read.
    if (StatusOr<std::vector<Store::SizePart>> disk = deps_.store.DiskUsage(); disk.ok()) {
      for (const Store::SizePart& part : *disk) {
        m.store_disk.Declare({part.name}).Set(static_cast<int64_t>(part.bytes));
      }
    } else {
      m.store_errors.Inc();
    }
    if (std::optional<uint64_t> free_bytes = deps_.store.DiskFreeBytes()) {
      m.store_disk_free.Declare({}).Set(static_cast<int64_t>(*free_bytes));
    }
    SetCount(m.escalations_open_count, deps_.store.escalations().CountOpen(kCap));
  }

 private:
  // A count that cannot be read keeps the last one read; before any was
  // read it is unknown (NaN), not a 0 that says "none".
  void SetCount(Gauge& g, const StatusOr<size_t>& count) REQUIRES(mu_) {
    if (count.ok()) {
      g.Set(static_cast<int64_t>(*count));
      read_.insert(&g);
      return;
    }
    deps_.metrics.store_errors.Inc();
    if (!read_.contains(&g)) g.SetUnknown();
  }

  ApiDeps deps_;
  Mutex mu_;
  std::set<const Gauge*> read_ GUARDED_BY(mu_);
  bool refreshed_ GUARDED_BY(mu_) = false;
  int64_t refreshed_at_ms_ GUARDED_BY(mu_) = 0;
};

}  // namespace

StatusOr<size_t> LimitParam(const RequestContext& ctx, size_t def, size_t max) {
  auto it = ctx.query.find("limit");
  if (it == ctx.query.end()) return def;
  char* end = nullptr;
  long v = std::strtol(it->second.c_str(), &end, 10);
  if (end == it->second.c_str() || *end != '\0' || v < 1 || static_cast<size_t>(v) > max) {
    return InvalidArgument("limit must be a number from 1 to " + std::to_string(max),
                           "query:limit");
  }
  return static_cast<size_t>(v);
}

StatusOr<size_t> LimitParam(const RequestContext& ctx, PageSize page) {
  return LimitParam(ctx, page.def, page.max);
}

QueryDoc LimitDoc(PageSize page) {
  return {"limit",
          {{"type", "integer"}, {"minimum", 1}, {"maximum", page.max}, {"default", page.def}},
          "items per page (400 outside the bounds)"};
}

QueryDoc OneOfDoc(const std::string& name, std::span<const char* const> allowed,
                  const std::string& description) {
  Json values = Json::array();
  for (const char* a : allowed) values.push_back(a);
  return {name, {{"type", "string"}, {"enum", values}}, description + " (400 for another value)"};
}

QueryDoc TextDoc(const std::string& name, const std::string& description, bool required) {
  return {name, {{"type", "string"}}, description, required};
}

QueryDoc CursorDoc() {
  return TextDoc("cursor", "the next_cursor of the previous page (400 for one no page returned)");
}

QueryDoc MillisDoc(const std::string& name, const std::string& description) {
  return {name,
          {{"type", "integer"}, {"minimum", 0}, {"maximum", kMaxEpochMillis}},
          description + ", epoch milliseconds (up to 9999-12-31)"};
}

StatusOr<int64_t> MillisParam(const RequestContext& ctx, const std::string& name, int64_t def) {
  const std::string v = QueryParam(ctx, name);
  if (v.empty()) return def;
  int64_t out = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || end != v.data() + v.size() || out < 0 || out > kMaxEpochMillis) {
    return InvalidArgument(name + " must be milliseconds since the epoch (an integer from 0 to " +
                               std::to_string(kMaxEpochMillis) + ", 9999-12-31)",
                           "query:" + name);
  }
  return out;
}

std::string QueryParam(const RequestContext& ctx, const std::string& name) {
  auto it = ctx.query.find(name);
  return it == ctx.query.end() ? std::string() : it->second;
}

StatusOr<std::string> OneOfParam(const RequestContext& ctx, const std::string& name,
                                 std::span<const char* const> allowed) {
  auto it = ctx.query.find(name);
  if (it == ctx.query.end()) return std::string();  // absent: no filter
  // Present but empty (?state=) is a value too: a filter it cannot be
  // told from a typo's, and "all" would answer a question not asked.
  std::string list;
  for (const char* a : allowed) {
    if (it->second == a) return it->second;
    list += (list.empty() ? "" : ", ") + std::string(a);
  }
  return InvalidArgument(name + " must be one of " + list +
                             (it->second.empty() ? " (it is empty; leave it out for all)" : ""),
                         "query:" + name);
}

std::vector<Route> BuildApiRoutes(ApiDeps deps) {
  std::vector<Route> routes;

  routes.push_back(Route{.method = "GET",
                         .pattern = "/healthz",
                         .summary = "Liveness: the process answers.",
                         .responses = {{200, "health"}},
                         .is_public = true,
                         .handler = [](RequestContext&) -> StatusOr<RouteResponse> {
                           return RouteResponse{200, {{"status", "ok"}}, {}};
                         }});

  routes.push_back(Route{.method = "GET",
                         .pattern = "/readyz",
                         .summary = "Readiness: the store answers reads and takes writes.",
                         .responses = {{200, "health"}, {503, "problem"}},
                         .is_public = true,
                         .handler = [deps](RequestContext&) -> StatusOr<RouteResponse> {
                           auto probe = deps.store.decisions().Get("dec_readiness_probe");
                           if (!probe.ok() && probe.status().code() != Code::kNotFound) {
                             return Unavailable("store: " + probe.status().message());
                           }
                           // Disk full: reads still work, but a balancer
                           // should send writes elsewhere until it recovers.
                           RETURN_IF_ERROR(deps.store.WriteHealth());
                           return RouteResponse{200, {{"status", "ready"}}, {}};
                         }});

  routes.push_back(Route{.method = "GET",
                         .pattern = "/metrics",
                         .summary = "Prometheus metrics (text format).",
                         .responses = {{200, ""}},
                         .media = {{200, {{"text/plain", ""}}}},
                         .roles = {"agent", "operator"},
                         .raw_text = true,
                         .handler = [deps, gauges = std::make_shared<StoreGauges>(deps)](
                                        RequestContext&) -> StatusOr<RouteResponse> {
                           gauges->RefreshIfStale();
                           deps.metrics.trace_entries_dropped.Mirror(deps.store.traces().dropped());
                           if (std::optional<uint64_t> n = deps.store.Corruptions()) {
                             deps.metrics.store_corruptions.Declare({}).Mirror(*n);
                           }
                           return RouteResponse{200, deps.metrics.RenderPrometheus(), {}};
                         }});

  routes.push_back(Route{
      .method = "POST",
      .pattern = "/v1/decide",
      .summary = "Decide a step for an input: the cached decision, or a new validated one.",
      .key_policy = KeyPolicy::kOptional,
      .request_schema = "decide.request",
      .responses = {{200, "decide.response"},
                    {400, "problem"},
                    {404, "problem"},
                    {409, "problem"},
                    {422, "problem"},
                    {503, "problem"},
                    {504, "problem"}},
      .roles = {"agent"},
      .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
        DecideRequest req;
        req.step = ctx.body.value("step", "");
        req.input = ctx.body.contains("input") ? ctx.body["input"] : Json::object();
        std::string cache = ctx.body.value("cache", "default");
        req.cache = cache == "refresh" ? CacheMode::kRefresh
                    : cache == "only"  ? CacheMode::kOnly
                                       : CacheMode::kDefault;
        req.request_id = ctx.request_id;
        ASSIGN_OR_RETURN(DecideResult r, deps.decide.Decide(req));
        if (r.escalated) {
          RecordTraceEvent("escalation", r.escalation.escalation_id,
                           TraceDetail({{"step", r.escalation.step}, {"cache", CacheName(r)}}));
          Json body = EscalationSummary(r.escalation);
          body["cache"] = CacheName(r);
          RouteResponse escalated{200, std::move(body), {}};
          // No model answered (an outage): a repeat asks again, and so does
          // a retry with the request's Idempotency-Key, instead of being
          // shown this escalation, resolved since, for the key's window.
          escalated.transient = r.escalation.context.value("provider_outage", false);
          return escalated;
        }
        RecordTraceEvent("decision", r.decision.decision_id,
                         TraceDetail({{"step", r.decision.step},
                                      {"cache", CacheName(r)},
                                      {"decided_by", r.decision.decided_by}}));
        Json body = DecisionSummary(r.decision);
        body["cache"] = CacheName(r);
        StatusOr<std::optional<Json>> plan = PlanOf(deps, r.decision, ctx.caller);
        bool transient = false;
        if (!plan.ok() && plan.status().code() == Code::kUnavailable) {
          // The decision is answered (a hit the store's fallback served);
          // its plan is in the store that cannot be read now. The agent
          // learns the plan's id and to come back, not a 503 for the whole.
          body["plan"] = {{"plan_id", PlanEngine::DecisionPlanId(r.decision.decision_id)},
                          {"state", "unknown"},
                          {"error", "the plan cannot be read or made now (" +
                                        CallerDetail(503, plan.status(), ctx.request_id) +
                                        "); apply it, or read GET /v1/plans/{id}, once the store "
                                        "is back"}};
          transient = true;
        } else {
          RETURN_IF_ERROR(plan.status());
          if (*plan) body["plan"] = std::move(**plan);
        }
        double cost = r.decision.trace.value("cost_usd", 0.0);
        // A joined request waited for another's call: it spent nothing.
        if (r.cache_hit || r.joined) {
          body["saved_cost_usd"] = cost;  // what this answer would have cost again
        } else {
          body["cost_usd"] = cost;
        }
        RouteResponse response{200, std::move(body), {}};
        response.transient = transient;  // not kept under an Idempotency-Key
        return response;
      }});

  // Before /v1/decisions/{id}: the first route that matches a path serves it.
  AddDecisionIoRoutes(deps, routes);

  routes.push_back(
      Route{.method = "GET",
            .pattern = "/v1/decisions/{id}",
            .summary = "A stored decision with its trace (attempts, raw output, tokens).",
            .responses = {{200, "decision"}, {404, "problem"}},
            .roles = {"agent", "operator"},
            .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
              ASSIGN_OR_RETURN(Decision d, deps.store.decisions().Get(ctx.params[0]));
              return RouteResponse{200, d.ToJson(), {}};
            }});

  routes.push_back(Route{
      .method = "POST",
      .pattern = "/v1/decisions/{id}/replay",
      .summary = "Decide again with the recorded input (optionally another provider, model or "
                 "temperature): {original, replayed, diff}; the cache is untouched unless "
                 "promote: true (audited).",
      .key_policy = KeyPolicy::kOptional,
      .request_schema = "decision.replay.request",
      .responses = {{200, "decision.replay"},
                    {400, "problem"},
                    {404, "problem"},
                    {409, "problem"},
                    {503, "problem"},
                    {504, "problem"}},
      .roles = {"agent", "operator"},
      .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
        // A promotion rewrites the decision every caller of the key is
        // served, as an import does: an operator's power, not an agent's.
        if (ctx.body.value("promote", false) && !deps.config.auth.Holds(ctx.caller, {"operator"})) {
          return Status(Code::kPermissionDenied,
                        "token '" + ctx.caller +
                            "' may replay but not promote: promoting rewrites the cached "
                            "decision every caller of its key gets, which takes the operator role",
                        "/promote");
        }
        ASSIGN_OR_RETURN(Decision original, deps.store.decisions().Get(ctx.params[0]));
        if (ctx.body.value("promote", false) && original.material.is_object()) {
          // The cache key covers the prompt version and the temperature the
          // decision was made with (its material's, not today's defaults):
          // an answer to another cannot stand in for this key's.
          const Json& m = original.material;
          if (ctx.body.contains("prompt_version") &&
              ctx.body["prompt_version"] != m.value("prompt_version", Json())) {
            return Status(Code::kFailedPrecondition,
                          "a replay with another prompt version cannot be promoted: decisions "
                          "are cached per prompt version; make it the step's prompt instead",
                          "/promote");
          }
          if (ctx.body.contains("temperature") &&
              !(m.contains("temperature") && m["temperature"].is_number() &&
                m["temperature"].get<double>() == ctx.body["temperature"].get<double>())) {
            return Status(Code::kFailedPrecondition,
                          "a replay at another temperature cannot be promoted: decisions are "
                          "cached per temperature; change the step's temperature instead",
                          "/promote");
          }
        }
        ReplayOptions o;
        o.provider = ctx.body.value("provider", "");
        o.model = ctx.body.value("model", "");
        o.prompt_version = ctx.body.value("prompt_version", "");
        if (ctx.body.contains("temperature")) o.temperature = ctx.body["temperature"].get<double>();
        o.request_id = ctx.request_id;
        Json body = {{"original", DecisionSummary(original)}};
        StatusOr<Decision> replayed = deps.decide.Replay(original, o);
        if (!replayed.ok()) {
          if (replayed.status().code() != Code::kUnavailable) return replayed.status();
          // The replay found no valid output: a finding, not a failure of the call.
          body["replayed"] = {{"status", "failed"},
                              {"error", CallerDetail(503, replayed.status(), ctx.request_id)}};
          body["diff"] = nullptr;
          // Asked to promote: nothing was, and a script must be able to tell.
          if (ctx.body.value("promote", false)) body["promoted"] = false;
          return RouteResponse{200, std::move(body), {}};
        }
        body["replayed"] = DecisionSummary(*replayed);
        body["replayed"]["cost_usd"] = replayed->trace.value("cost_usd", 0.0);
        body["replayed"]["attempts"] = replayed->trace.value("attempts", Json::array());
        body["diff"] = JsonDiff(original.output, replayed->output);
        if (ctx.body.value("promote", false) && original.material.is_object() &&
            original.material.value("prompt_version", Json()) != Json(replayed->prompt_version)) {
          // The decision's own version is no longer loaded, so the replay
          // ran another: its answer is not this key's.
          return Status(Code::kFailedPrecondition,
                        "the replay ran prompt version " + replayed->prompt_version +
                            ", not the decision's own (no longer loaded): an answer to another "
                            "version cannot be promoted over this key's",
                        "/promote");
        }
        if (ctx.body.value("promote", false)) {
          // Promotes of one key go one at a time, on every daemon of the
          // store (a named lease of the daemon's own): each reads what the
          // key answers with, replaces it and retires what it displaced.
          // Two at once both retired the original's plan, and neither the
          // other's decision, which a decide between them could give a plan.
          const std::string lock = "idem.promote:" + original.decision_key;
          const std::string holder = "promote " + ctx.request_id;
          ASSIGN_OR_RETURN(LeaseResult held,
                           deps.store.leases().Acquire(lock, holder, "", kPromoteLockMs,
                                                       deps.clock.NowMillis()));
          if (held.outcome == LeaseOutcome::kHeld) {
            return Status(Code::kFailedPrecondition,
                          "another promote of this decision's key is running (" +
                              held.lease.holder +
                              "): read the key's decision again when it is "
                              "done, and promote then if this answer should still replace it",
                          "/promote", /*retryable=*/true);
          }
          struct Unlock {
            Store& store;
            const std::string& lock;
            const std::string& holder;
            const std::string token;
            ~Unlock() { (void)store.leases().Release(lock, holder, token); }
          } unlock{deps.store, lock, holder, held.lease.token};
          IDEM_FAILPOINT("api.promote_locked");
          // The replayed answer becomes the cached decision for the key;
          // its audit record is written first, so no promote goes
          // unrecorded (a Replace that then fails leaves the record, with
          // the request's trace, and its error goes to the caller).
          AuditEvent event;
          event.at_ms = deps.clock.NowMillis();
          event.actor = ctx.caller;
          event.action = "decision.promoted";
          event.detail = {{"original_decision_id", original.decision_id},
                          {"decision_id", replayed->decision_id},
                          {"decision_key", original.decision_key},
                          {"provider", replayed->provider},
                          {"model", replayed->model},
                          {"prompt_version", replayed->prompt_version},
                          {"diff", body["diff"]},
                          {"request_id", ctx.request_id},
                          {"trace_id", ctx.trace.trace_id}};
          RETURN_IF_ERROR(deps.store.audit().Append(std::move(event)).status());
          // It answers the original's key (a replay with another model is
          // keyed by that model while it runs); the decision says which
          // provider and model answered.
          Decision promoted = *replayed;
          promoted.decision_key = original.decision_key;
          promoted.material = original.material;
          // Whoever chose this answer for the key may not approve its plan
          // (as an importer may not).
          if (promoted.trace.is_object()) promoted.trace["promoted_by"] = ctx.caller;
          // The decision the key answers with until now: the original, or
          // one that took its place since (a refresh, an earlier promote).
          std::string displaced;
          if (auto current =
                  deps.store.decisions().GetByKey(original.decision_key, deps.clock.NowMillis());
              current.ok() && current->decision_id != original.decision_id) {
            displaced = current->decision_id;
          }
          RETURN_IF_ERROR(deps.store.decisions().Replace(promoted));
          body["promoted"] = true;
          // What the answer describes is what is stored now: under the
          // original's key, not the replay's setup's.
          body["replayed"]["decision_key"] = original.decision_key;
          // The plans of the original and of the displaced decision, if
          // they still wait, would run their own actions beside the new
          // decision's: they are retired now (and would be refused at
          // their approval anyway, should this fail).
          // A plan already approved (or running, or run) is not retired:
          // its actions ran or run, and the operator who promoted should
          // know that the new decision's plan, once approved, acts again.
          Json retired_ids = Json::array();
          Json started = Json::array();
          for (const std::string& id : {original.decision_id, displaced}) {
            if (id.empty()) continue;
            auto retired = deps.plans.RetireSupersededPlan(id, ctx.caller);
            if (retired.ok() && !retired->empty()) {
              retired_ids.push_back(*retired);
              continue;
            }
            auto plan = deps.store.plans().Get(PlanEngine::DecisionPlanId(id));
            if (plan.ok() && (plan->state == "approved" || plan->state == "applying" ||
                              plan->state == "applied" || plan->state == "partially_failed")) {
              started.push_back({{"plan_id", plan->plan_id}, {"state", plan->state}});
            }
          }
          if (!retired_ids.empty()) {
            body["retired_plan_id"] = retired_ids[0];
            body["retired_plan_ids"] = std::move(retired_ids);
          }
          if (!started.empty()) body["started_plans"] = std::move(started);
        }
        return RouteResponse{200, std::move(body), {}};
      }});

  routes.push_back(Route{
      .method = "GET",
      .pattern = "/v1/decisions",
      .summary = "Decisions, newest first (?step=&status=&cursor=&limit=).",
      .responses = {{200, "decision.list"}, {400, "problem"}, {404, "problem"}},
      .roles = {"agent", "operator"},
      .query = {TextDoc("step", "only this step's decisions (404 for one not configured)"),
                OneOfDoc("status", kDecisionStatuses, "only decisions in this status"), CursorDoc(),
                LimitDoc(kDecisionsPage)},
      .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
        ASSIGN_OR_RETURN(size_t limit, LimitParam(ctx, kDecisionsPage));
        ASSIGN_OR_RETURN(std::string status, OneOfParam(ctx, "status", kDecisionStatuses));
        ASSIGN_OR_RETURN(std::string step, ConfiguredParam(ctx, "step", deps.config.steps, "step"));
        ASSIGN_OR_RETURN(DecisionPage page, deps.store.decisions().List(
                                                step, status, QueryParam(ctx, "cursor"), limit));
        Json items = Json::array();
        for (const auto& d : page.items) items.push_back(DecisionSummary(d));
        Json body = {{"items", items}};
        if (!page.next_cursor.empty()) body["next_cursor"] = page.next_cursor;
        return RouteResponse{200, std::move(body), {}};
      }});

  routes.push_back(Route{
      .method = "GET",
      .pattern = "/v1/escalations",
      .summary = "Decides that ran out of attempts and fallbacks, waiting for a human "
                 "(?state=open|resolved).",
      .responses = {{200, "escalation.list"}, {400, "problem"}},
      .roles = {"operator"},
      .query = {OneOfDoc("state", kEscalationStates, "only escalations in this state"),
                LimitDoc(kEscalationsPage)},
      .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
        ASSIGN_OR_RETURN(size_t limit, LimitParam(ctx, kEscalationsPage));
        ASSIGN_OR_RETURN(std::string state, OneOfParam(ctx, "state", kEscalationStates));
        ASSIGN_OR_RETURN(std::vector<Escalation> list, deps.store.escalations().List(state, limit));
        Json items = Json::array();
        for (const auto& e : list) {
          Json j = EscalationSummary(e);
          j["input"] = e.input;
          items.push_back(std::move(j));
        }
        return RouteResponse{200, {{"items", items}}, {}};
      }});

  routes.push_back(Route{
      .method = "GET",
      .pattern = "/v1/escalations/{id}",
      .summary = "One escalation with its context: what was asked, every attempt, the best guess.",
      .responses = {{200, "escalation"}, {404, "problem"}},
      .roles = {"operator"},
      .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
        ASSIGN_OR_RETURN(Escalation e, deps.store.escalations().Get(ctx.params[0]));
        Json j = EscalationSummary(e);
        j["input"] = e.input;
        return RouteResponse{200, std::move(j), {}};
      }});

  routes.push_back(Route{
      .method = "POST",
      .pattern = "/v1/escalations/{id}/resolve",
      .summary = "A human's answer: validated like a model's output, then the cached decision "
                 "for the escalated key (decided_by: human).",
      .key_policy = KeyPolicy::kOptional,
      .request_schema = "escalation.resolve.request",
      .responses = {{200, "decide.response"}, {400, "problem"}, {404, "problem"}, {409, "problem"}},
      .roles = {"operator"},
      .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
        // Without tokens nobody has an identity, and the body may name the
        // human; with tokens the resolver is the token, whatever it says.
        std::string actor = ctx.caller;
        if (deps.config.auth.tokens.empty() && actor == "anonymous") {
          actor = ctx.body.value("actor", "anonymous");
          // "idem" is the daemon's own hand (a refresh closing an
          // escalation), "inbox:NAME" a webhook sender's and "anonymous" no
          // one's: a human's answer must not pass for them in the audit
          // trail, with odd case, spaces or controls either.
          if (ctx.body.contains("actor") &&
              (!IsPrintableText(actor) || IsReservedCallerName(http1::TrimOws(actor)))) {
            return InvalidArgument(
                "'idem', 'anonymous' and 'inbox:…' are reserved (the daemon itself, no one and "
                "webhook senders in the audit trail), as are control characters: name the human",
                "/actor");
          }
        }
        ASSIGN_OR_RETURN(Decision d,
                         deps.decide.ResolveEscalation(ctx.params[0], ctx.body["output"], actor,
                                                       ctx.body.value("note", "")));
        AuditEvent event;
        event.at_ms = deps.clock.NowMillis();
        event.actor = actor;
        event.action = "escalation.resolved";
        event.detail = {{"escalation_id", ctx.params[0]},
                        {"decision_id", d.decision_id},
                        {"step", d.step},
                        {"output", d.output},
                        {"note", ctx.body.value("note", "")},
                        {"trace_id", ctx.trace.trace_id}};
        RETURN_IF_ERROR(deps.store.audit().Append(std::move(event)).status());
        Json body = DecisionSummary(d);
        body["cache"] = "miss";
        ASSIGN_OR_RETURN(std::optional<Json> plan, PlanOf(deps, d, actor));
        if (plan) body["plan"] = std::move(*plan);
        return RouteResponse{200, std::move(body), {}};
      }});

  AddWorkRoutes(deps, routes);
  AddAuditRoutes(deps, routes);
  AddUiRoutes(deps, routes);
  AddInboxRoutes(deps, routes);
  AddReplayRoutes(deps, routes);
  AddOutboxRoutes(deps, routes);
  auto table = std::make_shared<std::vector<Route>>();  // filled once complete
  AddMcpRoutes(deps, table, routes);

  // /openapi.json documents every route, itself included.
  auto doc = std::make_shared<Json>();  // shared: filled after the table is complete
  routes.push_back(Route{.method = "GET",
                         .pattern = "/openapi.json",
                         .summary = "This API as an OpenAPI 3.1 document.",
                         .responses = {{200, "openapi"}},
                         .is_public = true,
                         .handler = [doc](RequestContext&) -> StatusOr<RouteResponse> {
                           return RouteResponse{200, *doc, {}};
                         }});
  for (Route& r : routes) CompileRoute(r);
  *doc = BuildOpenApi(routes);
  *table = routes;
  // The table is for looking routes up, not for running /mcp itself: its
  // copy of the MCP handlers (which own the toolbox that owns the table)
  // would make a cycle that is never freed.
  for (Route& r : *table) {
    if (r.pattern == "/mcp") r.handler = nullptr;
  }
  return routes;
}

}  // namespace idem
