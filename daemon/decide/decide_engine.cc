#include "daemon/decide/decide_engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <kainjow/mustache.hpp>
#include <mutex>
#include <unordered_map>

#include "daemon/core/backoff.h"
#include "daemon/core/crypto.h"
#include "daemon/core/json.h"
#include "daemon/core/json_schema.h"
#include "daemon/core/mutex.h"
#include "daemon/decide/value_checks.h"
#include "daemon/obs/log.h"
#include "daemon/obs/trace.h"
#include "providers/errors.h"

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

// One link of a step's chain: a provider and a model.
struct Candidate {
  std::string provider_name;
  Provider* provider;
  std::string model;
  ProviderMetrics metrics;  // this pair's series (metrics.h)
};

struct CompiledStep {
  const StepConfig* config;
  const ProviderConfig* provider_config;
  std::optional<DecisionKeyer> keyer;  // everything of the key but the input, canonicalized once
  std::vector<Candidate> chain;
  bool escalate = false;
  std::unique_ptr<JsonSchema> schema;
  std::unique_ptr<ValueChecks> checks;  // null: none
  Counter* cache_hits = nullptr;        // this step's series
  Counter* cache_misses = nullptr;
};

// What the chain produced: a decision, an escalation, or an error.
struct ChainOutcome {
  bool escalated = false;
  Decision decision;
  Escalation escalation;
  bool elsewhere = false;  // another daemon's run produced it (cross-daemon single flight)
};

// Wakes the engines of this process that wait on another holder's decide
// lease whenever any of them ends a guarded run, so that waiting on an
// engine next door costs no polling delay. A generation count: a waiter
// reads it before it looks at the store, and wakes when it moved.
struct RunWake {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t gen = 0;

  static RunWake& Get() {
    static RunWake w;
    return w;
  }
  uint64_t Gen() {
    std::lock_guard<std::mutex> lock(mu);
    return gen;
  }
  void Notify() {
    {
      std::lock_guard<std::mutex> lock(mu);
      ++gen;
    }
    cv.notify_all();
  }
  void WaitFor(uint64_t seen, int64_t ms) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::milliseconds(ms), [&] { return gen != seen; });
  }
};

// The outcome a single-flight leader hands to the requests that joined it.
struct Flight {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::optional<StatusOr<ChainOutcome>> outcome;
};

class DecideEngineImpl final : public DecideEngine {
 public:
  DecideEngineImpl(const Config& config, DecisionStore& decisions, EscalationStore& escalations,
                   std::map<std::string, std::unique_ptr<Provider>> providers, StableClock& clock,
                   Metrics& metrics, Notifier* notifier, CostLedger* costs,
                   DecideCoordination coordination)
      : config_(config),
        store_(decisions),
        escalations_(escalations),
        providers_(std::move(providers)),
        clock_(clock),
        metrics_(metrics),
        notifier_(notifier),
        costs_(costs),
        leases_(coordination.leases),
        holder_(coordination.holder.empty() ? "decide-" + RandomHex(8) : coordination.holder),
        shared_store_(coordination.shared_store),
        recheck_ms_(std::max<int64_t>(0, coordination.recheck_ms)) {}

  Status Init() {
    for (const auto& [step_name, step] : config_.steps) {
      const std::string& name = step_name;  // clang 14 cannot capture a structured binding
      const std::string at = "/steps/" + JsonPointerToken(name);
      auto provider_of = [&](const std::string& pname,
                             const std::string& field) -> StatusOr<Provider*> {
        auto pit = providers_.find(pname);
        if (pit == providers_.end() || config_.providers.count(pname) == 0) {
          return InvalidArgument(
              "step " + name + " names provider '" + pname + "' which is not configured", field);
        }
        return pit->second.get();
      };
      CompiledStep c;
      c.config = &step;
      c.provider_config = &config_.providers.at(step.provider);
      ASSIGN_OR_RETURN(Provider * primary, provider_of(step.provider, at + "/provider"));
      c.chain.push_back(
          {step.provider, primary, step.model, metrics_.ForProvider(step.provider, step.model)});
      c.cache_hits = &metrics_.decide_cache_hits.Declare({name});
      c.cache_misses = &metrics_.decide_cache_misses.Declare({name});
      for (size_t i = 0; i < step.fallback.size(); ++i) {
        const Json& f = step.fallback[i];
        if (f.is_string() && f.get<std::string>() == "escalate") {
          c.escalate = true;
          continue;
        }
        std::string pname = f.value("provider", step.provider);
        ASSIGN_OR_RETURN(Provider * p,
                         provider_of(pname, at + "/fallback/" + std::to_string(i) + "/provider"));
        std::string model = f.value("model", step.model);
        ProviderMetrics pm = metrics_.ForProvider(pname, model);
        c.chain.push_back({pname, p, std::move(model), pm});
      }
      ASSIGN_OR_RETURN(DecisionKeyer keyer, MakeStepKeyer(step, *c.provider_config));
      c.keyer = std::move(keyer);
      auto schema = JsonSchema::Create(step.output_schema);
      if (!schema.ok()) return schema.status().Annotate("step " + name + " output schema");
      c.schema = std::move(schema).value();
      if (!step.checks_path.empty()) {
        auto checks = ValueChecks::Load(step.checks_path);
        if (!checks.ok()) return checks.status().Annotate("step " + name + " checks");
        c.checks = std::move(checks).value();
      }
      steps_.emplace(name, std::move(c));
    }
    return Status::Ok();
  }

  StatusOr<StepKey> KeyFor(const std::string& step, const Json& input) const override {
    auto it = steps_.find(step);
    if (it == steps_.end()) return Status(Code::kNotFound, "unknown step '" + step + "'", "/step");
    return StepKeyOf(*it->second.config, *it->second.keyer, input);
  }

  StatusOr<DecideResult> Decide(const DecideRequest& req) override {
    auto it = steps_.find(req.step);
    if (it == steps_.end()) {
      return Status(Code::kNotFound, "unknown step '" + req.step + "'", "/step");
    }
    const CompiledStep& step = it->second;
    ASSIGN_OR_RETURN(StepKey key, StepKeyOf(*step.config, *step.keyer, req.input));

    if (req.cache != CacheMode::kRefresh) {
      ASSIGN_OR_RETURN(std::optional<DecideResult> cached,
                       Cached(key.key.key, step, req.cache != CacheMode::kOnly));
      if (cached) return std::move(*cached);
      if (req.cache == CacheMode::kOnly) {
        return NotFound("no cached decision for this step and input (cache: only)");
      }
    }
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
          // arrives after a flight ended finds the outcome here.
          ASSIGN_OR_RETURN(std::optional<DecideResult> cached, Cached(key.key.key, step));
          if (cached) return std::move(*cached);
        }
        flight = std::make_shared<Flight>();
        flights_.emplace(key.key.key, flight);
        leader = true;
      }
    }
    // Counted here, not before the second look: a request that look
    // answered is a hit (Cached counted it), not a miss and a hit.
    step.cache_misses->Inc();

    if (!leader) {
      metrics_.decide_single_flight_joined.Inc();
      std::unique_lock<std::mutex> lock(flight->mu);
      flight->cv.wait(lock, [&] { return flight->done; });
      StatusOr<ChainOutcome> outcome = *flight->outcome;
      if (!outcome.ok()) return outcome.status();
      return ToResult(*outcome, false, true);
    }

    StatusOr<ChainOutcome> outcome = RunLeader(step, key, req);
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
    return ToResult(*outcome, false, outcome->elsewhere);
  }

  Status CheckOutput(const std::string& step_name, const Json& output,
                     const Json& input) const override {
    auto it = steps_.find(step_name);
    if (it == steps_.end()) return NotFound("step " + step_name + " is not configured");
    const CompiledStep& step = it->second;
    Status valid = step.schema->Validate(output);
    if (!valid.ok()) return valid.WithField("/output" + valid.field());
    if (step.checks) {
      auto failures = step.checks->Evaluate(output, input);
      if (!failures.empty()) {
        return InvalidArgument("value check failed: " + failures[0].message,
                               "/output" + failures[0].pointer);
      }
    }
    return Status::Ok();
  }

  StatusOr<Decision> ResolveEscalation(const std::string& escalation_id, const Json& output,
                                       const std::string& actor, const std::string& note) override {
    ASSIGN_OR_RETURN(Escalation esc, escalations_.Get(escalation_id));
    if (esc.state != "open") {
      return FailedPrecondition("escalation " + escalation_id + " is " + esc.state +
                                " already (decision " + esc.decision_id + ")");
    }
    auto it = steps_.find(esc.step);
    if (it == steps_.end())
      return FailedPrecondition("step " + esc.step + " is no longer configured");
    const CompiledStep& step = it->second;
    RETURN_IF_ERROR(CheckOutput(esc.step, output, esc.input));
    Decision d;
    d.decision_id = "dec_" + RandomHex(16);
    d.decision_key = esc.decision_key;
    d.step = esc.step;
    d.decided_by = "human";
    d.output = output;
    d.material = esc.material;
    d.provider = "human";
    d.model = actor;
    // The version the escalated key was made under, even if another is
    // the step's default by now: the key's material says which.
    d.prompt_version = esc.material.is_object() && esc.material.contains("prompt_version") &&
                               esc.material["prompt_version"].is_string()
                           ? esc.material["prompt_version"].get<std::string>()
                           : step.config->prompt.version;
    d.created_at_ms = clock_.NowMillis();
    d.trace_id = CurrentTraceId();
    d.expires_at_ms =
        step.config->cache_window_ms == 0 ? 0 : d.created_at_ms + step.config->cache_window_ms;
    d.trace = {{"escalation_id", esc.escalation_id},
               {"resolved_by", actor},
               {"note", note},
               {"cost_usd", esc.context.value("cost_usd", 0.0)}};
    // Resolve first: of two humans answering at once, one wins.
    RETURN_IF_ERROR(
        escalations_.Resolve(escalation_id, d.decision_id, actor, d.created_at_ms).status());
    RETURN_IF_ERROR(store_.Replace(d));
    Remember(d);
    return d;
  }

 private:
  // The run of this process's leader for a key, single-flight across
  // daemons through the decide lease (DecideCoordination).
  StatusOr<ChainOutcome> RunLeader(const CompiledStep& step, const StepKey& key,
                                   const DecideRequest& req) {
    auto run = [&] {
      return RunChain(step, step.config->prompt, key, req, step.chain, step.config->temperature,
                      /*dry_run=*/false);
    };
    if (leases_ == nullptr || req.cache == CacheMode::kRefresh) return run();
    const std::string name = "decide:" + key.key.key;
    const int64_t ttl =
        std::max<int64_t>(1, step.config->timeout_ms) + DecideCoordination::kLeaseMarginMs;
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(ttl);
    int64_t backoff_ms = kLeasePollFirstMs;
    RunWake& wake = RunWake::Get();
    while (true) {
      const uint64_t seen = wake.Gen();
      StatusOr<LeaseResult> lease = leases_->Acquire(name, holder_, "", ttl, clock_.NowMillis());
      if (!lease.ok()) {
        // The guard saves provider calls; it is not what keeps one decision
        // per key (PutIfAbsent is): run without it rather than fail.
        LogEvent(LogLevel::kWarn, "decide_lease_failed",
                 {{"decision_key", key.key.key}, {"error", lease.status().ToString()}});
        return run();
      }
      if (lease->outcome != LeaseOutcome::kHeld) {
        // A run elsewhere may have stored its decision and released just
        // before this acquire: then that decision is the answer.
        StatusOr<std::optional<DecideResult>> cached = Cached(key.key.key, step);
        StatusOr<ChainOutcome> outcome = Unavailable("unset");
        if (cached.ok() && cached->has_value()) {
          outcome = FromElsewhere(**cached);
        } else {
          outcome = run();
        }
        Status released = leases_->Release(name, holder_, lease->lease.token);
        if (!released.ok()) {
          LogEvent(LogLevel::kWarn, "decide_lease_release_failed",
                   {{"decision_key", key.key.key}, {"error", released.ToString()}});
        }
        wake.Notify();
        return outcome;
      }
      // Another daemon is deciding this key: its decision is ours too.
      ASSIGN_OR_RETURN(std::optional<DecideResult> cached, Cached(key.key.key, step));
      if (cached) return FromElsewhere(*cached);
      if (std::chrono::steady_clock::now() >= give_up) {
        LogEvent(LogLevel::kWarn, "decide_lease_wait_expired",
                 {{"decision_key", key.key.key}, {"holder", lease->lease.holder}});
        return run();
      }
      const int64_t left = std::max<int64_t>(1, lease->lease.expires_at_ms - clock_.NowMillis());
      wake.WaitFor(seen, std::min(backoff_ms, left));
      backoff_ms = std::min(backoff_ms * 2, kLeasePollMaxMs);
    }
  }

  ChainOutcome FromElsewhere(const DecideResult& r) {
    metrics_.decide_single_flight_joined.Inc();
    ChainOutcome o;
    o.escalated = r.escalated;
    o.decision = r.decision;
    o.escalation = r.escalation;
    o.elsewhere = true;
    return o;
  }

  // The engine's own memory of hits (shared stores only): a decision read
  // from the store, trusted for recheck_ms_.
  std::optional<Decision> Recall(const std::string& key, int64_t now_ms) {
    MutexLock lock(hot_mu_);
    auto it = hot_.find(key);
    if (it == hot_.end()) return std::nullopt;
    const HotEntry& e = it->second;
    if (now_ms - e.read_at_ms >= recheck_ms_ ||
        (e.decision.expires_at_ms != 0 && e.decision.expires_at_ms <= now_ms)) {
      hot_.erase(it);
      return std::nullopt;
    }
    return e.decision;
  }
  // An escalation opened because no model answered (providers down or
  // slow): not the key's answer; the next decide asks again.
  static bool IsOutage(const Escalation& e) {
    return e.context.is_object() && e.context.value("provider_outage", false) == true;
  }

  // The open escalation of `d`'s key, which a refresh (or a decide after an
  // outage) has just answered:
  // resolved by the daemon with `d`, so the operator's queue holds no
  // question the cache no longer asks, and a late human answer is refused
  // (409, already resolved) instead of silently replacing the model's.
  void CloseAnsweredEscalation(const Decision& d) {
    auto open = escalations_.OpenByKey(d.decision_key);
    if (!open.ok()) return;
    auto closed =
        escalations_.Resolve(open->escalation_id, d.decision_id, "idem", clock_.NowMillis());
    if (closed.ok()) {
      LogEvent(LogLevel::kInfo, "decide.escalation_answered",
               {{"escalation_id", open->escalation_id},
                {"decision_id", d.decision_id},
                {"step", d.step}});
    }
  }

  void Remember(const Decision& d) {
    if (!shared_store_) return;
    const int64_t now = clock_.NowMillis();
    MutexLock lock(hot_mu_);
    if (hot_.size() >= kHotMaxEntries && hot_.count(d.decision_key) == 0) {
      hot_.erase(hot_.begin());  // arbitrary: the bound matters, not the choice
    }
    HotEntry& e = hot_[d.decision_key] = HotEntry{d, now};
    // A hit needs the trace's summary only (store.h, GetByKey), not the attempts.
    if (TraceHasDetail(e.decision.trace)) {
      e.decision.trace = TraceSummary(e.decision.trace);
      e.decision.trace_whole = false;
    }
  }
  void Forget(const std::string& key) {
    if (!shared_store_) return;
    MutexLock lock(hot_mu_);
    hot_.erase(key);
  }

  // The cached answer for a key: a live decision, or an open escalation
  // (one opened by an outage only for `cache: only`, which never asks).
  StatusOr<std::optional<DecideResult>> Cached(const std::string& key, const CompiledStep& step,
                                               bool ask_after_outage = true) {
    StatusOr<Decision> hit = NotFound("");
    std::optional<Decision> recalled;
    if (shared_store_) recalled = Recall(key, clock_.NowMillis());
    if (recalled) {
      hit = std::move(*recalled);
    } else {
      hit = store_.GetByKey(key, clock_.NowMillis());
      if (hit.ok()) Remember(*hit);
      if (hit.status().code() == Code::kNotFound) Forget(key);
    }
    if (hit.ok()) {
      step.cache_hits->Inc();
      if (costs_ != nullptr) {
        const Json* cost = hit->trace.is_object() && hit->trace.contains("cost_usd")
                               ? &hit->trace["cost_usd"]
                               : nullptr;
        // A human's answer (its model field names the resolver) counts
        // under "human": a person is not a model, and the per-day rows are
        // bounded.
        costs_->RecordHit(clock_.NowMillis(), hit->step,
                          hit->provider == "human" ? std::string("human") : hit->model,
                          cost != nullptr && cost->is_number() ? cost->get<double>() : 0.0);
      }
      DecideResult r;
      r.decision = std::move(hit).value();
      r.cache_hit = true;
      return std::optional<DecideResult>(std::move(r));
    }
    if (hit.status().code() != Code::kNotFound) return hit.status();
    auto open = escalations_.OpenByKey(key);
    if (open.ok() && !(ask_after_outage && IsOutage(*open))) {
      DecideResult r;
      r.escalated = true;
      r.escalation = std::move(open).value();
      r.cache_hit = true;
      return std::optional<DecideResult>(std::move(r));
    }
    if (!open.ok() && open.status().code() != Code::kNotFound) return open.status();
    return std::optional<DecideResult>();
  }

  static DecideResult ToResult(const ChainOutcome& o, bool hit, bool joined) {
    DecideResult r;
    r.escalated = o.escalated;
    r.decision = o.decision;
    r.escalation = o.escalation;
    r.cache_hit = hit;
    r.joined = joined;
    return r;
  }

  // Schema, then value checks. Returns the errors to repair (empty: valid).
  std::vector<std::string> Check(const CompiledStep& step, const ProviderResponse& resp,
                                 const Json& input) {
    if (resp.output.is_discarded() || (resp.output.is_null() && resp.raw_text != "null")) {
      return {"the output is not valid JSON"};
    }
    std::vector<std::string> errors;
    for (const auto& e : step.schema->Errors(resp.output)) {
      errors.push_back((e.pointer.empty() ? "/" : e.pointer) + ": " + e.message);
    }
    if (!errors.empty() || !step.checks) return errors;
    for (const auto& f : step.checks->Evaluate(resp.output, input)) {
      errors.push_back((f.pointer.empty() ? "/" : f.pointer) + ": " + f.message);
    }
    return errors;
  }

  StatusOr<Decision> Replay(const Decision& original, const ReplayOptions& o) override {
    auto it = steps_.find(original.step);
    if (it == steps_.end()) {
      return FailedPrecondition("step " + original.step + " is no longer configured");
    }
    const CompiledStep& step = it->second;
    const Json& recorded = original.material;
    // What the request does not change is as the decision was made: its
    // prompt version (when still loaded) and temperature, not today's
    // defaults, so "replay" without options reproduces the setup.
    const std::string recorded_version = recorded.is_object() &&
                                                 recorded.contains("prompt_version") &&
                                                 recorded["prompt_version"].is_string()
                                             ? recorded["prompt_version"].get<std::string>()
                                             : "";
    std::string version = o.prompt_version;
    if (version.empty() && !recorded_version.empty() &&
        (recorded_version == step.config->prompt.version ||
         step.config->other_prompts.count(recorded_version) != 0)) {
      version = recorded_version;
    }
    const PromptConfig* prompt = &step.config->prompt;
    if (!version.empty() && version != prompt->version) {
      auto other = step.config->other_prompts.find(version);
      if (other == step.config->other_prompts.end()) {
        std::string loaded = prompt->version;
        for (const auto& entry : step.config->other_prompts) loaded += ", " + entry.first;
        return Status(Code::kFailedPrecondition,
                      "prompt version " + version + " is not loaded; step " + original.step +
                          " has " + loaded,
                      "/prompt_version");
      }
      prompt = &other->second;
    }
    std::optional<double> temperature = o.temperature;
    if (!temperature && recorded.is_object() && recorded.contains("temperature")) {
      if (recorded["temperature"].is_number()) temperature = recorded["temperature"].get<double>();
    }
    if (!temperature && !(recorded.is_object() && recorded.contains("temperature"))) {
      temperature = step.config->temperature;
    }
    std::string provider_name = o.provider.empty() ? original.provider : o.provider;
    if (provider_name == "human" || provider_name.empty()) {
      provider_name = step.chain.empty() ? "" : step.chain[0].provider_name;
    }
    auto pit = providers_.find(provider_name);
    if (pit == providers_.end()) {
      return Status(Code::kInvalidArgument, "no provider named '" + provider_name + "'",
                    "/provider");
    }
    std::string model = !o.model.empty() ? o.model
                        : original.provider == "human" || original.model.empty()
                            ? step.config->model
                            : original.model;
    // A model named by the request is not a label value: a pair the config
    // does not name counts under the overflow series.
    ProviderMetrics pm;
    for (const Candidate& c : step.chain) {
      if (c.provider_name == provider_name && c.model == model) pm = c.metrics;
    }
    if (pm.latency == nullptr) pm = OverflowProviderMetrics();
    std::vector<Candidate> chain = {Candidate{provider_name, pit->second.get(), model, pm}};
    // The replay's key is that of the material it runs with: the
    // original's when nothing changed, another when the provider, model,
    // prompt or temperature did (a replay provider answers by key, and must
    // not answer another setup with the recording).
    StepKey key;
    key.key.key = original.decision_key;
    key.key.canonical = original.material.dump();
    key.normalized_input = recorded.is_object() ? recorded.value("input", Json()) : Json();
    if (recorded.is_object()) {
      Json material = recorded;
      material["provider"] = provider_name;
      material["model"] = model;
      material["prompt_version"] = prompt->version;
      if (!prompt->hash.empty()) material["prompt_hash"] = prompt->hash;
      material["temperature"] = temperature ? Json(*temperature) : Json(nullptr);
      if (material != recorded) {
        ASSIGN_OR_RETURN(std::string canonical, CanonicalJson(material));
        key.key.key = Sha256Hex(canonical);
        key.key.canonical = std::move(canonical);
      }
    }
    DecideRequest req;
    req.step = original.step;
    req.request_id = o.request_id;
    ASSIGN_OR_RETURN(ChainOutcome out, RunChain(step, *prompt, key, req, chain, temperature,
                                                /*dry_run=*/true, o.trace_out));
    return std::move(out.decision);
  }

  // `prompt_config` is the step's prompt, or another loaded version (replay).
  // `trace_out` (may be null) receives the attempts, tokens and cost however
  // the run ends.
  StatusOr<ChainOutcome> RunChain(const CompiledStep& step, const PromptConfig& prompt_config,
                                  const StepKey& key, const DecideRequest& req,
                                  const std::vector<Candidate>& chain,
                                  std::optional<double> temperature, bool dry_run,
                                  Json* trace_out = nullptr) {
    const StepConfig& cfg = *step.config;
    Json context = {{"input", key.normalized_input}, {"step", cfg.name}, {"model", cfg.model}};
    ASSIGN_OR_RETURN(std::string prompt, RenderPrompt(prompt_config.text, context));

    const int64_t started_ms = clock_.NowMillis();
    const int64_t deadline_ms = started_ms + cfg.timeout_ms;
    const int attempts = std::max(1, cfg.attempts);
    Json trace = Json::array();
    Status last_error = Unavailable("no attempt was made");
    Json best_guess;              // the last output that parsed, even if it failed checks
    bool model_answered = false;  // some attempt got an answer (valid or not)
    int64_t total_in = 0, total_out = 0;
    double total_cost = 0;
    bool deadline_hit = false;
    // Runs on every way out of this function.
    struct TraceOut {
      Json* out;
      const Json& attempts;
      const int64_t& in;
      const int64_t& output;
      const double& cost;
      ~TraceOut() {
        if (out != nullptr) {
          *out = {{"attempts", attempts},
                  {"input_tokens", in},
                  {"output_tokens", output},
                  {"cost_usd", cost}};
        }
      }
    } trace_out_guard{trace_out, trace, total_in, total_out, total_cost};

    for (size_t link = 0; link < chain.size() && !deadline_hit; ++link) {
      const Candidate& cand = chain[link];
      std::string repair_feedback;
      for (int attempt = 1; attempt <= attempts; ++attempt) {
        int64_t now = clock_.NowMillis();
        if (now >= deadline_ms) {
          deadline_hit = true;
          last_error = DeadlineExceeded("step " + cfg.name + " ran out of its " +
                                        std::to_string(cfg.timeout_ms) + " ms deadline");
          break;
        }
        ProviderRequest preq;
        preq.step = cfg.name;
        preq.decision_key = key.key.key;
        preq.model = cand.model;
        preq.temperature = temperature;
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
        const auto wall0 = std::chrono::steady_clock::now();
        StatusOr<ProviderResponse> resp = cand.provider->Complete(preq);
        cand.metrics.latency->ObserveMicros(std::chrono::duration_cast<std::chrono::microseconds>(
                                                std::chrono::steady_clock::now() - wall0)
                                                .count());
        Json record = {{"attempt", attempt},
                       {"provider", cand.provider_name},
                       {"model", cand.model},
                       {"repair", !repair_feedback.empty()},
                       {"latency_ms", clock_.NowMillis() - t0}};
        if (!resp.ok()) {
          cand.metrics.errors[ProviderErrorClass(resp.status().code())]->Inc();
          // The provider's Retry-After travels as a marker in the message
          // (providers/errors.h): read, then kept out of what people see.
          const int64_t retry_after_ms = RetryAfterMillis(resp.status());
          last_error = WithoutRetryMarker(resp.status());
          record["error"] = last_error.ToString();
          if (retry_after_ms > 0) record["retry_after_ms"] = retry_after_ms;
          trace.push_back(record);
          if (!last_error.retryable()) break;  // next link of the chain
          if (attempt < attempts) BackOff(cfg, attempt, retry_after_ms, deadline_ms);
          continue;
        }
        model_answered = true;
        double cost = CallCostUsd(config_, cand.model, resp->input_tokens, resp->output_tokens,
                                  resp->cached_input_tokens);
        total_in += resp->input_tokens;
        total_out += resp->output_tokens;
        total_cost += cost;
        cand.metrics.tokens[0]->Inc(
            static_cast<uint64_t>(std::max<int64_t>(0, resp->input_tokens)));
        cand.metrics.tokens[1]->Inc(
            static_cast<uint64_t>(std::max<int64_t>(0, resp->output_tokens)));
        cand.metrics.tokens[2]->Inc(
            static_cast<uint64_t>(std::max<int64_t>(0, resp->cached_input_tokens)));
        cand.metrics.AddCostUsd(cost);
        if (costs_ != nullptr) {
          costs_->RecordCall(clock_.NowMillis(), cfg.name, cand.model, resp->input_tokens,
                             resp->output_tokens, cost);
        }
        record["input_tokens"] = resp->input_tokens;
        record["output_tokens"] = resp->output_tokens;
        record["cached_input_tokens"] = resp->cached_input_tokens;
        record["cost_usd"] = cost;
        record["finish_reason"] = resp->finish_reason;
        record["raw_output"] = CutUtf8(resp->raw_text, kMaxRawInTrace);
        std::vector<std::string> errors = Check(step, *resp, key.normalized_input);
        if (!errors.empty()) {
          metrics_.decide_invalid_outputs.Inc();
          if (!resp->output.is_null() && !resp->output.is_discarded()) best_guess = resp->output;
          record["errors"] = errors;
          trace.push_back(record);
          std::string joined;
          for (const auto& e : errors) joined += (joined.empty() ? "" : "; ") + e;
          last_error = Unavailable("the model's output failed validation: " + joined, false);
          repair_feedback =
              "Your previous answer was rejected. Fix exactly these problems and answer again "
              "with JSON that satisfies the schema:\n- " +
              [&] {
                std::string list;
                for (const auto& e : errors) list += (list.empty() ? "" : "\n- ") + e;
                return list;
              }();
          continue;
        }
        trace.push_back(record);

        Decision d;
        d.decision_id = "dec_" + RandomHex(16);
        d.decision_key = key.key.key;
        d.step = cfg.name;
        d.output = resp->output;
        d.material = Json::parse(key.key.canonical, nullptr, false);
        d.provider = cand.provider_name;
        d.model = cand.model;
        d.prompt_version = prompt_config.version;
        d.created_at_ms = clock_.NowMillis();
        d.trace_id = CurrentTraceId();
        d.expires_at_ms = cfg.cache_window_ms == 0 ? 0 : d.created_at_ms + cfg.cache_window_ms;
        d.trace = {{"attempts", trace},
                   {"input_tokens", total_in},
                   {"output_tokens", total_out},
                   {"cost_usd", total_cost},
                   {"latency_ms", d.created_at_ms - started_ms},
                   {"request_id", req.request_id}};
        ChainOutcome out;
        if (dry_run) {
          out.decision = std::move(d);
        } else if (req.cache == CacheMode::kRefresh) {
          RETURN_IF_ERROR(store_.Replace(d));
          out.decision = std::move(d);
          Remember(out.decision);
          CloseAnsweredEscalation(out.decision);
        } else {
          ASSIGN_OR_RETURN(out.decision, store_.PutIfAbsent(d, d.created_at_ms));
          Remember(out.decision);
          CloseAnsweredEscalation(out.decision);  // an outage's, asked again
        }
        return out;
      }
    }

    LogEvent(LogLevel::kWarn, "decide_failed",
             {{"step", cfg.name},
              {"decision_key", key.key.key},
              {"request_id", req.request_id},
              {"attempts", trace.size()},
              {"error", last_error.ToString()}});
    if (!step.escalate || dry_run) {
      return Status(Code::kUnavailable,
                    "step " + cfg.name + " found no valid decision after " +
                        std::to_string(trace.size()) + " attempts: " + last_error.message(),
                    "", last_error.retryable());
    }
    // No model answered, and a retry may: the providers are down or slow.
    // Its escalation tells a human, but the next decide asks again (Cached).
    const bool outage = !model_answered && last_error.retryable();
    // One open escalation a key: a refresh that fails again joins the one
    // a human may be answering already (a second would hide the first from
    // the open list, and two answers would overwrite each other).
    if (auto open = escalations_.OpenByKey(key.key.key); open.ok()) {
      if (!(IsOutage(*open) && !outage)) {
        ChainOutcome out;
        out.escalated = true;
        out.escalation = std::move(open).value();
        return out;
      }
      // The model answers again, but not validly: the outage's escalation
      // closes, and this one, which the cache answers, takes its place.
      (void)escalations_.Resolve(open->escalation_id, "", "idem", clock_.NowMillis());
    } else if (open.status().code() != Code::kNotFound) {
      return open.status();
    }
    metrics_.decide_escalations.Inc();
    Escalation esc;
    esc.escalation_id = "esc_" + RandomHex(16);
    esc.decision_key = key.key.key;
    esc.step = cfg.name;
    esc.input = key.normalized_input;
    esc.material = Json::parse(key.key.canonical, nullptr, false);
    esc.created_at_ms = clock_.NowMillis();
    Json errors = Json::array();
    for (const auto& a : trace) {
      if (a.contains("error")) errors.push_back(a["error"]);
      if (a.contains("errors")) {
        for (const auto& e : a["errors"]) errors.push_back(e);
      }
    }
    esc.context = {{"summary", "could not decide step " + cfg.name + " for input " +
                                   CutUtf8(key.normalized_input.dump(), 300, "...") + " after " +
                                   std::to_string(trace.size()) +
                                   " attempts; last error: " + last_error.message() +
                                   (outage ? std::string("; no model answered (the next decide of "
                                                         "this input asks again)")
                                           : std::string())},
                   {"provider_outage", outage},
                   {"attempts", trace},
                   {"errors", errors},
                   {"best_guess", best_guess},
                   {"cost_usd", total_cost},
                   {"request_id", req.request_id}};
    RETURN_IF_ERROR(escalations_.Put(esc));
    NotifyEscalation(esc);
    ChainOutcome out;
    out.escalated = true;
    out.escalation = std::move(esc);
    return out;
  }

  // Full-jitter exponential backoff, at least the upstream's Retry-After,
  // and never past the step's deadline.
  void BackOff(const StepConfig& cfg, int attempt, int64_t retry_after_ms, int64_t deadline_ms) {
    // Here Retry-After may exceed the step's cap: only the deadline bounds it.
    int64_t sleep_ms = std::max(FullJitterBackoffMs(attempt, cfg.retry_base_ms, cfg.retry_cap_ms,
                                                    clock_.env().RandomUnit()),
                                retry_after_ms);
    int64_t left = deadline_ms - clock_.NowMillis();
    clock_.env().SleepMillis(std::max<int64_t>(0, std::min(sleep_ms, left)));
  }

  // Tells a human that `esc` waits for an answer (after it is stored).
  void NotifyEscalation(const Escalation& esc) {
    if (notifier_ == nullptr) return;
    const std::string& link_base = config_.notifications.link_base;
    const std::string api = link_base.empty() ? "http://" + config_.server.listen : link_base;
    Notification n;
    n.event_id = "escalation:" + esc.escalation_id;
    n.kind = "escalation";
    n.subject_id = esc.escalation_id;
    n.reason = esc.context.value("summary", "step " + esc.step + " escalated");
    n.command = "curl -X POST " + api + "/v1/escalations/" + esc.escalation_id +
                "/resolve -H \"Authorization: Bearer $IDEM_TOKEN\" -H \"Content-Type: "
                "application/json\" -d '{\"output\": {...}}'";
    if (!link_base.empty()) n.link = link_base + "/ui/#/escalations";
    n.detail = {{"step", esc.step}, {"decision_key", esc.decision_key}};
    notifier_->Notify(n);
  }

  // The overflow series (label values "other") of the provider families.
  ProviderMetrics OverflowProviderMetrics() { return metrics_.ForProvider("other", "other"); }

  static constexpr size_t kMaxRawInTrace = 16 * 1024;
  static constexpr int64_t kLeasePollFirstMs = 5;
  static constexpr int64_t kLeasePollMaxMs = 200;
  static constexpr size_t kHotMaxEntries = 16'384;

  struct HotEntry {
    Decision decision;
    int64_t read_at_ms = 0;
  };

  const Config& config_;
  DecisionStore& store_;
  EscalationStore& escalations_;
  std::map<std::string, std::unique_ptr<Provider>> providers_;
  StableClock& clock_;
  Metrics& metrics_;
  Notifier* const notifier_;  // may be null
  CostLedger* const costs_;   // may be null
  std::map<std::string, CompiledStep> steps_;
  Mutex flights_mu_;
  std::map<std::string, std::shared_ptr<Flight>> flights_ GUARDED_BY(flights_mu_);
  LeaseStore* const leases_;  // may be null
  const std::string holder_;
  const bool shared_store_;
  const int64_t recheck_ms_;
  Mutex hot_mu_;
  std::unordered_map<std::string, HotEntry> hot_ GUARDED_BY(hot_mu_);
};

}  // namespace

StatusOr<DecisionKeyer> MakeStepKeyer(const StepConfig& step, const ProviderConfig& provider) {
  DecisionKeyParts parts;
  parts.step = step.name;
  parts.provider = provider.name.empty() ? step.provider : provider.name;
  parts.model = step.model;
  parts.prompt_version = step.prompt.version;
  parts.prompt_hash = step.prompt.hash;
  if (parts.prompt_hash.empty()) {
    ASSIGN_OR_RETURN(parts.prompt_hash,
                     ComputePromptHash(step.prompt.text, step.system_prompt, step.tools));
  }
  parts.temperature = step.temperature;
  if (step.tools_sha256.empty()) parts.tools = step.tools;
  if (step.output_schema_sha256.empty()) parts.output_schema = step.output_schema;
  parts.tools_hash = step.tools_sha256;
  parts.schema_hash = step.output_schema_sha256;
  return DecisionKeyer::Create(parts);
}

StatusOr<StepKey> StepKeyOf(const StepConfig& step, const DecisionKeyer& keyer, const Json& input) {
  if (!input.is_object()) return InvalidArgument("input must be a JSON object", "/input");
  auto normalized = NormalizeInput(input, NormalizersOf(step));
  if (!normalized.ok()) {
    Status s = normalized.status();
    return s.WithField("/input" + s.field());
  }
  ASSIGN_OR_RETURN(KeyMaterial key, keyer.Key(*normalized));
  return StepKey{std::move(key), std::move(normalized).value()};
}

StatusOr<StepKey> ComputeStepKey(const StepConfig& step, const ProviderConfig& provider,
                                 const Json& input) {
  ASSIGN_OR_RETURN(DecisionKeyer keyer, MakeStepKeyer(step, provider));
  return StepKeyOf(step, keyer, input);
}

double CallCostUsd(const Config& config, const std::string& model, int64_t input_tokens,
                   int64_t output_tokens, int64_t cached_input_tokens) {
  auto it = config.prices.find(model);
  if (it == config.prices.end() || !it->is_object()) return 0;
  const double in = it->value("input_per_mtok", 0.0);
  const double out = it->value("output_per_mtok", 0.0);
  const double cached = it->value("cached_input_per_mtok", in);
  const int64_t fresh = std::max<int64_t>(0, input_tokens - cached_input_tokens);
  return (static_cast<double>(fresh) * in + static_cast<double>(cached_input_tokens) * cached +
          static_cast<double>(output_tokens) * out) /
         1e6;
}

StatusOr<std::unique_ptr<DecideEngine>> DecideEngine::Create(
    const Config& config, DecisionStore& decisions, EscalationStore& escalations,
    std::map<std::string, std::unique_ptr<Provider>> providers, StableClock& clock,
    Metrics& metrics, Notifier* notifier, CostLedger* costs, DecideCoordination coordination) {
  auto engine =
      std::make_unique<DecideEngineImpl>(config, decisions, escalations, std::move(providers),
                                         clock, metrics, notifier, costs, std::move(coordination));
  RETURN_IF_ERROR(engine->Init());
  return std::unique_ptr<DecideEngine>(std::move(engine));
}

}  // namespace idem
