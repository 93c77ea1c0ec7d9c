#include "daemon/apply/apply_engine.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/fakes/serve.h"
#include "tests/unit/apply/apply_test_util.h"

namespace idem::testing {
namespace {

constexpr int64_t kHour = 3600 * 1000;

Json HeaderEffector(const ApplyHarness& h) {
  return Json{{"method", "POST"}, {"url", h.Url("/replies")}, {"idempotency", "header"}};
}

Json UpsertEffector(const ApplyHarness& h) {
  return Json{{"url", h.Url("/items/{key}")}, {"idempotency", "upsert"}, {"upsert_key", "/sku"}};
}

Json CheckThenActEffector(const ApplyHarness& h) {
  return Json{{"url", h.Url("/records")},
              {"idempotency", "check_then_act"},
              {"lookup", {{"url", h.Url("/records?fingerprint={fingerprint}")}}}};
}

}  // namespace

TEST_CASE("header level: a lost answer, its retry and a resubmission make one effect") {
  for (bool as_500 : {false, true}) {
    CAPTURE(as_500);
    ApplyHarness h;
    h.AddKind("send_reply", {"/ticket_id"}, HeaderEffector(h));
    Json args = {{"ticket_id", "T-1"}, {"text", "hello"}};
    h.fake().DropResponseAfterCommit(1, as_500);

    ActionOutcome first = h.Submit("send_reply", args);
    CHECK(first.kind == ActionOutcomeKind::kRetrying);  // the answer was lost after the commit
    CHECK(first.item.state == WorkState::kFailed);
    CHECK(h.fake().stats().effects == 1);

    // The client's at-least-once retry while the work waits out its backoff:
    // no attempt of its own (one retry budget, R20).
    ActionOutcome resubmitted = h.Submit("send_reply", args);
    CHECK(resubmitted.kind == ActionOutcomeKind::kRetrying);
    CHECK(h.fake().stats().raw_calls == 1);

    h.env_.Advance(10'000);
    CHECK(h.RunDue() == 1);
    WorkItem done = h.Get(h.WorkId("send_reply", args));
    CHECK(done.state == WorkState::kDone);
    CHECK(done.attempt == 2);
    CHECK(done.external_ref == "rep_1");
    CHECK(done.result["status"] == 201);

    ActionOutcome again = h.Submit("send_reply", args);
    CHECK(again.kind == ActionOutcomeKind::kDuplicate);
    CHECK(again.item.external_ref == "rep_1");

    auto stats = h.fake().stats();
    CHECK(stats.effects == 1);
    CHECK(stats.duplicates_by_key == 0);
    CHECK(stats.replays == 1);  // the retry got the stored answer
    CHECK(stats.raw_calls == 2);
    // The same key on both attempts: the work_id, never a per-attempt key.
    auto calls = h.fake().calls();
    REQUIRE(calls.size() == 2);
    CHECK(calls[0].headers["idempotency-key"] == done.work_id);
    CHECK(calls[1].headers["idempotency-key"] == done.work_id);
    CHECK(Json::parse(calls[0].body) == args);
  }
}

TEST_CASE("upsert level: a lost answer and its retry overwrite one record") {
  ApplyHarness h;
  h.AddKind("sync_item", {"/sku"}, UpsertEffector(h));
  Json args = {{"sku", "A/1 b"}, {"price", 10}};
  h.fake().DropResponseAfterCommit(1);

  CHECK(h.Submit("sync_item", args).kind == ActionOutcomeKind::kRetrying);
  h.env_.Advance(10'000);
  CHECK(h.RunDue() == 1);
  CHECK(h.Submit("sync_item", args).kind == ActionOutcomeKind::kDuplicate);

  auto stats = h.fake().stats();
  CHECK(stats.effects == 1);
  CHECK(stats.updates == 1);
  CHECK(stats.duplicates_by_key == 0);
  auto calls = h.fake().calls();
  REQUIRE(calls.size() == 2);
  CHECK(calls[0].method == "PUT");
  CHECK(calls[0].headers.count("idempotency-key") == 0);
  auto items = h.fake().Records("items");
  REQUIRE(items.size() == 1);
  CHECK(items[0]["id"] == "A/1 b");  // {key} was percent-encoded on the wire
  CHECK(h.Get(h.WorkId("sync_item", args)).external_ref == "A/1 b");
}

TEST_CASE("check_then_act: the lookup adopts a record created before a crash") {
  ApplyHarness h;
  h.AddKind("create_ticket", {"/ticket_id"}, CheckThenActEffector(h));
  Json args = {{"ticket_id", "T-9"}, {"title", "printer on fire"}};
  const std::string work_id = h.WorkId("create_ticket", args);

  // A process claimed the work, created the record with the fingerprint
  // embedded, and died before recording anything.
  ClaimRequest req;
  req.work_id = work_id;
  req.kind = "create_ticket";
  req.args = args;
  req.lease_ms = 5'000;
  req.now_ms = h.clock_.NowMillis();
  auto claim = h.journal().Claim(req);
  REQUIRE(claim.ok());
  REQUIRE(claim->outcome == ClaimOutcome::kClaimed);
  Json body = args;
  body["idem_fingerprint"] = work_id;
  HttpRequest create;
  create.url = h.Url("/records");
  create.body = body.dump();
  create.headers = {{"Content-Type", "application/json"}};
  auto created = h.http_->Send(create);
  REQUIRE(created.ok());
  REQUIRE(created->status == 201);
  CHECK(h.fake().stats().effects == 1);

  h.env_.Advance(5'001);  // the lease expires
  CHECK(h.RunDue() == 1);
  WorkItem done = h.Get(work_id);
  CHECK(done.state == WorkState::kDone);
  CHECK(done.external_ref == "rec_1");
  CHECK(done.result["found_existing"] == true);
  CHECK(h.fake().stats().effects == 1);
  CHECK(h.Submit("create_ticket", args).kind == ActionOutcomeKind::kDuplicate);
  CHECK(h.fake().stats().effects == 1);
}

TEST_CASE("check_then_act: a lost answer is found by the retry's lookup") {
  ApplyHarness h;
  h.AddKind("create_ticket", {"/ticket_id"}, CheckThenActEffector(h));
  Json args = {{"ticket_id", "T-2"}};
  h.fake().DropResponseAfterCommit(1);
  CHECK(h.Submit("create_ticket", args).kind == ActionOutcomeKind::kRetrying);
  h.env_.Advance(10'000);
  CHECK(h.RunDue() == 1);
  WorkItem done = h.Get(h.WorkId("create_ticket", args));
  CHECK(done.state == WorkState::kDone);
  CHECK(done.external_ref == "rec_1");
  auto stats = h.fake().stats();
  CHECK(stats.effects == 1);
  CHECK(stats.raw_calls == 1);  // the retry only looked
  CHECK(stats.lookups == 2);
  auto records = h.fake().Records("records");
  REQUIRE(records.size() == 1);
  CHECK(records[0]["idem_fingerprint"] == done.work_id);
}

TEST_CASE(
    "check_then_act: after a call that timed out, the retry waits for the slow create to land "
    "and finds it, instead of making a second record") {
  ApplyHarness h;
  ActionConfig& k = h.AddKind("create_ticket", {"/ticket_id"}, CheckThenActEffector(h));
  k.retry.base_ms = 1;  // a jittered backoff of about nothing
  k.retry.cap_ms = 1;
  k.retry.timeout_ms = 300;
  Json args = {{"ticket_id", "T-slow"}};
  h.fake().TimeoutNext(1, 700);  // the target makes it, 700 ms later
  ActionOutcome first = h.Submit("create_ticket", args);
  REQUIRE(first.kind == ActionOutcomeKind::kRetrying);
  const WorkItem failed = h.Get(h.WorkId("create_ticket", args));
  CHECK(failed.next_attempt_at_ms - failed.updated_at_ms >= 300);
  // Not due before then...
  h.env_.Advance(100);
  CHECK(h.RunDue() == 0);
  // ...and by then the slow create has landed: the lookup finds it.
  REQUIRE(h.fake().WaitForEffects(1, std::chrono::seconds(30)));
  h.env_.Advance(300);
  CHECK(h.RunDue() == 1);
  WorkItem done = h.Get(h.WorkId("create_ticket", args));
  CHECK(done.state == WorkState::kDone);
  CHECK(h.fake().Records("records").size() == 1);
}

TEST_CASE(
    "header: a call that timed out is not asked again before it can finish, and the target's 409 "
    "in progress waits a call's time, so the work ends done with one effect instead of dead") {
  ApplyHarness h;
  ActionConfig& k = h.AddKind("send_reply", {"/ticket_id"}, HeaderEffector(h));
  k.retry.attempts = 3;
  k.retry.base_ms = 1;  // a jittered backoff of about nothing, capped far below the call
  k.retry.cap_ms = 1;
  k.retry.timeout_ms = 300;
  Json args = {{"ticket_id", "T-slow"}};
  h.fake().TimeoutNext(1, 900);  // the target makes it, 900 ms later
  ActionOutcome first = h.Submit("send_reply", args);
  REQUIRE(first.kind == ActionOutcomeKind::kRetrying);
  const std::string work_id = h.WorkId("send_reply", args);
  WorkItem failed = h.Get(work_id);
  CHECK(failed.next_attempt_at_ms - failed.updated_at_ms >= 300);
  // The second attempt, while the first still runs there: 409, and the next
  // one waits a call's time too instead of the 1 ms backoff.
  h.env_.Advance(300);
  CHECK(h.RunDue() == 1);
  failed = h.Get(work_id);
  CHECK(failed.state == WorkState::kFailed);
  CHECK(failed.last_error.find("409") != std::string::npos);
  CHECK(failed.next_attempt_at_ms - failed.updated_at_ms >= 300);
  h.env_.Advance(1);
  CHECK(h.RunDue() == 0);
  // By then the first call has finished: the third attempt replays its answer.
  REQUIRE(h.fake().WaitForEffects(1, std::chrono::seconds(30)));
  h.env_.Advance(300);
  CHECK(h.RunDue() == 1);
  WorkItem done = h.Get(work_id);
  CHECK(done.state == WorkState::kDone);
  CHECK(h.fake().stats().effects == 1);
}

TEST_CASE("check_then_act: external_ref recorded before a crash finishes the work without a call") {
  ApplyHarness h;
  FailpointsGuard guard;
  h.AddKind("create_ticket", {"/ticket_id"}, CheckThenActEffector(h));
  Json args = {{"ticket_id", "T-3"}};
  REQUIRE(Failpoints::Set("apply.after_effect=error").ok());
  auto failed = h.engine().Submit("create_ticket", args, "", "");
  CHECK_FALSE(failed.ok());
  Failpoints::Clear();
  const std::string work_id = h.WorkId("create_ticket", args);
  WorkItem running = h.Get(work_id);
  CHECK(running.state == WorkState::kRunning);
  CHECK(running.external_ref == "rec_1");  // proof first

  h.env_.Advance(10'000);
  CHECK(h.RunDue() == 1);
  WorkItem done = h.Get(work_id);
  CHECK(done.state == WorkState::kDone);
  CHECK(done.external_ref == "rec_1");
  CHECK(done.result["recovered"] == true);
  CHECK(h.fake().stats().effects == 1);
  CHECK(h.fake().stats().raw_calls == 1);
}

TEST_CASE(
    "each failpoint that errors leaves the lease to expire; a worker finishes with one effect") {
  for (const char* fp :
       {"apply.after_claim", "apply.after_effect", "apply.after_record", "apply.after_lookup"}) {
    CAPTURE(fp);
    ApplyHarness h;
    FailpointsGuard guard;
    h.AddKind("create_ticket", {"/ticket_id"}, CheckThenActEffector(h));
    Json args = {{"ticket_id", "T-4"}};
    REQUIRE(Failpoints::Set(std::string(fp) + "=error").ok());
    auto outcome = h.engine().Submit("create_ticket", args, "", "");
    Failpoints::Clear();
    const std::string work_id = h.WorkId("create_ticket", args);
    if (std::string(fp) == "apply.after_record") {
      // The completion is durable already; the caller only saw an error.
      CHECK_FALSE(outcome.ok());
      CHECK(h.Get(work_id).state == WorkState::kDone);
    } else {
      CHECK_FALSE(outcome.ok());
      CHECK(h.Get(work_id).state == WorkState::kRunning);
      CHECK(h.Submit("create_ticket", args).kind == ActionOutcomeKind::kBusy);
      h.env_.Advance(10'000);
      CHECK(h.RunDue() == 1);
    }
    CHECK(h.Get(work_id).state == WorkState::kDone);
    CHECK(h.fake().stats().effects == 1);
    CHECK(h.fake().stats().duplicates_by_key == 0);
  }
}

TEST_CASE(
    "a store briefly unreachable after the effect is tried again within the lease: one effect") {
  // idempotency none: the target cannot drop a repeat, so only the journal
  // stands between a database blip and a second effect.
  ApplyHarness h;
  FailpointsGuard guard;
  h.AddKind("send_reply", {"/ticket_id"},
            Json{{"method", "POST"}, {"url", h.Url("/replies")}, {"idempotency", "none"}});
  Json args = {{"ticket_id", "T-R"}};
  REQUIRE(Failpoints::Set("apply.record_completion=1-4*error").ok());
  ActionOutcome out = h.Submit("send_reply", args);
  CHECK(out.kind == ActionOutcomeKind::kExecuted);
  CHECK(out.item.state == WorkState::kDone);
  CHECK(out.item.attempt == 1);
  CHECK(h.env_.total_slept_ms() == 50 + 100 + 200 + 400);
  CHECK(h.metrics_.store_errors.Get() == 4);
  h.env_.Advance(60'000);
  CHECK(h.RunDue() == 0);
  CHECK(h.fake().stats().effects == 1);
}

TEST_CASE("a store unreachable past the lease: recording gives up before the lease ends") {
  ApplyHarness h;
  FailpointsGuard guard;
  h.AddKind("send_reply", {"/ticket_id"}, HeaderEffector(h));
  Json args = {{"ticket_id", "T-S"}};
  REQUIRE(Failpoints::Set("apply.record_completion=error").ok());
  const int64_t t0 = h.clock_.NowMillis();
  auto out = h.engine().Submit("send_reply", args, "", "");
  CHECK_FALSE(out.ok());
  CHECK(out.status().code() == Code::kUnavailable);
  WorkItem running = h.Get(h.WorkId("send_reply", args));
  CHECK(running.state == WorkState::kRunning);
  CHECK(h.clock_.NowMillis() < running.locked_until_ms);  // the next holder waits for it
  CHECK(h.clock_.NowMillis() - t0 > 1'000);               // and it did try for a while
}

TEST_CASE("a retryable failure is retried with full-jitter backoff, then done") {
  ApplyHarness h;
  h.AddKind("send_reply", {"/ticket_id"}, HeaderEffector(h));
  Json args = {{"ticket_id", "T-5"}};
  h.fake().FailNext(2, 503);
  const int64_t t0 = h.clock_.NowMillis();

  ActionOutcome first = h.Submit("send_reply", args);
  REQUIRE(first.kind == ActionOutcomeKind::kRetrying);
  CHECK(first.item.attempt == 1);
  CHECK(first.item.next_attempt_at_ms >= t0);
  CHECK(first.item.next_attempt_at_ms <= t0 + 1'000);  // [0, base]
  CHECK(first.item.last_error.find("503") != std::string::npos);

  h.env_.Advance(1'000);
  CHECK(h.RunDue() == 1);
  WorkItem second = h.Get(first.item.work_id);
  CHECK(second.state == WorkState::kFailed);
  CHECK(second.attempt == 2);
  CHECK(second.next_attempt_at_ms <= h.clock_.NowMillis() + 2'000);  // [0, 2 * base]

  h.env_.Advance(2'000);
  CHECK(h.RunDue() == 1);
  WorkItem done = h.Get(first.item.work_id);
  CHECK(done.state == WorkState::kDone);
  CHECK(done.attempt == 3);
  CHECK(h.fake().stats().raw_calls == 3);
  CHECK(h.fake().stats().effects == 1);
  CHECK(h.metrics_.work_failed.Get() == 2);
  CHECK(h.metrics_.work_completed.Get() == 1);
}

TEST_CASE("a worker does not spend an attempt before the work is due") {
  ApplyHarness h;
  h.AddKind("send_reply", {"/ticket_id"}, HeaderEffector(h));
  h.config_.actions["send_reply"].retry.base_ms = 60'000;
  h.config_.actions["send_reply"].retry.cap_ms = 60'000;
  h.fake().FailNext(1, 503, /*retry_after_s=*/30);
  ActionOutcome first = h.Submit("send_reply", {{"ticket_id", "T-6"}});
  REQUIRE(first.kind == ActionOutcomeKind::kRetrying);
  CHECK(first.item.next_attempt_at_ms >= h.clock_.NowMillis() + 30'000);  // Retry-After honoured
  CHECK(h.RunDue() == 0);
  CHECK(h.fake().stats().raw_calls == 1);
}

TEST_CASE("Retry-After is capped by the kind's cap") {
  ApplyHarness h;
  h.AddKind("send_reply", {"/ticket_id"}, HeaderEffector(h));
  h.fake().FailNext(1, 429, /*retry_after_s=*/3600);
  const int64_t t0 = h.clock_.NowMillis();
  ActionOutcome first = h.Submit("send_reply", {{"ticket_id", "T-7"}});
  REQUIRE(first.kind == ActionOutcomeKind::kRetrying);
  CHECK(first.item.next_attempt_at_ms == t0 + 10'000);
}

TEST_CASE("a permanent 4xx makes the work dead at once") {
  ApplyHarness h;
  h.AddKind("send_reply", {"/ticket_id"}, HeaderEffector(h));
  h.fake().FailNext(1, 400);
  ActionOutcome outcome = h.Submit("send_reply", {{"ticket_id", "T-8"}});
  CHECK(outcome.kind == ActionOutcomeKind::kDead);
  CHECK(outcome.item.state == WorkState::kDead);
  CHECK(outcome.item.attempt == 1);
  CHECK(outcome.item.last_error.find("HTTP 400") != std::string::npos);
  auto dead = h.journal().DeadLetters(10);
  REQUIRE(dead.ok());
  REQUIRE(dead->size() == 1);
  CHECK((*dead)[0].work_id == outcome.item.work_id);
  CHECK(h.metrics_.work_dead.Get() == 1);
  // A resubmission does not revive a dead letter.
  CHECK(h.Submit("send_reply", {{"ticket_id", "T-8"}}).kind == ActionOutcomeKind::kDead);
  CHECK(h.fake().stats().raw_calls == 1);
  CHECK(h.fake().stats().effects == 0);
}

TEST_CASE("five retryable failures make a dead letter; a requeue then succeeds") {
  ApplyHarness h;
  h.AddKind("send_reply", {"/ticket_id"}, HeaderEffector(h));
  Json args = {{"ticket_id", "T-10"}};
  h.fake().FailNext(5, 502);
  ActionOutcome outcome = h.Submit("send_reply", args);
  const std::string work_id = outcome.item.work_id;
  for (int i = 0; i < 4; ++i) {
    CHECK(h.Get(work_id).state == WorkState::kFailed);
    h.env_.Advance(10'000);
    CHECK(h.RunDue() == 1);
  }
  WorkItem dead = h.Get(work_id);
  CHECK(dead.state == WorkState::kDead);
  CHECK(dead.attempt == 5);
  CHECK(h.fake().stats().raw_calls == 5);
  CHECK(h.fake().stats().effects == 0);

  h.env_.Advance(10'000);
  CHECK(h.RunDue() == 0);  // dead letters wait for a human
  auto requeued = h.journal().Requeue(work_id, h.clock_.NowMillis());
  REQUIRE(requeued.ok());
  CHECK(h.RunDue() == 1);
  WorkItem done = h.Get(work_id);
  CHECK(done.state == WorkState::kDone);
  CHECK(h.fake().stats().effects == 1);
}

TEST_CASE("Replay runs a dead letter again at once; it refuses work that is not dead") {
  ApplyHarness h;
  h.AddKind("send_reply", {"/ticket_id"}, HeaderEffector(h));
  h.fake().FailNext(1, 404);
  ActionOutcome dead = h.Submit("send_reply", {{"ticket_id", "T-11"}});
  REQUIRE(dead.kind == ActionOutcomeKind::kDead);
  auto replayed = h.engine().Replay(dead.item.work_id);
  REQUIRE(replayed.ok());
  CHECK(replayed->kind == ActionOutcomeKind::kExecuted);
  CHECK(replayed->item.state == WorkState::kDone);
  CHECK(h.fake().stats().effects == 1);

  auto again = h.engine().Replay(dead.item.work_id);
  CHECK(again.status().code() == Code::kFailedPrecondition);
  CHECK(h.engine().Replay("no-such-work").status().code() == Code::kNotFound);
}

TEST_CASE(
    "a replay whose requeued work a worker claims first answers that its work is under way, not "
    "that another replay runs") {
  ApplyHarness h;
  h.AddKind("send_reply", {"/ticket_id"}, HeaderEffector(h));
  h.fake().FailNext(1, 404);
  ActionOutcome dead = h.Submit("send_reply", {{"ticket_id", "T-12"}});
  REQUIRE(dead.kind == ActionOutcomeKind::kDead);
  // The worker (another daemon's, on a shared store) claims it between the
  // replay's requeue and the replay's own claim, 1 s later, and is still
  // in its 1.5 s effect then, whenever in that second it claimed.
  h.fake().SetLatencyMs(1'500);
  REQUIRE(Failpoints::Set("apply.replay_after_requeue=delay(1000)").ok());
  auto other = ApplyEngine::Create(h.config_, h.store_->journal(), *h.http_, h.clock_, h.metrics_,
                                   h.options_);
  REQUIRE(other.ok());
  std::thread worker([&] {
    // Polls until the requeued work is due and it has run it.
    for (int i = 0; i < 500; ++i) {
      auto ran = (*other)->RunDueOnce(10);
      if (ran.ok() && *ran > 0) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  auto replayed = h.engine().Replay(dead.item.work_id);
  worker.join();
  Failpoints::Clear();
  REQUIRE_MESSAGE(replayed.ok(), replayed.status().ToString());
  CHECK(replayed->kind == ActionOutcomeKind::kRetrying);
  CHECK(h.Get(dead.item.work_id).state == WorkState::kDone);
  CHECK(h.fake().stats().effects == 1);
  (*other)->Stop();
}

TEST_CASE("16 threads submitting the same 50 actions concurrently make exactly 50 effects") {
  for (const char* level : {"header", "none"}) {
    CAPTURE(level);
    ApplyHarness h;
    Json http = HeaderEffector(h);
    http["idempotency"] = level;
    h.AddKind("send_reply", {"/ticket_id"}, http);
    h.fake().SetLatencyMs(2);
    h.engine();  // built before the threads start
    constexpr int kThreads = 16;
    constexpr int kActions = 50;
    std::atomic<int> executed{0}, duplicates{0}, busy{0}, errors{0};
    std::mutex error_mu;
    std::string first_error;  // what went wrong, for the failure message
    auto note_error = [&](const std::string& what) {
      ++errors;
      std::lock_guard lock(error_mu);
      if (first_error.empty()) first_error = what;
    };
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        std::vector<int> order(kActions);
        for (int i = 0; i < kActions; ++i) order[i] = i;
        std::shuffle(order.begin(), order.end(), std::mt19937(t));
        for (int i : order) {
          Json args = {{"ticket_id", "T-" + std::to_string(i)}, {"text", "hi"}};
          auto outcome = h.engine().Submit("send_reply", args, "run-1", "");
          if (!outcome.ok()) {
            note_error(outcome.status().ToString());
            continue;
          }
          switch (outcome->kind) {
            case ActionOutcomeKind::kExecuted:
              ++executed;
              break;
            case ActionOutcomeKind::kDuplicate:
              ++duplicates;
              break;
            case ActionOutcomeKind::kBusy:
              ++busy;
              break;
            default:
              note_error("outcome " + std::to_string(static_cast<int>(outcome->kind)) + ": " +
                         outcome->item.last_error);
              break;
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    CHECK_MESSAGE(errors == 0, first_error);
    CHECK(executed == kActions);
    CHECK(duplicates + busy == kThreads * kActions - kActions);
    auto stats = h.fake().stats();
    CHECK(stats.effects == kActions);
    CHECK(stats.raw_calls == kActions);
    CHECK(stats.duplicates_by_key == 0);
    auto by_run = h.journal().ByRun("run-1", 1000);
    REQUIRE(by_run.ok());
    CHECK(by_run->size() == static_cast<size_t>(kActions));
    for (const WorkItem& w : *by_run) CHECK(w.state == WorkState::kDone);
  }
}

TEST_CASE("a worker pass finishes work whose holder crashed, with one effect") {
  ApplyHarness h;
  h.AddKind("send_reply", {"/ticket_id"}, HeaderEffector(h));
  Json args = {{"ticket_id", "T-12"}, {"text", "crashed"}};
  const std::string work_id = h.WorkId("send_reply", args);
  ClaimRequest req;
  req.work_id = work_id;
  req.kind = "send_reply";
  req.args = args;
  req.lease_ms = 3'000;
  req.now_ms = h.clock_.NowMillis();
  auto claim = h.journal().Claim(req);
  REQUIRE(claim.ok());
  REQUIRE(claim->outcome == ClaimOutcome::kClaimed);

  CHECK(h.RunDue() == 0);  // the lease is live
  CHECK(h.Submit("send_reply", args).kind == ActionOutcomeKind::kBusy);
  h.env_.Advance(3'001);
  CHECK(h.RunDue() == 1);
  WorkItem done = h.Get(work_id);
  CHECK(done.state == WorkState::kDone);
  CHECK(done.attempt == 2);
  CHECK(h.fake().stats().effects == 1);
  auto calls = h.fake().calls();
  REQUIRE(calls.size() == 1);
  CHECK(calls[0].headers["idempotency-key"] == work_id);
  CHECK(Json::parse(calls[0].body) == args);  // the args stored by the first claim
}

TEST_CASE("background workers retry due work and stop promptly") {
  ApplyHarness h;
  h.options_.poll_interval_ms = 20;
  h.AddKind("send_reply", {"/ticket_id"}, HeaderEffector(h));
  h.fake().FailNext(1, 503);
  ActionOutcome first = h.Submit("send_reply", {{"ticket_id", "T-13"}});
  REQUIRE(first.kind == ActionOutcomeKind::kRetrying);
  h.engine().StartWorkers(3);
  h.engine().StartWorkers(3);  // idempotent
  h.env_.Advance(10'000);
  WorkState state = WorkState::kFailed;
  for (int i = 0; i < 500 && state != WorkState::kDone; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    state = h.Get(first.item.work_id).state;
  }
  CHECK(state == WorkState::kDone);
  auto start = std::chrono::steady_clock::now();
  h.engine().Stop();
  auto took = std::chrono::steady_clock::now() - start;
  CHECK(took < std::chrono::milliseconds(1'000));
  CHECK(h.fake().stats().effects == 1);
  h.engine().Stop();  // a second Stop is a no-op
}

TEST_CASE(
    "workers meeting a store that refuses writes try again at its recovery pace, not in a loop") {
  ApplyHarness h;
  h.options_.poll_interval_ms = 20;
  h.AddKind("send_reply", {"/ticket_id"}, HeaderEffector(h));
  h.fake().FailNext(1, 503);
  ActionOutcome first = h.Submit("send_reply", {{"ticket_id", "T-14"}});
  REQUIRE(first.kind == ActionOutcomeKind::kRetrying);
  h.env_.Advance(10'000);                              // due
  REQUIRE(Failpoints::Set("store.write=error").ok());  // a full disk: every write refused
  h.engine().StartWorkers(3);
  std::this_thread::sleep_for(std::chrono::milliseconds(1'500));
  const uint64_t failed_claims = h.metrics_.store_errors.Get();
  Failpoints::Clear();
  // Three workers, one pass each at once and at most one more a second
  // later: a handful, where a loop made tens of thousands.
  CHECK(failed_claims >= 1);
  CHECK(failed_claims <= 9);
  WorkState state = WorkState::kFailed;
  for (int i = 0; i < 300 && state != WorkState::kDone; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    state = h.Get(first.item.work_id).state;
  }
  CHECK(state == WorkState::kDone);  // the store came back: the work goes on by itself
  h.engine().Stop();
  CHECK(h.fake().stats().effects == 1);
}

TEST_CASE("reconcile reports a done effect the target no longer has") {
  ApplyHarness h;
  h.AddKind("create_ticket", {"/ticket_id"}, CheckThenActEffector(h));
  CHECK(h.engine().LastReconcile().status().code() == Code::kNotFound);
  std::vector<std::string> refs;
  for (int i = 0; i < 3; ++i) {
    ActionOutcome o = h.Submit("create_ticket", {{"ticket_id", "T-" + std::to_string(i)}});
    REQUIRE(o.kind == ActionOutcomeKind::kExecuted);
    refs.push_back(o.item.external_ref);
  }
  auto clean = h.engine().Reconcile();
  REQUIRE(clean.ok());
  CHECK(clean->checked == 3);
  CHECK(clean->findings.empty());

  REQUIRE(h.fake().DeleteRecord(refs[1]));
  auto report = h.engine().Reconcile();
  REQUIRE(report.ok());
  CHECK(report->checked == 3);
  CHECK(report->errors.empty());
  REQUIRE(report->findings.size() == 1);
  CHECK(report->findings[0].problem == "missing");
  CHECK(report->findings[0].external_ref == refs[1]);
  CHECK(report->findings[0].kind == "create_ticket");
  CHECK(report->findings[0].work_id == h.WorkId("create_ticket", {{"ticket_id", "T-1"}}));
  auto last = h.engine().LastReconcile();
  REQUIRE(last.ok());
  CHECK(last->findings.size() == 1);
}

TEST_CASE("reconcile reports a done effect the target holds twice, once") {
  for (bool listed : {false, true}) {
    CAPTURE(listed);
    ApplyHarness h;
    Json http = CheckThenActEffector(h);
    if (listed) http["list_url"] = h.Url("/records");
    h.AddKind("create_ticket", {"/ticket_id"}, http);
    ActionOutcome o = h.Submit("create_ticket", {{"ticket_id", "T-1"}});
    REQUIRE(o.kind == ActionOutcomeKind::kExecuted);
    // A second record with the same fingerprint (made by another way in).
    HttpRequest twin;
    twin.url = h.Url("/records");
    twin.body = Json{{"ticket_id", "T-1"}, {"idem_fingerprint", o.item.work_id}}.dump();
    REQUIRE(h.http_->Send(twin).ok());
    auto report = h.engine().Reconcile();
    REQUIRE(report.ok());
    REQUIRE(report->findings.size() == 1);
    CHECK(report->findings[0].problem == "duplicate");
    CHECK(report->findings[0].work_id == o.item.work_id);
    CHECK(report->findings[0].detail.find("2 records") != std::string::npos);
  }
}

TEST_CASE("reconcile lists the target for extra records and reports a lookup that fails") {
  ApplyHarness h;
  Json http = CheckThenActEffector(h);
  http["list_url"] = h.Url("/records");
  ActionConfig& kind = h.AddKind("create_ticket", {"/ticket_id"}, http);
  kind.window_ms = 0;  // remembered forever: an unknown fingerprint is a real extra
  REQUIRE(h.Submit("create_ticket", {{"ticket_id", "T-1"}}).kind == ActionOutcomeKind::kExecuted);
  HttpRequest stray;
  stray.url = h.Url("/records");
  stray.body = Json{{"ticket_id", "T-x"}, {"idem_fingerprint", "f00d"}}.dump();
  REQUIRE(h.http_->Send(stray).ok());

  auto report = h.engine().Reconcile();
  REQUIRE(report.ok());
  REQUIRE(report->findings.size() == 1);
  CHECK(report->findings[0].problem == "extra");
  CHECK(report->findings[0].work_id == "f00d");

  h.fake().FailLookupsNext(1);
  auto failing = h.engine().Reconcile();
  REQUIRE(failing.ok());
  REQUIRE(failing->errors.size() == 1);
  CHECK(failing->errors[0].find("create_ticket") != std::string::npos);
}

TEST_CASE("R18 message guard: the same message within the window is sent once, after it again") {
  ApplyHarness h;
  Json http = {{"url", h.Url("/messages")}, {"idempotency", "none"}};
  ActionConfig& kind = h.AddKind("send_message", {"/chat_id", "/text"}, http);
  kind.window_ms = 24 * kHour;
  Json message = {{"chat_id", 42}, {"text", "Your order has shipped"}};

  CHECK(h.Submit("send_message", message).kind == ActionOutcomeKind::kExecuted);
  h.env_.Advance(23 * kHour);
  CHECK(h.Submit("send_message", message).kind == ActionOutcomeKind::kDuplicate);
  Json spaced = {{"chat_id", 42}, {"text", "  Your order has shipped "}};
  CHECK(h.Submit("send_message", spaced).kind == ActionOutcomeKind::kDuplicate);
  CHECK(h.Submit("send_message", {{"chat_id", 43}, {"text", "Your order has shipped"}}).kind ==
        ActionOutcomeKind::kExecuted);
  CHECK(h.fake().stats().effects == 2);

  h.env_.Advance(1 * kHour + 1);  // past the window of the first send
  CHECK(h.Submit("send_message", message).kind == ActionOutcomeKind::kExecuted);
  CHECK(h.fake().stats().effects == 3);
}

TEST_CASE(
    "Submit rejects unknown kinds, missing identity or key fields, and client-executed kinds") {
  ApplyHarness h;
  h.AddKind("sync_item", {"/sku"}, UpsertEffector(h));
  ActionConfig client;
  client.name = "manual_step";
  client.identity_fields = {"/id"};
  h.config_.actions["manual_step"] = client;

  auto unknown = h.engine().Submit("nope", {{"sku", "1"}}, "", "");
  CHECK(unknown.status().code() == Code::kNotFound);
  CHECK(unknown.status().field() == "/kind");

  auto no_identity = h.engine().Submit("sync_item", {{"price", 1}}, "", "");
  CHECK(no_identity.status().code() == Code::kInvalidArgument);
  CHECK(no_identity.status().field() == "/args/sku");

  auto bad_key = h.engine().Submit("sync_item", {{"sku", Json::array()}}, "", "");
  CHECK(bad_key.status().code() == Code::kInvalidArgument);
  CHECK(bad_key.status().field() == "/args/sku");
  CHECK(h.journal().Get(h.WorkId("sync_item", {{"sku", Json::array()}})).status().code() ==
        Code::kNotFound);  // nothing entered the journal

  auto client_work = h.engine().Submit("manual_step", {{"id", 1}}, "", "");
  CHECK(client_work.status().code() == Code::kFailedPrecondition);
  CHECK(h.fake().stats().raw_calls == 0);
}

TEST_CASE("workers leave client-executed work alone and bury work of unknown kinds") {
  ApplyHarness h;
  h.AddKind("send_reply", {"/ticket_id"}, HeaderEffector(h));
  ActionConfig client;
  client.name = "manual_step";
  client.identity_fields = {"/id"};
  h.config_.actions["manual_step"] = client;
  for (const char* kind : {"manual_step", "retired_kind"}) {
    ClaimRequest req;
    req.work_id = std::string("w-") + kind;
    req.kind = kind;
    req.now_ms = h.clock_.NowMillis();
    REQUIRE(h.journal().Enqueue(req).ok());
  }
  REQUIRE(h.Submit("send_reply", {{"ticket_id", "T-1"}}).kind == ActionOutcomeKind::kExecuted);
  CHECK(h.RunDue() == 1);
  CHECK(h.Get("w-manual_step").state == WorkState::kPending);
  WorkItem buried = h.Get("w-retired_kind");
  CHECK(buried.state == WorkState::kDead);
  CHECK(buried.last_error.find("not configured") != std::string::npos);
}

TEST_CASE(
    "on a shared journal, workers pass over work of a kind their config lacks and leave it to the "
    "daemons that have it") {
  ApplyHarness h;
  h.options_.shared_journal = true;  // as on PostgreSQL, beside other daemons
  h.AddKind("send_reply", {"/ticket_id"}, HeaderEffector(h));
  for (int i = 0; i < 3; ++i) {
    ClaimRequest req;
    req.work_id = "w-newer-" + std::to_string(i);
    req.kind = "newer_kind";  // another daemon's config has it, this one's not yet
    req.now_ms = h.clock_.NowMillis();
    REQUIRE(h.journal().Enqueue(req).ok());
  }
  REQUIRE(h.Submit("send_reply", {{"ticket_id", "T-1"}}).kind == ActionOutcomeKind::kExecuted);
  CHECK(h.RunDue() == 0);
  CHECK(h.RunDue() == 0);
  for (int i = 0; i < 3; ++i) {
    WorkItem left = h.Get("w-newer-" + std::to_string(i));
    CHECK(left.state == WorkState::kPending);
    CHECK(left.attempt == 0);
    CHECK(left.last_error.empty());
  }
  // Its own kinds' work still runs in the same passes.
  h.fake().FailNext(1, 503);
  REQUIRE(h.Submit("send_reply", {{"ticket_id", "T-2"}}).kind == ActionOutcomeKind::kRetrying);
  h.env_.Advance(60'000);
  CHECK(h.RunDue() == 1);
  CHECK(h.Get(h.WorkId("send_reply", {{"ticket_id", "T-2"}})).state == WorkState::kDone);
}

TEST_CASE(
    "an effect whose answer is text that is not UTF-8 is recorded once, its bad bytes replaced, "
    "instead of running again on every attempt") {
  httplib::Server latin;
  std::atomic<int> calls{0};
  latin.Post("/x", [&](const httplib::Request&, httplib::Response& res) {
    calls.fetch_add(1);
    res.status = 201;
    res.set_content(std::string("caf\xe9 ok"), "text/plain; charset=latin-1");
  });
  std::thread serving;
  const int port = fakes::ServeInBackground(latin, 0, serving);
  REQUIRE(port > 0);
  ApplyHarness h;
  h.AddKind("latin", {"/id"},
            Json{{"method", "POST"},
                 {"url", "http://127.0.0.1:" + std::to_string(port) + "/x"},
                 {"idempotency", "header"}});
  ActionOutcome o = h.Submit("latin", {{"id", "L9"}});
  CHECK(o.kind == ActionOutcomeKind::kExecuted);
  CHECK(o.item.state == WorkState::kDone);
  CHECK(o.item.result["body"] == "caf\xef\xbf\xbd ok");
  // A retry of the call is a duplicate, and no worker runs it again.
  CHECK(h.Submit("latin", {{"id", "L9"}}).kind == ActionOutcomeKind::kDuplicate);
  h.env_.Advance(120'000);
  CHECK(h.RunDue() == 0);
  CHECK(calls.load() == 1);
  latin.stop();
  serving.join();
}

}  // namespace idem::testing
