// server.rate_limit over HTTP: a token bucket per caller, 429 with
// Retry-After past it, other callers and the probes unaffected, the batch
// lane (journal claims) limited like every other route.
#include <doctest/doctest.h>

#include <fstream>
#include <iterator>
#include <memory>
#include <string>

#include "tests/integration/harness.h"

namespace idem::testing {
namespace {

const char* kActions = R"(actions:
  send_invoice:
    identity: {fields: [/invoice_id], version: v1}
    window: 24h
    on_duplicate: return_original
)";

// Three requests at once per caller, then one every 100 s: no refill
// during a test, however slow the machine.
struct Fixture {
  TempDir dir;
  std::unique_ptr<DaemonProcess> daemon;
  std::unique_ptr<httplib::Client> client;
  explicit Fixture(const std::string& rate_limit = "{requests_per_s: 0.01, burst: 3}") {
    std::string config = WriteTestConfig(dir, kQuestionRules, kActions);
    std::string text;
    {
      std::ifstream in(config);
      text.assign(std::istreambuf_iterator<char>(in), {});
    }
    const std::string threads = "  threads: 96\n";
    size_t at = text.find(threads);
    REQUIRE(at != std::string::npos);
    text.insert(at + threads.size(), "  rate_limit: " + rate_limit + "\n");
    std::ofstream(config) << text;
    std::string err;
    daemon = DaemonProcess::Start({config, dir.path() + "/data", {}, {}}, &err);
    REQUIRE_MESSAGE(daemon != nullptr, err);
    client = daemon->Client();
  }
  httplib::Result Get(const std::string& path, const std::string& caller) {
    return client->Get(path.c_str(), {{"Idem-Caller", caller}});
  }
};

Json J(const httplib::Result& r) {
  REQUIRE(r);
  return Json::parse(r->body);
}

}  // namespace

TEST_CASE("a caller past server.rate_limit gets 429 with Retry-After and another caller does not") {
  Fixture f;
  for (int i = 0; i < 3; ++i) {
    auto ok = f.Get("/v1/decisions", "alice");
    REQUIRE(ok);
    CHECK(ok->status == 200);
  }
  auto limited = f.Get("/v1/decisions", "alice");
  REQUIRE(limited);
  CHECK(limited->status == 429);
  CHECK(limited->get_header_value("Content-Type") == "application/problem+json");
  // 0.01 per second: the next token is 100 s away.
  REQUIRE(limited->has_header("Retry-After"));
  long retry_after = std::stol(limited->get_header_value("Retry-After"));
  CHECK(retry_after > 90);
  CHECK(retry_after <= 100);
  CHECK(J(limited)["status"] == 429);
  CHECK(J(limited)["retryable"] == true);

  // Bob has his own bucket; anonymous callers share theirs, still full.
  for (int i = 0; i < 3; ++i) CHECK(f.Get("/v1/decisions", "bob")->status == 200);
  CHECK(f.client->Get("/v1/decisions")->status == 200);

  // Probes, scrapes and the API description are never limited.
  for (const char* path : {"/healthz", "/readyz", "/openapi.json"}) {
    CHECK(f.Get(path, "alice")->status == 200);
  }
  auto metrics = f.Get("/metrics", "alice");
  REQUIRE(metrics);
  CHECK(metrics->status == 200);
  CHECK(MetricValue(*f.client, "idem_http_rate_limited_total") == 1);
}

TEST_CASE("journal claims on the batch lane are rate limited per caller too") {
  Fixture f;
  auto claim = [&](const std::string& caller, int n) {
    Json body = {{"kind", "send_invoice"},
                 {"identity", {{"invoice_id", "INV-" + std::to_string(n)}}}};
    return f.client->Post("/v1/work/claim", {{"Idem-Caller", caller}}, body.dump(),
                          "application/json");
  };
  for (int i = 0; i < 3; ++i) CHECK(claim("carol", i)->status == 201);
  auto limited = claim("carol", 3);
  REQUIRE(limited);
  CHECK(limited->status == 429);
  CHECK(limited->has_header("Retry-After"));
  // The refused claim never reached the journal: dave's claim of the same
  // work is its first (a second would be 409, someone holds it).
  auto first = claim("dave", 3);
  REQUIRE(first);
  CHECK(first->status == 201);
  CHECK(J(first)["attempt"] == 1);
}

TEST_CASE("without server.rate_limit nothing is limited") {
  TempDir dir;
  std::string config = WriteTestConfig(dir, kQuestionRules);
  std::string err;
  auto daemon = DaemonProcess::Start({config, dir.path() + "/data", {}, {}}, &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);
  auto client = daemon->Client();
  for (int i = 0; i < 50; ++i) REQUIRE(client->Get("/v1/decisions")->status == 200);
  CHECK(MetricValue(*client, "idem_http_rate_limited_total") == 0);
}

}  // namespace idem::testing
