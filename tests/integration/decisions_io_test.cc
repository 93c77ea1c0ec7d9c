// Decisions as JSON Lines (issue 11): export, import into an empty store,
// served by `cache: only`; edited lines refused; a replay provider answering
// a recorded run offline; what deciding cost and what the cache saved.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/integration/harness.h"

namespace idem::testing {
namespace {

// The answer depends on the input, so every recorded decision is its own.
const char* kRules = R"(default:
  output: '{"category":"question","priority":"normal","summary":"about {{input.ticket_id}}","actions":[]}'
)";

Json J(const httplib::Result& r) {
  REQUIRE(r);
  INFO(r->body);
  return Json::parse(r->body);
}

std::string DecideBody(const std::string& ticket, const std::string& cache = "default") {
  return Json{{"step", "triage_ticket"},
              {"input", {{"ticket_id", ticket}, {"text", "text of " + ticket}}},
              {"cache", cache}}
      .dump();
}

std::vector<Json> Lines(const std::string& jsonl) {
  std::vector<Json> out;
  std::istringstream in(jsonl);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(Json::parse(line));
  }
  return out;
}

std::string Url(const DaemonProcess& d) { return "http://127.0.0.1:" + std::to_string(d.port()); }

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Records three decisions with the scripted provider and returns the export.
std::string RecordRun(const TempDir& dir, const std::string& config,
                      std::map<std::string, Json>* outputs) {
  std::string err;
  auto daemon = DaemonProcess::Start({config, dir.path() + "/record", {}, {}}, &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);
  auto c = daemon->Client();
  for (const char* t : {"T-1", "T-2", "T-3"}) {
    Json d = J(c->Post("/v1/decide", DecideBody(t), "application/json"));
    REQUIRE(d["cache"] == "miss");
    (*outputs)[d["decision_id"]] = d;
  }
  CliResult exported = RunCli({"--url", Url(*daemon), "decisions", "export"});
  REQUIRE_MESSAGE(exported.exit_code == 0, exported.err);
  CHECK(exported.err.find("exported 3 decisions") != std::string::npos);
  return exported.out;
}

// A daemon on a fresh store under `dir`, and its answer to importing `body`.
std::pair<std::unique_ptr<DaemonProcess>, Json> ImportIntoFreshStore(const TempDir& dir,
                                                                     const std::string& config,
                                                                     const std::string& body) {
  std::string err;
  auto fresh = DaemonProcess::Start({config, dir.path() + "/fresh", {}, {}}, &err);
  REQUIRE_MESSAGE(fresh != nullptr, err);
  auto r = fresh->Client()->Post("/v1/decisions/import", body, "application/x-ndjson");
  REQUIRE(r);
  REQUIRE_MESSAGE(r->status == 200, r->body);
  return {std::move(fresh), Json::parse(r->body)};
}

}  // namespace

TEST_CASE("exported decisions imported into an empty store are cache-only hits, ids kept") {
  TempDir dir;
  const std::string config = WriteTestConfig(dir, kRules);
  std::map<std::string, Json> recorded;
  const std::string jsonl = RecordRun(dir, config, &recorded);
  std::vector<Json> lines = Lines(jsonl);
  REQUIRE(lines.size() == 3);
  for (const Json& l : lines) {
    CHECK(recorded.count(l["decision_id"]) == 1);
    CHECK(l["material"]["input"]["ticket_id"].is_string());  // the key material travels
    CHECK(l["trace"].contains("attempts"));                  // and the trace
  }
  const std::string file = dir.File("decisions.jsonl", jsonl);

  std::string err;
  auto fresh = DaemonProcess::Start({config, dir.path() + "/fresh", {}, {}}, &err);
  REQUIRE_MESSAGE(fresh != nullptr, err);
  auto c = fresh->Client();
  // An empty store: nothing is cached yet.
  auto miss = c->Post("/v1/decide", DecideBody("T-1", "only"), "application/json");
  REQUIRE(miss);
  CHECK(miss->status == 404);

  CliResult imported =
      RunCli({"--url", Url(*fresh), "decisions", "import", file}, "", {{"NO_COLOR", "1"}});
  INFO(imported.out, imported.err);
  REQUIRE(imported.exit_code == 0);
  CHECK(imported.out.find("imported 3, exists 0, expired 0, refused 0") != std::string::npos);

  for (const char* t : {"T-1", "T-2", "T-3"}) {
    Json d = J(c->Post("/v1/decide", DecideBody(t, "only"), "application/json"));
    CHECK(d["cache"] == "hit");
    REQUIRE(recorded.count(d["decision_id"]) == 1);  // the recorded decision, its id kept
    CHECK(d["output"] == recorded[d["decision_id"]]["output"]);
  }
  // Importing again changes nothing.
  CliResult again = RunCli({"--url", Url(*fresh), "--json", "decisions", "import", file});
  REQUIRE(again.exit_code == 0);
  Json body = Json::parse(again.out);
  CHECK(body["imported"] == 0);
  CHECK(body["exists"] == 3);
  // The import is in the audit log.
  Json audit = J(c->Get("/v1/audit?limit=100"));
  int imports = 0;
  for (const Json& e : audit["items"]) imports += e["action"] == "decisions.imported";
  CHECK(imports == 2);
}

TEST_CASE(
    "a decision whose input was as deep as a request may be is imported from its own export "
    "(the record wraps the input in more levels)") {
  TempDir dir;
  const std::string config = WriteTestConfig(dir, kRules);
  std::string err;
  auto daemon = DaemonProcess::Start({config, dir.path() + "/record", {}, {}}, &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);
  // The body nests 64 levels, the default server.max_json_depth.
  std::string deep = "\"bottom\"";
  for (int i = 0; i < 62; ++i) deep = "[" + deep + "]";
  const std::string body =
      R"({"step":"triage_ticket","input":{"ticket_id":"D-1","text":"deep","deep":)" + deep + "}}";
  auto decided = daemon->Client()->Post("/v1/decide", body, "application/json");
  REQUIRE(decided);
  REQUIRE_MESSAGE(decided->status == 200, decided->body);
  CliResult exported = RunCli({"--url", Url(*daemon), "decisions", "export"});
  REQUIRE_MESSAGE(exported.exit_code == 0, exported.err);
  // Not a structured binding: clang 14 cannot capture one in doctest's message lambda.
  auto imported = ImportIntoFreshStore(dir, config, exported.out);
  std::unique_ptr<DaemonProcess>& fresh = imported.first;
  const Json& answer = imported.second;
  CHECK_MESSAGE(answer["imported"] == 1, answer.dump());
  CHECK(answer["refused"] == 0);
  // A line deeper than any record could be is still refused.
  std::string deeper = "1";
  for (int i = 0; i < 200; ++i) deeper = "[" + deeper + "]";
  auto refused = fresh->Client()->Post("/v1/decisions/import",
                                       R"({"decision_id":"dec_x","trace":)" + deeper + "}\n",
                                       "application/x-ndjson");
  REQUIRE(refused);
  CHECK(Json::parse(refused->body)["refused"] == 1);
}

TEST_CASE(
    "imports of one file at once store each decision once and report it imported once, "
    "exists elsewhere") {
  TempDir dir;
  const std::string config = WriteTestConfig(dir, kRules);
  std::map<std::string, Json> recorded;
  const std::string jsonl = RecordRun(dir, config, &recorded);
  std::string err;
  auto fresh = DaemonProcess::Start({config, dir.path() + "/fresh", {}, {}}, &err);
  REQUIRE_MESSAGE(fresh != nullptr, err);
  for (int round = 0; round < 5; ++round) {
    if (round > 0) {
      // A store emptied again: the same decisions race in anew.
      fresh.reset();
      std::filesystem::remove_all(dir.path() + "/fresh");
      fresh = DaemonProcess::Start({config, dir.path() + "/fresh", {}, {}}, &err);
      REQUIRE_MESSAGE(fresh != nullptr, err);
    }
    std::vector<Json> answers(4);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < answers.size(); ++i) {
      threads.emplace_back([&, i] {
        auto r = fresh->Client()->Post("/v1/decisions/import", jsonl, "application/x-ndjson");
        if (r && r->status == 200) answers[i] = Json::parse(r->body);
      });
    }
    for (std::thread& t : threads) t.join();
    int64_t imported = 0;
    int64_t exists = 0;
    for (const Json& a : answers) {
      REQUIRE(a.is_object());
      imported += a["imported"].get<int64_t>();
      exists += a["exists"].get<int64_t>();
      for (const Json& r : a["results"]) CHECK_FALSE(r.contains("cached_decision_id"));
    }
    CHECK(imported == 3);
    CHECK(exists == 3 * 3);
  }
}

TEST_CASE("a CLI import whose later batch the daemon refuses says what the batches before it did") {
  TempDir dir;
  const std::string config = WriteTestConfig(dir, kRules);
  std::map<std::string, Json> recorded;
  std::vector<Json> lines = Lines(RecordRun(dir, config, &recorded));
  REQUIRE(lines.size() == 3);
  // Line 3 is longer than a request body may be (server.max_body_bytes, 1 MiB).
  Json huge = lines[2];
  huge["trace"]["padding"] = std::string(2 << 20, 'x');
  const std::string file =
      dir.File("huge.jsonl", lines[0].dump() + "\n" + lines[1].dump() + "\n" + huge.dump() + "\n");
  std::string err;
  auto fresh = DaemonProcess::Start({config, dir.path() + "/fresh", {}, {}}, &err);
  REQUIRE_MESSAGE(fresh != nullptr, err);
  CliResult cli = RunCli({"--url", Url(*fresh), "decisions", "import", "--batch-kib", "1", file},
                         "", {{"NO_COLOR", "1"}});
  INFO(cli.out, cli.err);
  CHECK(cli.exit_code != 0);
  CHECK(cli.err.find("the batch from line 3 was not imported; lines 1-2 were sent before it: "
                     "imported 2, exists 0, expired 0, refused 0") != std::string::npos);
}

TEST_CASE("an export the CLI prints escapes C1 controls, and imports as the same decision") {
  TempDir dir;
  const std::string config = WriteTestConfig(dir, kRules);
  std::string err;
  auto daemon = DaemonProcess::Start({config, dir.path() + "/record", {}, {}}, &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);
  // U+009B, a terminal's CSI in one character, in the input the decision keeps.
  Json made =
      J(daemon->Client()->Post("/v1/decide", DecideBody("T-\xc2\x9b[2J"), "application/json"));
  REQUIRE(made["status"] == "decided");
  CliResult exported = RunCli({"--url", Url(*daemon), "decisions", "export"});
  REQUIRE_MESSAGE(exported.exit_code == 0, exported.err);
  CHECK(exported.out.find("\xc2\x9b") == std::string::npos);
  CHECK(exported.out.find("\\u009b") != std::string::npos);
  auto imported = ImportIntoFreshStore(dir, config, exported.out);
  CHECK(imported.second["imported"] == 1);
  CHECK(imported.second["results"][0]["decision_id"] == made["decision_id"]);
}

TEST_CASE("an export pages with Idem-Next-Cursor and filters by step and since") {
  TempDir dir;
  const std::string config = WriteTestConfig(dir, kRules);
  std::string err;
  auto daemon = DaemonProcess::Start({config, dir.path() + "/data", {}, {}}, &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);
  auto c = daemon->Client();
  for (const char* t : {"T-1", "T-2", "T-3"}) {
    J(c->Post("/v1/decide", DecideBody(t), "application/json"));
  }
  auto first = c->Get("/v1/decisions/export?limit=2");
  REQUIRE(first);
  REQUIRE(first->status == 200);
  CHECK(first->get_header_value("Content-Type").find("application/x-ndjson") == 0);
  CHECK(Lines(first->body).size() == 2);
  const std::string cursor = first->get_header_value("Idem-Next-Cursor");
  REQUIRE(!cursor.empty());
  auto second = c->Get(("/v1/decisions/export?limit=2&cursor=" + cursor).c_str());
  REQUIRE(second);
  CHECK(Lines(second->body).size() == 1);
  CHECK(!second->has_header("Idem-Next-Cursor"));

  // The step filter: the configured step's decisions; a step the config
  // does not have is a 404 (not an empty export that reads as "none").
  auto this_step = c->Get("/v1/decisions/export?step=triage_ticket");
  REQUIRE(this_step);
  CHECK(Lines(this_step->body).size() == 3);
  auto other_step = c->Get("/v1/decisions/export?step=nope");
  REQUIRE(other_step);
  CHECK(other_step->status == 404);
  CHECK(Json::parse(other_step->body)["pointer"] == "query:step");
  auto future = c->Get("/v1/decisions/export?since=99999999999999");
  REQUIRE(future);
  CHECK(future->body.empty());
  auto bad = c->Get("/v1/decisions/export?since=yesterday");
  REQUIRE(bad);
  CHECK(bad->status == 400);
}

TEST_CASE("an import refuses a line whose key material was edited and imports the rest") {
  TempDir dir;
  const std::string config = WriteTestConfig(dir, kRules);
  std::map<std::string, Json> recorded;
  std::vector<Json> lines = Lines(RecordRun(dir, config, &recorded));
  REQUIRE(lines.size() == 3);
  Json edited_material = lines[1];
  edited_material["material"]["input"]["text"] = "something else entirely";
  Json edited_key = lines[2];
  edited_key["decision_key"] = std::string(64, 'a');
  const std::string body =
      lines[0].dump() + "\n" + edited_material.dump() + "\n\nnot json\n" + edited_key.dump() + "\n";

  auto imported = ImportIntoFreshStore(dir, config, body);  // no structured binding: clang 14
  std::unique_ptr<DaemonProcess>& fresh = imported.first;   // cannot capture one in INFO
  const Json& result = imported.second;
  auto c = fresh->Client();
  CHECK(result["imported"] == 1);
  CHECK(result["refused"] == 3);
  REQUIRE(result["results"].size() == 4);
  CHECK(result["results"][0]["verdict"] == "imported");
  CHECK(result["results"][1]["line"] == 2);
  CHECK(result["results"][1]["verdict"] == "refused");
  CHECK(result["results"][1]["field"] == "/decision_key");
  CHECK(result["results"][2]["line"] == 4);  // the blank line 3 is skipped, not judged
  CHECK(result["results"][2]["verdict"] == "refused");
  CHECK(result["results"][3]["line"] == 5);
  CHECK(result["results"][3]["field"] == "/decision_key");

  // The refused decisions are not served; the edited input has no decision either.
  const std::string kept = lines[0]["material"]["input"]["ticket_id"];
  const std::string edited = lines[1]["material"]["input"]["ticket_id"];
  CHECK(c->Post("/v1/decide", DecideBody(edited, "only"), "application/json")->status == 404);
  CHECK(c->Post("/v1/decide", DecideBody(kept, "only"), "application/json")->status == 200);

  // The CLI lists the refused lines with the file's line numbers and exits 1.
  const std::string file = dir.File("edited.jsonl", body);
  CliResult cli = RunCli({"--url", Url(*fresh), "decisions", "import", "--batch-kib", "1", file},
                         "", {{"NO_COLOR", "1"}});
  INFO(cli.out, cli.err);
  CHECK(cli.exit_code == 1);
  CHECK(cli.out.find("refused 3") != std::string::npos);
  CHECK(cli.out.find("the line was edited") != std::string::npos);
  CHECK(cli.out.find("\n5 ") != std::string::npos);  // line 5, counted across batches
}

TEST_CASE("an import line with a member of the wrong type is refused naming that member") {
  TempDir dir;
  const std::string config = WriteTestConfig(dir, kRules);
  std::map<std::string, Json> recorded;
  std::vector<Json> lines = Lines(RecordRun(dir, config, &recorded));
  REQUIRE(lines.size() == 3);
  std::string body;
  const char* members[] = {"created_at_ms", "expires_at_ms", "step"};
  for (size_t i = 0; i < 3; ++i) {
    Json line = lines[i];
    line[members[i]] = i == 2 ? Json(7) : Json("soon");
    body += line.dump() + "\n";
  }
  auto imported = ImportIntoFreshStore(dir, config, body);
  const Json& result = imported.second;
  CHECK(result["refused"] == 3);
  REQUIRE(result["results"].size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CAPTURE(i);
    CHECK(result["results"][i]["verdict"] == "refused");
    CHECK(result["results"][i]["field"] == std::string("/") + members[i]);
  }
}

TEST_CASE(
    "an import refuses a prompt version its material contradicts, an output its step would "
    "refuse and a decision dated ahead of the daemon's clock") {
  TempDir dir;
  const std::string config = WriteTestConfig(dir, kRules);
  std::map<std::string, Json> recorded;
  std::vector<Json> lines = Lines(RecordRun(dir, config, &recorded));
  REQUIRE(lines.size() == 3);
  Json other_version = lines[0];
  other_version["prompt_version"] = "v2";
  Json null_output = lines[1];
  null_output["output"] = nullptr;
  Json off_schema = lines[2];
  off_schema["output"] = {{"hello", 1}};
  // Dated a year ahead: its outbox event would hold retention back a year.
  Json future = lines[0];
  future["created_at_ms"] = future["created_at_ms"].get<int64_t>() + 365LL * 86'400'000;
  const std::string body = other_version.dump() + "\n" + null_output.dump() + "\n" +
                           off_schema.dump() + "\n" + future.dump() + "\n";

  auto imported = ImportIntoFreshStore(dir, config, body);  // no structured binding: clang 14
  std::unique_ptr<DaemonProcess>& fresh = imported.first;   // cannot capture one in INFO
  const Json& result = imported.second;
  auto c = fresh->Client();
  INFO(result.dump());
  CHECK(result["refused"] == 4);
  CHECK(result["results"][0]["field"] == "/prompt_version");
  CHECK(result["results"][3]["field"] == "/created_at_ms");
  // Lines sent as a form or as text/plain (what a page may post cross-site
  // without a preflight) are 415, judged and stored nowhere.
  for (const char* type : {"text/plain", "application/x-www-form-urlencoded"}) {
    auto wrong = c->Post("/v1/decisions/import", lines[0].dump() + "\n", type);
    REQUIRE(wrong);
    CHECK(wrong->status == 415);
    CHECK(Json::parse(wrong->body)["pointer"] == "header:Content-Type");
  }
  CHECK(result["results"][1]["field"] == "/output");
  CHECK(result["results"][2]["field"].get<std::string>().rfind("/output", 0) == 0);
  // None of them is served.
  for (const Json& line : lines) {
    const std::string ticket = line["material"]["input"]["ticket_id"];
    CHECK(c->Post("/v1/decide", DecideBody(ticket, "only"), "application/json")->status == 404);
  }
}

TEST_CASE("a replay provider serves a recorded run offline, by decision key") {
  TempDir dir;
  const std::string config = WriteTestConfig(dir, kRules);
  std::map<std::string, Json> recorded;
  const std::string jsonl = RecordRun(dir, config, &recorded);
  const std::string file = dir.File("recorded.jsonl", jsonl);

  // The same config, with the provider of the same name answering from the file.
  std::string text = ReadAll(config);
  const std::string scripted = "    type: scripted\n    rules: " + dir.path() + "/rules.yaml\n";
  REQUIRE(text.find(scripted) != std::string::npos);
  text.replace(text.find(scripted), scripted.size(), "    type: replay\n    file: " + file + "\n");
  const std::string replay_config = dir.File("replay.yaml", text);

  std::string err;
  auto daemon = DaemonProcess::Start({replay_config, dir.path() + "/ci", {}, {}}, &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);
  auto c = daemon->Client();
  for (const char* t : {"T-3", "T-1", "T-2"}) {
    Json d = J(c->Post("/v1/decide", DecideBody(t), "application/json"));
    CHECK(d["cache"] == "miss");  // decided again, through the replay provider
    bool found = false;
    for (const auto& [id, rec] : recorded) {
      if (rec["decision_key"] == d["decision_key"]) {
        found = true;
        CHECK(d["output"] == rec["output"]);
        CHECK(d["decision_id"] != id);
      }
    }
    CHECK(found);
    Json full = J(c->Get(("/v1/decisions/" + d["decision_id"].get<std::string>()).c_str()));
    CHECK(full["trace"]["attempts"][0]["finish_reason"] == "replay");
  }
  // A replay of a recorded decision as it was made finds its answer; one
  // with another model or temperature is another setup, which the
  // recording never saw: not its answer under a new name.
  {
    Json d = J(c->Post("/v1/decide", DecideBody("T-1"), "application/json"));
    const std::string path = "/v1/decisions/" + d["decision_id"].get<std::string>() + "/replay";
    Json same = J(c->Post(path, "{}", "application/json"));
    CHECK(same["replayed"]["output"] == d["output"]);
    for (const char* changed : {R"({"model":"demo-9"})", R"({"temperature":0.9})"}) {
      CAPTURE(changed);
      auto other = c->Post(path, changed, "application/json");
      REQUIRE(other);
      const Json o = Json::parse(other->body);
      CHECK((other->status != 200 || o["replayed"]["status"] == "failed"));
      CHECK(other->body.find("has no decision for step triage_ticket") != std::string::npos);
    }
  }
  // An input the run never saw: a clear provider error, and the daemon lives on.
  auto unknown = c->Post("/v1/decide", DecideBody("T-9"), "application/json");
  REQUIRE(unknown);
  CHECK(unknown->status == 503);
  CHECK(unknown->body.find("has no decision for step triage_ticket") != std::string::npos);
  CHECK(c->Get("/healthz")->status == 200);

  // A replay file with an edited line is refused at start-up, naming the line.
  std::vector<Json> lines = Lines(jsonl);
  lines[1]["material"]["model"] = "demo-9";
  const std::string tampered = lines[0].dump() + "\n" + lines[1].dump() + "\n";
  std::string bad = text;
  bad.replace(bad.find(file), file.size(), dir.File("tampered.jsonl", tampered));
  std::string start_err;
  auto refused =
      DaemonProcess::Start({dir.File("bad.yaml", bad), dir.path() + "/bad", {}, {}}, &start_err);
  CHECK(refused == nullptr);
  CHECK(start_err.find("tampered.jsonl:2:") != std::string::npos);
}

TEST_CASE("cost stats add up tokens and USD per call and USD saved per cache hit") {
  TempDir dir;
  const std::string config = WriteTestConfig(dir, kRules,
                                             "prices:\n"
                                             "  demo-1:\n"
                                             "    input_per_mtok: 3\n"
                                             "    output_per_mtok: 15\n");
  std::string err;
  auto daemon = DaemonProcess::Start({config, dir.path() + "/data", {}, {}}, &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);
  auto c = daemon->Client();
  Json a = J(c->Post("/v1/decide", DecideBody("T-1"), "application/json"));
  Json b =
      J(c->Post("/v1/decide", DecideBody("T-2222222222222222222222222222"), "application/json"));
  for (int i = 0; i < 2; ++i) {
    CHECK(J(c->Post("/v1/decide", DecideBody("T-1"), "application/json"))["cache"] == "hit");
  }
  CHECK(J(c->Post("/v1/decide", DecideBody("T-2222222222222222222222222222"),
                  "application/json"))["cache"] == "hit");
  Json ta = J(c->Get(("/v1/decisions/" + a["decision_id"].get<std::string>()).c_str()))["trace"];
  Json tb = J(c->Get(("/v1/decisions/" + b["decision_id"].get<std::string>()).c_str()))["trace"];
  const double cost_a = ta["cost_usd"], cost_b = tb["cost_usd"];
  REQUIRE(cost_a > 0);
  REQUIRE(cost_b > cost_a);  // a longer input, a longer prompt

  auto check_totals = [&](const Json& counts) {
    CHECK(counts["calls"] == 2);
    CHECK(counts["input_tokens"] ==
          ta["input_tokens"].get<int64_t>() + tb["input_tokens"].get<int64_t>());
    CHECK(counts["output_tokens"] ==
          ta["output_tokens"].get<int64_t>() + tb["output_tokens"].get<int64_t>());
    CHECK(counts["spent_usd"].get<double>() == doctest::Approx(cost_a + cost_b));
    CHECK(counts["hits"] == 3);
    CHECK(counts["saved_usd"].get<double>() == doctest::Approx(2 * cost_a + cost_b));
  };
  Json by_step = J(c->Get("/v1/stats/cost?by=step"));
  REQUIRE(by_step["items"].size() == 1);
  CHECK(by_step["items"][0]["step"] == "triage_ticket");
  check_totals(by_step["items"][0]);
  check_totals(by_step["total"]);
  Json by_model = J(c->Get("/v1/stats/cost?by=model"));
  REQUIRE(by_model["items"].size() == 1);
  CHECK(by_model["items"][0]["model"] == "demo-1");
  Json by_day = J(c->Get("/v1/stats/cost?by=day"));
  REQUIRE(by_day["items"].size() == 1);
  CHECK(by_day["items"][0]["day"] == by_day["to_day"]);
  // A range that ended before today holds nothing.
  Json old = J(c->Get("/v1/stats/cost?since=0&until=86400000"));
  CHECK(old["items"].empty());
  CHECK(old["total"]["calls"] == 0);
  CHECK(c->Get("/v1/stats/cost?by=weather")->status == 400);
  CHECK(c->Get("/v1/stats/cost?since=0&until=999999999999999")->status == 400);  // too long
  // A time past year 9999 has no UTC day to name (it printed "-31106-07-04").
  auto far = c->Get("/v1/stats/cost?until=99999999999999999");
  REQUIRE(far);
  CHECK(far->status == 400);
  CHECK(J(far)["pointer"] == "query:until");
  CHECK(c->Get("/v1/stats/cost?until=253402300799999")->status == 200);  // 9999-12-31

  // The CLI prints the same numbers.
  CliResult cli = RunCli({"--url", Url(*daemon), "--json", "cost", "--by", "model"});
  REQUIRE_MESSAGE(cli.exit_code == 0, cli.err);
  check_totals(Json::parse(cli.out)["total"]);
  CliResult table = RunCli({"--url", Url(*daemon), "cost"}, "", {{"NO_COLOR", "1"}});
  CHECK(table.out.find("triage_ticket") != std::string::npos);
  CHECK(table.out.find("TOTAL") != std::string::npos);

  // The counts are durable: a restarted daemon still reports them.
  daemon->Stop();
  daemon = DaemonProcess::Start({config, dir.path() + "/data", {}, {}}, &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);
  check_totals(J(daemon->Client()->Get("/v1/stats/cost"))["total"]);
}

}  // namespace idem::testing
