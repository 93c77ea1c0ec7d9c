// The decide pipeline end to end over real HTTP: the real DecideEngine with
// the real provider adapters (OpenAI, Anthropic, Ollama native) and the
// real curl client, talking to the scripted fake provider server, on the
// real RocksDB store. The engine's clock is a FakeEnv (backoff sleeps are
// instant); the adapters' HTTP runs in real time.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "daemon/core/env.h"
#include "daemon/core/http_client.h"
#include "daemon/decide/decide_engine.h"
#include "providers/anthropic/anthropic_provider.h"
#include "providers/openai/openai_provider.h"
#include "providers/openai_compat/openai_compat_provider.h"
#include "tests/fakes/fake_provider.h"
#include "tests/unit/providers/provider_test_support.h"

namespace idem {
namespace {

using fakes::FakeProviderServer;
using fakes::FakeReply;
using testing::kTestKey;
using testing::ScopedEnvVar;

enum class Api { kOpenAi, kAnthropic, kOllama };

struct ProviderCase {
  const char* name;
  Api api;
};

constexpr ProviderCase kAllProviders[] = {
    {"openai", Api::kOpenAi}, {"anthropic", Api::kAnthropic}, {"ollama", Api::kOllama}};

constexpr char kOpenAiKeyVar[] = "IDEM_TEST_PIPELINE_OPENAI_KEY";
constexpr char kAnthropicKeyVar[] = "IDEM_TEST_PIPELINE_ANTHROPIC_KEY";
constexpr char kRepairMarker[] = "Your previous answer was rejected";

const Json kValid = {{"label", "billing"}, {"confidence", 0.9}};

struct Pipeline {
  ScopedEnvVar openai_key{kOpenAiKeyVar, kTestKey};
  ScopedEnvVar anthropic_key{kAnthropicKeyVar, kTestKey};
  std::unique_ptr<FakeProviderServer> server = FakeProviderServer::Start();
  std::unique_ptr<HttpClient> http = MakeCurlHttpClient();
  std::string dir;
  FakeEnv env;
  StableClock clock{env};
  Metrics metrics;
  Config config;
  std::unique_ptr<Store> store;
  std::unique_ptr<DecideEngine> engine;
  Api api;

  explicit Pipeline(Api a) : api(a) {
    REQUIRE(server);
    char tmpl[] = "/tmp/idem-pipeline-XXXXXX";
    char* made = mkdtemp(tmpl);
    REQUIRE(made != nullptr);
    dir = made;
    StoreOptions so;
    so.path = dir;
    auto opened = OpenRocksStore(so);
    REQUIRE(opened.ok());
    store = std::move(opened).value();

    ProviderConfig p;
    p.name = "llm";
    switch (api) {
      case Api::kOpenAi:
        p.type = "openai";
        p.api_key_env = kOpenAiKeyVar;
        p.base_url = server->base_url() + "/v1/";
        break;
      case Api::kAnthropic:
        p.type = "anthropic";
        p.api_key_env = kAnthropicKeyVar;
        p.base_url = server->base_url();
        break;
      case Api::kOllama:
        p.type = "openai_compatible";
        p.base_url = server->base_url();
        break;
    }
    p.raw = {{"type", p.type}};
    if (api == Api::kOllama) p.raw["api"] = "ollama";
    config.providers["llm"] = p;

    StepConfig s;
    s.name = "triage";
    s.provider = "llm";
    s.model = "model-x";
    s.system_prompt = "You triage support tickets.";
    s.prompt.text = "Triage {{input.text}}";
    s.prompt.version = "v1";
    s.output_schema = testing::TriageSchema();
    s.attempts = 3;
    s.timeout_ms = 30'000;
    s.retry_base_ms = 500;
    s.retry_cap_ms = 8'000;
    config.steps["triage"] = s;
  }

  ~Pipeline() {
    engine.reset();
    store.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }

  StepConfig& step() { return config.steps["triage"]; }

  void Build() {
    const ProviderConfig& p = config.providers["llm"];
    StatusOr<std::unique_ptr<Provider>> made = Internal("unset");
    switch (api) {
      case Api::kOpenAi:
        made = MakeOpenAiProvider(p, *http, env);
        break;
      case Api::kAnthropic:
        made = MakeAnthropicProvider(p, *http, env);
        break;
      case Api::kOllama:
        made = MakeOpenAiCompatProvider(p, *http, env);
        break;
    }
    REQUIRE(made.ok());
    std::map<std::string, std::unique_ptr<Provider>> providers;
    providers["llm"] = std::move(made).value();
    auto created = DecideEngine::Create(config, store->decisions(), store->escalations(),
                                        std::move(providers), clock, metrics);
    REQUIRE(created.ok());
    engine = std::move(created).value();
  }

  StatusOr<DecideResult> Decide() {
    DecideRequest r;
    r.step = "triage";
    r.input = {{"text", "I was charged twice"}};
    return engine->Decide(r);
  }

  // The decision cached under the result's key is the valid output.
  void CheckCachedValid(const DecideResult& r) {
    auto cached = store->decisions().GetByKey(r.decision.decision_key, clock.NowMillis());
    REQUIRE(cached.ok());
    CHECK(cached->decision_id == r.decision.decision_id);
    CHECK(cached->output == kValid);
  }
};

// Runs `first` then a valid output; expects a decision after two calls.
void ExpectDecidedAfterRetry(const ProviderCase& pc, FakeReply first) {
  CAPTURE(pc.name);
  Pipeline f(pc.api);
  f.Build();
  f.server->Enqueue(std::move(first));
  f.server->Enqueue(FakeReply::Output(kValid));
  auto r = f.Decide();
  REQUIRE(r.ok());
  REQUIRE_FALSE(r->escalated);
  CHECK(r->decision.output == kValid);
  CHECK(r->decision.model == "model-x");
  CHECK(f.server->calls() == 2);
  f.CheckCachedValid(*r);
}

}  // namespace

TEST_CASE("provider pipeline: success on the first call is decided and cached") {
  for (const auto& pc : kAllProviders) {
    CAPTURE(pc.name);
    Pipeline f(pc.api);
    f.Build();
    f.server->Enqueue(FakeReply::Output(kValid));
    auto r = f.Decide();
    REQUIRE(r.ok());
    REQUIRE_FALSE(r->escalated);
    CHECK_FALSE(r->cache_hit);
    CHECK(r->decision.output == kValid);
    CHECK(r->decision.provider == "llm");
    CHECK(r->decision.model == "model-x");
    CHECK(f.server->calls() == 1);
    f.CheckCachedValid(*r);
    // A repeat is a cache hit: no further call.
    auto again = f.Decide();
    REQUIRE(again.ok());
    CHECK(again->cache_hit);
    CHECK(again->decision.decision_id == r->decision.decision_id);
    CHECK(f.server->calls() == 1);
  }
}

TEST_CASE("provider pipeline: 429 with Retry-After is honoured, then decided") {
  for (const auto& pc : kAllProviders) {
    CAPTURE(pc.name);
    Pipeline f(pc.api);
    f.Build();
    f.server->Enqueue(FakeReply::RateLimited("2"));
    f.server->Enqueue(FakeReply::Output(kValid));
    const int64_t before = f.env.total_slept_ms();
    auto r = f.Decide();
    REQUIRE(r.ok());
    REQUIRE_FALSE(r->escalated);
    CHECK(r->decision.output == kValid);
    CHECK(f.server->calls() == 2);
    CHECK(f.env.total_slept_ms() - before >= 2'000);
    f.CheckCachedValid(*r);
    // The hint is the trace's own member, not a marker inside the error
    // text people read.
    const Json& first = r->decision.trace["attempts"][0];
    CHECK(first["retry_after_ms"] == 2'000);
    const std::string error = first["error"];
    CHECK(error.find("429") != std::string::npos);
    CHECK(error.find("retry_after_ms") == std::string::npos);
  }
}

TEST_CASE("provider pipeline: a server error is retried, then decided") {
  for (const auto& pc : kAllProviders) {
    for (int status : {500, 503}) {
      CAPTURE(status);
      ExpectDecidedAfterRetry(pc, FakeReply::HttpError(status));
    }
  }
  // 529 overloaded is Anthropic's.
  ExpectDecidedAfterRetry(kAllProviders[1], FakeReply::Overloaded());
}

TEST_CASE("provider pipeline: schema-violating output is repaired with the errors") {
  for (const auto& pc : kAllProviders) {
    CAPTURE(pc.name);
    Pipeline f(pc.api);
    f.Build();
    f.server->Enqueue(FakeReply::SchemaViolating());
    f.server->Enqueue(FakeReply::Output(kValid));
    auto r = f.Decide();
    REQUIRE(r.ok());
    REQUIRE_FALSE(r->escalated);
    CHECK(r->decision.output == kValid);
    REQUIRE(f.server->calls() == 2);
    auto reqs = f.server->requests();
    REQUIRE(reqs.size() == 2);
    CHECK(reqs[0].body.find(kRepairMarker) == std::string::npos);
    CHECK(reqs[1].body.find(kRepairMarker) != std::string::npos);
    f.CheckCachedValid(*r);
  }
}

TEST_CASE("provider pipeline: a malformed response body is retried, then decided") {
  for (const auto& pc : kAllProviders) ExpectDecidedAfterRetry(pc, FakeReply::MalformedBody());
}

TEST_CASE("provider pipeline: a connection cut mid-body is retried, then decided") {
  for (const auto& pc : kAllProviders) ExpectDecidedAfterRetry(pc, FakeReply::CutMidBody());
}

// Ollama has no refusal signal: the fake renders a refusal there as plain
// text content, which is a validation failure, not a refusal.
TEST_CASE("provider pipeline: a refusal falls back to the fallback model") {
  for (const auto& pc : {kAllProviders[0], kAllProviders[1]}) {
    CAPTURE(pc.name);
    Pipeline f(pc.api);
    f.step().fallback = Json::array({{{"model", "model-fallback"}}});
    f.Build();
    f.server->Enqueue(FakeReply::Refusal("I can't help with that."));
    f.server->Enqueue(FakeReply::Output(kValid));
    auto r = f.Decide();
    REQUIRE(r.ok());
    REQUIRE_FALSE(r->escalated);
    CHECK(r->decision.output == kValid);
    CHECK(r->decision.model == "model-fallback");
    REQUIRE(f.server->calls() == 2);
    auto reqs = f.server->requests();
    CHECK(reqs[0].json["model"] == "model-x");
    CHECK(reqs[1].json["model"] == "model-fallback");
    f.CheckCachedValid(*r);
  }
}

TEST_CASE("provider pipeline: truncation with one attempt escalates and caches nothing") {
  for (const auto& pc : kAllProviders) {
    CAPTURE(pc.name);
    Pipeline f(pc.api);
    f.step().attempts = 1;
    f.step().fallback = Json::array({"escalate"});
    f.Build();
    f.server->Enqueue(FakeReply::Truncated());
    auto r = f.Decide();
    REQUIRE(r.ok());
    REQUIRE(r->escalated);
    CHECK(f.server->calls() == 1);
    CHECK_FALSE(r->escalation.decision_key.empty());
    CHECK(f.store->decisions()
              .GetByKey(r->escalation.decision_key, f.clock.NowMillis())
              .status()
              .code() == Code::kNotFound);
  }
}

TEST_CASE("provider pipeline: an always-failing provider does not hang past the deadline") {
  for (const auto& pc : kAllProviders) {
    CAPTURE(pc.name);
    Pipeline f(pc.api);
    f.step().attempts = 3;
    f.step().timeout_ms = 1'000;
    f.step().retry_base_ms = 500;
    f.Build();
    f.server->SetDefault(FakeReply::HttpError(500));
    const int64_t start = f.clock.NowMillis();
    const auto wall_start = std::chrono::steady_clock::now();
    auto r = f.Decide();
    const auto wall = std::chrono::steady_clock::now() - wall_start;
    if (r.ok()) {
      CHECK(r->escalated);
    } else {
      CHECK(r.status().code() == Code::kUnavailable);
    }
    CHECK(f.clock.NowMillis() - start <= 1'000);
    CHECK(f.server->calls() >= 1);
    CHECK(f.server->calls() <= 3);
    CHECK(wall < std::chrono::seconds(10));
    if (r.ok() && r->escalated) {
      CHECK(f.store->decisions()
                .GetByKey(r->escalation.decision_key, f.clock.NowMillis())
                .status()
                .code() == Code::kNotFound);
    }
  }
}

}  // namespace idem
