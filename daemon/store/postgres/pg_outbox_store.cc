// PostgreSQL OutboxStore (store.h): events staged in the writers'
// transactions, numbered once committed, read in seq order by any number of
// daemons at once.
//
// Sequencing. A writer inserts its event with seq NULL (StageOutboxEvent), so
// an event's existence commits with the state change it reports. Seqs are
// given later by outbox_sequence(), which every After() runs first:
//   1. it locks the one outbox_head row (FOR UPDATE): one sequencer at a
//      time, across all daemons on this schema;
//   2. in a fresh snapshot taken after the lock (a VOLATILE plpgsql function
//      in READ COMMITTED takes one per statement) it numbers the committed,
//      unnumbered rows last_seq+1, last_seq+2, ... and moves last_seq on;
//   3. it commits, which releases the lock.
// A seq is thus given only to a committed row, and every seq a sequencer
// gives is larger than every seq any earlier sequencer gave, all of which
// were committed before it got the lock. A reader that sees a seq therefore
// already sees every smaller one (there is never a smaller one still to come),
// so continuing after the last seq it saw skips nothing: an event that
// commits late simply gets a later seq. The rows of one batch are numbered in
// id (staging) order; ids are taken at INSERT, not at commit, so across
// transactions this is not commit order, and it need not be: the order that
// consumers rely on is the seq order, and what makes it safe is that no row
// gets a seq below one already visible, which the lock guarantees whatever
// order the batch is numbered in. Within one transaction (a batch of
// completes) id order is the order the events were staged.
//
// Seqs are never reused: last_seq only grows, retention included. Unlike on
// RocksDB there are no gaps from failed writes (a rolled back INSERT never
// reaches a sequencer).
#include <algorithm>
#include <utility>

#include "daemon/store/postgres/pg_store.h"
#include "daemon/store/record_codec.h"

namespace idem::pg {

extern const std::string_view kSchemaOutbox = R"sql(
CREATE TABLE outbox (
  id    bigserial PRIMARY KEY,
  seq   bigint UNIQUE,
  type  text NOT NULL,
  key   text NOT NULL,
  at_ms bigint NOT NULL,
  data  jsonb NOT NULL
);
CREATE INDEX outbox_unsequenced ON outbox (id) WHERE seq IS NULL;
-- The sequencer's lock and the last seq given (one row, never deleted).
CREATE TABLE outbox_head (
  one      boolean PRIMARY KEY DEFAULT true CHECK (one),
  last_seq bigint NOT NULL
);
INSERT INTO outbox_head (last_seq) VALUES (0);
CREATE FUNCTION outbox_sequence(p_batch integer) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $fn$
DECLARE
  v_last bigint;
  v_numbered bigint;
BEGIN
  -- Cheap when there is nothing to do: readers do not queue on the lock.
  IF NOT EXISTS (SELECT 1 FROM outbox WHERE seq IS NULL) THEN
    RETURN 0;
  END IF;
  SELECT last_seq INTO v_last FROM outbox_head FOR UPDATE;
  -- A new snapshot: rows committed until now, the previous sequencer's too.
  WITH picked AS (
    SELECT id, row_number() OVER (ORDER BY id) AS n
    FROM (SELECT id FROM outbox WHERE seq IS NULL ORDER BY id LIMIT p_batch) AS p
  )
  UPDATE outbox o SET seq = v_last + picked.n FROM picked WHERE o.id = picked.id;
  GET DIAGNOSTICS v_numbered = ROW_COUNT;
  IF v_numbered > 0 THEN
    UPDATE outbox_head SET last_seq = v_last + v_numbered;
  END IF;
  RETURN v_numbered;
END
$fn$;
-- Sequences what committed, then reads past p_after, in one round trip.
CREATE FUNCTION outbox_after(p_after bigint, p_limit integer, p_batch integer)
RETURNS TABLE (seq bigint, type text, key text, at_ms bigint, data jsonb)
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $fn$
BEGIN
  PERFORM outbox_sequence(p_batch);
  RETURN QUERY
    SELECT o.seq, o.type, o.key, o.at_ms, o.data FROM outbox o
    WHERE o.seq > p_after ORDER BY o.seq LIMIT p_limit;
END
$fn$;
CREATE TABLE outbox_cursors (
  subscriber text PRIMARY KEY,
  seq        bigint NOT NULL
);
CREATE TABLE outbox_dead (
  subscriber text NOT NULL,
  seq        bigint NOT NULL,
  event      jsonb NOT NULL,
  attempts   integer NOT NULL,
  last_error text NOT NULL,
  state      text NOT NULL,
  dead_at_ms bigint NOT NULL,
  PRIMARY KEY (subscriber, seq)
);
CREATE INDEX outbox_dead_seq ON outbox_dead (seq, subscriber);
)sql";

Status StageOutboxEvent(Conn& c, const std::string& type, const std::string& key, int64_t at_ms,
                        const Json& data) {
  ASSIGN_OR_RETURN(std::string text, store_internal::EncodeJson(data));
  return StageOutboxEventText(c, type, key, at_ms, text);
}

Status StageOutboxEventText(Conn& c, const std::string& type, const std::string& key, int64_t at_ms,
                            const std::string& data) {
  return c
      .Exec("INSERT INTO outbox (type, key, at_ms, data) VALUES ($1, $2, $3, $4)",
            {P(type), P(key), P(at_ms), P(data)})
      .status();
}

namespace {

// Rows numbered per sequencer run: bounds its transaction.
constexpr int kSequenceBatch = 1'000;
constexpr size_t kMaxLimit = 100'000;

constexpr const char* kDeadColumns =
    "subscriber, seq, event::text, attempts, last_error, state, dead_at_ms";

StatusOr<OutboxDeadLetter> DeadFromRow(const Result& r, int row) {
  OutboxDeadLetter d;
  d.subscriber = r.str(row, 0);
  ASSIGN_OR_RETURN(Json event, store_internal::DecodeJson(r.text(row, 2), "outbox dead letter"));
  ASSIGN_OR_RETURN(d.event, OutboxEvent::FromJson(event));
  d.event.seq = static_cast<uint64_t>(r.i64(row, 1));
  d.attempts = static_cast<int>(r.i64(row, 3));
  d.last_error = r.str(row, 4);
  d.state = r.str(row, 5);
  d.dead_at_ms = r.i64(row, 6);
  return d;
}

std::string NoDeadLetter(const PgContext& ctx, const std::string& subscriber, uint64_t seq) {
  return "no dead letter of subscriber " + subscriber + " for event " +
         OutboxEvent::IdFor(ctx.store_id, seq);
}

class PgOutboxStore final : public OutboxStore {
 public:
  explicit PgOutboxStore(PgContext& ctx) : ctx_(ctx) {}

  StatusOr<std::vector<OutboxEvent>> After(uint64_t after, size_t limit) override {
    std::vector<OutboxEvent> out;
    if (limit == 0) return out;
    limit = std::min(limit, kMaxLimit);
    ASSIGN_OR_RETURN(Result r,
                     ctx_.pool.Exec("SELECT seq, type, key, at_ms, data::text"
                                    " FROM outbox_after($1, $2, $3)",
                                    {P(after), P(static_cast<int64_t>(limit)), P(kSequenceBatch)}));
    out.reserve(r.rows());
    for (int i = 0; i < r.rows(); ++i) {
      OutboxEvent e;
      e.seq = static_cast<uint64_t>(r.i64(i, 0));
      e.event_id = OutboxEvent::IdFor(ctx_.store_id, e.seq);
      e.type = r.str(i, 1);
      e.key = r.str(i, 2);
      e.at_ms = r.i64(i, 3);
      ASSIGN_OR_RETURN(e.data, store_internal::DecodeJson(r.text(i, 4), "outbox event"));
      out.push_back(std::move(e));
    }
    return out;
  }

  StatusOr<uint64_t> Cursor(const std::string& subscriber) override {
    ASSIGN_OR_RETURN(
        Result r,
        ctx_.pool.Exec("SELECT seq FROM outbox_cursors WHERE subscriber = $1", {P(subscriber)}));
    if (r.rows() == 0) return uint64_t{0};
    return static_cast<uint64_t>(r.i64(0, 0));
  }

  Status Advance(const std::string& subscriber, uint64_t seq) override {
    if (subscriber.empty()) return InvalidArgument("subscriber is empty", "/subscriber");
    // Never back, whichever daemon advances last.
    return ctx_.pool
        .Exec(
            "INSERT INTO outbox_cursors (subscriber, seq) VALUES ($1, $2)"
            " ON CONFLICT (subscriber) DO UPDATE SET seq = EXCLUDED.seq"
            " WHERE outbox_cursors.seq < EXCLUDED.seq",
            {P(subscriber), P(seq)})
        .status();
  }

  Status AddDeadLetter(const OutboxDeadLetter& dl) override {
    if (dl.subscriber.empty()) return InvalidArgument("subscriber is empty", "/subscriber");
    ASSIGN_OR_RETURN(std::string event, store_internal::EncodeJson(dl.event.ToJson()));
    // One statement, so one atomic write: the dead letter and the cursor.
    return ctx_.pool
        .Exec(
            "WITH dead AS ("
            "  INSERT INTO outbox_dead"
            "    (subscriber, seq, event, attempts, last_error, state, dead_at_ms)"
            "  VALUES ($1, $2, $3::jsonb, $4, $5, $6, $7)"
            "  ON CONFLICT (subscriber, seq) DO UPDATE SET event = EXCLUDED.event,"
            "    attempts = EXCLUDED.attempts, last_error = EXCLUDED.last_error,"
            "    state = EXCLUDED.state, dead_at_ms = EXCLUDED.dead_at_ms)"
            " INSERT INTO outbox_cursors (subscriber, seq) VALUES ($1, $2)"
            " ON CONFLICT (subscriber) DO UPDATE SET seq = EXCLUDED.seq"
            " WHERE outbox_cursors.seq < EXCLUDED.seq",
            {P(dl.subscriber), P(dl.event.seq), P(event), P(dl.attempts), P(dl.last_error),
             P(dl.state), P(dl.dead_at_ms)})
        .status();
  }

  StatusOr<std::vector<OutboxDeadLetter>> DeadLetters(const std::string& subscriber,
                                                      uint64_t after_seq, size_t limit) override {
    std::vector<OutboxDeadLetter> out;
    if (limit == 0) return out;
    limit = std::min(limit, kMaxLimit);
    const std::string cols = kDeadColumns;
    StatusOr<Result> r =
        subscriber.empty()
            ? ctx_.pool.Exec("SELECT " + cols +
                                 " FROM outbox_dead WHERE seq > $1 ORDER BY seq, subscriber"
                                 " LIMIT $2",
                             {P(after_seq), P(static_cast<int64_t>(limit))})
            : ctx_.pool.Exec("SELECT " + cols +
                                 " FROM outbox_dead WHERE subscriber = $1 AND seq > $2"
                                 " ORDER BY seq LIMIT $3",
                             {P(subscriber), P(after_seq), P(static_cast<int64_t>(limit))});
    RETURN_IF_ERROR(r.status());
    for (int i = 0; i < r->rows(); ++i) {
      ASSIGN_OR_RETURN(OutboxDeadLetter d, DeadFromRow(*r, i));
      out.push_back(std::move(d));
    }
    return out;
  }

  StatusOr<OutboxDeadLetter> RequestReplay(const std::string& subscriber, uint64_t seq) override {
    static const std::string kSql = std::string(
                                        "UPDATE outbox_dead SET state = 'replaying'"
                                        " WHERE subscriber = $1 AND seq = $2 RETURNING ")
                                        .append(kDeadColumns);
    ASSIGN_OR_RETURN(Result r, ctx_.pool.Exec(kSql, {P(subscriber), P(seq)}));
    if (r.rows() == 0) return NotFound(NoDeadLetter(ctx_, subscriber, seq));
    return DeadFromRow(r, 0);
  }

  Status FinishReplay(const std::string& subscriber, uint64_t seq, bool delivered,
                      const std::string& error, int64_t now_ms) override {
    StatusOr<Result> r =
        delivered ? ctx_.pool.Exec("DELETE FROM outbox_dead WHERE subscriber = $1 AND seq = $2",
                                   {P(subscriber), P(seq)})
                  : ctx_.pool.Exec(
                        "UPDATE outbox_dead SET state = 'dead', attempts = attempts + 1,"
                        " last_error = $3, dead_at_ms = $4 WHERE subscriber = $1 AND seq = $2",
                        {P(subscriber), P(seq), P(error), P(now_ms)});
    RETURN_IF_ERROR(r.status());
    if (r->affected() == 0) return NotFound(NoDeadLetter(ctx_, subscriber, seq));
    return Status::Ok();
  }

  StatusOr<size_t> Sweep(uint64_t through_seq, int64_t cutoff_ms, size_t limit) override {
    if (limit == 0 || through_seq == 0) return size_t{0};
    limit = std::min(limit, kMaxLimit);
    // Oldest first; outbox_head keeps the last seq, so none is given again.
    // The highest seq deleted is kept in meta (SweptThrough), in the same
    // statement.
    ASSIGN_OR_RETURN(Result r,
                     ctx_.pool.Exec("WITH gone AS (DELETE FROM outbox WHERE seq IN ("
                                    " SELECT seq FROM outbox WHERE seq IS NOT NULL AND seq <= $1"
                                    " AND at_ms <= $2 ORDER BY seq LIMIT $3) RETURNING seq),"
                                    " noted AS (INSERT INTO meta (key, value)"
                                    " SELECT $4, max(seq)::text FROM gone HAVING count(*) > 0"
                                    " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value"
                                    " WHERE meta.value::bigint < EXCLUDED.value::bigint)"
                                    " SELECT count(*) FROM gone",
                                    {P(through_seq), P(cutoff_ms), P(static_cast<int64_t>(limit)),
                                     P(std::string(kPgOutboxSweptKey))}));
    return static_cast<size_t>(r.i64(0, 0));
  }

  // last_seq only grows, and a sequencer moves it before a reader sees the
  // seqs it gave.
  StatusOr<uint64_t> Head() override {
    ASSIGN_OR_RETURN(Result r, ctx_.pool.Exec("SELECT last_seq FROM outbox_head", {}));
    return r.rows() == 0 ? uint64_t{0} : static_cast<uint64_t>(r.i64(0, 0));
  }

  StatusOr<uint64_t> SweptThrough() override {
    ASSIGN_OR_RETURN(Result r, ctx_.pool.Exec("SELECT value::bigint FROM meta WHERE key = $1",
                                              {P(std::string(kPgOutboxSweptKey))}));
    return r.rows() == 0 ? uint64_t{0} : static_cast<uint64_t>(r.i64(0, 0));
  }

 private:
  PgContext& ctx_;
};

}  // namespace

std::unique_ptr<OutboxStore> MakePgOutboxStore(PgContext& ctx) {
  return std::make_unique<PgOutboxStore>(ctx);
}

}  // namespace idem::pg
