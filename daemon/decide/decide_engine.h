// DecideEngine: the decide half of an LLM step.
//
// Decide(step, input) normalizes the input with the step's normalizers,
// derives the decision key (daemon/core/identity.h), and
//   - on a cache hit returns the stored decision without calling a provider
//     (and reports the cost it saved);
//   - on a miss runs the step's chain — the step's provider and model, then
//     each fallback — calling each candidate up to `attempts` times. Every
//     output is parsed, checked against the output schema (valijson) and the
//     step's value checks (JSONLogic, policies/*.yaml); a failure becomes a
//     repair attempt that tells the model the exact errors. Retryable
//     provider errors back off with full jitter (Env randomness), honouring
//     Retry-After; everything is bounded by the step's overall deadline
//     (`timeout`). Only a valid output is stored, as the cached decision.
//   - when the chain is exhausted and it ends in `escalate`, an Escalation
//     is stored with the context a human needs (what was asked, every
//     attempt's error, the best guess) and returned; it is cached nowhere: a
//     repeated decide for the same key returns the same open escalation
//     without calling a provider, until a human resolves it
//     (ResolveEscalation), whose output then becomes the cached decision.
// Identical concurrent misses share one run of the chain (single-flight):
// in this process through a table of flights; across daemons sharing one
// store through a named lease (DecideCoordination below).
//
// Cache modes: kDefault (use the cache), kRefresh (decide again and replace
// the cached decision; the old one stays readable by id), kOnly (never call
// a provider: NotFound on a miss).
//
// Errors: NotFound (unknown step, with field "/step"; or a kOnly miss),
// InvalidArgument (input that the normalizers reject, with its field),
// Unavailable (the chain failed and the step does not escalate; retryable()
// says whether a later retry may help).
//
// Thread-safety: Decide may be called from many threads at once.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "daemon/config/config.h"
#include "daemon/core/env.h"
#include "daemon/core/identity.h"
#include "daemon/core/status.h"
#include "daemon/decide/cost_ledger.h"
#include "daemon/obs/metrics.h"
#include "daemon/plans/notifier.h"
#include "daemon/store/store.h"
#include "providers/provider.h"

namespace idem {

enum class CacheMode { kDefault, kRefresh, kOnly };

struct DecideRequest {
  std::string step;
  Json input;
  CacheMode cache = CacheMode::kDefault;
  std::string request_id;
};

struct DecideResult {
  bool escalated = false;
  Decision decision;      // when !escalated
  Escalation escalation;  // when escalated
  bool cache_hit = false;
  bool joined = false;  // answered by a concurrent identical request's run
};

// What a replay changes (empty: as configured). A provider must be one the
// config declares; prompt_version must be the step's prompt.version or one
// of its other loaded versions (`prompts:`, StepConfig::other_prompts).
struct ReplayOptions {
  std::string provider;
  std::string model;
  std::optional<double> temperature;
  std::string prompt_version;
  std::string request_id;
  // When set, receives the run's trace ({attempts, input_tokens,
  // output_tokens, cost_usd}) whether or not an attempt gave a valid output,
  // so a caller can count what a failed replay cost and why it failed.
  Json* trace_out = nullptr;
};

// How the engine coordinates with other daemons on the same store (issue 13).
struct DecideCoordination {
  // Cross-daemon single flight (null: in this process only). A miss takes
  // the lease "decide:<decision_key>" (store.h, LeaseStore; TTL the step's
  // timeout plus kLeaseMarginMs) before it calls a provider, and releases it
  // once the decision (or escalation) is stored: one lease write and one
  // release per miss, nothing on a hit. A miss that finds the lease held by
  // another daemon calls no provider: it polls the store with backoff (5 ms
  // doubling to 200 ms; woken at once when an engine of this process ends a
  // run) until the decision or escalation appears, then answers with it
  // (joined); if the lease is released without one (that run failed) or
  // expires (that daemon died), it takes the lease and runs the chain itself.
  // The wait is bounded by the lease's TTL; past it the miss runs unguarded.
  // A refresh (kRefresh) is explicit and never waits on the lease.
  LeaseStore* leases = nullptr;
  std::string holder;  // the lease holder; "" : "decide-" + 16 random hex
  // Another process may replace decisions in this store (Store::shared()):
  // the engine then keeps its own memory of hits, each trusted for at most
  // recheck_ms after it was read from the store, so a decision refreshed,
  // or promoted by a human, on another daemon is served here within
  // recheck_ms. false (RocksDB: one process owns the store, whose own
  // write-through cache is exact): no memory here, no checks.
  bool shared_store = false;
  int64_t recheck_ms = 1'000;
  static constexpr int64_t kLeaseMarginMs = 5'000;
};

// The key material a step and input would be cached under, for `idem key`.
struct StepKey {
  KeyMaterial key;
  Json normalized_input;
};

class DecideEngine {
 public:
  virtual ~DecideEngine() = default;

  // `providers` maps provider names in `config` to adapters; every provider
  // a step or fallback names must be present (InvalidArgument otherwise).
  // Value-check files are loaded here (InvalidArgument with file and line).
  // `config`, the stores, `clock` and `metrics` must outlive the engine.
  // `notifier` (may be null; must outlive the engine) is told about each
  // escalation the engine stores: kind "escalation", event_id
  // "escalation:<escalation_id>", the summary as the reason, the resolve
  // call as the command and <link_base>/ui/#/escalations as the link.
  // `costs` (may be null; must outlive the engine) is told every provider
  // answer (tokens, USD) and every cache hit (the cached decision's
  // trace.cost_usd, saved). `coordination.leases` (may be null) must
  // outlive the engine.
  static StatusOr<std::unique_ptr<DecideEngine>> Create(
      const Config& config, DecisionStore& decisions, EscalationStore& escalations,
      std::map<std::string, std::unique_ptr<Provider>> providers, StableClock& clock,
      Metrics& metrics, Notifier* notifier = nullptr, CostLedger* costs = nullptr,
      DecideCoordination coordination = {});

  virtual StatusOr<DecideResult> Decide(const DecideRequest& request) = 0;
  virtual StatusOr<StepKey> KeyFor(const std::string& step, const Json& input) const = 0;

  // Decides `original`'s step again with its recorded (canonical) input,
  // changed as `options` say: attempts, repair and validation as usual, but
  // no fallback chain, no escalation and nothing stored (the cache is
  // untouched). The result carries the original's decision_key and
  // material and a fresh decision_id; its trace has every attempt; its
  // prompt_version is the one used. Unavailable (with the last error) when
  // no attempt gave a valid output; FailedPrecondition (field
  // "/prompt_version") for a prompt version the step has not loaded.
  virtual StatusOr<Decision> Replay(const Decision& original, const ReplayOptions& options) = 0;

  // Checks `output` for `step` as a model's output is checked: the step's
  // output schema, then its value checks with `input`. InvalidArgument with
  // the field ("/output/...") when it fails; NotFound for a step that is not
  // configured.
  virtual Status CheckOutput(const std::string& step, const Json& output,
                             const Json& input) const = 0;

  // A human's answer to an open escalation: validated like a model's output
  // (schema and value checks; InvalidArgument with the field otherwise),
  // stored as the cached decision for the escalation's key with
  // decided_by "human". FailedPrecondition when it is not open.
  virtual StatusOr<Decision> ResolveEscalation(const std::string& escalation_id, const Json& output,
                                               const std::string& actor,
                                               const std::string& note) = 0;
};

// Pure function shared by the engine and `idem key`: the decision key of
// `input` for `step` (normalizers applied).
StatusOr<StepKey> ComputeStepKey(const StepConfig& step, const ProviderConfig& provider,
                                 const Json& input);

// The same in two halves, as the engine does it: the step's part of the key
// material is canonicalized once (MakeStepKeyer), each input then costs a
// normalization, a JCS of the input and one SHA-256 (StepKeyOf).
StatusOr<DecisionKeyer> MakeStepKeyer(const StepConfig& step, const ProviderConfig& provider);
StatusOr<StepKey> StepKeyOf(const StepConfig& step, const DecisionKeyer& keyer, const Json& input);

// The price of one call in USD from config.prices[model]; 0 when unpriced.
double CallCostUsd(const Config& config, const std::string& model, int64_t input_tokens,
                   int64_t output_tokens, int64_t cached_input_tokens);

}  // namespace idem
