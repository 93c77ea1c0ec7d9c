// The operator page as the daemon serves it: public files with a strict
// CSP, the step description its escalation form reads, and the same-origin
// POSTs a browser sends from it (with an Origin header) let through while
// other origins stay refused. The page's behaviour in a browser is
// tests/e2e/ui_approvals.mjs.
#include <doctest/doctest.h>

#include "daemon/core/crypto.h"
#include "tests/integration/harness.h"

namespace idem::testing {
namespace {

const char* kUiRules = R"(default:
  output: '{"category":"question","priority":"normal","summary":"q","actions":[]}'
)";
const char* kUiAgent = "ui-agent-secret";
const char* kUiOperator = "ui-operator-secret";

struct UiFixture {
  UiFixture() {
    std::string tokens = "auth:\n  tokens:\n    - {name: agent, sha256: " + Sha256Hex(kUiAgent) +
                         ", roles: [agent]}\n    - {name: op, sha256: " + Sha256Hex(kUiOperator) +
                         ", roles: [operator]}\n";
    std::string err;
    daemon = DaemonProcess::Start(
        {WriteTestConfig(dir, kUiRules, tokens), dir.path() + "/data", {}, {}}, &err);
    REQUIRE_MESSAGE(daemon != nullptr, err);
    client = daemon->Client();
  }
  std::string Self() const { return "http://127.0.0.1:" + std::to_string(daemon->port()); }
  TempDir dir;
  std::unique_ptr<DaemonProcess> daemon;
  std::unique_ptr<httplib::Client> client;
};

httplib::Headers As(const char* secret) {
  return {{"Authorization", std::string("Bearer ") + secret}};
}

}  // namespace

TEST_CASE("the operator page is served without a token, uncached, under a strict CSP") {
  UiFixture f;
  auto page = f.client->Get("/ui/");
  REQUIRE(page);
  CHECK(page->status == 200);
  CHECK(page->get_header_value("Content-Type") == "text/html; charset=utf-8");
  CHECK(page->body.find("<script src=\"app.js\"") != std::string::npos);
  CHECK(page->get_header_value("Cache-Control") == "no-store");
  CHECK(page->get_header_value("X-Content-Type-Options") == "nosniff");
  std::string csp = page->get_header_value("Content-Security-Policy");
  CHECK(csp.find("default-src 'none'") != std::string::npos);
  CHECK(csp.find("script-src 'self'") != std::string::npos);
  CHECK(csp.find("frame-ancestors 'none'") != std::string::npos);
  CHECK(csp.find("unsafe-inline") == std::string::npos);

  auto js = f.client->Get("/ui/app.js");
  CHECK(js->status == 200);
  CHECK(js->get_header_value("Content-Type") == "text/javascript; charset=utf-8");
  CHECK(js->body.find("sessionStorage") != std::string::npos);
  CHECK(f.client->Get("/ui/style.css")->get_header_value("Content-Type") ==
        "text/css; charset=utf-8");

  auto missing = f.client->Get("/ui/secrets.json");
  CHECK(missing->status == 404);
  CHECK(missing->get_header_value("Content-Type") == "application/problem+json");
  CHECK(f.client->Get("/ui/../idem.yaml")->status != 200);

  auto bare = f.client->Get("/ui");
  CHECK(bare->status == 308);
  CHECK(bare->get_header_value("Location") == "/ui/");
}

TEST_CASE("a step's output schema is readable by agents and operators, 404 for an unknown step") {
  UiFixture f;
  auto step = f.client->Get("/v1/steps/triage_ticket", As(kUiOperator));
  REQUIRE(step->status == 200);
  Json s = Json::parse(step->body);
  CHECK(s["name"] == "triage_ticket");
  CHECK(s["provider"] == "demo");
  CHECK(s["model"] == "demo-1");
  CHECK(s["output_schema"]["properties"]["priority"]["enum"].size() == 3);
  CHECK(f.client->Get("/v1/steps/triage_ticket", As(kUiAgent))->status == 200);
  CHECK(f.client->Get("/v1/steps/triage_ticket")->status == 401);
  auto unknown = f.client->Get("/v1/steps/nope", As(kUiOperator));
  CHECK(unknown->status == 404);
  CHECK(Json::parse(unknown->body)["detail"].get<std::string>().find("nope") != std::string::npos);
}

TEST_CASE("the page's same-origin POSTs pass the Origin check; another origin is refused") {
  UiFixture f;
  const std::string body = R"({"output":{"category":"question","priority":"normal",)"
                           R"("summary":"s","actions":[]}})";
  auto post = [&](const std::string& origin) {
    httplib::Headers h = As(kUiOperator);
    h.emplace("Origin", origin);
    return f.client->Post("/v1/escalations/esc_none/resolve", h, body, "application/json");
  };
  // Past the guard: the escalation does not exist.
  CHECK(post(f.Self())->status == 404);
  auto other_port = post("http://127.0.0.1:1");
  CHECK(other_port->status == 403);
  CHECK(Json::parse(other_port->body)["pointer"] == "header:Origin");
  CHECK(post("https://evil.example")->status == 403);
}

}  // namespace idem::testing
