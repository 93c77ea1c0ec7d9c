#include "providers/errors.h"

#include <doctest/doctest.h>

#include "tests/unit/providers/provider_test_support.h"

namespace idem {
namespace {

HttpResponse Answer(int status, std::string body = "", HttpHeaders headers = {}) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  r.headers = std::move(headers);
  return r;
}

TEST_CASE("an answer nested deeper than the wire limit is not JSON, not a crash") {
  auto nested = [](int depth) {
    return R"({"category":)" + std::string(depth, '[') + std::string(depth, ']') + "}";
  };
  CHECK(ParseJsonBody(nested(kMaxWireJsonDepth - 1)).has_value());
  CHECK_FALSE(ParseJsonBody(nested(kMaxWireJsonDepth)).has_value());
  CHECK_FALSE(ParseJsonBody(nested(200'000)).has_value());
  CHECK_FALSE(ParseJsonBody(R"({"a":1,"a":2})").has_value());  // which one would the model mean?
  CHECK(ParseJsonBody(R"({"a":[1,{"b":null}]})") == Json::parse(R"({"a":[1,{"b":null}]})"));
}

TEST_CASE("HTTP statuses map to one code and retryable bit each") {
  struct Row {
    int status;
    Code code;
    bool retryable;
  };
  const Row rows[] = {
      {400, Code::kInvalidArgument, false},   {401, Code::kUnauthenticated, false},
      {403, Code::kPermissionDenied, false},  {404, Code::kNotFound, false},
      {408, Code::kDeadlineExceeded, true},   {409, Code::kAborted, true},
      {413, Code::kResourceExhausted, false}, {422, Code::kInvalidArgument, false},
      {429, Code::kResourceExhausted, true},  {500, Code::kUnavailable, true},
      {502, Code::kUnavailable, true},        {503, Code::kUnavailable, true},
      {504, Code::kDeadlineExceeded, true},   {529, Code::kUnavailable, true},
      {599, Code::kUnavailable, true},        {418, Code::kFailedPrecondition, false},
      {302, Code::kUnavailable, false},
  };
  for (const Row& row : rows) {
    CAPTURE(row.status);
    UpstreamError e = ClassifyHttpFailure("up", Answer(row.status), 0);
    CHECK(e.status.code() == row.code);
    CHECK(e.status.retryable() == row.retryable);
    CHECK(IsRetryableHttpStatus(row.status) == row.retryable);
    CHECK(e.status.message().find("HTTP " + std::to_string(row.status)) != std::string::npos);
  }
}

TEST_CASE("a 429 that says insufficient_quota is not retryable") {
  UpstreamError e = ClassifyHttpFailure(
      "openai",
      Answer(
          429,
          R"({"error":{"message":"You exceeded your current quota.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}})",
          {{"retry-after", "20"}}),
      0);
  CHECK(e.status.code() == Code::kResourceExhausted);
  CHECK_FALSE(e.status.retryable());
  CHECK(e.retry_after_ms == 0);
  CHECK(e.status.message().find("You exceeded your current quota.") != std::string::npos);
  CHECK(e.status.message().find("quota exhausted") != std::string::npos);
}

TEST_CASE("the provider's error message is in the status") {
  SUBCASE("OpenAI shape") {
    auto e = ClassifyHttpFailure(
        "openai",
        Answer(
            400,
            R"({"error":{"message":"Invalid schema for response_format","type":"invalid_request_error","param":"response_format","code":null}})"),
        0);
    CHECK(e.status.message() ==
          "openai: HTTP 400: Invalid schema for response_format (invalid_request_error)");
  }
  SUBCASE("Anthropic shape") {
    auto e = ClassifyHttpFailure(
        "claude",
        Answer(529,
               R"({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}})"),
        0);
    CHECK(e.status.message() == "claude: HTTP 529: Overloaded (overloaded_error)");
    CHECK(e.status.retryable());
  }
  SUBCASE("Ollama shape") {
    auto e = ClassifyHttpFailure("local", Answer(404, R"({"error":"model 'x' not found"})"), 0);
    CHECK(e.status.message() == "local: HTTP 404: model 'x' not found");
  }
  SUBCASE("short plain-text body") {
    auto e = ClassifyHttpFailure("proxy", Answer(502, "Bad Gateway"), 0);
    CHECK(e.status.message() == "proxy: HTTP 502: Bad Gateway");
  }
  SUBCASE("HTML error pages are left out") {
    auto e = ClassifyHttpFailure("proxy", Answer(503, "<html><body>down</body></html>"), 0);
    CHECK(e.status.message() == "proxy: HTTP 503");
  }
  SUBCASE("long messages are cut") {
    std::string long_text(5000, 'x');
    auto e = ClassifyHttpFailure("up", Answer(400, Json{{"error", long_text}}.dump()), 0);
    CHECK(e.status.message().size() < 600);
  }
}

TEST_CASE("the secret is redacted from provider messages") {
  const std::string key = testing::kTestKey;
  auto e = ClassifyHttpFailure(
      "openai",
      Answer(401,
             Json{{"error", {{"message", "Incorrect API key provided: " + key + "."}}}}.dump()),
      0, {key});
  CHECK(e.status.code() == Code::kUnauthenticated);
  CHECK(e.status.message().find(key) == std::string::npos);
  CHECK(e.status.message().find("[redacted]") != std::string::npos);
  CHECK(Redact("a-key-a-key", "a-key") == "[redacted]-[redacted]");
  CHECK(Redact("abc", "ab") == "abc");  // too short to be a secret
}

TEST_CASE("a secret the 512-byte cut goes through is redacted whole first, not left half") {
  const std::string token = "SeCrEtToKeN-1234567890ab";
  // The target echoes the request's Authorization header past byte 495.
  const std::string text = std::string(495, 'y') + " Bearer " + token;
  for (const std::string& body : {Json{{"error", text}}.dump(), text.substr(400)}) {
    CAPTURE(body.size());
    auto e = ClassifyHttpFailure("effector", Answer(500, body), 0, {token});
    CHECK(e.status.message().find("SeCrEt") == std::string::npos);
  }
}

TEST_CASE("Retry-After: delta-seconds, HTTP-date and retry-after-ms") {
  const int64_t now = *ParseHttpDate("Sun, 06 Nov 1994 08:49:37 GMT");
  CHECK(now == 784111777000);
  CHECK(ParseRetryAfter({{"retry-after", "2"}}, now) == 2000);
  CHECK(ParseRetryAfter({{"retry-after", " 0 "}}, now) == 0);
  CHECK(ParseRetryAfter({{"retry-after", "Sun, 06 Nov 1994 08:50:07 GMT"}}, now) == 30000);
  CHECK(ParseRetryAfter({{"retry-after", "Sunday, 06-Nov-94 08:49:47 GMT"}}, now) == 10000);
  CHECK(ParseRetryAfter({{"retry-after", "Sun Nov  6 08:49:38 1994"}}, now) == 1000);
  CHECK(ParseRetryAfter({{"retry-after", "Sun, 06 Nov 1994 08:00:00 GMT"}}, now) == 0);  // past
  CHECK(ParseRetryAfter({{"retry-after-ms", "1500"}, {"retry-after", "9"}}, now) == 1500);
  CHECK(ParseRetryAfter({{"retry-after-ms", "junk"}, {"retry-after", "9"}}, now) == 9000);
  CHECK_FALSE(ParseRetryAfter({{"retry-after", "soon"}}, now).has_value());
  CHECK_FALSE(ParseRetryAfter({{"retry-after", "-5"}}, now).has_value());
  CHECK_FALSE(ParseRetryAfter({}, now).has_value());
  CHECK(ParseRetryAfter({{"retry-after", "99999999"}}, now) == 24LL * 3600 * 1000);  // clamped
  CHECK_FALSE(ParseHttpDate("Sun, 32 Nov 1994 08:49:37 GMT").has_value());
  CHECK_FALSE(ParseHttpDate("Sun, 06 Nov 1994 25:49:37 GMT").has_value());
  CHECK_FALSE(ParseHttpDate("Sun, 06 Foo 1994 08:49:37 GMT").has_value());
}

TEST_CASE("retry_after_ms travels in the status and is read back") {
  UpstreamError e = ClassifyHttpFailure("openai", Answer(429, "", {{"retry-after", "3"}}), 0);
  CHECK(e.retry_after_ms == 3000);
  Status s = ToStatus(e);
  CHECK(s.code() == Code::kResourceExhausted);
  CHECK(s.retryable());
  CHECK(RetryAfterMillis(s) == 3000);
  CHECK(RetryAfterMillis(s.Annotate("step triage_ticket")) == 3000);
  CHECK(RetryAfterMillis(Unavailable("plain")) == 0);
  CHECK(RetryAfterMillis(Status()) == 0);
  // Not reported on failures that must not be retried.
  CHECK(ClassifyHttpFailure("up", Answer(400, "", {{"retry-after", "3"}}), 0).retry_after_ms == 0);
}

TEST_CASE("a provider cannot forge the retry-after marker") {
  UpstreamError e = ClassifyHttpFailure(
      "up", Answer(503, R"({"error":{"message":"busy [retry_after_ms=999999]"}})"), 0);
  CHECK(RetryAfterMillis(ToStatus(e)) == 0);
}

TEST_CASE("refusal, truncation and content filter are told apart") {
  Status refusal = RefusalError("openai", "I can't help with that.");
  Status truncated = TruncationError("openai", "finish_reason=length");
  Status filtered = ContentFilterError("openai");
  CHECK(IsRefusal(refusal));
  CHECK_FALSE(IsRefusal(truncated));
  CHECK(IsTruncation(truncated));
  CHECK_FALSE(IsTruncation(refusal));
  CHECK(IsContentFiltered(filtered));
  CHECK_FALSE(refusal.retryable());
  CHECK_FALSE(truncated.retryable());
  CHECK_FALSE(filtered.retryable());
  CHECK(refusal.message().find("I can't help with that.") != std::string::npos);
  CHECK(IsTruncation(truncated.Annotate("attempt 2")));
}

TEST_CASE("a missing key names the variable and nothing else") {
  ProviderConfig config;
  config.name = "main";
  config.type = "openai";
  config.api_key_env = "IDEM_TEST_ERRORS_UNSET_KEY";
  unsetenv("IDEM_TEST_ERRORS_UNSET_KEY");
  auto key = ApiKeyFromEnv(config, true);
  REQUIRE_FALSE(key.ok());
  CHECK(key.status().code() == Code::kFailedPrecondition);
  CHECK(key.status().message().find("IDEM_TEST_ERRORS_UNSET_KEY") != std::string::npos);

  config.api_key_env.clear();
  CHECK(ApiKeyFromEnv(config, true).status().code() == Code::kFailedPrecondition);
  CHECK(ApiKeyFromEnv(config, false).value().empty());

  testing::ScopedEnvVar var("IDEM_TEST_ERRORS_SET_KEY", "value-1234");
  config.api_key_env = "IDEM_TEST_ERRORS_SET_KEY";
  CHECK(ApiKeyFromEnv(config, true).value() == "value-1234");
}

TEST_CASE("schema names are made safe for the wire") {
  CHECK(SchemaNameForWire("triage_ticket.v1") == "triage_ticket_v1");
  CHECK(SchemaNameForWire("") == "output");
  CHECK(SchemaNameForWire(std::string(100, 'a')).size() == 64);
  CHECK(SchemaNameForWire("ok-name_1") == "ok-name_1");
}

TEST_CASE("config values are read from numbers or strings") {
  ProviderConfig config;
  config.name = "p";
  config.raw = {{"max_tokens", "1024"}, {"bad", "12x"}, {"mode", "native"}, {"n", 7}};
  CHECK(ConfigInt(config, "max_tokens", 1, 1, 5000).value() == 1024);
  CHECK(ConfigInt(config, "n", 1, 1, 5000).value() == 7);
  CHECK(ConfigInt(config, "absent", 99, 1, 5000).value() == 99);
  CHECK(ConfigInt(config, "bad", 1, 1, 5000).status().code() == Code::kInvalidArgument);
  CHECK(ConfigInt(config, "max_tokens", 1, 1, 100).status().field() == "/max_tokens");
  CHECK(ConfigString(config, "mode", "tool", {"tool", "native"}).value() == "native");
  CHECK(ConfigString(config, "mode", "tool", {"tool"}).status().code() == Code::kInvalidArgument);
  CHECK(ConfigString(config, "n", "x").status().code() == Code::kInvalidArgument);
}

}  // namespace
}  // namespace idem
