// Replaying a decision (issue 11): decide again with the recorded input
// against another model, see the structural diff, leave the cache alone
// unless promoted (and then audit it).
#include <doctest/doctest.h>

#include "tests/integration/harness.h"

namespace idem::testing {
namespace {

// demo-1 calls every ticket a refund; demo-2 calls it a bug and drops the
// reply; demo-3 answers something the schema refuses.
const char* kRules = R"(rules:
  - match: {model: demo-2}
    output: '{"category":"bug","priority":"high","summary":"s","actions":[]}'
  - match: {model: demo-3}
    output: '{"category":"nonsense"}'
default:
  output: '{"category":"refund","priority":"high","summary":"s","actions":[{"kind":"send_reply","args":{"ticket_id":"{{input.ticket_id}}","text":"ok"}}]}'
)";

Json J(const httplib::Result& r) {
  REQUIRE(r);
  return Json::parse(r->body);
}

}  // namespace

TEST_CASE("a replay against another model shows the diff and leaves the cache alone") {
  TempDir dir;
  std::string config = WriteTestConfig(dir, kRules);
  std::string err;
  auto daemon = DaemonProcess::Start({config, dir.path() + "/data", {}, {}}, &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);
  auto c = daemon->Client();
  const std::string decide = R"({"step":"triage_ticket","input":{"ticket_id":"T-5","text":"x"}})";
  Json first = J(c->Post("/v1/decide", decide, "application/json"));
  const std::string id = first["decision_id"];

  auto r = c->Post(("/v1/decisions/" + id + "/replay").c_str(), R"({"model":"demo-2"})",
                   "application/json");
  REQUIRE(r);
  REQUIRE_MESSAGE(r->status == 200, r->body);
  Json replay = Json::parse(r->body);
  CHECK(replay["original"]["output"]["category"] == "refund");
  CHECK(replay["replayed"]["output"]["category"] == "bug");
  CHECK(replay["replayed"]["model"] == "demo-2");
  CHECK(replay["replayed"]["decision_id"] != id);
  bool category_changed = false;
  for (const Json& ch : replay["diff"]["changed"]) {
    if (ch["pointer"] == "/category") {
      category_changed = ch["from"] == "refund" && ch["to"] == "bug";
    }
  }
  CHECK(category_changed);
  REQUIRE(replay["diff"]["removed"].size() == 1);
  CHECK(replay["diff"]["removed"][0]["pointer"] == "/actions/0");

  // The cache still answers with the original.
  Json cached = J(c->Post("/v1/decide", decide, "application/json"));
  CHECK(cached["cache"] == "hit");
  CHECK(cached["decision_id"] == id);
  CHECK(cached["output"]["category"] == "refund");

  // A model whose answers fail validation is a finding, not an error.
  Json failed = J(c->Post(("/v1/decisions/" + id + "/replay").c_str(), R"({"model":"demo-3"})",
                          "application/json"));
  CHECK(failed["replayed"]["status"] == "failed");
  CHECK(failed["replayed"]["error"].get<std::string>().find("validation") != std::string::npos);
  CHECK_FALSE(failed.contains("promoted"));  // not asked
  // Asked to promote a replay that found no valid output: it says it did not.
  Json not_promoted = J(c->Post(("/v1/decisions/" + id + "/replay").c_str(),
                                R"({"model":"demo-3","promote":true})", "application/json"));
  CHECK(not_promoted["replayed"]["status"] == "failed");
  CHECK(not_promoted["promoted"] == false);
  CHECK(c->Post(("/v1/decisions/" + id + "/replay").c_str(), R"({"prompt_version":"v9"})",
                "application/json")
            ->status == 409);
  CHECK(c->Post("/v1/decisions/dec_nope/replay", "{}", "application/json")->status == 404);

  // The key covers the temperature and prompt version it was made with: a
  // replay at another cannot be promoted; naming its own version can.
  auto hot = c->Post(("/v1/decisions/" + id + "/replay").c_str(),
                     R"({"model":"demo-2","temperature":0.9,"promote":true})", "application/json");
  REQUIRE(hot);
  CHECK(hot->status == 409);
  CHECK(Json::parse(hot->body)["pointer"] == "/promote");
  CHECK(Json::parse(hot->body)["detail"].get<std::string>().find("temperature") !=
        std::string::npos);
  CHECK(J(c->Post("/v1/decide", decide, "application/json"))["decision_id"] == id);

  // Promote: the replayed answer becomes the cached decision, audited.
  Json promoted =
      J(c->Post(("/v1/decisions/" + id + "/replay").c_str(),
                R"({"model":"demo-2","prompt_version":"v1","promote":true})", "application/json"));
  CHECK(promoted["promoted"] == true);
  Json now = J(c->Post("/v1/decide", decide, "application/json"));
  CHECK(now["cache"] == "hit");
  CHECK(now["output"]["category"] == "bug");
  CHECK(now["decision_id"] == promoted["replayed"]["decision_id"]);
  CHECK(daemon->Stop() == 0);
}

TEST_CASE("a decision whose prompt version is no longer loaded cannot be promoted from a replay") {
  TempDir dir;
  std::string config = WriteTestConfig(dir, kRules);
  std::string err;
  auto daemon = DaemonProcess::Start({config, dir.path() + "/data", {}, {}}, &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);
  const std::string decide = R"({"step":"triage_ticket","input":{"ticket_id":"T-7","text":"x"}})";
  const std::string id =
      J(daemon->Client()->Post("/v1/decide", decide, "application/json"))["decision_id"];
  daemon.reset();
  // v2 is the prompt now, and v1 is not kept under prompts:.
  std::string text = ReadFile(config);
  const std::string v1 = "      version: v1\n";
  REQUIRE(text.find(v1) != std::string::npos);
  text.replace(text.find(v1), v1.size(), "      version: v2\n");
  const std::string v2_config = dir.File("v2.yaml", text);
  daemon = DaemonProcess::Start({v2_config, dir.path() + "/data", {}, {}}, &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);
  auto c = daemon->Client();
  auto promote = c->Post(("/v1/decisions/" + id + "/replay").c_str(), R"({"promote":true})",
                         "application/json");
  REQUIRE(promote);
  CHECK(promote->status == 409);
  CHECK(Json::parse(promote->body)["pointer"] == "/promote");
  // A replay without promote still runs (with the version loaded) and says so.
  Json replay = J(c->Post(("/v1/decisions/" + id + "/replay").c_str(), "{}", "application/json"));
  CHECK(replay["replayed"]["prompt_version"] == "v2");
}

}  // namespace idem::testing
