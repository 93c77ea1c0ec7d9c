// DecideEngine: the decide half of an LLM step.
//
// Decide(step, input) normalizes the input with the step's normalizers,
// derives the decision key (daemon/core/identity.h), and
//   - on a cache hit returns the stored decision without calling a provider;
//   - on a miss calls the step's provider, parses the output, validates it
//     against the step's output schema and stores it; an invalid output is
//     never stored: the engine asks the model again with the exact errors
//     (a repair attempt) until the step's attempts run out.
// Identical concurrent misses share one provider call (single-flight): one
// caller leads, the others wait for its outcome.
//
// Cache modes: kDefault (use the cache), kRefresh (decide again and replace
// the cached decision; the old one stays readable by id), kOnly (never call
// a provider: NotFound on a miss).
//
// Errors: NotFound (unknown step, with field "/step"; or a kOnly miss),
// InvalidArgument (input that the normalizers reject, with its field),
// Unavailable / DeadlineExceeded when the provider failed on every attempt
// (retryable() tells the caller whether a later retry may help),
// FailedPrecondition when the model kept producing invalid output.
//
// Thread-safety: Decide may be called from many threads at once.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "daemon/config/config.h"
#include "daemon/core/env.h"
#include "daemon/core/identity.h"
#include "daemon/core/status.h"
#include "daemon/obs/metrics.h"
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
  Decision decision;
  bool cache_hit = false;
  bool joined = false;  // answered by a concurrent identical request's provider call
};

// The key material a step and input would be cached under, for `idem key`.
struct StepKey {
  KeyMaterial key;
  Json normalized_input;
};

class DecideEngine {
 public:
  virtual ~DecideEngine() = default;

  // `providers` maps provider names in `config` to adapters; every step's
  // provider must be present (InvalidArgument otherwise). `config`, `store`,
  // `clock` and `metrics` must outlive the engine.
  static StatusOr<std::unique_ptr<DecideEngine>> Create(
      const Config& config, DecisionStore& store,
      std::map<std::string, std::unique_ptr<Provider>> providers, StableClock& clock,
      Metrics& metrics);

  virtual StatusOr<DecideResult> Decide(const DecideRequest& request) = 0;
  virtual StatusOr<StepKey> KeyFor(const std::string& step, const Json& input) const = 0;
};

// Pure function shared by the engine and `idem key`: the decision key of
// `input` for `step` (normalizers applied).
StatusOr<StepKey> ComputeStepKey(const StepConfig& step, const ProviderConfig& provider,
                                 const Json& input);

}  // namespace idem
