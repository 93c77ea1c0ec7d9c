// The MCP Streamable HTTP transport (daemon/mcp/mcp.h) without a network:
// sessions, version negotiation, batches, Accept, paging, JSON-RPC errors.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "daemon/mcp/mcp.h"

namespace idem {
namespace {

class CountingToolbox final : public McpToolbox {
 public:
  explicit CountingToolbox(int n) {
    for (int i = 0; i < n; ++i) {
      tools_.push_back({{"name", "t" + std::to_string(i)},
                        {"description", "d"},
                        {"inputSchema", {{"type", "object"}}}});
    }
  }
  const std::vector<Json>& Tools() const override { return tools_; }
  Json Call(const std::string& name, const Json& arguments, const Json&, const std::string& caller,
            const std::string&) override {
    if (name.empty() || name[0] != 't') return Json();
    ++calls;
    last_caller = caller;
    return {{"content", Json::array({{{"type", "text"}, {"text", arguments.dump()}}})},
            {"isError", false}};
  }
  int calls = 0;
  std::string last_caller;

 private:
  std::vector<Json> tools_;
};

McpHttpRequest Post(Json body, std::string session = "") {
  McpHttpRequest r;
  r.method = "POST";
  r.accept = "application/json, text/event-stream";
  r.session_id = std::move(session);
  r.caller = "agent-1";
  r.body = std::move(body);
  return r;
}

Json Rpc(int id, const std::string& method, Json params = Json::object()) {
  return {{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", params}};
}

McpHttpRequest Delete(std::string session, std::string caller = "agent-1") {
  McpHttpRequest r;
  r.method = "DELETE";
  r.session_id = std::move(session);
  r.caller = std::move(caller);
  return r;
}

std::string SessionOf(const McpHttpResponse& r) {
  for (const auto& [k, v] : r.headers) {
    if (k == "Mcp-Session-Id") return v;
  }
  return "";
}

struct Fixture {
  CountingToolbox tools{5};
  McpProtocol mcp{tools, McpOptions{.max_sessions = 3,
                                    .session_idle_ms = 1000,
                                    .tools_page_size = 2,
                                    .max_batch = 4,
                                    .server_name = "idem",
                                    .server_version = "test"}};
  std::string Initialize(const std::string& version = "2025-11-25", int64_t now = 0) {
    McpHttpResponse r = mcp.Handle(Post(Rpc(1, "initialize", {{"protocolVersion", version}})), now);
    REQUIRE(r.status == 200);
    return SessionOf(r);
  }
};

}  // namespace

TEST_CASE("initialize issues a session and negotiates a supported protocol version") {
  Fixture f;
  McpHttpResponse r =
      f.mcp.Handle(Post(Rpc(1, "initialize", {{"protocolVersion", "2025-03-26"}})), 0);
  REQUIRE(r.status == 200);
  Json j = Json::parse(r.body);
  CHECK(j["result"]["protocolVersion"] == "2025-03-26");
  CHECK(j["result"]["capabilities"].contains("tools"));
  CHECK_FALSE(SessionOf(r).empty());
  // A version this server does not know is answered with the latest.
  McpHttpResponse other =
      f.mcp.Handle(Post(Rpc(1, "initialize", {{"protocolVersion", "1999-01-01"}})), 0);
  CHECK(Json::parse(other.body)["result"]["protocolVersion"] == kMcpLatestVersion);
  // No version at all is no initialize (the specification requires one):
  // -32602, and no session is opened.
  for (const Json& params : {Json::object(), Json{{"capabilities", Json::object()}}}) {
    CAPTURE(params.dump());
    McpHttpResponse none = f.mcp.Handle(Post(Rpc(1, "initialize", params)), 0);
    Json answer = Json::parse(none.body);
    CHECK(answer["error"]["code"] == -32602);
    CHECK(SessionOf(none).empty());
  }
}

TEST_CASE("requests after initialize need a live session") {
  Fixture f;
  CHECK(f.mcp.Handle(Post(Rpc(2, "ping")), 0).status == 400);
  CHECK(f.mcp.Handle(Post(Rpc(2, "ping"), "nope"), 0).status == 404);
  std::string sid = f.Initialize();
  CHECK(f.mcp.Handle(Post(Rpc(2, "ping"), sid), 10).status == 200);
  // Idle past session_idle_ms: gone, the client must initialize again.
  CHECK(f.mcp.Handle(Post(Rpc(3, "ping"), sid), 5000).status == 404);
}

TEST_CASE("DELETE ends a session and GET opens no stream") {
  Fixture f;
  std::string sid = f.Initialize();
  McpHttpRequest del = Delete(sid);
  CHECK(f.mcp.Handle(del, 0).status == 200);
  CHECK(f.mcp.Handle(del, 0).status == 404);
  CHECK(f.mcp.Handle(Post(Rpc(2, "ping"), sid), 0).status == 404);
  McpHttpRequest get;
  get.method = "GET";
  CHECK(f.mcp.Handle(get, 0).status == 405);
}

TEST_CASE(
    "a session belongs to the caller that opened it: another caller can neither use nor end "
    "it") {
  Fixture f;
  std::string sid = f.Initialize();  // as agent-1
  McpHttpRequest other = Post(Rpc(2, "ping"), sid);
  other.caller = "agent-2";
  CHECK(f.mcp.Handle(other, 0).status == 404);
  CHECK(f.mcp.Handle(Delete(sid, "agent-2"), 0).status == 404);
  CHECK(f.mcp.Handle(Post(Rpc(3, "ping"), sid), 0).status == 200);  // its owner's, still alive
}

TEST_CASE("sessions are bounded: the least recently used is dropped first") {
  Fixture f;
  std::string a = f.Initialize(), b = f.Initialize(), c = f.Initialize();
  CHECK(f.mcp.Handle(Post(Rpc(2, "ping"), a), 1).status == 200);  // a is fresh now
  std::string d = f.Initialize();
  CHECK(f.mcp.session_count() == 3);
  CHECK(f.mcp.Handle(Post(Rpc(2, "ping"), b), 2).status == 404);
  CHECK(f.mcp.Handle(Post(Rpc(2, "ping"), a), 2).status == 200);
  CHECK(f.mcp.Handle(Post(Rpc(2, "ping"), d), 2).status == 200);
}

TEST_CASE("a caller past its share of sessions drops its own oldest, never another's") {
  CountingToolbox tools{1};
  McpProtocol mcp{tools, McpOptions{.max_sessions = 10, .max_sessions_per_caller = 2}};
  auto open = [&](const std::string& caller) {
    McpHttpRequest r = Post(Rpc(1, "initialize", {{"protocolVersion", "2025-11-25"}}));
    r.caller = caller;
    return SessionOf(mcp.Handle(r, 0));
  };
  auto alive = [&](const std::string& caller, const std::string& sid) {
    McpHttpRequest r = Post(Rpc(2, "ping"), sid);
    r.caller = caller;
    return mcp.Handle(r, 1).status == 200;
  };
  const std::string theirs = open("agent-2");
  const std::string first = open("agent-1");
  for (int i = 0; i < 50; ++i) open("agent-1");  // an initialize loop
  CHECK(alive("agent-2", theirs));
  CHECK_FALSE(alive("agent-1", first));
  CHECK(mcp.session_count() == 3);
}

TEST_CASE("each call of a batch past the first takes its own rate-limit token") {
  Fixture f;
  std::string sid = f.Initialize("2025-03-26");
  int tokens = 1;  // the request took one; one more is left
  McpHttpRequest r = Post(
      Json::array({Rpc(1, "tools/call", {{"name", "t0"}}), Rpc(2, "ping"),
                   Rpc(3, "tools/call", {{"name", "t1"}}), Rpc(4, "tools/call", {{"name", "t2"}})}),
      sid);
  r.take_rate_token = [&] { return tokens-- > 0; };
  McpHttpResponse res = f.mcp.Handle(r, 0);
  REQUIRE(res.status == 200);
  Json j = Json::parse(res.body);
  REQUIRE(j.size() == 4);
  CHECK(j[0]["result"]["isError"] == false);
  CHECK(j[1]["result"].is_object());  // a ping costs nothing
  CHECK(j[2]["result"]["isError"] == false);
  CHECK(j[3]["error"]["code"] == -32000);
  CHECK(f.tools.calls == 2);
}

TEST_CASE("batches are refused in sessions of MCP 2025-06-18 and later, and initialize in any") {
  Fixture f;
  std::string sid = f.Initialize("2025-06-18");
  McpHttpResponse r = f.mcp.Handle(Post(Json::array({Rpc(1, "ping")}), sid), 0);
  CHECK(r.status == 400);
  CHECK(Json::parse(r.body)["error"]["code"] == -32600);
  McpHttpResponse init = f.mcp.Handle(
      Post(Json::array({Rpc(1, "initialize", {{"protocolVersion", "2025-03-26"}})})), 0);
  CHECK(init.status == 400);
  CHECK(SessionOf(init).empty());
}

TEST_CASE("an unsupported MCP-Protocol-Version header is refused") {
  Fixture f;
  std::string sid = f.Initialize();
  McpHttpRequest r = Post(Rpc(2, "ping"), sid);
  r.protocol_version = "2030-01-01";
  CHECK(f.mcp.Handle(r, 0).status == 400);
  r.protocol_version = "2025-06-18";
  CHECK(f.mcp.Handle(r, 0).status == 200);
}

TEST_CASE("DELETE with an unsupported MCP-Protocol-Version is refused and ends nothing") {
  Fixture f;
  std::string sid = f.Initialize();
  McpHttpRequest del = Delete(sid);
  del.protocol_version = "1999-01-01";
  McpHttpResponse refused = f.mcp.Handle(del, 0);
  CHECK(refused.status == 400);
  CHECK(Json::parse(refused.body)["error"]["message"].get<std::string>().find("1999-01-01") !=
        std::string::npos);
  CHECK(f.mcp.Handle(Post(Rpc(2, "ping"), sid), 0).status == 200);  // still alive
  del.protocol_version = "2025-11-25";
  CHECK(f.mcp.Handle(del, 0).status == 200);
}

TEST_CASE("HEAD is answered as GET: 405 with Allow") {
  Fixture f;
  McpHttpRequest get;
  get.method = "GET";
  McpHttpRequest head = get;
  head.method = "HEAD";
  McpHttpResponse g = f.mcp.Handle(get, 0), h = f.mcp.Handle(head, 0);
  CHECK(h.status == 405);
  CHECK(h.headers == g.headers);
  CHECK(h.body == g.body);
  CHECK(h.headers == std::vector<std::pair<std::string, std::string>>{{"Allow", "POST, DELETE"}});
}

TEST_CASE(
    "a lone message that is no valid JSON-RPC request is a 400 carrying its error, with its id "
    "when readable") {
  Fixture f;
  std::string sid = f.Initialize();
  struct Case {
    Json msg;
    Json id;  // the id the error carries
  };
  for (const Case& c :
       {Case{{{"jsonrpc", "2.0"}, {"method", 5}}, nullptr},
        Case{{{"jsonrpc", "2.0"}, {"id", 5}, {"method", 5}}, 5},
        Case{{{"jsonrpc", "1.0"}, {"id", "a"}, {"method", "ping"}}, "a"},
        Case{{{"jsonrpc", "1.0"}, {"id", Json::array()}, {"method", "ping"}}, nullptr},
        Case{{{"jsonrpc", "2.0"}, {"id", nullptr}, {"method", "ping"}}, nullptr},
        Case{{{"jsonrpc", "2.0"}, {"id", 8}}, 8}}) {
    CAPTURE(c.msg);
    McpHttpResponse r = f.mcp.Handle(Post(c.msg, sid), 0);
    CHECK(r.status == 400);
    CHECK(r.content_type == "application/json");
    Json j = Json::parse(r.body);
    CHECK(j["error"]["code"] == -32600);
    CHECK(j["id"] == c.id);
  }
  // Valid requests the server answers with an error stay 200.
  CHECK(f.mcp.Handle(Post(Rpc(1, "resources/list"), sid), 0).status == 200);
  CHECK(f.mcp.Handle(Post(Rpc(1, "tools/call", {{"name", "unknown"}}), sid), 0).status == 200);
  // In a batch, the invalid message's error is its answer in the batch's.
  std::string old = f.Initialize("2025-03-26");
  McpHttpResponse batch = f.mcp.Handle(
      Post(Json::array({Rpc(1, "ping"), {{"jsonrpc", "2.0"}, {"id", 2}, {"method", 5}}}), old), 0);
  REQUIRE(batch.status == 200);
  Json answers = Json::parse(batch.body);
  REQUIRE(answers.size() == 2);
  CHECK(answers[0]["result"].is_object());
  CHECK(answers[1]["id"] == 2);
  CHECK(answers[1]["error"]["code"] == -32600);
}

TEST_CASE("notifications alone are accepted with 202 and no body") {
  Fixture f;
  std::string sid = f.Initialize();
  McpHttpResponse r =
      f.mcp.Handle(Post({{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}}, sid), 0);
  CHECK(r.status == 202);
  CHECK(r.body.empty());
}

TEST_CASE("a batch is answered with one answer per request, in order") {
  Fixture f;
  std::string sid = f.Initialize("2025-03-26");
  Json batch = Json::array({Rpc(1, "ping"),
                            {{"jsonrpc", "2.0"}, {"method", "notifications/x"}},
                            Rpc(2, "nope"),
                            Rpc(3, "tools/call", {{"name", "t1"}, {"arguments", {{"a", 1}}}})});
  McpHttpResponse r = f.mcp.Handle(Post(batch, sid), 0);
  REQUIRE(r.status == 200);
  Json j = Json::parse(r.body);
  REQUIRE(j.size() == 3);
  CHECK(j[0]["id"] == 1);
  CHECK(j[1]["error"]["code"] == -32601);
  CHECK(j[2]["result"]["isError"] == false);
  CHECK(f.tools.calls == 1);
  CHECK(f.tools.last_caller == "agent-1");
  Json too_many = Json::array();
  for (int i = 0; i < 5; ++i) too_many.push_back(Rpc(i, "ping"));
  CHECK(f.mcp.Handle(Post(too_many, sid), 0).status == 413);
  CHECK(f.mcp.Handle(Post(Json::array(), sid), 0).status == 400);
}

TEST_CASE("tools/list pages with nextCursor and refuses a cursor it did not make") {
  Fixture f;
  std::string sid = f.Initialize();
  std::vector<std::string> names;
  Json params = Json::object();
  for (int page = 0; page < 5; ++page) {
    Json j = Json::parse(f.mcp.Handle(Post(Rpc(page, "tools/list", params), sid), 0).body);
    for (const Json& t : j["result"]["tools"]) names.push_back(t["name"]);
    if (!j["result"].contains("nextCursor")) break;
    params = {{"cursor", j["result"]["nextCursor"]}};
  }
  CHECK(names == std::vector<std::string>{"t0", "t1", "t2", "t3", "t4"});
  Json bad = Json::parse(f.mcp.Handle(Post(Rpc(9, "tools/list", {{"cursor", "zz"}}), sid), 0).body);
  CHECK(bad["error"]["code"] == -32602);
}

TEST_CASE("protocol faults are JSON-RPC errors with the codes the specification names") {
  Fixture f;
  std::string sid = f.Initialize();
  auto code = [&](const Json& msg) {
    return Json::parse(f.mcp.Handle(Post(msg, sid), 0).body)["error"]["code"].get<int>();
  };
  CHECK(code({{"jsonrpc", "1.0"}, {"id", 1}, {"method", "ping"}}) == -32600);
  CHECK(code({{"jsonrpc", "2.0"}, {"id", Json::array()}, {"method", "ping"}}) == -32600);
  CHECK(code(Rpc(1, "resources/list")) == -32601);
  CHECK(code(Rpc(1, "tools/call", {{"name", "unknown"}})) == -32602);
  CHECK(code(Rpc(1, "tools/call", {{"arguments", {}}})) == -32602);
  CHECK(code(Rpc(1, "tools/call", {{"name", "t1"}, {"arguments", "x"}})) == -32602);
  // A _meta that is no object would drop the key it was meant to pin.
  for (const Json& meta : {Json(), Json::array(), Json("k")}) {
    CHECK(code(Rpc(1, "tools/call",
                   {{"name", "t1"}, {"arguments", Json::object()}, {"_meta", meta}})) == -32602);
  }
  // Members of another JSON type than the specification's are errors too,
  // not a failed request: a number for jsonrpc, for protocolVersion.
  CHECK(code({{"jsonrpc", 2}, {"id", 1}, {"method", "ping"}}) == -32600);
  // Neither a request nor a response: invalid. A response is dropped (202).
  CHECK(code({{"jsonrpc", "2.0"}, {"id", 8}}) == -32600);
  CHECK(f.mcp.Handle(Post({{"jsonrpc", "2.0"}, {"id", 8}, {"result", Json::object()}}, sid), 0)
            .status == 202);
  for (const Json& version : {Json(5), Json(true), Json::object(), Json::array({"x"})}) {
    CAPTURE(version);
    McpHttpResponse r = f.mcp.Handle(Post(Rpc(7, "initialize", {{"protocolVersion", version}})), 0);
    CHECK(Json::parse(r.body)["error"]["code"] == -32602);
    CHECK(SessionOf(r).empty());
  }
}

TEST_CASE("Accept decides between JSON and one SSE event, and must name one of them") {
  Fixture f;
  std::string sid = f.Initialize();
  McpHttpRequest r = Post(Rpc(2, "ping"), sid);
  r.accept = "text/event-stream";
  McpHttpResponse sse = f.mcp.Handle(r, 0);
  CHECK(sse.content_type == "text/event-stream");
  CHECK(sse.body.rfind("event: message\ndata: {", 0) == 0);
  CHECK(sse.body.substr(sse.body.size() - 2) == "\n\n");
  r.accept = "text/html";
  CHECK(f.mcp.Handle(r, 0).status == 406);
  // Weights and ranges as RFC 9110 12.5.1 reads them, not substrings.
  r.accept = "application/json;q=0, text/event-stream";
  CHECK(f.mcp.Handle(r, 0).content_type == "text/event-stream");
  r.accept = "application/json-patch+json";
  CHECK(f.mcp.Handle(r, 0).status == 406);
  r.accept = "*/*;q=0";
  CHECK(f.mcp.Handle(r, 0).status == 406);
  r.accept = "Application/JSON; Q=0.5";
  CHECK(f.mcp.Handle(r, 0).content_type == "application/json");
  r.accept = "application/json;q=0, */*";  // the more specific range says no to JSON
  CHECK(f.mcp.Handle(r, 0).content_type == "text/event-stream");
  r.accept = "application/*";
  CHECK(f.mcp.Handle(r, 0).content_type == "application/json");
}

}  // namespace idem
