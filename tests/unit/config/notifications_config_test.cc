// The `notifications` section: webhook and Telegram channels, read into
// NotificationsConfig without ever reading a secret.
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

class NotifyConfigDir {
 public:
  NotifyConfigDir() {
    static std::atomic<int> counter{0};
    root_ = fs::temp_directory_path() / ("idem_notify_config_test_" + std::to_string(::getpid()) +
                                         "_" + std::to_string(counter++));
    fs::create_directories(root_);
  }
  ~NotifyConfigDir() { fs::remove_all(root_); }
  StatusOr<Config> Load(const std::string& yaml) {
    std::ofstream(root_ / "idem.yaml") << yaml;
    return LoadConfig((root_ / "idem.yaml").string());
  }

 private:
  fs::path root_;
};

}  // namespace

TEST_CASE("notifications are optional and off by default") {
  NotifyConfigDir dir;
  auto config = dir.Load("{}\n");
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());
  CHECK_FALSE(config->notifications.any());
  CHECK(config->notifications.link_base.empty());
}

TEST_CASE("notifications read link_base, webhook and telegram") {
  NotifyConfigDir dir;
  auto config = dir.Load(R"(notifications:
  link_base: http://127.0.0.1:7411/
  webhook:
    url: http://hooks.example/idem
    headers: {Authorization: "Bearer ${HOOK_TOKEN}", X-Team: ops}
  telegram: {bot_token_env: TELEGRAM_BOT_TOKEN, chat_id: 123}
)");
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());
  const NotificationsConfig& n = config->notifications;
  CHECK(n.any());
  CHECK(n.link_base == "http://127.0.0.1:7411");
  REQUIRE(n.webhook.has_value());
  CHECK(n.webhook->url == "http://hooks.example/idem");
  REQUIRE(n.webhook->headers.size() == 2);
  // Kept as written: the secret is read from the environment at start-up.
  CHECK(n.webhook->headers[0].first == "Authorization");
  CHECK(n.webhook->headers[0].second == "Bearer ${HOOK_TOKEN}");
  REQUIRE(n.telegram.has_value());
  CHECK(n.telegram->base_url == "https://api.telegram.org");
  CHECK(n.telegram->bot_token_env == "TELEGRAM_BOT_TOKEN");
  CHECK(n.telegram->chat_id == "123");
}

TEST_CASE("the telegram base_url can point elsewhere and chat_id can be a channel name") {
  NotifyConfigDir dir;
  auto config = dir.Load(R"(notifications:
  telegram: {base_url: "http://127.0.0.1:9/tg/", bot_token_env: T, chat_id: "@ops"}
)");
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());
  REQUIRE(config->notifications.telegram.has_value());
  CHECK(config->notifications.telegram->base_url == "http://127.0.0.1:9/tg");
  CHECK(config->notifications.telegram->chat_id == "@ops");
  CHECK_FALSE(config->notifications.webhook.has_value());
}

TEST_CASE("the loader never reads the secrets a notification config names") {
  NotifyConfigDir dir;
  ::setenv("IDEM_TEST_NOTIFY_SECRET", "s3cret-value", 1);
  auto config = dir.Load(R"(notifications:
  webhook: {url: "http://h/x", headers: {Authorization: "Bearer ${IDEM_TEST_NOTIFY_SECRET}"}}
  telegram: {bot_token_env: IDEM_TEST_NOTIFY_SECRET, chat_id: 1}
)");
  ::unsetenv("IDEM_TEST_NOTIFY_SECRET");
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());
  CHECK(config->notifications.webhook->headers[0].second.find("s3cret") == std::string::npos);
  CHECK(config->notifications.telegram->bot_token_env == "IDEM_TEST_NOTIFY_SECRET");
}

TEST_CASE("notification config errors name the offending key") {
  struct Case {
    std::string yaml;
    std::string field;
  };
  const Case cases[] = {
      {"notifications: {webhook: {headers: {A: b}}}\n", "/notifications/webhook/url"},
      {"notifications: {webhook: {url: ftp://x}}\n", "/notifications/webhook/url"},
      {"notifications: {webhook: {url: http://x, secret: y}}\n", "/notifications/webhook/secret"},
      {"notifications: {webhook: {url: http://x, headers: {A: \"${NOPE\"}}}\n",
       "/notifications/webhook/headers/A"},
      {"notifications: {webhook: {url: http://x, headers: {A: \"${1X}\"}}}\n",
       "/notifications/webhook/headers/A"},
      {"notifications: {webhook: {url: http://x, headers: {\"A B\": c}}}\n",
       "/notifications/webhook/headers/A B"},
      {"notifications: {telegram: {chat_id: 1}}\n", "/notifications/telegram/bot_token_env"},
      {"notifications: {telegram: {bot_token_env: \"not a name\", chat_id: 1}}\n",
       "/notifications/telegram/bot_token_env"},
      {"notifications: {telegram: {bot_token_env: T, chat_id: \"\"}}\n",
       "/notifications/telegram/chat_id"},
      {"notifications: {telegram: {bot_token_env: T, chat_id: 1, bot_token: x}}\n",
       "/notifications/telegram/bot_token"},
      {"notifications: {link_base: not-a-url}\n", "/notifications/link_base"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.yaml);
    NotifyConfigDir dir;
    auto config = dir.Load(c.yaml);
    REQUIRE_FALSE(config.ok());
    CHECK(config.status().code() == Code::kInvalidArgument);
    CHECK(config.status().field() == c.field);
  }
}

TEST_CASE("action names starting with idem. are reserved for idem's own kinds") {
  NotifyConfigDir dir;
  auto config = dir.Load(R"(actions:
  idem.notify.webhook:
    identity: {fields: [/a], version: v1}
    window: 24h
    on_duplicate: return_original
)");
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().field() == "/actions/idem.notify.webhook");
}

}  // namespace idem
