// PostgreSQL PlanStore: plans shared by every daemon on the schema.
//
// "plans" holds one row per plan: its JSON (Plan::ToJson, as text so any
// string the plan holds round-trips) and the columns the lists and the
// sweep need (state, created_at_ms, updated_at_ms), indexed by
// (state, created_at_ms, plan_id). plan_id sorts bytewise (COLLATE "C"), as
// the RocksDB index does.
//
// Put is one INSERT ... ON CONFLICT DO NOTHING; Change locks the plan's row
// (SELECT ... FOR UPDATE), compares the state, writes the new version, stages
// the outbox event plan.<state> and appends the audit event, all in one
// transaction: of two daemons approving one plan, the second waits for the
// first's commit, then finds the state changed (FailedPrecondition) and
// writes nothing. Lock order: the plan's row, then the audit head.
#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "daemon/core/crypto.h"
#include "daemon/core/json.h"
#include "daemon/store/postgres/pg_store.h"
#include "daemon/store/record_codec.h"

namespace idem::pg {

extern const std::string_view kSchemaPlans = R"sql(
CREATE TABLE plans (
  plan_id       text COLLATE "C" PRIMARY KEY,
  state         text COLLATE "C" NOT NULL,
  created_at_ms bigint NOT NULL,
  updated_at_ms bigint NOT NULL,
  plan          text NOT NULL
);
CREATE INDEX plans_by_state ON plans (state, created_at_ms, plan_id);
)sql";

// The finished plans in the order their windows end: the sweep reads only
// those past it, however many created before them finished after it.
extern const std::string_view kSchemaPlansFinished = R"sql(
CREATE INDEX plans_finished ON plans (updated_at_ms, plan_id)
  WHERE state IN ('applied', 'rejected', 'expired');
)sql";

namespace {

// The outbox event's data for a plan entering its state (as on RocksDB).
Json OutboxData(const Plan& p, const std::string& from, const std::string& actor) {
  Json data = {{"plan_id", p.plan_id}, {"state", p.state}, {"origin", p.origin}};
  if (!from.empty()) data["from"] = from;
  if (!actor.empty()) data["actor"] = actor;
  if (!p.decision_id.empty()) data["decision_id"] = p.decision_id;
  if (!p.step.empty()) data["step"] = p.step;
  return data;
}

StatusOr<Plan> DecodePlan(std::string_view text) {
  ASSIGN_OR_RETURN(Json j, store_internal::DecodeJson(text, "plan"));
  return Plan::FromJson(j);
}

// The caller's audit event with the store's detail merged in.
AuditEvent WithDetail(const AuditEvent& audit, const Json& detail) {
  AuditEvent event = audit;
  if (!event.detail.is_object()) event.detail = Json::object();
  for (auto it = detail.begin(); it != detail.end(); ++it) event.detail[it.key()] = it.value();
  return event;
}

// List's cursor: the hex of BE8(created_at_ms) + plan_id of the last plan
// returned (the same form as the RocksDB store's).
std::string MakeCursor(const Plan& p) {
  std::string raw(8, '\0');
  uint64_t v = static_cast<uint64_t>(p.created_at_ms);
  for (int i = 7; i >= 0; --i, v >>= 8) raw[static_cast<size_t>(i)] = static_cast<char>(v & 0xff);
  return HexEncode(raw + p.plan_id);
}

// The cursor is the hex of BE8(created_at_ms) | plan_id (as the RocksDB
// engine's index suffix); nullopt for anything else, text PostgreSQL would
// refuse included.
std::optional<std::pair<int64_t, std::string>> ParseCursor(std::string_view hex) {
  std::optional<std::string> raw = HexDecode(hex);
  if (!raw || raw->size() <= 8) return std::nullopt;
  uint64_t v = 0;
  for (size_t i = 0; i < 8; ++i) v = (v << 8) | static_cast<unsigned char>((*raw)[i]);
  std::string id = raw->substr(8);
  if (!IsText(id)) return std::nullopt;
  return std::make_pair(static_cast<int64_t>(v), std::move(id));
}

class PgPlanStore final : public PlanStore {
 public:
  explicit PgPlanStore(PgContext& ctx) : ctx_(ctx) {}

  Status Put(const Plan& plan, const AuditEvent* audit) override {
    if (plan.plan_id.empty()) return InvalidArgument("plan_id is empty", "/plan_id");
    if (plan.state.empty()) return InvalidArgument("plan state is empty", "/state");
    if (!plan.actions.is_array()) return InvalidArgument("actions is not an array", "/actions");
    if (!plan.history.is_array()) return InvalidArgument("history is not an array", "/history");
    ASSIGN_OR_RETURN(std::string text, store_internal::EncodeJson(plan.ToJson()));
    return ctx_.pool.Tx([&](Conn& c) -> Status {
      ASSIGN_OR_RETURN(Result r, c.Exec("INSERT INTO plans (plan_id, state, created_at_ms,"
                                        " updated_at_ms, plan) VALUES ($1, $2, $3, $4, $5)"
                                        " ON CONFLICT (plan_id) DO NOTHING",
                                        {P(plan.plan_id), P(plan.state), P(plan.created_at_ms),
                                         P(plan.updated_at_ms), P(text)}));
      if (r.affected() == 0) return AlreadyExists("plan " + plan.plan_id + " exists");
      RETURN_IF_ERROR(StageOutboxEvent(c, "plan." + plan.state, plan.plan_id,
                                       std::max(plan.updated_at_ms, plan.created_at_ms),
                                       OutboxData(plan, "", plan.created_by)));
      if (audit != nullptr) {
        RETURN_IF_ERROR(
            AppendAuditTx(c, WithDetail(*audit, {{"plan_id", plan.plan_id}, {"to", plan.state}}))
                .status());
      }
      return Status::Ok();
    });
  }

  StatusOr<Plan> Get(const std::string& plan_id) override {
    ASSIGN_OR_RETURN(Result r,
                     ctx_.pool.Exec("SELECT plan FROM plans WHERE plan_id = $1", {P(plan_id)}));
    if (r.rows() == 0) return NotFound("no such plan: " + plan_id);
    return DecodePlan(r.text(0, 0));
  }

  StatusOr<Plan> Change(const std::string& plan_id, const PlanChange& change) override {
    if (change.to.empty()) return InvalidArgument("target state is empty", "/to");
    Plan next;
    RETURN_IF_ERROR(ctx_.pool.Tx([&](Conn& c) -> Status {
      ASSIGN_OR_RETURN(
          Result r, c.Exec("SELECT plan FROM plans WHERE plan_id = $1 FOR UPDATE", {P(plan_id)}));
      if (r.rows() == 0) return NotFound("no such plan: " + plan_id);
      ASSIGN_OR_RETURN(Plan current, DecodePlan(r.text(0, 0)));
      if (current.state != change.from) {
        return FailedPrecondition("plan " + plan_id + " is " + current.state + ", not " +
                                  change.from);
      }
      next = current;
      if (change.mutate) RETURN_IF_ERROR(change.mutate(next));
      next.plan_id = plan_id;
      next.created_at_ms = current.created_at_ms;
      next.state = change.to;
      next.updated_at_ms = change.now_ms;
      next.history.push_back(Json{{"from", change.from},
                                  {"to", change.to},
                                  {"actor", change.actor},
                                  {"note", change.note},
                                  {"at_ms", change.now_ms}});
      ASSIGN_OR_RETURN(std::string text, store_internal::EncodeJson(next.ToJson()));
      RETURN_IF_ERROR(c.Exec("UPDATE plans SET state = $2, updated_at_ms = $3, plan = $4"
                             " WHERE plan_id = $1",
                             {P(plan_id), P(next.state), P(next.updated_at_ms), P(text)})
                          .status());
      if (change.from != change.to) {
        RETURN_IF_ERROR(StageOutboxEvent(c, "plan." + change.to, plan_id, change.now_ms,
                                         OutboxData(next, change.from, change.actor)));
      }
      if (change.audit != nullptr) {
        RETURN_IF_ERROR(AppendAuditTx(c, WithDetail(*change.audit, {{"plan_id", plan_id},
                                                                    {"from", change.from},
                                                                    {"to", change.to}}))
                            .status());
      }
      return Status::Ok();
    }));
    return next;
  }

  StatusOr<std::vector<Plan>> ByState(const std::string& state, size_t limit) override {
    std::vector<Plan> out;
    if (limit == 0) return out;
    ASSIGN_OR_RETURN(Result r, ctx_.pool.Exec("SELECT plan FROM plans WHERE state = $1"
                                              " ORDER BY created_at_ms, plan_id LIMIT $2",
                                              {P(state), P(static_cast<uint64_t>(limit))}));
    return Decode(r);
  }

  StatusOr<size_t> CountByState(const std::string& state, size_t cap) override {
    return CountRows(ctx_.pool, "plans WHERE state = $2", {P(state)}, cap);
  }

  StatusOr<PlanPage> List(const std::string& state, size_t limit,
                          const std::string& cursor) override {
    PlanPage page;
    std::optional<std::pair<int64_t, std::string>> after;
    if (!cursor.empty()) {
      after = ParseCursor(cursor);
      if (!after) return store_internal::BadCursor();
    }
    if (limit == 0) return page;
    // One more than asked: whether a next page exists.
    const std::vector<Param> params = {P(state), P(static_cast<uint64_t>(limit) + 1)};
    StatusOr<Result> r = after ? ctx_.pool.Exec(
                                     "SELECT plan FROM plans WHERE state = $1"
                                     " AND (created_at_ms, plan_id) < ($3, $4)"
                                     " ORDER BY created_at_ms DESC, plan_id DESC LIMIT $2",
                                     {params[0], params[1], P(after->first), P(after->second)})
                               : ctx_.pool.Exec(
                                     "SELECT plan FROM plans WHERE state = $1"
                                     " ORDER BY created_at_ms DESC, plan_id DESC LIMIT $2",
                                     params);
    RETURN_IF_ERROR(r.status());
    ASSIGN_OR_RETURN(page.items, Decode(*r));
    if (page.items.size() > limit) {
      page.items.resize(limit);
      page.next_cursor = MakeCursor(page.items.back());
    }
    return page;
  }

  StatusOr<size_t> SweepFinished(int64_t cutoff_ms, size_t limit) override {
    if (limit == 0 || cutoff_ms < 0) return size_t{0};
    // Rows another daemon is changing right now are skipped, not waited for.
    ASSIGN_OR_RETURN(Result r,
                     ctx_.pool.Exec("DELETE FROM plans WHERE plan_id IN ("
                                    " SELECT plan_id FROM plans"
                                    " WHERE state IN ('applied', 'rejected', 'expired')"
                                    " AND updated_at_ms <= $1"
                                    " ORDER BY updated_at_ms LIMIT $2 FOR UPDATE SKIP LOCKED)",
                                    {P(cutoff_ms), P(static_cast<uint64_t>(limit))}));
    return static_cast<size_t>(r.affected());
  }

  StatusOr<size_t> DeleteProposed(const std::vector<DecisionPlan>& plans) override {
    if (plans.empty()) return size_t{0};
    std::vector<std::string> plan_ids, decision_ids;
    for (const auto& [plan_id, decision_id] : plans) {
      RETURN_IF_ERROR(CheckText(plan_id, "/plan_id"));
      RETURN_IF_ERROR(CheckText(decision_id, "/decision_id"));
      plan_ids.push_back(plan_id);
      decision_ids.push_back(decision_id);
    }
    // The row lock the DELETE takes orders it with a Change of the same
    // plan, which then finds no row; a Change first makes the DELETE
    // re-check the row's new state, and keep it.
    ASSIGN_OR_RETURN(Result r,
                     ctx_.pool.Exec("DELETE FROM plans p USING unnest($1::text[], $2::text[])"
                                    " AS v(plan_id, decision_id)"
                                    " WHERE p.plan_id = v.plan_id AND p.state = 'proposed'"
                                    " AND (p.plan::jsonb ->> 'decision_id') = v.decision_id",
                                    {P(ArrayLiteral(plan_ids)), P(ArrayLiteral(decision_ids))}));
    return static_cast<size_t>(r.affected());
  }

 private:
  static StatusOr<std::vector<Plan>> Decode(const Result& r) {
    std::vector<Plan> out;
    out.reserve(static_cast<size_t>(r.rows()));
    for (int i = 0; i < r.rows(); ++i) {
      ASSIGN_OR_RETURN(Plan p, DecodePlan(r.text(i, 0)));
      out.push_back(std::move(p));
    }
    return out;
  }

  PgContext& ctx_;
};

}  // namespace

std::unique_ptr<PlanStore> MakePgPlanStore(PgContext& ctx) {
  return std::make_unique<PgPlanStore>(ctx);
}

}  // namespace idem::pg
