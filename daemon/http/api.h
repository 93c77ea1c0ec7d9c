// The v1 HTTP API: builds the route table (router.h) over the daemon's
// engines. Handlers translate between JSON bodies and engine calls; the
// pipeline around them (auth, limits, Idempotency-Key) is the server's.
//
// Thread-safety: the handlers are thread-safe; the deps must outlive them.
#pragma once

#include <algorithm>
#include <atomic>
#include <memory>
#include <span>
#include <vector>

#include "daemon/apply/apply_engine.h"
#include "daemon/config/config.h"
#include "daemon/core/env.h"
#include "daemon/core/json.h"
#include "daemon/decide/decide_engine.h"
#include "daemon/http/router.h"
#include "daemon/obs/metrics.h"
#include "daemon/plans/notifier.h"
#include "daemon/plans/plan_engine.h"
#include "daemon/store/store.h"

namespace idem {

class ReplayJobs;  // daemon/replay/replay_jobs.h

// Limits for reading back an answer the daemon stored under a key (an
// Idempotency-Key's, an MCP call's, an inbox event's): it is ours, bounded
// when it was made, so it is read whole (`bytes`), as deep as the deepest
// value a route takes or keeps plus a few levels of the answer's wrapping,
// not under a request's limits (a replay must never fail where the first
// answer did not).
inline JsonLimits StoredAnswerLimits(const Config& config, size_t bytes) {
  constexpr int kWrapping = 8;
  return JsonLimits{
      .max_bytes = bytes,
      .max_depth = std::max(config.server.max_json_depth, JsonLimits{}.max_depth) + kWrapping};
}

struct ApiDeps {
  const Config& config;
  Store& store;
  DecideEngine& decide;
  ApplyEngine& apply;
  Metrics& metrics;
  StableClock& clock;
  PlanEngine& plans;
  Notifier& notifier;             // awaiting_approval / approval_overdue / escalation / dead_letter
  ReplayJobs* replays = nullptr;  // bulk replay jobs; null: /v1/replays answers 503
  CostLedger* costs = nullptr;    // GET /v1/stats/cost (null: the route answers 503)
  // Set when the daemon begins to stop (SIGTERM): a long handler (a run)
  // starts no more work and answers 503, so the stop is bounded by the
  // work already started, not by the rest of a 10,000-item run.
  const std::atomic<bool>* stopping = nullptr;
};

// Every route, /openapi.json included (documenting all of them).
std::vector<Route> BuildApiRoutes(ApiDeps deps);

// The apply half: work claims, actions, runs, plans, dead letters, named
// leases, reconciliation (api_work.cc).
void AddWorkRoutes(ApiDeps deps, std::vector<Route>& routes);

// The audit log, paged, and its verification (api_audit.cc).
void AddAuditRoutes(ApiDeps deps, std::vector<Route>& routes);

// The MCP endpoint (api_mcp.cc): its tools run the routes of `table`,
// which the caller fills with the finished route table.
void AddMcpRoutes(ApiDeps deps, std::shared_ptr<const std::vector<Route>> table,
                  std::vector<Route>& routes);

// The operator web page (/ui/, its files from daemon/ui) and GET
// /v1/steps/{name}, which its escalation form reads (ui_routes.cc).
void AddUiRoutes(ApiDeps deps, std::vector<Route>& routes);

// POST /v1/inbox/{source}: webhook events processed once each (api_inbox.cc).
void AddInboxRoutes(ApiDeps deps, std::vector<Route>& routes);

// POST /v1/replays, GET /v1/replays/{id}: bulk replay jobs (api_replay.cc).
void AddReplayRoutes(ApiDeps deps, std::vector<Route>& routes);
// GET /v1/events and the outbox's dead letters (api_outbox.cc).
void AddOutboxRoutes(ApiDeps deps, std::vector<Route>& routes);
// Decisions as JSON Lines: GET /v1/decisions/export, POST
// /v1/decisions/import; and GET /v1/stats/cost (api_decisions_io.cc).
void AddDecisionIoRoutes(ApiDeps deps, std::vector<Route>& routes);

// Shared by the route files.
// A list's page size: ?limit= from 1 to `max`, `def` when absent.
struct PageSize {
  size_t def;
  size_t max;
};
StatusOr<size_t> LimitParam(const RequestContext& ctx, PageSize page);
StatusOr<size_t> LimitParam(const RequestContext& ctx, size_t def, size_t max);
// The /openapi.json declarations of the parameters these helpers read.
QueryDoc LimitDoc(PageSize page);
QueryDoc OneOfDoc(const std::string& name, std::span<const char* const> allowed,
                  const std::string& description);
QueryDoc TextDoc(const std::string& name, const std::string& description, bool required = false);
QueryDoc CursorDoc();
QueryDoc MillisDoc(const std::string& name, const std::string& description);
// The latest time a query may name: 9999-12-31T23:59:59.999Z (a UTC day
// past it has no four-digit year).
inline constexpr int64_t kMaxEpochMillis = 253'402'300'799'999;
// ?name= as epoch milliseconds from 0 to kMaxEpochMillis, `def` when absent;
// InvalidArgument at query:name otherwise.
StatusOr<int64_t> MillisParam(const RequestContext& ctx, const std::string& name, int64_t def);
std::string QueryParam(const RequestContext& ctx, const std::string& name);
// The query parameter `name` ("" when absent), or InvalidArgument (pointer
// query:NAME, listing them) when it is none of `allowed`: a filter with a
// mistyped value would otherwise match nothing and read as "none".
StatusOr<std::string> OneOfParam(const RequestContext& ctx, const std::string& name,
                                 std::span<const char* const> allowed);
// The query parameter `name` naming something of the config ("" when
// absent): InvalidArgument when present but empty (it is not "all"), and
// NotFound (pointer query:NAME) when `configured` holds no such `what`
// (a mistyped step would otherwise list nothing and read as "none").
template <typename Map>
StatusOr<std::string> ConfiguredParam(const RequestContext& ctx, const std::string& name,
                                      const Map& configured, const std::string& what) {
  auto it = ctx.query.find(name);
  if (it == ctx.query.end()) return std::string();
  if (it->second.empty()) {
    return InvalidArgument(name + " is empty; leave it out for all", "query:" + name);
  }
  if (!configured.contains(it->second)) {
    return Status(Code::kNotFound, "no " + what + " named '" + it->second + "' in the config",
                  "query:" + name);
  }
  return it->second;
}

}  // namespace idem
