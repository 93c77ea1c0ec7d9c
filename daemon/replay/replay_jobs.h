// Bulk replay (issue 11): the check before a prompt or model change. A job
// decides a step's recorded decisions again with other options
// (DecideEngine::Replay: another prompt version, model, provider or
// temperature), never touching the cache, and summarizes what would change.
//
// Selection: the step's decisions newest first (DecisionStore::List), only
// those created at or after `since_ms`, one per decision key (the newest,
// which is the cached one; superseded ones are skipped), at most `limit`.
//
// Running: each job runs on its own background thread with up to
// `concurrency` replay threads (never on the HTTP server's threads). At most
// `max_running` jobs run at once; Start refuses another with Aborted (HTTP
// 409). Stop() cancels the running jobs (they end "failed", error
// "cancelled"; a replay in flight finishes first) and joins every thread.
// A job holds its selected decisions without their traces (only the cost).
//
// Results: kept in memory only, for the running jobs and the last
// `max_finished` finished ones (older ones are forgotten; a restart forgets
// all). A job is ToJson():
//   {replay_id, state: running|done|failed, step, prompt_version, model,
//    provider, temperature?, since_ms, limit, concurrency, created_by,
//    started_at_ms, finished_at_ms?, phase: selecting|replaying|finished,
//    total, done, changed, unchanged, failed_validation_count,
//    failed_validation [decision ids, first 1,000], errors,
//    error_samples [{decision_id, error}, first 20],
//    top_changed_pointers [{pointer, count}, at most 20, most first],
//    cost_usd, original_cost_usd, tokens {input, output}, error?}
// A decision is "changed" when its replay's output differs from the
// original's (core/json_diff.h), "failed validation" when no attempt gave an
// output that passed the schema and value checks, an "error" when the
// replay failed otherwise (provider errors, the deadline). cost_usd and
// tokens count every attempt of every replay, failed ones included.
//
// Thread-safety: every method may be called from many threads at once.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "daemon/config/config.h"
#include "daemon/core/env.h"
#include "daemon/core/mutex.h"
#include "daemon/core/status.h"
#include "daemon/decide/decide_engine.h"
#include "daemon/store/store.h"

namespace idem {

// What one decision's replay found.
struct ReplayOutcome {
  enum class Kind { kUnchanged, kChanged, kFailedValidation, kError };
  Kind kind = Kind::kUnchanged;
  std::string decision_id;  // the original's
  Json diff;                // JsonDiff(original, replayed) when kChanged
  std::string error;        // kFailedValidation / kError
  int64_t input_tokens = 0, output_tokens = 0;
  double cost_usd = 0;           // the replay's, failed attempts included
  double original_cost_usd = 0;  // what the original decision cost
};

// The counts of a job, outcome by outcome. Pure; not thread-safe.
class ReplaySummary {
 public:
  static constexpr size_t kMaxFailedIds = 1000;
  static constexpr size_t kMaxErrorSamples = 20;
  static constexpr size_t kMaxPointers = 1000;  // distinct pointers counted; more: other_pointers
  static constexpr size_t kTopPointers = 20;

  void Add(const ReplayOutcome& outcome);
  // {done, changed, unchanged, failed_validation_count, failed_validation,
  //  errors, error_samples, top_changed_pointers, other_pointers, cost_usd,
  //  original_cost_usd, tokens}. Each pointer counts once per decision
  // whose diff names it (added, removed or changed); ties by pointer.
  Json ToJson() const;
  int64_t done() const { return done_; }

 private:
  int64_t done_ = 0, changed_ = 0, unchanged_ = 0, failed_validation_ = 0, errors_ = 0;
  std::vector<std::string> failed_ids_;
  Json error_samples_ = Json::array();
  std::map<std::string, int64_t> pointers_;
  int64_t other_pointers_ = 0;
  int64_t input_tokens_ = 0, output_tokens_ = 0;
  double cost_usd_ = 0, original_cost_usd_ = 0;
};

// Decides `original` again as `options` say and classifies the result.
ReplayOutcome ReplayOne(DecideEngine& engine, const Decision& original, ReplayOptions options);

struct ReplayJobRequest {
  std::string step;
  int64_t since_ms = 0;  // 0: no lower bound
  size_t limit = 1000;
  std::string provider, model, prompt_version;
  std::optional<double> temperature;
  int concurrency = 4;
  std::string created_by;
  std::string request_id;
  // Non-empty: a second Start with the same created_by and key, while the
  // first job is still kept, returns the first job's id (starts nothing).
  std::string idempotency_key;
};

struct ReplayJobsOptions {
  int max_running = 2;
  size_t max_finished = 20;
  size_t max_limit = 10'000;
  int max_concurrency = 16;
};

class ReplayJobs {
 public:
  // `config`, `decisions`, `engine` and `clock` must outlive the object.
  ReplayJobs(const Config& config, DecisionStore& decisions, DecideEngine& engine,
             StableClock& clock, ReplayJobsOptions options = {});
  ~ReplayJobs();  // Stop()

  // Checks the request and starts a job; returns its replay_id (or the
  // kept job's of the same caller and Idempotency-Key). NotFound
  // (field "/step") for an unknown step; FailedPrecondition (409, field
  // "/prompt_version") for a prompt version the step has not loaded;
  // InvalidArgument for an unknown provider ("/provider"), a limit or
  // concurrency out of range; Aborted (409) when max_running jobs run;
  // FailedPrecondition after Stop().
  StatusOr<std::string> Start(const ReplayJobRequest& request);
  // The job's ToJson (see above); NotFound when unknown or forgotten.
  StatusOr<Json> Get(const std::string& replay_id);
  // Cancels running jobs and joins their threads; later Starts fail.
  void Stop();

  struct Job;

 private:
  void Run(const std::shared_ptr<Job>& job);
  void Finished(const std::string& replay_id);
  // Joins the threads of jobs that ended.
  void ReapLocked() REQUIRES(mu_);

  const Config& config_;
  DecisionStore& decisions_;
  DecideEngine& engine_;
  StableClock& clock_;
  const ReplayJobsOptions options_;
  Mutex mu_;
  bool stopped_ GUARDED_BY(mu_) = false;
  std::map<std::string, std::shared_ptr<Job>> jobs_ GUARDED_BY(mu_);
  std::vector<std::string> finished_order_ GUARDED_BY(mu_);  // oldest first
  int running_ GUARDED_BY(mu_) = 0;
  std::vector<std::pair<std::shared_ptr<Job>, std::thread>> threads_ GUARDED_BY(mu_);
};

}  // namespace idem
