// `idem store copy` as a command: what it prints and its exit codes, without
// a server (the copy itself: tests/unit/store/store_copy_test.cc).
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "daemon/cli/cli.h"
#include "daemon/store/store.h"

namespace idem::cli {
namespace {

std::string ReadAll(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) s.append(buf, n);
  return s;
}

// One `idem store copy` of the RocksDB store at `rocks` to `conninfo`: its
// exit code, stdout and stderr.
struct Copied {
  int exit_code;
  std::string out, err;
};
Copied Copy(const std::string& rocks, const std::string& conninfo) {
  std::FILE* out = std::tmpfile();
  std::FILE* err = std::tmpfile();
  Output o;
  o.out = out;
  o.err = err;
  PgStoreOptions to;
  to.conninfo = conninfo;
  to.schema = "idem";
  Copied c{StoreCopy(o, rocks, to), ReadAll(out), ReadAll(err)};
  std::fclose(out);
  std::fclose(err);
  return c;
}

}  // namespace

TEST_CASE("store copy to a URL libpq cannot parse exits 2 and prints no part of its password") {
  char tmpl[] = "/tmp/idem-copy-XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  const std::string rocks = std::string(tmpl) + "/store";
  {
    auto store = OpenRocksStore(StoreOptions{rocks, false});
    REQUIRE_MESSAGE(store.ok(), store.status().ToString());
  }
  for (const char* url : {"postgresql://idemp:p%ssw0rd-SECRET@127.0.0.1:1/idemdb",
                          "host=127.0.0.1 port=1 DBPASSWORD999"}) {
    CAPTURE(url);
    Copied c = Copy(rocks, url);
    CAPTURE(c.err);
    CHECK(c.exit_code == kExitUnreachable);
    CHECK(c.err.find("cannot connect") != std::string::npos);
    CHECK(c.err.find("SECRET") == std::string::npos);
    CHECK(c.err.find("DBPASSWORD999") == std::string::npos);
    CHECK(c.out.empty());
  }
  std::filesystem::remove_all(tmpl);
}

TEST_CASE("store copy counts are listed per family, leases as not copied") {
  CopyCounts c;
  c.decisions = 12;
  c.audit_events = 7;
  c.outbox_cursors = 2;
  c.leases_skipped = 1;
  std::string text = RenderCopyCounts(c, Style{});
  CHECK(text.find("decisions") != std::string::npos);
  CHECK(text.find("12") != std::string::npos);
  CHECK(text.find("audit events") != std::string::npos);
  CHECK(text.find("outbox cursors") != std::string::npos);
  size_t leases = text.find("leases (not copied: transient)");
  REQUIRE(leases != std::string::npos);
  std::string line = text.substr(leases, text.find('\n', leases) - leases);
  CHECK(line.back() == '1');
  CHECK(c.ToJson()["decisions"] == 12);
  CHECK(c.ToJson()["leases_skipped"] == 1);
}

TEST_CASE("store copy from a folder without a store exits 3 and never reaches the server") {
  // Nothing listens here: reaching for the server would fail with exit 2.
  Copied c = Copy("/nonexistent/idem-store", "host=127.0.0.1 port=1 connect_timeout=1");
  CHECK(c.exit_code == kExitNotFound);
  CHECK(c.err.find("no RocksDB store at '/nonexistent/idem-store'") != std::string::npos);
  CHECK(c.out.empty());
}

}  // namespace idem::cli
