#include "daemon/decide/decide_engine.h"

#include <algorithm>
#include <condition_variable>
#include <cmath>
#include <mutex>

#include <kainjow/mustache.hpp>

#include "daemon/core/crypto.h"
#include "daemon/core/json.h"
#include "daemon/core/json_schema.h"
#include "daemon/core/mutex.h"
#include "daemon/obs/log.h"

namespace idem {
namespace {

using kainjow::mustache::data;
using kainjow::mustache::mustache;

data ToMustache(const Json& j) {
  switch (j.type()) {
    case Json::value_t::object: {
      data d{data::type::object};
      for (auto it = j.begin(); it != j.end(); ++it) d.set(it.key(), ToMustache(it.value()));
      return d;
    }
    case Json::value_t::array: {
      data d{data::type::list};
      for (const auto& v : j) d.push_back(ToMustache(v));
      return d;
    }
    case Json::value_t::string:
      return data(j.get<std::string>());
    case Json::value_t::boolean:
      return data(j.get<bool>());
    case Json::value_t::null:
      return data(std::string());
    default:
      return data(j.dump());
  }
}

StatusOr<std::string> RenderPrompt(const std::string& text, const Json& context) {
  mustache tmpl{text};
  if (!tmpl.is_valid()) return InvalidArgument("prompt template: " + tmpl.error_message());
  // Prompts are not HTML: no escaping.
  tmpl.set_custom_escape([](const std::string& s) { return s; });
  std::string out = tmpl.render(ToMustache(context));
  if (!tmpl.is_valid()) return InvalidArgument("prompt template: " + tmpl.error_message());
  return out;
}

Normalizers NormalizersOf(const StepConfig& step) {
  Normalizers n;
  n.drop = step.input.drop;
  n.trim_strings = step.input.trim_strings;
  n.url_fields = step.input.url_fields;
  return n;
}

// The outcome a single-flight leader hands to the requests that joined it.
struct Flight {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::optional<StatusOr<Decision>> outcome;
};

struct CompiledStep {
  const StepConfig* config;
  const ProviderConfig* provider_config;
  Provider* provider;
  std::unique_ptr<JsonSchema> schema;
};

class DecideEngineImpl final : public DecideEngine {
 public:
  DecideEngineImpl(const Config& config, DecisionStore& store,
                   std::map<std::string, std::unique_ptr<Provider>> providers, StableClock& clock,
                   Metrics& metrics)
      : config_(config),
        store_(store),
        providers_(std::move(providers)),
        clock_(clock),
        metrics_(metrics) {}

  Status Init() {
    for (const auto& [name, step] : config_.steps) {
      auto pit = providers_.find(step.provider);
      auto cit = config_.providers.find(step.provider);
      if (pit == providers_.end() || cit == config_.providers.end()) {
        return InvalidArgument("step " + name + " names provider '" + step.provider +
                                   "' which is not configured",
                               "/steps/" + JsonPointerToken(name) + "/provider");
      }
      auto schema = JsonSchema::Create(step.output_schema);
      if (!schema.ok()) {
        return schema.status().Annotate("step " + name + " output schema");
      }
      CompiledStep c{&step, &cit->second, pit->second.get(), std::move(schema).value()};
      steps_.emplace(name, std::move(c));
    }
    return Status::Ok();
  }

  StatusOr<StepKey> KeyFor(const std::string& step, const Json& input) const override {
    auto it = steps_.find(step);
    if (it == steps_.end()) return Status(Code::kNotFound, "unknown step '" + step + "'", "/step");
    return ComputeStepKey(*it->second.config, *it->second.provider_config, input);
  }

  StatusOr<DecideResult> Decide(const DecideRequest& req) override {
    auto it = steps_.find(req.step);
    if (it == steps_.end()) {
      return Status(Code::kNotFound, "unknown step '" + req.step + "'", "/step");
    }
    const CompiledStep& step = it->second;
    ASSIGN_OR_RETURN(StepKey key, ComputeStepKey(*step.config, *step.provider_config, req.input));

    if (req.cache != CacheMode::kRefresh) {
      auto hit = store_.GetByKey(key.key.key, clock_.NowMillis());
      if (hit.ok()) {
        metrics_.decide_cache_hits.Inc();
        return DecideResult{std::move(hit).value(), true, false};
      }
      if (hit.status().code() != Code::kNotFound) return hit.status();
      if (req.cache == CacheMode::kOnly) {
        return NotFound("no cached decision for this step and input (cache: only)");
      }
    }
    metrics_.decide_cache_misses.Inc();

    // Single flight: the first miss for a key leads; identical misses wait.
    std::shared_ptr<Flight> flight;  // shared: the leader and every waiter hold it
    bool leader = false;
    {
      MutexLock lock(flights_mu_);
      auto fit = flights_.find(key.key.key);
      if (fit != flights_.end()) {
        flight = fit->second;
      } else {
        if (req.cache != CacheMode::kRefresh) {
          // The leader stores before it leaves the table, so a miss that
          // arrives after a flight ended finds the decision here.
          auto hit = store_.GetByKey(key.key.key, clock_.NowMillis());
          if (hit.ok()) {
            metrics_.decide_cache_hits.Inc();
            return DecideResult{std::move(hit).value(), true, false};
          }
        }
        flight = std::make_shared<Flight>();
        flights_.emplace(key.key.key, flight);
        leader = true;
      }
    }

    if (!leader) {
      metrics_.decide_single_flight_joined.Inc();
      std::unique_lock<std::mutex> lock(flight->mu);
      flight->cv.wait(lock, [&] { return flight->done; });
      StatusOr<Decision> outcome = *flight->outcome;
      if (!outcome.ok()) return outcome.status();
      return DecideResult{std::move(outcome).value(), false, true};
    }

    StatusOr<Decision> outcome = DecideWithProvider(step, key, req);
    {
      MutexLock lock(flights_mu_);
      flights_.erase(key.key.key);
    }
    {
      std::lock_guard<std::mutex> lock(flight->mu);
      flight->outcome = outcome;
      flight->done = true;
    }
    flight->cv.notify_all();
    if (!outcome.ok()) return outcome.status();
    return DecideResult{std::move(outcome).value(), false, false};
  }

 private:
  // Calls the provider until a valid output or the attempts run out, then
  // stores the decision. Runs with the flight registered.
  StatusOr<Decision> DecideWithProvider(const CompiledStep& step, const StepKey& key,
                                        const DecideRequest& req) {
    const StepConfig& cfg = *step.config;
    Json context = {{"input", key.normalized_input}, {"step", cfg.name}, {"model", cfg.model}};
    ASSIGN_OR_RETURN(std::string prompt, RenderPrompt(cfg.prompt.text, context));

    const int64_t started_ms = clock_.NowMillis();
    const int64_t deadline_ms = started_ms + cfg.timeout_ms;
    const int attempts = std::max(1, cfg.attempts);
    Json trace_attempts = Json::array();
    std::string repair_feedback;
    Status last_error = Unavailable("no attempt was made");
    int64_t total_in = 0, total_out = 0;

    for (int attempt = 1; attempt <= attempts; ++attempt) {
      int64_t now = clock_.NowMillis();
      if (now >= deadline_ms) {
        last_error = DeadlineExceeded("step " + cfg.name + " ran out of its " +
                                      std::to_string(cfg.timeout_ms) + " ms deadline");
        break;
      }
      ProviderRequest preq;
      preq.step = cfg.name;
      preq.model = cfg.model;
      preq.temperature = cfg.temperature;
      preq.system_prompt = cfg.system_prompt;
      preq.prompt = prompt;
      preq.input = key.normalized_input;
      preq.output_schema = cfg.output_schema;
      preq.schema_name = cfg.name;
      preq.tools = cfg.tools;
      preq.repair_feedback = repair_feedback;
      preq.timeout_ms = deadline_ms - now;

      metrics_.provider_calls.Inc();
      const int64_t t0 = clock_.NowMillis();
      StatusOr<ProviderResponse> resp = step.provider->Complete(preq);
      Json record = {{"attempt", attempt},
                     {"provider", cfg.provider},
                     {"model", cfg.model},
                     {"latency_ms", clock_.NowMillis() - t0}};
      if (!resp.ok()) {
        metrics_.provider_errors.Inc();
        record["error"] = resp.status().ToString();
        trace_attempts.push_back(record);
        last_error = resp.status();
        if (!resp.status().retryable()) break;
        BackOff(attempt, deadline_ms);
        continue;
      }
      total_in += resp->input_tokens;
      total_out += resp->output_tokens;
      record["input_tokens"] = resp->input_tokens;
      record["output_tokens"] = resp->output_tokens;
      record["raw_output"] = resp->raw_text;
      Status valid = ValidateOutput(step, *resp);
      if (!valid.ok()) {
        metrics_.decide_invalid_outputs.Inc();
        record["error"] = valid.ToString();
        trace_attempts.push_back(record);
        last_error = FailedPrecondition("the model's output was invalid on every attempt: " +
                                        valid.message());
        repair_feedback = "Your previous output was invalid: " + valid.message() +
                          ". Answer again with JSON that satisfies the schema.";
        continue;
      }
      trace_attempts.push_back(record);

      Decision d;
      d.decision_id = "dec_" + RandomHex(16);
      d.decision_key = key.key.key;
      d.step = cfg.name;
      d.output = resp->output;
      d.material = Json::parse(key.key.canonical, nullptr, false);
      d.provider = cfg.provider;
      d.model = cfg.model;
      d.prompt_version = cfg.prompt.version;
      d.created_at_ms = clock_.NowMillis();
      d.expires_at_ms = cfg.cache_window_ms == 0 ? 0 : d.created_at_ms + cfg.cache_window_ms;
      d.trace = {{"attempts", trace_attempts},
                 {"input_tokens", total_in},
                 {"output_tokens", total_out},
                 {"latency_ms", d.created_at_ms - started_ms},
                 {"request_id", req.request_id}};
      if (req.cache == CacheMode::kRefresh) {
        RETURN_IF_ERROR(store_.Replace(d));
        return d;
      }
      return store_.PutIfAbsent(d, d.created_at_ms);
    }
    LogEvent(LogLevel::kWarn, "decide_failed",
             {{"step", cfg.name},
              {"decision_key", key.key.key},
              {"request_id", req.request_id},
              {"attempts", trace_attempts},
              {"error", last_error.ToString()}});
    return last_error;
  }

  Status ValidateOutput(const CompiledStep& step, const ProviderResponse& resp) {
    if (resp.output.is_discarded() || (resp.output.is_null() && resp.raw_text != "null")) {
      return InvalidArgument("output is not valid JSON");
    }
    return step.schema->Validate(resp.output);
  }

  // Full-jitter exponential backoff, bounded by the step's deadline.
  void BackOff(int attempt, int64_t deadline_ms) {
    const int64_t base = 200, cap = 10'000;
    int64_t ceiling = std::min<int64_t>(cap, base << std::min(attempt - 1, 20));
    auto sleep_ms = static_cast<int64_t>(clock_.env().RandomUnit() * static_cast<double>(ceiling));
    int64_t left = deadline_ms - clock_.NowMillis();
    clock_.env().SleepMillis(std::max<int64_t>(0, std::min(sleep_ms, left)));
  }

  const Config& config_;
  DecisionStore& store_;
  std::map<std::string, std::unique_ptr<Provider>> providers_;
  StableClock& clock_;
  Metrics& metrics_;
  std::map<std::string, CompiledStep> steps_;
  Mutex flights_mu_;
  std::map<std::string, std::shared_ptr<Flight>> flights_ GUARDED_BY(flights_mu_);
};

}  // namespace

StatusOr<StepKey> ComputeStepKey(const StepConfig& step, const ProviderConfig& provider,
                                 const Json& input) {
  if (!input.is_object()) return InvalidArgument("input must be a JSON object", "/input");
  auto normalized = NormalizeInput(input, NormalizersOf(step));
  if (!normalized.ok()) {
    Status s = normalized.status();
    return s.WithField("/input" + s.field());
  }
  DecisionKeyParts parts;
  parts.provider = provider.name.empty() ? step.provider : provider.name;
  parts.model = step.model;
  parts.prompt_version = step.prompt.version;
  parts.temperature = step.temperature;
  parts.tools = step.tools;
  parts.output_schema = step.output_schema;
  parts.input = normalized.value();
  ASSIGN_OR_RETURN(KeyMaterial key, ComputeDecisionKey(parts));
  return StepKey{std::move(key), std::move(normalized).value()};
}

StatusOr<std::unique_ptr<DecideEngine>> DecideEngine::Create(
    const Config& config, DecisionStore& store,
    std::map<std::string, std::unique_ptr<Provider>> providers, StableClock& clock,
    Metrics& metrics) {
  auto engine =
      std::make_unique<DecideEngineImpl>(config, store, std::move(providers), clock, metrics);
  RETURN_IF_ERROR(engine->Init());
  return std::unique_ptr<DecideEngine>(std::move(engine));
}

}  // namespace idem
