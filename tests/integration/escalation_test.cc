// The escalation flow over HTTP: a step whose model keeps failing its value
// checks escalates; a human resolves it; the answer becomes the decision.
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>

#include "tests/integration/harness.h"

namespace idem::testing {

namespace {

// The test config with triage_ticket trying twice and then escalating;
// `more` is added to the step (two more lines of its YAML, indented).
std::string EscalatingConfig(TempDir& dir, const char* rules, const std::string& more = "") {
  std::string config = WriteTestConfig(dir, rules);
  std::ifstream in(config);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  text.replace(text.find("    attempts: 3"), 15,
               "    attempts: 2\n    fallback: [escalate]" + more);
  dir.File("idem.yaml", text);
  return config;
}

}  // namespace

TEST_CASE("an exhausted step escalates, and the human's answer becomes the cached decision") {
  TempDir dir;
  // The model always answers a refund with low priority, which the triage
  // policy forbids: every attempt fails its value checks.
  const char* rules = R"(default:
  output: '{"category":"refund","priority":"low","summary":"wants money back","actions":[]}'
)";
  std::string config = EscalatingConfig(
      dir, rules, "\n    checks: " + std::string(IDEM_SOURCE_DIR) + "/policies/triage_ticket.yaml");
  std::string err;
  auto d = DaemonProcess::Start({config, dir.path() + "/data", {}, {}}, &err);
  REQUIRE_MESSAGE(d != nullptr, err);
  auto c = d->Client();
  const std::string body = R"({"step":"triage_ticket","input":{"ticket_id":"42","text":"refund"}})";
  auto first = c->Post("/v1/decide", body, "application/json");
  REQUIRE(first->status == 200);
  Json e = Json::parse(first->body);
  CHECK(e["status"] == "escalated");
  CHECK(e["context"]["attempts"].size() == 2);
  CHECK(e["context"]["best_guess"]["priority"] == "low");
  CHECK(e["context"]["summary"].get<std::string>().find("42") != std::string::npos);
  CHECK(MetricValue(*c, "idem_provider_calls_total") == 2);

  // Retrying the decide does not burn tokens: the open escalation answers.
  auto again = c->Post("/v1/decide", body, "application/json");
  CHECK(Json::parse(again->body)["escalation_id"] == e["escalation_id"]);
  CHECK(MetricValue(*c, "idem_provider_calls_total") == 2);

  // cache: refresh asks the model again; failing again, it joins the open
  // escalation instead of opening a second that hides the first.
  const std::string refresh =
      R"({"step":"triage_ticket","input":{"ticket_id":"42","text":"refund"},"cache":"refresh"})";
  auto refreshed = c->Post("/v1/decide", refresh, "application/json");
  REQUIRE(refreshed);
  CHECK(Json::parse(refreshed->body)["escalation_id"] == e["escalation_id"]);
  CHECK(Json::parse(c->Get("/v1/escalations")->body)["items"].size() == 1);

  Json open = Json::parse(c->Get("/v1/escalations?state=open")->body);
  REQUIRE(open["items"].size() == 1);

  const std::string id = e["escalation_id"];
  auto invalid =
      c->Post(("/v1/escalations/" + id + "/resolve").c_str(),
              R"({"output":{"category":"refund","priority":"low","summary":"s","actions":[]}})",
              "application/json");
  CHECK(invalid->status == 400);
  CHECK(Json::parse(invalid->body)["pointer"] == "/output/priority");

  // Without tokens the body names the human, but never as the daemon (a
  // refresh closes escalations as "idem"), nobody or a webhook sender,
  // nor with a control character; the escalation stays open.
  for (const char* actor : {R"("idem")", R"("IDem")", R"("idem\u0000x")", R"("")", R"(" idem")",
                            R"("Anonymous")", R"("inbox:git")", R"("al\u009bice")"}) {
    CAPTURE(actor);
    auto spoof = c->Post(
        ("/v1/escalations/" + id + "/resolve").c_str(),
        std::string(
            R"({"output":{"category":"refund","priority":"high","summary":"s","actions":[]},)") +
            R"("actor":)" + actor + "}",
        "application/json");
    CHECK(spoof->status == 400);
    CHECK(Json::parse(spoof->body)["pointer"] == "/actor");
  }
  CHECK(Json::parse(c->Get("/v1/escalations?state=open")->body)["items"].size() == 1);

  auto resolved = c->Post(
      ("/v1/escalations/" + id + "/resolve").c_str(),
      R"({"output":{"category":"refund","priority":"high","summary":"refund approved by ops","actions":[]},"actor":"alice"})",
      "application/json");
  REQUIRE(resolved->status == 200);
  Json dec = Json::parse(resolved->body);
  CHECK(dec["decided_by"] == "human");

  auto after = c->Post("/v1/decide", body, "application/json");
  Json a = Json::parse(after->body);
  CHECK(a["status"] == "decided");
  CHECK(a["cache"] == "hit");
  CHECK(a["decision_id"] == dec["decision_id"]);
  CHECK(MetricValue(*c, "idem_provider_calls_total") == 4);  // 2, and the refresh's 2
  // The hit on alice's answer counts under "human", not as a model "alice".
  bool human = false, alice = false;
  const Json by_model = Json::parse(c->Get("/v1/stats/cost?by=model")->body);
  for (const Json& row : by_model["items"]) {
    human = human || row["model"] == "human";
    alice = alice || row["model"] == "alice";
  }
  CHECK(human);
  CHECK_FALSE(alice);
  CHECK(Json::parse(c->Get("/v1/escalations?state=open")->body)["items"].empty());
  CHECK(Json::parse(c->Get("/v1/escalations?state=resolved")->body)["items"].size() == 1);

  // A mistyped filter is refused, not answered "nothing" (it matched no record).
  // An empty one (?state=) too: it is not "all" (README, API walkthrough).
  for (const char* path :
       {"/v1/escalations?state=opne", "/v1/decisions?status=escalated",
        "/v1/escalations?state=", "/v1/decisions?status=", "/v1/plans?state=", "/v1/stats/cost?by=",
        "/v1/decisions?step=", "/v1/decisions/export?step="}) {
    INFO(path);
    auto typo = c->Get(path);
    REQUIRE(typo);
    CHECK(typo->status == 400);
    Json problem = Json::parse(typo->body);
    const std::string query = std::string(path).substr(std::string(path).find('?') + 1);
    CHECK(problem["pointer"] == "query:" + query.substr(0, query.find('=')));
  }
  CHECK(Json::parse(c->Get("/v1/escalations?state=opne")->body)["detail"] ==
        "state must be one of open, resolved");
  CHECK(c->Get("/v1/decisions?status=decided")->status == 200);
  // A step the config does not have is a 404, not an empty list that reads
  // as "this step decided nothing"; the configured step lists its decision.
  for (const char* path : {"/v1/decisions?step=triage_tikcet", "/v1/decisions/export?step=nope"}) {
    INFO(path);
    auto unknown = c->Get(path);
    REQUIRE(unknown);
    CHECK(unknown->status == 404);
    CHECK(Json::parse(unknown->body)["pointer"] == "query:step");
  }
  CHECK(Json::parse(c->Get("/v1/decisions?step=triage_ticket")->body)["items"].size() == 1);
  auto exported = c->Get("/v1/decisions/export?step=triage_ticket");
  REQUIRE(exported);
  CHECK(exported->status == 200);
  CHECK(exported->body.find(dec["decision_id"].get<std::string>()) != std::string::npos);
}

TEST_CASE(
    "a refresh that decides an escalated input closes its escalation, so a late human answer is "
    "refused instead of silently replacing the model's decision") {
  TempDir dir;
  // The provider is down for the first two calls (the escalation), then answers.
  const char* rules = R"(rules:
  - match: {input: {text: {contains: flaky}}}
    fail: {code: unavailable, message: provider down}
    times: 2
default:
  output: '{"category":"question","priority":"low","summary":"a question","actions":[]}'
)";
  std::string config = EscalatingConfig(dir, rules);
  std::string err;
  auto d = DaemonProcess::Start({config, dir.path() + "/data", {}, {}}, &err);
  REQUIRE_MESSAGE(d != nullptr, err);
  auto c = d->Client();
  const std::string input = R"("input":{"ticket_id":"77","text":"flaky"})";
  Json escalated = Json::parse(
      c->Post("/v1/decide", R"({"step":"triage_ticket",)" + input + "}", "application/json")->body);
  REQUIRE(escalated["status"] == "escalated");
  const std::string esc = escalated["escalation_id"];

  auto refreshed =
      c->Post("/v1/decide", R"({"step":"triage_ticket","cache":"refresh",)" + input + "}",
              "application/json");
  REQUIRE(refreshed->status == 200);
  Json decided = Json::parse(refreshed->body);
  REQUIRE(decided["status"] == "decided");
  Json closed = Json::parse(c->Get(("/v1/escalations/" + esc).c_str())->body);
  CHECK(closed["state"] == "resolved");
  CHECK(closed["decision_id"] == decided["decision_id"]);
  CHECK(closed["resolved_by"] == "idem");
  CHECK(Json::parse(c->Get("/v1/escalations?state=open")->body)["items"].empty());

  auto late =
      c->Post(("/v1/escalations/" + esc + "/resolve").c_str(),
              R"({"output":{"category":"refund","priority":"high","summary":"late","actions":[]}})",
              "application/json");
  REQUIRE(late);
  CHECK(late->status == 409);
  Json after = Json::parse(
      c->Post("/v1/decide", R"({"step":"triage_ticket",)" + input + "}", "application/json")->body);
  CHECK(after["cache"] == "hit");
  CHECK(after["decision_id"] == decided["decision_id"]);
}

namespace {

// Scripted rules for the outage tests: an input whose text holds `word`
// finds the provider down twice, then gets `then` (a rule's tail), and
// every other input a valid question.
std::string DownTwice(const std::string& word) {
  return "  - match: {input: {text: {contains: " + word +
         "}}}\n"
         "    fail: {code: unavailable, message: provider down}\n"
         "    times: 2\n";
}
constexpr const char* kProse = "    output: 'I would rather chat about it.'\n";
constexpr const char* kQuestionByDefault =
    "default:\n"
    "  output: '{\"category\":\"question\",\"priority\":\"low\",\"summary\":\"a "
    "question\",\"actions\":[]}'\n";

std::unique_ptr<DaemonProcess> StartEscalating(TempDir& dir, const std::string& rules) {
  std::string err;
  auto d = DaemonProcess::Start(
      {EscalatingConfig(dir, rules.c_str()), dir.path() + "/data", {}, {}}, &err);
  REQUIRE_MESSAGE(d != nullptr, err);
  return d;
}

}  // namespace

TEST_CASE(
    "an escalation because no model answered (the provider was down) is not the input's "
    "answer: the next decide asks again, and its decision closes the escalation") {
  TempDir dir;
  // "blip": down twice, then answers. "bad": down twice, then prose, always.
  auto d = StartEscalating(dir, "rules:\n" + DownTwice("blip") + DownTwice("bad") +
                                    "  - match: {input: {text: {contains: bad}}}\n" + kProse +
                                    kQuestionByDefault);
  auto c = d->Client();
  // No structured bindings below: clang 14 cannot capture one in doctest's lambdas.
  struct Answer {
    int status;
    Json body;
  };
  auto decide = [&c](const std::string& text, const std::string& cache = "default") {
    Json body = {{"step", "triage_ticket"},
                 {"input", {{"ticket_id", "88"}, {"text", text}}},
                 {"cache", cache}};
    auto r = c->Post("/v1/decide", body.dump(), "application/json");
    REQUIRE(r);
    return Answer{r->status, Json::parse(r->body)};
  };
  const Answer first = decide("blip");
  REQUIRE(first.status == 200);
  const Json& escalated = first.body;
  REQUIRE(escalated["status"] == "escalated");
  CHECK(escalated["context"]["provider_outage"] == true);
  const std::string esc = escalated["escalation_id"];
  // cache: only never asks: it answers the open escalation.
  const Answer only_answer = decide("blip", "only");
  CHECK(only_answer.status == 200);
  const Json& only = only_answer.body;
  CHECK(only["escalation_id"] == esc);
  CHECK(MetricValue(*c, "idem_provider_calls_total") == 2);
  // A plain decide asks again; the provider is back.
  const Answer again = decide("blip");
  REQUIRE(again.status == 200);
  const Json& decided = again.body;
  CHECK(decided["status"] == "decided");
  CHECK(MetricValue(*c, "idem_provider_calls_total") == 3);
  Json closed = Json::parse(c->Get(("/v1/escalations/" + esc).c_str())->body);
  CHECK(closed["state"] == "resolved");
  CHECK(closed["decision_id"] == decided["decision_id"]);

  // Down, then answering badly: the outage's escalation gives way to one
  // about the answers, which the cache answers without asking again.
  const Json down = decide("bad").body;
  REQUIRE(down["status"] == "escalated");
  CHECK(down["context"]["provider_outage"] == true);
  const Json invalid = decide("bad").body;
  REQUIRE(invalid["status"] == "escalated");
  CHECK(invalid["escalation_id"] != down["escalation_id"]);
  CHECK(invalid["context"]["provider_outage"] == false);
  CHECK(Json::parse(c->Get(("/v1/escalations/" + down["escalation_id"].get<std::string>()).c_str())
                        ->body)["state"] == "resolved");
  const long calls = MetricValue(*c, "idem_provider_calls_total");
  const Json cached = decide("bad").body;
  CHECK(cached["escalation_id"] == invalid["escalation_id"]);
  CHECK(MetricValue(*c, "idem_provider_calls_total") == calls);
  CHECK(Json::parse(c->Get("/v1/escalations?state=open")->body)["items"].size() == 1);
}

TEST_CASE(
    "an outage's escalation is not stored under the request's Idempotency-Key: the retry with "
    "the key asks again and gets the decision") {
  TempDir dir;
  auto d = StartEscalating(dir, "rules:\n" + DownTwice("blip") +
                                    "  - match: {input: {text: {contains: prose}}}\n" + kProse +
                                    kQuestionByDefault);
  auto c = d->Client();
  auto decide = [&c](const std::string& text, const std::string& key) {
    Json body = {{"step", "triage_ticket"}, {"input", {{"ticket_id", "89"}, {"text", text}}}};
    auto r = c->Post("/v1/decide", {{"Idempotency-Key", "\"" + key + "\""}}, body.dump(),
                     "application/json");
    REQUIRE(r);
    REQUIRE(r->status == 200);
    return std::make_pair(Json::parse(r->body), r->has_header("Idempotent-Replayed"));
  };
  const auto first = decide("blip", "k-outage");
  REQUIRE(first.first["status"] == "escalated");
  REQUIRE(first.first["context"]["provider_outage"] == true);
  const auto retry = decide("blip", "k-outage");
  CHECK_FALSE(retry.second);
  CHECK(retry.first["status"] == "decided");
  // An escalation about the model's answers is final: the key replays it.
  const auto prose = decide("prose", "k-prose");
  REQUIRE(prose.first["status"] == "escalated");
  REQUIRE(prose.first["context"]["provider_outage"] == false);
  const auto replayed = decide("prose", "k-prose");
  CHECK(replayed.second);
  CHECK(replayed.first["escalation_id"] == prose.first["escalation_id"]);
}

}  // namespace idem::testing
