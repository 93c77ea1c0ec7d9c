// The first commands a new user types: the `curl` lines the daemon prints
// when it starts ("try:") and the README's quick start, run as printed (by
// sh and curl, as a user would) against the daemon on the repository's own
// default config. Both once sent a body curl labels as a form (`-d`), which
// the decide route refuses with 415.
#include <doctest/doctest.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/harness.h"

namespace idem::testing {
namespace {

// The shell commands of `text`: lines joined where one ends in a
// backslash; blank lines and comment lines left out.
std::vector<std::string> Commands(const std::string& text) {
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
    out.push_back(pending + line);
    pending.clear();
  }
  return out;
}

// Runs `command` with sh; its standard output (a failure when it fails).
std::string Shell(const std::string& command) {
  CliResult r = RunShell(command);
  CHECK_MESSAGE(r.exit_code == 0, command);
  return r.out;
}

// The text of every "```sh" and "```bash" block of the README between the
// first `from` and the `to` after it ("" and "": the whole README).
std::string ReadmeShellBlocks(const std::string& from, const std::string& to) {
  const std::string readme = ReadFile(std::string(IDEM_SOURCE_DIR) + "/README.md");
  const size_t begin = from.empty() ? 0 : readme.find(from);
  const size_t end = to.empty() ? readme.size() : readme.find(to, begin);
  REQUIRE(begin != std::string::npos);
  REQUIRE(end != std::string::npos);
  const std::string section = readme.substr(begin, end - begin);
  std::string blocks;
  for (size_t at = section.find("```"); at != std::string::npos; at = section.find("```", at)) {
    const size_t eol = section.find('\n', at);
    REQUIRE(eol != std::string::npos);
    const std::string lang = section.substr(at + 3, eol - at - 3);
    const size_t close = section.find("```", eol);
    REQUIRE(close != std::string::npos);
    if (lang == "sh" || lang == "bash") blocks += section.substr(eol + 1, close - eol - 1);
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
  // A proxy from the environment (http_proxy and friends) must not take
  // curl's requests to the local daemon elsewhere.
  setenv("no_proxy", "*", 1);
  setenv("NO_PROXY", "*", 1);
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
  const std::vector<std::string> hinted = Commands(hint);
  REQUIRE(hinted.size() == 2);
  const Json first = Json::parse(Shell(hinted[0]));
  CHECK_MESSAGE(first.value("status", Json()) == "decided", first.dump());
  CHECK(first.value("cache", Json()) == "miss");
  CHECK(Shell(hinted[1]).rfind("{\"", 0) == 0);  // the start of the OpenAPI document

  // Then the README's quick start on the same daemon: the same call (a
  // replay of the hint's), the reordered one (a cache hit), the marked replay.
  std::string quick = ReadmeShellBlocks("## Quick start", "## API walkthrough");
  ReplaceAll(quick, "localhost:7411", here);
  std::vector<std::string> readme = Commands(quick);
  std::erase_if(readme, [](const std::string& c) {
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

// The words of one shell command: quotes removed, nothing expanded.
// Unquoted ';' and '|' end the command; `rest` gets what follows.
std::vector<std::string> Words(const std::string& line, std::string* rest) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  char quote = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quote != 0) {
      if (c == quote) {
        quote = 0;
      } else {
        word += c;
      }
    } else if (c == '\'' || c == '"') {
      quote = c;
      in_word = true;
    } else if (c == ';' || c == '|' || c == '#') {
      if (c != '#' && rest != nullptr) *rest = line.substr(i + 1);
      break;
    } else if (c == ' ' || c == '\t') {
      if (in_word) words.push_back(word);
      word.clear();
      in_word = false;
    } else {
      word += c;
      in_word = true;
    }
  }
  if (in_word) words.push_back(word);
  return words;
}

struct CurlCall {
  std::string text;    // the command as written
  std::string method;  // GET unless -X, -I or a body says otherwise
  std::string path;    // without host and query
  bool body = false;
  bool json_type = false;  // --json, or a Content-Type header
};

// Every curl command of `blocks` addressed to the daemon (a localhost URL).
// `$H` stands for the MCP example's header variable (a Content-Type).
std::vector<CurlCall> CurlCalls(const std::string& blocks) {
  std::vector<CurlCall> calls;
  for (const std::string& command : Commands(blocks)) {
    std::string rest = command;
    while (!rest.empty()) {
      const std::string one = rest;
      rest.clear();
      const std::vector<std::string> w = Words(one, &rest);
      if (w.empty() || w[0] != "curl") continue;
      CurlCall call{one, "", "", false, false};
      std::string url;
      for (size_t i = 1; i < w.size(); ++i) {
        const std::string& a = w[i];
        const std::string next = i + 1 < w.size() ? w[i + 1] : "";
        if (a == "-X") {
          call.method = next;
          ++i;
        } else if (a == "-I") {
          call.method = "HEAD";
        } else if (a == "--json") {
          call.body = call.json_type = true;
          ++i;
        } else if (a == "-d" || a == "--data" || a == "--data-binary" || a == "--data-raw") {
          call.body = true;
          ++i;
        } else if (a == "-H") {
          if (next.rfind("Content-Type", 0) == 0) call.json_type = true;
          ++i;
        } else if (a == "$H") {
          call.json_type = true;
        } else if (a.find("localhost:") != std::string::npos ||
                   a.find("127.0.0.1:") != std::string::npos) {
          url = a;
        }
      }
      if (url.empty()) continue;
      if (call.method.empty()) call.method = call.body ? "POST" : "GET";
      const size_t slash = url.find('/', url.find(':'));
      call.path = slash == std::string::npos ? "/" : url.substr(slash);
      call.path = call.path.substr(0, call.path.find('?'));
      calls.push_back(std::move(call));
    }
  }
  return calls;
}

std::vector<std::string> Segments(const std::string& path) {
  std::vector<std::string> out;
  std::istringstream in(path);
  for (std::string s; std::getline(in, s, '/');) {
    if (!s.empty()) out.push_back(s);
  }
  return out;
}

// Does the README's `path` (placeholders such as dec_e199… or $ID in it)
// fit the OpenAPI path template `pattern` ({name} segments)?
bool Fits(const std::string& path, const std::string& pattern) {
  const std::vector<std::string> a = Segments(path), b = Segments(pattern);
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (b[i].front() == '{' || a[i] == b[i]) continue;
    return false;
  }
  return true;
}

TEST_CASE("every_curl_command_in_the_readme_names_a_route_with_its_method") {
  TempDir dir;
  std::string err;
  auto daemon = DaemonProcess::Start(
      {std::string(IDEM_SOURCE_DIR) + "/config/idem.yaml", dir.path() + "/data", {}, {}}, &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);
  auto got = daemon->Client()->Get("/openapi.json");
  REQUIRE(got);
  REQUIRE(got->status == 200);
  const Json spec = Json::parse(got->body);

  const std::vector<CurlCall> calls = CurlCalls(ReadmeShellBlocks("", ""));
  CHECK(calls.size() >= 40);  // the walkthrough's commands were all found
  for (const CurlCall& call : calls) {
    bool routed = false;
    std::string lower = call.method;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    for (const auto& [pattern, operations] : spec["paths"].items()) {
      if (Fits(call.path, pattern) && operations.contains(lower)) routed = true;
    }
    // The operator page and the OpenAPI document are served outside the API.
    if (call.path.rfind("/ui/", 0) == 0 || call.path == "/openapi.json") routed = true;
    CHECK_MESSAGE(routed, "no " << call.method << " route for " << call.path << ": " << call.text);
    // A body the JSON routes take needs its type: curl's -d says it is a form.
    if (call.body) CHECK_MESSAGE(call.json_type, "a body without Content-Type: " << call.text);
  }
}

}  // namespace
}  // namespace idem::testing
