// PostgreSQL EscalationStore: escalations shared by every daemon on the
// schema.
//
// "escalations" holds one row per escalation: its JSON (Escalation::ToJson,
// as text) and the columns the lookups need. OpenByKey reads a partial index
// of the open ones by decision key (the newest open one, as the RocksDB
// store's pointer to the last one put); List reads newest first. Resolve is a
// compare-and-set on state (UPDATE ... WHERE state = 'open'): an open
// escalation changes only by being resolved, so of two daemons resolving one,
// exactly one row update happens and the other gets FailedPrecondition.
#include <string>
#include <utility>
#include <vector>

#include "daemon/store/postgres/pg_store.h"
#include "daemon/store/record_codec.h"

namespace idem::pg {

extern const std::string_view kSchemaEscalations = R"sql(
CREATE TABLE escalations (
  escalation_id  text COLLATE "C" PRIMARY KEY,
  decision_key   text NOT NULL,
  state          text NOT NULL,
  created_at_ms  bigint NOT NULL,
  resolved_at_ms bigint NOT NULL DEFAULT 0,
  escalation     text NOT NULL
);
CREATE INDEX escalations_open ON escalations (decision_key, created_at_ms)
  WHERE state = 'open';
CREATE INDEX escalations_by_time ON escalations (created_at_ms DESC, escalation_id);
)sql";

namespace {

StatusOr<Escalation> DecodeEscalation(std::string_view text) {
  ASSIGN_OR_RETURN(Json j, store_internal::DecodeJson(text, "escalation"));
  return Escalation::FromJson(j);
}

class PgEscalationStore final : public EscalationStore {
 public:
  explicit PgEscalationStore(PgContext& ctx) : ctx_(ctx) {}

  Status Put(const Escalation& e) override {
    if (e.escalation_id.empty()) return InvalidArgument("escalation_id is empty");
    if (e.decision_key.empty()) return InvalidArgument("decision_key is empty");
    ASSIGN_OR_RETURN(std::string text, store_internal::EncodeJson(e.ToJson()));
    ASSIGN_OR_RETURN(Result r,
                     ctx_.pool.Exec("INSERT INTO escalations (escalation_id, decision_key, state,"
                                    " created_at_ms, resolved_at_ms, escalation)"
                                    " VALUES ($1, $2, $3, $4, $5, $6)"
                                    " ON CONFLICT (escalation_id) DO NOTHING",
                                    {P(e.escalation_id), P(e.decision_key), P(e.state),
                                     P(e.created_at_ms), P(e.resolved_at_ms), P(text)}));
    if (r.affected() == 0) return AlreadyExists("escalation " + e.escalation_id + " exists");
    return Status::Ok();
  }

  StatusOr<Escalation> Get(const std::string& escalation_id) override {
    ASSIGN_OR_RETURN(Result r,
                     ctx_.pool.Exec("SELECT escalation FROM escalations WHERE escalation_id = $1",
                                    {P(escalation_id)}));
    if (r.rows() == 0) return NotFound("no such escalation: " + escalation_id);
    return DecodeEscalation(r.text(0, 0));
  }

  StatusOr<Escalation> OpenByKey(const std::string& decision_key) override {
    ASSIGN_OR_RETURN(Result r, ctx_.pool.Exec("SELECT escalation FROM escalations"
                                              " WHERE decision_key = $1 AND state = 'open'"
                                              " ORDER BY created_at_ms DESC, escalation_id DESC"
                                              " LIMIT 1",
                                              {P(decision_key)}));
    if (r.rows() == 0) return NotFound("no open escalation for this key");
    return DecodeEscalation(r.text(0, 0));
  }

  StatusOr<std::vector<Escalation>> List(const std::string& state, size_t limit) override {
    std::vector<Escalation> out;
    if (limit == 0) return out;
    const Param lim = P(static_cast<uint64_t>(limit));
    StatusOr<Result> r = state.empty() ? ctx_.pool.Exec(
                                             "SELECT escalation FROM escalations"
                                             " ORDER BY created_at_ms DESC, escalation_id LIMIT $1",
                                             {lim})
                                       : ctx_.pool.Exec(
                                             "SELECT escalation FROM escalations WHERE state = $2"
                                             " ORDER BY created_at_ms DESC, escalation_id LIMIT $1",
                                             {lim, P(state)});
    RETURN_IF_ERROR(r.status());
    out.reserve(static_cast<size_t>(r->rows()));
    for (int i = 0; i < r->rows(); ++i) {
      ASSIGN_OR_RETURN(Escalation e, DecodeEscalation(r->text(i, 0)));
      out.push_back(std::move(e));
    }
    return out;
  }

  StatusOr<size_t> CountOpen(size_t cap) override {
    return CountRows(ctx_.pool, "escalations WHERE state = 'open'", {}, cap);
  }

  StatusOr<Escalation> Resolve(const std::string& escalation_id, const std::string& decision_id,
                               const std::string& actor, int64_t now_ms) override {
    ASSIGN_OR_RETURN(Escalation current, Get(escalation_id));
    if (current.state != "open") {
      return FailedPrecondition("escalation " + escalation_id + " is " + current.state);
    }
    Escalation next = current;
    next.state = "resolved";
    next.decision_id = decision_id;
    next.resolved_by = actor;
    next.resolved_at_ms = now_ms;
    ASSIGN_OR_RETURN(std::string text, store_internal::EncodeJson(next.ToJson()));
    // Compare-and-set: only an open row changes; its content is what we read,
    // since nothing but Resolve changes an open escalation.
    ASSIGN_OR_RETURN(Result r, ctx_.pool.Exec("UPDATE escalations SET state = 'resolved',"
                                              " resolved_at_ms = $2, escalation = $3"
                                              " WHERE escalation_id = $1 AND state = 'open'",
                                              {P(escalation_id), P(now_ms), P(text)}));
    if (r.affected() == 0) {
      ASSIGN_OR_RETURN(Escalation now, Get(escalation_id));
      return FailedPrecondition("escalation " + escalation_id + " is " + now.state);
    }
    return next;
  }

  StatusOr<size_t> SweepResolved(int64_t cutoff_ms, size_t limit) override {
    if (limit == 0 || cutoff_ms < 0) return size_t{0};
    ASSIGN_OR_RETURN(Result r,
                     ctx_.pool.Exec("DELETE FROM escalations WHERE escalation_id IN ("
                                    " SELECT escalation_id FROM escalations"
                                    " WHERE state = 'resolved' AND created_at_ms <= $1"
                                    " AND resolved_at_ms <= $1"
                                    " ORDER BY created_at_ms DESC LIMIT $2 FOR UPDATE SKIP LOCKED)",
                                    {P(cutoff_ms), P(static_cast<uint64_t>(limit))}));
    return static_cast<size_t>(r.affected());
  }

 private:
  PgContext& ctx_;
};

}  // namespace

std::unique_ptr<EscalationStore> MakePgEscalationStore(PgContext& ctx) {
  return std::make_unique<PgEscalationStore>(ctx);
}

}  // namespace idem::pg
