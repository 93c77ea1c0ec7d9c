// The `outbox` section: subscribers, retention and poll interval, read into
// OutboxConfig without ever reading a secret.
#include <doctest/doctest.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>

#include "daemon/config/config.h"

namespace idem {
namespace {

namespace fs = std::filesystem;

class OutboxConfigDir {
 public:
  OutboxConfigDir() {
    static std::atomic<int> counter{0};
    root_ = fs::temp_directory_path() / ("idem_outbox_config_test_" + std::to_string(::getpid()) +
                                         "_" + std::to_string(counter++));
    fs::create_directories(root_);
  }
  ~OutboxConfigDir() { fs::remove_all(root_); }
  StatusOr<Config> Load(const std::string& yaml) {
    std::ofstream(root_ / "idem.yaml") << yaml;
    return LoadConfig((root_ / "idem.yaml").string());
  }

 private:
  fs::path root_;
};

}  // namespace

TEST_CASE("outbox defaults: no subscribers, 7 days of retention") {
  OutboxConfigDir dir;
  auto config = dir.Load("{}\n");
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());
  CHECK(config->outbox.subscribers.empty());
  CHECK(config->outbox.retention_ms == 7LL * 24 * 3600 * 1000);
  CHECK(config->outbox.poll_ms == 250);
}

TEST_CASE("outbox subscribers read url, headers, attempts, backoff and timeout") {
  OutboxConfigDir dir;
  ::setenv("IDEM_TEST_OUTBOX_SECRET", "s3cret-value", 1);
  auto config = dir.Load(R"(outbox:
  retention: 2d
  poll: 1s
  subscribers:
    billing:
      url: https://billing.example/hook
      headers: {Authorization: "Bearer ${IDEM_TEST_OUTBOX_SECRET}"}
      max_attempts: 7
      backoff: {base: 2s, cap: 5m}
      timeout: 3s
    crm: {url: "http://127.0.0.1:9/x"}
)");
  ::unsetenv("IDEM_TEST_OUTBOX_SECRET");
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());
  const OutboxConfig& o = config->outbox;
  CHECK(o.retention_ms == 2LL * 24 * 3600 * 1000);
  CHECK(o.poll_ms == 1000);
  REQUIRE(o.subscribers.size() == 2);
  const OutboxSubscriberConfig& b = o.subscribers.at("billing");
  CHECK(b.name == "billing");
  CHECK(b.url == "https://billing.example/hook");
  REQUIRE(b.headers.size() == 1);
  // The reference is kept; the secret is expanded by the dispatcher at start-up.
  CHECK(b.headers[0].second == "Bearer ${IDEM_TEST_OUTBOX_SECRET}");
  CHECK(b.retry.attempts == 7);
  CHECK(b.retry.base_ms == 2000);
  CHECK(b.retry.cap_ms == 300'000);
  CHECK(b.retry.timeout_ms == 3000);
  const OutboxSubscriberConfig& c = o.subscribers.at("crm");
  CHECK(c.retry.attempts == 5);
  CHECK(c.retry.base_ms == 1000);
  CHECK(c.retry.cap_ms == 60'000);
}

TEST_CASE("outbox config errors name the offending key") {
  struct Case {
    std::string yaml;
    std::string field;
  };
  const Case cases[] = {
      {"outbox: {subscribers: {a: {headers: {A: b}}}}\n", "/outbox/subscribers/a/url"},
      {"outbox: {subscribers: {a: {url: ftp://x}}}\n", "/outbox/subscribers/a/url"},
      {"outbox: {subscribers: {a: {url: http://x, max_attempts: 0}}}\n",
       "/outbox/subscribers/a/max_attempts"},
      {"outbox: {subscribers: {a: {url: http://x, backoff: {base: 2s, cap: 1s}}}}\n",
       "/outbox/subscribers/a/backoff/cap"},
      {"outbox: {subscribers: {a: {url: http://x, headers: {A: \"${NOPE\"}}}}\n",
       "/outbox/subscribers/a/headers/A"},
      {"outbox: {subscribers: {a: {url: http://x, secret: y}}}\n", "/outbox/subscribers/a/secret"},
      {"outbox: {subscribers: {\"1bad\": {url: http://x}}}\n", "/outbox/subscribers/1bad"},
      {"outbox: {retention: soon}\n", "/outbox/retention"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.yaml);
    OutboxConfigDir dir;
    auto config = dir.Load(c.yaml);
    REQUIRE_FALSE(config.ok());
    CHECK(config.status().code() == Code::kInvalidArgument);
    CHECK(config.status().field() == c.field);
  }
  // A URL that is not one says so, not what the field is for.
  OutboxConfigDir dir;
  auto bad_url = dir.Load("outbox: {subscribers: {s: {url: \"htp:/oops\"}}}\n");
  REQUIRE_FALSE(bad_url.ok());
  CHECK(bad_url.status().message().find("must be an http:// or https:// URL") != std::string::npos);
}

}  // namespace idem
