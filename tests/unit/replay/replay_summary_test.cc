// The counts of a bulk replay (daemon/replay/replay_jobs.h).
#include <doctest/doctest.h>

#include "daemon/core/json_diff.h"
#include "daemon/replay/replay_jobs.h"

namespace idem {
namespace {

ReplayOutcome Changed(const std::string& id, const Json& from, const Json& to, double cost = 0) {
  ReplayOutcome o;
  o.kind = ReplayOutcome::Kind::kChanged;
  o.decision_id = id;
  o.diff = JsonDiff(from, to);
  o.cost_usd = cost;
  return o;
}

ReplayOutcome Of(ReplayOutcome::Kind kind, const std::string& id, const std::string& error = "") {
  ReplayOutcome o;
  o.kind = kind;
  o.decision_id = id;
  o.error = error;
  return o;
}

}  // namespace

TEST_CASE("summary_counts_each_outcome_and_sums_cost_and_tokens") {
  ReplaySummary s;
  s.Add(Of(ReplayOutcome::Kind::kUnchanged, "dec_1"));
  s.Add(Of(ReplayOutcome::Kind::kUnchanged, "dec_2"));
  s.Add(Changed("dec_3", {{"category", "refund"}}, {{"category", "bug"}}, 0.25));
  s.Add(Of(ReplayOutcome::Kind::kFailedValidation, "dec_4", "failed validation"));
  ReplayOutcome err = Of(ReplayOutcome::Kind::kError, "dec_5", "provider down");
  err.input_tokens = 10;
  err.output_tokens = 3;
  err.cost_usd = 0.5;
  err.original_cost_usd = 0.125;
  s.Add(err);
  Json j = s.ToJson();
  CHECK(j["done"] == 5);
  CHECK(j["changed"] == 1);
  CHECK(j["unchanged"] == 2);
  CHECK(j["failed_validation_count"] == 1);
  CHECK(j["failed_validation"] == Json::array({"dec_4"}));
  CHECK(j["errors"] == 1);
  CHECK(j["error_samples"] == Json::parse(R"([{"decision_id":"dec_5","error":"provider down"}])"));
  CHECK(j["cost_usd"].get<double>() == doctest::Approx(0.75));
  CHECK(j["original_cost_usd"].get<double>() == doctest::Approx(0.125));
  CHECK(j["tokens"] == Json{{"input", 10}, {"output", 3}});
}

TEST_CASE("top_pointers_count_each_pointer_once_per_decision_most_first_ties_by_pointer") {
  ReplaySummary s;
  // /category changes in three decisions, /priority in two, /actions/0 is
  // removed in two and /summary added in one.
  s.Add(Changed("a", {{"category", "x"}, {"priority", "low"}},
                {{"category", "y"}, {"priority", "high"}}));
  const Json one = Json::array({1}), none = Json::array();
  s.Add(
      Changed("b", {{"category", "x"}, {"actions", one}}, {{"category", "z"}, {"actions", none}}));
  s.Add(Changed("c", {{"category", "x"}, {"actions", one}, {"priority", "low"}},
                {{"category", "w"}, {"actions", none}, {"priority", "mid"}, {"summary", "s"}}));
  Json top = s.ToJson()["top_changed_pointers"];
  REQUIRE(top.size() == 4);
  CHECK(top[0] == Json{{"pointer", "/category"}, {"count", 3}});
  CHECK(top[1] == Json{{"pointer", "/actions/0"}, {"count", 2}});  // ties: pointer order
  CHECK(top[2] == Json{{"pointer", "/priority"}, {"count", 2}});
  CHECK(top[3] == Json{{"pointer", "/summary"}, {"count", 1}});
  CHECK(s.ToJson()["changed"] == 3);
}

TEST_CASE("a_pointer_changed_twice_in_one_decision_counts_once") {
  ReplaySummary s;
  ReplayOutcome o = Changed("a", {{"x", 1}}, {{"x", 2}});
  o.diff["changed"].push_back(o.diff["changed"][0]);  // the same pointer listed twice
  s.Add(o);
  CHECK(s.ToJson()["top_changed_pointers"][0]["count"] == 1);
}

TEST_CASE("failed_ids_error_samples_and_distinct_pointers_are_bounded") {
  ReplaySummary s;
  for (size_t i = 0; i < ReplaySummary::kMaxFailedIds + 5; ++i) {
    s.Add(Of(ReplayOutcome::Kind::kFailedValidation, "dec_" + std::to_string(i)));
  }
  for (size_t i = 0; i < ReplaySummary::kMaxErrorSamples + 5; ++i) {
    s.Add(Of(ReplayOutcome::Kind::kError, "dec_e" + std::to_string(i), "e"));
  }
  for (size_t i = 0; i < ReplaySummary::kMaxPointers + 7; ++i) {
    s.Add(Changed("c" + std::to_string(i), {{"k" + std::to_string(i), 1}},
                  {{"k" + std::to_string(i), 2}}));
  }
  Json j = s.ToJson();
  CHECK(j["failed_validation_count"] == ReplaySummary::kMaxFailedIds + 5);
  CHECK(j["failed_validation"].size() == ReplaySummary::kMaxFailedIds);
  CHECK(j["errors"] == ReplaySummary::kMaxErrorSamples + 5);
  CHECK(j["error_samples"].size() == ReplaySummary::kMaxErrorSamples);
  CHECK(j["other_pointers"] == 7);
  CHECK(j["top_changed_pointers"].size() == ReplaySummary::kTopPointers);
}

}  // namespace idem
