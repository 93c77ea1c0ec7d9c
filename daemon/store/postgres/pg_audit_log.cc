// PostgreSQL AuditLog: one hash chain (store.h) shared by every daemon on the
// schema.
//
// "audit" holds seq -> the event's stored JSON text (exactly the bytes that
// were hashed, never re-encoded); "audit_head" is one row with the seq and
// hash of the last event. Every append, from any daemon, first locks that row
// (SELECT ... FOR UPDATE) in its own transaction, so appends form one linear
// sequence: seq = head + 1, prev_hash = head hash, and the head moves in the
// same transaction as the event. A writer that appends with a state change
// (a plan's) takes its own locks first and the head last, so the head is held
// only for the end of a transaction and lock order is the same everywhere.
//
// Check reads the head and every event in one REPEATABLE READ snapshot, in
// pages, and walks them with AuditChainCheck: a modified, removed or
// reordered row breaks a link, rows removed from the end fall short of the
// head, and a missing head row with events present fails at seq 1.
#include <string>
#include <utility>
#include <vector>

#include "daemon/store/postgres/pg_store.h"
#include "daemon/store/record_codec.h"

namespace idem::pg {

extern const std::string_view kSchemaAudit = R"sql(
CREATE TABLE audit (
  seq   bigint PRIMARY KEY,
  event text NOT NULL
);
CREATE TABLE audit_head (
  one  boolean PRIMARY KEY DEFAULT true CHECK (one),
  seq  bigint NOT NULL,
  hash text NOT NULL
);
INSERT INTO audit_head (one, seq, hash) VALUES (true, 0, '');
)sql";

namespace {

constexpr size_t kCheckPage = 1000;

StatusOr<AuditEvent> DecodeEvent(std::string_view text) {
  ASSIGN_OR_RETURN(Json j, store_internal::DecodeJson(text, "audit"));
  return store_internal::AuditEventFromJson(j);
}

class PgAuditLog final : public AuditLog {
 public:
  explicit PgAuditLog(PgContext& ctx) : ctx_(ctx) {}

  StatusOr<uint64_t> Append(AuditEvent event) override {
    uint64_t seq = 0;
    RETURN_IF_ERROR(ctx_.pool.Tx([&](Conn& c) -> Status {
      ASSIGN_OR_RETURN(seq, AppendAuditTx(c, event));
      return Status::Ok();
    }));
    return seq;
  }

  StatusOr<std::vector<AuditEvent>> Scan(uint64_t from_seq, size_t limit) override {
    std::vector<AuditEvent> out;
    if (limit == 0) return out;
    ASSIGN_OR_RETURN(Result r, ctx_.pool.Exec("SELECT event FROM audit WHERE seq >= $1"
                                              " ORDER BY seq LIMIT $2",
                                              {P(from_seq), P(static_cast<uint64_t>(limit))}));
    out.reserve(static_cast<size_t>(r.rows()));
    for (int i = 0; i < r.rows(); ++i) {
      ASSIGN_OR_RETURN(AuditEvent e, DecodeEvent(r.text(i, 0)));
      out.push_back(std::move(e));
    }
    return out;
  }

  StatusOr<AuditVerification> Check() override {
    AuditVerification v;
    AuditChainCheck check;
    // One snapshot for the head and every page: appends committed after it
    // are neither in the head nor in the pages.
    Status s = ctx_.pool.Tx([&](Conn& c) -> Status {
      v = AuditVerification();
      check = AuditChainCheck();
      RETURN_IF_ERROR(c.ExecScript("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"));
      ASSIGN_OR_RETURN(Result head, c.Exec("SELECT seq, hash FROM audit_head WHERE one"));
      bool head_missing = head.rows() == 0;
      if (!head_missing) {
        v.head_seq = static_cast<uint64_t>(head.i64(0, 0));
        v.head_hash = head.str(0, 1);
      }
      int64_t after = 0;
      bool first_page = true;
      while (check.ok()) {
        ASSIGN_OR_RETURN(Result r, c.Exec("SELECT seq, event FROM audit WHERE seq > $1"
                                          " ORDER BY seq LIMIT $2",
                                          {P(after), P(static_cast<uint64_t>(kCheckPage))}));
        if (first_page && head_missing && r.rows() > 0) {
          check.Fail(1, "the log has events but no head record (it was removed)");
        }
        first_page = false;
        for (int i = 0; i < r.rows() && check.ok(); ++i) {
          const int64_t row_seq = r.i64(i, 0);
          const uint64_t expected = check.checked() + 1;
          StatusOr<AuditEvent> e = DecodeEvent(r.text(i, 1));
          if (!e.ok()) {
            check.Fail(expected, "undecodable event: " + e.status().message());
            break;
          }
          if (row_seq < 0 || static_cast<uint64_t>(row_seq) != e->seq) {
            check.Fail(expected,
                       "event seq " + std::to_string(e->seq) + " stored under another seq");
            break;
          }
          check.Add(*e);
          after = row_seq;
        }
        if (static_cast<size_t>(r.rows()) < kCheckPage) break;
      }
      return Status::Ok();
    });
    RETURN_IF_ERROR(s);
    check.Finish(v.head_seq, v.head_hash);
    v.ok = check.ok();
    v.checked = check.checked();
    v.broken_seq = check.broken_seq();
    v.detail = check.detail();
    return v;
  }

 private:
  PgContext& ctx_;
};

}  // namespace

std::unique_ptr<AuditLog> MakePgAuditLog(PgContext& ctx) {
  return std::make_unique<PgAuditLog>(ctx);
}

StatusOr<uint64_t> AppendAuditTx(Conn& c, AuditEvent event) {
  if (!event.detail.is_object()) event.detail = Json::object();
  // The head row serializes appenders across every daemon until commit.
  ASSIGN_OR_RETURN(Result head, c.Exec("SELECT seq, hash FROM audit_head WHERE one FOR UPDATE"));
  if (head.rows() == 0) {
    // The head row was removed (Check reports it while events remain).
    // Continue after the last stored event, as the RocksDB log does.
    ASSIGN_OR_RETURN(Result last, c.Exec("SELECT event FROM audit ORDER BY seq DESC LIMIT 1"));
    uint64_t seq = 0;
    std::string hash;
    if (last.rows() > 0) {
      ASSIGN_OR_RETURN(AuditEvent e, DecodeEvent(last.text(0, 0)));
      seq = e.seq;
      hash = e.hash;
    }
    RETURN_IF_ERROR(c.Exec("INSERT INTO audit_head (one, seq, hash) VALUES (true, $1, $2)"
                           " ON CONFLICT (one) DO NOTHING",
                           {P(seq), P(hash)})
                        .status());
    ASSIGN_OR_RETURN(head, c.Exec("SELECT seq, hash FROM audit_head WHERE one FOR UPDATE"));
    if (head.rows() == 0) return Internal("postgres audit: the head row cannot be recreated");
  }
  event.seq = static_cast<uint64_t>(head.i64(0, 0)) + 1;
  event.prev_hash = head.str(0, 1);
  ASSIGN_OR_RETURN(event.hash, AuditChainHash(event));
  ASSIGN_OR_RETURN(std::string text,
                   store_internal::EncodeJson(store_internal::AuditEventToJson(event)));
  RETURN_IF_ERROR(c.Exec("WITH ev AS (INSERT INTO audit (seq, event) VALUES ($1, $2))"
                         " UPDATE audit_head SET seq = $1, hash = $3 WHERE one",
                         {P(event.seq), P(text), P(event.hash)})
                      .status());
  return event.seq;
}

}  // namespace idem::pg
