#include "providers/anthropic/anthropic_provider.h"

#include <doctest/doctest.h>

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

constexpr char kKeyVar[] = "IDEM_TEST_ANTHROPIC_KEY";

struct AnthropicFixture : ProviderHarness {
  ScopedEnvVar key{kKeyVar, kTestKey};
  std::unique_ptr<Provider> provider;

  explicit AnthropicFixture(Json extra = Json::object()) {
    REQUIRE(server);
    ProviderConfig config = Config("anthropic", kKeyVar, server->base_url());
    config.raw.update(extra);
    auto made = MakeAnthropicProvider(config, *http, env);
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

struct NativeFixture : AnthropicFixture {
  NativeFixture() : AnthropicFixture(Json{{"structured_output", "native"}}) {}
};

TEST_CASE_FIXTURE(AnthropicFixture, "the request forces the output tool with the schema") {
  server->Enqueue(FakeReply::Output({{"label", "billing"}, {"confidence", 0.9}}));
  REQUIRE(provider->Complete(TriageRequest()).ok());
  auto req = server->last_request();
  CHECK(req.path == "/v1/messages");
  CHECK(req.Header("x-api-key") == kTestKey);
  CHECK(req.Header("anthropic-version") == "2023-06-01");
  CHECK(req.Header("content-type") == "application/json");
  CHECK(req.Header("authorization").empty());
  CHECK(req.Header("anthropic-beta").empty());
  const Json& body = req.json;
  CHECK(body["model"] == "model-x");
  CHECK(body["max_tokens"] == 4096);
  CHECK(body["temperature"] == 0.2);
  CHECK(body["system"] == "You triage support tickets.");
  CHECK(body["messages"] ==
        Json::array({{{"role", "user"}, {"content", "Ticket #123: I was charged twice."}}}));
  REQUIRE(body["tools"].size() == 1);
  CHECK(body["tools"][0]["name"] == "triage_ticket_v1");
  CHECK(body["tools"][0]["input_schema"] == TriageSchema());
  CHECK(body["tool_choice"] == Json{{"type", "tool"}, {"name", "triage_ticket_v1"}});
  CHECK_FALSE(body.contains("output_config"));
}

TEST_CASE_FIXTURE(AnthropicFixture, "the tool_use input is the output; usage counts cache reads") {
  server->Enqueue(
      FakeReply::Output({{"label", "billing"}, {"confidence", 0.9}}).WithUsage(100, 20, 30));
  auto result = provider->Complete(TriageRequest());
  REQUIRE(result.ok());
  CHECK(result->output == Json{{"label", "billing"}, {"confidence", 0.9}});
  CHECK(Json::parse(result->raw_text) == result->output);
  CHECK(result->finish_reason == "tool_use");
  CHECK(result->input_tokens == 130);  // input_tokens + cache reads + cache writes
  CHECK(result->cached_input_tokens == 30);
  CHECK(result->output_tokens == 20);
  CHECK(provider->type() == "anthropic");
}

TEST_CASE_FIXTURE(AnthropicFixture,
                  "user tools go along with the output tool; repair is a user turn") {
  server->Enqueue(FakeReply::Output({{"label", "bug"}, {"confidence", 0.1}}));
  ProviderRequest request = TriageRequest();
  request.tools =
      Json::array({{{"type", "function"},
                    {"function", {{"name", "lookup"}, {"parameters", {{"type", "object"}}}}}}});
  request.repair_feedback = "label: must be one of billing, bug, other";
  REQUIRE(provider->Complete(request).ok());
  const Json body = server->last_request().json;
  REQUIRE(body["tools"].size() == 2);
  CHECK(body["tools"][1] == Json{{"name", "lookup"}, {"input_schema", {{"type", "object"}}}});
  REQUIRE(body["messages"].size() == 2);
  CHECK(body["messages"][1]["content"] == "label: must be one of billing, bug, other");
}

TEST_CASE_FIXTURE(NativeFixture, "native structured output sends output_config.format") {
  server->Enqueue(FakeReply::Output({{"label", "other"}, {"confidence", 0.3}}));
  auto result = provider->Complete(TriageRequest());
  REQUIRE(result.ok());
  CHECK(result->output == Json{{"label", "other"}, {"confidence", 0.3}});
  CHECK(result->finish_reason == "end_turn");
  const Json body = server->last_request().json;
  CHECK(body["output_config"] ==
        Json{{"format", {{"type", "json_schema"}, {"schema", TriageSchema()}}}});
  CHECK_FALSE(body.contains("tool_choice"));
  CHECK_FALSE(body.contains("tools"));
}

TEST_CASE_FIXTURE(NativeFixture,
                  "native mode: text that is not JSON comes back with a null output") {
  server->Enqueue(FakeReply::Text("Sure! Here is the JSON: {"));
  auto result = provider->Complete(TriageRequest());
  REQUIRE(result.ok());
  CHECK(result->raw_text == "Sure! Here is the JSON: {");
  CHECK(result->output.is_null());
}

TEST_CASE_FIXTURE(AnthropicFixture,
                  "529 overloaded and 5xx are retryable; 429 carries Retry-After") {
  Status overloaded = Fail(FakeReply::Overloaded());
  CHECK(overloaded.code() == Code::kUnavailable);
  CHECK(overloaded.retryable());
  CHECK(overloaded.message().find("overloaded_error") != std::string::npos);

  Status limited = Fail(FakeReply::RateLimited("7"));
  CHECK(limited.code() == Code::kResourceExhausted);
  CHECK(limited.retryable());
  CHECK(RetryAfterMillis(limited) == 7000);

  Status server_error = Fail(FakeReply::HttpError(500));
  CHECK(server_error.retryable());
  CHECK(server_error.message().find("api_error") != std::string::npos);

  Status bad = Fail(FakeReply::HttpError(400, "messages: field required"));
  CHECK(bad.code() == Code::kInvalidArgument);
  CHECK_FALSE(bad.retryable());
  CHECK(bad.message().find("messages: field required") != std::string::npos);
}

TEST_CASE_FIXTURE(AnthropicFixture, "a 401 that echoes the x-api-key does not leak it") {
  Status s = Fail(FakeReply::HttpError(401, "invalid x-api-key: {key}"));
  CHECK(s.code() == Code::kUnauthenticated);
  CHECK_FALSE(s.retryable());
  CHECK(s.message().find("[redacted]") != std::string::npos);
}

TEST_CASE_FIXTURE(AnthropicFixture, "stop_reason max_tokens and refusal are failures") {
  Status truncated = Fail(FakeReply::Truncated());
  CHECK(IsTruncation(truncated));
  CHECK(truncated.message().find("stop_reason=max_tokens") != std::string::npos);
  Status refused = Fail(FakeReply::Refusal("I won't process this."));
  CHECK(IsRefusal(refused));
  CHECK_FALSE(refused.retryable());
  CHECK(refused.message().find("I won't process this.") != std::string::npos);
}

TEST_CASE_FIXTURE(AnthropicFixture, "a refusal says why from stop_details") {
  Status refused = Fail(FakeReply::Raw(200, R"({"type":"message","role":"assistant",
      "content":[],"stop_reason":"refusal",
      "stop_details":{"type":"refusal","category":"cyber",
                      "explanation":"the request asks for an exploit"}})"));
  CHECK(IsRefusal(refused));
  CHECK_FALSE(refused.retryable());
  CHECK(refused.message().find("category cyber: the request asks for an exploit") !=
        std::string::npos);

  // Both may be null; the answer's text still counts.
  Status bare = Fail(FakeReply::Raw(200, R"({"type":"message","role":"assistant",
      "content":[{"type":"text","text":"I can't help with that."}],"stop_reason":"refusal",
      "stop_details":{"type":"refusal","category":null,"explanation":null}})"));
  CHECK(IsRefusal(bare));
  CHECK(bare.message().find("I can't help with that.") != std::string::npos);
}

TEST_CASE_FIXTURE(AnthropicFixture, "a refusal that quotes the key has it redacted") {
  Status refused = Fail(FakeReply::Raw(200, std::string(R"({"type":"message","role":"assistant",
      "content":[{"type":"text","text":"the key )") +
                                                kTestKey + R"( is not mine"}],
      "stop_reason":"refusal","stop_details":{"type":"refusal","category":"cyber",
      "explanation":"asked to use )" + kTestKey +
                                                R"("}})"));
  CHECK(IsRefusal(refused));
  CHECK(refused.message().find("asked to use [redacted]") != std::string::npos);
  CHECK(refused.message().find("the key [redacted] is not mine") != std::string::npos);
}

TEST_CASE_FIXTURE(AnthropicFixture, "temperature is sent only when the step sets it") {
  ProviderRequest request = TriageRequest();
  request.temperature.reset();
  server->Enqueue(FakeReply::Output({{"label", "billing"}, {"confidence", 0.9}}));
  REQUIRE(provider->Complete(request).ok());
  CHECK_FALSE(server->last_request().json.contains("temperature"));
  request.temperature = 0;
  server->Enqueue(FakeReply::Output({{"label", "billing"}, {"confidence", 0.9}}));
  REQUIRE(provider->Complete(request).ok());
  CHECK(server->last_request().json["temperature"] == 0);
}

TEST_CASE_FIXTURE(AnthropicFixture, "broken answers are retryable Unavailable") {
  CHECK(Fail(FakeReply::MalformedBody()).code() == Code::kUnavailable);
  CHECK(Fail(FakeReply::CutMidBody()).retryable());
  Status not_message = Fail(FakeReply::Raw(200, R"({"type":"completion"})"));
  CHECK(not_message.code() == Code::kUnavailable);
  CHECK(not_message.retryable());
}

TEST_CASE("Anthropic: config is checked and the key is required") {
  ProviderHarness h;
  unsetenv("IDEM_TEST_ANTHROPIC_MISSING");
  auto missing = MakeAnthropicProvider(h.Config("anthropic", "IDEM_TEST_ANTHROPIC_MISSING", ""),
                                       *h.http, h.env);
  CHECK(missing.status().code() == Code::kFailedPrecondition);
  CHECK(missing.status().message().find("IDEM_TEST_ANTHROPIC_MISSING") != std::string::npos);

  ScopedEnvVar key(kKeyVar, kTestKey);
  ProviderConfig config = h.Config("anthropic", kKeyVar, "");
  config.raw["structured_output"] = "json_mode";
  auto bad_mode = MakeAnthropicProvider(config, *h.http, h.env);
  CHECK(bad_mode.status().code() == Code::kInvalidArgument);
  CHECK(bad_mode.status().field() == "/structured_output");
  CHECK(bad_mode.status().message().find(kTestKey) == std::string::npos);
}

TEST_CASE("Anthropic: max_tokens (a YAML string or a number) and extra headers from config") {
  ProviderHarness h;
  REQUIRE(h.server);
  ScopedEnvVar key(kKeyVar, kTestKey);
  ProviderConfig config = h.Config("anthropic", kKeyVar, h.server->base_url() + "/");
  config.raw["max_tokens"] = "1024";
  config.raw["headers"] = {{"X-Gateway", "a"}};
  auto provider = MakeAnthropicProvider(config, *h.http, h.env);
  REQUIRE(provider.ok());
  h.server->Enqueue(FakeReply::Output({{"label", "bug"}}));
  REQUIRE((*provider)->Complete(TriageRequest()).ok());
  CHECK(h.server->last_request().json["max_tokens"] == 1024);
  CHECK(h.server->last_request().path == "/v1/messages");
  CHECK(h.server->last_request().Header("x-gateway") == "a");
}

}  // namespace
}  // namespace idem
