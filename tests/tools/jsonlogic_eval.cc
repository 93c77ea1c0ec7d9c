// jsonlogic_eval: the daemon's JSONLogic evaluator as a filter, for the
// differential test against json-logic-js (tests/e2e/jsonlogic_diff.mjs).
//
// Reads one JSON object {"rule": ..., "data": ...} per line on stdin and
// writes one line per input on stdout: {"result": <value>} or
// {"error": "<status>"}. A line that is not such an object is an error
// line too, so the output always has as many lines as the input.
#include <iostream>
#include <string>

#include "daemon/core/json.h"
#include "daemon/decide/jsonlogic.h"

namespace {

std::string Answer(const std::string& line) {
  idem::JsonLimits limits;
  limits.max_bytes = 64 << 20;
  limits.max_depth = 512;
  auto parsed = idem::ParseJson(line, limits);
  idem::Json out = idem::Json::object();
  if (!parsed.ok()) {
    out["error"] = "bad input line: " + parsed.status().ToString();
  } else if (!parsed->is_object() || !parsed->contains("rule")) {
    out["error"] = "bad input line: want {\"rule\": ..., \"data\": ...}";
  } else {
    const idem::Json& rule = (*parsed)["rule"];
    const idem::Json data = parsed->value("data", idem::Json());
    auto result = idem::EvalJsonLogic(rule, data);
    if (result.ok()) {
      out["result"] = std::move(result).value();
    } else {
      out["error"] = result.status().ToString();
    }
  }
  return out.dump(-1, ' ', false, idem::Json::error_handler_t::replace);
}

}  // namespace

int main() {
  std::ios::sync_with_stdio(false);
  std::string line;
  while (std::getline(std::cin, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::cout << Answer(line) << '\n';
  }
  std::cout.flush();
  return std::cout.good() ? 0 : 1;
}
