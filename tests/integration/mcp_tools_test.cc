// The MCP tools (daemon/http/api_mcp.cc) over /mcp on the real daemon: what
// a tools/call answers, and what a retried call gets back, against the fake
// effector in this process (it answers with the body it got).
#include <doctest/doctest.h>

#include <chrono>
#include <map>
#include <string>
#include <thread>

#include "tests/fakes/fake_effector.h"
#include "tests/integration/harness.h"

namespace idem::testing {
namespace {

using fakes::FakeEffectorServer;

// A daemon with the kind send_reply (and `kinds_yaml`'s) and an MCP session.
struct Fixture {
  TempDir dir;
  std::unique_ptr<FakeEffectorServer> target = FakeEffectorServer::Start();
  std::string session;  // Mcp-Session-Id
  int id = 0;           // of the last JSON-RPC request
  std::unique_ptr<DaemonProcess> daemon;
  std::unique_ptr<httplib::Client> client;

  // `kinds_yaml`: more action kinds (under actions:, two-space indented;
  // "{effector}" in it is the fake effector's URL).
  explicit Fixture(const std::string& kinds_yaml = "") {
    REQUIRE(target != nullptr);
    std::string kinds = kinds_yaml;  // "{effector}": the fake's URL
    for (size_t at = kinds.find("{effector}"); at != std::string::npos;
         at = kinds.find("{effector}")) {
      kinds.replace(at, 10, target->base_url());
    }
    const std::string config =
        WriteTestConfig(dir, kQuestionRules,
                        "actions:\n"
                        "  send_reply:\n"
                        "    identity: {fields: [/ticket_id], version: v1}\n"
                        "    window: 24h\n"
                        "    on_duplicate: return_original\n"
                        "    effector: {http: {method: POST, url: \"" +
                            target->base_url() + "/replies\", idempotency: header}}\n" + kinds);
    std::string err;
    daemon = DaemonProcess::Start({config, dir.path() + "/data", {}, {}}, &err);
    REQUIRE_MESSAGE(daemon != nullptr, err);
    client = daemon->Client();
    auto init = Rpc("initialize", {{"protocolVersion", "2025-11-25"},
                                   {"capabilities", Json::object()},
                                   {"clientInfo", {{"name", "test"}, {"version", "1"}}}});
    REQUIRE(init);
    REQUIRE(init->status == 200);
    session = init->get_header_value("Mcp-Session-Id");
    REQUIRE_FALSE(session.empty());
  }

  httplib::Result Post(const std::string& body) {
    httplib::Headers headers = {{"Accept", "application/json, text/event-stream"}};
    if (!session.empty()) {
      headers.emplace("Mcp-Session-Id", session);
      headers.emplace("MCP-Protocol-Version", "2025-11-25");
    }
    return client->Post("/mcp", headers, body, "application/json");
  }

  httplib::Result Rpc(const std::string& method, const Json& params) {
    return Post(
        Json{{"jsonrpc", "2.0"}, {"id", ++id}, {"method", method}, {"params", params}}.dump());
  }

  // The result of tools/call `name` (REQUIREs a JSON-RPC result).
  Json Call(const std::string& name, const Json& arguments, const Json& meta = nullptr) {
    Json params = {{"name", name}, {"arguments", arguments}};
    if (!meta.is_null()) params["_meta"] = meta;
    auto res = Rpc("tools/call", params);
    REQUIRE(res);
    REQUIRE(res->status == 200);
    Json j = Json::parse(res->body);
    REQUIRE_MESSAGE(j.contains("result"), res->body.substr(0, 300));
    return j["result"];
  }
};

// `levels` objects, one inside the other, around a string.
Json Nested(int levels) {
  Json v = "bottom";
  for (int i = 0; i < levels; ++i) v = Json{{"n", std::move(v)}};
  return v;
}

// do_send_reply with `args` twice: created (the effector's answer, the
// arguments echoed, is the result), then already_done with that result.
void CallTwiceReplays(Fixture& f, const Json& args) {
  const Json first = f.Call("do_send_reply", args);
  REQUIRE_MESSAGE(first["isError"] == false, first.dump().substr(0, 300));
  CHECK(first["structuredContent"]["outcome"] == "created");
  // (Compared, not CHECKed as values: a failure would print them whole.)
  const bool echoed = first["structuredContent"]["result"]["body"]["text"] == args["text"];
  CHECK(echoed);
  const Json again = f.Call("do_send_reply", args);
  REQUIRE_MESSAGE(again["isError"] == false, again.dump().substr(0, 300));
  CHECK(again["structuredContent"]["outcome"] == "already_done");
  const bool same = again["structuredContent"]["result"] == first["structuredContent"]["result"];
  CHECK(same);
  CHECK(f.target->stats().effects == 1);
}

}  // namespace

TEST_CASE("a retried tool call whose first answer was large replays it") {
  Fixture f;
  CallTwiceReplays(f, {{"ticket_id", "T-BIG"}, {"text", std::string(600 * 1024, 'x')}});
}

TEST_CASE("a retried tool call whose first answer was deeply nested replays it") {
  Fixture f;
  CallTwiceReplays(f, {{"ticket_id", "T-DEEP"}, {"text", Nested(61)}});
}

TEST_CASE("a do_ call again after its kind's window is new work, as over REST") {
  Fixture f(
      "  ping_short:\n"
      "    identity: {fields: [/ping_id], version: v1}\n"
      "    window: 2s\n"
      "    on_duplicate: return_original\n"
      "    effector: {http: {method: POST, url: \"{effector}/records\", idempotency: header}}\n");
  const Json args = {{"ping_id", "P-1"}};
  Json first = f.Call("do_ping_short", args);
  REQUIRE_MESSAGE(first["isError"] == false, first.dump());
  CHECK(first["structuredContent"]["outcome"] == "created");
  Json within = f.Call("do_ping_short", args);
  CHECK(within["structuredContent"]["outcome"] == "already_done");
  CHECK(within["structuredContent"]["work_id"] == first["structuredContent"]["work_id"]);
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  Json after = f.Call("do_ping_short", args);
  REQUIRE_MESSAGE(after["isError"] == false, after.dump());
  CHECK(after["structuredContent"]["outcome"] == "created");
  CHECK(f.target->stats().raw_calls == 2);  // (the same work id: the fake answers it again)
}

TEST_CASE("a tool call's key lives as long as idempotency.routes keeps its route's keys") {
  // Answers of decide_ calls are kept 1 s, as POST /v1/decide's keys.
  Fixture f("idempotency:\n  routes:\n    POST /v1/decide: 1s\n");
  const Json args = {{"input", {{"ticket_id", 7}, {"text", "where is my order"}}}};
  const Json key = {{"idempotencyKey", "decide-7"}};
  const Json first = f.Call("decide_triage_ticket", args, key);
  REQUIRE_MESSAGE(first["isError"] == false, first.dump().substr(0, 300));
  CHECK(first["structuredContent"]["cache"] == "miss");
  // Within the window the stored answer is replayed as it was.
  CHECK(f.Call("decide_triage_ticket", args, key)["structuredContent"]["cache"] == "miss");
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  // Past it the call runs again, and finds the decision in the cache.
  const Json after = f.Call("decide_triage_ticket", args, key);
  CHECK(after["structuredContent"]["cache"] == "hit");
  CHECK(after["structuredContent"]["decision_id"] == first["structuredContent"]["decision_id"]);
}

TEST_CASE("a claim_work on work another holds says when to call again, as Retry-After does") {
  Fixture f(
      "  hand_off:\n"
      "    identity: {fields: [/case_id], version: v1}\n"
      "    window: 24h\n"
      "    on_duplicate: return_original\n");
  const Json args = {{"kind", "hand_off"}, {"identity", {{"case_id", "C-1"}}}, {"lease", "30s"}};
  const Json first = f.Call("claim_work", args, {{"idempotencyKey", "worker-a"}});
  REQUIRE_MESSAGE(first["isError"] == false, first.dump().substr(0, 300));
  // Another worker's call (another key): the work is held for 30 s.
  const Json busy = f.Call("claim_work", args, {{"idempotencyKey", "worker-b"}});
  REQUIRE(busy["isError"] == true);
  const std::string text = busy["content"][0]["text"];
  const size_t at = text.find("Call again in ");
  REQUIRE_MESSAGE(at != std::string::npos, text);
  const int seconds = std::stoi(text.substr(at + 14));
  CHECK(seconds >= 1);
  CHECK(seconds <= 30);
}

TEST_CASE("a do_ tool's description says what a call again gets under each on_duplicate") {
  std::string kinds;
  for (const char* mode : {"conflict", "ignore"}) {
    kinds += std::string("  once_") + mode + ":\n    identity: {fields: [/id], version: v1}\n" +
             "    window: 24h\n    on_duplicate: " + mode +
             "\n    effector: {http: {method: POST, url: \"{effector}/records\", idempotency: "
             "header}}\n";
  }
  Fixture f(kinds);
  auto listed = f.Rpc("tools/list", Json::object());
  REQUIRE(listed);
  const Json tools = Json::parse(listed->body)["result"]["tools"];
  std::map<std::string, std::string> described;
  for (const Json& t : tools) {
    described[t["name"]] = t["description"];
  }
  CAPTURE(described["do_once_conflict"]);
  CAPTURE(described["do_once_ignore"]);
  CHECK(described["do_send_reply"].find("it returns outcome already_done with the original "
                                        "result") != std::string::npos);
  CHECK(described["do_once_conflict"].find("refused with an error") != std::string::npos);
  CHECK(described["do_once_ignore"].find("already_done without the result") != std::string::npos);
  for (const char* tool : {"do_once_conflict", "do_once_ignore"}) {
    CHECK(described[tool].find("it returns outcome already_done") == std::string::npos);
  }
  // What they say is what a call gets: the same call again replays the
  // first answer; another call with the same identity (here, another key)
  // is refused (conflict) or answered without the result (ignore).
  for (const char* tool : {"do_once_conflict", "do_once_ignore"}) {
    CAPTURE(tool);
    const Json args = {{"id", std::string("X-") + tool}};
    Json first = f.Call(tool, args);
    REQUIRE_MESSAGE(first["isError"] == false, first.dump());
    Json same = f.Call(tool, args);
    CHECK(same["structuredContent"]["outcome"] == "already_done");
    CHECK(same["structuredContent"]["result"] == first["structuredContent"]["result"]);
    Json other = f.Call(tool, args, {{"idempotencyKey", "another-call"}});
    if (std::string(tool) == "do_once_conflict") {
      CHECK(other["isError"] == true);
      CHECK(other["content"][0]["text"].get<std::string>().find("already done") !=
            std::string::npos);
    } else {
      CHECK(other["isError"] == false);
      CHECK(other["structuredContent"]["outcome"] == "already_done");
      CHECK_FALSE(other["structuredContent"].contains("result"));
    }
  }
}

TEST_CASE(
    "a do_ call first answered awaiting_approval, made again after the approved work ran, is "
    "already_done with the result even under on_duplicate conflict") {
  Fixture f(
      "  wire:\n"
      "    identity: {fields: [/id], version: v1}\n"
      "    window: 24h\n"
      "    on_duplicate: conflict\n"
      "    effector: {http: {method: POST, url: \"{effector}/records\", idempotency: header}}\n"
      "    approval: {require: always, reason: every wire}\n");
  const Json args = {{"id", "W-1"}, {"amount", 70}};
  const Json first = f.Call("do_wire", args);
  REQUIRE_MESSAGE(first["isError"] == false, first.dump());
  REQUIRE(first["structuredContent"]["outcome"] == "awaiting_approval");
  const std::string plan = first["structuredContent"]["plan_id"];
  auto approved = f.client->Post(("/v1/plans/" + plan + "/approve").c_str(),
                                 {{"Idempotency-Key", "\"approve-w1\""}}, "{}", "application/json");
  REQUIRE(approved);
  REQUIRE_MESSAGE(approved->status == 200, approved->body);
  REQUIRE(f.target->stats().effects == 1);
  // As the tool's description asks: the same arguments again.
  const Json again = f.Call("do_wire", args);
  REQUIRE_MESSAGE(again["isError"] == false, again.dump());
  CHECK(again["structuredContent"]["outcome"] == "already_done");
  CHECK(again["structuredContent"].contains("result"));
  // Another call with that identity is still refused.
  const Json other = f.Call("do_wire", args, {{"idempotencyKey", "another-wire-call"}});
  CHECK(other["isError"] == true);
  CHECK(f.target->stats().effects == 1);
}

TEST_CASE("_meta.idempotencyKey is counted in characters and must be a string") {
  Fixture f;
  std::string e150, e256;
  for (int i = 0; i < 150; ++i) e150 += "\xC3\xA9";  // é: 2 bytes, one character
  for (int i = 0; i < 256; ++i) e256 += "\xC3\xA9";
  Json fits = f.Call("do_send_reply", {{"ticket_id", "T-K1"}}, {{"idempotencyKey", e150}});
  CHECK_MESSAGE(fits["isError"] == false, fits.dump());
  Json again = f.Call("do_send_reply", {{"ticket_id", "T-K1"}}, {{"idempotencyKey", e150}});
  CHECK(again["structuredContent"]["outcome"] == "already_done");
  Json too_long = f.Call("do_send_reply", {{"ticket_id", "T-K2"}}, {{"idempotencyKey", e256}});
  CHECK(too_long["isError"] == true);
  CHECK(too_long["content"][0]["text"].get<std::string>().find("255 characters") !=
        std::string::npos);
  for (const Json& key : {Json(5), Json(true), Json::object(), Json(nullptr)}) {
    CAPTURE(key);
    Json wrong = f.Call("do_send_reply", {{"ticket_id", "T-K3"}}, {{"idempotencyKey", key}});
    CHECK(wrong["isError"] == true);
    CHECK(wrong["content"][0]["text"].get<std::string>().find("_meta.idempotencyKey must be a "
                                                              "string") != std::string::npos);
  }
  CHECK(f.target->stats().effects == 1);  // T-K1 once; nothing for the refused calls
}

TEST_CASE(
    "a tool call with an argument its route does not take is an error naming it, not a call "
    "without it: a mistyped cache: only must not pay for a provider call") {
  Fixture f;
  const long calls = MetricValue(*f.client, "idem_provider_calls_total");
  Json typo = f.Call("decide_triage_ticket",
                     {{"input", {{"ticket_id", 8100}, {"text", "hello"}}}, {"Cache", "only"}});
  CHECK(typo["isError"] == true);
  CHECK_MESSAGE(typo["content"][0]["text"].get<std::string>().find("Cache") != std::string::npos,
                typo.dump());
  CHECK(MetricValue(*f.client, "idem_provider_calls_total") == calls);
  Json only = f.Call("decide_triage_ticket",
                     {{"input", {{"ticket_id", 8100}, {"text", "hello"}}}, {"cache", "only"}});
  CHECK(only["isError"] == true);  // a miss: cache only never asks the model
  CHECK(MetricValue(*f.client, "idem_provider_calls_total") == calls);
  Json stray = f.Call("get_decision", {{"decision_id", "dec_x"}, {"bogus", 1}});
  CHECK(stray["isError"] == true);
  CHECK(stray["content"][0]["text"].get<std::string>().find("bogus") != std::string::npos);
  // The work tools take what their routes take (run_id, retry_after), no more.
  Json tools = Json::parse(f.Rpc("tools/list", Json::object())->body)["result"]["tools"];
  std::map<std::string, Json> inputs;
  for (const Json& t : tools) inputs[t["name"]] = t["inputSchema"];
  CHECK(inputs["claim_work"]["properties"].contains("run_id"));
  CHECK(inputs["fail_work"]["properties"].contains("retry_after"));
  for (const char* name : {"claim_work", "complete_work", "fail_work", "decide_triage_ticket",
                           "get_plan", "get_decision"}) {
    CAPTURE(name);
    CHECK(inputs[name]["additionalProperties"] == false);
  }
  CHECK(inputs["complete_work"]["required"] == Json::array({"work_id", "lease_token"}));
}

TEST_CASE("HEAD /mcp is answered as GET: 405 with Allow and no body") {
  Fixture f;
  auto get = f.client->Get("/mcp");
  auto head = f.client->Head("/mcp");
  REQUIRE(get);
  REQUIRE(head);
  CHECK(get->status == 405);
  CHECK(head->status == 405);
  CHECK(head->get_header_value("Allow") == "POST, DELETE");
  CHECK(head->get_header_value("Allow") == get->get_header_value("Allow"));
  CHECK(head->body.empty());
  // Another method's 405 names the same methods: not GET and HEAD, which
  // answer 405 themselves.
  auto put = f.client->Put("/mcp", "{}", "application/json");
  REQUIRE(put);
  CHECK(put->status == 405);
  CHECK(put->get_header_value("Allow") == "POST, DELETE");
}

}  // namespace idem::testing
