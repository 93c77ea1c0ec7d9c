// ReplayProvider: answers from a recorded run, offline and deterministically.
//
// Its file (provider `file:`) is a decisions export (`idem decisions export`,
// GET /v1/decisions/export): JSON Lines, one decision per line with its
// decision_key, key material and output. A call is answered by the decision
// key of the request (ProviderRequest::decision_key): the recorded output,
// verbatim, with finish_reason "replay" and zero tokens (nothing was spent).
//
// Users record real provider answers once, then run their agent's CI with
// the same config where the provider of that name has `type: replay`: the
// decision key covers the provider's name, the model, the prompt and the
// input, so a key recorded under provider "llm" is asked for again only
// under a provider named "llm".
//
// Loading verifies every line like an import does: the key is recomputed
// from the line's material (DecisionKeyOfMaterial) and a line whose key
// does not match, or that is not a decision, refuses the whole file with
// InvalidArgument "FILE:LINE: reason". Blank lines are skipped. The first
// line for a key wins (an export lists newest first). At most kMaxFileBytes.
//
// A key that is not in the file is FailedPrecondition (not retryable), naming
// the step and the key: the decide then fails or falls back like after any
// provider error; nothing crashes.
//
// Thread-safety: Complete may be called concurrently (the map is immutable
// after Create).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "daemon/config/config.h"
#include "daemon/core/status.h"
#include "providers/provider.h"

namespace idem {

class ReplayProvider final : public Provider {
 public:
  static constexpr size_t kMaxFileBytes = size_t{256} << 20;

  // Reads config.file_path.
  static StatusOr<std::unique_ptr<ReplayProvider>> Create(const ProviderConfig& config);
  // Same, from the file's text; `source` names it in messages.
  static StatusOr<std::unique_ptr<ReplayProvider>> FromText(std::string_view jsonl,
                                                            std::string source);

  StatusOr<ProviderResponse> Complete(const ProviderRequest& request) override;
  std::string type() const override { return "replay"; }

  size_t size() const { return outputs_.size(); }  // decisions loaded
  int64_t calls() const { return calls_.load(); }

 private:
  ReplayProvider(std::string source, std::map<std::string, Json> outputs)
      : source_(std::move(source)), outputs_(std::move(outputs)) {}

  const std::string source_;
  const std::map<std::string, Json> outputs_;  // decision_key -> output
  std::atomic<int64_t> calls_{0};
};

}  // namespace idem
