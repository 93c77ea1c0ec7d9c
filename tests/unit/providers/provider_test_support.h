// Shared set-up for the provider adapter tests: a fake provider server, the
// real curl client, a fake Env, and a request with a small strict schema.
#pragma once

#include <cstdlib>
#include <memory>
#include <string>

#include "daemon/config/config.h"
#include "daemon/core/env.h"
#include "daemon/core/http_client.h"
#include "providers/provider.h"
#include "tests/fakes/fake_provider.h"

namespace idem::testing {

// A key that must never show up in any Status.
inline constexpr char kTestKey[] = "sk-test-SECRET-7f3a9c1e5b2d4680";

// Sets (or unsets, for nullptr) an environment variable for one test.
class ScopedEnvVar {
 public:
  ScopedEnvVar(std::string name, const char* value) : name_(std::move(name)) {
    if (value != nullptr) {
      setenv(name_.c_str(), value, 1);
    } else {
      unsetenv(name_.c_str());
    }
  }
  ~ScopedEnvVar() { unsetenv(name_.c_str()); }

 private:
  std::string name_;
};

inline Json TriageSchema() {
  return Json::parse(R"({
    "type": "object",
    "properties": {
      "label": {"type": "string", "enum": ["billing", "bug", "other"]},
      "confidence": {"type": "number"}
    },
    "required": ["label", "confidence"],
    "additionalProperties": false
  })");
}

inline ProviderRequest TriageRequest() {
  ProviderRequest r;
  r.step = "triage_ticket";
  r.model = "model-x";
  r.temperature = 0.2;
  r.system_prompt = "You triage support tickets.";
  r.prompt = "Ticket #123: I was charged twice.";
  r.input = {{"ticket_id", 123}};
  r.output_schema = TriageSchema();
  r.schema_name = "triage_ticket.v1";
  r.timeout_ms = 5'000;
  return r;
}

struct ProviderHarness {
  std::unique_ptr<fakes::FakeProviderServer> server = fakes::FakeProviderServer::Start();
  std::unique_ptr<HttpClient> http = MakeCurlHttpClient();
  FakeEnv env;

  ProviderConfig Config(std::string type, std::string key_env, std::string base_url) const {
    ProviderConfig c;
    c.name = "test-" + type;
    c.type = type;
    c.api_key_env = std::move(key_env);
    c.base_url = std::move(base_url);
    c.raw = {{"type", c.type}};
    return c;
  }
};

}  // namespace idem::testing
