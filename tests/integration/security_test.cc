// The doors a web page in the user's browser, a typo in the config or a
// second cron run could walk through, tried against the real daemon.
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <set>

#include "daemon/core/crypto.h"
#include "tests/integration/harness.h"

namespace idem::testing {
namespace {

const char* kRules = R"(default:
  output: '{"category":"question","priority":"normal","summary":"q {{input.ticket_id}}","actions":[]}'
)";

const std::string kBodyA = R"({"step":"triage_ticket","input":{"ticket_id":1,"text":"a"}})";
const std::string kBodyB = R"({"step":"triage_ticket","input":{"ticket_id":2,"text":"b"}})";

// One token per role; the YAML lists their sha256 as the config wants.
const char* kAgent = "agent-secret";
const char* kOperator = "operator-secret";
const char* kAdmin = "admin-secret";

std::string Tokens() {
  auto token = [](const char* name, const char* secret, const char* roles) {
    return std::string("    - {name: ") + name + ", sha256: " + Sha256Hex(secret) + ", roles: [" +
           roles + "]}\n";
  };
  return "auth:\n  tokens:\n" + token("agent", kAgent, "agent") +
         token("operator", kOperator, "operator") + token("admin", kAdmin, "admin");
}

struct Fixture {
  // `server_lines` go into the server section WriteTestConfig writes.
  explicit Fixture(const std::string& extra = "", const std::string& listen = "127.0.0.1:0",
                   const std::string& server_lines = "")
      : config(WriteTestConfig(dir, kRules, extra)) {
    if (!server_lines.empty()) {
      std::ifstream in(config);
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      text.replace(text.find("server:\n"), 8, "server:\n" + server_lines);
      std::ofstream(config) << text;
    }
    std::string err;
    DaemonArgs args{config, dir.path() + "/data", {}, {}};
    args.listen = listen;
    daemon = DaemonProcess::Start(args, &err);
    REQUIRE_MESSAGE(daemon != nullptr, err);
    client = daemon->Client();
  }
  std::string HostPort(const std::string& name) const {
    return name + ":" + std::to_string(daemon->port());
  }
  TempDir dir;
  std::string config;
  std::unique_ptr<DaemonProcess> daemon;
  std::unique_ptr<httplib::Client> client;
};

Json J(const httplib::Result& r) {
  REQUIRE(r);
  return Json::parse(r->body);
}

httplib::Headers Bearer(const char* secret) {
  return {{"Authorization", std::string("Bearer ") + secret}};
}

}  // namespace

TEST_CASE("a cross-site text/plain POST is refused with 415 before anything runs") {
  Fixture f;
  // What <form enctype=text/plain> or fetch(no-cors) can send without a preflight.
  auto plain = f.client->Post("/v1/decide", kBodyA, "text/plain");
  REQUIRE(plain);
  CHECK(plain->status == 415);
  CHECK(J(plain)["pointer"] == "header:Content-Type");
  auto form = f.client->Post("/v1/work/claim", R"({"kind":"x","identity":{}})",
                             "application/x-www-form-urlencoded");
  CHECK(form->status == 415);
  CHECK(J(f.client->Get("/v1/decisions"))["items"].empty());
  auto json = f.client->Post("/v1/decide", kBodyA, "application/json; charset=utf-8");
  CHECK(json->status == 200);
}

TEST_CASE("a request from a web origin not on the allow-list is 403, body-less POSTs included") {
  Fixture f;
  httplib::Headers evil = {{"Origin", "https://evil.example"}};
  auto reconcile = f.client->Post("/v1/reconcile", evil, "", "text/plain");
  REQUIRE(reconcile);
  CHECK(reconcile->status == 403);
  CHECK(J(reconcile)["pointer"] == "header:Origin");
  CHECK(f.client->Post("/v1/decide", evil, kBodyA, "application/json")->status == 403);
  // The batch lane (claims without an Idempotency-Key) admits the same way.
  auto claim = f.client->Post("/v1/work/claim", evil,
                              R"({"kind":"send_invoice","identity":{"invoice_id":"1"}})",
                              "application/json");
  CHECK(claim->status == 403);
  CHECK(f.client->Get("/v1/decisions", evil)->status == 403);
  CHECK(f.client->Post("/v1/decide", {{"Origin", "null"}}, kBodyA, "application/json")->status ==
        403);
  CHECK(J(f.client->Get("/v1/decisions"))["items"].empty());
  // Health probes and the API description stay open.
  CHECK(f.client->Get("/healthz", evil)->status == 200);
}

TEST_CASE("an origin on server.allowed_origins is served, others still are not") {
  Fixture f("", "127.0.0.1:0", "  allowed_origins: [\"https://console.example.com\"]\n");
  auto trusted = f.client->Post("/v1/decide", {{"Origin", "https://console.example.com"}}, kBodyA,
                                "application/json");
  CHECK(trusted->status == 200);
  CHECK(f.client->Post("/v1/reconcile", {{"Origin", "https://evil.example"}}, "", "text/plain")
            ->status == 403);
}

TEST_CASE("a Host that does not name the daemon is 403: DNS rebinding is refused") {
  Fixture f;
  auto rebound = f.client->Get("/v1/decisions",
                               {{"Host", "evil.example:" + std::to_string(f.daemon->port())}});
  REQUIRE(rebound);
  CHECK(rebound->status == 403);
  CHECK(J(rebound)["pointer"] == "header:Host");
  CHECK(f.client->Post("/v1/decide", {{"Host", "evil.example"}}, kBodyA, "application/json")
            ->status == 403);
  // The names of this daemon: loopback with the port it bound (port 0 in the config).
  CHECK(f.client->Get("/v1/decisions", {{"Host", f.HostPort("localhost")}})->status == 200);
  CHECK(f.client->Get("/v1/decisions", {{"Host", f.HostPort("127.0.0.1")}})->status == 200);
  CHECK(f.client->Get("/v1/decisions", {{"Host", "127.0.0.1:1"}})->status == 403);
  CHECK(f.client->Get("/healthz", {{"Host", "evil.example"}})->status == 200);
}

TEST_CASE("a name on server.allowed_hosts is served on any port") {
  Fixture f("", "127.0.0.1:0", "  allowed_hosts: [idem.internal]\n");
  CHECK(f.client->Get("/v1/decisions", {{"Host", "idem.internal:8443"}})->status == 200);
  CHECK(f.client->Get("/v1/decisions", {{"Host", "IDEM.internal"}})->status == 200);
  CHECK(f.client->Get("/v1/decisions", {{"Host", "evil.example"}})->status == 403);
}

TEST_CASE("listening beyond loopback without tokens is a start-up error; with tokens it serves") {
  {
    TempDir dir;
    std::string config = WriteTestConfig(dir, kRules);
    DaemonArgs args{config, dir.path() + "/data", {}, {}};
    args.listen = "0.0.0.0:0";
    std::string err;
    auto refused = DaemonProcess::Start(args, &err);
    CHECK(refused == nullptr);
    CHECK(err.find("not a loopback address and auth.tokens is empty") != std::string::npos);
  }
  Fixture f(Tokens(), "0.0.0.0:0");
  CHECK(f.client->Get("/v1/decisions", Bearer(kAgent))->status == 200);
  CHECK(f.client->Get("/v1/decisions")->status == 401);
}

TEST_CASE("a --listen that is not host:port is blamed on the flag, not on a config line") {
  TempDir dir;
  std::string config = WriteTestConfig(dir, kRules);
  DaemonArgs args{config, dir.path() + "/data", {}, {}};
  args.listen = dir.path() + "/x.sock";
  std::string err;
  auto refused = DaemonProcess::Start(args, &err);
  CHECK(refused == nullptr);
  CAPTURE(err);
  CHECK(err.find("--listen: ") != std::string::npos);
  CHECK(err.find(".yaml:") == std::string::npos);
}

// The 1-based line of the first line of `path` that holds `text`, or 0.
int LineHolding(const std::string& path, const std::string& text) {
  std::ifstream in(path);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find(text) != std::string::npos) return n;
  }
  return 0;
}

// Starts a daemon on `config`, which must fail, with an error that reads
// "CONFIG:LINE: then" for the line of the config holding `on_line`.
void RefusedAt(const TempDir& dir, const std::string& config, const std::string& on_line,
               const std::string& then) {
  std::string err;
  CHECK(DaemonProcess::Start({config, dir.path() + "/data", {}, {}}, &err) == nullptr);
  const int line = LineHolding(config, on_line);
  REQUIRE(line > 0);
  CHECK_MESSAGE(err.find(config + ":" + std::to_string(line) + ": " + then) != std::string::npos,
                err);
}

TEST_CASE("a config error found by the components built from it names the file, line and key") {
  {
    // A window for a route that takes no Idempotency-Key (the server's check).
    TempDir dir;
    RefusedAt(dir,
              WriteTestConfig(dir, kRules, "idempotency:\n  routes:\n    GET /v1/decisions: 1h\n"),
              "GET /v1/decisions: 1h",
              "/idempotency/routes/GET ~1v1~1decisions: \"GET /v1/decisions\" is no route that "
              "takes an Idempotency-Key");
  }
  {
    // An effector header naming a variable that is not set (the effector's check).
    TempDir dir;
    RefusedAt(dir,
              WriteTestConfig(dir, kRules,
                              "actions:\n"
                              "  send_invoice:\n"
                              "    identity: {fields: [/invoice_id], version: v1}\n"
                              "    window: forever\n"
                              "    on_duplicate: return_original\n"
                              "    effector:\n"
                              "      http:\n"
                              "        method: POST\n"
                              "        url: http://127.0.0.1:9/invoices\n"
                              "        idempotency: header\n"
                              "        headers:\n"
                              "          Authorization: \"Bearer ${IDEM_IT_NEVER_SET}\"\n"),
              "Authorization:",
              "/actions/send_invoice/effector/http/headers/Authorization: the environment "
              "variable IDEM_IT_NEVER_SET (named in a header) is not set");
  }
  {
    // A provider whose key variable is not set (the provider's check).
    TempDir dir;
    std::string text = ReadFile(WriteTestConfig(dir, kRules));
    text.replace(text.find("providers:\n"), 11,
                 "providers:\n  llm:\n    type: openai\n    api_key_env: IDEM_IT_NEVER_SET_KEY\n");
    RefusedAt(dir, dir.File("idem.yaml", text), "api_key_env: IDEM_IT_NEVER_SET_KEY",
              "/providers/llm/api_key_env: provider 'llm' (openai): environment variable "
              "IDEM_IT_NEVER_SET_KEY is not set or empty");
  }
  {
    // An inline approval rule the JSONLogic engine cannot run (the plan engine's check).
    TempDir dir;
    RefusedAt(dir,
              WriteTestConfig(dir, kRules,
                              "actions:\n"
                              "  pay:\n"
                              "    identity: {fields: [/id], version: v1}\n"
                              "    window: 1h\n"
                              "    on_duplicate: conflict\n"
                              "    approval:\n"
                              "      when: {\">>\": [{\"var\": \"args.amount\"}, 100]}\n"),
              "when:", "/actions/pay/approval/when: the rule is not usable: ");
  }
}

TEST_CASE("serve and migrate refuse a PostgreSQL URL libpq cannot parse without printing it") {
  TempDir dir;
  const std::string config =
      OnPostgres(dir, WriteTestConfig(dir, kRules), "  url_env: IDEM_PG_URL\n");
  for (const char* url : {"postgresql://idemp:p%ssw0rd-SECRET@127.0.0.1:1/idemdb",
                          "host=127.0.0.1 port=1 DBPASSWORD999"}) {
    for (const char* command : {"serve", "migrate"}) {
      CAPTURE(url);
      CAPTURE(command);
      CliResult r = RunCli({command, "--config", config}, "", {{"IDEM_PG_URL", url}});
      CAPTURE(r.err);
      CHECK(r.exit_code != 0);
      CHECK(r.err.find("cannot connect") != std::string::npos);
      for (const char* secret : {"SECRET", "ssw0rd", "DBPASSWORD999"}) {
        CHECK(r.err.find(secret) == std::string::npos);
        CHECK(r.out.find(secret) == std::string::npos);
      }
    }
  }
}

TEST_CASE("the Bearer scheme is case-insensitive") {
  Fixture f(Tokens());
  CHECK(f.client->Get("/v1/decisions", {{"Authorization", "bearer agent-secret"}})->status == 200);
  CHECK(f.client->Get("/v1/decisions", {{"Authorization", "BEARER agent-secret"}})->status == 200);
  CHECK(f.client->Get("/v1/decisions", {{"Authorization", "Basic agent-secret"}})->status == 401);
}

TEST_CASE("a 401 names the Bearer scheme, and says so when a token was sent and is not valid") {
  Fixture f(Tokens());
  auto none = f.client->Get("/v1/decisions");
  REQUIRE(none->status == 401);
  CHECK(none->get_header_value("WWW-Authenticate") == R"(Bearer realm="idem")");
  auto wrong = f.client->Get("/v1/decisions", Bearer("not-a-token"));
  REQUIRE(wrong->status == 401);
  CHECK(wrong->get_header_value("WWW-Authenticate") ==
        R"(Bearer realm="idem", error="invalid_token")");
  // The header carries nothing of what was sent.
  CHECK(wrong->get_header_value("WWW-Authenticate").find("not-a-token") == std::string::npos);
}

TEST_CASE("two Authorization headers are refused, whichever comes first") {
  Fixture f(Tokens());
  for (auto [first, second] : {std::pair{kAgent, kAdmin}, std::pair{kAdmin, kAgent}}) {
    httplib::Headers two = {{"Authorization", std::string("Bearer ") + first},
                            {"Authorization", std::string("Bearer ") + second}};
    auto r = f.client->Get("/v1/audit/verify", two);
    REQUIRE(r);
    CHECK(r->status == 400);
    CHECK(J(r)["pointer"] == "header:Authorization");
  }
}

TEST_CASE("guessed tokens draw from one rate-limit bucket; a valid token is not slowed by them") {
  Fixture f(Tokens(), "127.0.0.1:0", "  rate_limit: {requests_per_s: 0.01, burst: 3}\n");
  for (int i = 0; i < 3; ++i) {
    CHECK(f.client->Get("/v1/decisions", Bearer(("guess-" + std::to_string(i)).c_str()))->status ==
          401);
  }
  auto limited = f.client->Get("/v1/decisions", Bearer("guess-3"));
  REQUIRE(limited);
  CHECK(limited->status == 429);
  CHECK(limited->has_header("Retry-After"));
  CHECK(f.client->Get("/v1/decisions")->status == 429);  // no token at all: the same bucket
  CHECK(f.client->Get("/v1/decisions", Bearer(kAgent))->status == 200);
}

TEST_CASE("an agent may replay a decision but only an operator may promote the replay") {
  Fixture f(Tokens());
  auto decided = f.client->Post("/v1/decide", Bearer(kAgent), kBodyA, "application/json");
  REQUIRE(decided->status == 200);
  const std::string id = J(decided)["decision_id"];
  const std::string path = "/v1/decisions/" + id + "/replay";
  auto replayed = f.client->Post(path, Bearer(kAgent), R"({"model":"demo-2"})", "application/json");
  CHECK(replayed->status == 200);
  auto promoted = f.client->Post(path, Bearer(kAgent), R"({"model":"demo-2","promote":true})",
                                 "application/json");
  REQUIRE(promoted);
  CHECK(promoted->status == 403);
  CHECK(J(promoted)["pointer"] == "/promote");
  auto by_operator = f.client->Post(path, Bearer(kOperator), R"({"model":"demo-2","promote":true})",
                                    "application/json");
  REQUIRE(by_operator);
  CHECK(by_operator->status == 200);
  CHECK(J(by_operator)["promoted"] == true);
}

TEST_CASE("every route declares its roles and a token without one of them is 403") {
  Fixture f(Tokens());
  auto doc_res = f.client->Get("/openapi.json");
  REQUIRE(doc_res->status == 200);
  Json doc = J(doc_res);
  const std::set<std::string> known = {"agent", "operator", "admin"};
  const std::vector<std::pair<std::string, const char*>> callers = {
      {"agent", kAgent}, {"operator", kOperator}, {"admin", kAdmin}};
  int checked = 0;
  // Plain names, not structured bindings: clang 14 cannot capture those.
  for (const auto& path_item : doc["paths"].items()) {
    const std::string pattern = path_item.key();
    const Json& ops = path_item.value();
    // Path parameters become "x": auth is decided before the handler looks.
    std::string path;
    for (size_t i = 0; i < pattern.size(); ++i) {
      if (pattern[i] == '{') {
        path += "x";
        i = pattern.find('}', i);
      } else {
        path += pattern[i];
      }
    }
    for (const auto& op_item : ops.items()) {
      const std::string method = op_item.key();
      const Json& op = op_item.value();
      CAPTURE(method);
      CAPTURE(pattern);
      REQUIRE(op.contains("security"));
      auto call = [&](httplib::Headers h) {
        if (method == "get") return f.client->Get(path.c_str(), h);
        if (method == "delete") return f.client->Delete(path.c_str(), h);
        return f.client->Post(path.c_str(), h, "{}", "application/json");
      };
      if (op["security"].empty()) {  // public
        CHECK(call({})->status != 401);
        continue;
      }
      std::vector<std::string> roles = op["security"][0]["bearer"];
      CHECK_MESSAGE(!roles.empty(), "a route that is not public must name its roles");
      for (const auto& r : roles) CHECK_MESSAGE(known.count(r) == 1, r);
      CHECK(call({})->status == 401);
      for (const auto& caller : callers) {
        const std::string& role = caller.first;
        const char* secret = caller.second;
        CAPTURE(role);
        bool allowed = role == "admin" || std::count(roles.begin(), roles.end(), role) > 0;
        auto res = call(Bearer(secret));
        REQUIRE(res);
        if (allowed) {
          CHECK(res->status != 401);
          CHECK(res->status != 403);
        } else {
          CHECK(res->status == 403);
          CHECK(J(res)["type"] == "urn:idem:problem:PermissionDenied");
        }
      }
      ++checked;
    }
  }
  // decide, decisions, escalations, work, actions, runs, plans, dead letters,
  // leases, reconcile and metrics: none escaped.
  CHECK(checked >= 20);
}

TEST_CASE("without auth, Idem-Caller gives each caller its own Idempotency-Key scope") {
  Fixture f;
  auto post = [&](const char* caller, const std::string& body) {
    httplib::Headers h = {{"Idempotency-Key", "\"nightly\""}};
    if (caller != nullptr) h.emplace("Idem-Caller", caller);
    return f.client->Post("/v1/decide", h, body, "application/json");
  };
  CHECK(post("billing-cron", kBodyA)->status == 200);
  auto other = post("support-bot", kBodyB);
  CHECK(other->status == 200);
  CHECK(other->get_header_value("Idempotent-Replayed") == "");
  CHECK(post("billing-cron", kBodyB)->status == 422);
  CHECK(post("support-bot", kBodyB)->get_header_value("Idempotent-Replayed") == "true");
  // Callers that do not name themselves share one scope.
  CHECK(post(nullptr, kBodyA)->status == 200);
  CHECK(post(nullptr, kBodyB)->status == 422);
  auto bad = post("has space", kBodyA);
  CHECK(bad->status == 400);
  CHECK(J(bad)["pointer"] == "header:Idem-Caller");
  // The names the daemon writes itself cannot be taken: a caller would pass
  // for the daemon (or an inbox) in the audit trail and as a resolver.
  for (const char* reserved : {"idem", "IDEM", "anonymous", "inbox:github"}) {
    CAPTURE(reserved);
    auto refused = post(reserved, kBodyA);
    CHECK(refused->status == 400);
    CHECK(J(refused)["pointer"] == "header:Idem-Caller");
  }
}

TEST_CASE("with auth the token's name scopes keys and Idem-Caller is ignored") {
  Fixture f(Tokens());
  auto post = [&](const char* caller, const std::string& body) {
    httplib::Headers h = Bearer(kAgent);
    h.emplace("Idempotency-Key", "\"k\"");
    h.emplace("Idem-Caller", caller);
    return f.client->Post("/v1/decide", h, body, "application/json");
  };
  CHECK(post("one", kBodyA)->status == 200);
  CHECK(post("two", kBodyB)->status == 422);
}

}  // namespace idem::testing
