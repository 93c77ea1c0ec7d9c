// The server and auth sections that decide who may call the daemon.
#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>

#include "daemon/config/config.h"

namespace idem {
namespace {

namespace fs = std::filesystem;

// conf/idem.yaml in a scratch folder; the sections tested here refer to no files.
class ConfigFile {
 public:
  ConfigFile() {
    static std::atomic<int> counter{0};
    root_ = fs::temp_directory_path() / ("idem_config_security_test_" + std::to_string(::getpid()) +
                                         "_" + std::to_string(counter++));
    fs::create_directories(root_ / "conf");
  }
  ~ConfigFile() { fs::remove_all(root_); }
  std::string Path() const { return (root_ / "conf" / "idem.yaml").string(); }
  StatusOr<Config> Load(const std::string& yaml) {
    std::ofstream(Path()) << yaml;
    return LoadConfig(Path());
  }

 private:
  fs::path root_;
};

const char* kZeros = "\"0000000000000000000000000000000000000000000000000000000000000000\"";

}  // namespace

TEST_CASE("a role that does not exist is a config error naming file, line and pointer") {
  ConfigFile f;
  auto config = f.Load(std::string("auth:\n  tokens:\n    - name: cron\n      sha256: ") + kZeros +
                       "\n      roles: [agent, operater]\n");
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().code() == Code::kInvalidArgument);
  CHECK(config.status().field() == "/auth/tokens/0/roles/1");
  CHECK(config.status().message().find(f.Path() + ":5: /auth/tokens/0/roles/1: unknown role "
                                                  "'operater'") == 0);
}

TEST_CASE("two tokens with one sha256 are a config error: one secret names one caller") {
  ConfigFile f;
  auto config = f.Load(std::string("auth:\n  tokens:\n    - name: cron\n      sha256: ") + kZeros +
                       "\n      roles: [agent]\n    - name: boss\n      sha256: " + kZeros +
                       "\n      roles: [admin]\n");
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().field() == "/auth/tokens/1/sha256");
  CHECK(config.status().message().find("the same sha256 as token 'cron'") != std::string::npos);
}

TEST_CASE(
    "a token named anonymous or idem is a config error: it would pass for a caller without a "
    "token, or for the daemon, in the audit trail and the approver checks") {
  for (const char* name : {"anonymous", "idem", "Anonymous", "IDEM"}) {
    CAPTURE(name);
    ConfigFile f;
    auto config = f.Load(std::string("auth:\n  tokens:\n    - name: ") + name +
                         "\n      sha256: " + kZeros + "\n      roles: [operator]\n");
    REQUIRE_FALSE(config.ok());
    CHECK(config.status().field() == "/auth/tokens/0/name");
    CHECK(config.status().message().find("is reserved") != std::string::npos);
  }
  ConfigFile f;
  auto near = f.Load(std::string("auth:\n  tokens:\n    - name: idem-ops\n      sha256: ") +
                     kZeros + "\n      roles: [operator]\n");
  CHECK_MESSAGE(near.ok(), near.status().ToString());
}

TEST_CASE("every known role is accepted") {
  ConfigFile f;
  auto config = f.Load(std::string("auth:\n  tokens:\n    - name: all\n      sha256: ") + kZeros +
                       "\n      roles: [agent, operator, admin]\n");
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());
  CHECK(config->auth.tokens[0].roles.size() == 3);
}

TEST_CASE("allowed origins and hosts are read in lower case") {
  ConfigFile f;
  auto config = f.Load(
      "server:\n  listen: 0.0.0.0:7411\n"
      "  allowed_origins: [\"https://Console.Example.com\", \"http://localhost:3000\"]\n"
      "  allowed_hosts: [IDEM.internal, 10.0.0.5, \"[fd00::1]\"]\n");
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());
  CHECK(config->server.allowed_origins ==
        std::vector<std::string>{"https://console.example.com", "http://localhost:3000"});
  CHECK(config->server.allowed_hosts ==
        std::vector<std::string>{"idem.internal", "10.0.0.5", "[fd00::1]"});
}

TEST_CASE("an origin with a path or a host with a port is a config error") {
  ConfigFile f;
  auto origin = f.Load("server:\n  allowed_origins: [\"https://a.example/app\"]\n");
  REQUIRE_FALSE(origin.ok());
  CHECK(origin.status().field() == "/server/allowed_origins/0");
  auto star = f.Load("server:\n  allowed_origins: [\"*\"]\n");
  REQUIRE_FALSE(star.ok());
  auto host = f.Load("server:\n  allowed_hosts: [\"idem.internal:443\"]\n");
  REQUIRE_FALSE(host.ok());
  CHECK(host.status().field() == "/server/allowed_hosts/0");
}

}  // namespace idem
