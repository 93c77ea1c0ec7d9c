// The OpenAI-compatible adapter's response parsing with Ollama's native
// API (/api/chat), and with the OpenAI-compatible API, on arbitrary
// upstream answers. See fuzz_provider.h.
#include "providers/openai_compat/openai_compat_provider.h"
#include "tests/fuzz/fuzz_provider.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return idem::fuzz::FuzzProvider(
      data, size, [](int variant, idem::HttpClient& http, idem::Env& env) {
        // Mostly the native API, the target's subject; sometimes /v1.
        idem::Json raw = {{"api", variant % 4 == 3 ? "openai" : "ollama"}};
        return idem::MakeOpenAiCompatProvider(idem::fuzz::FuzzConfig("openai_compatible", raw),
                                              http, env);
      });
}
