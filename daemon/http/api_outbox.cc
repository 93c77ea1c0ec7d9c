// The outbox routes (R29): pull the events (GET /v1/events), list the
// subscribers' dead letters and ask for one to be delivered again.
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "daemon/core/failpoints.h"
#include "daemon/http/api.h"

namespace idem {
namespace {

constexpr PageSize kOutboxPage{100, 1000};

}  // namespace
namespace {

// A seq: the `after` cursor or a dead letter's path parameter.
StatusOr<uint64_t> SeqText(const std::string& v, const std::string& field, bool allow_empty) {
  if (v.empty() && allow_empty) return uint64_t{0};
  char* end = nullptr;
  errno = 0;
  unsigned long long n = std::strtoull(v.c_str(), &end, 10);
  if (v.empty() || v.size() > 20 || end == v.c_str() || *end != '\0' || v[0] == '-' ||
      v[0] == '+' || errno == ERANGE) {
    return InvalidArgument("must be a cursor this API returned (a number)", field);
  }
  return static_cast<uint64_t>(n);
}

// A cursor of /v1/events: "<store id>:<seq>" as next_cursor gives it, or a
// bare seq (0, or one kept from before cursors named their store). One of
// another store (a reset folder, another environment) is refused: its seq
// means nothing here, and a consumer that kept it would skip events.
// `named`: the cursor names its store, so this API returned it (a bare 0
// is a reader starting; "<id>:0" is one that has read an empty store).
StatusOr<uint64_t> CursorText(const std::string& v, const std::string& store_id, bool* named) {
  const size_t colon = v.find(':');
  *named = colon != std::string::npos;
  if (colon == std::string::npos) return SeqText(v, "query:after", true);
  if (v.compare(0, colon, store_id) != 0) {
    return Status(Code::kFailedPrecondition,
                  "this cursor is from another store (" + v.substr(0, std::min<size_t>(colon, 16)) +
                      ", this one is " + store_id +
                      "): start again with after=0, and dedupe on event_id",
                  "query:after");
  }
  return SeqText(v.substr(colon + 1), "query:after", false);
}

}  // namespace

void AddOutboxRoutes(ApiDeps deps, std::vector<Route>& routes) {
  routes.push_back(Route{
      .method = "GET",
      .pattern = "/v1/events",
      .summary = "Outbox events in commit order (?after=CURSOR&limit=100): decision.created, "
                 "plan.<state>, effect.done, work.dead_letter. Keep next_cursor and ask again "
                 "with it; an event is never skipped (a cursor retention has passed, or one beyond "
                 "the store's last event, is refused, 409). Dedupe on event_id.",
      .responses = {{200, "outbox.event.list"}, {400, "problem"}, {409, "problem"}},
      .roles = {"operator"},
      .query = {TextDoc("after",
                        "the next_cursor of the previous page (0, or absent: from the "
                        "first event kept)"),
                LimitDoc(kOutboxPage)},
      .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
        ASSIGN_OR_RETURN(std::optional<std::string> store_id, deps.store.meta().Get(kStoreIdKey));
        const std::string id = store_id.value_or("");
        bool named = false;
        ASSIGN_OR_RETURN(uint64_t after, CursorText(QueryParam(ctx, "after"), id, &named));
        ASSIGN_OR_RETURN(size_t limit, LimitParam(ctx, kOutboxPage));
        // Retention waits for the configured subscribers, not for pullers:
        // a cursor below what it deleted would skip those events unseen.
        const bool positioned = after > 0 || named;
        auto passed = [&](uint64_t swept) {
          return Status(Code::kFailedPrecondition,
                        "events after this cursor, up to seq " + std::to_string(swept) +
                            ", were deleted by retention (outbox.retention) before this reader "
                            "took them: reconcile what they covered, then continue with after=" +
                            (id.empty() ? "" : id + ":") + std::to_string(swept),
                        "query:after");
        };
        ASSIGN_OR_RETURN(uint64_t swept, deps.store.outbox().SweptThrough());
        if (positioned && after < swept) return passed(swept);
        if (positioned) IDEM_FAILPOINT("outbox.pull_between_reads");
        ASSIGN_OR_RETURN(std::vector<OutboxEvent> events, deps.store.outbox().After(after, limit));
        if (positioned && (events.empty() || events.front().seq != after + 1)) {
          // A sweep (another daemon's, on a shared store) may have deleted
          // the first events after the cursor between the two reads; it
          // deletes oldest first, so a page that starts right after the
          // cursor lost nothing.
          ASSIGN_OR_RETURN(swept, deps.store.outbox().SweptThrough());
          if (after < swept) return passed(swept);
        }
        if (events.empty() && after > 0) {
          // Nothing after it: caught up, unless this store never got that
          // far (restored from an older copy): its next events would take
          // seqs the reader believes it has seen.
          ASSIGN_OR_RETURN(uint64_t head, deps.store.outbox().Head());
          if (after > head) {
            return Status(Code::kFailedPrecondition,
                          "this cursor is ahead of this store, whose last event is seq " +
                              std::to_string(head) +
                              " (restored from an older copy, or a cursor it did not return): "
                              "its next events would take seqs this reader believes it has seen. "
                              "Reconcile what the reader saw after seq " +
                              std::to_string(head) + ", then continue with after=" +
                              (id.empty() ? "" : id + ":") + std::to_string(head),
                          "query:after");
          }
        }
        Json items = Json::array();
        for (const OutboxEvent& e : events) items.push_back(e.ToJson());
        // An empty page: on from what retention deleted, if that is further
        // (those events are gone for every reader; later ones still come).
        const uint64_t next = events.empty() ? std::max(after, swept) : events.back().seq;
        return RouteResponse{200,
                             {{"items", std::move(items)},
                              {"next_cursor", (id.empty() ? "" : id + ":") + std::to_string(next)}},
                             {}};
      }});

  routes.push_back(Route{
      .method = "GET",
      .pattern = "/v1/outbox/dead-letters",
      .summary = "Outbox events a subscriber did not take within its attempts "
                 "(?subscriber=NAME&limit=100&cursor=), oldest event first; a full page "
                 "has a next_cursor.",
      .responses = {{200, "outbox.dead_letter.list"}, {400, "problem"}, {404, "problem"}},
      .roles = {"operator"},
      .query = {TextDoc("subscriber", "only this subscriber's (404 for one not configured)"),
                LimitDoc(kOutboxPage), CursorDoc()},
      .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
        ASSIGN_OR_RETURN(size_t limit, LimitParam(ctx, kOutboxPage));
        ASSIGN_OR_RETURN(std::string subscriber,
                         ConfiguredParam(ctx, "subscriber", deps.config.outbox.subscribers,
                                         "outbox subscriber"));
        ASSIGN_OR_RETURN(uint64_t after, SeqText(QueryParam(ctx, "cursor"), "query:cursor", true));
        ASSIGN_OR_RETURN(std::vector<OutboxDeadLetter> dead,
                         deps.store.outbox().DeadLetters(subscriber, after, limit));
        Json items = Json::array();
        for (const OutboxDeadLetter& d : dead) items.push_back(d.ToJson());
        Json body = {{"items", std::move(items)}};
        if (dead.size() == limit) body["next_cursor"] = std::to_string(dead.back().event.seq);
        return RouteResponse{200, std::move(body), {}};
      }});

  routes.push_back(Route{
      .method = "POST",
      .pattern = "/v1/outbox/dead-letters/{subscriber}/{seq}/replay",
      .summary = "Deliver one outbox dead letter once more: 202 state replaying; the "
                 "subscriber's dispatcher posts it next (delivered: the dead letter goes; "
                 "refused: it is dead again with one more attempt).",
      .key_policy = KeyPolicy::kOptional,
      .responses = {{202, "outbox.dead_letter"}, {404, "problem"}},
      .roles = {"operator"},
      .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
        const std::string& subscriber = ctx.params[0];
        if (!deps.config.outbox.subscribers.contains(subscriber)) {
          return Status(Code::kNotFound, "no outbox subscriber " + subscriber, "path:subscriber");
        }
        ASSIGN_OR_RETURN(uint64_t seq, SeqText(ctx.params[1], "path:seq", false));
        ASSIGN_OR_RETURN(OutboxDeadLetter d, deps.store.outbox().RequestReplay(subscriber, seq));
        AuditEvent event;
        event.at_ms = deps.clock.NowMillis();
        event.actor = ctx.caller;
        event.action = "outbox.dead_letter.replayed";
        event.detail = {{"subscriber", subscriber},
                        {"event_id", d.event.event_id},
                        {"request_id", ctx.request_id}};
        RETURN_IF_ERROR(deps.store.audit().Append(std::move(event)).status());
        RouteResponse r{202, d.ToJson(), {}};
        r.transient = true;
        return r;
      }});
}

}  // namespace idem
