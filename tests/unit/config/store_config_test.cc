// The `store` section: engine rocksdb (embedded) or postgres (many daemons
// on one database), each engine's own keys, and the URL never in the file.
#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>

#include "daemon/config/config.h"

namespace idem {
namespace {

namespace fs = std::filesystem;

class StoreConfigDir {
 public:
  StoreConfigDir() {
    static std::atomic<int> counter{0};
    root_ = fs::temp_directory_path() / ("idem_store_config_test_" + std::to_string(::getpid()) +
                                         "_" + std::to_string(counter++));
    fs::create_directories(root_);
  }
  ~StoreConfigDir() { fs::remove_all(root_); }
  StatusOr<Config> Load(const std::string& yaml) {
    std::ofstream(root_ / "idem.yaml") << yaml;
    return LoadConfig((root_ / "idem.yaml").string());
  }

 private:
  fs::path root_;
};

TEST_CASE("postgres_engine_reads_url_env_schema_pool_size_and_statement_timeout") {
  StoreConfigDir dir;
  auto config = dir.Load(
      "store:\n  engine: postgres\n  url_env: IDEM_PG_URL\n  schema: idem_prod\n"
      "  pool_size: 32\n  statement_timeout: 2s\n");
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());
  CHECK(config->store.engine == "postgres");
  CHECK(config->store.url_env == "IDEM_PG_URL");
  CHECK(config->store.schema == "idem_prod");
  CHECK(config->store.pool_size == 32);
  CHECK(config->store.statement_timeout_ms == 2'000);
}

TEST_CASE("postgres_engine_defaults_to_schema_idem_16_connections_and_5s_statements") {
  StoreConfigDir dir;
  auto config = dir.Load("store: {engine: postgres}\n");
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());
  CHECK(config->store.url_env.empty());  // libpq's PG* variables
  CHECK(config->store.schema == "idem");
  CHECK(config->store.pool_size == 16);
  CHECK(config->store.statement_timeout_ms == 5'000);
}

TEST_CASE("rocksdb_stays_the_default_engine") {
  StoreConfigDir dir;
  auto config = dir.Load("store: {sync: true}\n");
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());
  CHECK(config->store.engine == "rocksdb");
}

TEST_CASE("an_unknown_engine_is_an_error_naming_store_engine") {
  StoreConfigDir dir;
  auto config = dir.Load("store: {engine: mysql}\n");
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().field() == "/store/engine");
}

TEST_CASE("a_url_instead_of_a_variable_name_in_url_env_is_refused_without_echoing_it") {
  StoreConfigDir dir;
  auto config = dir.Load("store:\n  engine: postgres\n  url_env: postgres://app:s3cret@db/idem\n");
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().field() == "/store/url_env");
  CHECK(config.status().message().find("s3cret") == std::string::npos);
}

TEST_CASE("a_schema_name_that_would_need_quoting_is_an_error_naming_store_schema") {
  StoreConfigDir dir;
  auto config = dir.Load("store:\n  engine: postgres\n  schema: \"Idem; DROP\"\n");
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().field() == "/store/schema");
}

TEST_CASE("pool_size_out_of_range_is_an_error_naming_store_pool_size") {
  StoreConfigDir dir;
  auto config = dir.Load("store:\n  engine: postgres\n  pool_size: 0\n");
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().field() == "/store/pool_size");
}

TEST_CASE("a_zero_statement_timeout_is_an_error_naming_store_statement_timeout") {
  StoreConfigDir dir;
  auto config = dir.Load("store:\n  engine: postgres\n  statement_timeout: 0s\n");
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().field() == "/store/statement_timeout");
}

TEST_CASE("postgres_keys_under_engine_rocksdb_are_an_error_naming_the_key") {
  StoreConfigDir dir;
  auto config = dir.Load("store:\n  engine: rocksdb\n  url_env: IDEM_PG_URL\n");
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().field() == "/store/url_env");
  CHECK(config.status().message().find("engine postgres") != std::string::npos);
}

TEST_CASE("rocksdb_keys_under_engine_postgres_are_an_error_naming_the_key") {
  StoreConfigDir dir;
  auto config = dir.Load("store:\n  engine: postgres\n  path: /var/idem\n");
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().field() == "/store/path");
}

TEST_CASE("store_trace_budget_mb_is_read_and_bounded") {
  StoreConfigDir dir;
  auto config = dir.Load("store:\n  trace_budget_mb: 64\n");
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());
  CHECK(config->store.trace_budget_mb == 64);
  CHECK(dir.Load("store:\n  sync: true\n")->store.trace_budget_mb == 256);  // the default
  auto zero = dir.Load("store:\n  trace_budget_mb: 0\n");
  REQUIRE_FALSE(zero.ok());
  CHECK(zero.status().field() == "/store/trace_budget_mb");
  auto on_postgres = dir.Load("store:\n  engine: postgres\n  trace_budget_mb: 64\n");
  REQUIRE_FALSE(on_postgres.ok());
  CHECK(on_postgres.status().field() == "/store/trace_budget_mb");
}

TEST_CASE("store_finished_retention_is_read_on_both_engines_and_forever_keeps_finished_records") {
  StoreConfigDir dir;
  CHECK(dir.Load("store:\n  sync: true\n")->store.finished_retention_ms ==
        30LL * 24 * 3600 * 1000);  // the default
  auto days = dir.Load("store:\n  finished_retention: 90d\n");
  REQUIRE_MESSAGE(days.ok(), days.status().ToString());
  CHECK(days->store.finished_retention_ms == 90LL * 24 * 3600 * 1000);
  auto on_postgres = dir.Load("store:\n  engine: postgres\n  finished_retention: 12h\n");
  REQUIRE_MESSAGE(on_postgres.ok(), on_postgres.status().ToString());
  CHECK(on_postgres->store.finished_retention_ms == 12LL * 3600 * 1000);
  auto forever = dir.Load("store:\n  finished_retention: forever\n");
  REQUIRE_MESSAGE(forever.ok(), forever.status().ToString());
  CHECK(forever->store.finished_retention_ms == 0);
  for (const char* bad : {"0s", "soon", "-1d"}) {
    CAPTURE(bad);
    auto wrong = dir.Load(std::string("store:\n  finished_retention: ") + bad + "\n");
    REQUIRE_FALSE(wrong.ok());
    CHECK(wrong.status().field() == "/store/finished_retention");
  }
}

}  // namespace
}  // namespace idem
