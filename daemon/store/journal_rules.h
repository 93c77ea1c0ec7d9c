// Journal rules both engines share (store.h, Journal): request checks, a
// new item, a lease grant, the claim outcomes that write nothing, and the
// lease fence of completes and fails. Pure functions of their arguments.
#pragma once

#include <algorithm>
#include <optional>
#include <string>
#include <string_view>

#include "daemon/core/crypto.h"
#include "daemon/core/json.h"
#include "daemon/store/store.h"

namespace idem::journal_rules {

inline constexpr size_t kLeaseTokenBytes = 16;

inline bool Expired(const WorkItem& w, int64_t now_ms) {
  return w.state == WorkState::kDone && w.expires_at_ms != 0 && w.expires_at_ms <= now_ms;
}

// Only the claimer learns the token; every other caller gets the record
// without it, so a duplicate cannot complete or fail someone else's lease.
inline WorkItem Scrubbed(WorkItem w) {
  w.lease_token.clear();
  return w;
}

inline Status ValidateRequest(const ClaimRequest& req) {
  if (req.work_id.empty()) return InvalidArgument("work_id is empty", "/work_id");
  if (req.lease_ms <= 0) return InvalidArgument("lease_ms must be positive", "/lease_ms");
  if (req.window_ms < 0) return InvalidArgument("window_ms must not be negative", "/window_ms");
  if (req.max_attempts < 1) {
    return InvalidArgument("max_attempts must be at least 1", "/max_attempts");
  }
  return Status::Ok();
}

inline WorkItem NewItem(const ClaimRequest& req) {
  WorkItem w;
  w.work_id = req.work_id;
  w.kind = req.kind;
  w.max_attempts = req.max_attempts;
  w.args = req.args;
  w.identity = req.identity;
  w.run_id = req.run_id;
  w.request_id = req.request_id;
  w.trace_id = req.trace_id;
  w.call_id = req.call_id;
  w.window_ms = req.window_ms;
  w.created_at_ms = req.now_ms;
  w.updated_at_ms = req.now_ms;
  return w;
}

inline void GrantLease(WorkItem& w, const ClaimRequest& req) {
  w.state = WorkState::kRunning;
  w.attempt += 1;
  w.lease_token = RandomHex(kLeaseTokenBytes);
  w.locked_until_ms = req.now_ms + req.lease_ms;
  w.next_attempt_at_ms = 0;
  w.updated_at_ms = req.now_ms;
}

// The outcome of a claim that writes nothing, or nullopt when the claim must
// write (and so must hold the lock).
inline std::optional<ClaimOutcome> ReadOnlyOutcome(const std::optional<WorkItem>& current,
                                                   int64_t now_ms) {
  if (!current || Expired(*current, now_ms)) return std::nullopt;
  switch (current->state) {
    case WorkState::kDone:
      return ClaimOutcome::kDone;
    case WorkState::kDead:
      return ClaimOutcome::kDead;
    case WorkState::kRunning:
      if (current->locked_until_ms > now_ms) return ClaimOutcome::kBusy;
      return std::nullopt;
    case WorkState::kFailed:
      // The backoff the last failure set holds for every claimer, the
      // daemon's workers and clients alike (R20: one retry policy).
      if (current->next_attempt_at_ms > now_ms) return ClaimOutcome::kBackoff;
      return std::nullopt;
    case WorkState::kPending:
      return std::nullopt;
  }
  return std::nullopt;
}

// A running item whose lease ran out on its last attempt, buried by the
// claim that found it so: dead, with no attempts left. Its holder may have
// crashed, or may still be working (a slow call): the token stays, so that
// holder's late complete is still taken (DeadByExpiry) and its effect is
// recorded instead of run again after a replay.
inline constexpr std::string_view kLeaseExpiredPrefix = "lease expired on attempt ";
inline void BuryExpired(WorkItem& w, int64_t now_ms) {
  w.state = WorkState::kDead;
  w.last_error = std::string(kLeaseExpiredPrefix) + std::to_string(w.attempt) + " of " +
                 std::to_string(w.max_attempts) +
                 ": its holder neither completed nor failed it in time (it crashed, hung, or is "
                 "still working; its complete is still taken until the work is replayed)";
  w.locked_until_ms = 0;
  w.expires_at_ms = 0;
  w.updated_at_ms = now_ms;
}
// The record a writing claim stores, and its outcome: a new lease for new,
// pending, failed or expired work; dead (buried) for a crash on the last
// attempt. `current` is absent, expired, or not answerable read-only
// (ReadOnlyOutcome gave nullopt).
inline ClaimResult ClaimTransition(const std::optional<WorkItem>& current,
                                   const ClaimRequest& req) {
  if (!current || Expired(*current, req.now_ms)) {
    WorkItem next = NewItem(req);  // first delivery, or the window of the done record is over
    GrantLease(next, req);
    return ClaimResult{ClaimOutcome::kClaimed, std::move(next)};
  }
  WorkItem next = *current;
  if (next.state == WorkState::kRunning && next.attempt >= next.max_attempts) {
    BuryExpired(next, req.now_ms);  // no attempts left
    return ClaimResult{.outcome = ClaimOutcome::kDead, .item = std::move(next), .buried = true};
  }
  GrantLease(next, req);  // pending, failed, or running under an expired lease
  return ClaimResult{ClaimOutcome::kClaimed, std::move(next)};
}

// A claim's result as a batch op's.
inline JournalOpResult OpResultOf(ClaimResult c) {
  JournalOpResult r{.outcome = c.outcome, .item = std::move(c.item)};
  r.buried = c.buried;
  return r;
}

inline bool DeadByExpiry(const WorkItem& w) {
  return w.state == WorkState::kDead && !w.lease_token.empty() &&
         std::string_view(w.last_error).substr(0, kLeaseExpiredPrefix.size()) ==
             kLeaseExpiredPrefix;
}

// Does `token` hold `w` (running under that token)?
inline bool Holds(const WorkItem& w, const std::string& token) {
  return w.state == WorkState::kRunning && ConstantTimeEquals(w.lease_token, token);
}

inline JournalOpResult StaleLease(const WorkItem& found) {
  JournalOpResult r;
  r.item = Scrubbed(found);
  r.stale_lease = true;
  return r;
}

// A complete or fail whose token does not hold `w`, as an error.
inline Status StaleLeaseStatus(const WorkItem& w) {
  return Status(Code::kFailedPrecondition,
                "stale lease: the lease token does not hold work " + w.work_id + " (it is " +
                    std::string(WorkStateName(w.state)) + ", attempt " + std::to_string(w.attempt) +
                    ")",
                "/lease_token");
}

// Why a complete or fail (CompleteOrFail's result) changed nothing and is
// refused, or Ok: a stale lease, a fail after the holder's own complete, a
// repeated complete with another result than the first's.
inline Status Refusal(const JournalOpResult& r) {
  const WorkItem& w = r.item;
  if (r.after_complete) {
    return Status(Code::kFailedPrecondition,
                  "work " + w.work_id + " is done: this lease completed it (attempt " +
                      std::to_string(w.attempt) + "), and a fail after a complete changes nothing",
                  "/lease_token");
  }
  if (r.stale_lease) return StaleLeaseStatus(w);
  if (r.differs) {
    return Status(Code::kFailedPrecondition,
                  "work " + w.work_id + " is done: this lease completed it with another " +
                      (r.result_differs ? "result" : "external_ref") +
                      ", and the first complete stands (it is in this answer)",
                  r.result_differs ? "/result" : "/external_ref");
  }
  return Status::Ok();
}

inline const std::string& OpWorkId(const JournalOp& op) {
  return op.type == JournalOp::Type::kClaim ? op.claim.work_id : op.work_id;
}

inline Status ValidateOp(const JournalOp& op) {
  if (op.type == JournalOp::Type::kClaim) return ValidateRequest(op.claim);
  if (op.work_id.empty()) return InvalidArgument("work_id is empty", "/work_id");
  if (op.lease_token.empty()) return InvalidArgument("lease token is empty", "/lease_token");
  return Status::Ok();
}

// The record a Complete or Fail stores, or why nothing is written
// (repeated, stale). `current` is the work's record as the caller holds it
// locked (a RocksDB stripe, a PostgreSQL row lock).
inline StatusOr<JournalOpResult> CompleteOrFail(const std::optional<WorkItem>& current,
                                                const JournalOp& op, bool* writes) {
  *writes = false;
  if (!current) return NotFound("no such work: " + op.work_id);
  if (op.type == JournalOp::Type::kComplete) {
    if (current->state == WorkState::kDone &&
        ConstantTimeEquals(current->lease_token, op.lease_token)) {
      JournalOpResult r{.outcome = ClaimOutcome::kDone, .item = Scrubbed(*current)};
      r.repeated = true;  // a retried Complete by the holder that completed it
      r.result_differs = op.result != current->result;
      r.differs = r.result_differs ||
                  (!op.external_ref.empty() && op.external_ref != current->external_ref);
      return r;
    }
    // The holder of a lease that ran out on the last attempt, completing
    // late: the effect happened, and recording it is what keeps a replay
    // from running it again.
    const bool late =
        DeadByExpiry(*current) && ConstantTimeEquals(current->lease_token, op.lease_token);
    if (!late && !Holds(*current, op.lease_token)) return StaleLease(*current);
    WorkItem next = *current;
    next.state = WorkState::kDone;
    next.result = op.result;
    next.last_error.clear();  // an earlier attempt's; the work is done
    if (!op.external_ref.empty()) next.external_ref = op.external_ref;
    next.locked_until_ms = 0;
    next.updated_at_ms = op.now_ms;
    next.expires_at_ms = next.window_ms == 0 ? 0 : op.now_ms + next.window_ms;
    // lease_token stays (never returned) so that a retried Complete is a no-op.
    *writes = true;
    return JournalOpResult{.outcome = ClaimOutcome::kDone, .item = std::move(next)};
  }
  if ((current->state == WorkState::kFailed || current->state == WorkState::kDead) &&
      ConstantTimeEquals(current->lease_token, op.lease_token)) {
    // A retried Fail by the holder that failed it (its answer was lost):
    // the first one stands, as for Complete.
    JournalOpResult r{
        .outcome = current->state == WorkState::kDead ? ClaimOutcome::kDead : ClaimOutcome::kDone,
        .item = Scrubbed(*current)};
    r.repeated = true;
    return r;
  }
  if (!Holds(*current, op.lease_token)) {
    JournalOpResult r = StaleLease(*current);
    r.after_complete = current->state == WorkState::kDone &&
                       ConstantTimeEquals(current->lease_token, op.lease_token);
    return r;
  }
  WorkItem next = *current;
  // A holder's own words never pass for the daemon's bury (DeadByExpiry
  // reads that prefix): they are quoted as reported.
  next.last_error =
      std::string_view(op.error).substr(0, kLeaseExpiredPrefix.size()) == kLeaseExpiredPrefix
          ? "reported: " + op.error
          : op.error;
  // lease_token stays (never returned; the next claim replaces it) so that a
  // retried Fail is a no-op. Holds() needs running: it holds nothing now.
  next.locked_until_ms = 0;
  next.updated_at_ms = op.now_ms;
  ClaimOutcome outcome = ClaimOutcome::kDone;
  if (op.retryable && next.attempt < next.max_attempts) {
    next.state = WorkState::kFailed;
    int64_t delay = op.retry_delay_ms ? std::max<int64_t>(0, op.retry_delay_ms(*current)) : 0;
    next.next_attempt_at_ms = op.now_ms + delay;
  } else {
    next.state = WorkState::kDead;
    next.next_attempt_at_ms = 0;
    next.expires_at_ms = 0;
    outcome = ClaimOutcome::kDead;
  }
  *writes = true;
  return JournalOpResult{.outcome = outcome, .item = std::move(next)};
}

// The outbox event a journal write raises (work done, work dead), as the
// event's type and its data's text; nullopt when the write raises none.
// InvalidArgument when a member is not valid UTF-8.
struct WorkEvent {
  const char* type;
  std::string data;
};
inline StatusOr<std::optional<WorkEvent>> WorkEventFor(const std::optional<WorkItem>& before,
                                                       const WorkItem& after) {
  if ((before && before->state == after.state) ||
      (after.state != WorkState::kDone && after.state != WorkState::kDead)) {
    return std::optional<WorkEvent>();
  }
  const bool done = after.state == WorkState::kDone;
  // Members sorted, as a Json object writes them.
  JsonObjectWriter data;
  data.Int("attempt", after.attempt);
  if (!done) data.Str("error", after.last_error);
  if (done && !after.external_ref.empty()) data.Str("external_ref", after.external_ref);
  data.Str("kind", after.kind);
  if (!after.run_id.empty()) data.Str("run_id", after.run_id);
  data.Str("state", WorkStateName(after.state)).Str("work_id", after.work_id);
  if (!data.bad().empty()) {
    return InvalidArgument("outbox event cannot be stored: " + std::string(data.bad()) +
                           " is not valid UTF-8");
  }
  return std::optional<WorkEvent>(
      WorkEvent{done ? "effect.done" : "work.dead_letter", data.Take()});
}

}  // namespace idem::journal_rules
