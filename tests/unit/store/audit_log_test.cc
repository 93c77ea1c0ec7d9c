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

}  // namespace
}  // namespace idem
