#include "providers/openai/openai_provider.h"

#include <doctest/doctest.h>

#include <ctime>

#include "providers/errors.h"
#include "tests/unit/providers/provider_test_support.h"

namespace idem {
namespace {

using fakes::FakeReply;
using testing::kTestKey;
using testing::ProviderHarness;
using testing::ScopedEnvVar;
using testing::TriageRequest;
using testing::TriageSchema;

constexpr char kKeyVar[] = "IDEM_TEST_OPENAI_KEY";

struct OpenAiFixture : ProviderHarness {
  ScopedEnvVar key{kKeyVar, kTestKey};
  std::unique_ptr<Provider> provider;

  OpenAiFixture() {
    REQUIRE(server);
    auto made =
        MakeOpenAiProvider(Config("openai", kKeyVar, server->base_url() + "/v1/"), *http, env);
    REQUIRE(made.ok());
    provider = std::move(made).value();
  }

  Status Fail(FakeReply reply) {
    server->Enqueue(std::move(reply));
    auto result = provider->Complete(TriageRequest());
    REQUIRE_FALSE(result.ok());
    CHECK(result.status().ToString().find(kTestKey) == std::string::npos);
    return result.status();
  }
};

std::string HttpDate(int64_t epoch_ms) {
  time_t seconds = static_cast<time_t>(epoch_ms / 1000);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char buf[64];
  strftime(buf, sizeof buf, "%a, %d %b %Y %H:%M:%S GMT", &tm);
  return buf;
}

TEST_CASE_FIXTURE(OpenAiFixture, "temperature is sent only when the step sets it") {
  ProviderRequest request = TriageRequest();
  request.temperature.reset();
  server->Enqueue(FakeReply::Output({{"label", "billing"}, {"confidence", 0.9}}));
  REQUIRE(provider->Complete(request).ok());
  CHECK_FALSE(server->last_request().json.contains("temperature"));
}

TEST_CASE_FIXTURE(OpenAiFixture, "the request is a strict json_schema chat completion") {
  server->Enqueue(FakeReply::Output({{"label", "billing"}, {"confidence", 0.9}}));
  REQUIRE(provider->Complete(TriageRequest()).ok());
  auto req = server->last_request();
  CHECK(req.method == "POST");
  CHECK(req.path == "/v1/chat/completions");
  CHECK(req.Header("authorization") == std::string("Bearer ") + kTestKey);
  CHECK(req.Header("content-type") == "application/json");
  const Json& body = req.json;
  CHECK(body["model"] == "model-x");
  CHECK(body["temperature"] == 0.2);
  REQUIRE(body["messages"].size() == 2);
  CHECK(body["messages"][0] ==
        Json{{"role", "system"}, {"content", "You triage support tickets."}});
  CHECK(body["messages"][1] ==
        Json{{"role", "user"}, {"content", "Ticket #123: I was charged twice."}});
  const Json& format = body["response_format"];
  CHECK(format["type"] == "json_schema");
  CHECK(format["json_schema"]["name"] == "triage_ticket_v1");
  CHECK(format["json_schema"]["strict"] == true);
  CHECK(format["json_schema"]["schema"] == TriageSchema());
  CHECK_FALSE(body.contains("tools"));
  CHECK_FALSE(body.contains("max_completion_tokens"));
}

TEST_CASE_FIXTURE(OpenAiFixture, "tools are sent as functions and repair feedback as a user turn") {
  server->Enqueue(FakeReply::Output({{"label", "bug"}, {"confidence", 0.5}}));
  ProviderRequest request = TriageRequest();
  request.system_prompt.clear();
  request.tools = Json::array({{{"name", "lookup_order"},
                                {"description", "Find an order"},
                                {"parameters", {{"type", "object"}}}}});
  request.repair_feedback = "/confidence: must be <= 1";
  REQUIRE(provider->Complete(request).ok());
  const Json body = server->last_request().json;
  REQUIRE(body["messages"].size() == 2);
  CHECK(body["messages"][0]["role"] == "user");
  CHECK(body["messages"][1] == Json{{"role", "user"}, {"content", "/confidence: must be <= 1"}});
  CHECK(body["tools"] == Json::array({{{"type", "function"},
                                       {"function",
                                        {{"name", "lookup_order"},
                                         {"description", "Find an order"},
                                         {"parameters", {{"type", "object"}}}}}}}));
}

TEST_CASE_FIXTURE(OpenAiFixture, "a success returns the output, the raw text and the usage") {
  server->Enqueue(
      FakeReply::Output({{"label", "billing"}, {"confidence", 0.9}}).WithUsage(120, 15, 64));
  auto result = provider->Complete(TriageRequest());
  REQUIRE(result.ok());
  CHECK(result->output == Json{{"label", "billing"}, {"confidence", 0.9}});
  CHECK(Json::parse(result->raw_text) == result->output);
  CHECK(result->input_tokens == 120);
  CHECK(result->output_tokens == 15);
  CHECK(result->cached_input_tokens == 64);
  CHECK(result->finish_reason == "stop");
  CHECK(result->retry_after_ms == 0);
  CHECK(provider->type() == "openai");
}

TEST_CASE_FIXTURE(OpenAiFixture, "output that is not JSON comes back verbatim with a null output") {
  server->Enqueue(FakeReply::Text("{\"label\": \"billing\", "));
  auto result = provider->Complete(TriageRequest());
  REQUIRE(result.ok());
  CHECK(result->raw_text == "{\"label\": \"billing\", ");
  CHECK(result->output.is_null());
}

TEST_CASE_FIXTURE(OpenAiFixture,
                  "tool calls beside an empty content are the raw text the decide engine judges") {
  const Json calls = Json::array(
      {{{"id", "call_1"},
        {"type", "function"},
        {"function", {{"name", "lookup_order"}, {"arguments", "{\"order_id\":\"A-1\"}"}}}}});
  for (const Json& content : {Json(""), Json(nullptr)}) {
    CAPTURE(content.dump());
    const Json body = {
        {"id", "chatcmpl-1"},
        {"object", "chat.completion"},
        {"choices",
         {{{"index", 0},
           {"message", {{"role", "assistant"}, {"content", content}, {"tool_calls", calls}}},
           {"finish_reason", "tool_calls"}}}},
        {"usage", {{"prompt_tokens", 10}, {"completion_tokens", 5}}}};
    server->Enqueue(FakeReply::Raw(200, body.dump()));
    auto result = provider->Complete(TriageRequest());
    REQUIRE(result.ok());
    CHECK(Json::parse(result->raw_text) == calls);
  }
}

TEST_CASE_FIXTURE(OpenAiFixture,
                  "schema-violating output is returned for the decide engine to judge") {
  server->Enqueue(FakeReply::SchemaViolating());
  auto result = provider->Complete(TriageRequest());
  REQUIRE(result.ok());
  CHECK(result->output == Json{{"unexpected", true}});
}

TEST_CASE_FIXTURE(OpenAiFixture, "429 with Retry-After is retryable and carries the delay") {
  SUBCASE("delta-seconds") {
    Status s = Fail(FakeReply::RateLimited("3"));
    CHECK(s.code() == Code::kResourceExhausted);
    CHECK(s.retryable());
    CHECK(RetryAfterMillis(s) == 3000);
  }
  SUBCASE("HTTP-date, against the injected clock") {
    Status s = Fail(FakeReply::RateLimited(HttpDate(env.WallMillis() + 20'000)));
    CHECK(s.retryable());
    CHECK(RetryAfterMillis(s) == 20'000);
  }
  SUBCASE("retry-after-ms") {
    Status s = Fail(FakeReply::RateLimitedMs(1500));
    CHECK(RetryAfterMillis(s) == 1500);
  }
  SUBCASE("no header") {
    Status s = Fail(FakeReply::HttpError(429));
    CHECK(s.retryable());
    CHECK(RetryAfterMillis(s) == 0);
  }
}

TEST_CASE_FIXTURE(OpenAiFixture, "insufficient_quota is not retryable") {
  Status s = Fail(FakeReply::QuotaExhausted().WithHeader("retry-after", "1"));
  CHECK(s.code() == Code::kResourceExhausted);
  CHECK_FALSE(s.retryable());
  CHECK(RetryAfterMillis(s) == 0);
  CHECK(s.message().find("exceeded your current quota") != std::string::npos);
}

TEST_CASE_FIXTURE(OpenAiFixture, "server errors are retryable, client errors are not") {
  struct Row {
    int status;
    Code code;
    bool retryable;
  };
  const Row rows[] = {{500, Code::kUnavailable, true},       {502, Code::kUnavailable, true},
                      {503, Code::kUnavailable, true},       {504, Code::kDeadlineExceeded, true},
                      {529, Code::kUnavailable, true},       {408, Code::kDeadlineExceeded, true},
                      {400, Code::kInvalidArgument, false},  {401, Code::kUnauthenticated, false},
                      {403, Code::kPermissionDenied, false}, {404, Code::kNotFound, false},
                      {422, Code::kInvalidArgument, false}};
  for (const Row& row : rows) {
    CAPTURE(row.status);
    Status s = Fail(FakeReply::HttpError(row.status, "scripted failure"));
    CHECK(s.code() == row.code);
    CHECK(s.retryable() == row.retryable);
    CHECK(s.message().find("scripted failure") != std::string::npos);
    CHECK(s.message().find("test-openai") == 0);
  }
}

TEST_CASE_FIXTURE(OpenAiFixture,
                  "the API key never appears in a status, even when a 401 echoes it") {
  Status s = Fail(FakeReply::HttpError(401));  // the fake echoes the presented key
  CHECK(s.code() == Code::kUnauthenticated);
  CHECK(s.message().find("[redacted]") != std::string::npos);
  for (FakeReply reply :
       {FakeReply::HttpError(400, "bad key {key}"), FakeReply::HttpError(500, "{key}"),
        FakeReply::Raw(403, "{key}"), FakeReply::CutMidBody(), FakeReply::MalformedBody(),
        FakeReply::Refusal("no"), FakeReply::Truncated()}) {
    server->Enqueue(reply);
    auto result = provider->Complete(TriageRequest());
    REQUIRE_FALSE(result.ok());
    CHECK(result.status().ToString().find(kTestKey) == std::string::npos);
  }
}

TEST_CASE_FIXTURE(OpenAiFixture, "a refusal is a non-retryable failure with the refusal text") {
  Status s = Fail(FakeReply::Refusal("I'm sorry, I can't help with that request."));
  CHECK(IsRefusal(s));
  CHECK(s.code() == Code::kFailedPrecondition);
  CHECK_FALSE(s.retryable());
  CHECK(s.message().find("I'm sorry, I can't help with that request.") != std::string::npos);
}

TEST_CASE_FIXTURE(OpenAiFixture,
                  "a refusal or an answer that repeats the key has it redacted before it is read") {
  Status refused = Fail(FakeReply::Refusal(std::string("I will not use the key ") + kTestKey));
  CHECK(IsRefusal(refused));
  CHECK(refused.message().find("I will not use the key [redacted]") != std::string::npos);

  server->Enqueue(FakeReply::Output({{"label", std::string("key=") + kTestKey}}));
  auto echoed = provider->Complete(TriageRequest());
  REQUIRE(echoed.ok());
  CHECK(echoed->output == Json{{"label", "key=[redacted]"}});
  CHECK(echoed->raw_text.find(kTestKey) == std::string::npos);
}

TEST_CASE_FIXTURE(OpenAiFixture, "finish_reason length and content_filter are failures") {
  Status truncated = Fail(FakeReply::Truncated());
  CHECK(IsTruncation(truncated));
  CHECK_FALSE(truncated.retryable());
  CHECK(truncated.message().find("finish_reason=length") != std::string::npos);
  Status filtered = Fail(FakeReply::ContentFilter());
  CHECK(IsContentFiltered(filtered));
  CHECK_FALSE(filtered.retryable());
}

TEST_CASE_FIXTURE(OpenAiFixture, "a broken answer body is a retryable Unavailable") {
  SUBCASE("not JSON") {
    Status s = Fail(FakeReply::MalformedBody());
    CHECK(s.code() == Code::kUnavailable);
    CHECK(s.retryable());
  }
  SUBCASE("JSON without choices") {
    Status s = Fail(FakeReply::Raw(200, R"({"id":"x","object":"chat.completion","choices":[]})"));
    CHECK(s.code() == Code::kUnavailable);
    CHECK(s.retryable());
  }
  SUBCASE("cut mid-body") {
    Status s = Fail(FakeReply::CutMidBody());
    CHECK(s.code() == Code::kUnavailable);
    CHECK(s.retryable());
  }
}

TEST_CASE_FIXTURE(OpenAiFixture, "an answer slower than the step timeout is DeadlineExceeded") {
  server->Enqueue(FakeReply::Output({{"label", "bug"}}).WithLatency(3'000));
  ProviderRequest request = TriageRequest();
  request.timeout_ms = 150;
  auto result = provider->Complete(request);
  REQUIRE_FALSE(result.ok());
  CHECK(result.status().code() == Code::kDeadlineExceeded);
  CHECK(result.status().retryable());
}

TEST_CASE("OpenAI: a server that is down is Unavailable and retryable") {
  ProviderHarness h;
  REQUIRE(h.server);
  std::string url = h.server->base_url() + "/v1";
  h.server.reset();
  ScopedEnvVar key(kKeyVar, kTestKey);
  auto provider = MakeOpenAiProvider(h.Config("openai", kKeyVar, url), *h.http, h.env);
  REQUIRE(provider.ok());
  auto result = (*provider)->Complete(TriageRequest());
  REQUIRE_FALSE(result.ok());
  CHECK(result.status().code() == Code::kUnavailable);
  CHECK(result.status().retryable());
  CHECK(result.status().message().find(kTestKey) == std::string::npos);
}

TEST_CASE("OpenAI: a missing key variable is a clear error that names the variable") {
  ProviderHarness h;
  unsetenv("IDEM_TEST_OPENAI_MISSING");
  auto provider = MakeOpenAiProvider(
      h.Config("openai", "IDEM_TEST_OPENAI_MISSING", "http://127.0.0.1:1/v1"), *h.http, h.env);
  REQUIRE_FALSE(provider.ok());
  CHECK(provider.status().code() == Code::kFailedPrecondition);
  CHECK(provider.status().message().find("IDEM_TEST_OPENAI_MISSING") != std::string::npos);

  ScopedEnvVar empty("IDEM_TEST_OPENAI_EMPTY", "");
  auto empty_key = MakeOpenAiProvider(
      h.Config("openai", "IDEM_TEST_OPENAI_EMPTY", "http://127.0.0.1:1/v1"), *h.http, h.env);
  CHECK(empty_key.status().code() == Code::kFailedPrecondition);

  auto no_env = MakeOpenAiProvider(h.Config("openai", "", ""), *h.http, h.env);
  CHECK(no_env.status().code() == Code::kFailedPrecondition);
  CHECK(no_env.status().message().find("api_key_env") != std::string::npos);

  // A line break inside would start another header line to the provider.
  ScopedEnvVar split("IDEM_TEST_OPENAI_SPLIT", "sk-abc\r\nX-Injected: 1");
  auto injected = MakeOpenAiProvider(
      h.Config("openai", "IDEM_TEST_OPENAI_SPLIT", "http://127.0.0.1:1/v1"), *h.http, h.env);
  CHECK(injected.status().code() == Code::kFailedPrecondition);
  CHECK(injected.status().message().find("X-Injected") == std::string::npos);
  // A trailing one (echo "$KEY" > file) is dropped.
  ScopedEnvVar trailing("IDEM_TEST_OPENAI_TRAILING", "sk-abc-123456\n");
  auto fine = MakeOpenAiProvider(
      h.Config("openai", "IDEM_TEST_OPENAI_TRAILING", "http://127.0.0.1:1/v1"), *h.http, h.env);
  CHECK(fine.ok());
}

TEST_CASE("OpenAI: max_tokens from config is sent as max_completion_tokens") {
  ProviderHarness h;
  REQUIRE(h.server);
  ScopedEnvVar key(kKeyVar, kTestKey);
  ProviderConfig config = h.Config("openai", kKeyVar, h.server->base_url() + "/v1");
  config.raw["max_tokens"] = 256;
  auto provider = MakeOpenAiProvider(config, *h.http, h.env);
  REQUIRE(provider.ok());
  h.server->Enqueue(FakeReply::Output({{"label", "bug"}}));
  REQUIRE((*provider)->Complete(TriageRequest()).ok());
  CHECK(h.server->last_request().json["max_completion_tokens"] == 256);

  config.raw["max_tokens"] = "many";
  CHECK(MakeOpenAiProvider(config, *h.http, h.env).status().code() == Code::kInvalidArgument);
}

TEST_CASE("OpenAI: organization and extra headers from config are sent; bad headers rejected") {
  ProviderHarness h;
  REQUIRE(h.server);
  ScopedEnvVar key(kKeyVar, kTestKey);
  ProviderConfig config = h.Config("openai", kKeyVar, h.server->base_url() + "/v1");
  config.raw["organization"] = "org-123";
  config.raw["headers"] = {{"X-Gateway-Route", "eu"}};
  auto provider = MakeOpenAiProvider(config, *h.http, h.env);
  REQUIRE(provider.ok());
  h.server->Enqueue(FakeReply::Output({{"label", "bug"}}));
  REQUIRE((*provider)->Complete(TriageRequest()).ok());
  auto req = h.server->last_request();
  CHECK(req.Header("openai-organization") == "org-123");
  CHECK(req.Header("x-gateway-route") == "eu");
  CHECK(req.Header("authorization") == std::string("Bearer ") + kTestKey);

  config.raw["headers"] = {{"X-Bad", "line\r\nInjected: yes"}};
  auto bad = MakeOpenAiProvider(config, *h.http, h.env);
  CHECK(bad.status().code() == Code::kInvalidArgument);
  CHECK(bad.status().message().find("Injected") == std::string::npos);
  config.raw["headers"] = "X-A: b";
  CHECK(MakeOpenAiProvider(config, *h.http, h.env).status().code() == Code::kInvalidArgument);
}

}  // namespace
}  // namespace idem
