#include "daemon/cli/table.h"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <string>

namespace idem::cli {
namespace {

TEST_CASE("a table aligns its columns by the widest cell") {
  Table t({"ID", "STATE", "NOTE"});
  t.AddRow({"plan_1", "applied", "ok"});
  t.AddRow({"p2", "awaiting_approval", "needs a human"});
  CHECK(t.Render(Style{}) ==
        "ID      STATE              NOTE\n"
        "plan_1  applied            ok\n"
        "p2      awaiting_approval  needs a human\n");
}

TEST_CASE("colour escapes do not count toward the width") {
  Table t({"A", "B"});
  t.AddRow({{"x", Color::kRed}, "y"});
  t.AddRow({"long", "z"});
  std::string plain = t.Render(Style{false});
  std::string coloured = t.Render(Style{true});
  CHECK(plain.find('\033') == std::string::npos);
  CHECK(coloured.find("\033[31mx\033[0m     y") != std::string::npos);
  CHECK(coloured.find("\033[1mA\033[0m") != std::string::npos);  // bold header
}

TEST_CASE("widths count code points, so non-ASCII cells stay aligned") {
  Table t({"NAME", "X"});
  t.AddRow({"é\u2026", "1"});
  t.AddRow({"abcd", "2"});
  CHECK(t.Render(Style{}) ==
        "NAME  X\n"
        "é\u2026    1\n"
        "abcd  2\n");
}

TEST_CASE("long cells are cut with an ellipsis and kept on one line") {
  CHECK(Truncate("abcdef", 4) == "abc\u2026");
  CHECK(Truncate("abc", 4) == "abc");
  CHECK(Truncate("a\nb", 0) == "a b");
  CHECK(Truncate("ééééé", 3) == "éé\u2026");
  Table t({"A"});
  t.SetMaxWidth(0, 5);
  t.AddRow({"0123456789"});
  CHECK(t.Render(Style{}) == "A\n0123\u2026\n");
}

TEST_CASE("a cell's control characters are shown escaped, whoever built the row") {
  Table t({"A", "B"});
  t.AddRow({"x\x1b[2Jy",
            {"\xe2\x80\xae"
             "evil",
             Color::kRed}});
  CHECK(t.Render(Style{}) ==
        "A          B\n"
        "x\\x1b[2Jy  \\u202eevil\n");
}

TEST_CASE("missing cells are empty and trailing spaces are trimmed") {
  Table t({"A", "B", "C"});
  t.AddRow({"1"});
  CHECK(t.Render(Style{}) == "A  B  C\n1\n");
}

TEST_CASE("key-value lines pad their labels to one width") {
  CHECK(KeyValues({{"plan", "p1"}, {"created by", "agent-1"}}, Style{}) ==
        "plan:       p1\n"
        "created by: agent-1\n");
}

TEST_CASE("ages and times are short and in UTC") {
  constexpr int64_t now = 1'700'000'000'000;
  CHECK(Age(now - 5'000, now) == "5s");
  CHECK(Age(now - 120'000, now) == "2m");
  CHECK(Age(now - 7'200'000, now) == "2h");
  CHECK(Age(now - 3 * 86'400'000LL, now) == "3d");
  CHECK(Age(0, now) == "-");
  CHECK(UtcTime(now) == "2023-11-14 22:13:20Z");
}

TEST_CASE("colour is used on a terminal, never with NO_COLOR or on a file") {
  // A pseudo-terminal stands in for the operator's terminal.
  int master = posix_openpt(O_RDWR | O_NOCTTY);
  REQUIRE(master >= 0);
  REQUIRE(grantpt(master) == 0);
  REQUIRE(unlockpt(master) == 0);
  std::FILE* tty = std::fopen(ptsname(master), "w");
  REQUIRE(tty != nullptr);
  unsetenv("NO_COLOR");
  CHECK(UseColor(tty));
  setenv("NO_COLOR", "1", 1);
  CHECK_FALSE(UseColor(tty));
  unsetenv("NO_COLOR");
  std::fclose(tty);
  close(master);
  std::FILE* file = std::tmpfile();  // a pipe or file is never coloured
  REQUIRE(file != nullptr);
  CHECK_FALSE(UseColor(file));
  std::fclose(file);
}

}  // namespace
}  // namespace idem::cli
