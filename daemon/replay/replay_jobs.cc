#include "daemon/replay/replay_jobs.h"

#include <algorithm>
#include <atomic>
#include <set>

#include "daemon/core/crypto.h"
#include "daemon/core/env.h"
#include "daemon/core/json_diff.h"
#include "daemon/obs/log.h"

namespace idem {

// ------------------------------------------------------------------ summary

void ReplaySummary::Add(const ReplayOutcome& o) {
  ++done_;
  input_tokens_ += o.input_tokens;
  output_tokens_ += o.output_tokens;
  cost_usd_ += o.cost_usd;
  original_cost_usd_ += o.original_cost_usd;
  switch (o.kind) {
    case ReplayOutcome::Kind::kUnchanged:
      ++unchanged_;
      return;
    case ReplayOutcome::Kind::kFailedValidation:
      ++failed_validation_;
      if (failed_ids_.size() < kMaxFailedIds) failed_ids_.push_back(o.decision_id);
      return;
    case ReplayOutcome::Kind::kError:
      ++errors_;
      if (error_samples_.size() < kMaxErrorSamples) {
        error_samples_.push_back({{"decision_id", o.decision_id}, {"error", o.error}});
      }
      return;
    case ReplayOutcome::Kind::kChanged:
      break;
  }
  ++changed_;
  // Each pointer once per decision, whichever way it changed.
  std::set<std::string> seen;
  for (const char* part : {"added", "removed", "changed"}) {
    auto it = o.diff.find(part);
    if (it == o.diff.end() || !it->is_array()) continue;
    for (const Json& entry : *it) {
      if (entry.is_object()) seen.insert(entry.value("pointer", ""));
    }
  }
  for (const std::string& p : seen) {
    auto it = pointers_.find(p);
    if (it != pointers_.end()) {
      ++it->second;
    } else if (pointers_.size() < kMaxPointers) {
      pointers_.emplace(p, 1);
    } else {
      ++other_pointers_;
    }
  }
}

Json ReplaySummary::ToJson() const {
  std::vector<std::pair<std::string, int64_t>> top(pointers_.begin(), pointers_.end());
  // Most first; ties in pointer order (the map's), so the answer is stable.
  std::stable_sort(top.begin(), top.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  if (top.size() > kTopPointers) top.resize(kTopPointers);
  Json top_json = Json::array();
  for (const auto& [pointer, count] : top) {
    top_json.push_back({{"pointer", pointer}, {"count", count}});
  }
  return {{"done", done_},
          {"changed", changed_},
          {"unchanged", unchanged_},
          {"failed_validation_count", failed_validation_},
          {"failed_validation", failed_ids_},
          {"errors", errors_},
          {"error_samples", error_samples_},
          {"top_changed_pointers", std::move(top_json)},
          {"other_pointers", other_pointers_},
          {"cost_usd", cost_usd_},
          {"original_cost_usd", original_cost_usd_},
          {"tokens", {{"input", input_tokens_}, {"output", output_tokens_}}}};
}

ReplayOutcome ReplayOne(DecideEngine& engine, const Decision& original, ReplayOptions options) {
  ReplayOutcome out;
  out.decision_id = original.decision_id;
  out.original_cost_usd = original.trace.is_object() ? original.trace.value("cost_usd", 0.0) : 0.0;
  Json trace;
  options.trace_out = &trace;
  StatusOr<Decision> replayed = engine.Replay(original, options);
  if (trace.is_object()) {
    out.input_tokens = trace.value("input_tokens", int64_t{0});
    out.output_tokens = trace.value("output_tokens", int64_t{0});
    out.cost_usd = trace.value("cost_usd", 0.0);
  }
  if (!replayed.ok()) {
    out.error = replayed.status().message();
    // No valid output: a validation failure when the last attempt answered
    // and its answer was refused; otherwise the provider or the deadline.
    const Json& attempts = trace.is_object() ? trace.value("attempts", Json::array()) : Json();
    const bool refused = replayed.status().code() == Code::kUnavailable && attempts.is_array() &&
                         !attempts.empty() && attempts.back().contains("errors");
    out.kind = refused ? ReplayOutcome::Kind::kFailedValidation : ReplayOutcome::Kind::kError;
    return out;
  }
  out.diff = JsonDiff(original.output, replayed->output);
  const bool same =
      out.diff["added"].empty() && out.diff["removed"].empty() && out.diff["changed"].empty();
  out.kind = same ? ReplayOutcome::Kind::kUnchanged : ReplayOutcome::Kind::kChanged;
  if (same) out.diff = Json();
  return out;
}

// --------------------------------------------------------------------- jobs

struct ReplayJobs::Job {
  ReplayJobRequest request;
  std::string replay_id;
  int64_t started_at_ms = 0;
  std::atomic<bool> cancel{false};
  std::atomic<bool> thread_done{false};

  Mutex mu;
  std::string state GUARDED_BY(mu) = "running";
  std::string phase GUARDED_BY(mu) = "selecting";
  std::string error GUARDED_BY(mu);
  int64_t total GUARDED_BY(mu) = 0;
  int64_t finished_at_ms GUARDED_BY(mu) = 0;
  ReplaySummary summary GUARDED_BY(mu);

  Json ToJson() {
    MutexLock lock(mu);
    Json j = summary.ToJson();
    j["replay_id"] = replay_id;
    j["state"] = state;
    j["phase"] = phase;
    j["step"] = request.step;
    j["prompt_version"] = request.prompt_version;
    j["model"] = request.model;
    j["provider"] = request.provider;
    if (request.temperature) j["temperature"] = *request.temperature;
    j["since_ms"] = request.since_ms;
    j["limit"] = request.limit;
    j["concurrency"] = request.concurrency;
    j["created_by"] = request.created_by;
    j["started_at_ms"] = started_at_ms;
    if (finished_at_ms != 0) j["finished_at_ms"] = finished_at_ms;
    j["total"] = total;
    if (!error.empty()) j["error"] = error;
    return j;
  }
};

ReplayJobs::ReplayJobs(const Config& config, DecisionStore& decisions, DecideEngine& engine,
                       StableClock& clock, ReplayJobsOptions options)
    : config_(config), decisions_(decisions), engine_(engine), clock_(clock), options_(options) {}

ReplayJobs::~ReplayJobs() { Stop(); }

StatusOr<std::string> ReplayJobs::Start(const ReplayJobRequest& r) {
  auto sit = config_.steps.find(r.step);
  if (sit == config_.steps.end()) {
    return Status(Code::kNotFound, "unknown step '" + r.step + "'", "/step");
  }
  const StepConfig& step = sit->second;
  if (!r.prompt_version.empty() && r.prompt_version != step.prompt.version &&
      step.other_prompts.count(r.prompt_version) == 0) {
    std::string loaded = step.prompt.version;
    for (const auto& entry : step.other_prompts) loaded += ", " + entry.first;
    return Status(Code::kFailedPrecondition,
                  "prompt version " + r.prompt_version + " is not loaded; step " + r.step +
                      " has " + loaded + " (add it under steps." + r.step + ".prompts)",
                  "/prompt_version");
  }
  if (!r.provider.empty() && config_.providers.count(r.provider) == 0) {
    return InvalidArgument("no provider named '" + r.provider + "'", "/provider");
  }
  if (r.limit < 1 || r.limit > options_.max_limit) {
    return InvalidArgument("limit must be from 1 to " + std::to_string(options_.max_limit),
                           "/limit");
  }
  if (r.concurrency < 1 || r.concurrency > options_.max_concurrency) {
    return InvalidArgument(
        "concurrency must be from 1 to " + std::to_string(options_.max_concurrency),
        "/concurrency");
  }
  auto job = std::make_shared<Job>();
  job->request = r;
  job->replay_id = "rpl_" + RandomHex(16);
  job->started_at_ms = clock_.NowMillis();
  MutexLock lock(mu_);
  if (stopped_) return FailedPrecondition("the daemon is stopping");
  ReapLocked();
  if (!r.idempotency_key.empty()) {
    for (const auto& [id, kept] : jobs_) {
      if (kept->request.idempotency_key == r.idempotency_key &&
          kept->request.created_by == r.created_by) {
        return id;
      }
    }
  }
  if (running_ >= options_.max_running) {
    std::string ids;
    for (const auto& [id, j] : jobs_) {
      if (!j->thread_done.load() && !j->cancel.load()) ids += (ids.empty() ? "" : ", ") + id;
    }
    return Status(Code::kAborted, std::to_string(running_) +
                                      " bulk replays are running already (at most " +
                                      std::to_string(options_.max_running) + " at once): " + ids +
                                      "; wait for one to finish (GET /v1/replays/{id})");
  }
  ++running_;
  jobs_.emplace(job->replay_id, job);
  threads_.emplace_back(job, std::thread([this, job] {
                          NameThread("replay");
                          Run(job);
                        }));
  LogEvent(LogLevel::kInfo, "replay_started",
           {{"replay_id", job->replay_id},
            {"step", r.step},
            {"prompt_version", r.prompt_version},
            {"model", r.model},
            {"limit", r.limit},
            {"request_id", r.request_id}});
  return job->replay_id;
}

StatusOr<Json> ReplayJobs::Get(const std::string& replay_id) {
  std::shared_ptr<Job> job;
  {
    MutexLock lock(mu_);
    auto it = jobs_.find(replay_id);
    if (it == jobs_.end()) {
      return NotFound("no bulk replay " + replay_id + " (finished ones are kept for the last " +
                      std::to_string(options_.max_finished) + " jobs, in memory)");
    }
    job = it->second;
  }
  return job->ToJson();
}

void ReplayJobs::Stop() {
  std::vector<std::pair<std::shared_ptr<Job>, std::thread>> threads;
  {
    MutexLock lock(mu_);
    stopped_ = true;
    for (auto& [id, job] : jobs_) job->cancel.store(true);
    threads.swap(threads_);
  }
  for (auto& entry : threads) {
    if (entry.second.joinable()) entry.second.join();
  }
}

void ReplayJobs::ReapLocked() {
  for (auto it = threads_.begin(); it != threads_.end();) {
    if (it->first->thread_done.load()) {
      if (it->second.joinable()) it->second.join();
      it = threads_.erase(it);
    } else {
      ++it;
    }
  }
}

void ReplayJobs::Finished(const std::string& replay_id) {
  MutexLock lock(mu_);
  --running_;
  finished_order_.push_back(replay_id);
  while (finished_order_.size() > options_.max_finished) {
    jobs_.erase(finished_order_.front());
    finished_order_.erase(finished_order_.begin());
  }
}

void ReplayJobs::Run(const std::shared_ptr<Job>& job) {
  const ReplayJobRequest& r = job->request;
  // Select: newest first, one per key, created at or after since_ms.
  std::vector<Decision> selected;
  Status failed = Status::Ok();
  {
    std::set<std::string> keys;
    std::string cursor;
    bool more = true;
    while (more && selected.size() < r.limit && !job->cancel.load()) {
      StatusOr<DecisionPage> page = decisions_.List(r.step, "", cursor, 500);
      if (!page.ok()) {
        failed = page.status();
        break;
      }
      for (Decision& d : page->items) {
        if (r.since_ms != 0 && d.created_at_ms < r.since_ms) {
          more = false;  // newest first: the rest are older still
          break;
        }
        if (!keys.insert(d.decision_key).second) continue;  // superseded
        // Only the cost of the trace is needed: raw outputs of up to 16 KB
        // per attempt, times 10,000 decisions, would not fit in memory.
        const double cost = d.trace.is_object() ? d.trace.value("cost_usd", 0.0) : 0.0;
        d.trace = {{"cost_usd", cost}};
        selected.push_back(std::move(d));
        if (selected.size() >= r.limit) break;
      }
      cursor = page->next_cursor;
      if (cursor.empty()) more = false;
    }
  }
  {
    MutexLock lock(job->mu);
    job->total = static_cast<int64_t>(selected.size());
    job->phase = "replaying";
  }

  ReplayOptions options;
  options.provider = r.provider;
  options.model = r.model;
  options.prompt_version = r.prompt_version;
  options.temperature = r.temperature;
  std::atomic<size_t> next{0};
  auto worker = [&] {
    while (!job->cancel.load()) {
      const size_t i = next.fetch_add(1);
      if (i >= selected.size()) return;
      ReplayOptions o = options;
      o.request_id = r.request_id.empty() ? job->replay_id : r.request_id;
      ReplayOutcome outcome = ReplayOne(engine_, selected[i], o);
      MutexLock lock(job->mu);
      job->summary.Add(outcome);
    }
  };
  if (failed.ok()) {
    const size_t n = std::min<size_t>(static_cast<size_t>(r.concurrency), selected.size());
    std::vector<std::thread> workers;
    for (size_t i = 1; i < n; ++i) workers.emplace_back(worker);
    if (n > 0) worker();  // this thread is one of them
    for (auto& t : workers) t.join();
  }

  Json summary;
  {
    MutexLock lock(job->mu);
    job->phase = "finished";
    job->finished_at_ms = clock_.NowMillis();
    if (!failed.ok()) {
      job->state = "failed";
      job->error = "selecting decisions: " + failed.message();
    } else if (job->cancel.load()) {
      job->state = "failed";
      job->error = "cancelled (the daemon is stopping)";
    } else {
      job->state = "done";
    }
    summary = job->summary.ToJson();
    summary["state"] = job->state;
  }
  LogEvent(LogLevel::kInfo, "replay_finished",
           {{"replay_id", job->replay_id},
            {"state", summary["state"]},
            {"done", summary["done"]},
            {"changed", summary["changed"]},
            {"failed_validation", summary["failed_validation_count"]},
            {"errors", summary["errors"]},
            {"cost_usd", summary["cost_usd"]}});
  Finished(job->replay_id);
  job->thread_done.store(true);
}

}  // namespace idem
