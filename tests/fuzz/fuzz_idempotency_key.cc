// The Idempotency-Key header parser (daemon/http/idempotency_key.h) on
// arbitrary header values. Invariants: no crash; a key that parses is
// 1..255 characters of printable ASCII; a value repeated is refused.
//
// The input is one or more header values separated by "\n----\n" lines.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/http/idempotency_key.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view rest = idem::fuzz::AsView(data, size);
  std::vector<std::string> values;
  while (values.size() < 4) {
    std::string_view one, more;
    idem::fuzz::SplitTwo(rest, one, more);
    values.emplace_back(one);
    if (more.data() == nullptr) break;
    rest = more;
  }
  idem::StatusOr<std::string> key = idem::ParseIdempotencyKey(values);
  if (key.ok() && !key->empty()) {
    FUZZ_CHECK(key->size() <= 255);
    for (char c : *key) FUZZ_CHECK(c >= 0x20 && c < 0x7f);
  }
  if (values.size() > 1) FUZZ_CHECK(!key.ok());
  // The single-value parse of the first value alone is the same function.
  (void)idem::ParseIdempotencyKey({values[0]});

  // Prefer (RFC 7240): never more than the cap, never negative.
  constexpr int64_t kCap = 60'000;
  idem::StatusOr<int64_t> wait = idem::ParsePreferWait(values, kCap);
  if (wait.ok()) FUZZ_CHECK(*wait >= 0 && *wait <= kCap);
  return 0;
}
