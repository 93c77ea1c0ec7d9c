// JsonObjectWriter (daemon/core/json.h), the hand-written JSON text writer
// behind every work answer, stored work record, outbox event and trace
// entry, against the reference it replaces: nlohmann's dump() of the same
// object. The input is two strings split at "\n----\n" (fuzz_util.h).
// Invariants:
//   - when both strings are UTF-8, the writer's text is byte for byte what
//     dump() writes for {"a": a, "b": b, "n": n, "t": t, "z" + a: n}, and
//     bad() is "" (the last member's name is escaped by the writer's own
//     path for names, which takes names it need not escape whole);
//   - when one is not, IsValidUtf8 agrees with nlohmann (whose dump()
//     refuses it), bad() names the first such member, that member is
//     written as "", and the text still parses to the other members.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "daemon/core/json.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using idem::Json;

// Whether nlohmann's serializer takes `s` as a string (it throws on bytes
// that are not UTF-8).
bool NlohmannTakes(std::string_view s) {
  try {
    (void)Json(std::string(s)).dump();
    return true;
  } catch (const Json::exception&) {
    return false;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view a, b;
  idem::fuzz::SplitTwo(idem::fuzz::AsView(data, size), a, b);
  int64_t n = 0;
  if (size > 0) std::memcpy(&n, data, std::min(size, sizeof(n)));
  const bool t = size % 2 == 1;

  const bool a_ok = idem::IsValidUtf8(a);
  const bool b_ok = idem::IsValidUtf8(b);
  // A name from the input, sorted after the others (as nlohmann's object
  // keeps them); names are not checked for UTF-8, so only a valid one.
  const std::string z_name = "z" + std::string(a);

  idem::JsonObjectWriter writer;
  writer.Str("a", a).Str("b", b).Int("n", n).Bool("t", t);
  if (a_ok) writer.Int(z_name, n);
  const std::string bad(writer.bad());
  const std::string text = writer.Take();

  FUZZ_CHECK(a_ok == NlohmannTakes(a));
  FUZZ_CHECK(b_ok == NlohmannTakes(b));
  Json expected = {
      {"a", a_ok ? std::string(a) : ""}, {"b", b_ok ? std::string(b) : ""}, {"n", n}, {"t", t}};
  if (a_ok) expected[z_name] = n;
  FUZZ_CHECK(text == expected.dump());
  FUZZ_CHECK(bad == (!a_ok ? "a" : !b_ok ? "b" : ""));
  Json back = Json::parse(text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  FUZZ_CHECK(!back.is_discarded());
  FUZZ_CHECK(back == expected);
  return 0;
}
