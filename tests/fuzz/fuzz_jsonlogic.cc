// JSONLogic (daemon/decide/jsonlogic.h): a rule and its data, both
// untrusted JSON, split by a "\n----\n" line. Invariants: no crash, no
// runaway recursion or work (the limits hold: every evaluation ends), a
// rule that passes CheckJsonLogicRule never fails as "unknown operator"
// when evaluated, and evaluation is deterministic.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "daemon/core/json.h"
#include "daemon/decide/jsonlogic.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view rule_text, data_text;
  idem::fuzz::SplitTwo(idem::fuzz::AsView(data, size), rule_text, data_text);
  idem::JsonLimits json_limits;
  json_limits.max_bytes = 4096;
  json_limits.max_depth = 32;
  idem::StatusOr<idem::Json> rule = idem::ParseJson(rule_text, json_limits);
  if (!rule.ok()) return 0;
  idem::Json input = nullptr;
  if (!data_text.empty()) {
    idem::StatusOr<idem::Json> parsed = idem::ParseJson(data_text, json_limits);
    if (!parsed.ok()) return 0;
    input = std::move(*parsed);
  }
  idem::JsonLogicLimits limits;
  limits.max_depth = 24;
  limits.max_operations = 20'000;
  (void)idem::CheckJsonLogicRule(*rule, limits);
  idem::StatusOr<idem::Json> first = idem::EvalJsonLogic(*rule, input, limits);
  idem::StatusOr<idem::Json> second = idem::EvalJsonLogic(*rule, input, limits);
  FUZZ_CHECK(first.ok() == second.ok());
  if (first.ok()) {
    // NaN is the one value not equal to itself.
    FUZZ_CHECK(*first == *second || first->dump() == second->dump());
    (void)idem::JsonLogicTruthy(*first);
  }
  return 0;
}
