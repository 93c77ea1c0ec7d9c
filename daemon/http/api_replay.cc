// Bulk replay (issue 11): POST /v1/replays starts a job of
// daemon/replay/replay_jobs.h, GET /v1/replays/{id} reports its progress
// and summary.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <ctime>

#include "daemon/http/api.h"
#include "daemon/replay/replay_jobs.h"

namespace idem {
namespace {

// `since` of a bulk replay: epoch milliseconds, a duration before now, or a
// UTC time.
StatusOr<int64_t> ParseSince(const Json& since, int64_t now_ms) {
  // Epoch milliseconds: a JSON integer, or its digits as text (as the CLI's
  // --since sends them).
  std::optional<int64_t> ms;
  const std::string text = since.is_string() ? since.get<std::string>() : std::string();
  if (since.is_number_integer()) {
    ms = since.is_number_unsigned() && since.get<uint64_t>() > uint64_t{INT64_MAX}
             ? INT64_MAX
             : since.get<int64_t>();
  } else if (!text.empty() && text.find_first_not_of("0123456789") == std::string::npos) {
    int64_t parsed = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), parsed);
    ms = ec == std::errc() && end == text.data() + text.size() ? parsed : INT64_MAX;
  } else if (!since.is_string()) {
    return InvalidArgument("since is a duration (24h), a UTC time or epoch milliseconds", "/since");
  }
  if (ms) {
    if (*ms < 0 || *ms > kMaxEpochMillis) {
      return InvalidArgument("since in epoch milliseconds is from 0 to " +
                                 std::to_string(kMaxEpochMillis) + " (9999-12-31)",
                             "/since");
    }
    return *ms;
  }
  // A duration: that long before now.
  if (StatusOr<int64_t> ago = ParseDuration(text); ago.ok() && *ago > 0) {
    return std::max<int64_t>(0, now_ms - *ago);
  }
  // A UTC time: 2026-11-30, 2026-11-30T14:05:00Z (fractions of a second ignored).
  int y = 0, mo = 0, d = 0, h = 0, mi = 0, s = 0, used = 0;
  bool ok = false;
  if (std::sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%n", &y, &mo, &d, &h, &mi, &s, &used) ==
      6) {
    size_t i = static_cast<size_t>(used);
    if (i < text.size() && text[i] == '.') {
      ++i;
      while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
    }
    ok = i + 1 == text.size() && text[i] == 'Z';
  } else if (std::sscanf(text.c_str(), "%4d-%2d-%2d%n", &y, &mo, &d, &used) == 3) {
    ok = static_cast<size_t>(used) == text.size();
  }
  // A day past its month's end (2026-02-31) is no date: it must not roll
  // over into the next month.
  const std::chrono::year_month_day date{std::chrono::year{y},
                                         std::chrono::month{static_cast<unsigned>(mo)},
                                         std::chrono::day{static_cast<unsigned>(d)}};
  if (!ok || mo < 1 || !date.ok() || h > 23 || mi > 59 || s > 60 || y < 1970) {
    return InvalidArgument(
        "since must be a duration such as 24h, a UTC time such as 2026-11-30T14:05:00Z or "
        "2026-11-30, or epoch milliseconds; got '" +
            text.substr(0, 64) + "'",
        "/since");
  }
  std::tm tm{};
  tm.tm_year = y - 1900;
  tm.tm_mon = mo - 1;
  tm.tm_mday = d;
  tm.tm_hour = h;
  tm.tm_min = mi;
  tm.tm_sec = s;
  return static_cast<int64_t>(timegm(&tm)) * 1000;
}

}  // namespace

void AddReplayRoutes(ApiDeps deps, std::vector<Route>& routes) {
  routes.push_back(Route{
      .method = "POST",
      .pattern = "/v1/replays",
      .summary = "Bulk replay: decide a step's recorded decisions again (another prompt version, "
                 "model, provider or temperature) in the background, the cache untouched; 202 "
                 "{replay_id, status_url}. The same Idempotency-Key returns the same job.",
      .key_policy = KeyPolicy::kOptional,
      .request_schema = "replay.request",
      .responses = {{202, "replay.accepted"},
                    {400, "problem"},
                    {404, "problem"},
                    {409, "problem"},
                    {503, "problem"}},
      .roles = {"operator"},
      .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
        if (deps.replays == nullptr) return Unavailable("bulk replay is not running");
        ReplayJobRequest r;
        r.step = ctx.body.value("step", "");
        if (ctx.body.contains("since")) {
          ASSIGN_OR_RETURN(r.since_ms, ParseSince(ctx.body["since"], deps.clock.NowMillis()));
        }
        r.limit = ctx.body.value("limit", size_t{1000});
        r.provider = ctx.body.value("provider", "");
        r.model = ctx.body.value("model", "");
        r.prompt_version = ctx.body.value("prompt_version", "");
        if (ctx.body.contains("temperature")) r.temperature = ctx.body["temperature"].get<double>();
        r.concurrency = ctx.body.value("concurrency", 4);
        r.created_by = ctx.caller;
        r.request_id = ctx.request_id;
        r.idempotency_key = ctx.idempotency_key;
        ASSIGN_OR_RETURN(std::string id, deps.replays->Start(r));
        const std::string url = "/v1/replays/" + id;
        return RouteResponse{202,
                             {{"replay_id", id}, {"state", "running"}, {"status_url", url}},
                             {{"Location", url}}};
      }});

  routes.push_back(Route{
      .method = "GET",
      .pattern = "/v1/replays/{id}",
      .summary = "A bulk replay's progress and summary: state, total, done, changed, the pointers "
                 "that changed most, the decisions that now fail validation, cost and tokens. "
                 "Kept in memory for the running and the last 20 finished jobs.",
      .responses = {{200, "replay"}, {404, "problem"}},
      .roles = {"operator"},
      .handler = [deps](RequestContext& ctx) -> StatusOr<RouteResponse> {
        if (deps.replays == nullptr) return NotFound("bulk replay is not running");
        ASSIGN_OR_RETURN(Json job, deps.replays->Get(ctx.params[0]));
        return RouteResponse{200, std::move(job), {}};
      }});
}

}  // namespace idem
