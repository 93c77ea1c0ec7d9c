// ParseJson (daemon/core/json.h) with limits, on arbitrary bytes.
// Invariants: no crash or unbounded recursion; text over max_bytes is
// refused; anything accepted is no deeper than max_depth and serializes
// back to text that parses to an equal value.
#include <cstddef>
#include <cstdint>
#include <string>

#include "daemon/core/json.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

int Depth(const idem::Json& v) {
  int deepest = 0;
  if (v.is_structured()) {
    for (const auto& child : v) deepest = std::max(deepest, Depth(child));
    return deepest + 1;
  }
  return 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  idem::JsonLimits limits;
  limits.max_bytes = 4096;
  limits.max_depth = 16;
  std::string_view text = idem::fuzz::AsView(data, size);
  idem::StatusOr<idem::Json> parsed = idem::ParseJson(text, limits);
  if (size > limits.max_bytes) FUZZ_CHECK(!parsed.ok());
  if (!parsed.ok()) return 0;
  FUZZ_CHECK(Depth(*parsed) <= limits.max_depth);
  // nlohmann's dump is valid JSON (with ensure_ascii off it keeps UTF-8,
  // which ParseJson has already checked).
  std::string again = parsed->dump();
  idem::JsonLimits loose;
  loose.max_bytes = 1 << 20;
  loose.max_depth = limits.max_depth;
  idem::StatusOr<idem::Json> reparsed = idem::ParseJson(again, loose);
  FUZZ_CHECK(reparsed.ok());
  FUZZ_CHECK(*reparsed == *parsed);
  return 0;
}
