// The request bodies the adapters really send, checked against the
// providers' published request schemas (transcribed into testdata/, each
// naming its source), so that a field the API does not define, a removed
// one, or a value out of its range fails here rather than in production.
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>

#include "daemon/core/json.h"
#include "daemon/core/json_schema.h"
#include "providers/anthropic/anthropic_provider.h"
#include "providers/openai/openai_provider.h"
#include "providers/openai_compat/openai_compat_provider.h"
#include "tests/unit/providers/provider_test_support.h"

namespace idem {
namespace {

using fakes::FakeReply;
using testing::kTestKey;
using testing::ProviderHarness;
using testing::ScopedEnvVar;
using testing::TriageRequest;

constexpr char kKeyVar[] = "IDEM_TEST_REQUEST_SCHEMA_KEY";

std::unique_ptr<JsonSchema> LoadSchema(const std::string& name) {
  std::ifstream in(std::string(IDEM_SOURCE_DIR) + "/tests/unit/providers/testdata/" + name);
  REQUIRE(in);
  std::ostringstream text;
  text << in.rdbuf();
  StatusOr<Json> parsed = ParseJson(text.str());
  REQUIRE_MESSAGE(parsed.ok(), parsed.status().ToString());
  auto schema = JsonSchema::Create(*parsed);
  REQUIRE_MESSAGE(schema.ok(), schema.status().ToString());
  return std::move(schema).value();
}

std::string ErrorsOf(const JsonSchema& schema, const Json& body) {
  std::string out;
  for (const auto& e : schema.Errors(body)) out += e.pointer + ": " + e.message + "\n";
  return out;
}

// The step shapes an adapter must turn into a valid body.
struct Variant {
  const char* name;
  void (*apply)(ProviderRequest&);
};

const Variant kVariants[] = {
    {"temperature set", [](ProviderRequest&) {}},
    {"temperature unset", [](ProviderRequest& r) { r.temperature.reset(); }},
    {"temperature 0", [](ProviderRequest& r) { r.temperature = 0; }},
    {"no system text", [](ProviderRequest& r) { r.system_prompt.clear(); }},
    {"a repair attempt", [](ProviderRequest& r) { r.repair_feedback = "/label: not allowed"; }},
    {"tools in both shapes",
     [](ProviderRequest& r) {
       r.tools = Json::parse(R"([
         {"name": "lookup_order", "description": "find an order",
          "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}},
         {"name": "refund", "input_schema": {"type": "object"}},
         {"type": "function", "function": {"name": "escalate", "parameters": {"type": "object"}}}
       ])");
     }},
};

// Sends one request per variant through `provider` and checks each body.
void CheckBodies(ProviderHarness& h, Provider& provider, const JsonSchema& schema) {
  for (const Variant& v : kVariants) {
    CAPTURE(v.name);
    ProviderRequest request = TriageRequest();
    v.apply(request);
    h.server->Enqueue(FakeReply::Output({{"label", "billing"}, {"confidence", 0.9}}));
    auto result = provider.Complete(request);
    REQUIRE_MESSAGE(result.ok(), result.status().ToString());
    const Json body = h.server->last_request().json;
    const std::string why = body.dump() + "\n" + ErrorsOf(schema, body);
    CHECK_MESSAGE(schema.Validate(body).ok(), why);
    CHECK(body.contains("temperature") == request.temperature.has_value());
  }
}

TEST_CASE("OpenAI request bodies are valid against the published Chat Completions schema") {
  ProviderHarness h;
  REQUIRE(h.server);
  ScopedEnvVar key{kKeyVar, kTestKey};
  auto schema = LoadSchema("openai_chat_request.schema.json");
  for (int64_t max_tokens : {0, 512}) {
    CAPTURE(max_tokens);
    ProviderConfig config = h.Config("openai", kKeyVar, h.server->base_url() + "/v1");
    if (max_tokens > 0) config.raw["max_tokens"] = max_tokens;
    auto provider = MakeOpenAiProvider(config, *h.http, h.env);
    REQUIRE(provider.ok());
    CheckBodies(h, **provider, *schema);
  }
}

TEST_CASE("OpenAI-compatible request bodies are valid against the Chat Completions schema") {
  ProviderHarness h;
  REQUIRE(h.server);
  auto schema = LoadSchema("openai_chat_request.schema.json");
  ProviderConfig config = h.Config("openai_compatible", "", h.server->base_url() + "/v1");
  config.raw["max_tokens"] = 256;
  auto provider = MakeOpenAiCompatProvider(config, *h.http, h.env);
  REQUIRE(provider.ok());
  CheckBodies(h, **provider, *schema);
}

TEST_CASE("Anthropic request bodies are valid against the SDK's MessageCreateParams") {
  ProviderHarness h;
  REQUIRE(h.server);
  ScopedEnvVar key{kKeyVar, kTestKey};
  auto schema = LoadSchema("anthropic_messages_request.schema.json");
  for (const char* mode : {"tool", "native"}) {
    CAPTURE(mode);
    ProviderConfig config = h.Config("anthropic", kKeyVar, h.server->base_url());
    config.raw["structured_output"] = mode;
    auto provider = MakeAnthropicProvider(config, *h.http, h.env);
    REQUIRE(provider.ok());
    CheckBodies(h, **provider, *schema);
  }
}

// The schemas can fail: what a body must not carry is refused.
TEST_CASE("the transcribed request schemas refuse unknown fields and out-of-range values") {
  auto openai = LoadSchema("openai_chat_request.schema.json");
  auto anthropic = LoadSchema("anthropic_messages_request.schema.json");
  const Json messages = Json::array({{{"role", "user"}, {"content", "hi"}}});
  auto With = [](Json j, const Json& extra) {
    j.update(extra);
    return j;
  };
  Json chat = {{"model", "m"}, {"messages", messages}};
  CHECK(openai->Validate(chat).ok());
  CHECK_FALSE(openai->Validate(With(chat, {{"temprature", 0}})).ok());
  CHECK_FALSE(openai->Validate(With(chat, {{"temperature", 2.5}})).ok());
  Json claude = {{"model", "m"}, {"max_tokens", 16}, {"messages", messages}};
  CHECK(anthropic->Validate(claude).ok());
  CHECK_FALSE(anthropic->Validate(With(claude, {{"top_k", 5}})).ok());
  CHECK_FALSE(anthropic->Validate(With(claude, {{"temperature", 1.5}})).ok());
  CHECK_FALSE(anthropic->Validate(With(claude, {{"output_format", Json::object()}})).ok());
}

}  // namespace
}  // namespace idem
