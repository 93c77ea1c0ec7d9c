// Trace context and the access log (issue 11): a caller's traceparent
// reaches the model provider and the effector with X-Request-Id, every
// record under it is one GET /v1/traces/{id} away, and every request leaves
// one JSON access-log line without a secret in it.
#include "daemon/obs/trace.h"

#include <doctest/doctest.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "daemon/core/crypto.h"
#include "tests/fakes/fake_effector.h"
#include "tests/fakes/fake_provider.h"
#include "tests/integration/harness.h"

namespace idem::testing {
namespace {

using fakes::FakeEffectorServer;
using fakes::FakeProviderServer;
using fakes::FakeReply;

const char* kAgent = "agent-trace-secret";
const char* kOperator = "op-trace-secret";
const char* kApiKey = "sk-provider-trace-secret";
const char* kTrace = "4bf92f3577b34da6a3ce929d0e0e4736";
const char* kCallerSpan = "00f067aa0ba902b7";

struct Fixture {
  std::unique_ptr<FakeProviderServer> model = FakeProviderServer::Start();
  std::unique_ptr<FakeEffectorServer> target = FakeEffectorServer::Start();
  TempDir dir;
  std::unique_ptr<DaemonProcess> daemon;
  std::unique_ptr<httplib::Client> client;

  explicit Fixture(const std::string& log_yaml = "") {
    REQUIRE(model != nullptr);
    REQUIRE(target != nullptr);
    const std::string src = IDEM_SOURCE_DIR;
    auto token = [](const char* name, const char* secret, const char* roles) {
      return std::string("    - {name: ") + name + ", sha256: " + Sha256Hex(secret) + ", roles: [" +
             roles + "]}\n";
    };
    std::string config =
        "server:\n  listen: 127.0.0.1:0\n  threads: 8\n"
        "store:\n  engine: rocksdb\n  path: " +
        dir.path() +
        "/data\n"
        "providers:\n"
        "  fake:\n"
        "    type: openai_compatible\n"
        "    base_url: " +
        model->base_url() +
        "/v1\n"
        "    api_key_env: IDEM_TEST_TRACE_KEY\n"
        "steps:\n"
        "  triage_ticket:\n"
        "    provider: fake\n"
        "    model: m-1\n"
        "    prompt:\n"
        "      template: " +
        src +
        "/config/prompts/triage_ticket.mustache\n"
        "      version: v1\n"
        "    output_schema: " +
        src +
        "/schemas/examples/triage_ticket.v1.json\n"
        "    attempts: 1\n"
        "    plan: {pointer: /actions}\n"
        "actions:\n"
        "  send_reply:\n"
        "    identity: {fields: [/ticket_id, /text], version: v1}\n"
        "    window: 24h\n"
        "    on_duplicate: return_original\n"
        "    effector: {http: {method: POST, url: \"" +
        target->base_url() +
        "/records\", idempotency: header}}\n"
        "    approval: {require: always, reason: replies are read first}\n"
        "  ship:\n"
        "    identity: {fields: [/parcel], version: v1}\n"
        "    window: forever\n"
        "    on_duplicate: return_original\n"
        "auth:\n  tokens:\n" +
        token("agent-1", kAgent, "agent") + token("op-1", kOperator, "operator") + log_yaml;
    std::string path = dir.File("idem.yaml", config);
    std::string err;
    daemon = DaemonProcess::Start(
        {path, dir.path() + "/data", {}, {{"IDEM_TEST_TRACE_KEY", kApiKey}}}, &err);
    REQUIRE_MESSAGE(daemon != nullptr, err);
    client = daemon->Client();
  }

  httplib::Result Post(const std::string& path, const Json& body, const char* token,
                       httplib::Headers extra = {}) {
    extra.emplace("Authorization", std::string("Bearer ") + token);
    return client->Post(path.c_str(), extra, body.dump(), "application/json");
  }
  httplib::Result Get(const std::string& path, const char* token = kOperator) {
    return client->Get(path.c_str(), {{"Authorization", std::string("Bearer ") + token}});
  }

  // The daemon's log lines: stderr, one JSON object a line (the file also
  // holds stdout, where `idem serve` prints its human greeting).
  std::vector<Json> LogLines() const {
    std::ifstream in(daemon->log_path());
    std::vector<Json> out;
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] != '{') continue;
      Json j = Json::parse(line, nullptr, false);
      INFO(line);
      CHECK_FALSE(j.is_discarded());
      if (!j.is_discarded()) out.push_back(std::move(j));
    }
    return out;
  }
  std::string LogText() const {
    std::ifstream in(daemon->log_path());
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
};

Json J(const httplib::Result& r) {
  REQUIRE(r);
  return Json::parse(r->body);
}

const char* kReply =
    R"({"category":"refund","priority":"high","summary":"s","actions":[{"kind":"send_reply","args":{"ticket_id":"T-1","text":"refund on its way"}}]})";

// The trace id of a traceparent value, "" when it is not one.
std::string TraceOf(const std::string& traceparent) {
  auto p = ParseTraceparent(traceparent);
  return p ? p->trace_id : "";
}

}  // namespace

TEST_CASE("traceparent_and_request_id_reach_provider_and_effector_and_the_trace_has_the_chain") {
  Fixture f;
  f.model->Enqueue(FakeReply::Output(Json::parse(kReply)));
  const std::string traceparent = std::string("00-") + kTrace + "-" + kCallerSpan + "-01";
  auto d =
      f.Post("/v1/decide", {{"step", "triage_ticket"}, {"input", {{"ticket_id", "T-1"}}}}, kAgent,
             {{"traceparent", traceparent},
              {"tracestate", "vendor=abc"},
              {"X-Request-Id", "req-decide-1"}});
  REQUIRE(d);
  REQUIRE_MESSAGE(d->status == 200, d->body);
  CHECK(TraceOf(d->get_header_value("traceresponse")) == kTrace);
  Json plan = J(d)["plan"];
  REQUIRE(plan["state"] == "awaiting_approval");
  const std::string plan_id = plan["plan_id"];
  const std::string decision_id = J(d)["decision_id"];

  // The provider call: the caller's trace, a span of idem's, the request id.
  REQUIRE(f.model->calls() == 1);
  fakes::RecordedRequest call = f.model->last_request();
  auto sent = ParseTraceparent(call.Header("traceparent"));
  REQUIRE(sent.has_value());
  CHECK(sent->trace_id == kTrace);
  CHECK(sent->parent_id != kCallerSpan);
  CHECK(sent->flags == 1);
  CHECK(call.Header("tracestate") == "vendor=abc");
  CHECK(call.Header("x-request-id") == "req-decide-1");

  // An operator approves in a request of their own (a trace of its own);
  // the plan's work still belongs to the decide's trace.
  auto a = f.Post("/v1/plans/" + plan_id + "/approve", {{"comment", "ok"}}, kOperator,
                  {{"X-Request-Id", "req-approve-1"}});
  REQUIRE(a);
  REQUIRE_MESSAGE(a->status == 200, a->body);
  CHECK(TraceOf(a->get_header_value("traceresponse")) != kTrace);
  std::vector<fakes::FakeEffectorCall> effects;
  for (const auto& c : f.target->calls()) {
    if (c.method == "POST") effects.push_back(c);
  }
  REQUIRE(effects.size() == 1);
  CHECK(TraceOf(effects[0].headers["traceparent"]) == kTrace);
  CHECK(effects[0].headers["tracestate"].empty());  // the approval's request carried none
  CHECK(effects[0].headers["x-request-id"] == "req-approve-1");

  // The decision and the plan carry the trace id.
  CHECK(J(f.Get("/v1/decisions/" + decision_id))["trace_id"] == kTrace);

  auto t = f.Get(std::string("/v1/traces/") + kTrace);
  REQUIRE(t);
  REQUIRE_MESSAGE(t->status == 200, t->body);
  Json events = J(t)["events"];
  std::vector<std::string> types;
  int64_t last_at = 0;
  for (const Json& e : events) {
    types.push_back(e["type"]);
    CHECK(e["at_ms"].get<int64_t>() >= last_at);
    last_at = e["at_ms"];
  }
  auto pos = [&](const std::string& type) {
    for (size_t i = 0; i < types.size(); ++i) {
      if (types[i] == type) return static_cast<int>(i);
    }
    return -1;
  };
  INFO(events.dump(1));
  REQUIRE(pos("decision") >= 0);
  REQUIRE(pos("plan") >= 0);
  REQUIRE(pos("approval") >= 0);
  REQUIRE(pos("work") >= 0);
  REQUIRE(pos("attempt") >= 0);
  CHECK(pos("decision") < pos("plan"));
  CHECK(pos("plan") < pos("approval"));
  CHECK(pos("approval") < pos("work"));
  CHECK(pos("work") < pos("attempt"));
  // The decide request is there (the approval request is in its own trace).
  bool decide_request = false;
  for (const Json& e : events) {
    if (e["type"] == "request" && e["ref"] == "req-decide-1") {
      decide_request = e["detail"]["route"] == "/v1/decide" && e["detail"]["status"] == 200;
    }
    if (e["type"] == "decision") CHECK(e["ref"] == decision_id);
    if (e["type"] == "approval") CHECK(e["detail"]["actor"] == "op-1");
    if (e["type"] == "work") {
      CHECK(e["record"]["state"] == "done");
      CHECK(e["record"]["trace_id"] == kTrace);
    }
    if (e["type"] == "attempt") {
      CHECK(e["detail"]["attempt"] == 1);
      CHECK(e["detail"]["ok"] == true);
    }
  }
  CHECK(decide_request);
  CHECK(pos("request") < pos("decision"));

  // The audit record of the approval names the trace it happened in.
  Json audit = J(f.Get("/v1/audit"));
  bool approved_audit = false;
  for (const Json& e : audit["items"]) {
    if (e["action"] == "plan.approved") {
      approved_audit = true;
      CHECK(e["detail"]["trace_id"].get<std::string>().size() == 32);
    }
  }
  CHECK(approved_audit);
}

TEST_CASE("an_invalid_traceparent_starts_a_new_trace_instead_of_failing_the_request") {
  Fixture f;
  auto c = f.Post("/v1/work/claim", {{"kind", "ship"}, {"identity", {{"parcel", "P-1"}}}}, kAgent,
                  {{"traceparent", "00-00000000000000000000000000000000-00f067aa0ba902b7-01"},
                   {"tracestate", "vendor=abc"}});
  REQUIRE(c);
  CHECK(c->status == 201);
  std::string trace = TraceOf(c->get_header_value("traceresponse"));
  CHECK(ValidTraceId(trace));
  auto t = f.Get("/v1/traces/" + trace);
  REQUIRE(t);
  CHECK(t->status == 200);
  CHECK(f.Get("/v1/traces/not-a-trace")->status == 400);
  CHECK(f.Get(std::string("/v1/traces/") + kTrace)->status == 404);

  // Two valid traceparents name no one parent: neither trace is joined.
  const std::string other = "4bf92f3577b34da6a3ce929d0e0e4737";
  auto twice =
      f.Post("/v1/work/claim", {{"kind", "ship"}, {"identity", {{"parcel", "P-2"}}}}, kAgent,
             {{"traceparent", std::string("00-") + kTrace + "-00f067aa0ba902b7-01"},
              {"traceparent", "00-" + other + "-00f067aa0ba902b7-01"}});
  REQUIRE(twice);
  CHECK(twice->status == 201);
  const std::string fresh = TraceOf(twice->get_header_value("traceresponse"));
  CHECK(ValidTraceId(fresh));
  CHECK(fresh != kTrace);
  CHECK(fresh != other);
}

TEST_CASE("every_request_leaves_one_json_access_line_without_secrets") {
  Fixture f;
  f.model->Enqueue(FakeReply::Output(Json::parse(kReply)));
  const std::string traceparent = std::string("00-") + kTrace + "-" + kCallerSpan + "-01";
  auto d = f.Post("/v1/decide", {{"step", "triage_ticket"}, {"input", {{"ticket_id", "T-1"}}}},
                  kAgent, {{"traceparent", traceparent}, {"X-Request-Id", "req-log-1"}});
  REQUIRE(d);
  REQUIRE(d->status == 200);
  // A long poll (parked, no handler thread) is logged when it is answered.
  const std::string plan_id = J(d)["plan"]["plan_id"];
  auto waited = f.client->Get(
      ("/v1/plans/" + plan_id + "?wait=1s").c_str(),
      {{"Authorization", std::string("Bearer ") + kAgent}, {"X-Request-Id", "req-wait-1"}});
  REQUIRE(waited);
  CHECK(waited->status == 200);
  // Through the batch lane (no Idempotency-Key) and through the handler.
  Json claim = {{"kind", "ship"}, {"identity", {{"parcel", "P-9"}}}};
  auto lane = f.Post("/v1/work/claim", claim, kAgent, {{"X-Request-Id", "req-lane-1"}});
  REQUIRE(lane);
  CHECK(lane->status == 201);
  Json other = {{"kind", "ship"}, {"identity", {{"parcel", "P-10"}}}};
  auto keyed = f.Post("/v1/work/claim", other, kAgent,
                      {{"X-Request-Id", "req-keyed-1"}, {"Idempotency-Key", "\"k-1\""}});
  REQUIRE(keyed);
  CHECK(keyed->status == 201);
  auto replayed = f.Post("/v1/work/claim", other, kAgent,
                         {{"X-Request-Id", "req-keyed-2"}, {"Idempotency-Key", "\"k-1\""}});
  REQUIRE(replayed);
  CHECK(replayed->get_header_value("Idempotent-Replayed") == "true");
  // A failing decide logs a warning line of its own: it carries the ids.
  f.model->Enqueue(FakeReply::HttpError(401, "invalid api key {key}"));
  const std::string failing_trace = "0af7651916cd43dd8448eb211c80319c";
  auto failed =
      f.Post("/v1/decide", {{"step", "triage_ticket"}, {"input", {{"ticket_id", "T-2"}}}}, kAgent,
             {{"traceparent", "00-" + failing_trace + "-b7ad6b7169203331-01"},
              {"X-Request-Id", "req-fail-1"}});
  REQUIRE(failed);
  CHECK(failed->status >= 400);
  auto refused = f.Get("/v1/audit", "wrong-token");
  REQUIRE(refused);
  CHECK(refused->status == 401);
  auto unknown = f.client->Get("/v1/nothing-here");
  REQUIRE(unknown);
  CHECK(unknown->status == 404);
  f.daemon->Stop();  // every line flushed

  std::map<std::string, Json> access;  // request_id -> line
  int access_lines = 0;
  bool failure_line = false;
  for (const Json& line : f.LogLines()) {
    if (line.value("event", "") == "decide_failed") {
      failure_line = true;
      CHECK(line["request_id"] == "req-fail-1");
      CHECK(line["trace_id"] == failing_trace);
    }
    if (line.value("event", "") != "access") continue;
    ++access_lines;
    for (const char* field : {"ts_ms", "level", "method", "route", "status", "duration_ms",
                              "request_id", "trace_id", "caller", "idempotency"}) {
      INFO(line.dump(), " lacks ", field);
      CHECK(line.contains(field));
    }
    access[line.value("request_id", "")] = line;
  }
  CHECK(failure_line);
  CHECK(access_lines >= 7);
  Json decide = access["req-log-1"];
  CHECK(decide["method"] == "POST");
  CHECK(decide["route"] == "/v1/decide");
  CHECK(decide["status"] == 200);
  CHECK(decide["trace_id"] == kTrace);
  CHECK(decide["caller"] == "agent-1");
  CHECK(decide["idempotency"] == "none");
  CHECK(decide["level"] == "info");
  CHECK(decide["duration_ms"].is_number());
  CHECK(access["req-wait-1"]["route"] == "/v1/plans/{id}");
  CHECK(access["req-wait-1"]["status"] == 200);
  CHECK(access["req-wait-1"]["trace_id"].get<std::string>().size() == 32);
  CHECK(access["req-wait-1"]["duration_ms"].get<double>() >= 900);
  CHECK(access["req-lane-1"]["route"] == "/v1/work/claim");
  CHECK(access["req-lane-1"]["lane"] == "batch");
  CHECK(access["req-lane-1"]["status"] == 201);
  CHECK(access["req-keyed-1"]["idempotency"] == "new");
  CHECK(access["req-keyed-2"]["idempotency"] == "replayed");
  bool unauthenticated = false, unmatched = false;
  for (const auto& [rid, line] : access) {
    if (line["route"] == "/v1/audit" && line["status"] == 401) unauthenticated = true;
    if (line["route"] == "" && line["status"] == 404) unmatched = true;
  }
  CHECK(unauthenticated);
  CHECK(unmatched);

  // No secret anywhere in the log: tokens, the provider's key, the header.
  std::string text = f.LogText();
  CHECK(text.find(kAgent) == std::string::npos);
  CHECK(text.find(kOperator) == std::string::npos);
  CHECK(text.find("wrong-token") == std::string::npos);
  CHECK(text.find(kApiKey) == std::string::npos);
  CHECK(text.find("Bearer") == std::string::npos);
}

TEST_CASE("log_access_false_drops_the_access_lines_and_keeps_the_rest") {
  Fixture f("log:\n  access: false\n");
  auto c = f.Post("/v1/work/claim", {{"kind", "ship"}, {"identity", {{"parcel", "P-2"}}}}, kAgent);
  REQUIRE(c);
  CHECK(c->status == 201);
  f.daemon->Stop();
  bool started = false;
  for (const Json& line : f.LogLines()) {
    CHECK(line.value("event", "") != "access");
    started = started || line.value("event", "") == "started";
  }
  CHECK(started);  // info lines other than access are still written
}

TEST_CASE("log_level_warn_drops_info_lines_the_access_log_included") {
  Fixture f("log:\n  level: warn\n");
  auto c = f.Post("/v1/work/claim", {{"kind", "ship"}, {"identity", {{"parcel", "P-2"}}}}, kAgent);
  REQUIRE(c);
  CHECK(c->status == 201);
  f.daemon->Stop();
  for (const Json& line : f.LogLines()) {
    CHECK(line.value("level", "") != "info");
    CHECK(line.value("event", "") != "access");
  }
}

}  // namespace idem::testing
