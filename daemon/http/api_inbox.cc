// POST /v1/inbox/{source}: webhook senders (R29). Each event is processed
// once however often it is delivered: the event id (a JSON pointer into the
// body or a header, per source) is begun as a key in the IdemKeyStore under
// the scope "inbox <source>" before anything runs. A new event runs the
// source's on_event (decide a step, run an action kind, or only record it)
// and its answer is stored; a duplicate, or a delivery that arrives while
// the first is still running, answers 200 at once with duplicate: true and
// runs nothing. A failure that a retry may fix (a provider or the store
// down) forgets the event, so the sender's retry processes it.
//
// Signature: hmac_sha256 (the header carries the hex HMAC-SHA-256 of the
// raw body with the secret from the source's environment variable, after an
// optional prefix such as "sha256=") or token (the header carries the secret
// itself, as Telegram's X-Telegram-Bot-Api-Secret-Token does); compared in
// constant time. A bad or missing signature is 401 and recorded nowhere. A
// source without a signature is served only while the daemon listens on
// loopback (checked at start-up, daemon.cc).
//
// The route takes the sender's content type and no bearer token: the
// signature is its authentication. A browser's foreign Origin is refused
// (RequestGuard::CheckOrigin): webhook senders send none, and a web page
// must not deliver events (to an unsigned source) through the browser.
//
// Errors name the event's own fields: the body's pointer "" when it is not
// JSON, the pointer where it nests too deep (400), and a payload's field
// where the sender put it (/data/id, not the action's /args/id).
#include <cstdlib>
#include <string_view>

#include "daemon/core/crypto.h"
#include "daemon/core/json.h"
#include "daemon/http/api.h"
#include "daemon/http/problem.h"

namespace idem {
namespace {

std::string Lower(std::string v) {
  for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return v;
}

std::string Header(const RequestContext& ctx, const std::string& name) {
  auto it = ctx.headers.find(name);
  return it == ctx.headers.end() ? std::string() : it->second;
}

Status CheckSignature(const InboxSource& src, const RequestContext& ctx) {
  if (src.signature_header.empty()) return Status::Ok();
  const char* secret = std::getenv(src.signature_env.c_str());
  if (secret == nullptr || *secret == '\0') {
    return Unavailable("inbox " + src.name + ": its signature secret is not set");
  }
  std::string sent = Header(ctx, src.signature_header);
  bool ok = false;
  if (src.signature_scheme == "token") {
    ok = !sent.empty() && ConstantTimeEquals(sent, secret);
  } else if (sent.size() > src.signature_prefix.size() &&
             sent.compare(0, src.signature_prefix.size(), src.signature_prefix) == 0) {
    ok = ConstantTimeEquals(Lower(sent.substr(src.signature_prefix.size())),
                            HmacSha256Hex(secret, ctx.raw_body));
  }
  if (!ok) {
    return Status(Code::kUnauthenticated, "the event's signature does not match",
                  "header:" + src.signature_header);
  }
  return Status::Ok();
}

// An error about the payload, named where the sender put it: what a decide
// names under /input, or an action under /args, is at `at` in the event.
Status AtPayload(const Status& s, std::string_view prefix, const std::string& at) {
  const std::string& field = s.field();
  if (field.compare(0, prefix.size(), prefix) != 0 ||
      (field.size() > prefix.size() && field[prefix.size()] != '/')) {
    return s;
  }
  std::string rebased = at + field.substr(prefix.size());
  return s.WithField(rebased.empty() ? std::string(kWholeBody) : rebased);
}

// What a new event does; the answer's body.
StatusOr<Json> Process(const ApiDeps& deps, const InboxSource& src, const Json& payload,
                       const std::string& event_id, const std::string& request_id) {
  const std::string actor = "inbox:" + src.name;
  Json out = {{"source", src.name}, {"event_id", event_id}, {"duplicate", false}};
  if (src.record_only) {
    out["outcome"] = "recorded";
    return out;
  }
  if (!src.decide_step.empty()) {
    DecideRequest req;
    req.step = src.decide_step;
    req.input = payload;
    req.request_id = request_id;
    StatusOr<DecideResult> decided = deps.decide.Decide(req);
    if (!decided.ok()) return AtPayload(decided.status(), "/input", src.payload_pointer);
    DecideResult& r = *decided;
    if (r.escalated && r.escalation.context.is_object() &&
        r.escalation.context.value("provider_outage", false) == true) {
      // No model answered: not the event's answer. Forgotten, so that the
      // sender's retry decides it (the next decide asks the model again).
      return Unavailable("no model answered (" + src.decide_step +
                         "'s providers are failing); send the event again after Retry-After");
    }
    if (r.escalated) {
      out["outcome"] = "escalated";
      out["escalation_id"] = r.escalation.escalation_id;
      return out;
    }
    out["outcome"] = "decided";
    out["decision_id"] = r.decision.decision_id;
    out["output"] = r.decision.output;
    auto sit = deps.config.steps.find(src.decide_step);
    if (sit != deps.config.steps.end() && !sit->second.plan_pointer.empty()) {
      auto plan = deps.plans.ProposeFromDecision(r.decision, actor);
      if (plan.ok()) out["plan"] = {{"plan_id", plan->plan_id}, {"state", plan->state}};
    }
    return out;
  }
  const ActionConfig& kind = deps.config.actions.at(src.action_kind);
  RETURN_IF_ERROR(deps.plans.CheckArgs(kind, payload, src.payload_pointer));
  StatusOr<Gate> gated = deps.plans.GateAction(kind, payload, "action", actor);
  if (!gated.ok()) return AtPayload(gated.status(), "/args", src.payload_pointer);
  Gate& gate = *gated;
  if (!gate.allowed) {
    out["outcome"] = "awaiting_approval";
    out["plan_id"] = gate.plan.plan_id;
    return out;
  }
  StatusOr<ActionOutcome> submitted = deps.apply.Submit(kind.name, gate.args, "", request_id);
  if (!submitted.ok()) return AtPayload(submitted.status(), "/args", src.payload_pointer);
  ActionOutcome& o = *submitted;
  out["outcome"] = o.kind == ActionOutcomeKind::kExecuted    ? "executed"
                   : o.kind == ActionOutcomeKind::kDuplicate ? "already_done"
                   : o.kind == ActionOutcomeKind::kRetrying  ? "retrying"
                   : o.kind == ActionOutcomeKind::kBusy      ? "busy"
                                                             : "dead";
  out["work_id"] = o.item.work_id;
  return out;
}

}  // namespace

void AddInboxRoutes(ApiDeps deps, std::vector<Route>& routes) {
  std::vector<std::string> headers;
  for (const auto& [name, src] : deps.config.inbox) {
    if (!src.id_header.empty()) headers.push_back(src.id_header);
    if (!src.signature_header.empty()) headers.push_back(src.signature_header);
  }
  routes.push_back(Route{
      .method = "POST",
      .pattern = "/v1/inbox/{source}",
      .summary = "A webhook event from a configured sender: processed once per event id "
                 "(200 with duplicate: true for a repeat; 503 with Retry-After while the first "
                 "delivery is still being processed); 401 for a bad signature.",
      .responses = {{200, "inbox.response"},
                    {400, "problem"},
                    {401, "problem"},
                    {403, "problem"},
                    {404, "problem"},
                    {409, "problem"},
                    {503, "problem"},
                    {504, "problem"}},
      .is_public = true,
      .browser_origin_checked = true,
      .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
        auto sit = deps.config.inbox.find(ctx.params[0]);
        if (sit == deps.config.inbox.end()) {
          return Status(Code::kNotFound, "no inbox source named '" + ctx.params[0] + "'",
                        "path:source");
        }
        const InboxSource& src = sit->second;
        RETURN_IF_ERROR(CheckSignature(src, ctx));
        JsonLimits limits;
        limits.max_bytes = deps.config.server.max_body_bytes;
        limits.max_depth = deps.config.server.max_json_depth;
        limits.exact_integer_literals = true;  // the event's fields may be an identity
        Json body;
        if (!ctx.raw_body.empty()) {
          auto parsed = ParseJson(ctx.raw_body, limits);
          if (!parsed.ok()) {
            return BodyParseError(parsed.status(), ctx.raw_body.size(), limits.max_bytes);
          }
          body = std::move(parsed).value();
        }
        std::string event_id;
        const std::string id_at =
            src.id_header.empty() ? src.id_pointer : "header:" + src.id_header;
        if (!src.id_header.empty()) {
          event_id = Header(ctx, src.id_header);
          if (event_id.empty()) return InvalidArgument("the event id header is missing", id_at);
        } else {
          Json::json_pointer ptr(src.id_pointer);
          if (!body.is_object() || !body.contains(ptr) ||
              !(body.at(ptr).is_string() || body.at(ptr).is_number_integer())) {
            return InvalidArgument("the event has no id (a string or an integer) here",
                                   src.id_pointer);
          }
          const Json& id = body.at(ptr);
          event_id = id.is_string() ? id.get<std::string>() : id.dump();
        }
        if (!IsValidUtf8(event_id)) {
          return InvalidArgument("the event id is not valid UTF-8 text", id_at);
        }
        if (event_id.empty() || CodePoints(event_id) > 255) {
          return InvalidArgument("an event id is 1 to 255 characters", id_at);
        }
        Json payload = body;
        if (!src.payload_pointer.empty()) {
          Json::json_pointer ptr(src.payload_pointer);
          if (!body.is_object() || !body.contains(ptr)) {
            return InvalidArgument("the event has nothing here", src.payload_pointer);
          }
          payload = body.at(ptr);
        }
        IdemKeyStore& keys = deps.store.idem_keys();
        const std::string scope = "inbox " + src.name;
        const std::string fingerprint = "event";  // the id alone names the event
        ASSIGN_OR_RETURN(BeginResult begun, keys.Begin(scope, event_id, fingerprint, ctx.request_id,
                                                       deps.clock.NowMillis(), src.window_ms,
                                                       deps.config.idempotency.lease_ms));
        if (begun.outcome != BeginOutcome::kNew && begun.outcome != BeginOutcome::kReplay) {
          // The first delivery is still being processed, and may yet fail
          // (then the event is forgotten for a retry to process): a 2xx now
          // would stop the sender's retries and lose the event. A sender
          // retries a 503, after Retry-After.
          deps.metrics.inbox_duplicates.Inc();
          RouteResponse busy{503,
                             ProblemBody(503,
                                         Unavailable("event " + event_id + " of " + src.name +
                                                     " is still being processed; send it again "
                                                     "after Retry-After"),
                                         ctx.request_id),
                             {{"Retry-After", "1"}}};
          busy.transient = true;
          return busy;
        }
        if (begun.outcome == BeginOutcome::kReplay) {
          Json dup = {{"source", src.name}, {"event_id", event_id}, {"duplicate", true}};
          auto first =
              ParseJson(begun.record.response_body,
                        StoredAnswerLimits(deps.config, begun.record.response_body.size()));
          if (first.ok()) dup["first"] = *first;
          deps.metrics.inbox_duplicates.Inc();
          return RouteResponse{200, std::move(dup), {}};
        }
        // A long decide or effect keeps the event its own: the key's lease is
        // renewed while it runs, so a sender's retry waits (503) instead of
        // processing the event a second time.
        const uint64_t held =
            ctx.hold_key ? ctx.hold_key(scope, event_id, fingerprint, begun.record.lease_until_ms)
                         : 0;
        StatusOr<Json> out = Process(deps, src, payload, event_id, ctx.request_id);
        if (ctx.drop_key) ctx.drop_key(held);
        if (!out.ok()) {
          // Not processed: the sender's retry must find the event new.
          (void)keys.Abandon(scope, event_id, fingerprint);
          return out.status();
        }
        RETURN_IF_ERROR(keys.Finish(scope, event_id, fingerprint, 200, out->dump(),
                                    "application/json", deps.clock.NowMillis()));
        deps.metrics.inbox_events.Inc();
        return RouteResponse{200, std::move(out).value(), {}};
      },
      .request_headers = headers,
      .raw_body = true});
}

}  // namespace idem
