// `idem replay`: the diff of one decision and a bulk replay's progress and
// summary, against a fake daemon that speaks the API's JSON.
#include <doctest/doctest.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "daemon/cli/cli.h"

namespace idem::cli {
namespace {

class FakeDaemon final : public HttpClient {
 public:
  std::function<StatusOr<HttpResponse>(const HttpRequest&)> answer;
  std::vector<HttpRequest> seen;
  StatusOr<HttpResponse> Send(const HttpRequest& r) override {
    seen.push_back(r);
    return answer(r);
  }
};

HttpResponse Answer(int status, const Json& body) {
  HttpResponse r;
  r.status = status;
  r.headers = {{"content-type", status >= 400 ? "application/problem+json" : "application/json"}};
  r.body = body.dump();
  return r;
}

struct Captured {
  std::FILE* out = std::tmpfile();
  std::FILE* err = std::tmpfile();
  ~Captured() {
    std::fclose(out);
    std::fclose(err);
  }
  Output Make(bool json = false, bool color = false) const {
    Output o;
    o.out = out;
    o.err = err;
    o.json = json;
    o.style.color = color;
    return o;
  }
  static std::string Read(std::FILE* f) {
    std::fflush(f);
    std::rewind(f);
    std::string s;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
    return s;
  }
  std::string Out() const { return Read(out); }
  std::string Err() const { return Read(err); }
};

Json ReplayAnswer() {
  return Json::parse(R"({
    "original": {"decision_id": "dec_1", "step": "triage_ticket", "provider": "demo",
                 "model": "demo-1", "prompt_version": "v1"},
    "replayed": {"decision_id": "dec_2", "provider": "demo", "model": "demo-1",
                 "prompt_version": "v2", "cost_usd": 0.0004},
    "diff": {"changed": [{"pointer": "/category", "from": "refund", "to": "bug"}],
             "added": [{"pointer": "/tags/0", "value": "urgent"}],
             "removed": [{"pointer": "/actions/0", "value": {"kind": "send_reply"}}]}})");
}

Json Job(const std::string& state, int64_t done) {
  Json j = Json::parse(R"({
    "replay_id": "rpl_1", "phase": "replaying", "step": "triage_ticket", "prompt_version": "v2",
    "total": 4, "changed": 2, "unchanged": 1, "failed_validation_count": 1,
    "failed_validation": ["dec_9"], "errors": 0, "error_samples": [],
    "top_changed_pointers": [{"pointer": "/category", "count": 2}, {"pointer": "/priority", "count": 1}],
    "cost_usd": 0.5, "original_cost_usd": 0.25, "tokens": {"input": 100, "output": 40},
    "started_at_ms": 1000, "finished_at_ms": 3500})");
  j["state"] = state;
  j["done"] = done;
  if (state != "running") j["phase"] = "finished";
  return j;
}

}  // namespace

TEST_CASE("replay_diff_shows_each_pointer_before_and_after") {
  std::string text = RenderReplayDiff(ReplayAnswer(), Style{});
  CHECK(text.find("replayed dec_1 (step triage_ticket): demo/demo-1 prompt v1 → demo/demo-1 "
                  "prompt v2, cost $0.0004\n") == 0);
  CHECK(text.find("3 changes:\n") != std::string::npos);
  CHECK(text.find("  ~ /category: \"refund\" → \"bug\"\n") != std::string::npos);
  CHECK(text.find("  + /tags/0: \"urgent\"\n") != std::string::npos);
  CHECK(text.find("  - /actions/0: {\"kind\":\"send_reply\"}\n") != std::string::npos);
  CHECK(text.find("\x1b[") == std::string::npos);
  // Colour only when asked (a tty).
  CHECK(RenderReplayDiff(ReplayAnswer(), Style{true}).find("\x1b[33m  ~ /category") !=
        std::string::npos);
}

TEST_CASE("replay_diff_of_two_long_texts_that_differ_late_shows_where_they_differ") {
  Json answer = ReplayAnswer();
  const std::string common(200, 'x');
  answer["diff"] = {{"changed", Json::array({{{"pointer", "/actions/0/args/text"},
                                              {"from", common + " -- good-high"},
                                              {"to", common + " -- good-high-v2"}}})},
                    {"added", Json::array()},
                    {"removed", Json::array()}};
  const std::string text = RenderReplayDiff(answer, Style{});
  CAPTURE(text);
  CHECK(text.find("-- good-high\" → …") != std::string::npos);
  CHECK(text.find("-- good-high-v2\"") != std::string::npos);
}

TEST_CASE("replay_diff_says_no_change_and_reports_a_failed_replay") {
  Json same = ReplayAnswer();
  same["diff"] = {{"changed", Json::array()}, {"added", Json::array()}, {"removed", Json::array()}};
  CHECK(RenderReplayDiff(same, Style{}).find("no change: the same output") != std::string::npos);
  Json failed = ReplayAnswer();
  failed["replayed"] = {{"status", "failed"}, {"error", "the model's output failed validation"}};
  failed["diff"] = nullptr;
  std::string text = RenderReplayDiff(failed, Style{});
  CHECK(text.find("→ no valid output") != std::string::npos);
  CHECK(text.find("failed validation") != std::string::npos);
}

TEST_CASE("replay_of_one_decision_posts_the_options_and_maps_errors_to_exit_codes") {
  FakeDaemon http;
  http.answer = [](const HttpRequest& r) -> StatusOr<HttpResponse> {
    if (r.url.find("dec_missing") != std::string::npos) {
      return Answer(404, {{"title", "Not Found"}, {"status", 404}, {"detail", "no decision"}});
    }
    return Answer(200, ReplayAnswer());
  };
  DaemonClient api("http://d", "", http);
  Captured c;
  CHECK(ReplayDecision(api, c.Make(), "dec_1", {{"prompt_version", "v2"}}) == kExitOk);
  REQUIRE(http.seen.size() == 1);
  CHECK(http.seen[0].method == "POST");
  CHECK(http.seen[0].url == "http://d/v1/decisions/dec_1/replay");
  CHECK(Json::parse(http.seen[0].body) == Json{{"prompt_version", "v2"}});
  CHECK(c.Out().find("~ /category") != std::string::npos);
  Captured missing;
  CHECK(ReplayDecision(api, missing.Make(), "dec_missing", Json::object()) == kExitNotFound);
  CHECK(missing.Err().find("HTTP 404") != std::string::npos);
}

TEST_CASE("progress_bar_fills_in_proportion") {
  CHECK(ProgressBar(0, 0, 10) == "[..........] 0/0");
  CHECK(ProgressBar(5, 10, 10) == "[#####.....] 5/10 (50.0%)");
  CHECK(ProgressBar(10, 10, 4) == "[####] 10/10 (100.0%)");
  CHECK(ProgressBar(12, 10, 4) == "[####] 12/10 (120.0%)");  // never past the width
}

TEST_CASE("bulk_replay_polls_until_done_then_prints_the_summary") {
  FakeDaemon http;
  int polls = 0;
  http.answer = [&polls](const HttpRequest& r) -> StatusOr<HttpResponse> {
    if (r.method == "POST") {
      return Answer(202, {{"replay_id", "rpl_1"}, {"state", "running"}, {"status_url", "/x"}});
    }
    ++polls;
    // The count moves 1, 1 (no new line), 4.
    return Answer(200, polls < 3 ? Job("running", 1) : Job("done", 4));
  };
  DaemonClient api("http://d", "", http);
  Captured c;
  Json body = {{"step", "triage_ticket"}, {"prompt_version", "v2"}, {"limit", 4}};
  CHECK(BulkReplay(api, c.Make(), body, /*tty_progress=*/false, /*poll_ms=*/1) == kExitOk);
  REQUIRE(http.seen.size() == 4);
  CHECK(http.seen[0].url == "http://d/v1/replays");
  CHECK(Json::parse(http.seen[0].body) == body);
  bool keyed = false;
  for (const auto& [name, value] : http.seen[0].headers) {
    keyed =
        keyed || (name == "Idempotency-Key" && value.find("cli-bulk-replay-") != std::string::npos);
  }
  CHECK(keyed);
  CHECK(http.seen[1].url == "http://d/v1/replays/rpl_1");
  // Plain progress lines (not a tty), one per count that moved.
  CHECK(c.Err() ==
        "bulk replay rpl_1 started\nbulk replay rpl_1: 1/4 done\nbulk replay rpl_1: 4/4 done\n");
  std::string out = c.Out();
  CHECK(out.find("bulk replay rpl_1 done: step triage_ticket, prompt v2, 4 of 4 decisions in "
                 "2.5s\n") == 0);
  CHECK(out.find("changed            2          50.0%") != std::string::npos);
  CHECK(out.find("failed validation  1          25.0%") != std::string::npos);
  CHECK(out.find("cost $0.5000 (the originals cost $0.2500), tokens 100 in / 40 out") !=
        std::string::npos);
  CHECK(out.find("/category  2") != std::string::npos);
  CHECK(out.find("Decisions that now fail validation (1):\n  dec_9\n") != std::string::npos);
}

TEST_CASE("bulk_replay_draws_a_bar_on_a_tty_and_prints_json_for_scripts") {
  FakeDaemon http;
  int polls = 0;
  http.answer = [&polls](const HttpRequest& r) -> StatusOr<HttpResponse> {
    if (r.method == "POST") return Answer(202, {{"replay_id", "rpl_1"}, {"state", "running"}});
    return Answer(200, ++polls < 2 ? Job("running", 2) : Job("done", 4));
  };
  DaemonClient api("http://d", "", http);
  Captured tty;
  CHECK(BulkReplay(api, tty.Make(), Json::object(), true, 1) == kExitOk);
  CHECK(tty.Err().find("\r[####################....................] 2/4 (50.0%)") !=
        std::string::npos);
  CHECK(tty.Err().find("\r[########################################] 4/4 (100.0%)") !=
        std::string::npos);
  polls = 0;
  Captured json;
  CHECK(BulkReplay(api, json.Make(true), Json::object(), false, 1) == kExitOk);
  CHECK(json.Err().empty());
  CHECK(Json::parse(json.Out())["changed"] == 2);
}

TEST_CASE("bulk_replay_exits_non_zero_when_the_job_failed_or_was_refused") {
  FakeDaemon http;
  bool refuse = false;
  http.answer = [&refuse](const HttpRequest& r) -> StatusOr<HttpResponse> {
    if (r.method == "POST") {
      if (refuse) {
        return Answer(409, {{"title", "Conflict"}, {"status", 409}, {"detail", "at most 2"}});
      }
      return Answer(202, {{"replay_id", "rpl_1"}, {"state", "running"}});
    }
    Json j = Job("failed", 1);
    j["error"] = "cancelled (the daemon is stopping)";
    return Answer(200, j);
  };
  DaemonClient api("http://d", "", http);
  Captured failed;
  CHECK(BulkReplay(api, failed.Make(), Json::object(), false, 1) == kExitFailed);
  CHECK(failed.Out().find("error: cancelled") != std::string::npos);
  refuse = true;
  Captured refused;
  CHECK(BulkReplay(api, refused.Make(), Json::object(), false, 1) == kExitConflict);
  CHECK(refused.Err().find("HTTP 409 Conflict: at most 2") != std::string::npos);
}

}  // namespace idem::cli
