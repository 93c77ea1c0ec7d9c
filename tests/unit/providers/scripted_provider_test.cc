#include "providers/scripted/scripted_provider.h"

#include <doctest/doctest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "daemon/config/config.h"
#include "daemon/core/http_client.h"
#include "daemon/core/json_schema.h"
#include "providers/registry.h"

namespace idem {
namespace {

std::unique_ptr<ScriptedProvider> MustBuild(const std::string& yaml, Env& env) {
  auto provider = ScriptedProvider::FromYaml(yaml, "rules.yaml", env);
  REQUIRE_MESSAGE(provider.ok(), provider.status().ToString());
  return std::move(provider).value();
}

ProviderRequest Request(Json input, std::string step = "triage_ticket") {
  ProviderRequest r;
  r.step = std::move(step);
  r.model = "demo-1";
  r.prompt = "Ticket: something";
  r.input = std::move(input);
  return r;
}

const char* kTriageRules = R"(
rules:
  - name: refund
    match:
      step: triage_ticket
      input:
        text: {contains: refund, ignore_case: true}
    output: '{"category": "refund", "ticket": "{{input.ticket_id}}", "echo": "{{input.text}}"}'
  - name: bug
    match:
      step: triage_ticket
      input:
        /text: {regex: "crash|bug", ignore_case: true}
    output: '{"category": "bug"}'
default:
  output: '{"category": "question"}'
)";

TEST_CASE("the first matching rule answers, in file order") {
  FakeEnv env;
  auto p = MustBuild(kTriageRules, env);
  auto r = p->Complete(Request({{"text", "A REFUND for a crash, please"}, {"ticket_id", "T-1"}}));
  REQUIRE(r.ok());
  CHECK(r->output["category"] == "refund");

  r = p->Complete(Request({{"text", "the app has a Bug"}}));
  REQUIRE(r.ok());
  CHECK(r->output["category"] == "bug");
}

TEST_CASE("no matching rule falls back to the default answer") {
  FakeEnv env;
  auto p = MustBuild(kTriageRules, env);
  auto r = p->Complete(Request({{"text", "how do I log in?"}}));
  REQUIRE(r.ok());
  CHECK(r->output["category"] == "question");

  // Step conditions are exact: the same text for another step is unmatched.
  r = p->Complete(Request({{"text", "refund"}}, "other_step"));
  REQUIRE(r.ok());
  CHECK(r->output["category"] == "question");
}

TEST_CASE("without a default an unmatched call is FailedPrecondition") {
  FakeEnv env;
  auto p = MustBuild("rules: [{match: {step: x}, output: '{}'}]\n", env);
  auto r = p->Complete(Request({{"text", "hi"}}));
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == Code::kFailedPrecondition);
  CHECK_FALSE(r.status().retryable());
}

TEST_CASE("the same request always gets the same answer") {
  FakeEnv env;
  auto p = MustBuild(kTriageRules, env);
  ProviderRequest req = Request({{"text", "refund me"}, {"ticket_id", "T-9"}});
  auto first = p->Complete(req);
  REQUIRE(first.ok());
  for (int i = 0; i < 5; ++i) {
    auto again = p->Complete(req);
    REQUIRE(again.ok());
    CHECK(again->raw_text == first->raw_text);
    CHECK(again->output == first->output);
  }
}

TEST_CASE("output templates render input values escaped for a JSON string") {
  FakeEnv env;
  auto p = MustBuild(kTriageRules, env);
  auto r = p->Complete(Request({{"text", "refund \"now\"\n\\ <b>&"}, {"ticket_id", "T-7"}}));
  REQUIRE(r.ok());
  REQUIRE(r->output.is_object());
  CHECK(r->output["ticket"] == "T-7");
  CHECK(r->output["echo"] == "refund \"now\"\n\\ <b>&");
  CHECK(r->finish_reason == "stop");
}

TEST_CASE("templates see step, model, numbers and the whole input as JSON") {
  FakeEnv env;
  auto p = MustBuild(R"(
default:
  output: '{"step": "{{step}}", "model": "{{model}}", "n": {{input.n}}, "all": {{{input_json}}},
            "tags": [{{#input.tags}}"{{.}}",{{/input.tags}} "end"]}'
)",
                     env);
  auto r = p->Complete(Request({{"n", 42}, {"tags", {"a", "b"}}}));
  REQUIRE(r.ok());
  REQUIRE_MESSAGE(r->output.is_object(), r->raw_text);
  CHECK(r->output["step"] == "triage_ticket");
  CHECK(r->output["model"] == "demo-1");
  CHECK(r->output["n"] == 42);
  CHECK(r->output["all"] == Json{{"n", 42}, {"tags", {"a", "b"}}});
  CHECK(r->output["tags"] == Json{"a", "b", "end"});
}

TEST_CASE("an output written as a YAML mapping is the JSON value, with templated strings") {
  FakeEnv env;
  auto p = MustBuild(R"(
default:
  output:
    category: refund
    count: 2
    args: {ticket_id: "{{input.id}}", text: "said: {{input.text}}"}
)",
                     env);
  auto r = p->Complete(Request({{"id", "T-3"}, {"text", "a \"quote\""}}));
  REQUIRE(r.ok());
  CHECK(r->output["category"] == "refund");
  CHECK(r->output["count"] == 2);
  CHECK(r->output["args"]["ticket_id"] == "T-3");
  CHECK(r->output["args"]["text"] == "said: a \"quote\"");
  CHECK(Json::parse(r->raw_text) == r->output);
}

TEST_CASE("output that is not JSON comes back as raw text with a null output") {
  FakeEnv env;
  auto p =
      MustBuild("default: {output: 'Sure! Here is your JSON: {', finish_reason: length}\n", env);
  auto r = p->Complete(Request(Json::object()));
  REQUIRE(r.ok());
  CHECK(r->raw_text == "Sure! Here is your JSON: {");
  CHECK(r->output.is_null());
  CHECK(r->finish_reason == "length");
}

TEST_CASE("equals, exists and JSON pointer conditions select rules") {
  FakeEnv env;
  auto p = MustBuild(R"(
rules:
  - match: {input: {/meta/lang: {equals: DE, ignore_case: true}}}
    output: '"german"'
  - match: {input: {/priority: {equals: 3}}}
    output: '"three"'
  - match: {input: {urgent: {exists: true}}}
    output: '"urgent"'
  - match: {input: {/a~1b: {equals: true}}}
    output: '"slash"'
default: {output: '"none"'}
)",
                     env);
  auto answer = [&](Json input) {
    auto r = p->Complete(Request(std::move(input)));
    REQUIRE(r.ok());
    return r->output;
  };
  CHECK(answer({{"meta", {{"lang", "de"}}}}) == "german");
  CHECK(answer({{"priority", 3}}) == "three");
  CHECK(answer({{"priority", "3"}}) == "none");  // JSON equality: types matter
  CHECK(answer({{"urgent", false}}) == "urgent");
  CHECK(answer({{"a/b", true}}) == "slash");
  CHECK(answer({{"meta", "not an object"}}) == "none");
}

TEST_CASE("repair conditions tell first tries from repair attempts") {
  FakeEnv env;
  auto p = MustBuild(R"(
rules:
  - match: {repair: false}
    output: 'not json'
  - match: {repair: true}
    output: '{"fixed": true}'
)",
                     env);
  ProviderRequest req = Request(Json::object());
  auto first = p->Complete(req);
  REQUIRE(first.ok());
  CHECK(first->output.is_null());
  req.repair_feedback = "/: must be object";
  auto repaired = p->Complete(req);
  REQUIRE(repaired.ok());
  CHECK(repaired->output["fixed"] == true);
}

TEST_CASE("calls counts every call, answered or failed") {
  FakeEnv env;
  auto p = MustBuild(R"(
rules:
  - match: {input: {fail: {exists: true}}}
    fail: {code: internal}
default: {output: '{}'}
)",
                     env);
  CHECK(p->calls() == 0);
  CHECK(p->Complete(Request(Json::object())).ok());
  CHECK_FALSE(p->Complete(Request({{"fail", 1}})).ok());
  CHECK(p->Complete(Request(Json::object())).ok());
  CHECK(p->calls() == 3);
}

TEST_CASE("fail rules return the scripted code, message and retryable bit") {
  FakeEnv env;
  auto p = MustBuild(R"(
rules:
  - match: {input: {kind: {equals: down}}}
    fail: {code: unavailable, message: "provider overloaded"}
  - match: {input: {kind: {equals: bad}}}
    fail: {code: invalid_argument}
  - match: {input: {kind: {equals: quota}}}
    fail: {code: resource_exhausted, retryable: false}
)",
                     env);
  auto down = p->Complete(Request({{"kind", "down"}}));
  CHECK(down.status().code() == Code::kUnavailable);
  CHECK(down.status().message() == "provider overloaded");
  CHECK(down.status().retryable());

  auto bad = p->Complete(Request({{"kind", "bad"}}));
  CHECK(bad.status().code() == Code::kInvalidArgument);
  CHECK_FALSE(bad.status().retryable());

  auto quota = p->Complete(Request({{"kind", "quota"}}));
  CHECK(quota.status().code() == Code::kResourceExhausted);
  CHECK_FALSE(quota.status().retryable());
}

TEST_CASE("a rule with times answers only its first N matching calls") {
  FakeEnv env;
  auto p = MustBuild(R"(
rules:
  - times: 2
    fail: {code: unavailable}
default: {output: '{"ok": true}'}
)",
                     env);
  CHECK(p->Complete(Request(Json::object())).status().code() == Code::kUnavailable);
  CHECK(p->Complete(Request(Json::object())).status().code() == Code::kUnavailable);
  auto third = p->Complete(Request(Json::object()));
  REQUIRE(third.ok());
  CHECK(third->output["ok"] == true);
  CHECK(p->calls() == 3);
}

TEST_CASE("a delay sleeps on the Env clock, and past the timeout is DeadlineExceeded") {
  FakeEnv env;
  auto p = MustBuild("default: {output: '{}', delay_ms: 1500}\n", env);
  ProviderRequest req = Request(Json::object());
  req.timeout_ms = 30'000;
  REQUIRE(p->Complete(req).ok());
  CHECK(env.total_slept_ms() == 1500);

  req.timeout_ms = 1000;
  auto late = p->Complete(req);
  CHECK(late.status().code() == Code::kDeadlineExceeded);
  CHECK(late.status().retryable());
  CHECK(env.total_slept_ms() == 2500);
}

TEST_CASE("token counts are about a quarter of the bytes") {
  FakeEnv env;
  auto p = MustBuild("default: {output: '{\"a\": \"12345678\"}'}\n", env);
  ProviderRequest req = Request(Json::object());
  req.system_prompt = std::string(40, 's');
  req.prompt = std::string(60, 'p');
  auto r = p->Complete(req);
  REQUIRE(r.ok());
  CHECK(r->input_tokens == 25);
  CHECK(r->output_tokens == 5);  // 17 bytes, rounded up
}

TEST_CASE("regex conditions only look at the first 4 KiB of a value") {
  FakeEnv env;
  auto p = MustBuild(R"(
rules:
  - match: {input: {text: {regex: "needle"}}}
    output: '"found"'
default: {output: '"missing"'}
)",
                     env);
  auto r = p->Complete(Request({{"text", std::string(5000, 'x') + "needle"}}));
  REQUIRE(r.ok());
  CHECK(r->output == "missing");
  r = p->Complete(Request({{"text", std::string(100, 'x') + "needle"}}));
  REQUIRE(r.ok());
  CHECK(r->output == "found");
}

TEST_CASE("malformed rules are errors naming the file, line and pointer") {
  FakeEnv env;
  struct Case {
    const char* yaml;
    const char* field;
    const char* text;
  };
  const Case cases[] = {
      {"rules:\n  - output: '{}'\n    colour: red\n", "/rules/0/colour", "rules.yaml:3: "},
      {"rules:\n  - match: {input: {x: {regex: '(['}}}\n    output: '{}'\n",
       "/rules/0/match/input/x/regex", "not a valid regular expression"},
      {"rules:\n  - match: {input: {x: {}}}\n    output: '{}'\n", "/rules/0/match/input/x",
       "needs equals, contains, regex or exists"},
      {"rules:\n  - match: {step: a}\n", "/rules/0", "needs exactly one of output and fail"},
      {"default: {output: '{{#open}}'}\n", "/default/output", "not a valid mustache template"},
      {"default: {fail: {code: teapot}}\n", "/default/fail/code", "must be one of"},
      {"rules:\n  - match: {input: {/a~2: {exists: true}}}\n    output: '{}'\n",
       "/rules/0/match/input/~1a~02", "not a JSON pointer"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.yaml);
    auto p = ScriptedProvider::FromYaml(c.yaml, "rules.yaml", env);
    REQUIRE_FALSE(p.ok());
    CHECK(p.status().code() == Code::kInvalidArgument);
    CHECK(p.status().field() == c.field);
    CHECK(p.status().message().find(c.text) != std::string::npos);
  }
}

TEST_CASE("concurrent calls are all answered and all counted") {
  FakeEnv env;
  auto p = MustBuild(kTriageRules, env);
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 100; ++i) {
        auto r = p->Complete(Request({{"text", i % 2 ? "refund" : "crash"}}));
        if (!r.ok() || r->output["category"] != (i % 2 ? "refund" : "bug")) ++wrong;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(wrong.load() == 0);
  CHECK(p->calls() == 400);
}

TEST_CASE("the demo rules triage refunds, bugs and questions") {
  FakeEnv env;
  ProviderConfig config;
  config.name = "demo";
  config.type = "scripted";
  config.rules_path = IDEM_SOURCE_DIR "/config/examples/demo.rules.yaml";
  auto made = ScriptedProvider::Create(config, env);
  REQUIRE_MESSAGE(made.ok(), made.status().ToString());
  auto& p = *made;

  auto refund = p->Complete(Request({{"ticket_id", "T-42"}, {"text", "I want a Refund"}}));
  REQUIRE(refund.ok());
  CHECK(refund->output["category"] == "refund");
  CHECK(refund->output["priority"] == "high");
  REQUIRE(refund->output["actions"].size() == 1);
  CHECK(refund->output["actions"][0]["kind"] == "send_reply");
  CHECK(refund->output["actions"][0]["args"]["ticket_id"] == "T-42");
  CHECK(refund->output["actions"][0]["args"]["text"].is_string());

  auto bug = p->Complete(Request({{"ticket_id", "T-43"}, {"text", "The app crashes on start"}}));
  REQUIRE(bug.ok());
  CHECK(bug->output["category"] == "bug");
  CHECK(bug->output["actions"].empty());

  auto question = p->Complete(Request({{"ticket_id", "T-44"}, {"text", "Where is my order?"}}));
  REQUIRE(question.ok());
  CHECK(question->output["category"] == "question");
}

TEST_CASE("the demo rules' answers satisfy the triage output schema of the default config") {
  auto config = LoadConfig(IDEM_SOURCE_DIR "/config/idem.yaml");
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());
  auto schema = JsonSchema::Create(config->steps.at("triage_ticket").output_schema);
  REQUIRE(schema.ok());
  FakeEnv env;
  auto http = MakeCurlHttpClient();
  auto provider = MakeProvider(config->providers.at("demo"), *http, env);
  REQUIRE_MESSAGE(provider.ok(), provider.status().ToString());
  CHECK((*provider)->type() == "scripted");
  for (const char* text : {"refund please", "it crashed", "hello", "\"quoted\" \\ refund"}) {
    CAPTURE(text);
    auto r = (*provider)->Complete(Request({{"ticket_id", "T-1"}, {"text", text}}));
    REQUIRE(r.ok());
    Status valid = (*schema)->Validate(r->output);
    CHECK_MESSAGE(valid.ok(), valid.ToString());
  }
}

TEST_CASE("the registry refuses an unknown provider type and passes scripted errors through") {
  FakeEnv env;
  auto http = MakeCurlHttpClient();
  ProviderConfig config;
  config.name = "x";
  config.type = "gemini";
  auto unknown = MakeProvider(config, *http, env);
  CHECK(unknown.status().code() == Code::kInvalidArgument);

  config.type = "scripted";
  config.rules_path = "/nonexistent/rules.yaml";
  auto missing = MakeProvider(config, *http, env);
  CHECK(missing.status().code() == Code::kInvalidArgument);
  CHECK(missing.status().message().find("/nonexistent/rules.yaml") != std::string::npos);
}

}  // namespace
}  // namespace idem

namespace idem {

TEST_CASE("a_prompt_condition_matches_the_rendered_prompt_text") {
  FakeEnv env;
  auto p = MustBuild(R"(rules:
  - match: {prompt: {contains: VERSION-2}}
    output: '{"v": 2}'
  - match: {prompt: {regex: "^Ticket: "}}
    output: '{"v": 1}'
default:
  output: '{"v": 0}'
)",
                     env);
  ProviderRequest r = Request({{"text", "x"}});
  r.prompt = "VERSION-2 Ticket: x";
  CHECK(p->Complete(r)->output["v"] == 2);
  r.prompt = "Ticket: x";
  CHECK(p->Complete(r)->output["v"] == 1);
  r.prompt = "something else";
  CHECK(p->Complete(r)->output["v"] == 0);
  // A prompt condition needs one of the tests, like an input condition.
  CHECK_FALSE(ScriptedProvider::FromYaml("rules:\n  - match: {prompt: {}}\n    output: '{}'\n",
                                         "rules.yaml", env)
                  .ok());
}

}  // namespace idem
