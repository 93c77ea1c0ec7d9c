// Every route of the daemon's route table, walked from /openapi.json (which
// is generated from that table, so a new route is walked the day it is
// added): with auth.tokens configured, no token is 401 and a token without
// one of the route's roles is 403, both as problem+json, and a token that
// holds one of the roles gets past auth.
#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "daemon/core/crypto.h"
#include "tests/integration/harness.h"

namespace idem::testing {
namespace {

// One token per role; the YAML lists their sha256 as the config wants.
const std::vector<std::pair<std::string, std::string>> kRoleSecrets = {
    {"agent", "walk-agent-secret"}, {"operator", "walk-operator-secret"}};
const char* kAdminSecret = "walk-admin-secret";

std::string Tokens() {
  std::string yaml = "auth:\n  tokens:\n";
  auto add = [&](const std::string& role, const std::string& secret) {
    yaml +=
        "    - {name: " + role + ", sha256: " + Sha256Hex(secret) + ", roles: [" + role + "]}\n";
  };
  for (const auto& [role, secret] : kRoleSecrets) add(role, secret);
  add("admin", kAdminSecret);
  return yaml;
}

// The pattern with every "{param}" replaced by a plausible value.
std::string Concrete(const std::string& pattern) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '{') {
      out += pattern[i];
      continue;
    }
    const size_t end = pattern.find('}', i);
    out += "p1";
    i = end;
  }
  return out;
}

httplib::Result Send(httplib::Client& c, const std::string& method, const std::string& path,
                     const httplib::Headers& headers) {
  if (method == "GET") return c.Get(path, headers);
  if (method == "DELETE") return c.Delete(path, headers, "{}", "application/json");
  return c.Post(path, headers, "{}", "application/json");
}

void CheckProblem(const httplib::Result& r, int status, const std::string& what) {
  INFO(what);
  REQUIRE(r);
  CHECK(r->status == status);
  CHECK(r->get_header_value("Content-Type").find("application/problem+json") == 0);
  Json body = Json::parse(r->body, nullptr, false);
  REQUIRE(body.is_object());
  CHECK(body["status"] == status);
}

struct Operation {
  std::string method;  // upper case
  std::string pattern;
  bool is_public = false;
  std::vector<std::string> roles;  // empty: any token
};

std::vector<Operation> Operations(const Json& openapi) {
  std::vector<Operation> out;
  for (const auto& [pattern, item] : openapi["paths"].items()) {
    for (const auto& [method, op] : item.items()) {
      Operation o;
      o.method = method;
      std::transform(o.method.begin(), o.method.end(), o.method.begin(), ::toupper);
      o.pattern = pattern;
      const Json& security = op.at("security");
      o.is_public = security.empty();
      if (!o.is_public) o.roles = security.at(0).at("bearer").get<std::vector<std::string>>();
      out.push_back(std::move(o));
    }
  }
  return out;
}

// A daemon with the tokens above, and its routes as /openapi.json lists them.
struct Walk {
  TempDir dir;
  std::unique_ptr<DaemonProcess> daemon;
  std::unique_ptr<httplib::Client> client;
  std::vector<Operation> ops;
};

std::unique_ptr<Walk> StartWalk() {
  auto walk = std::make_unique<Walk>();
  const std::string config = WriteTestConfig(walk->dir, kQuestionRules, Tokens());
  std::string err;
  walk->daemon = DaemonProcess::Start({config, walk->dir.path() + "/data", {}, {}}, &err);
  REQUIRE_MESSAGE(walk->daemon != nullptr, err);
  walk->client = walk->daemon->Client();
  walk->client->set_read_timeout(3, 0);  // a route that streams (SSE) counts as past auth
  auto doc = walk->client->Get("/openapi.json");
  REQUIRE(doc);
  REQUIRE(doc->status == 200);
  walk->ops = Operations(Json::parse(doc->body));
  return walk;
}

}  // namespace

TEST_CASE("every route refuses no token with 401 and a token without its role with 403") {
  std::unique_ptr<Walk> walk = StartWalk();
  httplib::Client* c = walk->client.get();
  const std::vector<Operation>& ops = walk->ops;

  // The operator routes of the last session are in the walk, operator only.
  const std::set<std::string> operator_only = {
      "GET /v1/events",
      "GET /v1/outbox/dead-letters",
      "POST /v1/outbox/dead-letters/{subscriber}/{seq}/replay",
      "GET /v1/traces/{trace_id}",
      "GET /v1/decisions/export",
      "POST /v1/decisions/import",
      "GET /v1/stats/cost",
      "POST /v1/replays",
      "GET /v1/replays/{id}"};
  std::set<std::string> seen;
  for (const Operation& o : ops) {
    const std::string name = o.method + " " + o.pattern;
    if (operator_only.contains(name)) {
      seen.insert(name);
      CHECK_MESSAGE(o.roles == std::vector<std::string>{"operator"}, name);
    }
  }
  CHECK(seen == operator_only);

  // What may be called without a token: probes, the API description, the
  // page's shell and webhook receivers that check their own signature. A
  // route that turns public by mistake fails here.
  std::set<std::string> open;
  for (const Operation& o : ops) {
    if (o.is_public) open.insert(o.method + " " + o.pattern);
  }
  INFO("public routes: ", Json(open).dump());
  for (const std::string& name : open) {
    const bool expected = name == "GET /healthz" || name == "GET /readyz" ||
                          name == "GET /openapi.json" || name.starts_with("GET /ui") ||
                          name == "GET /" || name.starts_with("POST /v1/inbox/");
    CHECK_MESSAGE(expected, name);
  }

  int refused_403 = 0;
  for (const Operation& o : ops) {
    if (o.is_public) continue;
    const std::string path = Concrete(o.pattern);
    const std::string name = o.method + " " + o.pattern;
    CheckProblem(Send(*c, o.method, path, {}), 401, name + " without a token");
    CheckProblem(Send(*c, o.method, path, {{"Authorization", "Bearer not-a-configured-token"}}),
                 401, name + " with an unknown token");
    for (const auto& token : kRoleSecrets) {
      const std::string& role = token.first;  // not a structured binding: INFO captures it
      const std::string& secret = token.second;
      const bool holds =
          o.roles.empty() || std::find(o.roles.begin(), o.roles.end(), role) != o.roles.end();
      auto r = Send(*c, o.method, path, {{"Authorization", "Bearer " + secret}});
      if (!holds) {
        CheckProblem(r, 403, name + " with the " + role + " token");
        ++refused_403;
      } else if (r) {
        INFO(name, " with the ", role, " token: ", r->body);
        CHECK(r->status != 401);
        CHECK(r->status != 403);
      }
    }
    auto admin =
        Send(*c, o.method, path, {{"Authorization", std::string("Bearer ") + kAdminSecret}});
    if (admin) {
      INFO(name, " with the admin token: ", admin->body);
      CHECK(admin->status != 401);
      CHECK(admin->status != 403);
    }
  }
  // Not vacuous: the operator-only routes above alone refuse the agent.
  CHECK(refused_403 >= static_cast<int>(operator_only.size()));
}

TEST_CASE("a HEAD takes its GET route's roles and answer, without the body") {
  std::unique_ptr<Walk> walk = StartWalk();
  httplib::Client* c = walk->client.get();
  const httplib::Headers admin = {{"Authorization", std::string("Bearer ") + kAdminSecret}};
  int walked = 0;
  for (const Operation& o : walk->ops) {
    if (o.method != "GET") continue;
    const std::string path = Concrete(o.pattern);
    INFO("HEAD ", o.pattern);
    auto got = c->Get(path, admin);
    auto head = c->Head(path, admin);
    REQUIRE(got);
    REQUIRE(head);
    CHECK(head->status == got->status);
    CHECK(head->body.empty());
    CHECK(head->get_header_value("Content-Type") == got->get_header_value("Content-Type"));
    if (!o.is_public) {
      auto anonymous = c->Head(path);
      REQUIRE(anonymous);
      CHECK(anonymous->status == 401);
      CHECK(anonymous->body.empty());
    }
    ++walked;
  }
  CHECK(walked >= 20);
  // The answer's length is the GET body's (RFC 9110 8.6), and the
  // connection goes on: httplib reads no body after a HEAD.
  auto got = c->Get("/openapi.json");
  auto head = c->Head("/openapi.json");
  REQUIRE((got && head));
  CHECK(head->get_header_value("Content-Length") == std::to_string(got->body.size()));
  auto live = c->Head("/healthz");
  REQUIRE(live);
  CHECK(live->status == 200);
  // A path that has GET lists HEAD beside it in a 405's Allow.
  auto post = c->Post("/healthz", "{}", "application/json");
  REQUIRE(post);
  CHECK(post->status == 405);
  CHECK(post->get_header_value("Allow") == "GET, HEAD");
  // A path without GET has no HEAD either.
  auto claim = c->Head("/v1/decide", admin);
  REQUIRE(claim);
  CHECK(claim->status == 405);
  CHECK(claim->get_header_value("Allow") == "POST");
}

}  // namespace idem::testing
