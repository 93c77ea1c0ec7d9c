// One unit of work, several plans: a human's refusal of one plan holds for
// every other way to the same work (a direct call, a run, another
// decision's plan), and work waiting in its own plan is not run by another.
#include <doctest/doctest.h>

#include "daemon/core/crypto.h"
#include "tests/fakes/fake_effector.h"
#include "tests/integration/harness.h"

namespace idem::testing {
namespace {

using fakes::FakeEffectorServer;

const char* kAgent = "agent-secret";
const char* kOperator = "op-secret";

// The model proposes one refund per ticket, with the ticket's text.
const char* kRules = R"(default:
  output: '{"category":"question","priority":"low","summary":"s","actions":[{"kind":"refund","args":{"ticket_id":"{{input.ticket_id}}","text":"{{input.text}}"}}]}'
)";

struct Fixture {
  std::unique_ptr<FakeEffectorServer> target = FakeEffectorServer::Start();
  TempDir dir;
  std::unique_ptr<DaemonProcess> daemon;
  std::unique_ptr<httplib::Client> client;

  Fixture() {
    REQUIRE(target != nullptr);
    // A refund is one per ticket; one whose text says "big" waits for a human.
    std::string extra =
        "    plan: {pointer: /actions}\n"
        "actions:\n"
        "  refund:\n"
        "    identity: {fields: [/ticket_id], version: v1}\n"
        "    window: forever\n"
        "    on_duplicate: return_original\n"
        "    effector: {http: {method: POST, url: \"" +
        target->base_url() +
        "/records\", idempotency: header}}\n"
        "    approval: {when: {\"==\": [{\"var\": \"args.text\"}, \"big\"]}, reason: big refunds}\n"
        "auth:\n  tokens:\n" +
        TokenYaml("agent-1", kAgent, "agent") + TokenYaml("op-1", kOperator, "operator");
    std::string err;
    daemon = DaemonProcess::Start(
        {WriteTestConfig(dir, kRules, extra), dir.path() + "/data", {}, {}}, &err);
    REQUIRE_MESSAGE(daemon != nullptr, err);
    client = daemon->Client();
  }

  httplib::Result Post(const std::string& path, const Json& body, const char* token,
                       const std::string& key = "") {
    httplib::Headers h = {{"Authorization", std::string("Bearer ") + token}};
    if (!key.empty()) h.emplace("Idempotency-Key", key);
    return client->Post(path.c_str(), h, body.dump(), "application/json");
  }
  Json Decide(const std::string& ticket, const std::string& text) {
    auto r = Post("/v1/decide",
                  {{"step", "triage_ticket"}, {"input", {{"ticket_id", ticket}, {"text", text}}}},
                  kAgent);
    REQUIRE(r);
    REQUIRE_MESSAGE(r->status == 200, r->body);
    return Json::parse(r->body);
  }
  int64_t Effects() { return target->stats().effects; }
};

Json J(const httplib::Result& r) {
  REQUIRE(r);
  INFO(r->body);
  return Json::parse(r->body);
}

}  // namespace

TEST_CASE("a refused call's work is not run by a decision's plan for the same work") {
  Fixture f;
  auto call = f.Post("/v1/actions/refund", {{"args", {{"ticket_id", "T-9"}, {"text", "big"}}}},
                     kAgent, "\"t9\"");
  REQUIRE(call->status == 202);
  const std::string gate = J(call)["plan_id"];
  auto rejected = f.Post("/v1/plans/" + gate + "/reject", {{"reason", "fraud"}}, kOperator);
  REQUIRE(rejected->status == 200);

  // The model proposes the same refund, small enough for no human.
  Json decided = f.Decide("T-9", "small");
  REQUIRE(decided["plan"]["state"] == "proposed");
  const std::string plan = decided["plan"]["plan_id"];
  auto applied = f.Post("/v1/plans/" + plan + "/apply", Json::object(), kAgent, "\"apply-t9\"");
  REQUIRE(applied);
  Json body = J(applied);
  CHECK(body["state"] == "partially_failed");
  CHECK(body.dump().find("rejected by op-1: fraud") != std::string::npos);
  CHECK(f.Effects() == 0);
}

TEST_CASE("a refused decision plan's work is refused to a direct call too") {
  Fixture f;
  Json decided = f.Decide("T-8", "big");
  REQUIRE(decided["plan"]["state"] == "awaiting_approval");
  const std::string plan = decided["plan"]["plan_id"];
  REQUIRE(f.Post("/v1/plans/" + plan + "/reject", {{"reason", "fraud"}}, kOperator)->status == 200);

  auto call = f.Post("/v1/actions/refund", {{"args", {{"ticket_id", "T-8"}, {"text", "small"}}}},
                     kAgent, "\"t8\"");
  REQUIRE(call);
  CHECK(call->status == 409);
  CHECK(J(call)["detail"].get<std::string>().find("rejected by op-1: fraud") != std::string::npos);
  CHECK(f.Effects() == 0);
  // Other work is not held.
  auto other = f.Post("/v1/actions/refund", {{"args", {{"ticket_id", "T-7"}, {"text", "small"}}}},
                      kAgent, "\"t7\"");
  REQUIRE(other);
  CHECK(other->status == 201);
  CHECK(f.Effects() == 1);
}

TEST_CASE("work waiting in its own plan is not run by a decision's plan meanwhile") {
  Fixture f;
  auto call = f.Post("/v1/actions/refund", {{"args", {{"ticket_id", "T-6"}, {"text", "big"}}}},
                     kAgent, "\"t6\"");
  REQUIRE(call->status == 202);
  Json decided = f.Decide("T-6", "small");
  REQUIRE(decided["plan"]["state"] == "proposed");
  auto applied = f.Post("/v1/plans/" + decided["plan"]["plan_id"].get<std::string>() + "/apply",
                        Json::object(), kAgent, "\"apply-t6\"");
  REQUIRE(applied);
  CHECK(J(applied).dump().find("is waiting for an operator") != std::string::npos);
  CHECK(f.Effects() == 0);
}

}  // namespace idem::testing
