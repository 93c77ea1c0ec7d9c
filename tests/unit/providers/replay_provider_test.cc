#include "providers/replay/replay_provider.h"

#include <doctest/doctest.h>

#include "daemon/core/identity.h"

namespace idem {
namespace {

// One exported decision line for `input` with `output`.
Json Line(const Json& input, const Json& output) {
  DecisionKeyParts parts;
  parts.step = "triage";
  parts.provider = "llm";
  parts.model = "m-1";
  parts.prompt_version = "v1";
  parts.prompt_hash = "ph";
  parts.input = input;
  auto key = ComputeDecisionKey(parts);
  REQUIRE(key.ok());
  return {{"decision_id", "dec_00000000000000000000000000000001"},
          {"decision_key", key->key},
          {"step", "triage"},
          {"material", Json::parse(key->canonical)},
          {"output", output},
          {"trace", Json::object()}};
}

ProviderRequest RequestFor(const Json& line) {
  ProviderRequest r;
  r.step = "triage";
  r.model = "m-1";
  r.decision_key = line["decision_key"];
  return r;
}

}  // namespace

TEST_CASE("the replay provider answers a call with the recorded output of its decision key") {
  Json a = Line({{"t", "a"}}, {{"category", "refund"}});
  Json b = Line({{"t", "b"}}, {{"category", "bug"}});
  auto p = ReplayProvider::FromText(a.dump() + "\n\n" + b.dump() + "\r\n", "run.jsonl");
  REQUIRE_MESSAGE(p.ok(), p.status().ToString());
  CHECK((*p)->size() == 2);
  CHECK((*p)->type() == "replay");
  auto ra = (*p)->Complete(RequestFor(a));
  REQUIRE(ra.ok());
  CHECK(ra->output == a["output"]);
  CHECK(ra->raw_text == a["output"].dump());
  CHECK(ra->finish_reason == "replay");
  CHECK(ra->input_tokens == 0);
  auto rb = (*p)->Complete(RequestFor(b));
  REQUIRE(rb.ok());
  CHECK(rb->output["category"] == "bug");
}

TEST_CASE("the first line for a key wins, as an export lists the newest first") {
  Json newer = Line({{"t", "a"}}, {{"category", "newer"}});
  Json older = Line({{"t", "a"}}, {{"category", "older"}});
  auto p = ReplayProvider::FromText(newer.dump() + "\n" + older.dump() + "\n", "run.jsonl");
  REQUIRE(p.ok());
  CHECK((*p)->size() == 1);
  CHECK((*p)->Complete(RequestFor(newer))->output["category"] == "newer");
}

TEST_CASE("a key the recording does not hold is a provider error that names it, not a crash") {
  Json a = Line({{"t", "a"}}, {{"category", "refund"}});
  auto p = ReplayProvider::FromText(a.dump() + "\n", "run.jsonl");
  REQUIRE(p.ok());
  ProviderRequest r = RequestFor(Line({{"t", "z"}}, Json::object()));
  auto answer = (*p)->Complete(r);
  REQUIRE_FALSE(answer.ok());
  CHECK(answer.status().code() == Code::kFailedPrecondition);
  CHECK_FALSE(answer.status().retryable());
  CHECK(answer.status().message().find(r.decision_key) != std::string::npos);
  CHECK(answer.status().message().find("run.jsonl") != std::string::npos);
}

TEST_CASE("a replay file with an edited line is refused whole, naming the line") {
  Json a = Line({{"t", "a"}}, {{"category", "refund"}});
  Json edited = Line({{"t", "b"}}, {{"category", "bug"}});
  edited["material"]["input"]["t"] = "c";  // the key no longer matches
  auto p = ReplayProvider::FromText(a.dump() + "\n" + edited.dump() + "\n", "run.jsonl");
  REQUIRE_FALSE(p.ok());
  CHECK(p.status().message().find("run.jsonl:2:") == 0);
  CHECK(p.status().message().find("/decision_key") != std::string::npos);

  auto junk = ReplayProvider::FromText(a.dump() + "\n{\"decision_key\":\"x\"}\n", "run.jsonl");
  REQUIRE_FALSE(junk.ok());
  CHECK(junk.status().message().find("run.jsonl:2: not a decision") == 0);
  auto not_json = ReplayProvider::FromText("nope\n", "run.jsonl");
  REQUIRE_FALSE(not_json.ok());
  CHECK(not_json.status().message().find("run.jsonl:1:") == 0);
}

TEST_CASE("the registry makes a replay provider from its file") {
  ProviderConfig c;
  c.name = "llm";
  c.type = "replay";
  c.file_path = "/nonexistent/run.jsonl";
  auto p = ReplayProvider::Create(c);
  REQUIRE_FALSE(p.ok());
  CHECK(p.status().message().find("/nonexistent/run.jsonl") != std::string::npos);
}

}  // namespace idem
