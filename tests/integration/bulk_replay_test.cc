// Bulk replay (issue 11): 1,000 recorded decisions replayed against a second
// prompt version loaded beside the first; the summary's counts and top
// pointers are exact and the cache is the same afterwards.
#include <doctest/doctest.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <set>
#include <thread>

#include "tests/integration/harness.h"

namespace idem::testing {
namespace {

// v1 (the default prompt) answers every ticket as a refund with one reply.
// The v2 prompt (recognized by its marker) answers differently on some
// inputs: "kind-change" tickets become bugs without a reply, "kind-change-low"
// ones also drop to low priority, and "kind-broken" ones get an answer the
// schema refuses (every attempt, repairs included). "slow-1" answers after
// 300 ms (to hold jobs running).
const char* kRules = R"(rules:
  - match: {model: slow-1}
    delay_ms: 300
    output: '{"category":"refund","priority":"high","summary":"s","actions":[]}'
  - match: {prompt: {contains: PROMPT-V2}, input: {text: {contains: kind-broken}}}
    output: '{"category":"nonsense"}'
  - match: {prompt: {contains: PROMPT-V2}, input: {text: {contains: kind-change-low}}}
    output: '{"category":"bug","priority":"low","summary":"s","actions":[]}'
  - match: {prompt: {contains: PROMPT-V2}, input: {text: {contains: kind-change}}}
    output: '{"category":"bug","priority":"high","summary":"s","actions":[]}'
default:
  output: '{"category":"refund","priority":"high","summary":"s","actions":[{"kind":"send_reply","args":{"ticket_id":"{{input.ticket_id}}","text":"ok"}}]}'
)";

constexpr int kDecisions = 1000;

// Ticket i: every 10th changes under v2 (every 50th also in priority), every
// 25th from 1 on breaks (never a multiple of 10): 100 changed (20 of them in
// priority), 40 failing validation, 860 unchanged.
std::string TicketText(int i) {
  if (i % 50 == 0) return "ticket " + std::to_string(i) + " kind-change-low";
  if (i % 10 == 0) return "ticket " + std::to_string(i) + " kind-change";
  if (i % 25 == 1) return "ticket " + std::to_string(i) + " kind-broken";
  return "ticket " + std::to_string(i) + " kind-same";
}

std::string DecideBody(int i) {
  return Json{{"step", "triage_ticket"},
              {"input", {{"ticket_id", "T-" + std::to_string(i)}, {"text", TicketText(i)}}}}
      .dump();
}

Json J(const httplib::Result& r) {
  REQUIRE(r);
  return Json::parse(r->body);
}

// Polls GET /v1/replays/{id} until the job is no longer running.
Json WaitForJob(httplib::Client& c, const std::string& id, int timeout_s = 240) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  Json job;
  while (std::chrono::steady_clock::now() < deadline) {
    job = J(c.Get(("/v1/replays/" + id).c_str()));
    if (job.value("state", "") != "running") return job;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  FAIL("bulk replay " << id << " still running after " << timeout_s << " s: " << job.dump());
  return job;
}

std::string Extra(const TempDir& dir) {
  std::string v2 = dir.File("triage_v2.mustache",
                            "PROMPT-V2: triage this ticket.\n{{{input.ticket_id}}}\n"
                            "{{{input.text}}}\n");
  return "    prompts:\n"
         "      v2:\n"
         "        template: " +
         v2 +
         "\n"
         "prices:\n"
         "  demo-1: {input_per_mtok: 1000, output_per_mtok: 2000}\n";
}

}  // namespace

TEST_CASE("a bulk replay of 1,000 decisions with a second prompt version summarizes exactly") {
  TempDir dir;
  std::string config = WriteTestConfig(dir, kRules, Extra(dir));
  std::string err;
  auto daemon = DaemonProcess::Start({config, dir.path() + "/data", {}, {}}, &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);
  auto c = daemon->Client();

  // Record 1,000 decisions with the default prompt (v1): all refunds.
  std::vector<std::string> ids(kDecisions);
  {
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        auto client = daemon->Client();
        for (int i = t; i < kDecisions; i += 4) {
          auto r = client->Post("/v1/decide", DecideBody(i), "application/json");
          if (r && r->status == 200) ids[i] = Json::parse(r->body)["decision_id"];
        }
      });
    }
    for (auto& t : threads) t.join();
  }
  for (int i = 0; i < kDecisions; ++i) REQUIRE_MESSAGE(!ids[i].empty(), "decide " << i);

  // The default prompt stays v1: a new input is decided with it. (A later
  // millisecond than every recorded one: the list orders ties by id.)
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  Json fresh = J(c->Post(
      "/v1/decide", R"({"step":"triage_ticket","input":{"ticket_id":"N","text":"kind-change"}})",
      "application/json"));
  CHECK(fresh["prompt_version"] == "v1");
  CHECK(fresh["output"]["category"] == "refund");
  ids.push_back(fresh["decision_id"]);

  // A single replay with v2 works (it used to be 409) and says which version.
  Json one = J(c->Post(("/v1/decisions/" + ids[10] + "/replay").c_str(),
                       R"({"prompt_version":"v2"})", "application/json"));
  CHECK(one["replayed"]["prompt_version"] == "v2");
  CHECK(one["replayed"]["output"]["category"] == "bug");
  // ...but cannot be promoted under v1's cache key.
  auto promote = c->Post(("/v1/decisions/" + ids[10] + "/replay").c_str(),
                         R"({"prompt_version":"v2","promote":true})", "application/json");
  REQUIRE(promote);
  CHECK(promote->status == 409);
  CHECK(Json::parse(promote->body)["pointer"] == "/promote");

  // Refusals before anything runs.
  auto unknown = c->Post("/v1/replays", R"({"step":"triage_ticket","prompt_version":"v9"})",
                         "application/json");
  REQUIRE(unknown);
  CHECK(unknown->status == 409);
  CHECK(Json::parse(unknown->body)["pointer"] == "/prompt_version");
  CHECK(c->Post("/v1/replays", R"({"step":"nope"})", "application/json")->status == 404);
  CHECK(c->Post("/v1/replays", R"({"step":"triage_ticket","limit":10001})", "application/json")
            ->status == 400);
  auto bad_since =
      c->Post("/v1/replays", R"({"step":"triage_ticket","since":"yesterday"})", "application/json");
  CHECK(bad_since->status == 400);
  CHECK(Json::parse(bad_since->body)["pointer"] == "/since");
  // A day past its month's end is no date (not 3 March).
  for (const char* day : {"2026-02-31", "2026-02-29", "2026-04-31T00:00:00Z"}) {
    CAPTURE(day);
    auto bad_day =
        c->Post("/v1/replays", R"({"step":"triage_ticket","since":")" + std::string(day) + R"("})",
                "application/json");
    CHECK(bad_day->status == 400);
  }
  CHECK(c->Get("/v1/replays/rpl_nope")->status == 404);
  // An empty model, provider or prompt version is no choice: refused, not
  // taken as "the recorded one" (leave it out for that).
  for (const char* field : {"model", "provider", "prompt_version"}) {
    CAPTURE(field);
    const std::string body = R"({"step":"triage_ticket",")" + std::string(field) + R"(":""})";
    auto empty = c->Post("/v1/replays", body, "application/json");
    REQUIRE(empty);
    CHECK(empty->status == 400);
    CHECK(Json::parse(empty->body)["pointer"] == "/" + std::string(field));
    auto one = c->Post("/v1/decisions/dec_" + std::string(32, '0') + "/replay",
                       R"({")" + std::string(field) + R"(":""})", "application/json");
    REQUIRE(one);
    CHECK(one->status == 400);
  }

  // The bulk replay of every decision of the step (1,000 recorded + the
  // fresh one), since a date before all of them.
  auto started = c->Post("/v1/replays",
                         R"({"step":"triage_ticket","prompt_version":"v2","limit":10000,
                             "since":"2000-01-01","concurrency":8})",
                         "application/json");
  REQUIRE(started);
  REQUIRE_MESSAGE(started->status == 202, started->body);
  Json accepted = Json::parse(started->body);
  const std::string id = accepted["replay_id"];
  CHECK(accepted["status_url"] == "/v1/replays/" + id);
  Json job = WaitForJob(*c, id);
  INFO(job.dump());
  CHECK(job["state"] == "done");
  CHECK(job["phase"] == "finished");
  // 1,000 recorded + the fresh one (a kind-change text: changes under v2).
  CHECK(job["total"] == kDecisions + 1);
  CHECK(job["done"] == kDecisions + 1);
  CHECK(job["changed"] == 101);
  CHECK(job["unchanged"] == 860);
  CHECK(job["failed_validation_count"] == 40);
  CHECK(job["errors"] == 0);
  std::set<std::string> failing(job["failed_validation"].begin(), job["failed_validation"].end());
  std::set<std::string> expected_failing;
  for (int i = 1; i < kDecisions; i += 25) expected_failing.insert(ids[i]);
  CHECK(failing == expected_failing);
  CHECK(job["top_changed_pointers"] == Json::parse(R"([{"pointer":"/actions/0","count":101},
                                                       {"pointer":"/category","count":101},
                                                       {"pointer":"/priority","count":20}])"));
  // Cost: every attempt at the configured prices (the 40 failing ones took
  // 3 attempts each).
  const double in = job["tokens"]["input"], out = job["tokens"]["output"];
  CHECK(in > 0);
  CHECK(job["cost_usd"].get<double>() == doctest::Approx((in * 1000 + out * 2000) / 1e6));

  // The cache is unchanged: the same 1,001 decisions, and each input is
  // still answered by its original.
  std::set<std::string> listed;
  std::string cursor;
  for (;;) {
    Json page = J(c->Get(
        ("/v1/decisions?step=triage_ticket&limit=500" + (cursor.empty() ? "" : "&cursor=" + cursor))
            .c_str()));
    for (const Json& d : page["items"]) listed.insert(d["decision_id"].get<std::string>());
    if (!page.contains("next_cursor")) break;
    cursor = page["next_cursor"];
  }
  CHECK(listed == std::set<std::string>(ids.begin(), ids.end()));
  int hits = 0;
  for (int i = 0; i < kDecisions; ++i) {
    Json again = J(c->Post("/v1/decide", DecideBody(i), "application/json"));
    if (again["cache"] == "hit" && again["decision_id"] == ids[i] &&
        again["output"]["category"] == "refund") {
      ++hits;
    }
  }
  CHECK(hits == kDecisions);

  // since and limit select the newest: one decision since a minute ago, limit 1.
  Json newest = WaitForJob(
      *c, J(c->Post("/v1/replays", R"({"step":"triage_ticket","prompt_version":"v2","limit":1})",
                    "application/json"))["replay_id"]);
  CHECK(newest["total"] == 1);
  CHECK(newest["changed"] == 1);  // the fresh "N" decision, the newest
  Json future =
      WaitForJob(*c, J(c->Post("/v1/replays", R"({"step":"triage_ticket","since":"2999-01-01"})",
                               "application/json"))["replay_id"]);
  CHECK(future["state"] == "done");
  CHECK(future["total"] == 0);
  // Epoch milliseconds as digits in a string (the CLI's --since) mean the
  // same as the integer; past 9999-12-31 they are refused.
  for (const char* since : {R"("32503680000000")", "32503680000000"}) {  // 3000-01-01
    CAPTURE(since);
    Json later = WaitForJob(
        *c,
        J(c->Post("/v1/replays", std::string(R"({"step":"triage_ticket","since":)") + since + "}",
                  "application/json"))["replay_id"]);
    CHECK(later["total"] == 0);
    CHECK(later["since_ms"] == 32503680000000);
  }
  for (const char* since :
       {R"("253402300800000")", "253402300800000", R"("99999999999999999999")"}) {
    CAPTURE(since);
    auto refused =
        c->Post("/v1/replays", std::string(R"({"step":"triage_ticket","since":)") + since + "}",
                "application/json");
    CHECK(refused->status == 400);
    CHECK(J(refused)["pointer"] == "/since");
  }
  CHECK(daemon->Stop() == 0);
}

TEST_CASE("idem replay prints one decision's diff and a bulk replay's summary") {
  TempDir dir;
  std::string config = WriteTestConfig(dir, kRules, Extra(dir));
  std::string err;
  auto daemon = DaemonProcess::Start({config, dir.path() + "/data", {}, {}}, &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);
  auto c = daemon->Client();
  std::vector<std::string> ids;
  for (int i = 0; i < 30; ++i) {
    ids.push_back(J(c->Post("/v1/decide", DecideBody(i), "application/json"))["decision_id"]);
  }
  const std::string url = "http://127.0.0.1:" + std::to_string(daemon->port());

  CliResult one = RunCli({"replay", ids[10], "--prompt-version", "v2", "--url", url});
  INFO(one.out, one.err);
  CHECK(one.exit_code == 0);
  CHECK(one.out.find("~ /category: \"refund\" → \"bug\"") != std::string::npos);
  CHECK(one.out.find("- /actions/0: {\"args\"") != std::string::npos);
  CHECK(one.out.find("\x1b[") == std::string::npos);  // not a tty: no colour
  CliResult same = RunCli({"replay", ids[2], "--prompt-version", "v2", "--url", url});
  CHECK(same.out.find("no change") != std::string::npos);
  CHECK(RunCli({"replay", ids[2], "--step", "triage_ticket", "--url", url}).exit_code == 1);
  CHECK(RunCli({"replay", ids[2], "--prompt-version", "v9", "--url", url}).exit_code == 4);

  // 30 tickets: 0, 10, 20 change (0 also in priority), 1 and 26 break.
  CliResult bulk =
      RunCli({"replay", "--step", "triage_ticket", "--prompt-version", "v2", "--url", url});
  INFO(bulk.out, bulk.err);
  CHECK(bulk.exit_code == 0);
  CHECK(bulk.out.find(" done: step triage_ticket, prompt v2, 30 of 30 decisions") !=
        std::string::npos);
  CHECK(bulk.out.find("changed            3          10.0%") != std::string::npos);
  CHECK(bulk.out.find("unchanged          25         83.3%") != std::string::npos);
  CHECK(bulk.out.find("failed validation  2          6.7%") != std::string::npos);
  CHECK(bulk.out.find("/category   3") != std::string::npos);
  CHECK(bulk.out.find("/priority   1") != std::string::npos);
  CHECK(bulk.out.find(ids[1]) != std::string::npos);
  CHECK(bulk.out.find(ids[26]) != std::string::npos);
  CHECK(bulk.err.find("30/30 done") != std::string::npos);  // plain progress lines

  CliResult json = RunCli(
      {"replay", "--step", "triage_ticket", "--prompt-version", "v2", "--json", "--url", url});
  CHECK(json.exit_code == 0);
  Json job = Json::parse(json.out);
  CHECK(job["changed"] == 3);
  CHECK(job["failed_validation_count"] == 2);
  CHECK(json.err.empty());
  CHECK(daemon->Stop() == 0);
}

TEST_CASE("at most two bulk replays run at once and a repeated key returns the same job") {
  TempDir dir;
  std::string config = WriteTestConfig(dir, kRules, Extra(dir));
  std::string err;
  auto daemon = DaemonProcess::Start({config, dir.path() + "/data", {}, {}}, &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);
  auto c = daemon->Client();
  for (int i = 0; i < 4; ++i) {
    REQUIRE(c->Post("/v1/decide", DecideBody(i), "application/json")->status == 200);
  }
  // Two slow jobs (4 decisions, one at a time, 300 ms each).
  const std::string slow = R"({"step":"triage_ticket","model":"slow-1","concurrency":1})";
  httplib::Headers key = {{"Idempotency-Key", "\"bulk-1\""}};
  Json first = J(c->Post("/v1/replays", key, slow, "application/json"));
  Json again = J(c->Post("/v1/replays", key, slow, "application/json"));
  CHECK(again["replay_id"] == first["replay_id"]);  // no second job
  Json second = J(c->Post("/v1/replays", slow, "application/json"));
  CHECK(second["replay_id"] != first["replay_id"]);
  auto third = c->Post("/v1/replays", slow, "application/json");
  REQUIRE(third);
  CHECK(third->status == 409);
  CHECK(Json::parse(third->body)["detail"].get<std::string>().find("at most 2") !=
        std::string::npos);
  Json a = WaitForJob(*c, first["replay_id"]);
  Json b = WaitForJob(*c, second["replay_id"]);
  CHECK(a["state"] == "done");
  CHECK(a["total"] == 4);
  CHECK(a["changed"] == 4);  // the slow model answers without actions
  CHECK(b["state"] == "done");
  // Room again.
  CHECK(
      c->Post("/v1/replays", R"({"step":"triage_ticket","limit":1})", "application/json")->status ==
      202);
  CHECK(daemon->Stop() == 0);
}

}  // namespace idem::testing

namespace idem::testing {

TEST_CASE("an other prompt version must be the prompt its name had when it was the default") {
  TempDir dir;
  const std::string src = IDEM_SOURCE_DIR;
  const std::string v1 = src + "/config/prompts/triage_ticket.mustache";
  std::string v2 = dir.File("v2.mustache", "PROMPT-V2 {{{input.text}}}\n");
  std::string changed_v1 = dir.File("v1b.mustache", "another v1 {{{input.text}}}\n");
  std::string config = WriteTestConfig(dir, kQuestionRules);
  std::string err;
  {
    auto daemon = DaemonProcess::Start({config, dir.path() + "/data", {}, {}}, &err);
    REQUIRE_MESSAGE(daemon != nullptr, err);
    CHECK(daemon->Stop() == 0);
  }
  // v2 becomes the default; v1 stays loadable for replays only as it was.
  auto promote_v2 = [&](const std::string& v1_template) {
    std::string text = WriteTestConfig(dir, kQuestionRules,
                                       "    prompts:\n      v1: {template: " + v1_template + "}\n");
    std::ifstream in(text);
    std::string yaml((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string from = "      template: " + v1 + "\n      version: v1\n";
    REQUIRE(yaml.find(from) != std::string::npos);
    yaml.replace(yaml.find(from), from.size(), "      template: " + v2 + "\n      version: v2\n");
    return dir.File("idem.yaml", yaml);
  };
  auto refused = DaemonProcess::Start({promote_v2(changed_v1), dir.path() + "/data", {}, {}}, &err);
  CHECK(refused == nullptr);
  CHECK(err.find("prompts.v1") != std::string::npos);
  auto served = DaemonProcess::Start({promote_v2(v1), dir.path() + "/data", {}, {}}, &err);
  REQUIRE_MESSAGE(served != nullptr, err);
  CHECK(served->Stop() == 0);
}

}  // namespace idem::testing
