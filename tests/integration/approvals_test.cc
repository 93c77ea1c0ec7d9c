// Plans that wait for a human (issue 10): policies gate every way in, and
// only an operator's approval lets the effects happen — once.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <thread>

#include "daemon/core/crypto.h"
#include "tests/fakes/fake_effector.h"
#include "tests/integration/harness.h"

namespace idem::testing {
namespace {

using fakes::FakeEffectorServer;

const char* kAgent = "agent-secret";
const char* kOperator = "op-secret";
const char* kOperator2 = "op2-secret";
const char* kAdmin = "admin-secret";

// The scripted model triages every ticket as a refund with one reply.
const char* kRules = R"(default:
  output: '{"category":"refund","priority":"high","summary":"s","actions":[{"kind":"send_reply","args":{"ticket_id":"{{input.ticket_id}}","text":"refund on its way"}}]}'
)";

struct Fixture {
  std::unique_ptr<FakeEffectorServer> target = FakeEffectorServer::Start();
  TempDir dir;
  std::unique_ptr<DaemonProcess> daemon;
  std::unique_ptr<httplib::Client> client;
  std::string config_path;

  // threads > 0: the daemon's handler threads (server.threads); env: the
  // daemon's environment besides (failpoints).
  explicit Fixture(int threads = 0, std::map<std::string, std::string> env = {}) {
    REQUIRE(target != nullptr);
    // The step's plans wait when the model says refund (a policy file);
    // refunds over 100 wait (inline); wires always wait, 1 s at most;
    // shipments are client-executed and always wait.
    std::string step_policy = dir.File("refund_replies.yaml",
                                       "description: replies promising refunds\n"
                                       "when: {\"==\": [{\"var\": \"decision.output.category\"}, "
                                       "\"refund\"]}\n"
                                       "reason: replies about refunds are read by a human\n");
    std::string refund_schema = dir.File(
        "refund.args.json",
        R"({"type":"object","required":["order_id","amount"],"properties":{"order_id":{"type":"string"},"amount":{"type":"number","maximum":10000}}})");
    std::string effector = "    effector: {http: {method: POST, url: \"" + target->base_url() +
                           "/records\", idempotency: header}}\n";
    std::string extra =
        "    plan: {pointer: /actions}\n"
        "    approval: " +
        step_policy +
        "\n"
        "actions:\n"
        "  send_reply:\n"
        "    identity: {fields: [/ticket_id, /text], version: v1}\n"
        "    window: 24h\n"
        "    on_duplicate: return_original\n" +
        effector +
        "  refund:\n"
        "    identity: {fields: [/order_id], version: v1}\n"
        "    window: forever\n"
        "    on_duplicate: return_original\n"
        "    args_schema: " +
        refund_schema + "\n" + effector +
        "    approval: {when: {\">\": [{\"var\": \"args.amount\"}, 100]}, reason: "
        "refunds over 100 need a human}\n"
        "  wire:\n"
        "    identity: {fields: [/wire_id], version: v1}\n"
        "    window: forever\n"
        "    on_duplicate: return_original\n" +
        effector +
        "    approval: {require: always, reason: every wire, timeout: 1s}\n"
        "  ship:\n"
        "    identity: {fields: [/parcel], version: v1}\n"
        "    window: forever\n"
        "    on_duplicate: return_original\n"
        "    approval: {require: always, reason: shipments are checked}\n"
        "auth:\n  tokens:\n" +
        TokenYaml("agent-1", kAgent, "agent") + TokenYaml("op-1", kOperator, "operator") +
        TokenYaml("op-2", kOperator2, "operator") + TokenYaml("root", kAdmin, "admin");
    std::string config = WriteTestConfig(dir, kRules, extra);
    if (threads > 0) {
      std::string text = ReadFile(config);
      const std::string from = "  threads: 96\n";
      REQUIRE(text.find(from) != std::string::npos);
      text.replace(text.find(from), from.size(), "  threads: " + std::to_string(threads) + "\n");
      config = dir.File("idem-threads.yaml", text);
    }
    config_path = config;
    std::string err;
    daemon = DaemonProcess::Start({config, dir.path() + "/data", {}, std::move(env)}, &err);
    REQUIRE_MESSAGE(daemon != nullptr, err);
    client = daemon->Client();
  }

  httplib::Result Post(const std::string& path, const Json& body, const char* token,
                       const std::string& key = "") {
    httplib::Headers h = {{"Authorization", std::string("Bearer ") + token}};
    if (!key.empty()) h.emplace("Idempotency-Key", key);
    return client->Post(path.c_str(), h, body.dump(), "application/json");
  }
  httplib::Result Get(const std::string& path, const char* token = kOperator) {
    return client->Get(path.c_str(), {{"Authorization", std::string("Bearer ") + token}});
  }
  // The plan of a gated refund call (202), made by the agent.
  std::string GatedRefund(const std::string& order, double amount) {
    auto r = Post("/v1/actions/refund", {{"args", {{"order_id", order}, {"amount", amount}}}},
                  kAgent, "\"" + order + "-call\"");
    REQUIRE(r);
    REQUIRE_MESSAGE(r->status == 202, r->body);
    return Json::parse(r->body)["plan_id"];
  }
  int64_t Effects() { return target->stats().effects; }
};

Json J(const httplib::Result& r) {
  REQUIRE(r);
  return Json::parse(r->body);
}

}  // namespace

TEST_CASE("a plan that needs approval is not applied until approved, by any of the four ways in") {
  Fixture f;
  // 1. A decision's plan, applied through /v1/plans/{id}/apply.
  auto d =
      f.Post("/v1/decide", {{"step", "triage_ticket"}, {"input", {{"ticket_id", "T-1"}}}}, kAgent);
  REQUIRE(d->status == 200);
  Json plan = J(d)["plan"];
  CHECK(plan["state"] == "awaiting_approval");
  CHECK(plan["approval_required"] == true);
  CHECK(plan["reasons"][0]["reason"] == "replies about refunds are read by a human");
  const std::string decision_id = J(d)["decision_id"];
  auto applied = f.Post("/v1/plans/" + decision_id + "/apply", Json::object(), kAgent, "\"ap-1\"");
  REQUIRE(applied->status == 202);
  CHECK(J(applied)["state"] == "awaiting_approval");

  // 2. A direct action call: 202 with the plan, the same plan on a retry.
  std::string refund_plan = f.GatedRefund("O-1", 500);
  auto retried = f.Post("/v1/actions/refund", {{"args", {{"order_id", "O-1"}, {"amount", 500}}}},
                        kAgent, "\"O-1-retry\"");
  REQUIRE(retried->status == 202);
  CHECK(J(retried)["plan_id"] == refund_plan);
  // Under the threshold the policy lets it through at once.
  auto small = f.Post("/v1/actions/refund", {{"args", {{"order_id", "O-2"}, {"amount", 40}}}},
                      kAgent, "\"O-2-call\"");
  CHECK(small->status == 201);

  // 3. A run: the small item executes, the large one waits.
  Json run = {
      {"run_id", "r-1"},
      {"kind", "refund"},
      {"items", {{{"order_id", "O-3"}, {"amount", 20}}, {{"order_id", "O-4"}, {"amount", 900}}}}};
  auto r = f.Post("/v1/runs", run, kAgent, "\"run-1\"");
  REQUIRE(r->status == 200);
  CHECK(J(r)["counts"]["executed"] == 1);
  CHECK(J(r)["counts"]["awaiting_approval"] == 1);
  const std::string run_plan = J(r)["items"][1]["plan_id"];

  // 4. A client claim of a gated client-executed kind.
  Json claim = {{"kind", "ship"}, {"identity", {{"parcel", "P-1"}}}, {"args", {{"to", "Oslo"}}}};
  auto c = f.Post("/v1/work/claim", claim, kAgent);
  REQUIRE(c->status == 202);
  const std::string claim_plan = J(c)["plan_id"];
  CHECK(f.Post("/v1/work/claim", claim, kAgent)->status == 202);

  // Only the two ungated refunds touched the outside world.
  CHECK(f.Effects() == 2);
  auto queue = J(f.Get("/v1/plans?state=awaiting_approval"));
  CHECK(queue["items"].size() == 4);

  // Approvals by an operator let each through, once.
  const std::string decision_plan = plan["plan_id"];
  for (const std::string& id : {decision_plan, refund_plan, run_plan, claim_plan}) {
    auto a = f.Post("/v1/plans/" + id + "/approve", {{"comment", "ok"}}, kOperator);
    REQUIRE_MESSAGE(a->status == 200, a->body);
  }
  CHECK(J(f.Get("/v1/plans/" + decision_plan))["state"] == "applied");
  CHECK(J(f.Get("/v1/plans/" + refund_plan))["state"] == "applied");
  CHECK(f.Effects() == 5);  // the reply, O-1, O-4
  // The agent's same call now gets the outcome, without a second effect.
  auto after = f.Post("/v1/actions/refund", {{"args", {{"order_id", "O-1"}, {"amount", 500}}}},
                      kAgent, "\"O-1-after\"");
  CHECK(after->status == 200);
  CHECK(J(after)["duplicate"] == true);
  CHECK(f.Post("/v1/plans/" + decision_id + "/apply", Json::object(), kAgent, "\"ap-2\"")->status ==
        200);
  CHECK(f.Effects() == 5);
  // The client may claim the approved shipment now.
  auto claimed = f.Post("/v1/work/claim", claim, kAgent);
  CHECK(claimed->status == 201);
  CHECK(J(claimed)["args"]["to"] == "Oslo");
}

TEST_CASE(
    "a claim of a kind the daemon executes brings args its schema takes and its identity names, so "
    "a takeover never runs unchecked args") {
  Fixture f;
  auto claim = [&](const std::string& order, const Json& args) {
    Json body = {{"kind", "refund"}, {"identity", {{"order_id", order}}}, {"lease", "1s"}};
    if (!args.is_null()) body["args"] = args;
    return f.Post("/v1/work/claim", body, kAgent);
  };
  struct Refused {
    std::string order;
    Json args;
    std::string pointer;
  };
  for (const Refused& r : std::vector<Refused>{
           {"O-20", Json(), "/args/amount"},  // no args: the worker would send {}
           {"O-21", {{"amount", "lots"}}, "/args/amount"},
           {"O-22", {{"order_id", "O-23"}, {"amount", 5}}, "/args/order_id"},  // other work
       }) {
    CAPTURE(r.order);
    auto refused = claim(r.order, r.args);
    REQUIRE(refused->status == 400);
    CHECK(J(refused)["pointer"] == r.pointer);
  }
  // Args without the identity's fields get them from the identity.
  auto claimed = claim("O-24", {{"amount", 5}});
  REQUIRE(claimed->status == 201);
  CHECK(J(claimed)["args"] == Json{{"amount", 5}, {"order_id", "O-24"}});
  // The policy sees the same args as /v1/actions would: over 100 waits.
  CHECK(claim("O-25", {{"amount", 5000}})->status == 202);
  // Members of the identity beyond its fields are not what the policy
  // judges: a small "amount" there does not let a large one in the args
  // through (the worker would have sent 5000 with no plan).
  auto smuggled = f.Post("/v1/work/claim",
                         {{"kind", "refund"},
                          {"identity", {{"order_id", "O-26"}, {"amount", 50}}},
                          {"args", {{"order_id", "O-26"}, {"amount", 5000}}},
                          {"lease", "1s"}},
                         kAgent);
  REQUIRE(smuggled);
  CHECK(smuggled->status == 202);
  // The lease runs out and the daemon's worker takes the work over: it
  // sends the checked args, and nothing of the refused claims.
  for (int i = 0; i < 100 && f.target->Records("records").empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::vector<Json> records = f.target->Records("records");
  REQUIRE(records.size() == 1);
  CHECK(records[0].dump().find("O-24") != std::string::npos);
}

TEST_CASE(
    "the operator who imported a decision cannot approve the plan made from it, and a promoter "
    "the line names bars no one") {
  Fixture source;  // where the decision was made (another daemon, say staging)
  auto made = source.Post("/v1/decide",
                          {{"step", "triage_ticket"}, {"input", {{"ticket_id", "T-IMP"}}}}, kAgent);
  REQUIRE(made->status == 200);
  auto exported = source.Get("/v1/decisions/export");
  REQUIRE(exported->status == 200);

  // A line naming a promoter (a token of another daemon, or a forged one)
  // bars no token here: the import drops it.
  Json line = Json::parse(exported->body);
  line["trace"]["promoted_by"] = "op-2";

  Fixture f;
  auto imported = f.client->Post("/v1/decisions/import",
                                 {{"Authorization", std::string("Bearer ") + kOperator}},
                                 line.dump() + "\n", "application/x-ndjson");
  REQUIRE(imported->status == 200);
  CHECK(J(imported)["imported"] == 1);
  // The agent's decide is a cache hit on the imported decision: its plan
  // waits, and says who wrote its actions.
  auto hit = f.Post("/v1/decide", {{"step", "triage_ticket"}, {"input", {{"ticket_id", "T-IMP"}}}},
                    kAgent);
  REQUIRE(hit->status == 200);
  const std::string plan_id = J(hit)["plan"]["plan_id"];
  Json plan = J(f.Get("/v1/plans/" + plan_id));
  CHECK(plan["state"] == "awaiting_approval");
  CHECK(plan["approval"]["decision_imported_by"] == "op-1");
  Json decision = J(f.Get("/v1/decisions/" + J(hit)["decision_id"].get<std::string>()));
  CHECK(decision["trace"]["imported_by"] == "op-1");
  CHECK_FALSE(decision["trace"].contains("promoted_by"));
  auto own = f.Post("/v1/plans/" + plan_id + "/approve", Json::object(), kOperator);
  REQUIRE(own);
  CHECK(own->status == 403);
  CHECK(J(own)["detail"].get<std::string>().find("imported the decision") != std::string::npos);
  CHECK(f.Post("/v1/plans/" + plan_id + "/approve", Json::object(), kOperator2)->status == 200);
  // The audit event names what was imported.
  Json audit = J(f.Get("/v1/audit?limit=100"));
  bool named = false;
  for (const Json& e : audit["items"]) {
    if (e["action"] == "decisions.imported") {
      named = e["detail"]["decision_ids"].size() == 1 &&
              e["detail"]["decision_ids"][0] == J(hit)["decision_id"];
    }
  }
  CHECK(named);
}

// One exported decision of `ticket` from a daemon of its own, as a line.
Json ExportedDecision(const std::string& ticket) {
  Fixture source;
  auto made = source.Post("/v1/decide",
                          {{"step", "triage_ticket"}, {"input", {{"ticket_id", ticket}}}}, kAgent);
  REQUIRE(made->status == 200);
  auto exported = source.Get("/v1/decisions/export");
  REQUIRE(exported->status == 200);
  return Json::parse(exported->body.substr(0, exported->body.find('\n')));
}

TEST_CASE("an imported decision cannot take over the approval plan of a gated call") {
  Fixture f;
  CliResult key =
      RunCli({"key", "--kind", "refund", "--config", f.config_path}, R"({"order_id":"O-51"})");
  REQUIRE_MESSAGE(key.exit_code == 0, key.err);
  REQUIRE(key.out.rfind("work_id ", 0) == 0);  // "work_id <hex>\nmaterial …"
  const std::string work_id = key.out.substr(8, key.out.find('\n') - 8);
  const std::string gate_plan = "plan_" + Sha256Hex("gate:" + work_id).substr(0, 32);
  // A line whose decision_id would plan under that gate plan's id, with
  // actions that need no human (not a refund) and args of its choosing.
  Json line = ExportedDecision("T-GATE");
  line["decision_id"] = "dec_" + gate_plan.substr(5);
  line["output"]["category"] = "question";
  line["output"]["actions"] = Json::array(
      {{{"kind", "send_reply"}, {"args", {{"ticket_id", "T"}, {"text", "order O-51, 9000"}}}}});
  auto import = [&] {
    auto r = f.client->Post("/v1/decisions/import",
                            {{"Authorization", std::string("Bearer ") + kOperator}},
                            line.dump() + "\n", "application/x-ndjson");
    REQUIRE(r);
    REQUIRE(r->status == 200);
    return Json::parse(r->body);
  };

  SUBCASE("imported before the call: the call refuses the plan it finds, nothing runs") {
    REQUIRE(import()["imported"] == 1);
    auto hit = f.Post("/v1/decide",
                      {{"step", "triage_ticket"}, {"input", {{"ticket_id", "T-GATE"}}}}, kAgent);
    REQUIRE(hit->status == 200);
    REQUIRE(J(hit)["plan"]["plan_id"] == gate_plan);
    auto call = f.Post("/v1/actions/refund", {{"args", {{"order_id", "O-51"}, {"amount", 500}}}},
                       kAgent, "\"o51\"");
    REQUIRE(call);
    CHECK(call->status == 409);
    CHECK(J(call)["detail"].get<std::string>().find("not the approval plan of this work") !=
          std::string::npos);
    CHECK(f.Effects() == 0);
  }
  SUBCASE("imported after the call: the line is refused at /decision_id") {
    REQUIRE(f.GatedRefund("O-51", 500) == gate_plan);
    Json result = import();
    CHECK(result["refused"] == 1);
    CHECK(result["results"][0]["field"] == "/decision_id");
    CHECK(J(f.Get("/v1/plans/" + gate_plan))["state"] == "awaiting_approval");
  }
}

TEST_CASE("an import line under the id of a decision of another key is refused, not 'exists'") {
  Fixture f;
  auto made =
      f.Post("/v1/decide", {{"step", "triage_ticket"}, {"input", {{"ticket_id", "T-A"}}}}, kAgent);
  REQUIRE(made->status == 200);
  Json line = ExportedDecision("T-B");
  line["decision_id"] = J(made)["decision_id"];
  auto r = f.client->Post("/v1/decisions/import",
                          {{"Authorization", std::string("Bearer ") + kOperator}},
                          line.dump() + "\n{\"a\":1}\n", "application/x-ndjson");
  REQUIRE(r);
  Json result = J(r);
  CHECK(result["refused"] == 2);
  CHECK(result["results"][0]["field"] == "/decision_id");
  CHECK(result["results"][1]["field"] == "/decision_id");
  CHECK(result["results"][1]["reason"].get<std::string>().find("stored") == std::string::npos);
}

TEST_CASE("a run's item that waited for approval is listed in its run once approved") {
  Fixture f;
  auto run = f.Post(
      "/v1/runs",
      {{"run_id", "refunds-1"},
       {"kind", "refund"},
       {"items", {{{"order_id", "R-1"}, {"amount", 5}}, {{"order_id", "R-2"}, {"amount", 500}}}}},
      kAgent, "\"rr-1\"");
  REQUIRE(run->status == 200);
  Json items = J(run)["items"];
  REQUIRE(items[1]["outcome"] == "awaiting_approval");
  const std::string plan_id = items[1]["plan_id"];
  auto approved = f.Post("/v1/plans/" + plan_id + "/approve", Json::object(), kOperator);
  REQUIRE(approved->status == 200);
  Json listed = J(f.Get("/v1/runs/refunds-1", kAgent));
  CHECK(listed["counts"]["done"] == 2);
  REQUIRE(listed["items"].size() == 2);
  CHECK(f.Get("/v1/runs/" + plan_id, kAgent)->status == 404);
}

TEST_CASE("a rejected plan is never applied, and a rejection needs a reason") {
  Fixture f;
  std::string id = f.GatedRefund("O-9", 700);
  CHECK(f.Post("/v1/plans/" + id + "/reject", Json::object(), kOperator)->status == 400);
  auto rejected = f.Post("/v1/plans/" + id + "/reject", {{"reason", "duplicate order"}}, kOperator);
  REQUIRE(rejected->status == 200);
  CHECK(J(rejected)["state"] == "rejected");
  CHECK(J(rejected)["rejected_by"] == "op-1");
  auto again = f.Post("/v1/actions/refund", {{"args", {{"order_id", "O-9"}, {"amount", 700}}}},
                      kAgent, "\"O-9-again\"");
  CHECK(again->status == 409);
  CHECK(again->body.find("duplicate order") != std::string::npos);
  // A claim and a run of the same work are refused too, pointing at what
  // names the work in each of them (the identity; the run's item).
  auto claim = f.Post("/v1/work/claim",
                      {{"kind", "refund"},
                       {"identity", {{"order_id", "O-9"}}},
                       {"args", {{"order_id", "O-9"}, {"amount", 700}}}},
                      kAgent);
  CHECK(claim->status == 409);
  CHECK(J(claim)["pointer"] == "/identity");
  auto run = f.Post(
      "/v1/runs",
      {{"run_id", "r-9"}, {"kind", "refund"}, {"items", {{{"order_id", "O-9"}, {"amount", 700}}}}},
      kAgent, "\"run-9\"");
  REQUIRE(run->status == 200);
  CHECK(J(run)["items"][0]["error"].get<std::string>().find("(at /items/0)") != std::string::npos);
  CHECK(f.Post("/v1/plans/" + id + "/apply", Json::object(), kOperator, "\"ap\"")->status == 409);
  CHECK(f.Post("/v1/plans/" + id + "/approve", Json::object(), kOperator)->status == 409);
  CHECK(f.Effects() == 0);
}

TEST_CASE("approving twice at once applies the plan once") {
  Fixture f;
  std::string id = f.GatedRefund("O-5", 300);
  std::atomic<int> ok{0}, conflict{0};
  std::vector<std::thread> threads;
  for (const char* token : {kOperator, kOperator2, kOperator, kOperator2}) {
    threads.emplace_back([&, token] {
      auto c = f.daemon->Client();
      auto r =
          c->Post(("/v1/plans/" + id + "/approve").c_str(),
                  {{"Authorization", std::string("Bearer ") + token}}, "{}", "application/json");
      if (r && r->status == 200) ok++;
      if (r && r->status == 409) conflict++;
    });
  }
  for (auto& t : threads) t.join();
  CHECK(ok == 1);
  CHECK(conflict == 3);
  CHECK(f.Effects() == 1);
}

TEST_CASE("an edited plan is applied with the edited args, and the plan keeps both versions") {
  Fixture f;
  std::string id = f.GatedRefund("O-6", 500);
  // An edit that breaks the kind's args_schema is refused with its place.
  auto bad = f.Post("/v1/plans/" + id + "/approve",
                    {{"edits", {{{"path", "/0/args/amount"}, {"value", "lots"}}}}}, kOperator);
  REQUIRE(bad->status == 400);
  CHECK(J(bad)["pointer"] == "/edits/0/value");
  CHECK(f.Post("/v1/plans/" + id + "/approve",
               {{"edits", {{{"path", "/0/kind"}, {"value", "wire"}}}}}, kOperator)
            ->status == 400);
  auto ok = f.Post(
      "/v1/plans/" + id + "/approve",
      {{"comment", "partial refund"}, {"edits", {{{"path", "/0/args/amount"}, {"value", 90}}}}},
      kOperator);
  REQUIRE_MESSAGE(ok->status == 200, ok->body);
  Json p = J(ok);
  CHECK(p["state"] == "applied");
  CHECK(p["actions"][0]["args"]["amount"] == 90);
  CHECK(p["original_actions"][0]["args"]["amount"] == 500);
  CHECK(p["comment"] == "partial refund");
  REQUIRE(f.Effects() == 1);
  Json sent = Json::parse(f.target->calls().back().body);
  CHECK(sent["amount"] == 90);
  // The audit holds both versions and the approver's token name.
  Json audit = J(f.Get("/v1/audit?from_seq=1&limit=100"));
  bool both = false;
  for (const Json& e : audit["items"]) {
    if (e["action"] == "plan.approved" && e["detail"]["plan_id"] == id) {
      both = e["actor"] == "op-1" && e["detail"]["original_actions"][0]["args"]["amount"] == 500 &&
             e["detail"]["actions"][0]["args"]["amount"] == 90;
    }
  }
  CHECK(both);
  CHECK(J(f.Get("/v1/audit/verify"))["ok"] == true);
}

TEST_CASE("a plan nobody approves within its timeout expires and is never applied") {
  Fixture f;
  auto r =
      f.Post("/v1/actions/wire", {{"args", {{"wire_id", "W-1"}, {"to", "x"}}}}, kAgent, "\"w-1\"");
  REQUIRE(r->status == 202);
  const std::string id = J(r)["plan_id"];
  std::string state;
  for (int i = 0; i < 60 && state != "expired"; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    state = J(f.Get("/v1/plans/" + id))["state"];
  }
  CHECK(state == "expired");
  CHECK(f.Post("/v1/plans/" + id + "/approve", Json::object(), kOperator)->status == 409);
  CHECK(f.Post("/v1/actions/wire", {{"args", {{"wire_id", "W-1"}, {"to", "x"}}}}, kAgent, "\"w-2\"")
            ->status == 409);
  CHECK(f.Effects() == 0);
}

TEST_CASE("an agent token cannot approve, and the token that created a plan cannot approve it") {
  Fixture f;
  std::string id = f.GatedRefund("O-7", 250);
  CHECK(f.Post("/v1/plans/" + id + "/approve", Json::object(), kAgent)->status == 403);
  // An admin may approve anything except what it created itself.
  auto own = f.Post("/v1/actions/refund", {{"args", {{"order_id", "O-8"}, {"amount", 600}}}},
                    kAdmin, "\"O-8\"");
  REQUIRE(own->status == 202);
  const std::string own_id = J(own)["plan_id"];
  auto denied = f.Post("/v1/plans/" + own_id + "/approve", Json::object(), kAdmin);
  CHECK(denied->status == 403);
  CHECK(denied->body.find("separation of duties") != std::string::npos);
  CHECK(f.Effects() == 0);
  auto approved = f.Post("/v1/plans/" + own_id + "/approve", Json::object(), kOperator);
  REQUIRE(approved->status == 200);
  Json p = J(approved);
  CHECK(p["approved_by"] == "op-1");
  CHECK(p["created_by"] == "root");
  bool recorded = false;
  for (const Json& h : p["history"]) {
    recorded = recorded || (h["to"] == "approved" && h["actor"] == "op-1");
  }
  CHECK(recorded);
  CHECK(f.Effects() == 1);
}

TEST_CASE("an agent waiting on its plan is answered when an operator approves it") {
  Fixture f;
  std::string id = f.GatedRefund("O-10", 150);
  std::thread approver([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto c = f.daemon->Client();
    c->Post(("/v1/plans/" + id + "/approve").c_str(),
            {{"Authorization", std::string("Bearer ") + kOperator}}, "{}", "application/json");
  });
  auto start = std::chrono::steady_clock::now();
  auto waited = f.Get("/v1/plans/" + id + "?wait=20s", kAgent);
  auto took = std::chrono::steady_clock::now() - start;
  approver.join();
  REQUIRE(waited->status == 200);
  CHECK(J(waited)["state"] != "awaiting_approval");
  CHECK(took < std::chrono::seconds(10));
  CHECK(f.Get("/v1/plans/" + id + "?wait=2h", kAgent)->status == 400);
}

TEST_CASE("agents waiting on plans hold no handler thread: others are served meanwhile") {
  Fixture f(/*threads=*/2);  // two handler threads
  std::string id = f.GatedRefund("O-11", 150);
  constexpr int kWaiters = 8;
  std::atomic<int> answered{0};
  std::vector<std::string> states(kWaiters);
  std::vector<std::thread> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.emplace_back([&, i] {
      auto c = f.daemon->Client();
      c->set_read_timeout(30, 0);
      auto r = c->Get(("/v1/plans/" + id + "?wait=20s").c_str(),
                      {{"Authorization", std::string("Bearer ") + kAgent}});
      if (r && r->status == 200) states[i] = Json::parse(r->body).value("state", "");
      answered.fetch_add(1);
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // every wait has arrived
  CHECK(answered.load() == 0);
  // Eight waits and two handler threads: were they held, this would queue
  // behind the waits for 20 s.
  auto start = std::chrono::steady_clock::now();
  auto other = f.Get("/v1/plans/" + id);
  CHECK((other && other->status == 200));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  auto approved = f.Post("/v1/plans/" + id + "/approve", Json::object(), kOperator);
  CHECK((approved && approved->status == 200));
  for (auto& t : waiters) t.join();  // (no REQUIRE before: the threads must be joined)
  CHECK(answered.load() == kWaiters);
  for (const std::string& s : states) CHECK((s == "approved" || s == "applying" || s == "applied"));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(15));
}

TEST_CASE("the approval queue pages newest first") {
  Fixture f;
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    ids.push_back(f.GatedRefund("Q-" + std::to_string(i), 200 + i));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  Json first = J(f.Get("/v1/plans?state=awaiting_approval&limit=2"));
  REQUIRE(first["items"].size() == 2);
  CHECK(first["items"][0]["plan_id"] == ids[2]);
  CHECK(first["items"][1]["plan_id"] == ids[1]);
  REQUIRE(first.contains("next_cursor"));
  Json second = J(f.Get("/v1/plans?state=awaiting_approval&limit=2&cursor=" +
                        first["next_cursor"].get<std::string>()));
  REQUIRE(second["items"].size() == 1);
  CHECK(second["items"][0]["plan_id"] == ids[0]);
  CHECK_FALSE(second.contains("next_cursor"));
  CHECK(f.Get("/v1/plans?state=nonsense")->status == 400);
  CHECK(f.Get("/v1/plans?cursor=zz")->status == 400);
}

TEST_CASE(
    "a promote retires the original decision's waiting plan, so an operator approves only the "
    "answer the input has now") {
  Fixture f;
  const Json decide = {{"step", "triage_ticket"}, {"input", {{"ticket_id", "T-9"}}}};
  auto d = f.Post("/v1/decide", decide, kAgent);
  REQUIRE(d->status == 200);
  const std::string old_plan = J(d)["plan"]["plan_id"];
  const std::string old_id = J(d)["decision_id"];
  REQUIRE(J(d)["plan"]["state"] == "awaiting_approval");

  auto promoted = f.Post("/v1/decisions/" + old_id + "/replay", {{"promote", true}}, kOperator);
  REQUIRE(promoted);
  REQUIRE_MESSAGE(promoted->status == 200, promoted->body);
  CHECK(J(promoted)["promoted"] == true);
  CHECK(J(promoted)["retired_plan_id"] == old_plan);
  Json retired = J(f.Get("/v1/plans/" + old_plan));
  CHECK(retired["state"] == "rejected");
  CHECK(retired["reason"].get<std::string>().find("superseded") != std::string::npos);
  auto approve_old = f.Post("/v1/plans/" + old_plan + "/approve", Json::object(), kOperator2);
  REQUIRE(approve_old);
  CHECK(approve_old->status == 409);
  CHECK(f.Effects() == 0);

  // The agent's next decide gets the promoted decision and its own plan,
  // which an operator approves once.
  auto again = f.Post("/v1/decide", decide, kAgent);
  REQUIRE(again->status == 200);
  CHECK(J(again)["decision_id"] == J(promoted)["replayed"]["decision_id"]);
  const std::string new_plan = J(again)["plan"]["plan_id"];
  CHECK(new_plan != old_plan);
  // The operator who promoted the answer chose what its plan does: it may
  // not approve that plan.
  CHECK(J(f.Get("/v1/plans/" + new_plan))["approval"]["decision_promoted_by"] == "op-1");
  auto own = f.Post("/v1/plans/" + new_plan + "/approve", Json::object(), kOperator);
  REQUIRE(own);
  CHECK(own->status == 403);
  auto approve_new = f.Post("/v1/plans/" + new_plan + "/approve", Json::object(), kOperator2);
  REQUIRE(approve_new);
  CHECK_MESSAGE(approve_new->status == 200, approve_new->body);
  CHECK(f.Effects() == 1);
}

TEST_CASE(
    "a promote after the original's plan was approved retires nothing and names that plan as "
    "started, so the operator knows its actions ran") {
  Fixture f;
  const Json decide = {{"step", "triage_ticket"}, {"input", {{"ticket_id", "T-RAN"}}}};
  auto d = f.Post("/v1/decide", decide, kAgent);
  REQUIRE(d->status == 200);
  const std::string old_plan = J(d)["plan"]["plan_id"];
  const std::string old_id = J(d)["decision_id"];
  auto approved = f.Post("/v1/plans/" + old_plan + "/approve", Json::object(), kOperator2);
  REQUIRE(approved);
  REQUIRE_MESSAGE(approved->status == 200, approved->body);
  REQUIRE(f.Effects() == 1);
  const std::string ran_state = J(f.Get("/v1/plans/" + old_plan))["state"];

  auto promoted = f.Post("/v1/decisions/" + old_id + "/replay", {{"promote", true}}, kOperator);
  REQUIRE(promoted);
  REQUIRE_MESSAGE(promoted->status == 200, promoted->body);
  CHECK(J(promoted)["promoted"] == true);
  CHECK_FALSE(J(promoted).contains("retired_plan_ids"));
  CHECK(J(promoted)["started_plans"] ==
        Json::array({{{"plan_id", old_plan}, {"state", ran_state}}}));
  CHECK(J(f.Get("/v1/plans/" + old_plan))["state"] == ran_state);
  CHECK(f.Effects() == 1);
}

TEST_CASE(
    "a promote of an older decision's replay also retires the plan of the decision the key "
    "answered with until then, and names the key it stored under") {
  Fixture f;
  const Json decide = {{"step", "triage_ticket"}, {"input", {{"ticket_id", "T-12"}}}};
  auto d1 = f.Post("/v1/decide", decide, kAgent);
  REQUIRE(d1->status == 200);
  const std::string d1_id = J(d1)["decision_id"];
  const std::string key = J(d1)["decision_key"];
  auto first = f.Post("/v1/decisions/" + d1_id + "/replay", {{"promote", true}}, kOperator);
  REQUIRE(first->status == 200);
  auto d2 = f.Post("/v1/decide", decide, kAgent);  // the promoted decision, with its plan
  REQUIRE(d2->status == 200);
  const std::string p2 = J(d2)["plan"]["plan_id"];
  REQUIRE(J(f.Get("/v1/plans/" + p2))["state"] == "awaiting_approval");

  // The first decision's replay promoted again: d2's plan waits no longer.
  auto second = f.Post("/v1/decisions/" + d1_id + "/replay", {{"promote", true}}, kOperator);
  REQUIRE(second);
  REQUIRE_MESSAGE(second->status == 200, second->body);
  CHECK(J(second)["retired_plan_ids"] == Json::array({p2}));
  CHECK(J(second)["retired_plan_id"] == p2);
  CHECK(J(f.Get("/v1/plans/" + p2))["state"] == "rejected");
  const std::string d3_id = J(second)["replayed"]["decision_id"];
  CHECK(J(second)["replayed"]["decision_key"] == key);
  CHECK(J(f.Get("/v1/decisions/" + d3_id))["decision_key"] == key);
  auto approve_p2 = f.Post("/v1/plans/" + p2 + "/approve", Json::object(), kOperator2);
  REQUIRE(approve_p2);
  CHECK(approve_p2->status == 409);
  CHECK(f.Effects() == 0);
}

TEST_CASE(
    "two promotes of one key at once: one replaces the decision, the other is refused and "
    "writes nothing") {
  // The first promote holds its key's lock 1.5 s, so the second meets it.
  Fixture f(0, {{"IDEM_FAILPOINTS", "api.promote_locked=1*delay(1500)"}});
  const Json decide = {{"step", "triage_ticket"}, {"input", {{"ticket_id", "T-21"}}}};
  auto d1 = f.Post("/v1/decide", decide, kAgent);
  REQUIRE(d1->status == 200);
  const std::string d1_id = J(d1)["decision_id"];
  const std::string p1 = J(d1)["plan"]["plan_id"];
  auto promotes = [&] {
    size_t n = 0;
    const Json audit = J(f.Get("/v1/audit?from_seq=1&limit=100", kAdmin));
    for (const Json& e : audit["items"]) {
      n += e.value("action", "") == "decision.promoted" ? 1 : 0;
    }
    return n;
  };
  REQUIRE(promotes() == 0);
  int first_status = 0;
  std::string first_body;
  std::thread first([&] {
    auto c = f.daemon->Client();
    auto r = c->Post(("/v1/decisions/" + d1_id + "/replay").c_str(),
                     {{"Authorization", std::string("Bearer ") + kOperator}},
                     Json{{"promote", true}}.dump(), "application/json");
    if (r) {
      first_status = r->status;
      first_body = r->body;
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  auto second = f.Post("/v1/decisions/" + d1_id + "/replay", {{"promote", true}}, kOperator2);
  first.join();
  REQUIRE(second);
  REQUIRE_MESSAGE(first_status == 200, first_body);
  CHECK(Json::parse(first_body)["promoted"] == true);
  CHECK(Json::parse(first_body)["retired_plan_id"] == p1);
  CHECK_MESSAGE(second->status == 409, second->body);
  CHECK(J(second)["pointer"] == "/promote");
  // One decision.promoted in the audit trail, and the key answers with the first's.
  CHECK(promotes() == 1);
  const std::string winner = Json::parse(first_body)["replayed"]["decision_id"];
  auto now = f.Post("/v1/decide", decide, kAgent);
  CHECK(J(now)["decision_id"] == winner);
  // The lock is given back: a promote after it goes through.
  auto third = f.Post("/v1/decisions/" + d1_id + "/replay", {{"promote", true}}, kOperator);
  CHECK_MESSAGE(third->status == 200, third->body);
}

TEST_CASE(
    "an approval names the plan as it was read: a plan changed since is refused, 409 at "
    "/expect_updated_at_ms, and nothing runs") {
  Fixture f;
  const std::string id = f.GatedRefund("X-1", 300);
  const Json read = J(f.Get("/v1/plans/" + id));
  const int64_t seen = read["updated_at_ms"];
  auto stale =
      f.Post("/v1/plans/" + id + "/approve", {{"expect_updated_at_ms", seen - 1}}, kOperator);
  REQUIRE(stale);
  CHECK(stale->status == 409);
  CHECK(J(stale)["pointer"] == "/expect_updated_at_ms");
  CHECK(J(f.Get("/v1/plans/" + id))["state"] == "awaiting_approval");
  CHECK(f.Effects() == 0);
  auto fresh = f.Post("/v1/plans/" + id + "/approve", {{"expect_updated_at_ms", seen}}, kOperator);
  REQUIRE(fresh);
  CHECK_MESSAGE(fresh->status == 200, fresh->body);
  CHECK(f.Effects() == 1);
}

}  // namespace idem::testing
