// The first commands a new user types: the `curl` lines the daemon prints
// when it starts ("try:") and the README's quick start, run as printed (by
// sh and curl, as a user would) against the daemon on the repository's own
// default config. Both once sent a body curl labels as a form (`-d`), which
// the decide route refuses with 415.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/harness.h"

namespace idem::testing {
namespace {

// The shell commands of `text`: lines joined where one ends in a backslash;
// blank lines, comment lines and lines for which `skip` is true left out.
template <typename Skip>
std::vector<std::string> Commands(const std::string& text, Skip skip) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line, pending;
  while (std::getline(in, line)) {
    const size_t first = line.find_first_not_of(' ');
    if (pending.empty() && (first == std::string::npos || line[first] == '#')) continue;
    if (!line.empty() && line.back() == '\\') {
      pending += line.substr(0, line.size() - 1);
      continue;
    }
    std::string command = pending + line;
    pending.clear();
    if (!skip(command)) out.push_back(command);
  }
  return out;
}

// Runs `command` with sh; its standard output.
std::string Shell(const std::string& command) {
  FILE* p = popen(command.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  CHECK_MESSAGE((WIFEXITED(status) && WEXITSTATUS(status) == 0), command);
  return out;
}

// Every "```sh" block between `from` and `to` in the README.
std::string ReadmeShellBlocks(const std::string& from, const std::string& to) {
  const std::string readme = ReadFile(std::string(IDEM_SOURCE_DIR) + "/README.md");
  const size_t begin = readme.find(from);
  const size_t end = readme.find(to, begin);
  REQUIRE(begin != std::string::npos);
  REQUIRE(end != std::string::npos);
  const std::string section = readme.substr(begin, end - begin);
  std::string blocks;
  for (size_t at = section.find("```sh\n"); at != std::string::npos;
       at = section.find("```sh\n", at)) {
    at += 6;
    const size_t close = section.find("```", at);
    REQUIRE(close != std::string::npos);
    blocks += section.substr(at, close - at);
    at = close + 3;
  }
  return blocks;
}

void ReplaceAll(std::string& s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) {
    s.replace(at, from.size(), to);
  }
}

TEST_CASE("the_start_up_hint_and_the_readme_quick_start_work_as_printed") {
  REQUIRE_MESSAGE(std::system("command -v curl >/dev/null 2>&1") == 0,
                  "this test runs curl as a user would: install Debian's curl (scripts/deps.sh)");
  TempDir dir;
  std::string err;
  auto daemon = DaemonProcess::Start(
      {std::string(IDEM_SOURCE_DIR) + "/config/idem.yaml", dir.path() + "/data", {}, {}}, &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);
  const std::string here = "127.0.0.1:" + std::to_string(daemon->port());

  // The hint, as the daemon printed it: after it began to serve, so it may
  // not be in the log yet; its last line names /openapi.json.
  std::string log;
  for (int i = 0; i < 200; ++i) {
    log = ReadFile(daemon->log_path());
    if (log.find("/openapi.json | head -c 300; echo\n") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const size_t try_at = log.find("try:\n");
  REQUIRE_MESSAGE(try_at != std::string::npos, log);
  std::string hint;
  std::istringstream lines(log.substr(try_at + 5));
  for (std::string line; std::getline(lines, line) && line.rfind("  ", 0) == 0;) {
    hint += line + "\n";
  }
  const std::vector<std::string> hinted = Commands(hint, [](const std::string&) { return false; });
  REQUIRE(hinted.size() == 2);
  const Json first = Json::parse(Shell(hinted[0]));
  CHECK_MESSAGE(first.value("status", Json()) == "decided", first.dump());
  CHECK(first.value("cache", Json()) == "miss");
  CHECK(Shell(hinted[1]).rfind("{\"", 0) == 0);  // the start of the OpenAPI document

  // Then the README's quick start on the same daemon: the same call (a
  // replay of the hint's), the reordered one (a cache hit), the marked replay.
  std::string quick = ReadmeShellBlocks("## Quick start", "## API walkthrough");
  ReplaceAll(quick, "localhost:7411", here);
  const std::vector<std::string> readme = Commands(quick, [](const std::string& c) {
    return c.rfind("scripts/run.sh", 0) == 0;  // the daemon is already running
  });
  REQUIRE(readme.size() == 3);
  const Json same = Json::parse(Shell(readme[0]));
  CHECK_MESSAGE(same.value("status", Json()) == "decided", same.dump());
  CHECK(same.value("decision_id", "") == first.value("decision_id", "?"));
  const Json reordered = Json::parse(Shell(readme[1]));
  CHECK_MESSAGE(reordered.value("cache", Json()) == "hit", reordered.dump());
  CHECK(reordered.value("decision_id", "") == first.value("decision_id", "?"));
  CHECK(Shell(readme[2]).find("Idempotent-Replayed: true") != std::string::npos);
}

}  // namespace
}  // namespace idem::testing
