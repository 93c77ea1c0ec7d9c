#include "daemon/decide/value_checks.h"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace idem {
namespace {

std::unique_ptr<ValueChecks> MustParse(const std::string& yaml) {
  auto checks = ValueChecks::Parse(yaml, "p.yaml");
  REQUIRE_MESSAGE(checks.ok(), checks.status().ToString());
  return std::move(checks).value();
}

Status ParseError(const std::string& yaml) {
  auto checks = ValueChecks::Parse(yaml, "p.yaml");
  if (checks.ok()) return Internal("unexpectedly loaded");
  return checks.status();
}

Json TriageOutput() {
  return Json::parse(R"({
    "category": "refund",
    "priority": "high",
    "summary": "Customer asks for a refund of a damaged order.",
    "actions": [{"kind": "send_reply",
                 "args": {"ticket_id": "T-123", "text": "We received your refund request."}}]
  })");
}

const Json kTriageInput = {{"ticket_id", "T-123"}, {"text", "my order arrived broken"}};

std::vector<std::string> Names(const std::vector<CheckFailure>& failures) {
  std::vector<std::string> names;
  for (const CheckFailure& f : failures) names.push_back(f.name);
  return names;
}

TEST_CASE("a failing check yields its name, message and pointer; passing checks yield nothing") {
  auto checks = MustParse(R"(
data:
  min: 1
checks:
  - name: amount_positive
    rule: {">": [{"var": "output.amount"}, 0]}
    message: amount must be greater than 0
    pointer: /amount
  - name: amount_at_least_policy_min
    rule: {">=": [{"var": "output.amount"}, {"var": "policy.min"}]}
    message: amount must be at least the minimum
  - name: currency_matches_input
    rule: {"==": [{"var": "output.currency"}, {"var": "input.currency"}]}
    message: currency must be the one asked for
    pointer: /currency
)");
  CHECK(checks->size() == 3);
  CHECK(checks->source() == "p.yaml");
  const Json input = {{"currency", "EUR"}};
  CHECK(checks->Evaluate({{"amount", 5}, {"currency", "EUR"}}, input).empty());

  std::vector<CheckFailure> failures =
      checks->Evaluate({{"amount", 0}, {"currency", "EUR"}}, input);
  REQUIRE(failures.size() == 2);
  CHECK(failures[0].name == "amount_positive");
  CHECK(failures[0].message == "amount must be greater than 0");
  CHECK(failures[0].pointer == "/amount");
  CHECK_FALSE(failures[0].rule_error);
  CHECK(failures[1].name == "amount_at_least_policy_min");
  CHECK(failures[1].pointer == "");

  failures = checks->Evaluate({{"amount", "12.50"}, {"currency", "USD"}}, input);
  REQUIRE(failures.size() == 1);
  CHECK(failures[0].name == "currency_matches_input");
  CHECK(failures[0].pointer == "/currency");
}

TEST_CASE("a rule that cannot be evaluated fails its check and says so") {
  auto checks = MustParse(R"(
checks:
  - name: product_of_nothing
    rule: {"*": []}
    message: product must be positive
    pointer: /x
)");
  std::vector<CheckFailure> failures = checks->Evaluate(Json::object(), Json::object());
  REQUIRE(failures.size() == 1);
  CHECK(failures[0].rule_error);
  CHECK(failures[0].pointer == "/x");
  CHECK(failures[0].message.find("product must be positive") == 0);
  CHECK(failures[0].message.find("could not be evaluated") != std::string::npos);
}

TEST_CASE("the triage policy accepts a good decision and names each problem in a bad one") {
  auto loaded = ValueChecks::Load(IDEM_SOURCE_DIR "/policies/triage_ticket.yaml");
  REQUIRE_MESSAGE(loaded.ok(), loaded.status().ToString());
  const ValueChecks& checks = **loaded;
  CHECK(checks.Evaluate(TriageOutput(), kTriageInput).empty());

  Json no_actions = TriageOutput();
  no_actions["category"] = "question";
  no_actions["priority"] = "low";
  no_actions["actions"] = Json::array();
  CHECK(checks.Evaluate(no_actions, kTriageInput).empty());

  Json empty_summary = TriageOutput();
  empty_summary["summary"] = "";
  std::vector<CheckFailure> failures = checks.Evaluate(empty_summary, kTriageInput);
  REQUIRE(failures.size() == 1);
  CHECK(failures[0].name == "summary_not_empty");
  CHECK(failures[0].message == "summary must not be empty");
  CHECK(failures[0].pointer == "/summary");

  Json long_summary = TriageOutput();
  long_summary["summary"] = std::string(281, 'x');
  CHECK(Names(checks.Evaluate(long_summary, kTriageInput)) ==
        std::vector<std::string>{"summary_at_most_280_chars"});
  long_summary["summary"] = std::string(280, 'x');
  CHECK(checks.Evaluate(long_summary, kTriageInput).empty());

  Json email = TriageOutput();
  email["summary"] = "Write to jane@example.com about the refund.";
  CHECK(Names(checks.Evaluate(email, kTriageInput)) ==
        std::vector<std::string>{"summary_without_email_address"});

  Json low_refund = TriageOutput();
  low_refund["priority"] = "low";
  failures = checks.Evaluate(low_refund, kTriageInput);
  REQUIRE(failures.size() == 1);
  CHECK(failures[0].name == "refund_priority");
  CHECK(failures[0].pointer == "/priority");

  Json unknown_kind = TriageOutput();
  unknown_kind["actions"].push_back(
      {{"kind", "issue_refund"}, {"args", {{"ticket_id", "T-123"}, {"text", "done"}}}});
  CHECK(Names(checks.Evaluate(unknown_kind, kTriageInput)) ==
        std::vector<std::string>{"action_kinds_allowed"});

  Json other_ticket = TriageOutput();
  other_ticket["actions"][0]["args"]["ticket_id"] = "T-999";
  CHECK(Names(checks.Evaluate(other_ticket, kTriageInput)) ==
        std::vector<std::string>{"actions_target_this_ticket"});

  Json empty_reply = TriageOutput();
  empty_reply["actions"][0]["args"]["text"] = "";
  CHECK(Names(checks.Evaluate(empty_reply, kTriageInput)) ==
        std::vector<std::string>{"replies_not_empty"});
}

TEST_CASE("load errors name the file, the line and the pointer") {
  Status unknown_top = ParseError(R"(checks:
  - name: a
    rule: true
    message: m
colour: blue
)");
  CHECK(unknown_top.code() == Code::kInvalidArgument);
  CHECK(unknown_top.message().find("p.yaml:5: /colour:") != std::string::npos);
  CHECK(unknown_top.field() == "/colour");

  Status unknown_in_check = ParseError(R"(checks:
  - name: a
    rule: true
    message: m
    severity: high
)");
  CHECK(unknown_in_check.message().find("p.yaml:5: /checks/0/severity:") != std::string::npos);

  Status missing_message = ParseError(R"(checks:
  - name: a
    rule: true
)");
  // The line of the object the key is missing from.
  CHECK(missing_message.message().find("p.yaml:2: /checks/0/message: missing required key") !=
        std::string::npos);

  Status bad_operator = ParseError(R"(checks:
  - name: ok
    rule: true
    message: m
  - name: calls_a_method
    rule:
      if:
        - false
        - {"method": [{"var": "output.s"}, "toUpperCase"]}
        - true
    message: m
)");
  CHECK(bad_operator.code() == Code::kInvalidArgument);
  CHECK(bad_operator.field() == "/checks/1/rule/if/1");
  CHECK(bad_operator.message().find("p.yaml:9: /checks/1/rule/if/1:") != std::string::npos);
  CHECK(bad_operator.message().find("unknown operator \"method\"") != std::string::npos);

  Status duplicate = ParseError(R"(checks:
  - name: same
    rule: true
    message: m
  - name: same
    rule: true
    message: m
)");
  CHECK(duplicate.message().find("p.yaml:5: /checks/1/name:") != std::string::npos);
  CHECK(duplicate.message().find("duplicate") != std::string::npos);

  CHECK(ParseError("checks: []\n").field() == "/checks");
  CHECK(ParseError("").code() == Code::kInvalidArgument);
  CHECK(ParseError("checks:\n  - name: Bad-Name\n    rule: 1\n    message: m\n").field() ==
        "/checks/0/name");
  CHECK(ParseError("checks:\n  - name: a\n    rule: 1\n    message: m\n    pointer: x\n").field() ==
        "/checks/0/pointer");
  CHECK(ParseError("data: [1]\nchecks:\n  - name: a\n    rule: 1\n    message: m\n").field() ==
        "/data");
  CHECK(ParseError("checks: [\n").message().find("p.yaml") == 0);
}

TEST_CASE("Load reads a file and reports one that is missing") {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      ("idem_value_checks_" +
       std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "p.yaml").string();
  {
    std::ofstream out(path);
    out << "checks:\n  - name: a\n    rule: {\"var\": \"output.ok\"}\n    message: not ok\n";
  }
  auto checks = ValueChecks::Load(path);
  REQUIRE_MESSAGE(checks.ok(), checks.status().ToString());
  CHECK((*checks)->source() == path);
  CHECK((*checks)->Evaluate({{"ok", true}}, nullptr).empty());
  CHECK((*checks)->Evaluate({{"ok", false}}, nullptr).size() == 1);

  auto missing = ValueChecks::Load((dir / "absent.yaml").string());
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == Code::kInvalidArgument);
  CHECK(missing.status().message().find("absent.yaml") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("one ValueChecks evaluates on many threads at once") {
  auto checks = MustParse(R"(
checks:
  - name: positive
    rule: {">": [{"var": "output.n"}, 0]}
    message: n must be positive
)");
  std::atomic<int> right{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const int n = (i % 2 == 0) ? t + 1 : -t;
        const bool should_fail = n <= 0;
        if (checks->Evaluate({{"n", n}}, nullptr).empty() != should_fail) ++right;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  CHECK(right.load() == 800);
}

}  // namespace
}  // namespace idem
