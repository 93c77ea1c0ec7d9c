// The Idempotency-Key contract (draft-ietf-httpapi-idempotency-key-header)
// against the real daemon.
#include <doctest/doctest.h>

#include <chrono>
#include <future>
#include <thread>

#include "tests/integration/harness.h"

namespace idem::testing {
namespace {

const char* kRules = R"(rules:
  - match:
      input:
        /text: {contains: slow}
    delay_ms: 600
    output: '{"category":"bug","priority":"low","summary":"slow","actions":[]}'
  - match:
      input:
        /text: {contains: broken}
    fail: {code: unavailable, message: upstream is down}
  - match:
      input:
        /text: {contains: internal}
    fail: {code: internal, message: upstream broke}
default:
  output: '{"category":"question","priority":"normal","summary":"q {{input.ticket_id}}","actions":[]}'
)";

struct Fixture {
  explicit Fixture(const std::string& extra = "") : config(WriteTestConfig(dir, kRules, extra)) {}
  TempDir dir;
  std::string config;
  std::unique_ptr<DaemonProcess> daemon;
  std::unique_ptr<httplib::Client> client;

  void Start(std::map<std::string, std::string> env = {}) {
    std::string err;
    daemon = DaemonProcess::Start({config, dir.path() + "/data", {}, env}, &err);
    REQUIRE_MESSAGE(daemon != nullptr, err);
    client = daemon->Client();
  }
  httplib::Result Decide(const std::string& key, const std::string& body,
                         httplib::Headers extra = {}) {
    httplib::Headers h = extra;
    if (!key.empty()) h.emplace("Idempotency-Key", key);
    return client->Post("/v1/decide", h, body, "application/json");
  }
};

const std::string kBodyA = R"({"step":"triage_ticket","input":{"ticket_id":1,"text":"a"}})";
const std::string kBodyB = R"({"step":"triage_ticket","input":{"ticket_id":2,"text":"b"}})";
const std::string kSlow = R"({"step":"triage_ticket","input":{"ticket_id":3,"text":"slow one"}})";

}  // namespace

TEST_CASE("same key and same payload replays the stored response with Idempotent-Replayed") {
  Fixture f;
  f.Start();
  auto first = f.Decide("\"k-1\"", kBodyA);
  REQUIRE(first->status == 200);
  CHECK(first->get_header_value("Idempotent-Replayed") == "");
  // Same payload with reordered members: the fingerprint is over JCS.
  auto again =
      f.Decide("\"k-1\"", R"({"input":{"text":"a","ticket_id":1},"step":"triage_ticket"})");
  REQUIRE(again->status == 200);
  CHECK(again->get_header_value("Idempotent-Replayed") == "true");
  CHECK(again->body == first->body);
  CHECK(MetricValue(*f.client, "idem_key_replayed_total") == 1);
}

TEST_CASE("same key with another payload is 422 and runs nothing") {
  Fixture f;
  f.Start();
  REQUIRE(f.Decide("\"k-2\"", kBodyA)->status == 200);
  auto other = f.Decide("\"k-2\"", kBodyB);
  REQUIRE(other);
  CHECK(other->status == 422);
  CHECK(Json::parse(other->body)["pointer"] == "header:Idempotency-Key");
  CHECK(MetricValue(*f.client, "idem_provider_calls_total") == 1);
}

TEST_CASE("a bare token key is accepted and the same as its sf-string form") {
  Fixture f;
  f.Start();
  REQUIRE(f.Decide("tok-3", kBodyA)->status == 200);
  auto quoted = f.Decide("\"tok-3\"", kBodyA);
  CHECK(quoted->get_header_value("Idempotent-Replayed") == "true");
  // RFC 8941 parameters are valid on the item and mean nothing here.
  for (const char* with_params : {"\"tok-3\";v=1", "tok-3;a;b=\"x\""}) {
    CAPTURE(with_params);
    auto r = f.Decide(with_params, kBodyA);
    REQUIRE(r);
    CHECK(r->get_header_value("Idempotent-Replayed") == "true");
  }
}

TEST_CASE("malformed, oversized or repeated keys are 400 before anything runs") {
  Fixture f;
  f.Start();
  for (std::string bad :
       {std::string("\"unterminated"), std::string("has space"), std::string("\"k\"tail"),
        "\"" + std::string(256, 'k') + "\"", std::string("\"\"")}) {
    CAPTURE(bad);
    auto res = f.Decide(bad, kBodyA);
    REQUIRE(res);
    CHECK(res->status == 400);
    CHECK(Json::parse(res->body)["pointer"] == "header:Idempotency-Key");
  }
  httplib::Headers twice = {{"Idempotency-Key", "\"a\""}, {"Idempotency-Key", "\"b\""}};
  auto res = f.client->Post("/v1/decide", twice, kBodyA, "application/json");
  CHECK(res->status == 400);
  CHECK(f.Decide("\"" + std::string(255, 'k') + "\"", kBodyA)->status == 200);
  CHECK(MetricValue(*f.client, "idem_provider_calls_total") == 1);
}

TEST_CASE("a duplicate while the first request runs is 409, or waits with Prefer: wait") {
  Fixture f;
  f.Start();
  auto first = std::async(std::launch::async, [&] {
    auto c = f.daemon->Client();
    return c->Post("/v1/decide", {{"Idempotency-Key", "\"k-slow\""}}, kSlow, "application/json");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  auto dup = f.Decide("\"k-slow\"", kSlow);
  REQUIRE(dup);
  CHECK(dup->status == 409);
  CHECK(dup->get_header_value("Retry-After") == "1");
  auto waited = f.Decide("\"k-slow\"", kSlow, {{"Prefer", "wait=10"}});
  REQUIRE(waited);
  CHECK(waited->status == 200);
  CHECK(waited->get_header_value("Idempotent-Replayed") == "true");
  auto original = first.get();
  REQUIRE(original);
  CHECK(original->status == 200);
  CHECK(waited->body == original->body);
  CHECK(MetricValue(*f.client, "idem_provider_calls_total") == 1);
}

TEST_CASE(
    "a retryable 503 says when to come back and is not stored: the retry with the key runs "
    "again") {
  Fixture f;
  f.Start();
  const std::string body = R"({"step":"triage_ticket","input":{"ticket_id":4,"text":"broken"}})";
  auto first = f.Decide("\"k-5xx\"", body);
  REQUIRE(first);
  CHECK(first->status == 503);
  CHECK(first->get_header_value("Retry-After") == "1");
  CHECK(Json::parse(first->body).value("retryable", false));
  long calls = MetricValue(*f.client, "idem_provider_calls_total");
  auto again = f.Decide("\"k-5xx\"", body);
  REQUIRE(again);
  CHECK(again->status == 503);
  CHECK_FALSE(again->has_header("Idempotent-Replayed"));
  CHECK(MetricValue(*f.client, "idem_provider_calls_total") > calls);
}

TEST_CASE("a store blip while releasing a retryable answer's key is tried again, not held") {
  Fixture f;
  // The first write that would release the key fails, as on a database
  // connection that just dropped.
  f.Start({{"IDEM_FAILPOINTS", "http.key_end=1*error"}});
  const std::string body = R"({"step":"triage_ticket","input":{"ticket_id":4,"text":"broken"}})";
  auto first = f.Decide("\"k-blip\"", body);
  REQUIRE(first);
  CHECK(first->status == 503);
  auto again = f.Decide("\"k-blip\"", body);
  REQUIRE(again);
  CHECK(again->status == 503);  // run again; a held key would answer 409 for the whole lease
  CHECK_FALSE(again->has_header("Idempotent-Replayed"));
  CHECK(MetricValue(*f.client, "idem_key_store_errors_total") == 0);
}

TEST_CASE("a 5xx the caller may not retry is a final outcome: stored and replayed") {
  Fixture f;
  f.Start();
  const std::string body = R"({"step":"triage_ticket","input":{"ticket_id":5,"text":"internal"}})";
  auto first = f.Decide("\"k-500\"", body);
  REQUIRE(first);
  CHECK(first->status >= 500);
  CHECK_FALSE(Json::parse(first->body).contains("retryable"));
  CHECK_FALSE(first->has_header("Retry-After"));
  long calls = MetricValue(*f.client, "idem_provider_calls_total");
  const long errors = MetricValue(*f.client, "idem_http_errors_5xx_total");
  auto again = f.Decide("\"k-500\"", body);
  REQUIRE(again);
  CHECK(again->status == first->status);
  CHECK(MetricValue(*f.client, "idem_http_errors_5xx_total") == errors + 1);  // as it was answered
  CHECK(again->get_header_value("Idempotent-Replayed") == "true");
  CHECK(again->body == first->body);
  CHECK(MetricValue(*f.client, "idem_provider_calls_total") == calls);
}

TEST_CASE("a key is forgotten after its window and may then be reused") {
  Fixture f("idempotency:\n  window: 1s\n");
  f.Start();
  REQUIRE(f.Decide("\"k-exp\"", kBodyA)->status == 200);
  CHECK(f.Decide("\"k-exp\"", kBodyB)->status == 422);
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  auto reused = f.Decide("\"k-exp\"", kBodyB);
  CHECK(reused->status == 200);
  CHECK(reused->get_header_value("Idempotent-Replayed") == "");
}

TEST_CASE("a key whose request crashed mid-flight runs at once after the restart") {
  // The default lease (60 s) is far longer than this test: the restarted
  // daemon knows the key was its own and releases it, so no 409.
  Fixture f;
  f.Start({{"IDEM_FAILPOINTS", "http.after_key_begin=crash"}});
  auto crashed = f.Decide("\"k-crash\"", kBodyA);
  CHECK_FALSE(crashed);  // the connection died with the process
  CHECK(f.daemon->WaitExit(5000));
  f.Start();
  auto retried = f.Decide("\"k-crash\"", kBodyA);
  REQUIRE(retried);
  CHECK(retried->status == 200);
  CHECK(retried->get_header_value("Idempotent-Replayed") == "");
  // Still bound to its payload, and now replayed.
  CHECK(f.Decide("\"k-crash\"", kBodyB)->status == 422);
  CHECK(f.Decide("\"k-crash\"", kBodyA)->get_header_value("Idempotent-Replayed") == "true");
}

TEST_CASE("a Prefer: wait too large to scale is 400 with the header as pointer") {
  Fixture f;
  f.Start();
  auto res = f.Decide("\"k-prefer\"", kBodyA, {{"Prefer", "wait=2305843009213693960"}});
  REQUIRE(res);
  CHECK(res->status == 400);
  CHECK(Json::parse(res->body)["pointer"] == "header:Prefer");
  CHECK(MetricValue(*f.client, "idem_provider_calls_total") == 0);
  CHECK(f.Decide("\"k-prefer\"", kBodyA, {{"Prefer", "wait=5"}})->status == 200);
}

TEST_CASE("keys are scoped per caller and a missing or wrong token is 401") {
  // sha256 of "agent-one-secret" and "agent-two-secret" (printf '%s' X | sha256sum).
  Fixture f(
      "auth:\n  tokens:\n"
      "    - {name: one, sha256: f084401c27a27fedacb3feafebb7148bcfd273bc76d0fa5aa39f1b1cd6bd616c, "
      "roles: [agent]}\n"
      "    - {name: two, sha256: a5cef620fbd5ac9e81004a511567d414c7382943416dcfe1db9a13a976e4c7a3, "
      "roles: [agent]}\n");
  f.Start();
  httplib::Headers one = {{"Authorization", "Bearer agent-one-secret"}};
  httplib::Headers two = {{"Authorization", "Bearer agent-two-secret"}};
  CHECK(f.Decide("\"shared\"", kBodyA, one)->status == 200);
  // The same key from another caller is another key: no 422.
  auto other = f.Decide("\"shared\"", kBodyB, two);
  CHECK(other->status == 200);
  CHECK(other->get_header_value("Idempotent-Replayed") == "");
  CHECK(f.Decide("\"shared\"", kBodyB, one)->status == 422);
  CHECK(f.Decide("\"shared\"", kBodyA)->status == 401);
  CHECK(f.Decide("\"shared\"", kBodyA, {{"Authorization", "Bearer wrong"}})->status == 401);
}

}  // namespace idem::testing
