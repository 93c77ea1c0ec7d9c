// The OpenAI adapter's response parsing (Chat Completions), on arbitrary
// upstream answers. See fuzz_provider.h.
#include "providers/openai/openai_provider.h"
#include "tests/fuzz/fuzz_provider.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return idem::fuzz::FuzzProvider(data, size, [](int, idem::HttpClient& http, idem::Env& env) {
    return idem::MakeOpenAiProvider(idem::fuzz::FuzzConfig("openai", idem::Json::object()), http,
                                    env);
  });
}
