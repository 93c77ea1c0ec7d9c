// Shared body of the provider response fuzz targets: the adapter is built
// over a fake HttpClient whose answer is the fuzz input, so the adapter's
// own code turns arbitrary upstream bytes into a ProviderResponse or a
// Status. Input layout: byte 0 picks the HTTP status, byte 1 whether a
// retry-after header comes along, the rest is the body.
// Invariants: no crash, no exception, a success carries a raw_text whose
// `output` is its JSON parse (or null), token counts are not negative, and
// no failure quotes the API key.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "daemon/config/config.h"
#include "daemon/core/env.h"
#include "daemon/core/http_client.h"
#include "providers/provider.h"
#include "tests/fuzz/fuzz_util.h"

namespace idem::fuzz {

inline constexpr char kFuzzKeyVar[] = "IDEM_FUZZ_PROVIDER_KEY";
inline constexpr char kFuzzKey[] = "sk-fuzz-SECRET-0123456789abcdef";

class CannedHttpClient final : public HttpClient {
 public:
  StatusOr<HttpResponse> Send(const HttpRequest&) override { return response; }
  HttpResponse response;
};

inline ProviderRequest FuzzRequest() {
  ProviderRequest r;
  r.step = "triage";
  r.model = "model-x";
  r.prompt = "Ticket #1";
  r.input = {{"ticket_id", 1}};
  r.output_schema = Json::parse(
      R"({"type":"object","properties":{"label":{"type":"string"}},"required":["label"]})");
  r.schema_name = "triage.v1";
  r.timeout_ms = 1000;
  return r;
}

inline ProviderConfig FuzzConfig(std::string type, Json raw) {
  ProviderConfig c;
  c.name = "fuzz-" + type;
  c.type = type;
  c.api_key_env = kFuzzKeyVar;
  c.base_url = "http://127.0.0.1:9/v1";
  raw["type"] = type;
  c.raw = std::move(raw);
  return c;
}

// `make(config_variant, http, env)` builds the adapter; config_variant is
// a byte of the input so both structured-output modes etc. get fuzzed.
template <typename Make>
int FuzzProvider(const uint8_t* data, size_t size, Make make) {
  if (size < 2) return 0;
  static const int kStatuses[] = {200, 200, 200, 200, 201, 400, 401, 408,
                                  429, 500, 503, 529, 404, 413, 422, 302};
  ::setenv(kFuzzKeyVar, kFuzzKey, 1);
  CannedHttpClient http;
  FakeEnv env;
  http.response.status = kStatuses[data[0] % 16];
  if (data[1] & 1) http.response.headers.push_back({"retry-after", "2"});
  if (data[1] & 2) http.response.headers.push_back({"content-type", "application/json"});
  http.response.body = std::string(AsView(data + 2, size - 2));
  StatusOr<std::unique_ptr<Provider>> provider = make(data[1] >> 2, http, env);
  if (!provider.ok()) std::abort();  // the fixed configs are valid
  StatusOr<ProviderResponse> got = (*provider)->Complete(FuzzRequest());
  if (got.ok()) {
    FUZZ_CHECK(got->input_tokens >= 0);
    FUZZ_CHECK(got->output_tokens >= 0);
    FUZZ_CHECK(got->cached_input_tokens >= 0);
    FUZZ_CHECK(got->retry_after_ms >= 0);
  } else {
    FUZZ_CHECK(got.status().ToString().find(kFuzzKey) == std::string::npos);
  }
  return 0;
}

}  // namespace idem::fuzz
