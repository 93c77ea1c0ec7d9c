// Bounds on what a client may ask for at once, against the real daemon: one
// step past each, the client gets a 400 naming the parameter (or the whole
// request), and nothing is half done; at the bound itself it is served.
#include <doctest/doctest.h>

#include <algorithm>

#include "tests/integration/harness.h"

namespace idem::testing {
namespace {

const char* kRules = R"(default:
  output: '{"category":"question","priority":"normal","summary":"about {{input.ticket_id}}","actions":[]}'
)";

std::string DecideBody(const std::string& ticket, const std::string& cache = "default") {
  return Json{{"step", "triage_ticket"},
              {"input", {{"ticket_id", ticket}, {"text", "text of " + ticket}}},
              {"cache", cache}}
      .dump();
}

struct Daemon {
  explicit Daemon(const TempDir& dir, const std::string& config, const std::string& data) {
    std::string err;
    process = DaemonProcess::Start({config, dir.path() + "/" + data, {}, {}}, &err);
    REQUIRE_MESSAGE(process != nullptr, err);
    client = process->Client();
  }
  std::unique_ptr<DaemonProcess> process;
  std::unique_ptr<httplib::Client> client;
};

// A 400 problem+json whose pointer is `pointer` ("" : none is given).
void CheckRefused(const httplib::Result& r, const std::string& pointer) {
  REQUIRE(r);
  INFO(r->body);
  CHECK(r->status == 400);
  CHECK(r->get_header_value("Content-Type").find("application/problem+json") == 0);
  Json body = Json::parse(r->body);
  if (pointer.empty()) {
    CHECK(!body.contains("pointer"));
  } else {
    CHECK(body["pointer"] == pointer);
  }
}

}  // namespace

TEST_CASE("a body nested past server.max_json_depth is 400 with the pointer where it went deep") {
  TempDir dir;
  Daemon d(dir, WriteTestConfig(dir, kRules), "data");
  std::string deep = R"({"step":"triage_ticket","input":{"a":)";
  for (int i = 0; i < 70; ++i) deep += "[";
  for (int i = 0; i < 70; ++i) deep += "]";
  deep += "}}";
  auto r = d.client->Post("/v1/decide", deep, "application/json");
  REQUIRE(r);
  CHECK(r->status == 400);
  Json body = Json::parse(r->body);
  CHECK(body["pointer"].get<std::string>().rfind("/input/a/0/0", 0) == 0);
  CHECK(body["detail"].get<std::string>().find("nesting deeper than 64") != std::string::npos);
}

TEST_CASE("a decisions export page is at most 1000 decisions: limit=1001 is 400 query:limit") {
  TempDir dir;
  Daemon d(dir, WriteTestConfig(dir, kRules), "data");
  REQUIRE(d.client->Post("/v1/decide", DecideBody("T-1"), "application/json")->status == 200);
  auto at_bound = d.client->Get("/v1/decisions/export?limit=1000");
  REQUIRE(at_bound);
  CHECK(at_bound->status == 200);
  CHECK(at_bound->body.find("\"T-1\"") != std::string::npos);
  CheckRefused(d.client->Get("/v1/decisions/export?limit=1001"), "query:limit");
  CheckRefused(d.client->Get("/v1/decisions/export?limit=0"), "query:limit");
}

TEST_CASE("an import of more than 10000 lines is refused whole: nothing of it is stored") {
  TempDir dir;
  const std::string config = WriteTestConfig(dir, kRules);
  std::string line;
  {
    Daemon source(dir, config, "source");
    REQUIRE(source.client->Post("/v1/decide", DecideBody("T-1"), "application/json")->status ==
            200);
    auto exported = source.client->Get("/v1/decisions/export");
    REQUIRE(exported);
    line = exported->body;  // one decision, one line
    REQUIRE(std::count(line.begin(), line.end(), '\n') == 1);
  }
  Daemon target(dir, config, "target");
  // The decision first, then 10000 more lines: one past the bound. Blank
  // lines are not counted, so they are padded with something.
  std::string body = line;
  for (int i = 0; i < 10'000; ++i) body += "{}\n";
  body += "\n\n";
  CheckRefused(target.client->Post("/v1/decisions/import", body, "application/x-ndjson"), "");
  auto miss = target.client->Post("/v1/decide", DecideBody("T-1", "only"), "application/json");
  REQUIRE(miss);
  CHECK(miss->status == 404);  // the decision of the refused import was not stored

  // At the bound the same lines are answered one verdict each.
  body = line;
  for (int i = 0; i < 9'999; ++i) body += "{}\n";
  auto at_bound = target.client->Post("/v1/decisions/import", body, "application/x-ndjson");
  REQUIRE(at_bound);
  REQUIRE(at_bound->status == 200);
  Json verdicts = Json::parse(at_bound->body);
  CHECK(verdicts["imported"] == 1);
  CHECK(verdicts["refused"] == 9'999);
  auto hit = target.client->Post("/v1/decide", DecideBody("T-1", "only"), "application/json");
  REQUIRE(hit);
  CHECK(hit->status == 200);
}

TEST_CASE("outbox event and dead-letter pages are at most 1000: limit=1001 is 400 query:limit") {
  TempDir dir;
  Daemon d(dir, WriteTestConfig(dir, kRules), "data");
  for (const char* path : {"/v1/events", "/v1/outbox/dead-letters"}) {
    INFO(path);
    auto at_bound = d.client->Get(std::string(path) + "?limit=1000");
    REQUIRE(at_bound);
    CHECK(at_bound->status == 200);
    CheckRefused(d.client->Get(std::string(path) + "?limit=1001"), "query:limit");
  }
}

TEST_CASE("a query parameter sent twice is 400 at query:NAME, not one of them filtering") {
  TempDir dir;
  Daemon d(dir, WriteTestConfig(dir, kRules), "data");
  CheckRefused(d.client->Get("/v1/plans?state=awaiting_approval&state=applied"), "query:state");
  CheckRefused(d.client->Get("/v1/decisions/export?limit=5&limit=5"), "query:limit");
  auto once = d.client->Get("/v1/plans?state=applied&limit=5");
  REQUIRE(once);
  CHECK(once->status == 200);
}

TEST_CASE("plan pages are at most 500 and a plan long poll at most 60 s: past them 400") {
  TempDir dir;
  Daemon d(dir, WriteTestConfig(dir, kRules), "data");
  auto at_bound = d.client->Get("/v1/plans?limit=500");
  REQUIRE(at_bound);
  CHECK(at_bound->status == 200);
  CheckRefused(d.client->Get("/v1/plans?limit=501"), "query:limit");
  // The wait is checked before the plan is looked up.
  CheckRefused(d.client->Get("/v1/plans/plan_nope?wait=61s"), "query:wait");
  auto within = d.client->Get("/v1/plans/plan_nope?wait=60s");
  REQUIRE(within);
  CHECK(within->status == 404);
}

TEST_CASE("an outbox event's data is bounded by its request: external_ref past 1024 is 400") {
  // Event data holds ids and short fields, never args or results; the one
  // field a client writes into effect.done is external_ref, bounded by the
  // complete request's schema, so an event cannot grow past it.
  TempDir dir;
  Daemon d(dir,
           WriteTestConfig(dir, kRules,
                           "actions:\n  send_invoice:\n    identity: {fields: [/invoice_id], "
                           "version: v1}\n    window: 24h\n    on_duplicate: return_original\n"),
           "data");
  auto claim = d.client->Post(
      "/v1/work/claim",
      Json{{"kind", "send_invoice"}, {"identity", {{"invoice_id", "INV-1"}}}, {"lease", "30s"}}
          .dump(),
      "application/json");
  REQUIRE(claim);
  REQUIRE(claim->status == 201);
  const Json work = Json::parse(claim->body);
  const std::string path = "/v1/work/" + work["work_id"].get<std::string>() + "/complete";
  auto complete = [&](size_t ref_size) {
    return d.client->Post(path,
                          Json{{"lease_token", work["lease_token"]},
                               {"result", {{"sent", true}, {"body", std::string(100'000, 'r')}}},
                               {"external_ref", std::string(ref_size, 'x')}}
                              .dump(),
                          "application/json");
  };
  CheckRefused(complete(1025), "/external_ref");
  auto none = d.client->Get("/v1/events");
  REQUIRE(none);
  const Json before = Json::parse(none->body);
  for (const Json& e : before["items"]) CHECK(e["type"] != "effect.done");

  auto done = complete(1024);
  REQUIRE(done);
  CHECK(done->status == 200);
  auto events = d.client->Get("/v1/events");
  REQUIRE(events);
  const Json after = Json::parse(events->body);
  int effects = 0;
  for (const Json& e : after["items"]) {
    if (e["type"] != "effect.done") continue;
    ++effects;
    CHECK(e["data"]["external_ref"].get<std::string>().size() == 1024);
    CHECK(e.dump().size() < 2048);  // the 100 kB result is not in it
  }
  CHECK(effects == 1);
}

TEST_CASE("an inbox event id is 1 to 255 characters: 256 is 400 with the id's pointer") {
  TempDir dir;
  Daemon d(dir,
           WriteTestConfig(dir, kRules,
                           "inbox:\n  audit_log:\n    event_id: {pointer: /id}\n    on_event: "
                           "{record: true}\n"),
           "data");
  auto post = [&](const std::string& id) {
    return d.client->Post("/v1/inbox/audit_log", Json{{"id", id}, {"what", "x"}}.dump(),
                          "application/json");
  };
  CheckRefused(post(std::string(256, 'e')), "/id");
  CheckRefused(post(""), "/id");
  auto at_bound = post(std::string(255, 'e'));
  REQUIRE(at_bound);
  CHECK(at_bound->status == 200);
  auto again = post(std::string(255, 'e'));
  REQUIRE(again);
  CHECK(Json::parse(again->body)["duplicate"] == true);
}

}  // namespace idem::testing
