// Helpers shared by the store tests: a fresh temporary folder per test, a
// store opened in it, and raw RocksDB access for tests that tamper with the
// bytes on disk (the store must be closed first).
#pragma once

#include <doctest/doctest.h>
#include <rocksdb/db.h>
#include <stdlib.h>

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "daemon/core/crypto.h"
#include "daemon/store/postgres/pg_client.h"
#include "daemon/store/rocksdb/rocksdb_database.h"
#include "daemon/store/store.h"
#include "tests/unit/store/forget_index.h"

namespace idem::testing {

// The engine under test: RocksDB, or PostgreSQL when IDEM_TEST_STORE is
// "postgres" (the conformance run, ctest unit_store_postgres).
inline bool OnPostgres() {
  const char* e = std::getenv("IDEM_TEST_STORE");
  return e != nullptr && std::string(e) == "postgres";
}
inline std::string PgConninfo() {
  const char* u = std::getenv("IDEM_TEST_PG_URL");
  return u ? u : "";  // "": libpq reads PGHOST, PGPORT, ... (pg_virtualenv)
}
// On PostgreSQL a test's folder names its own schema, so reopening the
// same folder reopens the same data and tests never see each other's.
inline std::string PgSchemaFor(const std::string& path) {
  return "t_" + Sha256Hex(path).substr(0, 20);
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = "/tmp/idem-store-test-XXXXXX";
    char* made = mkdtemp(tmpl.data());
    REQUIRE(made != nullptr);
    path_ = made;
    if (OnPostgres()) {  // a folder name may repeat across runs: start empty
      auto pool = pg::Pool::Open(pg::PoolOptions{PgConninfo(), "public", 1});
      REQUIRE_MESSAGE(pool.ok(), pool.status().ToString());
      auto dropped =
          (*pool)->Exec("DROP SCHEMA IF EXISTS " + pg::QuoteIdent(PgSchemaFor(path_)) + " CASCADE");
      REQUIRE_MESSAGE(dropped.ok(), dropped.status().ToString());
    }
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline std::unique_ptr<Store> OpenStore(const std::string& path, bool sync = false,
                                        uint64_t min_free_bytes = 0) {
  if (OnPostgres()) {
    PgStoreOptions o;
    o.conninfo = PgConninfo();
    o.schema = PgSchemaFor(path);
    o.pool_size = 16;
    StatusOr<std::unique_ptr<Store>> store = OpenPostgresStore(o);
    REQUIRE_MESSAGE(store.ok(), store.status().ToString());
    return std::move(store).value();
  }
  StatusOr<std::unique_ptr<Store>> store = OpenRocksStore(StoreOptions{path, sync, min_free_bytes});
  REQUIRE_MESSAGE(store.ok(), store.status().ToString());
  return std::move(store).value();
}

constexpr int64_t kT0 = 1'700'000'000'000;  // a fixed "now" for journal tests

// A claim of `work_id` at `now_ms` for a kind with default retry settings.
inline ClaimRequest ClaimReq(const std::string& work_id, int64_t now_ms, int64_t lease_ms = 1'000) {
  ClaimRequest r;
  r.work_id = work_id;
  r.kind = "send_email";
  r.identity = Json{{"to", "a@example.com"}};
  r.args = Json{{"subject", "hi"}};
  r.lease_ms = lease_ms;
  r.now_ms = now_ms;
  return r;
}

// A closed store's database opened directly, with every column family by name.
inline void WithRawDb(
    const std::string& path,
    const std::function<void(rocksdb::DB&, std::map<std::string, rocksdb::ColumnFamilyHandle*>&)>&
        fn) {
  rocksdb::Options options;
  std::vector<std::string> names;
  REQUIRE(rocksdb::DB::ListColumnFamilies(options, path, &names).ok());
  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  for (const std::string& n : names) descriptors.emplace_back(n, rocksdb::ColumnFamilyOptions());
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(options, path, descriptors, &handles, &raw);
  REQUIRE_MESSAGE(s.ok(), s.ToString());
  std::map<std::string, rocksdb::ColumnFamilyHandle*> by_name;
  for (size_t i = 0; i < names.size(); ++i) by_name[names[i]] = handles[i];
  fn(*raw, by_name);
  for (rocksdb::ColumnFamilyHandle* h : handles)
    raw->DestroyColumnFamilyHandle(h).PermitUncheckedError();
  raw->Close().PermitUncheckedError();
  delete raw;
}

// The keys of RocksDB family `family` of the store at `path`, in order.
inline std::vector<std::string> RawKeys(const std::string& path, const std::string& family) {
  std::vector<std::string> keys;
  WithRawDb(path, [&](rocksdb::DB& db, auto& cf) {
    std::unique_ptr<rocksdb::Iterator> it(db.NewIterator({}, cf.at(family)));
    for (it->SeekToFirst(); it->Valid(); it->Next()) keys.push_back(it->key().ToString());
  });
  return keys;
}

// A decision of step "triage" under `key`, its output naming its id.
inline Decision MakeDecision(const std::string& id, const std::string& key, int64_t created_at_ms,
                             int64_t expires_at_ms = 0) {
  Decision d;
  d.decision_id = id;
  d.decision_key = key;
  d.step = "triage";
  d.output = Json{{"label", id}};
  d.material = Json{{"input", key}};
  d.created_at_ms = created_at_ms;
  d.expires_at_ms = expires_at_ms;
  return d;
}

}  // namespace idem::testing
