// JCS, RFC 8785 (CanonicalJson in daemon/core/json.h), on whatever
// ParseJson accepts. Invariants: the canonical text parses back to a value
// equal to the input (numbers compared as the doubles JCS makes of them),
// and canonicalizing it again gives the same bytes (idempotent).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "daemon/core/json.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using idem::Json;

// Equality under JCS's number model: every number is an IEEE-754 double.
bool SameAsDoubles(const Json& a, const Json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  if (a.type() != b.type()) return false;
  if (a.is_object()) {
    if (a.size() != b.size()) return false;
    for (auto it = a.begin(); it != a.end(); ++it) {
      auto other = b.find(it.key());
      if (other == b.end() || !SameAsDoubles(it.value(), *other)) return false;
    }
    return true;
  }
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!SameAsDoubles(a[i], b[i])) return false;
    }
    return true;
  }
  return a == b;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  idem::JsonLimits limits;
  limits.max_bytes = 4096;
  limits.max_depth = 16;
  idem::StatusOr<Json> parsed = idem::ParseJson(idem::fuzz::AsView(data, size), limits);
  if (!parsed.ok()) return 0;
  idem::StatusOr<std::string> canonical = idem::CanonicalJson(*parsed);
  if (!canonical.ok()) {
    // Only a number JSON cannot hold (a literal too large for a double)
    // may be refused.
    return 0;
  }
  idem::JsonLimits loose;
  loose.max_bytes = 1 << 20;
  loose.max_depth = limits.max_depth;
  idem::StatusOr<Json> back = idem::ParseJson(*canonical, loose);
  FUZZ_CHECK(back.ok());
  FUZZ_CHECK(SameAsDoubles(*back, *parsed));
  idem::StatusOr<std::string> twice = idem::CanonicalJson(*back);
  FUZZ_CHECK(twice.ok());
  FUZZ_CHECK(*twice == *canonical);
  return 0;
}
