// The domain store: what idem remembers, behind interfaces shaped by the
// domain (decisions, idempotency keys, the effects journal, plans, audit,
// named leases), never a generic key-value API. One implementation today:
// RocksDB (store/rocksdb/), embedded, one process owning the folder.
//
// Durability: every write that a later side effect depends on (an
// Idempotency-Key record, a journal claim, a completion) is synced to disk
// before the call returns when the store was opened with sync=true.
// Concurrent writers share fsyncs (group commit).
//
// Time: every call that needs "now" takes it as an argument (milliseconds
// since the epoch, from the daemon's StableClock), so tests control time.
//
// Errors: Unavailable (retryable) when the disk or RocksDB fails;
// InvalidArgument for malformed arguments; NotFound / FailedPrecondition as
// documented per method. A stored record that cannot be decoded is Internal.
//
// Thread-safety: every method of every interface may be called from many
// threads at once; atomicity is per method as documented.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "daemon/core/status.h"

namespace idem {

using Json = nlohmann::json;

// ---------------------------------------------------------------- decisions

struct Decision {
  std::string decision_id;   // "dec_" + 32 hex; unique per stored decision
  std::string decision_key;  // sha256 hex of the key material (the cache key)
  std::string step;
  std::string status = "decided";    // "decided"
  std::string decided_by = "model";  // "model" | "human"
  Json output;                       // the parsed, validated output
  Json material;                     // the canonical key material (JSON)
  Json trace = Json::object();       // attempts, raw output, tokens, cost
  std::string provider, model, prompt_version;
  int64_t created_at_ms = 0;
  int64_t expires_at_ms = 0;  // 0: kept forever
  std::string trace_id;       // W3C trace id of the request that decided ("" before traces)
  // false: `trace` holds only TraceSummary(trace) (a decision as GetByKey
  // answers it); Get(decision_id) reads it whole. Not part of ToJson.
  bool trace_whole = true;

  Json ToJson() const;
  static StatusOr<Decision> FromJson(const Json& j);
};

// The part of a trace the cache-hit path needs: its top-level members that
// are neither objects nor arrays (cost_usd, input_tokens, output_tokens,
// latency_ms, request_id, escalation_id, ...), without the attempts and
// their raw outputs. A non-object trace has an empty summary.
Json TraceSummary(const Json& trace);
// Whether `trace` holds more than its summary (an object or array member).
bool TraceHasDetail(const Json& trace);

struct DecisionPage {
  std::vector<Decision> items;
  std::string next_cursor;  // empty: no more
};

class DecisionStore {
 public:
  virtual ~DecisionStore() = default;
  // The current decision cached under `decision_key`, NotFound if none or if
  // it expired before `now_ms`. The cache-hit path: its trace is only
  // TraceSummary (trace_whole false when the trace had more), and the
  // engines keep the rest of the trace apart so that this read neither
  // reads nor decodes it.
  virtual StatusOr<Decision> GetByKey(const std::string& decision_key, int64_t now_ms) = 0;
  // A decision by id (also superseded ones), whole (with its whole trace),
  // NotFound if none.
  virtual StatusOr<Decision> Get(const std::string& decision_id) = 0;
  // Stores `d` as the decision for d.decision_key unless a live one exists;
  // returns the one that is cached afterwards (`d`, or the existing one as
  // GetByKey answers it). `stored`, if given, says whether this call wrote
  // `d` (false when a decision was live under the key, `d` itself included
  // when a concurrent call stored the same decision first).
  virtual StatusOr<Decision> PutIfAbsent(const Decision& d, int64_t now_ms,
                                         bool* stored = nullptr) = 0;
  // Stores `d` and makes it the cached decision for its key (cache=refresh);
  // an older decision stays readable by id.
  virtual Status Replace(const Decision& d) = 0;
  // Decisions (superseded and expired ones too), whole, newest first; filters may
  // be empty. `cursor` from a previous page; InvalidArgument for a malformed
  // cursor or limit == 0.
  virtual StatusOr<DecisionPage> List(const std::string& step, const std::string& status,
                                      const std::string& cursor, size_t limit) = 0;
  // Deletes up to `limit` decisions whose window ended at or before now_ms
  // (expires_at != 0), superseded ones too; returns how many. A decision
  // stored by an idem from before the expiry index is not listed there and
  // is kept. With `swept_ids`, the ids of the decisions it deleted are
  // appended to it (their plans go with them: SweepRetention).
  virtual StatusOr<size_t> SweepExpired(int64_t now_ms, size_t limit,
                                        std::vector<std::string>* swept_ids = nullptr) = 0;
};

// --------------------------------------------------------- idempotency keys

struct IdemRecord {
  std::string scope;        // the caller (token name) plus the route
  std::string key;          // the Idempotency-Key value
  std::string fingerprint;  // sha256 hex of method, path and JCS body
  // kReleased: an attempt ran and answered while its work was still moving
  // (202 retrying, 409 busy); no response is stored, the key stays bound to
  // its fingerprint, and the next Begin with that fingerprint takes it again.
  enum class State { kInProgress, kCompleted, kReleased } state = State::kInProgress;
  // An earlier attempt under this key ran (it was released at least once):
  // an Abandon then goes back to kReleased instead of forgetting the key.
  bool ran = false;
  // The instance id of the store that wrote the in_progress record (one
  // process owns a store folder), so a restarted daemon knows that its own
  // in-progress keys are orphans (ReleaseOwnInProgress).
  std::string owner;
  int response_status = 0;
  std::string response_body;
  std::string response_content_type;
  std::string request_id;
  int64_t created_at_ms = 0;
  int64_t expires_at_ms = 0;
  int64_t lease_until_ms = 0;  // in_progress only: after it, the key may be taken over
};

// Whether a key's window is over at `now_ms`. A key still in progress under
// a live lease is not over, whatever its window says: a handler that runs
// past the window (a long run under a short idempotency.routes window)
// still holds its key, so a retry then is 409, not a second run beside the
// first, and its holder may still renew and finish it. Both engines.
inline bool IdemKeyOver(const IdemRecord& r, int64_t now_ms) {
  if (r.expires_at_ms == 0 || r.expires_at_ms > now_ms) return false;
  return !(r.state == IdemRecord::State::kInProgress && r.lease_until_ms > now_ms);
}

enum class BeginOutcome {
  kNew,       // the caller owns the key now and must Finish or Abandon it
  kReplay,    // completed with the same fingerprint: replay record.response_*
  kMismatch,  // the key was used with another fingerprint: 422, nothing runs
  kInFlight,  // in progress under a live lease: 409 or wait
};

struct BeginResult {
  BeginOutcome outcome;
  IdemRecord record;  // the stored record (for kNew: the one just written)
};

class IdemKeyStore {
 public:
  virtual ~IdemKeyStore() = default;
  // Atomically: if (scope,key) is absent, or expired at now_ms, or
  // in_progress with lease_until <= now_ms (its owner crashed), or released
  // with the same fingerprint, writes an in_progress record (durably, owned
  // by this store's instance) and returns kNew; otherwise classifies,
  // without writing: another fingerprint -> kMismatch (checked first, also
  // while in progress or released), completed -> kReplay, in progress ->
  // kInFlight. The record expires at now_ms + ttl_ms (ttl_ms == 0: never);
  // the window starts at the first Begin: neither Finish nor retaking a
  // released key extends it. InvalidArgument if ttl_ms < 0 or lease_ms <= 0.
  virtual StatusOr<BeginResult> Begin(const std::string& scope, const std::string& key,
                                      const std::string& fingerprint, const std::string& request_id,
                                      int64_t now_ms, int64_t ttl_ms, int64_t lease_ms) = 0;
  // Records the response of the request that owns the key (durably).
  // FailedPrecondition if the record is gone or owned by another fingerprint.
  // Finishing a key that is already completed (same fingerprint) keeps the
  // first response and returns OK.
  virtual Status Finish(const std::string& scope, const std::string& key,
                        const std::string& fingerprint, int status, const std::string& body,
                        const std::string& content_type, int64_t now_ms) = 0;
  // Forgets an in_progress record (the request failed validation, so a
  // corrected retry may reuse the key). No-op when absent.
  // FailedPrecondition if it is completed or has another fingerprint.
  // (A key released before goes back to released: it stays bound to its
  // fingerprint.)
  virtual Status Abandon(const std::string& scope, const std::string& key,
                         const std::string& fingerprint) = 0;
  // in_progress -> released (durably): the attempt answered, but its work is
  // still moving, so no response is stored; a retry with the same
  // fingerprint runs again and reports the work's current state, another
  // fingerprint is still kMismatch. No-op when absent or already released.
  // FailedPrecondition if it is completed or has another fingerprint.
  virtual Status Release(const std::string& scope, const std::string& key,
                         const std::string& fingerprint) = 0;
  // Pushes the lease of an in_progress record to now_ms + lease_ms while its
  // handler still runs, so that a retry during a long request stays
  // kInFlight instead of taking the key over. Only the holder may: the
  // record must be in progress, unexpired, with this fingerprint and
  // request_id, written by this store's instance; otherwise
  // FailedPrecondition (the request ended, or its key was taken over).
  // Never shortens a lease. Not synced to disk: a restart releases this
  // instance's keys whatever their lease. InvalidArgument if lease_ms <= 0.
  virtual Status ExtendLease(const std::string& scope, const std::string& key,
                             const std::string& fingerprint, const std::string& request_id,
                             int64_t now_ms, int64_t lease_ms) = 0;
  // Releases every in_progress record owned by this store's instance: at
  // start-up they are orphans of a process that is gone (kill -9), so a
  // retry need not wait for the lease. Scans every record; returns how many
  // were released. Records of other owners keep their lease.
  virtual StatusOr<size_t> ReleaseOwnInProgress() = 0;
  virtual StatusOr<IdemRecord> Get(const std::string& scope, const std::string& key) = 0;
  // Deletes up to `limit` records expired before now_ms; returns how many.
  virtual StatusOr<size_t> SweepExpired(int64_t now_ms, size_t limit) = 0;
};

// ----------------------------------------------------------- effects journal

enum class WorkState { kPending, kRunning, kDone, kFailed, kDead };
std::string_view WorkStateName(WorkState s);

inline constexpr size_t kMaxOtherRuns = 64;

struct WorkItem {
  std::string work_id;  // sha256 hex of kind:version:JCS(identity)
  std::string kind;
  WorkState state = WorkState::kPending;
  int attempt = 0;          // claims granted so far
  int max_attempts = 5;     // after this many failures: dead
  std::string lease_token;  // holder of the current lease (running)
  int64_t locked_until_ms = 0;
  Json args = Json::object();  // what the effect needs (daemon-executed work)
  Json identity = Json::object();
  Json result;  // null until done
  std::string external_ref;
  std::string last_error;
  int64_t next_attempt_at_ms = 0;  // pending/failed: when it is due
  int64_t created_at_ms = 0;
  int64_t updated_at_ms = 0;
  int64_t expires_at_ms = 0;  // done: forgotten after this (0: never); dead: kept
  std::string run_id;
  // The runs that took the item in after it was made (Journal::AddToRun: a
  // run that includes work another run did), oldest first, at most
  // kMaxOtherRuns (the oldest leaves first). A new incarnation of the work
  // (after its window) starts without them.
  std::vector<std::string> other_runs;
  std::string request_id;  // correlation id of the request that created it
  int64_t window_ms = 0;   // from the creating request: done -> expires_at = now + window
  std::string trace_id;    // W3C trace id of the request that created it ("" before traces)
  // The call that created this incarnation (CallId in work_identity.h: a
  // digest of the caller and its Idempotency-Key; "" for a call without a
  // key, a decision's plan, a worker). A later call with the same call_id
  // is that call retried, whatever its first answer was; on_duplicate
  // conflict/ignore judge every other call as another caller's.
  std::string call_id;

  Json ToJson() const;
  static StatusOr<WorkItem> FromJson(const Json& j);
};

// A place in a run's listing (Journal::ByRun): an item's created_at_ms and
// work_id. The default (empty work_id) is before every item.
struct RunPosition {
  int64_t created_at_ms = 0;
  std::string work_id;
  bool start() const { return work_id.empty(); }
};

// A list cursor naming a position by time and id: the hex of "<ms>/<id>"
// (a run's listing, and PostgreSQL's decision list). The parse refuses
// anything that form did not make (a negative time included), and an id
// that is not text PostgreSQL can take (UTF-8 without NUL), with
// InvalidArgument at "query:cursor".
std::string TimeIdCursor(int64_t ms, std::string_view id);
StatusOr<std::pair<int64_t, std::string>> ParseTimeIdCursor(std::string_view cursor);

struct ClaimRequest {
  std::string work_id;
  std::string kind;
  Json identity = Json::object();
  Json args = Json::object();
  std::string run_id;
  std::string request_id;
  std::string trace_id;
  std::string call_id;  // WorkItem::call_id of a record this claim creates
  int64_t lease_ms = 30'000;
  int64_t window_ms = 0;  // how long a done record is remembered (0: forever)
  int max_attempts = 5;
  int64_t now_ms = 0;
};

enum class ClaimOutcome {
  kClaimed,  // the caller holds the lease: do the effect, then Complete/Fail
  kDone,     // already done: item.result / item.external_ref are the original
  kBusy,     // someone holds a live lease until item.locked_until_ms
  kDead,     // attempts exhausted; only a requeue revives it
  kBackoff,  // failed, and its next attempt is not due before item.next_attempt_at_ms:
             // a claim waits out the backoff its last failure set (R20)
};

struct ClaimResult {
  ClaimOutcome outcome;
  WorkItem item;  // the record after the claim
  // kDead: this claim buried the work (it found the last attempt's lease run
  // out and wrote the dead letter); false when the work was already dead.
  // The one signal to count and tell a new dead letter by.
  bool buried = false;
};

// One write of a batch (Journal::BeginOps): a claim, a complete or a fail,
// with the arguments of Claim, Complete and Fail.
struct JournalOp {
  enum class Type { kClaim, kComplete, kFail };
  Type type = Type::kClaim;
  ClaimRequest claim;  // kClaim
  // kComplete and kFail:
  std::string work_id;
  std::string lease_token;
  int64_t now_ms = 0;
  Json result;               // kComplete
  std::string external_ref;  // kComplete
  std::string error;         // kFail
  bool retryable = true;     // kFail
  // kFail, when retryable: the retry's delay, from the record being failed
  // (a backoff needs its attempt). Absent: retry at now_ms.
  std::function<int64_t(const WorkItem&)> retry_delay_ms;

  static JournalOp Claim(ClaimRequest req) {
    JournalOp op;
    op.claim = std::move(req);
    return op;
  }
};

struct JournalOpResult {
  // kClaim: the claim's outcome. kComplete: kDone. kFail: kClaimed is never
  // set; the item's state says failed (retried later) or dead.
  ClaimOutcome outcome = ClaimOutcome::kDone;
  WorkItem item;  // the record after the op (or as found, when refused)
  // kComplete/kFail: the lease token does not hold the work (stale lease:
  // someone else took it over, or it is done or dead); item is the record
  // as found, and nothing was written.
  bool stale_lease = false;
  // kComplete/kFail: retried by the holder that completed or failed it;
  // nothing written, item is the record as the first one left it.
  bool repeated = false;
  // With repeated, kComplete: its result or external_ref is not the first
  // one's, which stands (journal_rules::Refusal says so, pointing at the
  // result when it differs, else at the external_ref).
  bool differs = false;
  bool result_differs = false;
  // With stale_lease, kFail: the token's holder completed the work; a fail
  // after that changes nothing.
  bool after_complete = false;
  // kClaim, kDead: this claim buried the work (ClaimResult::buried).
  bool buried = false;
};

// Every WorkItem returned carries an empty lease_token, except the one in a
// kClaimed ClaimResult: only the holder of a lease learns its token.
// identity, args, run_id, request_id, trace_id, window_ms and max_attempts are taken
// from the request that creates the record; later claims keep them.
class Journal {
 public:
  virtual ~Journal() = default;
  // One atomic, durable step covering: first delivery (creates the record),
  // concurrent duplicates (one kClaimed, the rest kBusy), retry after a
  // crash (lease expired -> kClaimed with attempt+1 and a new token), retry
  // after a failure (failed -> kClaimed), and duplicates of done work.
  // A pending item is claimed at once. A crashed item (expired lease) whose
  // attempts are used up becomes dead (kDead) instead. A done item whose
  // window expired (expires_at != 0 && <= now) counts as absent: new work.
  // Outcomes other than kClaimed write nothing (no fsync).
  // InvalidArgument if work_id is empty, lease_ms <= 0, window_ms < 0 or
  // max_attempts < 1.
  virtual StatusOr<ClaimResult> Claim(const ClaimRequest& req) = 0;
  // Claims several items as one durable write (one fsync), with the outcome
  // each would get from Claim in this order: a repeated work_id sees the
  // claim before it in the same call. A failed write fails every claim in
  // it that had to write (nothing of them is stored); the others keep their
  // outcome.
  std::vector<StatusOr<ClaimResult>> ClaimMany(std::span<const ClaimRequest> reqs);

  // Claims, completes and fails in one durable write, in two halves, for a
  // caller that must not block on the fsync (an event loop). BeginOps
  // decides every outcome and queues the write; `on_durable` (may be empty)
  // runs on another thread once the write is over, after which Ready() is
  // true. FinishOps, on the thread that called BeginOps, returns the
  // outcomes in request order, waiting for the write if it is still in
  // flight. Each op gets the outcome it would get alone (Claim, Complete,
  // Fail), applied in order: an op sees the ops before it on the same work.
  // A failed write fails every op that had to write (nothing of them is
  // stored). Until FinishOps the pending ops hold the lock stripes of the
  // work they write, so a caller with ops pending must begin more with
  // kSkipBusy: an op whose stripe is taken (by anyone) is then not decided
  // but listed in Skipped(), to be begun again later. Waiting for a stripe
  // while holding others could deadlock two such callers.
  enum class LockWait { kBlock, kSkipBusy };
  class PendingOps {
   public:
    virtual ~PendingOps() = default;
    virtual bool Ready() const = 0;
    // Positions (in the request span) of the ops left undecided.
    virtual const std::vector<size_t>& Skipped() const { return none_; }

   private:
    std::vector<size_t> none_;
  };
  // The default decides and writes with Claim, Complete and Fail, one by
  // one, before returning.
  virtual std::unique_ptr<PendingOps> BeginOps(std::span<const JournalOp> ops,
                                               std::function<void()> on_durable,
                                               LockWait wait = LockWait::kBlock);
  virtual std::vector<StatusOr<JournalOpResult>> FinishOps(std::unique_ptr<PendingOps> pending);

  // Creates a pending record due at req.now_ms unless one exists; returns
  // the stored record either way (daemon-executed work goes through Due).
  virtual StatusOr<WorkItem> Enqueue(const ClaimRequest& req) = 0;
  // Marks done. FailedPrecondition if `lease_token` is not the current
  // holder (a stale lease), NotFound if no such work. An expired lease that
  // nobody has taken over yet is still the current holder. Completing again
  // with the token that completed it is OK and changes nothing. An empty
  // external_ref keeps one stored by RecordExternalRef.
  virtual Status Complete(const std::string& work_id, const std::string& lease_token,
                          const Json& result, const std::string& external_ref, int64_t now_ms) = 0;
  // Stores external_ref while still running (level-3 effects: proof first).
  virtual Status RecordExternalRef(const std::string& work_id, const std::string& lease_token,
                                   const std::string& external_ref, int64_t now_ms) = 0;
  // Records a failure. Retryable and attempts left: failed, due at
  // retry_at_ms. Otherwise: dead. Same token rules as Complete.
  virtual StatusOr<WorkItem> Fail(const std::string& work_id, const std::string& lease_token,
                                  const std::string& error, bool retryable, int64_t retry_at_ms,
                                  int64_t now_ms) = 0;
  virtual StatusOr<WorkItem> Get(const std::string& work_id) = 0;
  // Up to n items that are due at now_ms: pending/failed with
  // next_attempt_at <= now, and running with an expired lease; oldest due
  // first. Items of `skip_kinds` are passed over and not counted (the
  // daemon's workers do not run client-executed kinds: however many of
  // those wait, they must not fill every pass).
  StatusOr<std::vector<WorkItem>> Due(int64_t now_ms, size_t n) { return Due(now_ms, n, {}); }
  virtual StatusOr<std::vector<WorkItem>> Due(int64_t now_ms, size_t n,
                                              const std::vector<std::string>& skip_kinds) = 0;
  // Dead items, oldest death first.
  virtual StatusOr<std::vector<WorkItem>> DeadLetters(size_t limit) = 0;
  // How many items are dead, counted up to `cap` (cap means cap or more),
  // without reading them: a metrics scrape's gauge.
  virtual StatusOr<size_t> CountDeadLetters(size_t cap) = 0;
  // dead -> pending with a fresh attempt budget, due now. FailedPrecondition
  // unless dead.
  virtual StatusOr<WorkItem> Requeue(const std::string& work_id, int64_t now_ms) = 0;
  // Items created under run_id or taken into it (AddToRun), oldest created
  // first (the same millisecond by work_id), at most `limit`; with `after`
  // set, only the items ordered after that position (a page of a run with
  // more items than one listing holds).
  virtual StatusOr<std::vector<WorkItem>> ByRun(const std::string& run_id, size_t limit,
                                                const RunPosition& after) = 0;
  StatusOr<std::vector<WorkItem>> ByRun(const std::string& run_id, size_t limit) {
    return ByRun(run_id, limit, RunPosition{});
  }
  // Takes work `work_id`, as it is now, into run `run_id` besides the run
  // it was made under, so ByRun(run_id) lists it (a run that includes work
  // done before). Nothing when it is in the run already; NotFound when no
  // such work. Not durable on its own (a status view): the next write of
  // the store carries it.
  virtual Status AddToRun(const std::string& work_id, const std::string& run_id) = 0;
  // Done items of `kind` with an external_ref (for reconciliation), most
  // recently completed first.
  virtual StatusOr<std::vector<WorkItem>> DoneWithRef(const std::string& kind, size_t limit) = 0;
  // Deletes up to `limit` done items whose window expired at now_ms.
  virtual StatusOr<size_t> SweepExpired(int64_t now_ms, size_t limit) = 0;
};

// -------------------------------------------------------------------- plans

// A decision's (or a gated action call's) actions, read by a human before
// anything happens. States: proposed -> awaiting_approval -> approved |
// rejected | expired; proposed | approved -> applying -> applied |
// partially_failed (daemon/plans/plan_engine.h owns the rules).
struct Plan {
  std::string plan_id;
  std::string decision_id;          // "" for a plan made by a gated action call
  std::string origin = "decision";  // decision | action | run
  std::string step;                 // origin decision: the step
  std::string state;
  Json actions = Json::array();    // [{kind, args}], the edited version once edited
  Json original_actions;           // the proposed actions when an operator edited them
  Json approval = Json::object();  // {required, reasons, expires_at_ms, on_timeout, escalated}
  std::string created_by;          // the token that decided or called
  std::string approved_by, rejected_by;
  std::string comment;           // the approver's comment
  std::string reason;            // the rejection's reason
  Json history = Json::array();  // [{from,to,actor,note,at_ms}]
  int64_t created_at_ms = 0;
  int64_t updated_at_ms = 0;
  std::string trace_id;  // W3C trace id of the request that made it ("" before traces)

  Json ToJson() const;
  static StatusOr<Plan> FromJson(const Json& j);
};

struct PlanPage {
  std::vector<Plan> items;
  std::string next_cursor;  // empty: no more
};

struct AuditEvent;

// One state change of a plan, compare-and-set on `from`.
struct PlanChange {
  std::string from;
  std::string to;
  std::string actor;
  std::string note;
  int64_t now_ms = 0;
  // Edits the plan in the same write (may refuse: its error is returned and
  // nothing is written).
  std::function<Status(Plan&)> mutate;
  // Appended to the audit log in the same atomic write; its detail gains
  // plan_id, from and to.
  const AuditEvent* audit = nullptr;
};

class PlanStore {
 public:
  virtual ~PlanStore() = default;
  // AlreadyExists if plan_id exists. With `audit`, the event is appended in
  // the same atomic write.
  virtual Status Put(const Plan& plan, const AuditEvent* audit = nullptr) = 0;
  virtual StatusOr<Plan> Get(const std::string& plan_id) = 0;
  // FailedPrecondition when the current state is not change.from (nothing
  // written). Appends {from,to,actor,note,at_ms} to history. A change with
  // from == to only mutates (and audits).
  virtual StatusOr<Plan> Change(const std::string& plan_id, const PlanChange& change) = 0;
  StatusOr<Plan> Transition(const std::string& plan_id, const std::string& from,
                            const std::string& to, const std::string& actor,
                            const std::string& note, int64_t now_ms) {
    return Change(
        plan_id,
        PlanChange{.from = from, .to = to, .actor = actor, .note = note, .now_ms = now_ms});
  }
  // Plans in `state`, oldest created first.
  virtual StatusOr<std::vector<Plan>> ByState(const std::string& state, size_t limit) = 0;
  // How many plans are in `state`, counted up to `cap` (cap means cap or
  // more), without reading them: a metrics scrape's gauge.
  virtual StatusOr<size_t> CountByState(const std::string& state, size_t cap) = 0;
  // Plans in `state`, newest created first, `limit` per page; `cursor` is
  // the previous page's next_cursor ("" for the first). InvalidArgument
  // (field "query:cursor") for a cursor this store did not make.
  virtual StatusOr<PlanPage> List(const std::string& state, size_t limit,
                                  const std::string& cursor) = 0;
  // Deletes up to `limit` plans in a final state (applied, rejected,
  // expired) last changed at or before cutoff_ms, however many plans
  // created before them finished after it; returns how many it deleted.
  virtual StatusOr<size_t> SweepFinished(int64_t cutoff_ms, size_t limit) = 0;
  // The plan of a decision (plan_id, decision_id) whose window is over.
  struct DecisionPlan {
    std::string plan_id;
    std::string decision_id;
  };
  // Deletes each of `plans` that is still `proposed` and still that
  // decision's (no one has approved, applied or rejected it), ordered with
  // a concurrent Change of it (which then finds it gone); returns how many.
  virtual StatusOr<size_t> DeleteProposed(const std::vector<DecisionPlan>& plans) = 0;
};

// -------------------------------------------------------------------- audit

struct AuditEvent {
  uint64_t seq = 0;
  int64_t at_ms = 0;
  std::string actor;
  std::string action;
  Json detail = Json::object();
  std::string prev_hash;  // hash of the previous event (hex), "" for the first
  std::string hash;       // sha256(prev_hash + JCS(event without hash))

  // The stored and wire form (GET /v1/audit items): every field above.
  Json ToJson() const;
  static StatusOr<AuditEvent> FromJson(const Json& j);
};

// The chain rule: sha256_hex(prev_hash + JCS(the event without `hash`)).
// Shared by the store and by `idem audit verify`, which recomputes the chain
// from GET /v1/audit on the client side.
StatusOr<std::string> AuditChainHash(const AuditEvent& e);

// Walks a chain event by event from seq 1 and remembers the first break:
// a seq that is not the next one (removed or reordered events), a prev_hash
// that does not link, a hash that does not match the content (modified).
// Finish then checks that the chain ends at the head the writer recorded
// (events removed from the end). Not thread-safe: one walk per object.
class AuditChainCheck {
 public:
  // The next event, in the order found. False once the chain is broken.
  bool Add(const AuditEvent& e);
  // Records a break found by the caller (an undecodable record, an event
  // stored under another seq); the first break wins.
  void Fail(uint64_t seq, std::string why);
  // After the last event: the chain must end at head_seq, whose hash is
  // head_hash (skipped when empty).
  bool Finish(uint64_t head_seq, const std::string& head_hash);

  bool ok() const { return broken_seq_ == 0; }
  uint64_t checked() const { return checked_; }        // events that linked
  uint64_t broken_seq() const { return broken_seq_; }  // 0 while ok
  const std::string& detail() const { return detail_; }
  // OK, or Internal "audit chain broken at seq N: why".
  Status ToStatus() const;

 private:
  uint64_t checked_ = 0;
  std::string last_hash_;
  uint64_t broken_seq_ = 0;
  std::string detail_;
};

// What AuditLog::Check found.
struct AuditVerification {
  bool ok = true;
  uint64_t checked = 0;     // events that linked
  uint64_t head_seq = 0;    // the last event appended (as recorded with the appends)
  std::string head_hash;    // its hash
  uint64_t broken_seq = 0;  // the first broken seq when !ok
  std::string detail;       // why, when !ok
};

class AuditLog {
 public:
  virtual ~AuditLog() = default;
  // Appends, filling seq (1, 2, ...), prev_hash and hash; returns seq.
  // Appends are serialized (the chain is a sequence). The head (seq and
  // hash of the last event) is written in the same atomic batch, so events
  // removed from the end are detected, across restarts too.
  virtual StatusOr<uint64_t> Append(AuditEvent event) = 0;
  virtual StatusOr<std::vector<AuditEvent>> Scan(uint64_t from_seq, size_t limit) = 0;
  // Recomputes the chain at one point in time (appends may continue) and
  // compares its end with the head. A broken chain is a result, not an
  // error; errors are reading failures (Unavailable).
  virtual StatusOr<AuditVerification> Check() = 0;
  // Check as a Status: Internal "audit chain broken at seq N: why".
  Status Verify();
};

// ------------------------------------------------------------------- traces

// One thing that happened under a W3C trace id (daemon/obs/trace.h): a
// request, a decision, a plan, a work item, an attempt. `ref` names the
// record (request_id, decision_id, plan_id, work_id); `detail` is a small
// summary known when it happened, as the text of a JSON object (entries are
// written on every request: text is built once and stored as it is, where a
// Json value would be built, copied and destroyed on the way).
struct TraceEntry {
  std::string trace_id;  // 32 lower-case hex
  int64_t at_ms = 0;
  std::string type;
  std::string ref;
  std::string detail = "{}";  // a JSON object's text (the writer's promise)
};

// trace_id -> entries, so that everything under one trace is a prefix scan.
// Observability, not a record of truth: Add is buffered and written in the
// background without an fsync, so a crash may lose the last second of
// entries; the records themselves carry their trace_id durably.
class TraceIndex {
 public:
  virtual ~TraceIndex() = default;
  // Queues `entry` (never blocks on the disk). InvalidArgument for a
  // trace_id that is not 32 characters or an empty type. Entries past the
  // queue's bound (writes not keeping up) are dropped and counted.
  virtual Status Add(TraceEntry entry) = 0;
  // Add(TraceEntry{trace_id, at_ms, type, ref, detail}) without the caller
  // building the entry: an engine may store from the views at once (the
  // RocksDB one encodes them into its pending write; trace.h's sink, on
  // every request, calls this).
  virtual Status Record(std::string_view trace_id, int64_t at_ms, std::string_view type,
                        std::string_view ref, std::string detail) {
    return Add(TraceEntry{.trace_id = std::string(trace_id),
                          .at_ms = at_ms,
                          .type = std::string(type),
                          .ref = std::string(ref),
                          .detail = std::move(detail)});
  }
  // Writes what is queued (also done by a background thread).
  virtual Status Flush() = 0;
  // Up to `limit` entries of `trace_id` in time order (queued ones too).
  virtual StatusOr<std::vector<TraceEntry>> List(const std::string& trace_id, size_t limit) = 0;
  // Entries at or before cutoff_ms (queued ones too) are no longer listed; deletes up to
  // `limit` of them and returns how many it deleted. An engine may free
  // the space of recent entries later and in bulk (RocksDB drops a whole
  // table file at once; see rocksdb_trace_index.h) and report 0 for them.
  virtual StatusOr<size_t> SweepBefore(int64_t cutoff_ms, size_t limit) = 0;
  // Entries dropped because the queue was full.
  virtual uint64_t dropped() const = 0;
};

// ------------------------------------------------------------- named leases

struct NamedLease {
  std::string name;
  std::string holder;
  std::string token;
  int64_t acquired_at_ms = 0;
  int64_t expires_at_ms = 0;
};

enum class LeaseOutcome { kAcquired, kRenewed, kHeld };

struct LeaseResult {
  LeaseOutcome outcome;
  NamedLease lease;  // the current lease (the other holder's for kHeld)
};

// The error of a renewal whose lease is no longer live (LeaseStore::Acquire).
inline Status LeaseLapsed(const std::string& name) {
  return Status(Code::kFailedPrecondition,
                "lease '" + name +
                    "' is not held under this token any more: it expired or was released, and "
                    "another holder may have held it since; acquire it again without a token",
                "/token");
}

// Whether `name` is one of the leases idem takes for itself among daemons
// that share a store ("decide:<key>" single-flight, "outbox:<subscriber>"
// delivery, "cost:flush"; "idem." kept for more): callers' named leases
// (POST /v1/leases) may not take them, or they could stall a decide or
// stop the outbox.
inline bool IsInternalLeaseName(std::string_view name) {
  for (std::string_view prefix : {"decide:", "outbox:", "cost:", "idem."}) {
    if (name.starts_with(prefix)) return true;
  }
  return false;
}

class LeaseStore {
 public:
  virtual ~LeaseStore() = default;
  // Acquire if free or expired (a new token; `token` is not looked at);
  // renew if `holder` holds it and `token` is its token (same token, expiry
  // now + ttl); kHeld if another holder does. The holder's name alone does
  // not renew: anyone can say it, only the acquirer learned the token, so a
  // wrong or empty token is FailedPrecondition (field "/token"). A token
  // for a lease that is no longer live (it expired or was released, so
  // another holder may have held it since) is FailedPrecondition
  // (LeaseLapsed, field "/token"): the caller acquires it again without a
  // token and learns that it lost it, instead of a silent new lease.
  // InvalidArgument if name or holder is empty or ttl_ms <= 0.
  virtual StatusOr<LeaseResult> Acquire(const std::string& name, const std::string& holder,
                                        const std::string& token, int64_t ttl_ms,
                                        int64_t now_ms) = 0;
  // FailedPrecondition unless held by `holder` under `token`.
  virtual Status Release(const std::string& name, const std::string& holder,
                         const std::string& token) = 0;
  // The live lease; NotFound if free or expired at now_ms.
  virtual StatusOr<NamedLease> Get(const std::string& name, int64_t now_ms) = 0;
  // Deletes up to `limit` leases that expired at or before now_ms (free, but
  // still on disk); returns how many.
  virtual StatusOr<size_t> SweepExpired(int64_t now_ms, size_t limit) = 0;
};

// -------------------------------------------------------------- escalations

// A decide whose chain was exhausted, waiting for a human (R35). Never a
// decision: GetByKey does not see it. Resolving it stores a decision.
struct Escalation {
  std::string escalation_id;  // "esc_" + 32 hex
  std::string decision_key;
  std::string step;
  std::string state = "open";     // open | resolved
  Json input = Json::object();    // the normalized input
  Json material;                  // the canonical key material
  Json context = Json::object();  // summary, attempts, errors, best_guess, cost_usd
  std::string decision_id;        // resolved: the decision the human's answer became
  std::string resolved_by;
  int64_t created_at_ms = 0;
  int64_t resolved_at_ms = 0;

  Json ToJson() const;
  static StatusOr<Escalation> FromJson(const Json& j);
};

class EscalationStore {
 public:
  virtual ~EscalationStore() = default;
  // AlreadyExists if the id exists.
  virtual Status Put(const Escalation& e) = 0;
  virtual StatusOr<Escalation> Get(const std::string& escalation_id) = 0;
  // The open escalation for a decision key; NotFound if none is open.
  virtual StatusOr<Escalation> OpenByKey(const std::string& decision_key) = 0;
  // Newest first; `state` empty: all.
  virtual StatusOr<std::vector<Escalation>> List(const std::string& state, size_t limit) = 0;
  // How many escalations are open, counted up to `cap` (cap means cap or
  // more), without reading them: a metrics scrape's gauge.
  virtual StatusOr<size_t> CountOpen(size_t cap) = 0;
  // open -> resolved (compare-and-set); FailedPrecondition unless open.
  virtual StatusOr<Escalation> Resolve(const std::string& escalation_id,
                                       const std::string& decision_id, const std::string& actor,
                                       int64_t now_ms) = 0;
  // Deletes up to `limit` escalations resolved at or before cutoff_ms (open
  // ones stay), however many created before them were resolved after it;
  // returns how many it deleted.
  virtual StatusOr<size_t> SweepResolved(int64_t cutoff_ms, size_t limit) = 0;
};

// ------------------------------------------------------------------- outbox

// What happened, for consumers outside idem (R29): a decision stored, a
// plan's state change, work done, work dead. Each event is staged by the
// store that writes the state change, in the same atomic write: an event
// exists if and only if its state change committed.
struct OutboxEvent {
  uint64_t seq = 0;            // commit order across all keys; the pull cursor
  std::string event_id;        // IdFor(the store's id, seq): stable, for the consumer's inbox
  std::string type;            // decision.created | plan.<state> | effect.done | work.dead_letter
  std::string key;             // the decision_id, plan_id or work_id it is about
  int64_t at_ms = 0;           // the state change's time
  Json data = Json::object();  // small: ids, kind, state, never args or results

  Json ToJson() const;
  static StatusOr<OutboxEvent> FromJson(const Json& j);
  // "evt_" + store_id + "_" + seq in 20 digits. The store's id (kStoreIdKey,
  // 16 hex, made once per store and carried by `idem store copy`) keeps the
  // ids of two stores apart: a consumer that dedupes on event_id and hears
  // from a new store (a reset, staging and production on one hook) does not
  // drop its events as seen. An empty store_id gives "evt_" + 20 digits, the
  // form of events written before stores had an id.
  static std::string IdFor(std::string_view store_id, uint64_t seq);
};

// The meta key of the store's id, and a new one (16 hex, random).
inline constexpr char kStoreIdKey[] = "store.id";
std::string NewStoreId();

// An event a subscriber did not take within its attempts.
struct OutboxDeadLetter {
  std::string subscriber;
  OutboxEvent event;
  int attempts = 0;
  std::string last_error;
  std::string state = "dead";  // dead | replaying (an operator asked for one more try)
  int64_t dead_at_ms = 0;

  Json ToJson() const;
  static StatusOr<OutboxDeadLetter> FromJson(const Json& j);
};

class OutboxStore {
 public:
  virtual ~OutboxStore() = default;
  // Events with seq > after, in seq order, up to `limit`. Sequence numbers
  // are taken when a write is staged, so writes may commit out of order:
  // only events below the watermark (every smaller seq committed or
  // abandoned) are returned, so a reader that continues after the last seq
  // it saw never skips an event that commits later. Seqs have gaps (a write
  // that failed or was abandoned); they are never reused, retention included.
  virtual StatusOr<std::vector<OutboxEvent>> After(uint64_t after, size_t limit) = 0;
  // The seq of the last event the subscriber is done with (delivered or
  // dead-lettered); 0 before its first.
  virtual StatusOr<uint64_t> Cursor(const std::string& subscriber) = 0;
  // Moves the subscriber's cursor to `seq` (never back). Durable.
  virtual Status Advance(const std::string& subscriber, uint64_t seq) = 0;
  // Stores the dead letter and moves the subscriber's cursor to its seq in
  // one atomic write.
  virtual Status AddDeadLetter(const OutboxDeadLetter& dl) = 0;
  // Dead letters of `subscriber` ("" : all) whose event's seq is above
  // `after_seq`, oldest event first: a page, continued after the last seq.
  virtual StatusOr<std::vector<OutboxDeadLetter>> DeadLetters(const std::string& subscriber,
                                                              uint64_t after_seq, size_t limit) = 0;
  // dead -> replaying: the dispatcher tries it once more. NotFound if none.
  virtual StatusOr<OutboxDeadLetter> RequestReplay(const std::string& subscriber, uint64_t seq) = 0;
  // The replay's outcome: delivered removes the dead letter; otherwise it is
  // dead again with one more attempt and `error`. NotFound if none.
  virtual Status FinishReplay(const std::string& subscriber, uint64_t seq, bool delivered,
                              const std::string& error, int64_t now_ms) = 0;
  // Deletes up to `limit` events with seq <= through_seq and at_ms <=
  // cutoff_ms, oldest first; returns how many.
  virtual StatusOr<size_t> Sweep(uint64_t through_seq, int64_t cutoff_ms, size_t limit) = 0;
  // The highest seq Sweep has deleted (0: none yet): a reader whose cursor
  // is below it has missed the events in between.
  virtual StatusOr<uint64_t> SweptThrough() = 0;
  // The highest seq a reader may have been served: every event After() has
  // returned or will return at or below it (0: none yet). A cursor above it
  // was never returned by this store's history (a store restored from an
  // older copy, or a made-up cursor): reading on from it would skip the
  // events this store numbers up to that cursor.
  virtual StatusOr<uint64_t> Head() = 0;
};

// --------------------------------------------------------------------- meta

// Small durable facts, e.g. the hash of each prompt version.
class MetaStore {
 public:
  virtual ~MetaStore() = default;
  virtual StatusOr<std::optional<std::string>> Get(const std::string& key) = 0;
  virtual Status Put(const std::string& key, const std::string& value) = 0;
};

// ------------------------------------------------------------------- bundle

struct StoreOptions {
  std::string path;
  bool sync = true;
  // Below this much free space on the store's filesystem writes fail with
  // Unavailable before reaching the engine (0: no check).
  uint64_t min_free_bytes = 0;
  // RocksDB: the trace index's disk budget and retention. It drops its
  // oldest entries, a whole table file at a time, past either.
  uint64_t trace_budget_bytes = uint64_t{256} << 20;
  int64_t trace_retention_ms = 30LL * 24 * 3600 * 1000;
  // Called (may be empty) after every write to the database with its
  // duration in microseconds, on the writing thread with no lock held; must
  // be cheap (the daemon feeds idem_store_write_seconds).
  std::function<void(int64_t micros)> on_write_micros = {};
};

// All the stores of one database. The Store owns the database; the
// interfaces it hands out live as long as it does.
class Store {
 public:
  virtual ~Store() = default;
  virtual DecisionStore& decisions() = 0;
  virtual IdemKeyStore& idem_keys() = 0;
  virtual Journal& journal() = 0;
  virtual PlanStore& plans() = 0;
  virtual AuditLog& audit() = 0;
  virtual LeaseStore& leases() = 0;
  virtual MetaStore& meta() = 0;
  virtual EscalationStore& escalations() = 0;
  virtual OutboxStore& outbox() = 0;
  virtual TraceIndex& traces() = 0;
  // OK while writes succeed; Unavailable (retryable) from a write that the
  // disk refused (full, I/O error) until the store has recovered by itself
  // (it retries about once a second) and a write succeeds again. Reads keep
  // working meanwhile.
  virtual Status WriteHealth() const { return Status::Ok(); }
  // The shared clock of a store that several daemons open at once (the
  // database's clock for postgres), ms since the epoch; daemons anchor their
  // StableClock to it so that leases and expiries agree across hosts.
  // NotFound for an embedded store (rocksdb): the local clock is the clock.
  virtual StatusOr<int64_t> ClockMillis() { return NotFound("the store has no clock of its own"); }
  // True when other processes may use the same database at once
  // (PostgreSQL): what this process remembers of it (the decide engine's
  // memory of hits) can go stale, and background work is shared through
  // named leases. RocksDB: false (one process owns the folder).
  virtual bool shared() const { return false; }
  // A size in bytes, by named part: what MemoryUsage and DiskUsage report.
  struct SizePart {
    std::string name;
    uint64_t bytes = 0;
  };
  // What the engine holds in this process's memory, in bytes, by part
  // (RocksDB: "memtables", "block_cache" (of it "block_cache_pinned"),
  // "table_readers", "decision_cache"); empty when the engine keeps nothing
  // of note (postgres). Cheap enough for every /metrics scrape; thread-safe.
  virtual std::vector<SizePart> MemoryUsage() { return {}; }
  // What the store takes on disk, in bytes, by part; the parts add up to
  // the store's size. RocksDB: each column family's live table files, by
  // the family's name; "wal", the write-ahead log; "other", the rest of the
  // folder (manifest, options, RocksDB's own log, files it has yet to
  // delete). PostgreSQL: each table of the schema, with its indexes and
  // TOAST. Reads the folder or asks the database: for a /metrics scrape
  // every few seconds, not a request path. Thread-safe.
  virtual StatusOr<std::vector<SizePart>> DiskUsage() { return std::vector<SizePart>{}; }
  // Free bytes on the filesystem under the store (store.min_free_mb is
  // measured against it); nullopt when it cannot be read, or the disk is
  // the database server's (postgres).
  virtual std::optional<uint64_t> DiskFreeBytes() { return std::nullopt; }
  // How many reads and writes this process met that the engine reported as
  // damaged data (RocksDB's Corruption: a checksum mismatch, a truncated
  // table file; its flushes and compactions included), since the store
  // opened. Each was answered Internal (500). nullopt when the engine
  // reports damage its own way (postgres: its log and
  // pg_stat_database.checksum_failures). Cheap; thread-safe.
  virtual std::optional<uint64_t> Corruptions() const { return std::nullopt; }
};

// Opens (creating if needed) the RocksDB store at options.path.
// Unavailable if the folder is locked by another process or unreadable.
// Failpoint "store.write" (error) fails every write as a disk error would.
StatusOr<std::unique_ptr<Store>> OpenRocksStore(const StoreOptions& options);

struct PgStoreOptions {
  std::string conninfo;  // libpq URL or key=value; "" : the PG* variables. Never logged.
  std::string schema = "idem";
  int pool_size = 8;
  int64_t statement_timeout_ms = 5'000;
  int64_t acquire_timeout_ms = 5'000;
  bool migrate = true;  // apply missing schema migrations on open
  std::function<void(int64_t micros)> on_write_micros = {};
};

// Opens the PostgreSQL store (store/postgres/): any number of processes may
// open the same database and schema at once. Unavailable if the server
// cannot be reached.
StatusOr<std::unique_ptr<Store>> OpenPostgresStore(const PgStoreOptions& options);

// Applies the schema migrations the database lacks (`idem migrate`; the
// daemon does the same at start-up), under the advisory lock; returns the
// versions applied now (empty: up to date). Unavailable if the server
// cannot be reached; FailedPrecondition if the schema is newer than this
// binary.
StatusOr<std::vector<int>> MigratePostgres(const PgStoreOptions& options);

}  // namespace idem
