// JSON forms of the stored records. Field names are the on-disk format:
// renaming one is a migration. Decoding accepts missing optional fields (so
// records written before a field existed still load) but rejects a present
// field of the wrong type.
#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "daemon/core/crypto.h"
#include "daemon/core/json.h"
#include "daemon/store/record_codec.h"
#include "daemon/store/store.h"

namespace idem {
namespace {

// Reads typed members of one JSON object, remembering the first problem.
// Uses only non-throwing accessors.
class FieldReader {
 public:
  FieldReader(const Json& j, std::string_view record) : j_(j), record_(record) {
    if (!j_.is_object()) Fail("", "not an object");
  }

  void Str(const char* name, std::string& out, bool required = false) {
    const Json* v = Find(name, required);
    if (v == nullptr) return;
    if (!v->is_string()) return Fail(name, "not a string");
    out = v->get_ref<const std::string&>();
  }
  void Int(const char* name, int64_t& out) {
    const Json* v = Find(name, false);
    if (v == nullptr) return;
    if (!v->is_number_integer()) return Fail(name, "not an integer");
    out = v->get<int64_t>();
  }
  void Int(const char* name, int& out) {
    int64_t wide = out;
    Int(name, wide);
    if (wide < INT32_MIN || wide > INT32_MAX) return Fail(name, "out of range");
    out = static_cast<int>(wide);
  }
  void Bool(const char* name, bool& out) {
    const Json* v = Find(name, false);
    if (v == nullptr) return;
    if (!v->is_boolean()) return Fail(name, "not a boolean");
    out = v->get<bool>();
  }
  void Uint(const char* name, uint64_t& out) {
    const Json* v = Find(name, false);
    if (v == nullptr) return;
    if (!v->is_number_unsigned()) return Fail(name, "not an unsigned integer");
    out = v->get<uint64_t>();
  }
  void Any(const char* name, Json& out) {
    const Json* v = Find(name, false);
    if (v != nullptr) out = *v;
  }
  void Array(const char* name, Json& out) {
    const Json* v = Find(name, false);
    if (v == nullptr) return;
    if (!v->is_array()) return Fail(name, "not an array");
    out = *v;
  }
  void Fail(std::string_view name, std::string_view problem) {
    if (!status_.ok()) return;
    std::string msg = "stored " + std::string(record_) + " record is malformed";
    if (!name.empty()) msg += ": field '" + std::string(name) + "'";
    msg += " " + std::string(problem);
    status_ = Internal(std::move(msg));
  }
  const Status& status() const { return status_; }

 private:
  const Json* Find(const char* name, bool required) {
    if (!status_.ok()) return nullptr;
    auto it = j_.find(name);
    if (it == j_.end()) {
      if (required) Fail(name, "is missing");
      return nullptr;
    }
    return &*it;
  }

  const Json& j_;
  std::string_view record_;
  Status status_;
};

}  // namespace

std::string_view WorkStateName(WorkState s) {
  switch (s) {
    case WorkState::kPending:
      return "pending";
    case WorkState::kRunning:
      return "running";
    case WorkState::kDone:
      return "done";
    case WorkState::kFailed:
      return "failed";
    case WorkState::kDead:
      return "dead";
  }
  return "unknown";
}

// ---------------------------------------------------------------- Decision

Json Decision::ToJson() const {
  return Json{{"decision_id", decision_id},
              {"decision_key", decision_key},
              {"step", step},
              {"status", status},
              {"decided_by", decided_by},
              {"output", output},
              {"material", material},
              {"trace", trace},
              {"provider", provider},
              {"model", model},
              {"prompt_version", prompt_version},
              {"created_at_ms", created_at_ms},
              {"expires_at_ms", expires_at_ms},
              {"trace_id", trace_id}};
}

StatusOr<Decision> Decision::FromJson(const Json& j) {
  Decision d;
  FieldReader r(j, "decision");
  r.Str("decision_id", d.decision_id, /*required=*/true);
  r.Str("decision_key", d.decision_key, /*required=*/true);
  r.Str("step", d.step);
  r.Str("status", d.status);
  r.Str("decided_by", d.decided_by);
  r.Any("output", d.output);
  r.Any("material", d.material);
  r.Any("trace", d.trace);
  r.Str("provider", d.provider);
  r.Str("model", d.model);
  r.Str("prompt_version", d.prompt_version);
  r.Int("created_at_ms", d.created_at_ms);
  r.Int("expires_at_ms", d.expires_at_ms);
  r.Str("trace_id", d.trace_id);
  if (!r.status().ok()) return r.status();
  return d;
}

Json TraceSummary(const Json& trace) {
  Json summary = Json::object();
  if (!trace.is_object()) return summary;
  for (const auto& [k, v] : trace.items()) {
    if (!v.is_object() && !v.is_array()) summary[k] = v;
  }
  return summary;
}

bool TraceHasDetail(const Json& trace) {
  if (!trace.is_object()) return !trace.is_null();
  for (const auto& [k, v] : trace.items()) {
    if (v.is_object() || v.is_array()) return true;
  }
  return false;
}

// ---------------------------------------------------------------- WorkItem

Json WorkItem::ToJson() const {
  Json j{{"work_id", work_id},
         {"kind", kind},
         {"state", WorkStateName(state)},
         {"attempt", attempt},
         {"max_attempts", max_attempts},
         {"lease_token", lease_token},
         {"locked_until_ms", locked_until_ms},
         {"args", args},
         {"identity", identity},
         {"result", result},
         {"external_ref", external_ref},
         {"last_error", last_error},
         {"next_attempt_at_ms", next_attempt_at_ms},
         {"created_at_ms", created_at_ms},
         {"updated_at_ms", updated_at_ms},
         {"expires_at_ms", expires_at_ms},
         {"run_id", run_id},
         {"request_id", request_id},
         {"trace_id", trace_id},
         {"window_ms", window_ms}};
  if (!other_runs.empty()) j["other_runs"] = other_runs;
  if (!call_id.empty()) j["call_id"] = call_id;
  return j;
}

namespace {

// `other_runs` as stored: an array of at most kMaxOtherRuns non-empty strings.
Status ReadOtherRuns(const Json& v, std::vector<std::string>& out) {
  if (!v.is_array() || v.size() > kMaxOtherRuns) {
    return Internal("journal record: other_runs is not an array of at most " +
                    std::to_string(kMaxOtherRuns) + " run ids");
  }
  out.clear();
  for (const Json& run : v) {
    if (!run.is_string() || run.get_ref<const std::string&>().empty()) {
      return Internal("journal record: other_runs holds something other than a run id");
    }
    out.push_back(run.get<std::string>());
  }
  return Status::Ok();
}

}  // namespace

StatusOr<WorkItem> WorkItem::FromJson(const Json& j) {
  WorkItem w;
  FieldReader r(j, "journal");
  r.Str("work_id", w.work_id, /*required=*/true);
  r.Str("kind", w.kind);
  std::string state;
  r.Str("state", state, /*required=*/true);
  r.Int("attempt", w.attempt);
  r.Int("max_attempts", w.max_attempts);
  r.Str("lease_token", w.lease_token);
  r.Int("locked_until_ms", w.locked_until_ms);
  r.Any("args", w.args);
  r.Any("identity", w.identity);
  r.Any("result", w.result);
  r.Str("external_ref", w.external_ref);
  r.Str("last_error", w.last_error);
  r.Int("next_attempt_at_ms", w.next_attempt_at_ms);
  r.Int("created_at_ms", w.created_at_ms);
  r.Int("updated_at_ms", w.updated_at_ms);
  r.Int("expires_at_ms", w.expires_at_ms);
  r.Str("run_id", w.run_id);
  r.Str("request_id", w.request_id);
  r.Str("trace_id", w.trace_id);
  r.Int("window_ms", w.window_ms);
  r.Str("call_id", w.call_id);
  if (!r.status().ok()) return r.status();
  if (j.contains("other_runs")) RETURN_IF_ERROR(ReadOtherRuns(j["other_runs"], w.other_runs));
  StatusOr<WorkState> parsed = store_internal::ParseWorkState(state);
  if (!parsed.ok()) return parsed.status();
  w.state = *parsed;
  return w;
}

// -------------------------------------------------------------------- Plan

Json Plan::ToJson() const {
  Json j{{"plan_id", plan_id},
         {"decision_id", decision_id},
         {"origin", origin},
         {"state", state},
         {"actions", actions},
         {"approval", approval},
         {"history", history},
         {"created_at_ms", created_at_ms},
         {"updated_at_ms", updated_at_ms}};
  auto text = [&j](const char* name, const std::string& v) {
    if (!v.empty()) j[name] = v;
  };
  text("step", step);
  text("created_by", created_by);
  text("approved_by", approved_by);
  text("rejected_by", rejected_by);
  text("comment", comment);
  text("reason", reason);
  text("trace_id", trace_id);
  if (!original_actions.is_null()) j["original_actions"] = original_actions;
  return j;
}

StatusOr<Plan> Plan::FromJson(const Json& j) {
  Plan p;
  FieldReader r(j, "plan");
  r.Str("plan_id", p.plan_id, /*required=*/true);
  r.Str("decision_id", p.decision_id);
  r.Str("origin", p.origin);
  r.Str("step", p.step);
  r.Str("state", p.state, /*required=*/true);
  r.Array("actions", p.actions);
  r.Any("original_actions", p.original_actions);
  r.Any("approval", p.approval);
  r.Str("created_by", p.created_by);
  r.Str("approved_by", p.approved_by);
  r.Str("rejected_by", p.rejected_by);
  r.Str("comment", p.comment);
  r.Str("reason", p.reason);
  r.Array("history", p.history);
  r.Int("created_at_ms", p.created_at_ms);
  r.Int("updated_at_ms", p.updated_at_ms);
  r.Str("trace_id", p.trace_id);
  if (!r.status().ok()) return r.status();
  if (!p.approval.is_object()) p.approval = Json::object();
  return p;
}

namespace {

// Journal::BeginOps without a write to wait for: the outcomes are known.
class DecidedOps final : public Journal::PendingOps {
 public:
  explicit DecidedOps(std::vector<StatusOr<JournalOpResult>> results)
      : results(std::move(results)) {}
  bool Ready() const override { return true; }
  std::vector<StatusOr<JournalOpResult>> results;
};

// A refused Complete/Fail: the record as found, marked stale.
StatusOr<JournalOpResult> StaleOr(Journal& j, const Status& st, const std::string& work_id) {
  if (st.code() != Code::kFailedPrecondition) return st;
  ASSIGN_OR_RETURN(WorkItem found, j.Get(work_id));
  JournalOpResult r;
  r.item = std::move(found);
  r.stale_lease = true;
  return r;
}

StatusOr<JournalOpResult> ApplyOne(Journal& j, const JournalOp& op) {
  switch (op.type) {
    case JournalOp::Type::kClaim: {
      ASSIGN_OR_RETURN(ClaimResult c, j.Claim(op.claim));
      return JournalOpResult{.outcome = c.outcome, .item = std::move(c.item)};
    }
    case JournalOp::Type::kComplete: {
      Status st = j.Complete(op.work_id, op.lease_token, op.result, op.external_ref, op.now_ms);
      if (!st.ok()) return StaleOr(j, st, op.work_id);
      ASSIGN_OR_RETURN(WorkItem done, j.Get(op.work_id));
      return JournalOpResult{.outcome = ClaimOutcome::kDone, .item = std::move(done)};
    }
    case JournalOp::Type::kFail: {
      ASSIGN_OR_RETURN(WorkItem before, j.Get(op.work_id));
      int64_t delay = op.retry_delay_ms ? op.retry_delay_ms(before) : 0;
      StatusOr<WorkItem> after =
          j.Fail(op.work_id, op.lease_token, op.error, op.retryable, op.now_ms + delay, op.now_ms);
      if (!after.ok()) return StaleOr(j, after.status(), op.work_id);
      ClaimOutcome o = after->state == WorkState::kDead ? ClaimOutcome::kDead : ClaimOutcome::kDone;
      return JournalOpResult{.outcome = o, .item = std::move(after).value()};
    }
  }
  return Internal("unknown journal op");
}

}  // namespace

std::vector<StatusOr<ClaimResult>> Journal::ClaimMany(std::span<const ClaimRequest> reqs) {
  std::vector<JournalOp> ops;
  ops.reserve(reqs.size());
  for (const ClaimRequest& r : reqs) ops.push_back(JournalOp::Claim(r));
  std::vector<StatusOr<JournalOpResult>> done = FinishOps(BeginOps(ops, nullptr));
  std::vector<StatusOr<ClaimResult>> out;
  out.reserve(done.size());
  for (StatusOr<JournalOpResult>& r : done) {
    if (!r.ok()) {
      out.push_back(r.status());
    } else {
      out.push_back(
          ClaimResult{.outcome = r->outcome, .item = std::move(r->item), .buried = r->buried});
    }
  }
  return out;
}

std::unique_ptr<Journal::PendingOps> Journal::BeginOps(std::span<const JournalOp> ops,
                                                       std::function<void()> on_durable,
                                                       LockWait /*wait*/) {
  std::vector<StatusOr<JournalOpResult>> out;
  out.reserve(ops.size());
  for (const JournalOp& op : ops) out.push_back(ApplyOne(*this, op));
  if (on_durable) on_durable();
  return std::make_unique<DecidedOps>(std::move(out));
}

std::vector<StatusOr<JournalOpResult>> Journal::FinishOps(std::unique_ptr<PendingOps> pending) {
  return std::move(static_cast<DecidedOps&>(*pending).results);
}

std::string TimeIdCursor(int64_t ms, std::string_view id) {
  return HexEncode(std::to_string(ms) + "/" + std::string(id));
}

StatusOr<std::pair<int64_t, std::string>> ParseTimeIdCursor(std::string_view cursor) {
  const Status bad = store_internal::BadCursor();
  if (cursor.size() > 4096) return bad;
  std::optional<std::string> raw = HexDecode(cursor);
  if (!raw) return bad;
  const size_t slash = raw->find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == raw->size()) return bad;
  int64_t ms = 0;
  auto [end, ec] = std::from_chars(raw->data(), raw->data() + slash, ms);
  // No record is made before 1970: a negative time is no list's.
  if (ec != std::errc() || end != raw->data() + slash || ms < 0) return bad;
  std::string id = raw->substr(slash + 1);
  if (id.find('\0') != std::string::npos || !IsValidUtf8(id)) return bad;
  return std::make_pair(ms, std::move(id));
}

namespace store_internal {
namespace {

// SAX handler for one stored WorkItem: top-level scalars go straight into
// their fields; nested values (args, identity, result) are built as DOM.
class WorkItemSax {
 public:
  explicit WorkItemSax(WorkItem& w) : w_(w) {}

  bool null() { return Value(Json(nullptr)); }
  bool boolean(bool v) { return Value(Json(v)); }
  bool number_integer(Json::number_integer_t v) { return Value(Json(v)); }
  bool number_unsigned(Json::number_unsigned_t v) { return Value(Json(v)); }
  bool number_float(Json::number_float_t v, const std::string& /*text*/) { return Value(Json(v)); }
  bool string(std::string& v) { return Value(Json(std::move(v))); }
  bool binary(Json::binary_t& /*v*/) { return Fail("", "holds binary data"); }
  bool key(std::string& k) {
    if (stack_.empty()) {
      field_.assign(k);
    } else {
      nested_key_ = std::move(k);
    }
    return true;
  }
  bool start_object(size_t /*n*/) { return Open(Json::object()); }
  bool start_array(size_t /*n*/) {
    if (!in_top_) return Fail("", "is not an object");
    return Open(Json::array());
  }
  bool end_object() { return Close(); }
  bool end_array() { return Close(); }
  bool parse_error(size_t /*pos*/, const std::string& /*token*/,
                   const nlohmann::detail::exception& /*ex*/) {
    if (status_.ok()) status_ = Internal("stored journal record is not valid JSON");
    return false;
  }

  Status Finish() {
    RETURN_IF_ERROR(status_);
    if (!seen_top_) return Internal("stored journal record is malformed: not an object");
    if (!have_work_id_) Fail("work_id", "is missing");
    if (!have_state_) Fail("state", "is missing");
    if (status_.ok() && have_other_runs_) status_ = ReadOtherRuns(other_runs_, w_.other_runs);
    return status_;
  }

 private:
  bool Fail(std::string_view name, std::string_view problem) {
    if (status_.ok()) {
      std::string msg = "stored journal record is malformed";
      if (!name.empty()) msg += ": field '" + std::string(name) + "'";
      status_ = Internal(msg + " " + std::string(problem));
    }
    return false;
  }

  bool Open(Json container) {
    if (!in_top_) {
      if (seen_top_ || !container.is_object()) return Fail("", "is not an object");
      in_top_ = seen_top_ = true;
      return true;
    }
    if (stack_.empty()) {
      // A nested value of a top-level field.
      Json* target = NestedTarget();
      if (target == nullptr) return Fail(field_, "has the wrong type");
      *target = std::move(container);
      stack_.push_back(target);
      return true;
    }
    Json* parent = stack_.back();
    Json* child = parent->is_object() ? &(*parent)[nested_key_] : &parent->emplace_back();
    *child = std::move(container);
    stack_.push_back(child);
    return true;
  }

  bool Close() {
    if (stack_.empty()) {
      in_top_ = false;  // the end of the record
      return true;
    }
    stack_.pop_back();
    return true;
  }

  Json* NestedTarget() {
    if (field_ == "args") return &w_.args;
    if (field_ == "identity") return &w_.identity;
    if (field_ == "result") return &w_.result;
    if (field_ == "other_runs") return have_other_runs_ = true, &other_runs_;
    if (IsKnownScalar()) return nullptr;
    return &ignored_;  // an unknown field from a newer version
  }

  bool IsKnownScalar() const {
    for (std::string_view name :
         {"work_id", "kind", "state", "lease_token", "external_ref", "last_error", "run_id",
          "request_id", "trace_id", "call_id", "attempt", "max_attempts", "locked_until_ms",
          "next_attempt_at_ms", "created_at_ms", "updated_at_ms", "expires_at_ms", "window_ms"}) {
      if (field_ == name) return true;
    }
    return false;
  }

  bool Value(Json v) {
    if (!in_top_) return Fail("", "is not an object");
    if (!stack_.empty()) {
      Json* parent = stack_.back();
      if (parent->is_object()) {
        (*parent)[nested_key_] = std::move(v);
      } else {
        parent->push_back(std::move(v));
      }
      return true;
    }
    return Field(std::move(v));
  }

  bool Str(Json& v, std::string& out) {
    if (!v.is_string()) return Fail(field_, "not a string");
    out = std::move(v.get_ref<std::string&>());
    return true;
  }
  bool Int(const Json& v, int64_t& out) {
    if (!v.is_number_integer()) return Fail(field_, "not an integer");
    out = v.get<int64_t>();
    return true;
  }
  bool Int(const Json& v, int& out) {
    int64_t wide = 0;
    if (!Int(v, wide)) return false;
    if (wide < INT32_MIN || wide > INT32_MAX) return Fail(field_, "out of range");
    out = static_cast<int>(wide);
    return true;
  }

  bool Field(Json v) {
    const std::string& f = field_;
    if (f == "work_id") return have_work_id_ = true, Str(v, w_.work_id);
    if (f == "state") {
      std::string name;
      if (!Str(v, name)) return false;
      StatusOr<WorkState> parsed = ParseWorkState(name);
      if (!parsed.ok()) {
        status_ = parsed.status();
        return false;
      }
      w_.state = *parsed;
      have_state_ = true;
      return true;
    }
    if (f == "kind") return Str(v, w_.kind);
    if (f == "lease_token") return Str(v, w_.lease_token);
    if (f == "external_ref") return Str(v, w_.external_ref);
    if (f == "last_error") return Str(v, w_.last_error);
    if (f == "run_id") return Str(v, w_.run_id);
    if (f == "request_id") return Str(v, w_.request_id);
    if (f == "trace_id") return Str(v, w_.trace_id);
    if (f == "call_id") return Str(v, w_.call_id);
    if (f == "attempt") return Int(v, w_.attempt);
    if (f == "max_attempts") return Int(v, w_.max_attempts);
    if (f == "locked_until_ms") return Int(v, w_.locked_until_ms);
    if (f == "next_attempt_at_ms") return Int(v, w_.next_attempt_at_ms);
    if (f == "created_at_ms") return Int(v, w_.created_at_ms);
    if (f == "updated_at_ms") return Int(v, w_.updated_at_ms);
    if (f == "expires_at_ms") return Int(v, w_.expires_at_ms);
    if (f == "window_ms") return Int(v, w_.window_ms);
    if (f == "args") return w_.args = std::move(v), true;
    if (f == "identity") return w_.identity = std::move(v), true;
    if (f == "result") return w_.result = std::move(v), true;
    // Not an array (ReadOtherRuns refuses it in Finish, as FromJson does).
    if (f == "other_runs") return have_other_runs_ = true, other_runs_ = std::move(v), true;
    return true;  // an unknown field from a newer version
  }

  WorkItem& w_;
  Status status_;
  bool in_top_ = false;
  bool seen_top_ = false;
  bool have_work_id_ = false;
  bool have_state_ = false;
  std::string field_;         // the current top-level member name
  std::string nested_key_;    // the current member name inside a nested object
  std::vector<Json*> stack_;  // open nested containers, innermost last
  Json ignored_;
  Json other_runs_;  // read whole, checked by Finish
  bool have_other_runs_ = false;
};

}  // namespace

StatusOr<WorkItem> DecodeWorkItem(std::string_view text) {
  WorkItem w;
  WorkItemSax sax(w);
  bool parsed = false;
  try {
    parsed = Json::sax_parse(text, &sax);
  } catch (const Json::exception&) {
    // sax_parse reports through parse_error; this is belt and braces.
  }
  Status s = sax.Finish();
  if (!s.ok()) return s;
  if (!parsed) return Internal("stored journal record is not valid JSON");
  return w;
}

StatusOr<std::string> EncodeWorkItem(const WorkItem& w) {
  // A member whose value is WorkItem's default is left out (DecodeWorkItem
  // restores the default): a quarter fewer bytes per record to write to the
  // WAL, insert into the memtable and flush, twice per unit of work.
  JsonObjectWriter out;
  out.Str("work_id", w.work_id)
      .Str("kind", w.kind)
      .Str("state", WorkStateName(w.state))
      .Int("attempt", w.attempt)
      .Int("max_attempts", w.max_attempts);
  auto str = [&out](std::string_view name, const std::string& v) {
    if (!v.empty()) out.Str(name, v);
  };
  auto num = [&out](std::string_view name, int64_t v) {
    if (v != 0) out.Int(name, v);
  };
  str("lease_token", w.lease_token);
  num("locked_until_ms", w.locked_until_ms);
  for (const auto& [n, v] : {std::pair<std::string_view, const Json*>{"args", &w.args},
                             {"identity", &w.identity},
                             {"result", &w.result}}) {
    if (n == "args" && v->is_object() && v->empty()) continue;
    if (n == "result" && v->is_null()) continue;
    ASSIGN_OR_RETURN(std::string text, EncodeJson(*v));
    out.Raw(n, text);
  }
  str("external_ref", w.external_ref);
  str("last_error", w.last_error);
  num("next_attempt_at_ms", w.next_attempt_at_ms);
  out.Int("created_at_ms", w.created_at_ms).Int("updated_at_ms", w.updated_at_ms);
  num("expires_at_ms", w.expires_at_ms);
  str("run_id", w.run_id);
  if (!w.other_runs.empty()) {
    ASSIGN_OR_RETURN(std::string runs, EncodeJson(Json(w.other_runs)));
    out.Raw("other_runs", runs);
  }
  str("request_id", w.request_id);
  str("trace_id", w.trace_id);
  num("window_ms", w.window_ms);
  str("call_id", w.call_id);
  if (!out.bad().empty()) {
    return InvalidArgument("record cannot be stored: " + std::string(out.bad()) +
                           " is not valid UTF-8");
  }
  return out.Take();
}

StatusOr<WorkState> ParseWorkState(std::string_view name) {
  for (WorkState s : {WorkState::kPending, WorkState::kRunning, WorkState::kDone,
                      WorkState::kFailed, WorkState::kDead}) {
    if (WorkStateName(s) == name) return s;
  }
  return Internal("stored journal record has unknown state '" + std::string(name) + "'");
}

StatusOr<std::string> EncodeJson(const Json& j) {
  try {
    return j.dump();
  } catch (const Json::exception& e) {
    // dump() throws only for strings that are not valid UTF-8.
    return InvalidArgument(std::string("record cannot be stored: ") + e.what());
  }
}

StatusOr<Json> DecodeJson(std::string_view text, std::string_view what) {
  Json j = Json::parse(text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return Internal("stored " + std::string(what) + " record is not valid JSON");
  }
  return j;
}

// ---------------------------------------------------------- stored decision

StatusOr<StoredDecision> EncodeDecision(const Decision& d) {
  StoredDecision out;
  Json hot = d.ToJson();
  if (TraceHasDetail(d.trace)) {
    ASSIGN_OR_RETURN(std::string trace, EncodeJson(d.trace));
    out.trace = std::move(trace);
    hot["trace"] = TraceSummary(d.trace);
    hot[kTraceApartMember] = true;
  }
  ASSIGN_OR_RETURN(out.hot, EncodeJson(hot));
  return out;
}

StatusOr<Decision> DecodeDecision(std::string_view hot, bool* trace_apart) {
  ASSIGN_OR_RETURN(Json j, DecodeJson(hot, "decision"));
  ASSIGN_OR_RETURN(Decision d, Decision::FromJson(j));
  auto apart = j.find(kTraceApartMember);
  d.trace_whole = !(apart != j.end() && apart->is_boolean() && apart->get<bool>());
  if (trace_apart != nullptr) *trace_apart = !d.trace_whole;
  return d;
}

Status AttachTrace(Decision& d, std::string_view trace_text) {
  ASSIGN_OR_RETURN(d.trace, DecodeJson(trace_text, "decision trace"));
  d.trace_whole = true;
  return Status::Ok();
}

void CutTraceToSummary(Decision& d) {
  if (!d.trace_whole || !TraceHasDetail(d.trace)) return;
  d.trace = TraceSummary(d.trace);
  d.trace_whole = false;
}

// --------------------------------------------------------------- IdemRecord

std::string_view IdemStateName(IdemRecord::State s) {
  switch (s) {
    case IdemRecord::State::kCompleted:
      return "completed";
    case IdemRecord::State::kReleased:
      return "released";
    case IdemRecord::State::kInProgress:
      break;
  }
  return "in_progress";
}

Json IdemRecordToJson(const IdemRecord& rec) {
  return Json{{"scope", rec.scope},
              {"key", rec.key},
              {"fingerprint", rec.fingerprint},
              {"state", IdemStateName(rec.state)},
              {"response_status", rec.response_status},
              {"response_body", rec.response_body},
              {"response_content_type", rec.response_content_type},
              {"request_id", rec.request_id},
              {"created_at_ms", rec.created_at_ms},
              {"expires_at_ms", rec.expires_at_ms},
              {"lease_until_ms", rec.lease_until_ms},
              {"ran", rec.ran},
              {"owner", rec.owner}};
}

StatusOr<IdemRecord> IdemRecordFromJson(const Json& j) {
  IdemRecord rec;
  FieldReader r(j, "idempotency key");
  r.Str("scope", rec.scope, /*required=*/true);
  r.Str("key", rec.key, /*required=*/true);
  r.Str("fingerprint", rec.fingerprint);
  std::string state;
  r.Str("state", state, /*required=*/true);
  r.Int("response_status", rec.response_status);
  r.Str("response_body", rec.response_body);
  r.Str("response_content_type", rec.response_content_type);
  r.Str("request_id", rec.request_id);
  r.Int("created_at_ms", rec.created_at_ms);
  r.Int("expires_at_ms", rec.expires_at_ms);
  r.Int("lease_until_ms", rec.lease_until_ms);
  r.Bool("ran", rec.ran);
  r.Str("owner", rec.owner);
  if (r.status().ok()) {
    if (state == "completed") {
      rec.state = IdemRecord::State::kCompleted;
    } else if (state == "released") {
      rec.state = IdemRecord::State::kReleased;
    } else if (state == "in_progress") {
      rec.state = IdemRecord::State::kInProgress;
    } else {
      r.Fail("state", "is unknown");
    }
  }
  if (!r.status().ok()) return r.status();
  return rec;
}

// --------------------------------------------------------------- NamedLease

Json NamedLeaseToJson(const NamedLease& l) {
  return Json{{"name", l.name},
              {"holder", l.holder},
              {"token", l.token},
              {"acquired_at_ms", l.acquired_at_ms},
              {"expires_at_ms", l.expires_at_ms}};
}

StatusOr<NamedLease> NamedLeaseFromJson(const Json& j) {
  NamedLease l;
  FieldReader r(j, "lease");
  r.Str("name", l.name, /*required=*/true);
  r.Str("holder", l.holder, /*required=*/true);
  r.Str("token", l.token);
  r.Int("acquired_at_ms", l.acquired_at_ms);
  r.Int("expires_at_ms", l.expires_at_ms);
  if (!r.status().ok()) return r.status();
  return l;
}

// --------------------------------------------------------------- AuditEvent

Json AuditEventBodyToJson(const AuditEvent& e) {
  return Json{{"seq", e.seq},       {"at_ms", e.at_ms},   {"actor", e.actor},
              {"action", e.action}, {"detail", e.detail}, {"prev_hash", e.prev_hash}};
}

Json AuditEventToJson(const AuditEvent& e) {
  Json j = AuditEventBodyToJson(e);
  j["hash"] = e.hash;
  return j;
}

StatusOr<AuditEvent> AuditEventFromJson(const Json& j) {
  AuditEvent e;
  FieldReader r(j, "audit");
  r.Uint("seq", e.seq);
  r.Int("at_ms", e.at_ms);
  r.Str("actor", e.actor);
  r.Str("action", e.action);
  r.Any("detail", e.detail);
  r.Str("prev_hash", e.prev_hash);
  r.Str("hash", e.hash, /*required=*/true);
  if (!r.status().ok()) return r.status();
  return e;
}

}  // namespace store_internal
}  // namespace idem
