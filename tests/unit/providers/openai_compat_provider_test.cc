#include "providers/openai_compat/openai_compat_provider.h"

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

std::unique_ptr<Provider> MakeOrFail(ProviderHarness& h, const ProviderConfig& config) {
  auto made = MakeOpenAiCompatProvider(config, *h.http, h.env);
  REQUIRE(made.ok());
  return std::move(made).value();
}

TEST_CASE("OpenAI-compatible: base_url with /v1 gets /chat/completions, no key, no auth header") {
  ProviderHarness h;
  REQUIRE(h.server);
  auto provider = MakeOrFail(h, h.Config("openai_compatible", "", h.server->base_url() + "/v1"));
  h.server->Enqueue(FakeReply::Output({{"label", "bug"}, {"confidence", 1}}).WithUsage(9, 4));
  auto result = provider->Complete(TriageRequest());
  REQUIRE(result.ok());
  CHECK(result->output == Json{{"label", "bug"}, {"confidence", 1}});
  CHECK(result->input_tokens == 9);
  CHECK(result->output_tokens == 4);
  auto req = h.server->last_request();
  CHECK(req.path == "/v1/chat/completions");
  CHECK(req.Header("authorization").empty());
  CHECK(req.json["response_format"]["type"] == "json_schema");
  CHECK(req.json["response_format"]["json_schema"]["schema"] == TriageSchema());
  CHECK(req.json["response_format"]["json_schema"]["strict"] == true);
  CHECK(provider->type() == "openai_compatible");
}

TEST_CASE("OpenAI-compatible: a bare base_url gets /v1; a configured key is sent as Bearer") {
  ProviderHarness h;
  REQUIRE(h.server);
  ScopedEnvVar key("IDEM_TEST_COMPAT_KEY", kTestKey);
  ProviderConfig config =
      h.Config("openai_compatible", "IDEM_TEST_COMPAT_KEY", h.server->base_url());
  config.raw["max_tokens"] = 128;
  config.raw["headers"] = {{"X-Proxy-Route", "gpu-2"}};
  auto provider = MakeOrFail(h, config);
  h.server->Enqueue(FakeReply::Output({{"label", "bug"}}));
  REQUIRE(provider->Complete(TriageRequest()).ok());
  auto req = h.server->last_request();
  CHECK(req.path == "/v1/chat/completions");
  CHECK(req.Header("authorization") == std::string("Bearer ") + kTestKey);
  CHECK(req.json["max_tokens"] == 128);
  CHECK(req.Header("x-proxy-route") == "gpu-2");

  h.server->Enqueue(FakeReply::HttpError(401));  // echoes the key
  auto denied = provider->Complete(TriageRequest());
  REQUIRE_FALSE(denied.ok());
  CHECK(denied.status().code() == Code::kUnauthenticated);
  CHECK(denied.status().message().find(kTestKey) == std::string::npos);
}

TEST_CASE(
    "OpenAI-compatible: a gateway key in a header comes from ${VAR}, and neither it nor a literal "
    "one reaches an error") {
  ProviderHarness h;
  REQUIRE(h.server);
  ScopedEnvVar key("IDEM_TEST_GW_KEY", kTestKey);
  ProviderConfig config = h.Config("openai_compatible", "", h.server->base_url());
  config.raw["headers"] = {{"x-api-key", "${IDEM_TEST_GW_KEY}"},
                           {"X-Route", "eu-${IDEM_TEST_GW_KEY}"}};
  auto provider = MakeOrFail(h, config);
  h.server->Enqueue(FakeReply::HttpError(401));  // echoes the x-api-key it got
  auto denied = provider->Complete(TriageRequest());
  REQUIRE_FALSE(denied.ok());
  CHECK(h.server->last_request().Header("x-api-key") == kTestKey);
  CHECK(h.server->last_request().Header("x-route") == std::string("eu-") + kTestKey);
  CHECK(denied.status().code() == Code::kUnauthenticated);
  CHECK(denied.status().message().find(kTestKey) == std::string::npos);
  CHECK(denied.status().message().find("[redacted]") != std::string::npos);

  // Written into the file: still a key by its header's name.
  config.raw["headers"] = {{"x-api-key", "gw-literal-secret-9999"}};
  auto literal = MakeOrFail(h, config);
  h.server->Enqueue(FakeReply::HttpError(401));
  auto refused = literal->Complete(TriageRequest());
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().message().find("gw-literal-secret-9999") == std::string::npos);

  // An unset variable fails the start, naming it and not guessing.
  config.raw["headers"] = {{"x-api-key", "${IDEM_TEST_GW_KEY_UNSET}"}};
  auto unset = MakeOpenAiCompatProvider(config, *h.http, h.env);
  CHECK(unset.status().code() == Code::kFailedPrecondition);
  CHECK(unset.status().message().find("IDEM_TEST_GW_KEY_UNSET") != std::string::npos);
}

TEST_CASE("OpenAI-compatible: faults classify as for OpenAI") {
  ProviderHarness h;
  REQUIRE(h.server);
  auto provider = MakeOrFail(h, h.Config("openai_compatible", "", h.server->base_url() + "/v1"));
  h.server->Enqueue(FakeReply::HttpError(503));
  CHECK(provider->Complete(TriageRequest()).status().retryable());
  h.server->Enqueue(FakeReply::Truncated());
  CHECK(IsTruncation(provider->Complete(TriageRequest()).status()));
  h.server->Enqueue(FakeReply::CutMidBody());
  CHECK(provider->Complete(TriageRequest()).status().code() == Code::kUnavailable);
  h.server->Enqueue(FakeReply::Text("not json at all"));
  auto text = provider->Complete(TriageRequest());
  REQUIRE(text.ok());
  CHECK(text->output.is_null());
}

TEST_CASE("OpenAI-compatible: base_url is required for the openai api; api must be known") {
  ProviderHarness h;
  auto missing = MakeOpenAiCompatProvider(h.Config("openai_compatible", "", ""), *h.http, h.env);
  CHECK(missing.status().code() == Code::kFailedPrecondition);
  CHECK(missing.status().message().find("base_url") != std::string::npos);

  ProviderConfig config = h.Config("openai_compatible", "", "http://127.0.0.1:1");
  config.raw["api"] = "grpc";
  CHECK(MakeOpenAiCompatProvider(config, *h.http, h.env).status().code() == Code::kInvalidArgument);

  unsetenv("IDEM_TEST_COMPAT_MISSING");
  auto no_key = MakeOpenAiCompatProvider(
      h.Config("openai_compatible", "IDEM_TEST_COMPAT_MISSING", "http://127.0.0.1:1"), *h.http,
      h.env);
  CHECK(no_key.status().code() == Code::kFailedPrecondition);
  CHECK(no_key.status().message().find("IDEM_TEST_COMPAT_MISSING") != std::string::npos);
}

ProviderConfig OllamaConfig(const ProviderHarness& h, std::string base_url) {
  ProviderConfig config = h.Config("openai_compatible", "", std::move(base_url));
  config.raw["api"] = "ollama";
  return config;
}

TEST_CASE("Ollama native: /api/chat with the schema as format, stream off") {
  ProviderHarness h;
  REQUIRE(h.server);
  ProviderConfig config = OllamaConfig(h, h.server->base_url() + "/v1");  // /v1 is dropped
  config.raw["max_tokens"] = 300;
  auto provider = MakeOrFail(h, config);
  h.server->Enqueue(
      FakeReply::Output({{"label", "billing"}, {"confidence", 0.7}}).WithUsage(26, 11));
  auto result = provider->Complete(TriageRequest());
  REQUIRE(result.ok());
  CHECK(result->output == Json{{"label", "billing"}, {"confidence", 0.7}});
  CHECK(result->input_tokens == 26);
  CHECK(result->output_tokens == 11);
  CHECK(result->finish_reason == "stop");
  auto req = h.server->last_request();
  CHECK(req.path == "/api/chat");
  const Json& body = req.json;
  CHECK(body["model"] == "model-x");
  CHECK(body["format"] == TriageSchema());
  CHECK(body["stream"] == false);
  CHECK(body["options"] == Json{{"temperature", 0.2}, {"num_predict", 300}});
  REQUIRE(body["messages"].size() == 2);
  CHECK(body["messages"][0]["role"] == "system");
  CHECK(body["messages"][1]["content"] == "Ticket #123: I was charged twice.");
}

TEST_CASE(
    "a secret in base_url (userinfo, its Basic credential, a path segment) stays out of "
    "errors and answers") {
  ProviderHarness h;
  REQUIRE(h.server);
  const std::string host = h.server->base_url().substr(std::string("http://").size());
  // base64("pu:PROVURLPASS-1234"), what libcurl sends for the userinfo.
  const std::string basic = "cHU6UFJPVlVSTFBBU1MtMTIzNA==";
  auto provider = MakeOrFail(
      h, OllamaConfig(h, "http://pu:PROVURLPASS-1234@" + host + "/PROVPATHSECRETabcdefgh"));
  // An upstream that echoes what it got, as a proxy in front of Ollama may.
  h.server->Enqueue(FakeReply::HttpError(
      401, "bad credentials: Basic " + basic + " (PROVURLPASS-1234) for /PROVPATHSECRETabcdefgh"));
  auto denied = provider->Complete(TriageRequest());
  REQUIRE_FALSE(denied.ok());
  CHECK(h.server->last_request().Header("authorization") == "Basic " + basic);
  const std::string said = denied.status().ToString();
  CHECK(said.find(basic) == std::string::npos);
  CHECK(said.find("PROVURLPASS") == std::string::npos);
  CHECK(said.find("PROVPATHSECRET") == std::string::npos);
  CHECK(said.find("bad credentials") != std::string::npos);

  h.server->Enqueue(FakeReply::Output({{"label", "at /PROVPATHSECRETabcdefgh"}}));
  auto answered = provider->Complete(TriageRequest());
  REQUIRE(answered.ok());
  CHECK(answered->output == Json{{"label", "at /[redacted]"}});
}

TEST_CASE("Ollama native: truncation, errors and bad output") {
  ProviderHarness h;
  REQUIRE(h.server);
  auto provider = MakeOrFail(h, OllamaConfig(h, h.server->base_url()));

  h.server->Enqueue(FakeReply::Truncated());
  auto truncated = provider->Complete(TriageRequest());
  CHECK(IsTruncation(truncated.status()));
  CHECK(truncated.status().message().find("done_reason=length") != std::string::npos);

  h.server->Enqueue(FakeReply::HttpError(404, "model \"model-x\" not found, try pulling it first"));
  auto not_found = provider->Complete(TriageRequest());
  CHECK(not_found.status().code() == Code::kNotFound);
  CHECK_FALSE(not_found.status().retryable());
  CHECK(not_found.status().message().find("try pulling it first") != std::string::npos);

  h.server->Enqueue(FakeReply::HttpError(503).WithHeader("retry-after", "2"));
  auto busy = provider->Complete(TriageRequest());
  CHECK(busy.status().retryable());
  CHECK(RetryAfterMillis(busy.status()) == 2000);

  h.server->Enqueue(FakeReply::Text("{\"label\": "));
  auto bad = provider->Complete(TriageRequest());
  REQUIRE(bad.ok());
  CHECK(bad->output.is_null());

  h.server->Enqueue(FakeReply::MalformedBody());
  auto malformed = provider->Complete(TriageRequest());
  CHECK(malformed.status().code() == Code::kUnavailable);
  CHECK(malformed.status().retryable());

  h.server->Enqueue(FakeReply::Output({{"label", "x"}}).WithLatency(3'000));
  ProviderRequest quick = TriageRequest();
  quick.timeout_ms = 150;
  auto slow = provider->Complete(quick);
  CHECK(slow.status().code() == Code::kDeadlineExceeded);
  CHECK(slow.status().retryable());
}

}  // namespace
}  // namespace idem
