// `idem store copy` as a command: what it prints and its exit codes, without
// a server (the copy itself: tests/unit/store/store_copy_test.cc).
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#include "daemon/cli/cli.h"

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

}  // namespace

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
  std::FILE* out = std::tmpfile();
  std::FILE* err = std::tmpfile();
  Output o;
  o.out = out;
  o.err = err;
  PgStoreOptions to;
  // Nothing listens here: reaching for the server would fail with exit 2.
  to.conninfo = "host=127.0.0.1 port=1 connect_timeout=1";
  to.schema = "idem";
  CHECK(StoreCopy(o, "/nonexistent/idem-store", to) == kExitNotFound);
  std::string message = ReadAll(err);
  CHECK(message.find("no RocksDB store at '/nonexistent/idem-store'") != std::string::npos);
  CHECK(ReadAll(out).empty());
  std::fclose(out);
  std::fclose(err);
}

}  // namespace idem::cli
