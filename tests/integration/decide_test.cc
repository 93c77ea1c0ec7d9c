// The decide endpoint end to end: the real daemon, the scripted provider,
// the RocksDB store in a temp folder.
#include <doctest/doctest.h>

#include <atomic>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>
#include <vector>

#include "tests/integration/harness.h"

namespace idem::testing {
namespace {

const char* kRules = R"(rules:
  - match:
      input:
        /text: {contains: refund}
    delay_ms: 300
    output: '{"category":"refund","priority":"high","summary":"refund for {{input.ticket_id}}","actions":[{"kind":"send_reply","args":{"ticket_id":"{{input.ticket_id}}","text":"We are on it"}}]}'
default:
  output: '{"category":"question","priority":"normal","summary":"a question","actions":[]}'
)";

struct Fixture {
  TempDir dir;
  std::string config = WriteTestConfig(dir, kRules);
  std::unique_ptr<DaemonProcess> daemon;
  std::unique_ptr<httplib::Client> client;

  void Start(std::vector<std::string> extra = {}) {
    std::string err;
    daemon = DaemonProcess::Start({config, dir.path() + "/data", extra, {}}, &err);
    REQUIRE_MESSAGE(daemon != nullptr, err);
    client = daemon->Client();
  }
};

}  // namespace

std::string kRulesForPrompt() { return kRules; }

namespace {

Json Body(const httplib::Result& res) {
  REQUIRE(res);
  return Json::parse(res->body);
}

}  // namespace

TEST_CASE("the same decide with reordered keys and a changed volatile field is a cache hit") {
  Fixture f;
  f.Start();
  auto first = f.client->Post(
      "/v1/decide", {{"Idempotency-Key", "\"t-1\""}},
      R"({"step":"triage_ticket","input":{"ticket_id":42,"text":"refund please","received_at":"2026-11-29T10:00:00Z"}})",
      "application/json");
  REQUIRE(first->status == 200);
  Json a = Body(first);
  CHECK(a["status"] == "decided");
  CHECK(a["cache"] == "miss");
  CHECK(a["output"]["category"] == "refund");
  CHECK(MetricValue(*f.client, "idem_provider_calls_total") == 1);

  auto second = f.client->Post(
      "/v1/decide",
      R"({"input":{"received_at":"2026-11-30T00:00:00Z","text":"refund please","ticket_id":42},"step":"triage_ticket"})",
      "application/json");
  REQUIRE(second->status == 200);
  Json b = Body(second);
  CHECK(b["cache"] == "hit");
  CHECK(b["decision_id"] == a["decision_id"]);
  CHECK(b["output"] == a["output"]);
  CHECK(MetricValue(*f.client, "idem_provider_calls_total") == 1);

  auto other = f.client->Post(
      "/v1/decide", R"({"step":"triage_ticket","input":{"ticket_id":43,"text":"refund please"}})",
      "application/json");
  REQUIRE(other->status == 200);
  CHECK(Body(other)["decision_id"] != a["decision_id"]);
  CHECK(MetricValue(*f.client, "idem_provider_calls_total") == 2);

  auto stored = f.client->Get(("/v1/decisions/" + a["decision_id"].get<std::string>()).c_str());
  REQUIRE(stored->status == 200);
  Json d = Body(stored);
  CHECK(d["output"] == a["output"]);
  CHECK(d["trace"]["attempts"].size() == 1);
  CHECK_FALSE(d["material"]["input"].contains("received_at"));
}

TEST_CASE("64 concurrent identical decides make exactly one provider call and one decision") {
  Fixture f;
  f.Start();
  const std::string body =
      R"({"step":"triage_ticket","input":{"ticket_id":7,"text":"refund now"}})";
  std::atomic<int> ok{0};
  std::atomic<int> spent{0};  // answers that say they cost (the one call's)
  std::vector<std::string> ids(64);
  std::vector<std::thread> threads;
  for (int i = 0; i < 64; ++i) {
    threads.emplace_back([&, i] {
      auto c = f.daemon->Client();
      auto res = c->Post("/v1/decide", body, "application/json");
      if (res && res->status == 200) {
        const Json answer = Json::parse(res->body);
        ids[i] = answer["decision_id"];
        spent += answer.contains("cost_usd");
        ok++;
      } else if (res) {
        MESSAGE("status " << res->status << " " << res->body);
      } else {
        MESSAGE("error " << httplib::to_string(res.error()));
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(ok == 64);
  // A joined or cached answer saved the call; only the leader's spent it.
  CHECK(spent == 1);
  // Each request is a hit or a miss, never both.
  CHECK(MetricValue(*f.client, "idem_decide_cache_hits_total{step=\"triage_ticket\"}") +
            MetricValue(*f.client, "idem_decide_cache_misses_total{step=\"triage_ticket\"}") ==
        64);
  for (const auto& id : ids) CHECK(id == ids[0]);
  CHECK(MetricValue(*f.client, "idem_provider_calls_total") == 1);
  auto list = f.client->Get("/v1/decisions?step=triage_ticket");
  CHECK(Body(list)["items"].size() == 1);
}

TEST_CASE("decisions and idempotency keys survive a restart") {
  Fixture f;
  f.Start();
  const std::string body = R"({"step":"triage_ticket","input":{"ticket_id":9,"text":"hello"}})";
  auto first = f.client->Post("/v1/decide", {{"Idempotency-Key", "\"restart-1\""}}, body,
                              "application/json");
  REQUIRE(first->status == 200);
  std::string id = Body(first)["decision_id"];
  f.daemon->Kill9();
  f.Start();
  auto again = f.client->Post("/v1/decide", {{"Idempotency-Key", "\"restart-1\""}}, body,
                              "application/json");
  REQUIRE(again->status == 200);
  CHECK(again->get_header_value("Idempotent-Replayed") == "true");
  CHECK(Body(again)["decision_id"] == id);
  auto nokey = f.client->Post("/v1/decide", body, "application/json");
  CHECK(Body(nokey)["cache"] == "hit");
  CHECK(Body(nokey)["decision_id"] == id);
  CHECK(MetricValue(*f.client, "idem_provider_calls_total") == 0);
}

TEST_CASE("cache only answers 404 on a miss and refresh decides again") {
  Fixture f;
  f.Start();
  auto miss = f.client->Post(
      "/v1/decide", R"({"step":"triage_ticket","input":{"ticket_id":1,"text":"x"},"cache":"only"})",
      "application/json");
  CHECK(miss->status == 404);
  CHECK(miss->get_header_value("Content-Type") == "application/problem+json");
  CHECK(MetricValue(*f.client, "idem_provider_calls_total") == 0);
  auto first =
      f.client->Post("/v1/decide", R"({"step":"triage_ticket","input":{"ticket_id":1,"text":"x"}})",
                     "application/json");
  auto refreshed = f.client->Post(
      "/v1/decide",
      R"({"step":"triage_ticket","input":{"ticket_id":1,"text":"x"},"cache":"refresh"})",
      "application/json");
  REQUIRE(refreshed->status == 200);
  CHECK(Body(refreshed)["decision_id"] != Body(first)["decision_id"]);
  CHECK(MetricValue(*f.client, "idem_provider_calls_total") == 2);
  auto hit = f.client->Post(
      "/v1/decide", R"({"step":"triage_ticket","input":{"ticket_id":1,"text":"x"},"cache":"only"})",
      "application/json");
  CHECK(Body(hit)["decision_id"] == Body(refreshed)["decision_id"]);
  // The superseded decision stays readable by id.
  auto old =
      f.client->Get(("/v1/decisions/" + Body(first)["decision_id"].get<std::string>()).c_str());
  CHECK(old->status == 200);
}

TEST_CASE("bad requests get problem+json with a pointer and store nothing") {
  Fixture f;
  f.Start();
  struct Case {
    std::string body;
    int status;
    std::string pointer;
  };
  std::string deep = R"({"step":"triage_ticket","input":)";
  for (int i = 0; i < 200; ++i) deep += "[";
  for (int i = 0; i < 200; ++i) deep += "]";
  deep += "}";
  std::vector<Case> cases = {
      {R"({"step":"nope","input":{}})", 404, "/step"},
      {R"({"step":"triage_ticket","input":{"a":1})", 400, ""},
      {R"({"step":"triage_ticket","input":{"a":1,"a":2}})", 400, "/input/a"},
      {R"({"step":"triage_ticket"})", 400, "/input"},
      {R"({"step":"triage_ticket","input":{},"cache":"sometimes"})", 400, "/cache"},
      {R"({"step":"triage_ticket","input":{},"extra":1})", 400, ""},
      {deep, 400, ""},  // too deep: malformed, not too large (README, Limits)
  };
  for (const auto& c : cases) {
    CAPTURE(c.body.substr(0, 80));
    auto res = f.client->Post("/v1/decide", {{"Idempotency-Key", "\"bad-1\""}}, c.body,
                              "application/json");
    REQUIRE(res);
    CHECK(res->status == c.status);
    CHECK(res->get_header_value("Content-Type") == "application/problem+json");
    Json p = Json::parse(res->body);
    CHECK(p["status"] == c.status);
    CHECK(p["detail"].is_string());
    CHECK_FALSE(p["request_id"].get<std::string>().empty());
    if (!c.pointer.empty()) CHECK(p["pointer"] == c.pointer);
  }
  // What is wrong with the body as a whole points at the whole document ("").
  for (const std::string& whole :
       {std::string(R"({"step":)"), std::string(""), std::string("[1]")}) {
    CAPTURE(whole);
    auto res = f.client->Post("/v1/decide", whole, "application/json");
    REQUIRE(res);
    CHECK(res->status == 400);
    Json p = Json::parse(res->body);
    REQUIRE(p.contains("pointer"));
    CHECK(p["pointer"] == "");
  }
  // A 404 for what the path names points at its parameter.
  auto unknown =
      f.client->Post("/v1/work/nope/complete", R"({"lease_token":"t"})", "application/json");
  REQUIRE(unknown);
  CHECK(unknown->status == 404);
  CHECK(Json::parse(unknown->body)["pointer"] == "path:id");
  std::string big =
      R"({"step":"triage_ticket","input":{"t":")" + std::string(2 << 20, 'x') + "\"}}";
  auto res = f.client->Post("/v1/decide", big, "application/json");
  REQUIRE(res);
  CHECK(res->status == 413);
  CHECK(res->get_header_value("Content-Type") == "application/problem+json");
  // Nothing was stored: no decision, and the key is free for a corrected retry.
  CHECK(Body(f.client->Get("/v1/decisions"))["items"].empty());
  CHECK(MetricValue(*f.client, "idem_provider_calls_total") == 0);
  auto fixed = f.client->Post("/v1/decide", {{"Idempotency-Key", "\"bad-1\""}},
                              R"({"step":"triage_ticket","input":{"ticket_id":5,"text":"ok"}})",
                              "application/json");
  CHECK(fixed->status == 200);
  CHECK(fixed->get_header_value("Idempotent-Replayed") == "");
}

TEST_CASE("a body on /mcp that is not a JSON-RPC message gets a JSON-RPC error, not a problem") {
  Fixture f;
  f.Start();
  struct Case {
    std::string body;
    int code;
  };
  std::string deep;
  for (int i = 0; i < 200; ++i) deep += "[";
  for (int i = 0; i < 200; ++i) deep += "]";
  for (const Case& c : {Case{"this is not json", -32700}, Case{R"({"jsonrpc":"2.0",)", -32700},
                        Case{"", -32700}, Case{"42", -32600}, Case{deep, -32600}}) {
    CAPTURE(c.body.substr(0, 40));
    auto res = f.client->Post("/mcp", {{"Accept", "application/json, text/event-stream"}}, c.body,
                              "application/json");
    REQUIRE(res);
    CHECK(res->status == 400);
    CHECK(res->get_header_value("Content-Type") == "application/json");
    CHECK_FALSE(res->get_header_value("X-Request-Id").empty());
    Json rpc = Json::parse(res->body);  // MCP clients read this, as for every /mcp answer
    CHECK(rpc["jsonrpc"] == "2.0");
    CHECK(rpc["id"].is_null());
    CHECK(rpc["error"]["code"] == c.code);
    CHECK(rpc["error"]["message"].is_string());
  }
  // Other routes keep problem+json.
  auto other = f.client->Post("/v1/decide", "this is not json", "application/json");
  REQUIRE(other);
  CHECK(other->get_header_value("Content-Type") == "application/problem+json");
}

TEST_CASE("an invalid config fails start-up naming the file, the path and the reason") {
  TempDir dir;
  std::string config = WriteTestConfig(dir, kRules, "bogus_section: {a: 1}\n");
  std::string err;
  auto d = DaemonProcess::Start({config, dir.path() + "/data", {}, {}}, &err);
  CHECK(d == nullptr);
  CHECK(err.find(config) != std::string::npos);
  CHECK(err.find("bogus_section") != std::string::npos);

  TempDir dir2;
  std::string config2 = WriteTestConfig(dir2, kRules);
  std::string text;
  {
    std::ifstream in(config2);
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  text.replace(text.find("temperature: 0"), 14, "temperature: hot");
  dir2.File("idem.yaml", text);
  auto d2 = DaemonProcess::Start({config2, dir2.path() + "/data", {}, {}}, &err);
  CHECK(d2 == nullptr);
  CHECK(err.find("/steps/triage_ticket/temperature") != std::string::npos);
}

TEST_CASE("openapi documents every route with its body schemas") {
  Fixture f;
  f.Start();
  Json doc = Body(f.client->Get("/openapi.json"));
  CHECK(doc["openapi"] == "3.1.0");
  for (const char* path : {"/v1/decide", "/v1/decisions/{id}", "/v1/decisions", "/healthz",
                           "/readyz", "/metrics", "/openapi.json"}) {
    CAPTURE(path);
    CHECK(doc["paths"].contains(path));
  }
  CHECK(doc["paths"]["/v1/decide"]["post"]["requestBody"]["content"]["application/json"]["schema"]
           ["$ref"] == "#/components/schemas/decide.request");
  CHECK(doc["components"]["schemas"].contains("decide.request"));
  CHECK(doc["components"]["schemas"].contains("problem"));
  // Every status the pipeline around a handler may answer is documented.
  const Json& decide = doc["paths"]["/v1/decide"]["post"]["responses"];
  for (const char* status : {"200", "400", "401", "403", "409", "413", "415", "422", "503"}) {
    CAPTURE(status);
    CHECK(decide.contains(status));
  }
  const Json& health = doc["paths"]["/healthz"]["get"]["responses"];
  CHECK_FALSE(health.contains("401"));  // public
  CHECK(health.contains("503"));
  for (const char* path : {"/v1/plans", "/v1/plans/{id}/approve", "/mcp", "/v1/inbox/{source}",
                           "/v1/decisions/{id}/replay", "/ui/"}) {
    CAPTURE(path);
    CHECK(doc["paths"].contains(path));
  }
}

TEST_CASE("openapi documents each GET route's query parameters, and the route enforces them") {
  Fixture f;
  f.Start();
  Json doc = Body(f.client->Get("/openapi.json"));
  // The lists a client pages through all say how.
  for (const char* path :
       {"/v1/decisions", "/v1/escalations", "/v1/plans", "/v1/dead-letters", "/v1/audit",
        "/v1/events", "/v1/outbox/dead-letters", "/v1/decisions/export", "/v1/runs/{id}"}) {
    CAPTURE(path);
    bool has_limit = false;
    for (const Json& p : doc["paths"][path]["get"].value("parameters", Json::array())) {
      has_limit = has_limit || (p["in"] == "query" && p["name"] == "limit");
    }
    CHECK(has_limit);
  }
  int checked = 0;
  for (const auto& [path, ops] : doc["paths"].items()) {
    if (!ops.contains("get")) continue;
    std::string url = std::regex_replace(path, std::regex(R"(\{[a-z_]+\})"), "x");
    for (const Json& p : ops["get"].value("parameters", Json::array())) {
      if (p["in"] != "query") continue;
      const std::string name = p["name"];
      const Json& schema = p["schema"];
      const std::string where = path + "?" + name;  // clang 14: no structured binding in CAPTURE
      CAPTURE(where);
      auto get = [&](const std::string& value) {
        return f.client->Get((url + "?" + name + "=" + value).c_str());
      };
      if (schema.contains("maximum")) {  // a bound the route must hold, not more, not less
        const int64_t max = schema["maximum"];
        CHECK(get(std::to_string(max))->status != 400);
        auto past = get(std::to_string(max + 1));
        CHECK(past->status == 400);
        CHECK(Body(past)["pointer"] == "query:" + name);
        ++checked;
      }
      if (schema.contains("enum")) {  // every listed value taken, another refused
        for (const Json& v : schema["enum"]) CHECK(get(v.get<std::string>())->status != 400);
        auto other = get("not-a-value");
        CHECK(other->status == 400);
        CHECK(Body(other)["pointer"] == "query:" + name);
        ++checked;
      }
    }
  }
  CHECK(checked >= 13);
}

TEST_CASE("a request id is accepted, echoed and generated when absent") {
  Fixture f;
  f.Start();
  auto res = f.client->Get("/healthz", {{"X-Request-Id", "abc-123"}});
  CHECK(res->get_header_value("X-Request-Id") == "abc-123");
  auto gen = f.client->Get("/healthz");
  CHECK(gen->get_header_value("X-Request-Id").size() == 16);
  auto bad = f.client->Get("/healthz", {{"X-Request-Id", "has spaces and \"quotes\""}});
  CHECK(bad->get_header_value("X-Request-Id") != "has spaces and \"quotes\"");
}

}  // namespace idem::testing

namespace idem::testing {

TEST_CASE("a prompt whose text changed under the same version is refused at start-up") {
  TempDir dir;
  std::string tmpl = dir.File("prompt.mustache", "Triage: {{{input.text}}}");
  std::string config = WriteTestConfig(dir, kRulesForPrompt());
  {
    std::ifstream in(config);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    size_t at = text.find("template: ");
    text.replace(at, text.find('\n', at) - at, "template: " + tmpl);
    dir.File("idem.yaml", text);
  }
  std::string err;
  auto first = DaemonProcess::Start({config, dir.path() + "/data", {}, {}}, &err);
  REQUIRE_MESSAGE(first != nullptr, err);
  first->Stop();

  dir.File("prompt.mustache", "Triage politely: {{{input.text}}}");
  auto refused = DaemonProcess::Start({config, dir.path() + "/data", {}, {}}, &err);
  CHECK(refused == nullptr);
  CHECK(err.find("changed while its version stayed v1") != std::string::npos);

  auto allowed =
      DaemonProcess::Start({config, dir.path() + "/data", {"--allow-prompt-change"}, {}}, &err);
  CHECK_MESSAGE(allowed != nullptr, err);
}

TEST_CASE("an output schema that OpenAI's strict mode would refuse fails start-up with the fix") {
  TempDir dir;
  std::string schema =
      dir.File("loose.json", R"({"type":"object","properties":{"category":{"type":"string"}}})");
  std::string config = WriteTestConfig(dir, kRulesForPrompt(),
                                       "  strict_step:\n"
                                       "    provider: gpt\n"
                                       "    model: gpt-4o-mini\n"
                                       "    prompt: {template: " +
                                           std::string(IDEM_SOURCE_DIR) +
                                           "/config/prompts/triage_ticket.mustache, version: v1}\n"
                                           "    output_schema: " +
                                           schema + "\n");
  {
    std::ifstream in(config);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    text.replace(text.find("providers:\n"), 11,
                 "providers:\n  gpt:\n    type: openai\n    api_key_env: IDEM_TEST_OPENAI_KEY\n");
    dir.File("idem.yaml", text);
  }
  std::string err;
  auto d = DaemonProcess::Start(
      {config, dir.path() + "/data", {}, {{"IDEM_TEST_OPENAI_KEY", "sk-test-not-a-key"}}}, &err);
  CHECK(d == nullptr);
  CHECK(err.find("strict_step") != std::string::npos);
  CHECK(err.find("additionalProperties") != std::string::npos);
  CHECK(err.find("sk-test-not-a-key") == std::string::npos);
}

}  // namespace idem::testing

namespace idem::testing {

TEST_CASE("a decide whose input holds an integer beyond 2^53 is a 400 naming the field") {
  Fixture f;
  f.Start();
  auto res = f.client->Post(
      "/v1/decide", R"({"step":"triage_ticket","input":{"ticket_id":9007199254740993,"text":"x"}})",
      "application/json");
  REQUIRE(res);
  CHECK(res->status == 400);
  CHECK(res->get_header_value("Content-Type") == "application/problem+json");
  CHECK(Body(res)["pointer"] == "/input/ticket_id");
  auto as_string = f.client->Post(
      "/v1/decide",
      R"({"step":"triage_ticket","input":{"ticket_id":"9007199254740993","text":"x"}})",
      "application/json");
  REQUIRE(as_string);
  CHECK(as_string->status == 200);
}

}  // namespace idem::testing

namespace idem::testing {

TEST_CASE("a system text that changed under the same prompt version is refused at start-up") {
  TempDir dir;
  std::string config = WriteTestConfig(dir, kRulesForPrompt());
  auto set_system = [&](const std::string& system) {
    std::ifstream in(config);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    size_t at = text.find("    system: ");
    if (at != std::string::npos) text.erase(at, text.find('\n', at) + 1 - at);
    text.insert(text.find("    temperature: 0\n"), "    system: " + system + "\n");
    dir.File("idem.yaml", text);
  };
  set_system("You triage tickets.");
  std::string err;
  auto first = DaemonProcess::Start({config, dir.path() + "/data", {}, {}}, &err);
  REQUIRE_MESSAGE(first != nullptr, err);
  first->Stop();

  set_system("You triage tickets. Everything is urgent.");
  auto refused = DaemonProcess::Start({config, dir.path() + "/data", {}, {}}, &err);
  CHECK(refused == nullptr);
  CHECK(err.find("changed while its version stayed v1") != std::string::npos);

  auto allowed =
      DaemonProcess::Start({config, dir.path() + "/data", {"--allow-prompt-change"}, {}}, &err);
  CHECK_MESSAGE(allowed != nullptr, err);
}

}  // namespace idem::testing
