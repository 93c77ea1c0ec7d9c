// `idem store copy` at the store level (store_copy.h): a RocksDB store filled
// through the interfaces with every family, copied into a PostgreSQL schema,
// then read back through the PostgreSQL store's interfaces and compared with
// the RocksDB store read through its own. Suite "postgres": run only by ctest
// unit_store_postgres (IDEM_TEST_STORE=postgres).
#include "daemon/store/store_copy.h"

#include <doctest/doctest.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "daemon/store/store.h"
#include "tests/unit/store/store_test_util.h"

namespace idem {
namespace {

using testing::TempDir;

constexpr int64_t kT0 = 1'700'000'000'000;
constexpr int64_t kHour = 3'600'000;
const std::string kTrace = "0123456789abcdef0123456789abcdef";

std::unique_ptr<Store> OpenRocks(const std::string& path) {
  StatusOr<std::unique_ptr<Store>> s = OpenRocksStore(StoreOptions{path, false});
  REQUIRE_MESSAGE(s.ok(), s.status().ToString());
  return std::move(s).value();
}

PgStoreOptions PgOptions(const std::string& path) {
  PgStoreOptions o;
  o.conninfo = testing::PgConninfo();
  o.schema = testing::PgSchemaFor(path);
  o.pool_size = 4;
  return o;
}

std::unique_ptr<Store> OpenPg(const std::string& path) {
  StatusOr<std::unique_ptr<Store>> s = OpenPostgresStore(PgOptions(path));
  REQUIRE_MESSAGE(s.ok(), s.status().ToString());
  return std::move(s).value();
}

Decision MakeDecision(const std::string& id, const std::string& key, int64_t at,
                      int64_t expires = 0) {
  Decision d = testing::MakeDecision(id, key, at, expires);
  // Attempts make the trace one the engines keep apart from the decision.
  d.trace = Json{{"attempts", Json::array({Json{{"raw", "{\"label\":\"" + id + "\"}"}}})},
                 {"cost_usd", 0.25}};
  d.provider = "fake";
  d.model = "m1";
  d.prompt_version = "v1";
  d.trace_id = kTrace;
  return d;
}

// Every family of the store, written the way the daemon writes it.
void Fill(Store& s) {
  // Decisions: dec_a superseded by dec_b under key_1; dec_c cached for key_2.
  REQUIRE(s.decisions().PutIfAbsent(MakeDecision("dec_a", "key_1", kT0), kT0).ok());
  REQUIRE(s.decisions().Replace(MakeDecision("dec_b", "key_1", kT0 + 1)).ok());
  REQUIRE(s.decisions()
              .PutIfAbsent(MakeDecision("dec_c", "key_2", kT0 + 2, kT0 + 1000 * kHour), kT0 + 2)
              .ok());

  // Idempotency keys: one completed, one released, one left in progress.
  IdemKeyStore& keys = s.idem_keys();
  REQUIRE(keys.Begin("tok:POST /v1/apply", "k-done", "fp1", "req_1", kT0, 24 * kHour, 30'000).ok());
  REQUIRE(keys.Finish("tok:POST /v1/apply", "k-done", "fp1", 200, "{\"ok\":true}",
                      "application/json", kT0 + 5)
              .ok());
  REQUIRE(keys.Begin("tok:POST /v1/apply", "k-rel", "fp2", "req_2", kT0, 24 * kHour, 30'000).ok());
  REQUIRE(keys.Release("tok:POST /v1/apply", "k-rel", "fp2").ok());
  REQUIRE(keys.Begin("tok:POST /v1/apply", "k-run", "fp3", "req_3", kT0, 24 * kHour, 30'000).ok());

  // Journal: done, failed (retry later), dead, running, pending.
  Journal& j = s.journal();
  ClaimRequest done_req = testing::ClaimReq("w_done", kT0);
  done_req.call_id = std::string(64, 'a');  // the call that made it, copied with it
  auto claimed = j.Claim(done_req);
  REQUIRE(claimed.ok());
  REQUIRE(
      j.Complete("w_done", claimed->item.lease_token, Json{{"sent", "msg_1"}}, "ext_1", kT0 + 10)
          .ok());
  claimed = j.Claim(testing::ClaimReq("w_failed", kT0));
  REQUIRE(claimed.ok());
  REQUIRE(
      j.Fail("w_failed", claimed->item.lease_token, "timeout", true, kT0 + kHour, kT0 + 10).ok());
  ClaimRequest dead_req = testing::ClaimReq("w_dead", kT0);
  dead_req.max_attempts = 1;
  claimed = j.Claim(dead_req);
  REQUIRE(claimed.ok());
  REQUIRE(j.Fail("w_dead", claimed->item.lease_token, "refused", false, 0, kT0 + 10).ok());
  REQUIRE(j.Claim(testing::ClaimReq("w_running", kT0, 60'000)).ok());
  REQUIRE(j.Enqueue(testing::ClaimReq("w_pending", kT0)).ok());

  // Plans with history, each change audited.
  Plan p;
  p.plan_id = "plan_1";
  p.decision_id = "dec_b";
  p.step = "triage";
  p.state = "awaiting_approval";
  p.actions = Json::array({Json{{"kind", "send_email"}, {"args", {{"to", "a@example.com"}}}}});
  p.created_by = "tok";
  p.created_at_ms = kT0;
  p.updated_at_ms = kT0;
  AuditEvent proposed;
  proposed.at_ms = kT0;
  proposed.actor = "tok";
  proposed.action = "plan.proposed";
  REQUIRE(s.plans().Put(p, &proposed).ok());
  AuditEvent approved;
  approved.at_ms = kT0 + 20;
  approved.actor = "ops";
  approved.action = "plan.approved";
  PlanChange change{.from = "awaiting_approval",
                    .to = "approved",
                    .actor = "ops",
                    .note = "fine",
                    .now_ms = kT0 + 20,
                    .audit = &approved};
  REQUIRE(s.plans().Change("plan_1", change).ok());
  Plan p2 = p;
  p2.plan_id = "plan_2";
  p2.created_at_ms = kT0 + 1;
  p2.updated_at_ms = kT0 + 1;
  REQUIRE(s.plans().Put(p2).ok());

  // Audit: an event of its own.
  AuditEvent login;
  login.at_ms = kT0 + 30;
  login.actor = "admin";
  login.action = "token.created";
  login.detail = Json{{"name", "ci"}};
  REQUIRE(s.audit().Append(login).ok());

  // Escalations: one open, one resolved.
  Escalation e;
  e.escalation_id = "esc_open";
  e.decision_key = "key_3";
  e.step = "triage";
  e.input = Json{{"text", "?"}};
  e.material = Json{{"input", "key_3"}};
  e.created_at_ms = kT0 + 3;
  REQUIRE(s.escalations().Put(e).ok());
  e.escalation_id = "esc_done";
  e.decision_key = "key_4";
  e.created_at_ms = kT0 + 4;
  REQUIRE(s.escalations().Put(e).ok());
  REQUIRE(s.escalations().Resolve("esc_done", "dec_c", "ops", kT0 + 40).ok());

  // Outbox: the events above, a subscriber's cursor, a dead letter.
  auto events = s.outbox().After(0, 100);
  REQUIRE(events.ok());
  REQUIRE(events->size() >= 4);
  REQUIRE(s.outbox().Advance("hook-a", (*events)[1].seq).ok());
  OutboxDeadLetter dl;
  dl.subscriber = "hook-b";
  dl.event = (*events)[2];
  dl.attempts = 5;
  dl.last_error = "HTTP 500";
  dl.dead_at_ms = kT0 + 50;
  REQUIRE(s.outbox().AddDeadLetter(dl).ok());
  // Retention deleted the first event: a reader below it is refused.
  REQUIRE(s.outbox().Sweep((*events)[0].seq, kT0 + 1000 * kHour, 1).ok());
  REQUIRE(*s.outbox().SweptThrough() == (*events)[0].seq);

  // Meta: a prompt hash and a cost counter.
  REQUIRE(s.meta().Put("prompt.triage.v1", "sha256:abc").ok());
  REQUIRE(s.meta().Put("cost.2026-12-01", "1.25").ok());

  // Traces.
  for (int i = 0; i < 3; ++i) {
    REQUIRE(s.traces()
                .Add(TraceEntry{kTrace, kT0 + i, "request", "req_" + std::to_string(i),
                                Json{{"n", i}}.dump()})
                .ok());
  }
  REQUIRE(s.traces().Flush().ok());

  // A named lease: transient, not copied.
  REQUIRE(s.leases().Acquire("sweeper", "inst_x", "", 60'000, kT0).ok());
}

std::string Dump(const StatusOr<Json>& j) { return j.ok() ? j->dump() : j.status().ToString(); }

template <typename T, typename F>
StatusOr<Json> ListJson(const StatusOr<std::vector<T>>& items, F&& to_json) {
  if (!items.ok()) return items.status();
  Json out = Json::array();
  for (const T& t : *items) out.push_back(to_json(t));
  return out;
}

// What the copy must preserve, read through the interfaces of both stores.
// Returns one line per difference (empty: the copy is faithful).
std::vector<std::string> Differences(Store& from, Store& to) {
  std::vector<std::string> diffs;
  auto same = [&](const std::string& what, const StatusOr<Json>& a, const StatusOr<Json>& b) {
    std::string da = Dump(a), db = Dump(b);
    if (!a.ok() || da != db) diffs.push_back(what + ": " + da + " vs " + db);
  };
  auto decision_json = [](const Decision& d) { return d.ToJson(); };

  // Decisions: every one by id, and which one each key answers with.
  auto listed = from.decisions().List("", "", "", 100);
  REQUIRE(listed.ok());
  same("decision list", ListJson(StatusOr<std::vector<Decision>>(listed->items), decision_json),
       ListJson(StatusOr<std::vector<Decision>>(to.decisions().List("", "", "", 100)->items),
                decision_json));
  for (const std::string key : {"key_1", "key_2"}) {
    auto a = from.decisions().GetByKey(key, kT0 + 100);
    auto b = to.decisions().GetByKey(key, kT0 + 100);
    same(std::string("cached decision of ") + key,
         a.ok() ? StatusOr<Json>(a->ToJson()) : StatusOr<Json>(a.status()),
         b.ok() ? StatusOr<Json>(b->ToJson()) : StatusOr<Json>(b.status()));
  }

  // Idempotency keys: a finished key replays its response.
  {
    auto b = to.idem_keys().Begin("tok:POST /v1/apply", "k-done", "fp1", "req_9", kT0 + 100,
                                  24 * kHour, 30'000);
    if (!b.ok() || b->outcome != BeginOutcome::kReplay || b->record.response_status != 200 ||
        b->record.response_body != "{\"ok\":true}") {
      diffs.push_back("idempotency key k-done does not replay its response");
    }
    auto rel = to.idem_keys().Get("tok:POST /v1/apply", "k-rel");
    if (!rel.ok() || rel->state != IdemRecord::State::kReleased || rel->fingerprint != "fp2") {
      diffs.push_back("idempotency key k-rel is not released under fp2");
    }
    // The stopped daemon's key in progress: released, so a retry runs now.
    auto run = to.idem_keys().Begin("tok:POST /v1/apply", "k-run", "fp3", "req_9", kT0 + 100,
                                    24 * kHour, 30'000);
    if (!run.ok() || run->outcome != BeginOutcome::kNew) {
      diffs.push_back("idempotency key k-run (in progress at the copy) is not taken again");
    }
    auto other = to.idem_keys().Begin("tok:POST /v1/apply", "k-run", "fp-other", "req_9", kT0 + 100,
                                      24 * kHour, 30'000);
    if (!other.ok() || other->outcome != BeginOutcome::kMismatch) {
      diffs.push_back("idempotency key k-run lost its fingerprint");
    }
  }

  // Journal: every item as it was (lease tokens are never returned).
  for (const std::string id : {"w_done", "w_failed", "w_dead", "w_running", "w_pending"}) {
    auto a = from.journal().Get(id);
    auto b = to.journal().Get(id);
    same("work " + id, a.ok() ? StatusOr<Json>(a->ToJson()) : StatusOr<Json>(a.status()),
         b.ok() ? StatusOr<Json>(b->ToJson()) : StatusOr<Json>(b.status()));
  }
  {
    // Done work stays done: a duplicate claim answers with the original result.
    auto dup = to.journal().Claim(testing::ClaimReq("w_done", kT0 + 100));
    if (!dup.ok() || dup->outcome != ClaimOutcome::kDone ||
        dup->item.result != Json{{"sent", "msg_1"}} || dup->item.external_ref != "ext_1") {
      diffs.push_back("a duplicate claim of w_done does not answer done with its result");
    }
    // A running item stays held until its lease ends, then is taken over.
    auto busy = to.journal().Claim(testing::ClaimReq("w_running", kT0 + 100));
    if (!busy.ok() || busy->outcome != ClaimOutcome::kBusy) {
      diffs.push_back("w_running is not busy under its lease");
    }
  }

  // Plans with history.
  for (const std::string id : {"plan_1", "plan_2"}) {
    auto a = from.plans().Get(id);
    auto b = to.plans().Get(id);
    same("plan " + id, a.ok() ? StatusOr<Json>(a->ToJson()) : StatusOr<Json>(a.status()),
         b.ok() ? StatusOr<Json>(b->ToJson()) : StatusOr<Json>(b.status()));
  }

  // The audit chain: same events, verifies, same head.
  auto audit_json = [](const AuditEvent& e) { return e.ToJson(); };
  same("audit events", ListJson(from.audit().Scan(1, 1000), audit_json),
       ListJson(to.audit().Scan(1, 1000), audit_json));
  {
    auto a = from.audit().Check();
    auto b = to.audit().Check();
    if (!a.ok() || !b.ok() || !b->ok || b->head_seq != a->head_seq ||
        b->head_hash != a->head_hash || b->checked != a->checked) {
      diffs.push_back("audit check: " +
                      (b.ok()
                           ? b->detail + " head " + std::to_string(b->head_seq) + " " + b->head_hash
                           : b.status().ToString()));
    }
  }

  // Escalations.
  auto esc_json = [](const Escalation& e) { return e.ToJson(); };
  same("escalations", ListJson(from.escalations().List("", 100), esc_json),
       ListJson(to.escalations().List("", 100), esc_json));
  {
    auto open = to.escalations().OpenByKey("key_3");
    if (!open.ok() || open->escalation_id != "esc_open") {
      diffs.push_back("no open escalation for key_3");
    }
  }

  // Outbox: events with their seqs, cursors, dead letters.
  auto event_json = [](const OutboxEvent& e) { return e.ToJson(); };
  same("outbox events", ListJson(from.outbox().After(0, 1000), event_json),
       ListJson(to.outbox().After(0, 1000), event_json));
  for (const std::string sub : {"hook-a", "hook-b"}) {
    auto a = from.outbox().Cursor(sub);
    auto b = to.outbox().Cursor(sub);
    same("cursor of " + sub, a.ok() ? StatusOr<Json>(Json(*a)) : StatusOr<Json>(a.status()),
         b.ok() ? StatusOr<Json>(Json(*b)) : StatusOr<Json>(b.status()));
  }
  {
    auto a = from.outbox().SweptThrough();
    auto b = to.outbox().SweptThrough();
    same("outbox swept through", a.ok() ? StatusOr<Json>(Json(*a)) : StatusOr<Json>(a.status()),
         b.ok() ? StatusOr<Json>(Json(*b)) : StatusOr<Json>(b.status()));
  }
  auto dead_json = [](const OutboxDeadLetter& d) { return d.ToJson(); };
  same("outbox dead letters", ListJson(from.outbox().DeadLetters("", 0, 100), dead_json),
       ListJson(to.outbox().DeadLetters("", 0, 100), dead_json));

  // Meta.
  for (const std::string key : {"prompt.triage.v1", "cost.2026-12-01"}) {
    auto a = from.meta().Get(key);
    auto b = to.meta().Get(key);
    auto as_json = [](const StatusOr<std::optional<std::string>>& v) -> StatusOr<Json> {
      if (!v.ok()) return v.status();
      return *v ? Json(**v) : Json();
    };
    same("meta " + key, as_json(a), as_json(b));
  }

  // Traces.
  auto trace_json = [](const TraceEntry& e) {
    return Json{{"trace_id", e.trace_id},
                {"at_ms", e.at_ms},
                {"type", e.type},
                {"ref", e.ref},
                {"detail", Json::parse(e.detail)}};  // engines may space the text apart
  };
  same("traces", ListJson(from.traces().List(kTrace, 100), trace_json),
       ListJson(to.traces().List(kTrace, 100), trace_json));

  // Leases are not copied.
  if (to.leases().Get("sweeper", kT0 + 100).status().code() != Code::kNotFound) {
    diffs.push_back("the lease 'sweeper' was copied");
  }
  return diffs;
}

std::string Joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

// Forwards to the importer all but one family.
class Dropping final : public StoreRecordVisitor {
 public:
  Dropping(StoreRecordVisitor& to, std::string drop) : to_(to), drop_(std::move(drop)) {}
  Status OnDecision(const Decision& d) override {
    return drop_ == "decisions" ? Status::Ok() : to_.OnDecision(d);
  }
  Status OnCachedDecision(const std::string& k, const std::string& id) override {
    // Without the decisions their keys point nowhere: dropped with them.
    return drop_ == "cached" || drop_ == "decisions" ? Status::Ok() : to_.OnCachedDecision(k, id);
  }
  Status OnIdemRecord(const IdemRecord& r) override {
    return drop_ == "idem" ? Status::Ok() : to_.OnIdemRecord(r);
  }
  Status OnWorkItem(const WorkItem& w) override {
    return drop_ == "journal" ? Status::Ok() : to_.OnWorkItem(w);
  }
  Status OnPlan(const Plan& p) override { return drop_ == "plans" ? Status::Ok() : to_.OnPlan(p); }
  Status OnAuditEvent(const AuditEvent& e) override {
    return drop_ == "audit" ? Status::Ok() : to_.OnAuditEvent(e);
  }
  Status OnAuditHead(uint64_t seq, const std::string& hash) override {
    return drop_ == "audit_head" ? Status::Ok() : to_.OnAuditHead(seq, hash);
  }
  Status OnEscalation(const Escalation& e) override {
    return drop_ == "escalations" ? Status::Ok() : to_.OnEscalation(e);
  }
  Status OnOutboxEvent(const OutboxEvent& e) override {
    return drop_ == "outbox" ? Status::Ok() : to_.OnOutboxEvent(e);
  }
  Status OnOutboxCursor(const std::string& s, uint64_t seq) override {
    return drop_ == "cursors" ? Status::Ok() : to_.OnOutboxCursor(s, seq);
  }
  Status OnOutboxDeadLetter(const OutboxDeadLetter& dl) override {
    return drop_ == "dead_letters" ? Status::Ok() : to_.OnOutboxDeadLetter(dl);
  }
  Status OnOutboxLastSeq(uint64_t seq) override { return to_.OnOutboxLastSeq(seq); }
  Status OnOutboxSweptThrough(uint64_t seq) override {
    return drop_ == "swept" ? Status::Ok() : to_.OnOutboxSweptThrough(seq);
  }
  Status OnMeta(const std::string& k, const std::string& v) override {
    return drop_ == "meta" ? Status::Ok() : to_.OnMeta(k, v);
  }
  Status OnTrace(const TraceEntry& e) override {
    return drop_ == "traces" ? Status::Ok() : to_.OnTrace(e);
  }
  Status OnLease(const NamedLease& l) override { return to_.OnLease(l); }

 private:
  StoreRecordVisitor& to_;
  std::string drop_;
};

TEST_SUITE("postgres") {
  TEST_CASE("store copy moves every family of a RocksDB store into PostgreSQL unchanged") {
    TempDir rocks_dir, pg_dir;
    { Fill(*OpenRocks(rocks_dir.path())); }

    auto counts = CopyRocksToPostgres(rocks_dir.path(), PgOptions(pg_dir.path()));
    REQUIRE_MESSAGE(counts.ok(), counts.status().ToString());
    CHECK(counts->decisions == 3);
    CHECK(counts->cached_decision_keys == 2);
    CHECK(counts->idem_keys == 3);
    CHECK(counts->idem_keys_released == 1);
    CHECK(counts->work_items == 5);
    CHECK(counts->plans == 2);
    CHECK(counts->audit_events == 3);
    CHECK(counts->escalations == 2);
    CHECK(counts->outbox_events >= 4);
    CHECK(counts->outbox_cursors == 2);  // hook-a, and hook-b's dead letter moved its cursor
    CHECK(counts->outbox_dead_letters == 1);
    CHECK(counts->meta == 3);  // the two Fill put, and the store's id
    CHECK(counts->traces == 3);
    CHECK(counts->leases_skipped == 1);

    auto rocks = OpenRocks(rocks_dir.path());
    auto pg = OpenPg(pg_dir.path());
    std::vector<std::string> diffs = Differences(*rocks, *pg);
    CHECK_MESSAGE(diffs.empty(), Joined(diffs));
  }

  TEST_CASE("after a store copy new outbox and audit seqs continue after the copied ones") {
    TempDir rocks_dir, pg_dir;
    { Fill(*OpenRocks(rocks_dir.path())); }
    uint64_t last_event = 0, last_audit = 0;
    {
      auto rocks = OpenRocks(rocks_dir.path());
      auto events = rocks->outbox().After(0, 1000);
      REQUIRE(events.ok());
      last_event = events->back().seq;
      auto check = rocks->audit().Check();
      REQUIRE(check.ok());
      last_audit = check->head_seq;
    }
    REQUIRE(CopyRocksToPostgres(rocks_dir.path(), PgOptions(pg_dir.path())).ok());

    auto pg = OpenPg(pg_dir.path());
    REQUIRE(pg->decisions().PutIfAbsent(MakeDecision("dec_new", "key_new", kT0 + 200), kT0).ok());
    auto after = pg->outbox().After(last_event, 100);
    REQUIRE(after.ok());
    REQUIRE(after->size() == 1);
    CHECK(after->front().seq == last_event + 1);
    CHECK(after->front().key == "dec_new");

    AuditEvent next;
    next.at_ms = kT0 + 300;
    next.actor = "admin";
    next.action = "token.revoked";
    auto seq = pg->audit().Append(next);
    REQUIRE(seq.ok());
    CHECK(*seq == last_audit + 1);
    auto check = pg->audit().Check();
    REQUIRE(check.ok());
    CHECK(check->ok);
    CHECK(check->head_seq == last_audit + 1);
  }

  TEST_CASE("store copy refuses a PostgreSQL schema that already holds records") {
    TempDir rocks_dir, pg_dir;
    { Fill(*OpenRocks(rocks_dir.path())); }
    {
      auto pg = OpenPg(pg_dir.path());
      REQUIRE(pg->meta().Put("prompt.other", "x").ok());
    }
    auto counts = CopyRocksToPostgres(rocks_dir.path(), PgOptions(pg_dir.path()));
    REQUIRE(counts.status().code() == Code::kFailedPrecondition);
    CHECK(counts.status().message().find("already holds records (table meta)") !=
          std::string::npos);
    // Nothing was written.
    auto pg = OpenPg(pg_dir.path());
    CHECK(pg->decisions().Get("dec_a").status().code() == Code::kNotFound);
  }

  TEST_CASE("store copy of a store a daemon holds is refused, and nothing reaches PostgreSQL") {
    TempDir rocks_dir, pg_dir;
    auto held = OpenRocks(rocks_dir.path());
    Fill(*held);
    auto counts = CopyRocksToPostgres(rocks_dir.path(), PgOptions(pg_dir.path()));
    REQUIRE(counts.status().code() == Code::kUnavailable);
    CHECK(counts.status().message().find("is in use by another process") != std::string::npos);
    // Not even the schema was made: the server is touched only once the
    // folder is open.
    auto pool = pg::Pool::Open(pg::PoolOptions{testing::PgConninfo(), "public", 1});
    REQUIRE(pool.ok());
    auto schemas = (*pool)->Exec("SELECT 1 FROM information_schema.schemata WHERE schema_name = $1",
                                 {pg::P(testing::PgSchemaFor(pg_dir.path()))});
    REQUIRE(schemas.ok());
    CHECK(schemas->rows() == 0);
  }

  TEST_CASE("a schema a daemon only opened takes a copy, whose events keep their event ids") {
    TempDir rocks_dir, pg_dir;
    { Fill(*OpenRocks(rocks_dir.path())); }
    std::string pg_own_id;
    {
      auto pg = OpenPg(pg_dir.path());  // gives the empty schema an id of its own
      auto id = pg->meta().Get(kStoreIdKey);
      REQUIRE(id.ok());
      REQUIRE(id->has_value());
      pg_own_id = **id;
    }
    auto counts = CopyRocksToPostgres(rocks_dir.path(), PgOptions(pg_dir.path()));
    REQUIRE_MESSAGE(counts.ok(), counts.status().ToString());
    auto rocks = OpenRocks(rocks_dir.path());
    auto pg = OpenPg(pg_dir.path());
    auto from = rocks->outbox().After(0, 100);
    auto to = pg->outbox().After(0, 100);
    REQUIRE(from.ok());
    REQUIRE(to.ok());
    REQUIRE(!from->empty());
    REQUIRE(from->size() == to->size());
    for (size_t i = 0; i < from->size(); ++i) CHECK((*from)[i].event_id == (*to)[i].event_id);
    CHECK((*to)[0].event_id.find(pg_own_id) == std::string::npos);
    CHECK(*pg->meta().Get(kStoreIdKey) == *rocks->meta().Get(kStoreIdKey));
  }

  TEST_CASE("the copy comparison notices any family left out of the copy") {
    TempDir rocks_dir;
    { Fill(*OpenRocks(rocks_dir.path())); }
    for (const std::string family :
         {"decisions", "cached", "idem", "journal", "plans", "audit", "audit_head", "escalations",
          "outbox", "cursors", "dead_letters", "swept", "meta", "traces"}) {
      CAPTURE(family);
      TempDir pg_dir;
      {
        auto importer = PgImporter::Open(PgOptions(pg_dir.path()));
        REQUIRE_MESSAGE(importer.ok(), importer.status().ToString());
        Dropping dropping(**importer, family);
        REQUIRE(VisitRocksStore(rocks_dir.path(), dropping).ok());
        REQUIRE((*importer)->Commit().ok());
      }
      auto rocks = OpenRocks(rocks_dir.path());
      auto pg = OpenPg(pg_dir.path());
      CHECK_FALSE(Differences(*rocks, *pg).empty());
    }
  }
}

}  // namespace
}  // namespace idem
