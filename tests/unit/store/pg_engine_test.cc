// The PostgreSQL engine's own machinery: migrations and the pool. Suite
// "postgres": run only by ctest unit_store_postgres (on a real server).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <set>
#include <thread>
#include <vector>

#include "daemon/store/postgres/pg_store.h"
#include "tests/unit/store/store_test_util.h"

namespace idem {
namespace {

using testing::PgConninfo;
using testing::PgSchemaFor;
using testing::TempDir;

std::unique_ptr<pg::Pool> PoolFor(const std::string& schema, int size = 4) {
  auto pool = pg::Pool::Open(pg::PoolOptions{PgConninfo(), schema, size});
  REQUIRE_MESSAGE(pool.ok(), pool.status().ToString());
  return std::move(pool).value();
}

TEST_SUITE("postgres") {
  TEST_CASE("migrations apply once, however many daemons start together") {
    TempDir dir;
    const std::string schema = PgSchemaFor(dir.path());
    std::vector<std::unique_ptr<pg::Pool>> pools;
    for (int i = 0; i < 4; ++i) pools.push_back(PoolFor(schema, 1));
    std::vector<StatusOr<std::vector<int>>> results(4,
                                                    StatusOr<std::vector<int>>(std::vector<int>{}));
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; ++i) {
      threads.emplace_back([&, i] { results[i] = pg::Migrate(*pools[i]); });
    }
    for (auto& t : threads) t.join();
    int applied = 0;
    for (auto& r : results) {
      REQUIRE_MESSAGE(r.ok(), r.status().ToString());
      applied += static_cast<int>(r->size());
    }
    CHECK(applied == static_cast<int>(pg::Migrations().size()));
    auto versions = pools[0]->Exec("SELECT count(*) FROM schema_migrations");
    REQUIRE(versions.ok());
    CHECK(versions->i64(0, 0) == static_cast<int64_t>(pg::Migrations().size()));
    auto again = pg::Migrate(*pools[0]);
    REQUIRE(again.ok());
    CHECK(again->empty());
  }

  TEST_CASE("daemons opening a new schema together all open it, with one store id") {
    // CREATE SCHEMA IF NOT EXISTS loses a concurrent race with a unique
    // violation; each round is a new schema, four daemons at once.
    for (int round = 0; round < 8; ++round) {
      CAPTURE(round);
      TempDir dir;
      PgStoreOptions o;
      o.conninfo = PgConninfo();
      o.schema = PgSchemaFor(dir.path());
      o.pool_size = 1;
      std::vector<StatusOr<std::unique_ptr<Store>>> opened;
      for (int i = 0; i < 4; ++i) opened.emplace_back(Internal("not opened"));
      std::vector<std::thread> threads;
      for (int i = 0; i < 4; ++i) {
        threads.emplace_back([&, i] { opened[i] = OpenPostgresStore(o); });
      }
      for (auto& t : threads) t.join();
      std::set<std::string> ids;
      for (auto& s : opened) {
        REQUIRE_MESSAGE(s.ok(), s.status().ToString());
        auto id = (*s)->meta().Get(kStoreIdKey);
        REQUIRE(id.ok());
        REQUIRE(id->has_value());
        ids.insert(**id);
      }
      CHECK(ids.size() == 1);
    }
  }

  TEST_CASE(
      "a schema of migration 1 gains the decision trace column, run members, work call ids and "
      "the finished-plan index") {
    TempDir dir;
    const std::string schema = PgSchemaFor(dir.path());
    auto pool = PoolFor(schema);
    REQUIRE(pg::Migrate(*pool).ok());
    // Back to what the first release created.
    REQUIRE(pool->Exec("ALTER TABLE decisions DROP COLUMN trace").ok());
    REQUIRE(pool->Exec("DROP TABLE journal_run_members").ok());
    REQUIRE(pool->Exec("ALTER TABLE journal DROP COLUMN call_id").ok());
    REQUIRE(pool->Exec("DROP INDEX plans_finished").ok());
    REQUIRE(pool->Exec("DELETE FROM schema_migrations WHERE version >= 2").ok());
    auto applied = pg::Migrate(*pool);
    REQUIRE_MESSAGE(applied.ok(), applied.status().ToString());
    CHECK(*applied == std::vector<int>{2, 3, 4, 5});
    auto index = pool->Exec(
        "SELECT count(*) FROM pg_indexes"
        " WHERE schemaname = current_schema() AND indexname = 'plans_finished'");
    REQUIRE(index.ok());
    CHECK(index->i64(0, 0) == 1);

    PgStoreOptions o;
    o.conninfo = PgConninfo();
    o.schema = schema;
    o.pool_size = 2;
    auto store = OpenPostgresStore(o);
    REQUIRE_MESSAGE(store.ok(), store.status().ToString());
    Decision d;
    d.decision_id = "dec_00000000000000000000000000000001";
    d.decision_key = std::string(64, 'a');
    d.step = "triage";
    d.output = Json{{"label", "spam"}};
    d.trace = Json{{"attempts", Json::array({Json{{"raw", "{...}"}}})}, {"cost_usd", 0.001}};
    d.created_at_ms = testing::kT0;
    REQUIRE((*store)->decisions().PutIfAbsent(d, testing::kT0).ok());
    auto read = (*store)->decisions().Get(d.decision_id);
    REQUIRE_MESSAGE(read.ok(), read.status().ToString());
    CHECK(read->trace == d.trace);
    ClaimRequest claim = testing::ClaimReq("w-migrated", testing::kT0, 1'000);
    claim.call_id = std::string(64, 'e');
    REQUIRE((*store)->journal().Claim(claim).ok());
    CHECK((*store)->journal().Get("w-migrated")->call_id == claim.call_id);
  }

  TEST_CASE("a database newer than the binary is refused, not migrated") {
    TempDir dir;
    auto pool = PoolFor(PgSchemaFor(dir.path()));
    REQUIRE(pg::Migrate(*pool).ok());
    REQUIRE(
        pool->Exec("INSERT INTO schema_migrations (version, name) VALUES (9999, 'future')").ok());
    auto r = pg::Migrate(*pool);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == Code::kFailedPrecondition);
    CHECK(r.status().message().find("9999") != std::string::npos);
  }

  TEST_CASE("an unreachable server is Unavailable and the message holds no password") {
    auto pool = pg::Pool::Open(pg::PoolOptions{
        "postgresql://idem:s3cret-pw@127.0.0.1:1/idem?connect_timeout=2", "idem", 1});
    REQUIRE_FALSE(pool.ok());
    CHECK(pool.status().code() == Code::kUnavailable);
    CHECK(pool.status().message().find("s3cret-pw") == std::string::npos);
  }

  TEST_CASE("a pool never opens more connections than its size and waits for a free one") {
    TempDir dir;
    pg::PoolOptions o{PgConninfo(), PgSchemaFor(dir.path()), 2};
    o.acquire_timeout_ms = 200;
    auto pool = pg::Pool::Open(o);
    REQUIRE(pool.ok());
    auto a = (*pool)->Acquire();
    auto b = (*pool)->Acquire();
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    auto c = (*pool)->Acquire();
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().code() == Code::kUnavailable);
  }

  TEST_CASE("a pooled connection the server ended while idle is replaced, not used to fail") {
    TempDir dir;
    auto pool = PoolFor(PgSchemaFor(dir.path()), 2);
    auto pid = pool->Exec("SELECT pg_backend_pid()");
    REQUIRE(pid.ok());
    const int64_t before = pid->i64(0, 0);
    // Another session ends it, as a restart or an operator's
    // pg_terminate_backend would; the pool does not hear of it until it looks.
    auto killer = PoolFor(PgSchemaFor(dir.path()), 1);
    auto ended = killer->Exec("SELECT pg_terminate_backend(" + std::to_string(before) + ")");
    REQUIRE_MESSAGE(ended.ok(), ended.status().ToString());
    // The server's FATAL reaches the idle socket: wait for it to be readable.
    for (int i = 0; i < 100; ++i) {
      auto alive = killer->Exec("SELECT count(*) FROM pg_stat_activity WHERE pid = " +
                                std::to_string(before));
      REQUIRE(alive.ok());
      if (alive->i64(0, 0) == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    auto after = pool->Exec("SELECT pg_backend_pid()");
    REQUIRE_MESSAGE(after.ok(), after.status().ToString());
    CHECK(after->i64(0, 0) != before);
  }

  TEST_CASE("a transaction that fails leaves nothing behind") {
    TempDir dir;
    auto pool = PoolFor(PgSchemaFor(dir.path()));
    REQUIRE(pool->Exec("CREATE TABLE t (v int)").ok());
    Status s = pool->Tx([](pg::Conn& c) -> Status {
      RETURN_IF_ERROR(c.Exec("INSERT INTO t VALUES (1)").status());
      return Aborted("changed my mind");
    });
    CHECK(s.code() == Code::kAborted);
    auto n = pool->Exec("SELECT count(*) FROM t");
    REQUIRE(n.ok());
    CHECK(n->i64(0, 0) == 0);
  }

  TEST_CASE("meta values survive a reopen of the same schema") {
    TempDir dir;
    {
      auto store = testing::OpenStore(dir.path());
      REQUIRE(store->meta().Put("k", "v1").ok());
      REQUIRE(store->meta().Put("k", "v2").ok());
    }
    auto store = testing::OpenStore(dir.path());
    auto got = store->meta().Get("k");
    REQUIRE(got.ok());
    CHECK(*got == std::optional<std::string>("v2"));
    auto none = store->meta().Get("absent");
    REQUIRE(none.ok());
    CHECK_FALSE(none->has_value());
  }

  TEST_CASE("a server's notice is one JSON line in the daemon's log, not raw text on stderr") {
    TempDir dir;
    auto pool = PoolFor(PgSchemaFor(dir.path()), 1);
    const std::string path = dir.path() + "/stderr.txt";
    std::fflush(stderr);
    const int saved = ::dup(2);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    REQUIRE(saved >= 0);
    REQUIRE(fd >= 0);
    ::dup2(fd, 2);
    auto raised = pool->Exec("DO $$ BEGIN RAISE WARNING 'idem-notice-test'; END $$");
    std::fflush(stderr);
    ::dup2(saved, 2);
    ::close(saved);
    ::close(fd);
    REQUIRE_MESSAGE(raised.ok(), raised.status().ToString());
    std::ifstream in(path);
    int notices = 0;
    for (std::string line; std::getline(in, line);) {
      CAPTURE(line);
      Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
      REQUIRE(j.is_object());  // every line is a JSON object
      if (j.value("event", "") == "postgres.notice") {
        ++notices;
        CHECK(j["message"].get<std::string>().find("idem-notice-test") != std::string::npos);
        CHECK(j["level"] == "warn");
      }
    }
    CHECK(notices == 1);
  }
}

}  // namespace
}  // namespace idem
