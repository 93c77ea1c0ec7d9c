// The decide pipeline with a fake clock, a fake provider (the Provider
// interface, scripted per test) and the real RocksDB store.
#include "daemon/decide/decide_engine.h"

#include <doctest/doctest.h>

#include <atomic>
#include <deque>
#include <filesystem>
#include <mutex>
#include <thread>

#include "daemon/core/env.h"
#include "daemon/core/json.h"
#include "providers/errors.h"

namespace idem {
namespace {

// Answers from a queue (the last answer repeats); records every request.
class QueueProvider final : public Provider {
 public:
  void Push(StatusOr<ProviderResponse> r) {
    std::lock_guard<std::mutex> lock(mu_);
    answers_.push_back(std::move(r));
  }
  StatusOr<ProviderResponse> Complete(const ProviderRequest& request) override {
    std::lock_guard<std::mutex> lock(mu_);
    requests_.push_back(request);
    calls_++;
    if (answers_.empty()) return Internal("no scripted answer");
    StatusOr<ProviderResponse> r = answers_.front();
    if (answers_.size() > 1) answers_.pop_front();
    return r;
  }
  std::string type() const override { return "queue"; }
  int calls() const { return calls_.load(); }
  std::vector<ProviderRequest> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }

 private:
  std::mutex mu_;
  std::deque<StatusOr<ProviderResponse>> answers_;
  std::vector<ProviderRequest> requests_;
  std::atomic<int> calls_{0};
};

ProviderResponse Answer(const Json& output, int64_t in = 100, int64_t out = 20) {
  ProviderResponse r;
  r.raw_text = output.dump();
  r.output = output;
  r.input_tokens = in;
  r.output_tokens = out;
  r.finish_reason = "stop";
  return r;
}

ProviderResponse NotJson() {
  ProviderResponse r;
  r.raw_text = "Sure! Here is the JSON you asked for:";
  r.output = Json();
  return r;
}

Status RateLimited(int64_t retry_after_ms) {
  return ToStatus(
      UpstreamError{Status(Code::kResourceExhausted, "fake: HTTP 429", "", true), retry_after_ms});
}

const Json kValid = {{"category", "refund"}, {"priority", "high"}};
const Json kSchema = {{"type", "object"},
                      {"required", {"category", "priority"}},
                      {"additionalProperties", false},
                      {"properties",
                       {{"category", {{"type", "string"}, {"enum", {"refund", "bug"}}}},
                        {"priority", {{"type", "string"}}}}}};

struct Fixture {
  std::string dir;
  FakeEnv env;
  StableClock clock{env};
  Metrics metrics;
  Config config;
  std::unique_ptr<Store> store;
  QueueProvider* primary = nullptr;
  QueueProvider* backup = nullptr;
  std::unique_ptr<DecideEngine> engine;

  Fixture() {
    char tmpl[] = "/tmp/idem-decide-XXXXXX";
    dir = mkdtemp(tmpl);
    StoreOptions so;
    so.path = dir;
    store = std::move(OpenRocksStore(so)).value();
    ProviderConfig p;
    p.name = "main";
    p.type = "queue";
    config.providers["main"] = p;
    p.name = "backup";
    config.providers["backup"] = p;
    StepConfig s;
    s.name = "triage";
    s.provider = "main";
    s.model = "m-1";
    s.prompt.text = "Triage {{input.text}}";
    s.prompt.version = "v1";
    s.output_schema = kSchema;
    s.attempts = 3;
    s.timeout_ms = 30'000;
    s.retry_base_ms = 500;
    s.retry_cap_ms = 8'000;
    config.steps["triage"] = s;
    config.prices["m-1"] = {{"input_per_mtok", 2.0}, {"output_per_mtok", 8.0}};
  }
  ~Fixture() {
    engine.reset();
    store.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  StepConfig& step() { return config.steps["triage"]; }
  Notifier* notifier = nullptr;
  void Build() {
    std::map<std::string, std::unique_ptr<Provider>> providers;
    auto a = std::make_unique<QueueProvider>();
    auto b = std::make_unique<QueueProvider>();
    primary = a.get();
    backup = b.get();
    providers["main"] = std::move(a);
    providers["backup"] = std::move(b);
    engine = std::move(DecideEngine::Create(config, store->decisions(), store->escalations(),
                                            std::move(providers), clock, metrics, notifier))
                 .value();
  }
  StatusOr<DecideResult> Decide(const Json& input = {{"text", "refund please"}}) {
    DecideRequest r;
    r.step = "triage";
    r.input = input;
    return engine->Decide(r);
  }
};

}  // namespace

TEST_CASE("a retryable failure is retried with backoff and the decision is stored once") {
  Fixture f;
  f.Build();
  f.primary->Push(Unavailable("fake: HTTP 503"));
  f.primary->Push(Answer(kValid));
  auto r = f.Decide();
  REQUIRE(r.ok());
  CHECK_FALSE(r->escalated);
  CHECK(r->decision.output == kValid);
  CHECK(f.primary->calls() == 2);
  CHECK(r->decision.trace["attempts"].size() == 2);
  // Cached: the same input again costs no call.
  auto again = f.Decide();
  CHECK(again->cache_hit);
  CHECK(again->decision.decision_id == r->decision.decision_id);
  CHECK(f.primary->calls() == 2);
}

TEST_CASE("retry-after from the provider is honoured") {
  Fixture f;
  f.Build();
  f.primary->Push(RateLimited(7'000));
  f.primary->Push(Answer(kValid));
  const int64_t before = f.env.total_slept_ms();
  REQUIRE(f.Decide().ok());
  CHECK(f.env.total_slept_ms() - before >= 7'000);
}

TEST_CASE("the step's deadline holds however many retries are left") {
  Fixture f;
  f.step().attempts = 20;
  f.step().timeout_ms = 5'000;
  f.step().retry_base_ms = 1'000;
  f.Build();
  f.primary->Push(RateLimited(2'000));
  const int64_t start = f.clock.NowMillis();
  auto r = f.Decide();
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == Code::kUnavailable);
  CHECK(f.clock.NowMillis() - start <= 5'000);
  CHECK(f.primary->calls() < 20);
  // The provider's hint is not in what the caller reads.
}

TEST_CASE("the provider's retry hint stays out of the error the caller reads") {
  Fixture f;
  f.step().attempts = 2;
  f.Build();
  f.primary->Push(RateLimited(100));
  f.primary->Push(RateLimited(100));
  auto r = f.Decide();
  REQUIRE_FALSE(r.ok());
  INFO(r.status().message());
  CHECK(r.status().message().find("HTTP 429") != std::string::npos);
  CHECK(r.status().message().find("retry_after_ms") == std::string::npos);
}

TEST_CASE("an invalid output is repaired with the exact errors and never cached") {
  Fixture f;
  f.Build();
  f.primary->Push(Answer({{"category", "weather"}, {"priority", "high"}}));
  f.primary->Push(Answer(kValid));
  auto r = f.Decide();
  REQUIRE(r.ok());
  CHECK(r->decision.output == kValid);
  auto reqs = f.primary->requests();
  REQUIRE(reqs.size() == 2);
  CHECK(reqs[0].repair_feedback.empty());
  CHECK(reqs[1].repair_feedback.find("/category") != std::string::npos);
  CHECK(r->decision.trace["attempts"][0].contains("errors"));
}

TEST_CASE("output that is not JSON is repaired too") {
  Fixture f;
  f.Build();
  f.primary->Push(NotJson());
  f.primary->Push(Answer(kValid));
  auto r = f.Decide();
  REQUIRE(r.ok());
  CHECK(f.primary->calls() == 2);
}

TEST_CASE("a non-retryable failure falls back to the next model in the chain") {
  Fixture f;
  f.step().fallback = Json::array({{{"provider", "backup"}, {"model", "b-1"}}});
  f.Build();
  f.primary->Push(RefusalError("fake", "I cannot help with that"));
  f.backup->Push(Answer(kValid));
  auto r = f.Decide();
  REQUIRE(r.ok());
  CHECK(f.primary->calls() == 1);  // a refusal is not retried on the same model
  CHECK(f.backup->calls() == 1);
  CHECK(r->decision.provider == "backup");
  CHECK(r->decision.model == "b-1");
}

TEST_CASE("an exhausted chain escalates with context, and a human's answer becomes the decision") {
  Fixture f;
  f.step().fallback = Json::array({"escalate"});
  f.Build();
  f.primary->Push(Answer({{"category", "weather"}, {"priority", "high"}}));
  auto r = f.Decide();
  REQUIRE(r.ok());
  REQUIRE(r->escalated);
  CHECK(f.primary->calls() == 3);
  const Escalation& e = r->escalation;
  CHECK(e.state == "open");
  CHECK(e.context["attempts"].size() == 3);
  CHECK(e.context["best_guess"]["category"] == "weather");
  CHECK(e.context["summary"].get<std::string>().find("triage") != std::string::npos);
  // Nothing was cached as a decision; a retry returns the open escalation
  // without calling the provider again.
  CHECK(f.store->decisions().GetByKey(e.decision_key, f.clock.NowMillis()).status().code() ==
        Code::kNotFound);
  auto again = f.Decide();
  REQUIRE(again->escalated);
  CHECK(again->escalation.escalation_id == e.escalation_id);
  CHECK(f.primary->calls() == 3);

  auto bad = f.engine->ResolveEscalation(e.escalation_id, {{"category", "weather"}}, "ops", "");
  CHECK(bad.status().code() == Code::kInvalidArgument);
  auto good = f.engine->ResolveEscalation(e.escalation_id, kValid, "ops", "checked by hand");
  REQUIRE(good.ok());
  CHECK(good->decided_by == "human");
  auto after = f.Decide();
  REQUIRE(after.ok());
  CHECK_FALSE(after->escalated);
  CHECK(after->cache_hit);
  CHECK(after->decision.decision_id == good->decision_id);
  CHECK(f.engine->ResolveEscalation(e.escalation_id, kValid, "ops", "").status().code() ==
        Code::kFailedPrecondition);
}

TEST_CASE("a 100-call storm of identical misses under 429s makes one logical decision") {
  Fixture f;
  f.step().attempts = 5;
  f.Build();
  f.primary->Push(RateLimited(1'000));
  f.primary->Push(RateLimited(1'000));
  f.primary->Push(Answer(kValid));
  std::vector<std::thread> threads;
  std::vector<std::string> ids(100);
  std::atomic<int> ok{0};
  for (int i = 0; i < 100; ++i) {
    threads.emplace_back([&, i] {
      auto r = f.Decide();
      if (r.ok() && !r->escalated) {
        ids[i] = r->decision.decision_id;
        ok++;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(ok == 100);
  for (const auto& id : ids) CHECK(id == ids[0]);
  CHECK(f.primary->calls() == 3);
}

TEST_CASE("every attempt records tokens and cost, and the decision the total") {
  Fixture f;
  f.Build();
  f.primary->Push(Answer({{"category", "weather"}, {"priority", "x"}}, 1'000'000, 0));
  f.primary->Push(Answer(kValid, 500'000, 250'000));
  auto r = f.Decide();
  REQUIRE(r.ok());
  // 1M input at $2 + 0.5M input at $2 + 0.25M output at $8 = 2 + 1 + 2.
  CHECK(r->decision.trace["cost_usd"].get<double>() == doctest::Approx(5.0));
  CHECK(r->decision.trace["attempts"][0]["cost_usd"].get<double>() == doctest::Approx(2.0));
  CHECK(CallCostUsd(f.config, "unpriced", 1000, 1000, 0) == 0);
}

TEST_CASE("cache only never calls a provider and refresh replaces the cached decision") {
  Fixture f;
  f.Build();
  f.primary->Push(Answer(kValid));
  DecideRequest only;
  only.step = "triage";
  only.input = {{"text", "x"}};
  only.cache = CacheMode::kOnly;
  CHECK(f.engine->Decide(only).status().code() == Code::kNotFound);
  CHECK(f.primary->calls() == 0);
  auto first = f.Decide({{"text", "x"}});
  DecideRequest refresh = only;
  refresh.cache = CacheMode::kRefresh;
  auto second = f.engine->Decide(refresh);
  REQUIRE(second.ok());
  CHECK(second->decision.decision_id != first->decision.decision_id);
  auto cached = f.engine->Decide(only);
  CHECK(cached->decision.decision_id == second->decision.decision_id);
}

}  // namespace idem

namespace idem {

TEST_CASE("a step never answers with another step's cached decision") {
  Fixture f;
  // spam_check shares provider, model, prompt version, schema and input.
  StepConfig spam = f.step();
  spam.name = "spam_check";
  f.config.steps["spam_check"] = spam;
  f.Build();
  f.primary->Push(Answer(kValid));
  auto triage = f.Decide();
  REQUIRE(triage.ok());
  DecideRequest r;
  r.step = "spam_check";
  r.input = {{"text", "refund please"}};
  auto checked = f.engine->Decide(r);
  REQUIRE(checked.ok());
  CHECK_FALSE(checked->cache_hit);
  CHECK(checked->decision.step == "spam_check");
  CHECK(checked->decision.decision_key != triage->decision.decision_key);
  CHECK(f.primary->calls() == 2);
}

TEST_CASE("a changed system text misses the cache even under the same prompt version") {
  Fixture f;
  f.step().system_prompt = "You triage tickets.";
  f.Build();
  f.primary->Push(Answer(kValid));
  auto first = f.Decide();
  REQUIRE(first.ok());
  f.engine.reset();
  f.step().system_prompt = "You triage tickets. Everything is urgent.";
  f.Build();
  f.primary->Push(Answer(kValid));
  auto second = f.Decide();
  REQUIRE(second.ok());
  CHECK_FALSE(second->cache_hit);
  CHECK(second->decision.decision_key != first->decision.decision_key);
}

TEST_CASE("the provider gets a temperature only when the step sets one") {
  Fixture f;
  f.Build();
  f.primary->Push(Answer(kValid));
  REQUIRE(f.Decide().ok());
  REQUIRE(f.primary->requests().size() == 1);
  CHECK_FALSE(f.primary->requests()[0].temperature.has_value());

  Fixture g;
  g.step().temperature = 0;
  g.Build();
  g.primary->Push(Answer(kValid));
  REQUIRE(g.Decide().ok());
  REQUIRE(g.primary->requests().size() == 1);
  CHECK(g.primary->requests()[0].temperature == 0.0);
}

TEST_CASE("an input integer beyond 2^53 is refused with its pointer before any call") {
  Fixture f;
  f.Build();
  f.primary->Push(Answer(kValid));
  auto r = f.Decide({{"text", "refund"}, {"order", {{"id", 9007199254740993ULL}}}});
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == Code::kInvalidArgument);
  CHECK(r.status().field() == "/input/order/id");
  CHECK(f.primary->calls() == 0);
  CHECK(f.Decide({{"text", "refund"}, {"order", {{"id", "9007199254740993"}}}}).ok());
}

TEST_CASE("raw output and summaries cut at their byte limits stay storable UTF-8") {
  Fixture f;
  f.step().fallback = Json::array({"escalate"});
  f.step().attempts = 1;
  f.Build();
  // 16 KiB of trace keeps 16383 'a' and would split the 'é' that follows.
  ProviderResponse long_answer;
  long_answer.raw_text = std::string(16 * 1024 - 1, 'a') + "\xC3\xA9 and more";
  long_answer.output = Json();
  f.primary->Push(long_answer);
  // The summary keeps 300 bytes of {"text":"ééé…"}: 9 + 2k never lands on 300.
  std::string accents;
  for (int i = 0; i < 200; ++i) accents += "\xC3\xA9";
  auto r = f.Decide({{"text", accents}});
  REQUIRE_MESSAGE(r.ok(), r.status().ToString());
  REQUIRE(r->escalated);
  const std::string raw = r->escalation.context["attempts"][0]["raw_output"];
  CHECK(raw == std::string(16 * 1024 - 1, 'a') + "...[cut]");
  const std::string summary = r->escalation.context["summary"];
  CHECK(IsValidUtf8(summary));
  CHECK(summary.find("\xC3\xA9...") != std::string::npos);
}

// Records what the engine tells humans.
class RecordingNotifier final : public Notifier {
 public:
  void Notify(const Notification& n) override { sent.push_back(n); }
  std::vector<Notification> sent;
};

TEST_CASE("a new escalation notifies once with the resolve call and the page's link") {
  Fixture f;
  RecordingNotifier notes;
  f.notifier = &notes;
  f.config.notifications.link_base = "http://ops.example:7411";
  f.step().fallback = Json::array({"escalate"});
  f.Build();
  f.primary->Push(Answer({{"category", "weather"}, {"priority", "high"}}));
  auto r = f.Decide();
  REQUIRE(r.ok());
  REQUIRE(r->escalated);
  REQUIRE(notes.sent.size() == 1);
  const Notification& n = notes.sent[0];
  const std::string id = r->escalation.escalation_id;
  CHECK(n.kind == "escalation");
  CHECK(n.event_id == "escalation:" + id);
  CHECK(n.subject_id == id);
  CHECK(n.reason == r->escalation.context["summary"].get<std::string>());
  CHECK(n.command.find("http://ops.example:7411/v1/escalations/" + id + "/resolve") !=
        std::string::npos);
  CHECK(n.link == "http://ops.example:7411/ui/#/escalations");
  CHECK(n.detail["step"] == "triage");

  // The retry that finds the open escalation is not a new event.
  auto again = f.Decide();
  REQUIRE(again->escalated);
  CHECK(notes.sent.size() == 1);
}

}  // namespace idem
