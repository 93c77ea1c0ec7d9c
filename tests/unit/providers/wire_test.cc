#include "providers/wire.h"

#include <doctest/doctest.h>

#include <limits>
#include <string>

#include "daemon/core/http_client.h"
#include "providers/openai/chat_completions.h"

namespace idem {
namespace {

// Found by tests/fuzz/fuzz_provider_openai: usage numbers are upstream
// data, and converting 1e300 to int64_t was undefined behaviour.
TEST_CASE("token counts read from an answer are clamped to [0, 2^53]") {
  const Json usage = Json::parse(R"({"neg": -5, "huge": 1e300, "big_int": 18446744073709551615,
    "min": -9223372036854775808, "frac": 12.9, "tiny": -0.5, "text": "7", "ok": 42})");
  CHECK(wire::IntAt(usage, "neg") == 0);
  CHECK(wire::IntAt(usage, "huge") == wire::kMaxCount);
  CHECK(wire::IntAt(usage, "big_int") == wire::kMaxCount);
  CHECK(wire::IntAt(usage, "min") == 0);
  CHECK(wire::IntAt(usage, "frac") == 12);
  CHECK(wire::IntAt(usage, "tiny") == 0);
  CHECK(wire::IntAt(usage, "text") == 0);
  CHECK(wire::IntAt(usage, "missing") == 0);
  CHECK(wire::IntAt(usage, "ok") == 42);
}

TEST_CASE("a chat completion with absurd usage numbers still parses, with clamped counts") {
  HttpResponse res;
  res.status = 200;
  res.body = R"({"choices": [{"message": {"content": "{\"a\": 1}"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": -3, "completion_tokens": 1e300,
              "prompt_tokens_details": {"cached_tokens": 1e19}}})";
  StatusOr<ProviderResponse> got = chat_completions::ParseAnswer("openai", res);
  REQUIRE_MESSAGE(got.ok(), got.status().ToString());
  CHECK(got->input_tokens == 0);
  CHECK(got->output_tokens == wire::kMaxCount);
  CHECK(got->cached_input_tokens == wire::kMaxCount);
  CHECK(got->output == Json{{"a", 1}});
}

}  // namespace
}  // namespace idem
