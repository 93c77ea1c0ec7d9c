#include <doctest/doctest.h>

#include <string>

#include "daemon/core/crypto.h"
#include "daemon/core/json.h"
#include "daemon/store/postgres/pg_client.h"
#include "daemon/store/store.h"
#include "tests/unit/store/store_test_util.h"

namespace idem {
namespace {

using testing::OpenStore;
using testing::TempDir;

constexpr int64_t kT0 = 1'700'000'000'000;

AuditEvent Event(const std::string& actor, const std::string& action, int64_t at_ms) {
  AuditEvent e;
  e.actor = actor;
  e.action = action;
  e.at_ms = at_ms;
  e.detail = Json{{"plan_id", "plan_1"}};
  return e;
}

std::string SeqKey(uint64_t seq) {
  std::string key(8, '\0');
  for (int i = 7; i >= 0; --i, seq >>= 8) key[i] = static_cast<char>(seq & 0xff);
  return key;
}

// Tampering with a closed store's audit records, below the store: raw
// RocksDB writes, or SQL on the PostgreSQL engine's tables (an operator with
// database access). Each engine's Check must catch the same changes.
std::unique_ptr<pg::Pool> PgPoolFor(const std::string& path) {
  auto pool = pg::Pool::Open(pg::PoolOptions{testing::PgConninfo(), testing::PgSchemaFor(path), 1});
  REQUIRE_MESSAGE(pool.ok(), pool.status().ToString());
  return std::move(pool).value();
}

// The stored JSON text of event `seq`.
std::string ReadAuditRecord(const std::string& path, uint64_t seq) {
  std::string value;
  if (testing::OnPostgres()) {
    auto r = PgPoolFor(path)->Exec("SELECT event FROM audit WHERE seq = $1", {pg::P(seq)});
    REQUIRE_MESSAGE(r.ok(), r.status().ToString());
    REQUIRE(r->rows() == 1);
    return r->str(0, 0);
  }
  testing::WithRawDb(path, [&](rocksdb::DB& db, auto& cfs) {
    REQUIRE(db.Get(rocksdb::ReadOptions(), cfs.at("audit"), SeqKey(seq), &value).ok());
  });
  return value;
}

// Stores `value` as event `seq`'s record (replacing or adding it).
void WriteAuditRecord(const std::string& path, uint64_t seq, const std::string& value) {
  if (testing::OnPostgres()) {
    auto r = PgPoolFor(path)->Exec(
        "INSERT INTO audit (seq, event) VALUES ($1, $2)"
        " ON CONFLICT (seq) DO UPDATE SET event = EXCLUDED.event",
        {pg::P(seq), pg::P(value)});
    REQUIRE_MESSAGE(r.ok(), r.status().ToString());
    return;
  }
  testing::WithRawDb(path, [&](rocksdb::DB& db, auto& cfs) {
    REQUIRE(db.Put(rocksdb::WriteOptions(), cfs.at("audit"), SeqKey(seq), value).ok());
  });
}

void DeleteAuditRecord(const std::string& path, uint64_t seq) {
  if (testing::OnPostgres()) {
    auto r = PgPoolFor(path)->Exec("DELETE FROM audit WHERE seq = $1", {pg::P(seq)});
    REQUIRE_MESSAGE(r.ok(), r.status().ToString());
    REQUIRE(r->affected() == 1);
    return;
  }
  testing::WithRawDb(path, [seq](rocksdb::DB& db, auto& cfs) {
    REQUIRE(db.Delete(rocksdb::WriteOptions(), cfs.at("audit"), SeqKey(seq)).ok());
  });
}

// Removes the record of the chain's head (seq and hash of the last event).
void DeleteAuditHead(const std::string& path) {
  if (testing::OnPostgres()) {
    auto r = PgPoolFor(path)->Exec("DELETE FROM audit_head");
    REQUIRE_MESSAGE(r.ok(), r.status().ToString());
    REQUIRE(r->affected() == 1);
    return;
  }
  testing::WithRawDb(path, [](rocksdb::DB& db, auto& cfs) {
    REQUIRE(db.Delete(rocksdb::WriteOptions(), cfs.at("meta"), "audit.head").ok());
  });
}

TEST_CASE("audit events are appended with sequence numbers and a hash chain") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  AuditLog& log = store->audit();
  CHECK(log.Verify().ok());  // an empty log is a valid chain
  CHECK(log.Append(Event("alice", "plan.approve", kT0)).value() == 1);
  CHECK(log.Append(Event("bob", "plan.reject", kT0 + 1)).value() == 2);
  CHECK(log.Append(Event("carol", "dlq.requeue", kT0 + 2)).value() == 3);

  std::vector<AuditEvent> all = log.Scan(1, 10).value();
  REQUIRE(all.size() == 3);
  CHECK(all[0].prev_hash.empty());
  CHECK(all[1].prev_hash == all[0].hash);
  CHECK(all[2].prev_hash == all[1].hash);
  CHECK(all[1].actor == "bob");
  CHECK(all[1].detail == Json{{"plan_id", "plan_1"}});

  // The hash is sha256(prev_hash + JCS(event without hash)).
  Json body = {{"seq", 2},
               {"at_ms", kT0 + 1},
               {"actor", "bob"},
               {"action", "plan.reject"},
               {"detail", all[1].detail},
               {"prev_hash", all[0].hash}};
  CHECK(all[1].hash == Sha256Hex(all[0].hash + CanonicalJson(body).value()));

  std::vector<AuditEvent> tail = log.Scan(2, 1).value();
  REQUIRE(tail.size() == 1);
  CHECK(tail[0].seq == 2);
  CHECK(log.Verify().ok());
}

TEST_CASE("the audit chain continues across a reopen") {
  TempDir dir;
  {
    auto store = OpenStore(dir.path(), /*sync=*/true);
    REQUIRE(store->audit().Append(Event("alice", "a", kT0)).ok());
  }
  auto store = OpenStore(dir.path(), /*sync=*/true);
  CHECK(store->audit().Append(Event("bob", "b", kT0 + 1)).value() == 2);
  CHECK(store->audit().Verify().ok());
}

TEST_CASE("a tampered audit record fails Verify") {
  TempDir dir;
  {
    auto store = OpenStore(dir.path());
    for (int i = 0; i < 3; ++i) REQUIRE(store->audit().Append(Event("alice", "a", kT0 + i)).ok());
    REQUIRE(store->audit().Verify().ok());
  }
  // Rewrite who did event 2, directly in the database.
  Json j = Json::parse(ReadAuditRecord(dir.path(), 2));
  REQUIRE(j["actor"] == "alice");
  j["actor"] = "mallory";
  WriteAuditRecord(dir.path(), 2, j.dump());
  auto store = OpenStore(dir.path());
  Status s = store->audit().Verify();
  CHECK(s.code() == Code::kInternal);
  CHECK(s.message().find("seq 2") != std::string::npos);
}

TEST_CASE("a removed audit record fails Verify") {
  TempDir dir;
  {
    auto store = OpenStore(dir.path());
    for (int i = 0; i < 3; ++i) REQUIRE(store->audit().Append(Event("alice", "a", kT0 + i)).ok());
  }
  DeleteAuditRecord(dir.path(), 2);
  auto store = OpenStore(dir.path());
  Status s = store->audit().Verify();
  CHECK(s.code() == Code::kInternal);
  CHECK(s.message().find("seq 2") != std::string::npos);
}

// A closed store at `path` with `n` audit events.
void WriteEvents(const std::string& path, int n) {
  auto store = OpenStore(path);
  for (int i = 0; i < n; ++i) REQUIRE(store->audit().Append(Event("alice", "a", kT0 + i)).ok());
  REQUIRE(store->audit().Verify().ok());
}

TEST_CASE("removing the last audit record is detected after a reopen") {
  TempDir dir;
  WriteEvents(dir.path(), 3);
  DeleteAuditRecord(dir.path(), 3);
  auto store = OpenStore(dir.path());
  AuditVerification v = store->audit().Check().value();
  CHECK_FALSE(v.ok);
  CHECK(v.broken_seq == 3);
  CHECK(v.checked == 2);
  CHECK(v.head_seq == 3);
  Status s = store->audit().Verify();
  CHECK(s.code() == Code::kInternal);
  CHECK(s.message().find("seq 3") != std::string::npos);
}

TEST_CASE("removing the last two audit records names the first one missing") {
  TempDir dir;
  WriteEvents(dir.path(), 4);
  DeleteAuditRecord(dir.path(), 4);
  DeleteAuditRecord(dir.path(), 3);
  auto store = OpenStore(dir.path());
  CHECK(store->audit().Check().value().broken_seq == 3);
}

TEST_CASE("an append after a removed tail does not hide the removal") {
  TempDir dir;
  WriteEvents(dir.path(), 3);
  DeleteAuditRecord(dir.path(), 3);
  auto store = OpenStore(dir.path());
  // The chain continues from the recorded head, so the hole stays visible.
  CHECK(store->audit().Append(Event("bob", "b", kT0 + 9)).value() == 4);
  AuditVerification v = store->audit().Check().value();
  CHECK_FALSE(v.ok);
  CHECK(v.broken_seq == 3);
}

TEST_CASE("removing every audit record is detected") {
  TempDir dir;
  WriteEvents(dir.path(), 2);
  DeleteAuditRecord(dir.path(), 1);
  DeleteAuditRecord(dir.path(), 2);
  auto store = OpenStore(dir.path());
  AuditVerification v = store->audit().Check().value();
  CHECK_FALSE(v.ok);
  CHECK(v.broken_seq == 1);
}

TEST_CASE("swapped audit records fail Verify at the first swapped seq") {
  TempDir dir;
  WriteEvents(dir.path(), 4);
  const std::string two = ReadAuditRecord(dir.path(), 2);
  const std::string three = ReadAuditRecord(dir.path(), 3);
  WriteAuditRecord(dir.path(), 2, three);
  WriteAuditRecord(dir.path(), 3, two);
  auto store = OpenStore(dir.path());
  Status s = store->audit().Verify();
  CHECK(s.code() == Code::kInternal);
  CHECK(s.message().find("seq 2") != std::string::npos);
}

TEST_CASE("swapped audit records with renumbered seqs fail Verify") {
  // Rewriting the seq fields too (so each record sits under its own seq)
  // changes the hashed content: the prev_hash links and hashes break.
  TempDir dir;
  WriteEvents(dir.path(), 3);
  Json a = Json::parse(ReadAuditRecord(dir.path(), 2));
  Json b = Json::parse(ReadAuditRecord(dir.path(), 3));
  a["seq"] = 3;
  b["seq"] = 2;
  WriteAuditRecord(dir.path(), 2, b.dump());
  WriteAuditRecord(dir.path(), 3, a.dump());
  auto store = OpenStore(dir.path());
  AuditVerification v = store->audit().Check().value();
  CHECK_FALSE(v.ok);
  CHECK(v.broken_seq == 2);
}

TEST_CASE("a removed audit head record fails Verify") {
  TempDir dir;
  WriteEvents(dir.path(), 2);
  DeleteAuditHead(dir.path());
  auto store = OpenStore(dir.path());
  CHECK_FALSE(store->audit().Check().value().ok);
}

TEST_CASE("an intact audit log verifies after a reopen, with its head") {
  TempDir dir;
  WriteEvents(dir.path(), 3);
  auto store = OpenStore(dir.path());
  AuditVerification v = store->audit().Check().value();
  CHECK(v.ok);
  CHECK(v.checked == 3);
  CHECK(v.head_seq == 3);
  CHECK(v.head_hash == store->audit().Scan(3, 1).value().at(0).hash);
}

TEST_CASE("the chain checker names the first break of a chain it is fed") {
  // The client-side half of `idem audit verify`.
  TempDir dir;
  auto store = OpenStore(dir.path());
  for (int i = 0; i < 3; ++i) REQUIRE(store->audit().Append(Event("alice", "a", kT0 + i)).ok());
  std::vector<AuditEvent> all = store->audit().Scan(1, 10).value();
  {
    AuditChainCheck check;
    for (const auto& e : all) CHECK(check.Add(e));
    CHECK(check.Finish(3, all[2].hash));
    CHECK(check.checked() == 3);
  }
  {
    AuditChainCheck check;
    all[1].detail["amount"] = 1;
    CHECK(check.Add(all[0]));
    CHECK_FALSE(check.Add(all[1]));
    CHECK(check.broken_seq() == 2);
    CHECK(check.ToStatus().message().find("seq 2") != std::string::npos);
  }
  {
    AuditChainCheck check;
    CHECK(check.Add(all[0]));
    CHECK_FALSE(check.Finish(3, ""));  // the head is seq 3: 2 and 3 were removed
    CHECK(check.broken_seq() == 2);
  }
}

}  // namespace
}  // namespace idem
