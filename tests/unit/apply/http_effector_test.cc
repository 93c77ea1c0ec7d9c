#include "daemon/apply/http_effector.h"

#include <doctest/doctest.h>
#include <httplib.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "tests/fakes/serve.h"
#include "tests/unit/apply/apply_test_util.h"

namespace idem::testing {
namespace {

ActionConfig Kind(Json http) {
  ActionConfig a;
  a.name = "send_reply";
  a.identity_fields = {"/ticket_id"};
  a.effector = Json{{"http", std::move(http)}};
  return a;
}

// Records RecordExternalRef calls instead of writing a journal.
class RecordingContext final : public EffectContext {
 public:
  Status RecordExternalRef(const std::string& ref) override {
    refs.push_back(ref);
    return Status::Ok();
  }
  std::vector<std::string> refs;
};

WorkItem Item(Json args, std::string work_id = "w1") {
  WorkItem w;
  w.work_id = std::move(work_id);
  w.kind = "send_reply";
  w.args = std::move(args);
  return w;
}

// Passes each request on to `inner`, keeping a copy.
class RecordingHttp final : public HttpClient {
 public:
  explicit RecordingHttp(HttpClient& inner) : inner_(inner) {}
  StatusOr<HttpResponse> Send(const HttpRequest& request) override {
    sent.push_back(request);
    return inner_.Send(request);
  }
  std::vector<HttpRequest> sent;

 private:
  HttpClient& inner_;
};

}  // namespace

TEST_CASE(
    "an effect without an idempotency key goes out on a fresh connection: libcurl would send it "
    "again down a reused one that died after the target acted") {
  ApplyHarness h;
  struct Case {
    const char* level;
    bool fresh;
  };
  for (Case c : {Case{"header", false}, Case{"none", true}, Case{"check_then_act", true}}) {
    CAPTURE(c.level);
    Json http = {{"url", h.Url("/records")}, {"idempotency", c.level}};
    if (std::string(c.level) == "check_then_act") {
      http["lookup"] = {{"url", h.Url("/records?fingerprint={fingerprint}")}};
    }
    RecordingHttp recording(*h.http_);
    auto effector = HttpEffector::Create(Kind(http), recording, h.env_);
    REQUIRE(effector.ok());
    RecordingContext context;
    EffectAttempt done = (*effector)->Execute(Item({{"ticket_id", "T-1"}}, "fresh-1"), context);
    REQUIRE_MESSAGE(done.status.ok(), done.status.ToString());
    bool created = false;
    for (const HttpRequest& r : recording.sent) {
      // A lookup only reads: a repeat of it does no harm.
      CHECK(r.fresh_connection == (r.method == "POST" && c.fresh));
      created = created || r.method == "POST";
    }
    CHECK(created);
  }
}

TEST_CASE("effector config errors name the offending key") {
  const std::string at = "/actions/send_reply/effector/http";
  struct Case {
    Json http;
    std::string field;
  };
  const Case cases[] = {
      {{{"url", "http://x/r"}}, at + "/idempotency"},
      {{{"url", "http://x/r"}, {"idempotency", "maybe"}}, at + "/idempotency"},
      {{{"idempotency", "header"}}, at + "/url"},
      {{{"url", "ftp://x/r"}, {"idempotency", "header"}}, at + "/url"},
      {{{"url", "http://x/r"}, {"idempotency", "header"}, {"retries", 3}}, at + "/retries"},
      {{{"url", "http://x/r"}, {"idempotency", "upsert"}}, at + "/upsert_key"},
      {{{"url", "http://x/{key}"}, {"idempotency", "header"}}, at + "/url"},
      {{{"url", "http://x/{nope}"}, {"idempotency", "header"}}, at + "/url"},
      {{{"url", "http://x/r"}, {"idempotency", "check_then_act"}}, at + "/lookup"},
      {{{"url", "http://x/r"}, {"idempotency", "check_then_act"}, {"lookup", {{"method", "GET"}}}},
       at + "/lookup/url"},
      {{{"url", "http://x/r"},
        {"idempotency", "check_then_act"},
        {"lookup", {{"url", "http://x/r"}, {"method", "PUT"}}}},
       at + "/lookup/method"},
      {{{"url", "http://x/r"},
        {"idempotency", "check_then_act"},
        {"lookup", {{"url", "http://x/r"}, {"verb", "GET"}}}},
       at + "/lookup/verb"},
      {{{"url", "http://x/r"}, {"idempotency", "header"}, {"method", "GET"}}, at + "/method"},
      {{{"url", "http://x/r"}, {"idempotency", "header"}, {"external_ref", "id"}},
       at + "/external_ref"},
      {{{"url", "http://x/r"}, {"idempotency", "header"}, {"headers", {{"X-A", 1}}}},
       at + "/headers/X-A"},
      {{{"url", "http://x/r"}, {"idempotency", "header"}, {"list_url", "http://x/{fingerprint}"}},
       at + "/list_url"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.http.dump());
    auto parsed = ParseHttpEffectorConfig(Kind(c.http));
    REQUIRE_FALSE(parsed.ok());
    CHECK(parsed.status().code() == Code::kInvalidArgument);
    CHECK(parsed.status().field() == c.field);
  }
  ActionConfig other = Kind({});
  other.effector = Json{{"grpc", Json::object()}};
  CHECK(ParseHttpEffectorConfig(other).status().field() == "/actions/send_reply/effector");
}

TEST_CASE("effector config defaults per level") {
  auto upsert = ParseHttpEffectorConfig(
      Kind({{"url", "http://x/items/{key}"}, {"idempotency", "upsert"}, {"upsert_key", "/sku"}}));
  REQUIRE(upsert.ok());
  CHECK(upsert->method == "PUT");
  CHECK_FALSE(upsert->embed_fingerprint);
  CHECK(upsert->external_ref == "/id");

  auto cta =
      ParseHttpEffectorConfig(Kind({{"url", "http://x/records"},
                                    {"idempotency", "check_then_act"},
                                    {"lookup", {{"url", "http://x/records?fp={fingerprint}"}}}}));
  REQUIRE(cta.ok());
  CHECK(cta->method == "POST");
  CHECK(cta->embed_fingerprint);
  CHECK(cta->fingerprint_field == "idem_fingerprint");
}

TEST_CASE("an upsert key of . or .. is refused: in the URL it would name the collection") {
  ApplyHarness h;
  auto effector = HttpEffector::Create(Kind({{"url", h.Url("/tenants/acme/items/{key}")},
                                             {"idempotency", "upsert"},
                                             {"upsert_key", "/sku"}}),
                                       *h.http_, h.env_);
  REQUIRE(effector.ok());
  for (const char* dots : {".", ".."}) {
    CAPTURE(dots);
    Status refused = (*effector)->Validate(Json{{"sku", dots}});
    CHECK(refused.code() == Code::kInvalidArgument);
    CHECK(refused.field() == "/args/sku");
  }
  CHECK((*effector)->Validate(Json{{"sku", "..a"}}).ok());  // a name, not a dot segment
  CHECK((*effector)->Validate(Json{{"sku", "a.b"}}).ok());
  RecordingContext context;
  EffectAttempt attempt = (*effector)->Execute(Item({{"sku", ".."}}), context);
  CHECK_FALSE(attempt.status.ok());
  CHECK(h.fake().calls().empty());  // nothing went out
}

TEST_CASE("header values take ${VAR} from the environment, and an unset one is refused") {
  ApplyHarness h;
  setenv("IDEM_TEST_EFFECTOR_TOKEN", "s3cr3t-token", 1);
  Json http = {{"url", h.Url("/replies")},
               {"idempotency", "header"},
               {"idempotency_header", "X-Request-Key"},
               {"headers", {{"Authorization", "Bearer ${IDEM_TEST_EFFECTOR_TOKEN}"}}}};
  auto effector = HttpEffector::Create(Kind(http), *h.http_, h.env_);
  REQUIRE(effector.ok());
  RecordingContext context;
  EffectAttempt attempt = (*effector)->Execute(Item({{"ticket_id", "T-1"}}), context);
  REQUIRE(attempt.status.ok());
  CHECK(attempt.result.external_ref == "rep_1");
  auto calls = h.fake().calls();
  REQUIRE(calls.size() == 1);
  CHECK(calls[0].headers["authorization"] == "Bearer s3cr3t-token");
  CHECK(calls[0].headers["x-request-key"] == "w1");
  CHECK(calls[0].headers["content-type"] == "application/json");

  http["headers"]["Authorization"] = "Bearer ${IDEM_TEST_UNSET_VARIABLE}";
  auto unset = HttpEffector::Create(Kind(http), *h.http_, h.env_);
  CHECK(unset.status().code() == Code::kFailedPrecondition);
  CHECK(unset.status().message().find("IDEM_TEST_UNSET_VARIABLE") != std::string::npos);
}

TEST_CASE(
    "failures are classified once: 5xx and 429 retry, other 4xx do not, secrets are redacted") {
  ApplyHarness h;
  setenv("IDEM_TEST_EFFECTOR_TOKEN", "s3cr3t-token", 1);
  Json http = {{"url", h.Url("/replies")},
               {"idempotency", "header"},
               {"headers", {{"Authorization", "Bearer ${IDEM_TEST_EFFECTOR_TOKEN}"}}}};
  auto effector = HttpEffector::Create(Kind(http), *h.http_, h.env_);
  REQUIRE(effector.ok());
  struct Case {
    int status;
    bool retryable;
  };
  for (Case c : {Case{503, true}, Case{500, true}, Case{429, true}, Case{408, true},
                 Case{409, true}, Case{400, false}, Case{401, false}, Case{422, false}}) {
    CAPTURE(c.status);
    h.fake().FailNext(1, c.status, 7);
    RecordingContext context;
    EffectAttempt attempt = (*effector)->Execute(Item({{"ticket_id", "T-1"}}), context);
    REQUIRE_FALSE(attempt.status.ok());
    CHECK(attempt.status.retryable() == c.retryable);
    CHECK_FALSE(attempt.abandoned);
    CHECK(attempt.retry_after_ms == (c.retryable ? 7'000 : 0));
    CHECK(attempt.status.message().find("s3cr3t") == std::string::npos);
  }

  // A connection refused is a retryable network failure.
  Json closed = {{"url", "http://127.0.0.1:1/replies"}, {"idempotency", "header"}};
  auto nowhere = HttpEffector::Create(Kind(closed), *h.http_, h.env_);
  REQUIRE(nowhere.ok());
  RecordingContext context;
  EffectAttempt attempt = (*nowhere)->Execute(Item({{"ticket_id", "T-1"}}), context);
  CHECK(attempt.status.code() == Code::kUnavailable);
  CHECK(attempt.status.retryable());
}

TEST_CASE("a client timeout is retryable, and the slow effect still lands once") {
  ApplyHarness h;
  ActionConfig kind = Kind({{"url", h.Url("/replies")}, {"idempotency", "header"}});
  kind.retry.timeout_ms = 200;
  auto effector = HttpEffector::Create(kind, *h.http_, h.env_);
  REQUIRE(effector.ok());
  h.fake().TimeoutNext(1, 600);
  RecordingContext context;
  EffectAttempt slow = (*effector)->Execute(Item({{"ticket_id", "T-1"}}), context);
  CHECK(slow.status.code() == Code::kDeadlineExceeded);
  CHECK(slow.status.retryable());
  // The retry while the first is still being handled: the target says 409.
  EffectAttempt during = (*effector)->Execute(Item({{"ticket_id", "T-1"}}), context);
  CHECK(during.status.code() == Code::kAborted);
  CHECK(during.status.retryable());
  REQUIRE(h.fake().WaitForEffects(1, std::chrono::seconds(30)));  // the first call lands
  EffectAttempt after = (*effector)->Execute(Item({{"ticket_id", "T-1"}}), context);
  REQUIRE(after.status.ok());
  CHECK(after.result.external_ref == "rep_1");
  CHECK(h.fake().stats().effects == 1);
}

TEST_CASE("check_then_act creates with the fingerprint, records the ref at once, adopts a match") {
  ApplyHarness h;
  Json http = {{"url", h.Url("/records")},
               {"idempotency", "check_then_act"},
               {"lookup", {{"url", h.Url("/records?fingerprint={fingerprint}")}}},
               {"fingerprint_field", "external_key"}};
  auto effector = HttpEffector::Create(Kind(http), *h.http_, h.env_);
  REQUIRE(effector.ok());
  RecordingContext context;
  EffectAttempt created = (*effector)->Execute(Item({{"ticket_id", "T-1"}}, "fp-1"), context);
  REQUIRE(created.status.ok());
  CHECK(created.result.external_ref == "rec_1");
  CHECK(context.refs == std::vector<std::string>{"rec_1"});
  auto records = h.fake().Records("records");
  REQUIRE(records.size() == 1);
  CHECK(records[0]["external_key"] == "fp-1");

  // The fake's lookup filters by idem_fingerprint; this kind embeds
  // external_key, so the lookup lists everything and the effector must pick
  // the record whose member matches, ignoring near matches.
  auto found = (*effector)->Lookup(Item({{"ticket_id", "T-1"}}, "fp-1"));
  REQUIRE(found.ok());
  CHECK_FALSE(found->found);  // ?fingerprint= filters on idem_fingerprint: nothing

  Json listing = http;
  listing["lookup"]["url"] = h.Url("/records");
  auto lister = HttpEffector::Create(Kind(listing), *h.http_, h.env_);
  REQUIRE(lister.ok());
  auto match = (*lister)->Lookup(Item({{"ticket_id", "T-1"}}, "fp-1"));
  REQUIRE(match.ok());
  CHECK(match->found);
  CHECK(match->external_ref == "rec_1");
  auto other = (*lister)->Lookup(Item({{"ticket_id", "T-2"}}, "fp-2"));
  REQUIRE(other.ok());
  CHECK_FALSE(other->found);

  RecordingContext second;
  EffectAttempt adopted = (*lister)->Execute(Item({{"ticket_id", "T-1"}}, "fp-1"), second);
  REQUIRE(adopted.status.ok());
  CHECK(adopted.result.result["found_existing"] == true);
  CHECK(h.fake().stats().effects == 1);
}

TEST_CASE("a POST lookup sends the fingerprint in the body and reads the matches at lookup.found") {
  ApplyHarness h;
  Json http = {
      {"url", h.Url("/records")},
      {"idempotency", "check_then_act"},
      {"lookup", {{"url", h.Url("/records/_search")}, {"method", "POST"}, {"found", "/data"}}}};
  auto effector = HttpEffector::Create(Kind(http), *h.http_, h.env_);
  REQUIRE(effector.ok());
  RecordingContext context;
  EffectAttempt created = (*effector)->Execute(Item({{"ticket_id", "T-1"}}, "fp-7"), context);
  REQUIRE(created.status.ok());
  CHECK(created.result.external_ref == "rec_1");
  auto found = (*effector)->Lookup(Item({{"ticket_id", "T-1"}}, "fp-7"));
  REQUIRE(found.ok());
  CHECK(found->found);
  CHECK(found->external_ref == "rec_1");
  auto calls = h.fake().calls();
  REQUIRE(calls.size() == 3);  // search, create, search
  CHECK(calls[0].method == "POST");
  CHECK(Json::parse(calls[0].body) == Json{{"idem_fingerprint", "fp-7"}});
  auto missing = (*effector)->Lookup(Item({{"ticket_id", "T-2"}}, "fp-8"));
  REQUIRE(missing.ok());
  CHECK_FALSE(missing->found);
}

TEST_CASE("a lookup answer that is not JSON is a retryable failure; 404 means absent") {
  ApplyHarness h;
  Json http = {{"url", h.Url("/records")},
               {"idempotency", "check_then_act"},
               {"lookup", {{"url", h.Url("/_stats")}}}};
  // /_stats answers an object without a fingerprint member: one record found.
  auto effector = HttpEffector::Create(Kind(http), *h.http_, h.env_);
  REQUIRE(effector.ok());
  auto found = (*effector)->Lookup(Item({{"ticket_id", "T-1"}}));
  REQUIRE(found.ok());
  CHECK(found->found);

  http["lookup"]["url"] = h.Url("/records/{fingerprint}");
  auto by_id = HttpEffector::Create(Kind(http), *h.http_, h.env_);
  REQUIRE(by_id.ok());
  auto absent = (*by_id)->Lookup(Item({{"ticket_id", "T-1"}}));
  REQUIRE(absent.ok());
  CHECK_FALSE(absent->found);

  http["lookup"] = {{"url", h.Url("/records")}, {"found", "/data"}};
  auto wrong_shape = HttpEffector::Create(Kind(http), *h.http_, h.env_);
  REQUIRE(wrong_shape.ok());
  auto malformed = (*wrong_shape)->Lookup(Item({{"ticket_id", "T-1"}}));
  CHECK(malformed.status().code() == Code::kUnavailable);
  CHECK(malformed.status().retryable());
}

TEST_CASE("a 400 that echoes the request names none of the URL's secrets in the error") {
  // The target answers every call 400, repeating what it was sent: the
  // path (decoded), each query parameter and the Authorization header.
  httplib::Server echo;
  echo.set_error_handler([](const httplib::Request&, httplib::Response&) {});
  auto handler = [](const httplib::Request& req, httplib::Response& res) {
    std::string query;
    for (const auto& [name, value] : req.params) query += name + "=" + value + "&";
    const Json body = {{"message", "bad request: path " + req.path + " query " + query +
                                       " authorization " + req.get_header_value("Authorization")}};
    res.status = 400;
    res.set_content(body.dump(), "application/json");
  };
  echo.Put(".*", handler);
  echo.Post(".*", handler);
  std::thread thread;
  const int port = fakes::ServeInBackground(echo, 0, thread);
  REQUIRE(port > 0);
  const std::string base = "http://u:USERINFOPASS777@127.0.0.1:" + std::to_string(port);
  ApplyHarness h;
  struct Case {
    Json http;
    std::vector<std::string> secrets;
  };
  const Case cases[] = {
      {{{"url", base + "/refunds/PATHSECRETabcdef123456?apikey=QUERYSECRET555&v=2"},
        {"idempotency", "header"}},
       // dTpVU0VSSU5GT1BBU1M3Nzc= is base64("u:USERINFOPASS777"), curl's Basic credential.
       {"USERINFOPASS777", "dTpVU0VSSU5GT1BBU1M3Nzc=", "PATHSECRETabcdef123456", "QUERYSECRET555"}},
      // A template: its literal parts are secret, the item's key is not.
      {{{"url", base + "/hooks/TOKEN%20PART-{key}/PATHSECRET-two-xyz?sig=SIGSECRET999"},
        {"idempotency", "upsert"},
        {"upsert_key", "/ticket_id"}},
       {"USERINFOPASS777", "TOKEN PART-", "TOKEN%20PART-", "PATHSECRET-two-xyz", "SIGSECRET999"}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.http.dump());
    auto effector = HttpEffector::Create(Kind(c.http), *h.http_, h.env_);
    REQUIRE(effector.ok());
    RecordingContext context;
    EffectAttempt attempt = (*effector)->Execute(Item({{"ticket_id", "T-1234567890123"}}), context);
    REQUIRE_FALSE(attempt.status.ok());
    const std::string& message = attempt.status.message();
    CAPTURE(message);
    CHECK_FALSE(attempt.status.retryable());
    CHECK(message.find("HTTP 400") != std::string::npos);
    CHECK(message.find("[redacted]") != std::string::npos);
    for (const std::string& secret : c.secrets) {
      CAPTURE(secret);
      CHECK(message.find(secret) == std::string::npos);
    }
    if (c.http.contains("upsert_key")) {
      // The per-item key is the item's own, not the config's secret.
      CHECK(message.find("T-1234567890123") != std::string::npos);
    }
  }
  echo.stop();
  thread.join();
}

TEST_CASE(
    "a 2xx answer that echoes the request is stored without its secrets, and keeps its data") {
  // The target answers 201 with what it was sent (the Authorization header
  // and the query, as values and as a member name), and its lookup lists a
  // record that echoes the same, matched by fingerprint.
  httplib::Server echo;
  echo.set_error_handler([](const httplib::Request&, httplib::Response&) {});
  auto echoed = [](const httplib::Request& req) {
    const std::string auth = req.get_header_value("Authorization");
    return Json{{"authorization", auth},
                {"apikey", req.get_param_value("apikey")},
                {"format", req.get_param_value("format")},
                {"content_type", "application/json"},
                {"headers_seen", {{auth, true}}},
                {"list", Json::array({"x " + auth + " y"})}};
  };
  echo.Post(".*", [&](const httplib::Request& req, httplib::Response& res) {
    Json body = {{"id", "rec_1"}, {"echo", echoed(req)}};
    res.status = 201;
    res.set_content(body.dump(), "application/json");
  });
  echo.Get(".*", [&](const httplib::Request& req, httplib::Response& res) {
    Json record = {
        {"id", "rec_0"}, {"idem_fingerprint", req.get_param_value("fp")}, {"echo", echoed(req)}};
    res.set_content(Json::array({record}).dump(), "application/json");
  });
  std::thread thread;
  const int port = fakes::ServeInBackground(echo, 0, thread);
  REQUIRE(port > 0);
  const std::string base = "http://127.0.0.1:" + std::to_string(port);
  ApplyHarness h;
  setenv("IDEM_TEST_EFFECTOR_SECRET", "s3cr3t-value-42", 1);
  const Json headers = {{"Authorization", "Bearer ${IDEM_TEST_EFFECTOR_SECRET}"}};
  const std::vector<std::string> secrets = {"s3cr3t-value-42", "QUERYSECRET-5555555"};
  auto holds_secret = [&](const Json& stored) {
    const std::string text = stored.dump();
    for (const std::string& secret : secrets) {
      if (text.find(secret) != std::string::npos) return true;
    }
    return false;
  };

  Json http = {{"url", base + "/records?apikey=QUERYSECRET-5555555&format=json"},
               {"idempotency", "header"},
               {"headers", headers}};
  auto effector = HttpEffector::Create(Kind(http), *h.http_, h.env_);
  REQUIRE(effector.ok());
  RecordingContext context;
  EffectAttempt created = (*effector)->Execute(Item({{"ticket_id", "T-1"}}), context);
  REQUIRE(created.status.ok());
  const Json& stored = created.result.result;
  CAPTURE(stored.dump());
  CHECK(stored["status"] == 201);
  CHECK(created.result.external_ref == "rec_1");
  CHECK_FALSE(holds_secret(stored));
  const Json& body = stored["body"]["echo"];
  CHECK(body["authorization"] == "Bearer [redacted]");
  CHECK(body["apikey"] == "[redacted]");
  CHECK(body["headers_seen"].contains("Bearer [redacted]"));
  CHECK(body["list"][0] == "x Bearer [redacted] y");
  // A short plain query value is the answer's own data, not an echo to hide.
  CHECK(body["format"] == "json");
  CHECK(body["content_type"] == "application/json");

  // A found record (check_then_act adopting an earlier attempt's effect) too.
  Json lookup = {{"url", base + "/records?apikey=QUERYSECRET-5555555&format=json"},
                 {"idempotency", "check_then_act"},
                 {"headers", headers},
                 {"lookup", {{"url", base + "/find?apikey=QUERYSECRET-5555555&fp={fingerprint}"}}}};
  auto adopter = HttpEffector::Create(Kind(lookup), *h.http_, h.env_);
  REQUIRE(adopter.ok());
  RecordingContext second;
  EffectAttempt adopted = (*adopter)->Execute(Item({{"ticket_id", "T-1"}}, "fp-9"), second);
  REQUIRE(adopted.status.ok());
  CAPTURE(adopted.result.result.dump());
  CHECK(adopted.result.result["found_existing"] == true);
  CHECK(adopted.result.external_ref == "rec_0");
  CHECK_FALSE(holds_secret(adopted.result.result));
  CHECK(adopted.result.result["body"]["echo"]["authorization"] == "Bearer [redacted]");
  auto found = (*adopter)->Lookup(Item({{"ticket_id", "T-1"}}, "fp-9"));
  REQUIRE(found.ok());
  CHECK_FALSE(holds_secret(found->record));
  echo.stop();
  thread.join();
}

TEST_CASE(
    "a URL's secrets are its userinfo, Basic credential, query values and odd path segments") {
  std::vector<std::string> parts =
      UrlSecrets("https://bot:pa%20ss@h.example/v1/chat/AAAAbbbbCCCCdddd/x%2Fy?k=a+b&flag#frag");
  auto has = [&](const std::string& s) {
    return std::find(parts.begin(), parts.end(), s) != parts.end();
  };
  CHECK(has("bot:pa%20ss"));
  CHECK(has("pa%20ss"));
  CHECK(has("pa ss"));
  CHECK(has("Ym90OnBhIHNz"));  // base64("bot:pa ss")
  CHECK(has("AAAAbbbbCCCCdddd"));
  CHECK(has("x%2Fy"));
  CHECK(has("a+b"));
  CHECK(has("a b"));
  CHECK(has("flag"));
  // What UrlForMessages shows is no secret.
  for (const char* shown : {"h.example", "v1", "chat", "frag"}) {
    CAPTURE(shown);
    CHECK_FALSE(has(shown));
  }
  // A template's placeholders are no part of a secret.
  CHECK(UrlSecrets("http://h/items/{key}").empty());
  CHECK(UrlSecrets("http://h/a/{key}-LONGLITERALSECRET?t={fingerprint}") ==
        std::vector<std::string>{"-LONGLITERALSECRET"});
}

}  // namespace idem::testing
