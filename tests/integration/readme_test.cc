// The README, run as a user runs it. The first commands a new user types:
// the `curl` lines the daemon prints when it starts ("try:") and the
// README's quick start, run as printed (by sh and curl) against the daemon
// on the repository's own default config. Both once sent a body curl labels
// as a form (`-d`), which the decide route refuses with 415. Then every
// command of the API walkthrough, in order, with its placeholders filled
// from the answers before it; and every curl command's route and method
// checked against /openapi.json.
#include <doctest/doctest.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
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

// The daemon on the repository's own config/idem.yaml (its store in
// `dir`), for commands run by sh and curl as a user runs them.
std::unique_ptr<DaemonProcess> StartOnDefaultConfig(const TempDir& dir,
                                                    std::vector<std::string> extra_args = {}) {
  REQUIRE_MESSAGE(std::system("command -v curl >/dev/null 2>&1") == 0,
                  "this test runs curl as a user would: install Debian's curl (scripts/deps.sh)");
  // A proxy from the environment (http_proxy and friends) must not take
  // curl's requests to the local daemon elsewhere.
  setenv("no_proxy", "*", 1);
  setenv("NO_PROXY", "*", 1);
  std::string err;
  auto daemon = DaemonProcess::Start({std::string(IDEM_SOURCE_DIR) + "/config/idem.yaml",
                                      dir.path() + "/data",
                                      std::move(extra_args),
                                      {}},
                                     &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);
  return daemon;
}

TEST_CASE("the_start_up_hint_and_the_readme_quick_start_work_as_printed") {
  TempDir dir;
  auto daemon = StartOnDefaultConfig(dir);
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
                   a.find("127.0.0.1:") != std::string::npos ||
                   a.rfind("http://localhost/", 0) == 0) {  // --unix-socket's URL
          url = a;
        }
      }
      if (url.empty()) continue;
      if (call.method.empty()) call.method = call.body ? "POST" : "GET";
      const size_t scheme = url.find("://");
      const size_t slash = url.find('/', scheme == std::string::npos ? 0 : scheme + 3);
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
  auto daemon = StartOnDefaultConfig(dir);
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

// `command` without its trailing comment, cut at each unquoted ';'.
std::vector<std::string> Parts(const std::string& command) {
  std::vector<std::string> out;
  std::string part;
  auto flush = [&] {
    const size_t b = part.find_first_not_of(' '), e = part.find_last_not_of(' ');
    if (b != std::string::npos) out.push_back(part.substr(b, e - b + 1));
    part.clear();
  };
  char quote = 0;
  for (size_t i = 0; i < command.size(); ++i) {
    const char c = command[i];
    if (quote != 0) {
      if (c == quote) quote = 0;
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (c == '#' && (i == 0 || command[i - 1] == ' ')) {
      break;
    } else if (c == ';') {
      flush();
      continue;
    }
    part += c;
  }
  flush();
  return out;
}

// A synopsis without its optional parts: each " [...]" left out.
std::string DropOptional(const std::string& synopsis) {
  std::string out;
  int depth = 0;
  for (char c : synopsis) {
    if (c == '[') {
      if (depth++ == 0 && !out.empty() && out.back() == ' ') out.pop_back();
    } else if (c == ']' && depth > 0) {
      --depth;
    } else if (depth == 0) {
      out += c;
    }
  }
  return out;
}

// What a README placeholder (dec_e199…, 1b68…) stands for in this run.
using Bindings = std::map<std::string, std::string>;

enum class Way {
  kRun,        // as written, its placeholders filled
  kOptional,   // a synopsis, run without its [optional parts]
  kDefine,     // a shell variable the commands after it use
  kSynopsis,   // a synopsis with names to choose (F, DIR): not run
  kElsewhere,  // needs more than the default config: not run here
};

struct TourStep {
  const char* needle;  // a part of the README command at this place
  Way way;
  int expect = 0;  // curl: the HTTP status; anything else: the exit code
  std::function<void(const Json& body, const std::string& out, Bindings&)> after = nullptr;
  // Replaced in the command before it runs (a wait shortened).
  std::pair<const char*, const char*> edit = {"", ""};
};

Json Parsed(const std::string& text) { return Json::parse(text, nullptr, false); }

// Waits until at least `n` items are dead letters; their work ids.
std::vector<std::string> DeadLetters(DaemonProcess& daemon, size_t n) {
  std::vector<std::string> ids;
  for (int i = 0; i < 300 && ids.size() < n; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto got = daemon.Client()->Get("/v1/dead-letters");
    if (!got || got->status != 200) continue;
    ids.clear();
    for (const Json& item : Parsed(got->body).value("items", Json::array())) {
      ids.push_back(item.value("work_id", ""));
    }
  }
  return ids;
}

// The README's commands from its quick start to its Idempotency-Key
// contract, in order: how each is run on the default config and what it
// must answer (the answers the README shows beside it).
std::vector<TourStep> Tour(DaemonProcess& daemon) {
  auto bind = [](const char* placeholder, const char* member) {
    return [placeholder, member](const Json& body, const std::string&, Bindings& b) {
      REQUIRE_MESSAGE(body.contains(member), body.dump());
      b[placeholder] = body[member].get<std::string>();
    };
  };
  auto says = [](std::string text) {
    return [text](const Json&, const std::string& out, Bindings&) {
      CHECK_MESSAGE(out.find(text) != std::string::npos, out);
    };
  };
  return {
      // Quick start; the test's daemon stands in for scripts/run.sh.
      {"scripts/run.sh &", Way::kSynopsis},
      {R"(-H 'Idempotency-Key: "t-1"')", Way::kRun, 200,
       [](const Json& body, const std::string&, Bindings& b) {
         REQUIRE_MESSAGE(body.value("status", "") == "decided", body.dump());
         b["dec_e199…"] = b["dec_…"] = body["decision_id"].get<std::string>();
         b["plan_…"] = body["plan"]["plan_id"].get<std::string>();
         // The README prints this key's first eight digits.
         CHECK(body.value("decision_key", "").rfind("a08f5507", 0) == 0);
       }},
      {R"("received_at":"tomorrow")", Way::kRun, 200, says(R"("cache":"hit")")},
      {"| grep Idempotent", Way::kRun, 0, says("Idempotent-Replayed: true")},
      // Decide.
      {R"("cache":"only")", Way::kRun, 404},
      {"v1/decisions/dec_e199…", Way::kRun, 200, says(R"("attempts":[)")},
      {"decisions?step=triage_ticket&limit=20", Way::kRun, 200},
      {"lorem ipsum", Way::kRun, 200,
       [](const Json& body, const std::string&, Bindings& b) {
         REQUIRE_MESSAGE(body.value("status", "") == "escalated", body.dump());
         b["esc_…"] = body["escalation_id"].get<std::string>();
       }},
      {"escalations?state=open", Way::kRun, 200, says("esc_")},
      {"escalations/esc_…/resolve", Way::kRun, 200, says(R"("decided_by":"human")")},
      // Debugging a decision.
      {"decisions?step=triage_ticket&limit=20", Way::kRun, 200},
      {"idem decision dec_e199…", Way::kRun, 0, says("raw_output")},
      {R"("model":"demo-2")", Way::kRun, 200, says(R"("diff":)")},
      {"replay dec_e199… --prompt-version v2", Way::kRun, 0,
       says("1 change:\n  ~ /priority: \"high\" → \"normal\"")},
      {R"(-H 'Idempotency-Key: "pre-v2"')", Way::kRun, 202, bind("rpl_…", "replay_id")},
      {"v1/replays/rpl_…", Way::kRun, 200, says(R"("total":)")},
      {"replay --step triage_ticket --prompt-version v2 [", Way::kOptional, 0, says("changed")},
      // Client-executed work.
      {R"("lease":"30s")", Way::kRun, 201,
       [](const Json& body, const std::string&, Bindings& b) {
         // The README's id is this identity's real work id.
         CHECK(body.value("work_id", "").rfind("1b68", 0) == 0);
         b["1b68…"] = body["work_id"].get<std::string>();
         b[R"("lease_token":"…")"] = R"("lease_token":")" + body.value("lease_token", "") + "\"";
       }},
      {"v1/work/1b68…/complete", Way::kRun, 200, says(R"("state":"done")")},
      {"v1/work/claim", Way::kRun, 200, says(R"("duplicate":true)")},
      {"--unix-socket var/idem.sock", Way::kRun, 200, says(R"("duplicate":true)")},
      // Daemon-executed actions, plans, runs: nothing listens on port 9000.
      {"v1/actions/send_reply", Way::kRun, 200, says(R"("duplicate":true)")},
      {"v1/plans/dec_e199…/apply", Way::kRun, 200, says(R"("state":"failed")")},
      {"v1/runs -H", Way::kRun, 200, says(R"("retrying":2)")},
      {"v1/runs/nightly-2026-11-29", Way::kRun, 200,
       [&daemon](const Json&, const std::string&, Bindings& b) {
         // The three effects above become dead letters after 5 attempts.
         const std::vector<std::string> dead = DeadLetters(daemon, 3);
         REQUIRE(dead.size() == 3);
         b["7d42…"] = dead[0];
         b["second dead letter"] = dead[1];
       }},
      // Dead letters, leases, reconciliation, metrics.
      {"v1/dead-letters", Way::kRun, 200, says("last_error")},
      {"v1/dead-letters/7d42…/replay", Way::kRun, 202,
       [](const Json&, const std::string&, Bindings& b) {
         b["7d42…"] = b["second dead letter"];  // the first is no longer dead
       }},
      {"idem dlq ls", Way::kRun, 0},
      {"idem dlq replay 7d42…", Way::kRun, 0},
      {R"("ttl":"10m"}')", Way::kRun, 201,
       [](const Json& body, const std::string&, Bindings& b) {
         const std::string token = body.value("token", "");
         REQUIRE(!token.empty());
         b[R"("token":"…")"] = R"("token":")" + token + "\"";
         b["token=…"] = "token=" + token;
       }},
      {R"("token":"…")", Way::kRun, 200},
      {"-X DELETE", Way::kRun, 200},
      {"-X POST localhost:7411/v1/reconcile", Way::kRun, 200},
      {"v1/reconcile/report", Way::kRun, 200},
      {"/metrics", Way::kRun, 200, says("idem_")},
      {"v1/audit?from_seq=1", Way::kRun, 200, says("prev_hash")},
      {"v1/audit/verify", Way::kRun, 200, says(R"("ok":true)")},
      // Traces.
      {"| grep traceresponse", Way::kRun, 0, says("4bf92f3577b34da6a3ce929d0e0e4736")},
      {"v1/traces/4bf92f3577b34da6a3ce929d0e0e4736", Way::kRun, 200, says(R"("type":"decision")")},
      // CLI.
      {"idem --version", Way::kRun, 0, says(std::string("idem ") + IDEM_VERSION + "\n")},
      {"idem contracts", Way::kRun, 0, says("step triage_ticket")},
      {"idem canon", Way::kRun, 0, says(R"({"a":"é","b":[1,2.5]})")},
      {"key --step triage_ticket", Way::kRun, 0, says("decision_key a08f5507")},
      {"key --kind send_reply", Way::kRun, 0, says("work_id 1b68")},
      {"idem serve --config F", Way::kSynopsis},
      {"idem migrate --config F", Way::kElsewhere},  // store.engine postgres
      {"export IDEM_TOKEN", Way::kSynopsis},         // the default config has no tokens
      {"idem plans ls [", Way::kOptional, 0},
      {"idem plans show plan_…", Way::kRun, 0, says("plan_")},
      {"idem approve plan_…", Way::kSynopsis},
      {"idem reject plan_…", Way::kElsewhere},  // a plan awaiting approval: see Approvals
      {"idem audit verify", Way::kRun, 0},
      {"idem decisions export [", Way::kOptional, 0},
      {"idem decisions import run.jsonl", Way::kRun, 0, says("refused 0")},
      {"idem cost [", Way::kOptional, 0, says("TOTAL")},
      {"| jq", Way::kElsewhere},  // jq, which idem does not need
      {"idem replay dec_… [", Way::kOptional, 0},
      {"idem replay --step triage_ticket --prompt-version v2", Way::kRun, 0},
      // Approvals, without tokens: the refund kind's policy.
      {R"("order_id":"O-1","amount":500)", Way::kRun, 202,
       [](const Json& body, const std::string&, Bindings& b) {
         REQUIRE_MESSAGE(body.value("state", "") == "awaiting_approval", body.dump());
         b["plan_6cca…"] = body["plan_id"].get<std::string>();
       }},
      {"?wait=30s", Way::kRun, 200, says("awaiting_approval"), {"wait=30s", "wait=1s"}},
      {"v1/plans?state=awaiting_approval", Way::kRun, 200, says("refunds over 100 need a human")},
      {"v1/plans/plan_6cca…", Way::kRun, 200},
      {"v1/plans/plan_6cca…/approve", Way::kRun, 200, says(R"("original_actions")")},
      {R"("order_id":"O-2","amount":250)", Way::kRun, 202, bind("plan_…", "plan_id")},
      {"v1/plans/plan_…/reject", Way::kRun, 200, says(R"("state":"rejected")")},
      {R"("order_id":"O-2","amount":250)", Way::kRun, 409, says("rejected")},
      // MCP.
      {"H='-H Content-Type", Way::kDefine},
      {R"("method":"initialize")", Way::kRun, 200,
       [](const Json&, const std::string& out, Bindings& b) {
         const size_t at = out.find("Mcp-Session-Id: ");
         REQUIRE_MESSAGE(at != std::string::npos, out);
         const size_t from = at + 16;
         b["d1a8…"] = out.substr(from, out.find('\r', from) - from);
       }},
      {R"("method":"tools/list")", Way::kRun, 200, says("do_send_reply")},
      {R"("name":"do_send_reply")", Way::kRun, 200, says(R"("outcome":)")},
      // Outbox.
      {"v1/events?after=0", Way::kRun, 200,
       [](const Json& body, const std::string& out, Bindings& b) {
         CHECK(out.find("decision.created") != std::string::npos);
         // The README's store id stands for this store's (the cursor's prefix).
         const std::string cursor = body.value("next_cursor", "");
         REQUIRE(cursor.find(':') == 16);
         b["9f2c41d07ab3e865"] = cursor.substr(0, 16);
       }},
      {"v1/events?after=9f2c41d07ab3e865:3", Way::kRun, 200},
      {"subscriber=billing", Way::kElsewhere},  // a subscriber named billing
      {"outbox/dead-letters/billing/7/replay", Way::kElsewhere},
      // Export, import.
      {"idem decisions export [", Way::kOptional, 0},
      {"idem decisions import run.jsonl", Way::kRun, 0},
      {"v1/decisions/export?", Way::kRun, 200, says("decision_key")},
      {"v1/decisions/import", Way::kRun, 200, says(R"("refused":0)")},
      // Moving a store to PostgreSQL.
      {"export IDEM_PG_URL", Way::kElsewhere},
      {"idem store copy", Way::kElsewhere},
  };
}

TEST_CASE("the_readme_walkthrough_runs_as_written_on_the_default_config") {
  TempDir dir;
  // The README's commands run in a checkout's root: config/idem.yaml and
  // the files it names are found there, run.jsonl is written there; the
  // daemon also serves on var/idem.sock there, as the README starts it.
  const std::string root = dir.path() + "/checkout";
  REQUIRE(RunShell("mkdir -p " + root + "/var && cd " + root +
                   " && for d in config schemas policies; do " + "ln -s '" + IDEM_SOURCE_DIR +
                   "'/$d $d; done")
              .exit_code == 0);
  auto daemon = StartOnDefaultConfig(dir, {"--unix-socket", root + "/var/idem.sock"});
  const std::string here = "127.0.0.1:" + std::to_string(daemon->port());

  std::vector<std::string> commands;
  for (const std::string& c :
       Commands(ReadmeShellBlocks("## Quick start", "## Idempotency-Key contract"))) {
    for (std::string& part : Parts(c)) commands.push_back(std::move(part));
  }
  const std::vector<TourStep> tour = Tour(*daemon);
  Bindings bound;
  std::string defines;
  size_t next = 0;
  for (const std::string& written : commands) {
    REQUIRE_MESSAGE(next < tour.size(), "a README command the tour does not know: " << written);
    const TourStep& step = tour[next++];
    REQUIRE_MESSAGE(written.find(step.needle) != std::string::npos,
                    "the README has `" << written << "` where the tour expects a command with `"
                                       << std::string(step.needle) << "`");
    if (step.way == Way::kSynopsis || step.way == Way::kElsewhere) continue;
    std::string command = step.way == Way::kOptional ? DropOptional(written) : written;
    if (*step.edit.first != 0) ReplaceAll(command, step.edit.first, step.edit.second);
    for (const auto& [placeholder, value] : bound) ReplaceAll(command, placeholder, value);
    ReplaceAll(command, "localhost:7411", here);
    ReplaceAll(command, "build/idem", IDEM_BINARY);
    if (step.way == Way::kDefine) {
      defines += command + "\n";
      continue;
    }
    REQUIRE_MESSAGE(command.find("…") == std::string::npos,
                    "a placeholder the tour has no value for: " << command);
    const bool curl = command.rfind("curl ", 0) == 0 && command.find('|') == std::string::npos;
    if (curl) command.insert(4, " -w '\\n%{http_code} %{content_type}'");
    CliResult r = RunShell("cd '" + root + "' && exec 2>>stderr; set -e; export IDEM_URL=http://" +
                           here + "\n" + defines + command);
    int got = r.exit_code;
    std::string out = r.out;
    if (curl && r.exit_code == 0) {
      const size_t eol = out.rfind('\n');
      REQUIRE(eol != std::string::npos);
      got = std::atoi(out.c_str() + eol + 1);
      const std::string type = out.substr(out.find(' ', eol) + 1);
      out.resize(eol);
      // The answer, for the OpenAPI check (IDEM_RESPONSE_LOG): without the
      // headers `curl -i` printed.
      const std::vector<CurlCall> calls = CurlCalls(command);
      REQUIRE(calls.size() == 1);
      const size_t headers_end = out.find("\r\n\r\n");
      const bool with_headers = out.rfind("HTTP/1.1 ", 0) == 0 && headers_end != std::string::npos;
      RecordResponse(calls[0].method, calls[0].path, got, type,
                     with_headers ? out.substr(headers_end + 4) : out);
    }
    INFO("README: " << written << "\nran: " << command << "\nanswer: " << out.substr(0, 2000)
                    << "\nstderr: " << ReadFile(root + "/stderr"));
    CHECK(got == step.expect);
    if (step.after) step.after(Parsed(out), out, bound);
  }
  if (next < tour.size()) {
    FAIL_CHECK("the README lost a command the tour runs: " << std::string(tour[next].needle));
  }
}

}  // namespace
}  // namespace idem::testing
