// The MCP tools (daemon/http/api_mcp.cc) over /mcp on the real daemon: what
// a tools/call answers, and what a retried call gets back, against the fake
// effector in this process (it answers with the body it got).
#include <doctest/doctest.h>

#include <string>

#include "tests/fakes/fake_effector.h"
#include "tests/integration/harness.h"

namespace idem::testing {
namespace {

using fakes::FakeEffectorServer;

// A daemon with the kind send_reply and an MCP session.
struct Fixture {
  TempDir dir;
  std::unique_ptr<FakeEffectorServer> target = FakeEffectorServer::Start();
  std::string session;  // Mcp-Session-Id
  int id = 0;           // of the last JSON-RPC request
  std::unique_ptr<DaemonProcess> daemon;
  std::unique_ptr<httplib::Client> client;

  Fixture() {
    REQUIRE(target != nullptr);
    const std::string config =
        WriteTestConfig(dir, kQuestionRules,
                        "actions:\n"
                        "  send_reply:\n"
                        "    identity: {fields: [/ticket_id], version: v1}\n"
                        "    window: 24h\n"
                        "    on_duplicate: return_original\n"
                        "    effector: {http: {method: POST, url: \"" +
                            target->base_url() + "/replies\", idempotency: header}}\n");
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

}  // namespace idem::testing
