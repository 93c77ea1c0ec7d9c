#include <doctest/doctest.h>

#include <string>

#include "daemon/core/crypto.h"
#include "daemon/core/json.h"
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
  testing::WithRawDb(dir.path(), [](rocksdb::DB& db, auto& cfs) {
    std::string key("\0\0\0\0\0\0\0\x02", 8);
    std::string value;
    REQUIRE(db.Get(rocksdb::ReadOptions(), cfs.at("audit"), key, &value).ok());
    Json j = Json::parse(value);
    REQUIRE(j["actor"] == "alice");
    j["actor"] = "mallory";
    REQUIRE(db.Put(rocksdb::WriteOptions(), cfs.at("audit"), key, j.dump()).ok());
  });
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
  testing::WithRawDb(dir.path(), [](rocksdb::DB& db, auto& cfs) {
    REQUIRE(
        db.Delete(rocksdb::WriteOptions(), cfs.at("audit"), std::string("\0\0\0\0\0\0\0\x02", 8))
            .ok());
  });
  auto store = OpenStore(dir.path());
  Status s = store->audit().Verify();
  CHECK(s.code() == Code::kInternal);
  CHECK(s.message().find("seq 2") != std::string::npos);
}

std::string SeqKey(uint64_t seq) {
  std::string key(8, '\0');
  for (int i = 7; i >= 0; --i, seq >>= 8) key[i] = static_cast<char>(seq & 0xff);
  return key;
}

// A closed store at `path` with `n` audit events.
void WriteEvents(const std::string& path, int n) {
  auto store = OpenStore(path);
  for (int i = 0; i < n; ++i) REQUIRE(store->audit().Append(Event("alice", "a", kT0 + i)).ok());
  REQUIRE(store->audit().Verify().ok());
}

void DeleteAuditRecord(const std::string& path, uint64_t seq) {
  testing::WithRawDb(path, [seq](rocksdb::DB& db, auto& cfs) {
    REQUIRE(db.Delete(rocksdb::WriteOptions(), cfs.at("audit"), SeqKey(seq)).ok());
  });
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
  testing::WithRawDb(dir.path(), [](rocksdb::DB& db, auto& cfs) {
    std::string two, three;
    REQUIRE(db.Get(rocksdb::ReadOptions(), cfs.at("audit"), SeqKey(2), &two).ok());
    REQUIRE(db.Get(rocksdb::ReadOptions(), cfs.at("audit"), SeqKey(3), &three).ok());
    REQUIRE(db.Put(rocksdb::WriteOptions(), cfs.at("audit"), SeqKey(2), three).ok());
    REQUIRE(db.Put(rocksdb::WriteOptions(), cfs.at("audit"), SeqKey(3), two).ok());
  });
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
  testing::WithRawDb(dir.path(), [](rocksdb::DB& db, auto& cfs) {
    std::string two, three;
    REQUIRE(db.Get(rocksdb::ReadOptions(), cfs.at("audit"), SeqKey(2), &two).ok());
    REQUIRE(db.Get(rocksdb::ReadOptions(), cfs.at("audit"), SeqKey(3), &three).ok());
    Json a = Json::parse(two), b = Json::parse(three);
    a["seq"] = 3;
    b["seq"] = 2;
    REQUIRE(db.Put(rocksdb::WriteOptions(), cfs.at("audit"), SeqKey(2), b.dump()).ok());
    REQUIRE(db.Put(rocksdb::WriteOptions(), cfs.at("audit"), SeqKey(3), a.dump()).ok());
  });
  auto store = OpenStore(dir.path());
  AuditVerification v = store->audit().Check().value();
  CHECK_FALSE(v.ok);
  CHECK(v.broken_seq == 2);
}

TEST_CASE("a removed audit head record fails Verify") {
  TempDir dir;
  WriteEvents(dir.path(), 2);
  testing::WithRawDb(dir.path(), [](rocksdb::DB& db, auto& cfs) {
    REQUIRE(db.Delete(rocksdb::WriteOptions(), cfs.at("meta"), "audit.head").ok());
  });
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
