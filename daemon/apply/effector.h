// Effector: performs the external effect of one unit of work of an action
// kind (private to the apply component; ApplyEngine is the public face).
//
// One Execute call is one attempt. The engine has already claimed the work
// (it holds the lease) and records the outcome afterwards; the effector only
// talks to the target system and, for level-3 targets, records proof
// (external_ref) through the context the moment the effect lands.
//
// Thread-safety: implementations are immutable after construction and safe
// for concurrent calls.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "daemon/config/config.h"
#include "daemon/core/env.h"
#include "daemon/core/http_client.h"
#include "daemon/core/status.h"
#include "daemon/store/store.h"

namespace idem {

// What a successful attempt produced.
struct EffectResult {
  Json result;               // stored as WorkItem::result (the original answer)
  std::string external_ref;  // the target's id of the effect; may be empty
};

// The outcome of one attempt.
struct EffectAttempt {
  // OK: the effect landed (result holds it). Otherwise the failure, with
  // retryable() telling whether a later attempt can help.
  Status status;
  // The upstream asked to wait this long before retrying (0: it did not say).
  int64_t retry_after_ms = 0;
  // The least wait before the next attempt, past the kind's backoff cap:
  // the target is still working on an earlier attempt (a 409 "in progress"
  // from a target that dedups by Idempotency-Key), and asking again sooner
  // would only spend attempts until the work is dead while its effect lands.
  int64_t settle_ms = 0;
  // True when the attempt stopped without a verdict (a failpoint fired, or
  // proof of a landed effect could not be recorded): the engine must record
  // nothing and let the lease expire, so that a later attempt re-checks.
  bool abandoned = false;
  EffectResult result;
};

// Services the engine lends an effector for one attempt.
class EffectContext {
 public:
  virtual ~EffectContext() = default;
  // Durably stores `external_ref` on the running item (Journal::
  // RecordExternalRef with the attempt's lease token). Errors as the journal's.
  virtual Status RecordExternalRef(const std::string& external_ref) = 0;
};

// The answer of a lookup by fingerprint.
struct LookupResult {
  bool found = false;
  std::string external_ref;  // of the found record (may be empty)
  Json record;               // the found record (null when not found)
  size_t matches = 0;        // records the answer holds with this fingerprint (> 1: a duplicate)
};

// One record the target lists (for "extra" findings in reconciliation).
struct ListedRecord {
  std::string fingerprint;  // empty when the record carries none
  std::string external_ref;
};

class Effector {
 public:
  virtual ~Effector() = default;

  // InvalidArgument (with the field, "/args/...") when `args` lack what the
  // effector needs (e.g. the upsert key). Called before any claim, so bad
  // input never enters the journal.
  virtual Status Validate(const Json& args) const = 0;

  // How long one attempt may take at most (every HTTP call's timeout added
  // up); the engine's lease covers it plus a margin.
  virtual int64_t AttemptBudgetMs() const = 0;

  // After an attempt whose outcome is unknown (its call timed out: the
  // target may still be making the record), how long the next attempt
  // waits at least. An effector that finds its own earlier effect by a
  // lookup (check-then-act) needs that record to exist by then, or it
  // makes a second one; one whose target dedups by key would be answered
  // 409 "in progress" while the first call runs.
  virtual int64_t UnknownOutcomeSettleMs() const { return 0; }

  // One attempt of the effect of `item` (its work_id is the idempotency key
  // or fingerprint). Never throws.
  virtual EffectAttempt Execute(const WorkItem& item, EffectContext& context) = 0;

  // Whether Lookup / List are configured.
  virtual bool CanLookup() const = 0;
  virtual bool CanList() const = 0;
  // Looks `item` up in the target by its fingerprint. FailedPrecondition when
  // no lookup is configured; upstream failures as classified by
  // providers/errors.h.
  virtual StatusOr<LookupResult> Lookup(const WorkItem& item) = 0;
  // Every record the target lists. FailedPrecondition when not configured.
  virtual StatusOr<std::vector<ListedRecord>> List() = 0;
};

// The effector of `action` from its `effector` config node, or null when the
// node is empty (work of that kind is executed by clients). InvalidArgument
// (field "/actions/<kind>/effector/...") for an invalid node;
// FailedPrecondition when a header names an unset environment variable.
// `http` and `env` must outlive the effector.
StatusOr<std::unique_ptr<Effector>> MakeEffector(const ActionConfig& action, HttpClient& http,
                                                 Env& env);

}  // namespace idem
