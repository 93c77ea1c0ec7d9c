// The escalation flow over HTTP: a step whose model keeps failing its value
// checks escalates; a human resolves it; the answer becomes the decision.
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>

#include "tests/integration/harness.h"

namespace idem::testing {

TEST_CASE("an exhausted step escalates, and the human's answer becomes the cached decision") {
  TempDir dir;
  // The model always answers a refund with low priority, which the triage
  // policy forbids: every attempt fails its value checks.
  const char* rules = R"(default:
  output: '{"category":"refund","priority":"low","summary":"wants money back","actions":[]}'
)";
  std::string config = WriteTestConfig(dir, rules);
  {
    std::ifstream in(config);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    text.replace(text.find("    attempts: 3"), 15,
                 "    attempts: 2\n    fallback: [escalate]\n    checks: " +
                     std::string(IDEM_SOURCE_DIR) + "/policies/triage_ticket.yaml");
    dir.File("idem.yaml", text);
  }
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
       {"/v1/escalations?state=opne", "/v1/decisions?status=escalated", "/v1/escalations?state=",
        "/v1/decisions?status=", "/v1/plans?state=", "/v1/stats/cost?by="}) {
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
}

}  // namespace idem::testing
