// The Anthropic adapter's response parsing (Messages API), in both
// structured-output modes, on arbitrary upstream answers. See
// fuzz_provider.h.
#include "providers/anthropic/anthropic_provider.h"
#include "tests/fuzz/fuzz_provider.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return idem::fuzz::FuzzProvider(
      data, size, [](int variant, idem::HttpClient& http, idem::Env& env) {
        idem::Json raw = {{"structured_output", variant % 2 == 0 ? "tool" : "native"}};
        return idem::MakeAnthropicProvider(idem::fuzz::FuzzConfig("anthropic", raw), http, env);
      });
}
