#include "daemon/config/config.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace idem {
namespace {

namespace fs = std::filesystem;

// A scratch directory holding a config and the files it refers to.
class ConfigDir {
 public:
  ConfigDir() {
    static std::atomic<int> counter{0};
    root_ = fs::temp_directory_path() /
            ("idem_config_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(root_);
    fs::create_directories(root_ / "conf" / "prompts");
    Write("conf/prompts/p.mustache", "Ticket: {{{input.text}}}\n");
    Write("conf/rules.yaml", "rules: []\n");
    Write("schemas/out.json", R"({"type": "object", "properties": {"a": {"type": "string"}}})");
  }
  ~ConfigDir() { fs::remove_all(root_); }

  void Write(const std::string& relative, const std::string& text) {
    fs::path p = root_ / relative;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  std::string Path(const std::string& relative) const { return (root_ / relative).string(); }

  // Writes conf/idem.yaml and loads it.
  StatusOr<Config> Load(const std::string& yaml) {
    Write("conf/idem.yaml", yaml);
    return LoadConfig(Path("conf/idem.yaml"));
  }

 private:
  fs::path root_;
};

const std::string kMinimal = R"(providers:
  demo:
    type: scripted
    rules: rules.yaml
steps:
  triage:
    provider: demo
    model: m-1
    temperature: 0.5
    prompt: {template: prompts/p.mustache, version: v1}
    output_schema: ../schemas/out.json
actions:
  send_reply:
    identity: {fields: [/ticket_id, /text], version: v1}
    window: 24h
    on_duplicate: return_original
)";

TEST_CASE("the default config in config/idem.yaml loads") {
  auto config = LoadConfig(IDEM_SOURCE_DIR "/config/idem.yaml");
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());
  CHECK(config->server.listen == "127.0.0.1:7411");
  CHECK(config->store.engine == "rocksdb");
  CHECK(fs::path(config->store.path) == fs::path(IDEM_SOURCE_DIR "/var/idem").lexically_normal());
  REQUIRE(config->providers.count("demo") == 1);
  CHECK(config->providers.at("demo").type == "scripted");
  CHECK(fs::exists(config->providers.at("demo").rules_path));

  REQUIRE(config->steps.count("triage_ticket") == 1);
  const StepConfig& step = config->steps.at("triage_ticket");
  CHECK(step.provider == "demo");
  CHECK(step.model == "demo-1");
  CHECK(step.temperature == 0.0);
  CHECK(step.prompt.version == "v1");
  CHECK(step.prompt.text.find("{{{input.text}}}") != std::string::npos);
  CHECK(step.prompt.sha256.size() == 64);
  CHECK(step.output_schema["required"].size() == 4);
  CHECK(step.input.drop == std::vector<std::string>{"received_at", "request_id", "trace_id"});
  CHECK(step.attempts == 3);
  CHECK(step.timeout_ms == 30'000);
  CHECK(step.cache_window_ms == 0);
  CHECK(step.plan_pointer == "/actions");

  REQUIRE(config->actions.count("send_reply") == 1);
  const ActionConfig& action = config->actions.at("send_reply");
  CHECK(action.identity_fields == std::vector<std::string>{"/ticket_id", "/text"});
  CHECK(action.identity_version == "v1");
  CHECK(action.window_ms == 24LL * 3600 * 1000);
  CHECK(action.on_duplicate == "return_original");
  CHECK(action.effector["http"]["idempotency"] == "header");
  CHECK(action.retry.attempts == 5);
  CHECK(action.retry.base_ms == 200);
  CHECK(action.retry.cap_ms == 30'000);
}

TEST_CASE("relative paths resolve against the config file's directory") {
  ConfigDir dir;
  auto config = dir.Load(kMinimal + "store: {path: data/idem}\n");
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());
  CHECK(config->base_dir == dir.Path("conf"));
  CHECK(config->store.path == dir.Path("conf/data/idem"));
  CHECK(config->providers.at("demo").rules_path == dir.Path("conf/rules.yaml"));
  const StepConfig& step = config->steps.at("triage");
  CHECK(step.prompt.template_path == dir.Path("conf/prompts/p.mustache"));
  CHECK(step.output_schema_path == dir.Path("schemas/out.json"));
  CHECK(step.prompt.text == "Ticket: {{{input.text}}}\n");
  CHECK(step.output_schema["properties"]["a"]["type"] == "string");
}

TEST_CASE("absolute paths are kept as written") {
  ConfigDir dir;
  auto config = dir.Load(kMinimal + "store: {path: " + dir.Path("elsewhere") + "}\n");
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());
  CHECK(config->store.path == dir.Path("elsewhere"));
}

TEST_CASE("an unknown key is an error naming the file, line and pointer") {
  ConfigDir dir;
  auto config = dir.Load("server:\n  listen: 127.0.0.1:1\n  colour: red\n");
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().code() == Code::kInvalidArgument);
  CHECK(config.status().field() == "/server/colour");
  CHECK(config.status().message() ==
        dir.Path("conf/idem.yaml") + ":3: /server/colour: unknown key");
}

TEST_CASE("an unknown key deep inside a step is found too") {
  ConfigDir dir;
  auto config = dir.Load(kMinimal + "    colour: red\n");
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().field() == "/actions/send_reply/colour");
  CHECK(config.status().message().find(":17: /actions/send_reply/colour: unknown key") !=
        std::string::npos);
}

TEST_CASE("a value of the wrong type is an error saying which type was expected") {
  ConfigDir dir;
  auto config = dir.Load("server:\n  threads: \"8\"\n");
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().field() == "/server/threads");
  CHECK(config.status().message() ==
        dir.Path("conf/idem.yaml") + ":2: /server/threads: must be integer, not string");
}

TEST_CASE("a number out of range is an error with the bound") {
  ConfigDir dir;
  std::string yaml = kMinimal;
  yaml.replace(yaml.find("temperature: 0.5"), 16, "temperature: 3");
  auto config = dir.Load(yaml);
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().field() == "/steps/triage/temperature");
  CHECK(config.status().message().find(":9: /steps/triage/temperature: must be <= 2") !=
        std::string::npos);
}

TEST_CASE("every schema error is listed, one per line") {
  ConfigDir dir;
  auto config = dir.Load("server:\n  threads: 0\n  colour: red\nstore:\n  sync: maybe\n");
  REQUIRE_FALSE(config.ok());
  const std::string& m = config.status().message();
  CHECK(m.find(":2: /server/threads: must be >= 1") != std::string::npos);
  CHECK(m.find(":3: /server/colour: unknown key") != std::string::npos);
  CHECK(m.find(":5: /store/sync: must be boolean, not string") != std::string::npos);
  CHECK(std::count(m.begin(), m.end(), '\n') == 2);
}

TEST_CASE("a missing config file is an error naming it") {
  auto config = LoadConfig("/nonexistent/idem.yaml");
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().code() == Code::kInvalidArgument);
  CHECK(config.status().message().find("/nonexistent/idem.yaml: cannot read") == 0);
}

TEST_CASE("the daemon's URL puts an IPv6 listen host in brackets, as a URL must") {
  auto v6 = ParseListen("[::1]:7411");
  REQUIRE(v6.ok());
  CHECK(HttpUrl(v6->first, v6->second) == "http://[::1]:7411");
  auto v4 = ParseListen("127.0.0.1:7411");
  REQUIRE(v4.ok());
  CHECK(HttpUrl(v4->first, v4->second) == "http://127.0.0.1:7411");
  CHECK(HttpUrl("localhost", 80) == "http://localhost:80");
}

TEST_CASE("an idempotency lease too short to be renewed in time is a config error") {
  // Renewed every third of it by a store write: 1ms would lapse while its
  // request runs, and a second request with the key would run beside it.
  for (const char* lease : {"1ms", "99ms"}) {
    CAPTURE(lease);
    ConfigDir dir;
    auto config = dir.Load(std::string("store: {}\nidempotency:\n  lease: ") + lease + "\n");
    REQUIRE_FALSE(config.ok());
    CHECK(config.status().field() == "/idempotency/lease");
    CHECK(config.status().message().find("at least 100ms") != std::string::npos);
  }
  ConfigDir dir;
  auto config = dir.Load("store: {}\nidempotency:\n  lease: 100ms\n");
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());
  CHECK(config->idempotency.lease_ms == 100);
}

TEST_CASE("a listen address that is not host:port is a config error with its file and line") {
  for (const char* listen : {"127.0.0.1:99999", "localhost", "127.0.0.1:http"}) {
    CAPTURE(listen);
    ConfigDir dir;
    auto config = dir.Load(std::string("store: {}\nserver:\n  listen: \"") + listen + "\"\n");
    REQUIRE_FALSE(config.ok());
    CHECK(config.status().field() == "/server/listen");
    CHECK(config.status().message().find(dir.Path("conf/idem.yaml") + ":3: /server/listen: ") == 0);
  }
}

TEST_CASE("server.unix_socket resolves against the config's folder, its mode read in octal") {
  ConfigDir dir;
  auto plain = dir.Load(kMinimal);
  REQUIRE_MESSAGE(plain.ok(), plain.status().ToString());
  CHECK(plain->server.unix_socket.empty());
  CHECK(plain->server.unix_socket_mode == 0600);
  auto config =
      dir.Load(kMinimal + "server:\n  unix_socket: run/idem.sock\n  unix_socket_mode: \"0660\"\n");
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());
  CHECK(config->server.unix_socket == dir.Path("conf/run/idem.sock"));
  CHECK(config->server.unix_socket_mode == 0660);
}

TEST_CASE("a Unix socket path too long for sun_path, or a bad mode, is a config error") {
  ConfigDir dir;
  auto too_long =
      dir.Load(kMinimal + "server:\n  unix_socket: /tmp/" + std::string(120, 's') + "\n");
  REQUIRE_FALSE(too_long.ok());
  CHECK(too_long.status().field() == "/server/unix_socket");
  CHECK(too_long.status().message().find("at most 107") != std::string::npos);
  // Octal that is not a mode, and modes that shut the daemon's own user
  // out (connecting takes the owner's write bit).
  for (const char* mode :
       {"\"0999\"", "\"rw\"", "660", "\"06600\"", "\"0000\"", "\"0400\"", "\"0060\""}) {
    CAPTURE(mode);
    auto bad = dir.Load(kMinimal +
                        "server:\n  unix_socket: /tmp/i.sock\n  unix_socket_mode: " + mode + "\n");
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.status().field() == "/server/unix_socket_mode");
  }
  auto alone = dir.Load(kMinimal + "server:\n  unix_socket_mode: \"0660\"\n");
  REQUIRE_FALSE(alone.ok());
  CHECK(alone.status().field() == "/server/unix_socket_mode");
  CHECK(alone.status().message().find("applies only with server.unix_socket") != std::string::npos);
}

TEST_CASE("a config path that is a folder is refused, not read as an empty config") {
  ConfigDir dir;
  const std::string folder = dir.Path("conf");
  fs::create_directories(folder);
  auto config = LoadConfig(folder);
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().code() == Code::kInvalidArgument);
  CHECK(config.status().message().find(folder + ": is a folder, not a file") == 0);
}

TEST_CASE("a config that never ends is refused at 4 MiB, not read until memory runs out") {
  // /dev/zero reports 0 bytes: only a bounded read stops it.
  auto config = LoadConfig("/dev/zero");
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().message() == "/dev/zero: larger than 4 MiB, the most that is read");
}

TEST_CASE("a_missing_relative_config_path_says_which_folder_it_was_looked_for_in") {
  // `idem serve` from outside the checkout looks for config/idem.yaml there.
  auto config = LoadConfig("no-such-folder/idem.yaml");
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().message() ==
        "no-such-folder/idem.yaml: cannot read: No such file or directory (relative to the "
        "current folder, " +
            fs::current_path().string() + ")");
}

TEST_CASE("a YAML syntax error reports the file and line") {
  ConfigDir dir;
  auto config = dir.Load("server:\n  listen: [1, 2\nstore: {}\n");
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().message().find(dir.Path("conf/idem.yaml") + ":3: yaml syntax error") == 0);
}

TEST_CASE("a step naming an undeclared provider is an error listing the declared ones") {
  ConfigDir dir;
  std::string yaml = kMinimal;
  yaml.replace(yaml.find("provider: demo"), 14, "provider: openai");
  auto config = dir.Load(yaml);
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().field() == "/steps/triage/provider");
  CHECK(config.status().message().find(
            ":7: /steps/triage/provider: no provider named 'openai' (declared: demo)") !=
        std::string::npos);
}

TEST_CASE("a provider key that only another provider type reads is an error, not ignored") {
  ConfigDir dir;
  struct Case {
    std::string type, line, pointer;
  };
  for (const Case& c :
       std::vector<Case>{{"openai", "api: ollama", "/providers/llm/api"},
                         {"anthropic", "organization: org-1", "/providers/llm/organization"},
                         {"openai_compatible", "structured_output: native",
                          "/providers/llm/structured_output"}}) {
    const std::string& type = c.type;
    const std::string& line = c.line;
    const std::string& pointer = c.pointer;
    CAPTURE(type);
    std::string yaml = kMinimal;
    yaml.replace(0, std::string("providers:\n").size(),
                 "providers:\n  llm:\n    type: " + type + "\n    " + line + "\n");
    auto config = dir.Load(yaml);
    REQUIRE_FALSE(config.ok());
    CHECK(config.status().field() == pointer);
    CHECK_MESSAGE(config.status().message().find(":4: " + pointer + ": only ") != std::string::npos,
                  config.status().message());
  }
}

TEST_CASE("an inbox source may not run an action kind clients execute: every event would be 409") {
  ConfigDir dir;
  // kMinimal's send_reply has no effector.
  auto config = dir.Load(kMinimal +
                         "inbox:\n  gh:\n    event_id: {header: X-Id}\n"
                         "    on_event: {action: send_reply}\n");
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().field() == "/inbox/gh/on_event/action");
  CHECK(config.status().message().find("has no effector") != std::string::npos);
}

TEST_CASE("an inbox window is finite: event ids kept forever would grow the store") {
  ConfigDir dir;
  auto config = dir.Load(kMinimal +
                         "inbox:\n  gh:\n    event_id: {header: X-Id}\n"
                         "    on_event: {record: true}\n    window: forever\n");
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().field() == "/inbox/gh/window");
}

TEST_CASE("a provider, step or action name must be a plain identifier") {
  ConfigDir dir;
  std::string yaml = kMinimal;
  yaml.replace(yaml.find("send_reply:"), 11, "send reply:");
  auto config = dir.Load(yaml);
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().field() == "/actions/send reply");
  CHECK(config.status().message().find(
            ":13: /actions/send reply: a name must start with a letter") != std::string::npos);
}

TEST_CASE("the built-in config schema is the file in schemas/") {
  std::ifstream in(IDEM_SOURCE_DIR "/schemas/config.schema.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(Json::parse(ConfigSchemaText()) == Json::parse(text));
}

TEST_CASE("a fallback naming an undeclared provider is an error") {
  ConfigDir dir;
  std::string yaml = kMinimal;
  yaml.insert(yaml.find("actions:"), "    fallback: [{model: big, provider: nope}, escalate]\n");
  auto config = dir.Load(yaml);
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().field() == "/steps/triage/fallback/0/provider");
}

TEST_CASE("a fallback model after escalate, which would never be asked, is an error") {
  ConfigDir dir;
  std::string yaml = kMinimal;
  yaml.insert(yaml.find("actions:"), "    fallback: [escalate, {model: big}]\n");
  auto config = dir.Load(yaml);
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().field() == "/steps/triage/fallback/1");
  CHECK(config.status().message().find("escalate last") != std::string::npos);
  yaml = kMinimal;
  yaml.insert(yaml.find("actions:"), "    fallback: [{model: big}, escalate]\n");
  CHECK(dir.Load(yaml).ok());
}

TEST_CASE("a malformed duration is an error describing the expected form") {
  ConfigDir dir;
  std::string yaml = kMinimal;
  yaml.replace(yaml.find("window: 24h"), 11, "window: 24 hours");
  auto config = dir.Load(yaml);
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().field() == "/actions/send_reply/window");
  CHECK(config.status().message().find(
            "/actions/send_reply/window: must be a window like 5m, 24h, 30d or forever") !=
        std::string::npos);
}

TEST_CASE("a zero window is refused in favour of writing forever") {
  ConfigDir dir;
  std::string yaml = kMinimal;
  yaml.replace(yaml.find("window: 24h"), 11, "window: 0s");
  auto config = dir.Load(yaml);
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().message().find("write forever") != std::string::npos);
}

TEST_CASE("forever is not a timeout") {
  ConfigDir dir;
  std::string yaml = kMinimal;
  yaml.insert(yaml.find("actions:"), "    timeout: forever\n");
  auto config = dir.Load(yaml);
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().field() == "/steps/triage/timeout");
}

TEST_CASE("a duration too long for 64 bits is an error, not an overflow") {
  ConfigDir dir;
  std::string yaml = kMinimal;
  yaml.replace(yaml.find("window: 24h"), 11, "window: 999999999999d");
  auto config = dir.Load(yaml);
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().message().find("too long") != std::string::npos);
}

TEST_CASE("a step's retry backoff is read, with defaults when absent") {
  ConfigDir dir;
  auto config = dir.Load(kMinimal);
  REQUIRE(config.ok());
  CHECK(config->steps.at("triage").retry_base_ms == StepConfig{}.retry_base_ms);
  std::string yaml = kMinimal;
  yaml.insert(yaml.find("actions:"), "    retry: {base: 1s, cap: 20s}\n");
  config = dir.Load(yaml);
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());
  CHECK(config->steps.at("triage").retry_base_ms == 1000);
  CHECK(config->steps.at("triage").retry_cap_ms == 20'000);
}

TEST_CASE("a retry cap shorter than its base is an error") {
  ConfigDir dir;
  auto config = dir.Load(kMinimal + "    retry: {base: 10s, cap: 1s}\n");
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().field() == "/actions/send_reply/retry/cap");
}

TEST_CASE("a missing prompt template is an error at its key") {
  ConfigDir dir;
  std::string yaml = kMinimal;
  yaml.replace(yaml.find("prompts/p.mustache"), 18, "prompts/gone.mustache");
  auto config = dir.Load(yaml);
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().field() == "/steps/triage/prompt/template");
  CHECK(config.status().message().find("no such file: " + dir.Path("conf/prompts/gone.mustache")) !=
        std::string::npos);
}

TEST_CASE("a prompt template with broken mustache is an error") {
  ConfigDir dir;
  dir.Write("conf/prompts/p.mustache", "{{#input}}unclosed");
  auto config = dir.Load(kMinimal);
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().field() == "/steps/triage/prompt/template");
}

TEST_CASE("an output schema that is not JSON or not a schema is an error") {
  ConfigDir dir;
  dir.Write("schemas/out.json", "{not json");
  auto config = dir.Load(kMinimal);
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().field() == "/steps/triage/output_schema");
  CHECK(config.status().message().find("is not JSON") != std::string::npos);

  dir.Write("schemas/out.json", R"({"type": "objekt"})");
  config = dir.Load(kMinimal);
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().field() == "/steps/triage/output_schema");
}

TEST_CASE("the prompt hash follows the template text") {
  ConfigDir dir;
  auto first = dir.Load(kMinimal);
  REQUIRE(first.ok());
  dir.Write("conf/prompts/p.mustache", "Ticket, changed: {{{input.text}}}\n");
  auto second = dir.Load(kMinimal);
  REQUIRE(second.ok());
  CHECK(first->steps.at("triage").prompt.sha256 != second->steps.at("triage").prompt.sha256);
}

TEST_CASE("the prompt hash covers the system text and the tools as well as the template") {
  ConfigDir dir;
  auto base = dir.Load(kMinimal);
  REQUIRE(base.ok());
  const std::string hash = base->steps.at("triage").prompt.hash;
  CHECK(hash.size() == 64);
  std::string with_system = kMinimal;
  with_system.replace(with_system.find("    temperature: 0.5\n"), 0, "    system: be brief\n");
  auto system = dir.Load(with_system);
  REQUIRE_MESSAGE(system.ok(), system.status().ToString());
  CHECK(system->steps.at("triage").prompt.hash != hash);
  CHECK(system->steps.at("triage").prompt.sha256 == base->steps.at("triage").prompt.sha256);
  std::string with_tools = kMinimal;
  with_tools.replace(with_tools.find("    temperature: 0.5\n"), 0,
                     "    tools: [{name: lookup, description: find a ticket}]\n");
  auto tools = dir.Load(with_tools);
  REQUIRE_MESSAGE(tools.ok(), tools.status().ToString());
  CHECK(tools->steps.at("triage").prompt.hash != hash);
}

TEST_CASE("a step without temperature leaves it unset") {
  ConfigDir dir;
  std::string yaml = kMinimal;
  yaml.erase(yaml.find("    temperature: 0.5\n"), 21);
  auto config = dir.Load(yaml);
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());
  CHECK_FALSE(config->steps.at("triage").temperature.has_value());
  CHECK(DescribeContracts(*config).find("the provider's default temperature") != std::string::npos);
}

const std::string kClaude = R"(providers:
  claude:
    type: anthropic
    api_key_env: ANTHROPIC_API_KEY
    unsupported_params: {"claude-opus-4-7*": [temperature, top_p, top_k], claude-x: [top_k]}
  old:
    type: anthropic
    api_key_env: ANTHROPIC_API_KEY
steps:
  triage:
    provider: claude
    model: claude-opus-4-7-20260101
    temperature: 0.5
    prompt: {template: prompts/p.mustache, version: v1}
    output_schema: ../schemas/out.json
)";

TEST_CASE("a step that sets temperature for a model that refuses it fails at start-up") {
  ConfigDir dir;
  auto config = dir.Load(kClaude);
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().field() == "/steps/triage/temperature");
  CHECK(config.status().message().find("idem.yaml:13: /steps/triage/temperature: model "
                                       "claude-opus-4-7-20260101 of provider claude does not "
                                       "accept temperature") != std::string::npos);

  // The same step without temperature loads; so does another model.
  std::string unset = kClaude;
  unset.erase(unset.find("    temperature: 0.5\n"), 21);
  auto ok = dir.Load(unset);
  CHECK_MESSAGE(ok.ok(), ok.status().ToString());
  std::string other = kClaude;
  other.replace(other.find("claude-opus-4-7-20260101"), 24, "claude-x");
  ok = dir.Load(other);
  CHECK_MESSAGE(ok.ok(), ok.status().ToString());

  // A fallback to a refusing model is caught too.
  std::string fallback = kClaude;
  const std::string primary = "    provider: claude\n    model: claude-opus-4-7-20260101";
  fallback.replace(fallback.find(primary), primary.size(),
                   "    provider: old\n    model: claude-3");
  fallback += "    fallback: [{provider: claude, model: claude-opus-4-7}, escalate]\n";
  auto fb = dir.Load(fallback);
  REQUIRE_FALSE(fb.ok());
  CHECK(fb.status().field() == "/steps/triage/temperature");
  CHECK(fb.status().message().find("model claude-opus-4-7 of provider claude") !=
        std::string::npos);
}

TEST_CASE("an anthropic step takes a temperature from 0 to 1 only") {
  ConfigDir dir;
  std::string yaml = kClaude;
  yaml.replace(yaml.find("model: claude-opus-4-7-20260101"), 31, "model: claude-3");
  yaml.replace(yaml.find("temperature: 0.5"), 16, "temperature: 1.5");
  auto config = dir.Load(yaml);
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().field() == "/steps/triage/temperature");
  CHECK(config.status().message().find("from 0 to 1") != std::string::npos);
}

TEST_CASE("an unsupported_params pattern is a name or a prefix ending in one star") {
  ConfigDir dir;
  std::string yaml = kClaude;
  yaml.replace(yaml.find("claude-opus-4-7*"), 16, "claude-*-4-7");
  auto config = dir.Load(yaml);
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().field() == "/providers/claude/unsupported_params/claude-*-4-7");
}

TEST_CASE("a scripted provider takes only a rules file") {
  ConfigDir dir;
  std::string yaml = kMinimal;
  yaml.insert(yaml.find("steps:"), "    api_key_env: KEY\n");
  auto config = dir.Load(yaml);
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().field() == "/providers/demo/api_key_env");
}

TEST_CASE("a replay provider takes a file, made absolute, and nothing else") {
  ConfigDir dir;
  dir.Write("conf/run.jsonl", "");
  std::string yaml = kMinimal;
  yaml.insert(yaml.find("steps:"), "  recorded:\n    type: replay\n    file: run.jsonl\n");
  auto config = dir.Load(yaml);
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());
  CHECK(config->providers.at("recorded").type == "replay");
  CHECK(config->providers.at("recorded").file_path == dir.Path("conf/run.jsonl"));

  std::string missing = kMinimal;
  missing.insert(missing.find("steps:"), "  recorded:\n    type: replay\n");
  auto no_file = dir.Load(missing);
  REQUIRE_FALSE(no_file.ok());
  CHECK(no_file.status().field() == "/providers/recorded");

  std::string extra = kMinimal;
  extra.insert(extra.find("steps:"),
               "  recorded:\n    type: replay\n    file: run.jsonl\n    api_key_env: KEY\n");
  auto extra_key = dir.Load(extra);
  REQUIRE_FALSE(extra_key.ok());
  CHECK(extra_key.status().field() == "/providers/recorded/api_key_env");

  std::string file_elsewhere = kMinimal;
  file_elsewhere.insert(file_elsewhere.find("steps:"),
                        "  openai:\n    type: openai\n    file: run.jsonl\n");
  auto misplaced = dir.Load(file_elsewhere);
  REQUIRE_FALSE(misplaced.ok());
  CHECK(misplaced.status().field() == "/providers/openai/file");
}

TEST_CASE("other provider types keep their adapter keys in raw") {
  ConfigDir dir;
  std::string yaml = kMinimal;
  yaml.insert(yaml.find("steps:"), R"(  openai:
    type: openai
    api_key_env: OPENAI_API_KEY
    base_url: https://api.openai.com/v1
    max_tokens: 512
    organization: org-1
    headers: {X-Trace: "on"}
)");
  auto config = dir.Load(yaml);
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());
  const ProviderConfig& p = config->providers.at("openai");
  CHECK(p.api_key_env == "OPENAI_API_KEY");
  CHECK(p.base_url == "https://api.openai.com/v1");
  CHECK(p.raw["max_tokens"] == 512);
  CHECK(p.raw["headers"]["X-Trace"] == "on");
  CHECK(p.raw["organization"] == "org-1");
}

TEST_CASE("quoted scalars stay strings and plain ones get their YAML types") {
  ConfigDir dir;
  // A token's sha256 must be a string; a route window must be a string even
  // when it looks like a number.
  auto config = dir.Load(R"(server: {listen: "127.0.0.1:7411", threads: 8, max_body_bytes: 0x100}
store: {sync: false}
auth:
  tokens:
    - name: agent-1
      sha256: "0000000000000000000000000000000000000000000000000000000000000000"
      roles: [agent]
prices:
  m-1: {input_per_mtok: 2.5, output_per_mtok: 10}
)");
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());
  CHECK(config->server.threads == 8);
  CHECK(config->server.max_body_bytes == 256);
  CHECK(config->store.sync == false);
  REQUIRE(config->auth.tokens.size() == 1);
  CHECK(config->auth.tokens[0].roles == std::vector<std::string>{"agent"});
  CHECK(config->prices["m-1"]["input_per_mtok"].is_number_float());
  CHECK(config->prices["m-1"]["output_per_mtok"].is_number_integer());
}

TEST_CASE("idempotency windows per route are read as durations") {
  ConfigDir dir;
  auto config = dir.Load(
      "idempotency:\n  window: 1h\n  lease: 30s\n  routes:\n"
      "    \"POST /v1/decide\": 2d\n");
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());
  CHECK(config->idempotency.window_ms == 3'600'000);
  CHECK(config->idempotency.lease_ms == 30'000);
  CHECK(config->idempotency.route_windows_ms.at("POST /v1/decide") == 2 * 86'400'000LL);

  config = dir.Load("idempotency:\n  routes:\n    \"FETCH /v1/x\": 2d\n");
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().field() == "/idempotency/routes/FETCH ~1v1~1x");
}

TEST_CASE("an empty config file means all defaults") {
  ConfigDir dir;
  auto config = dir.Load("# nothing here\n");
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());
  CHECK(config->server.threads == 64);
  CHECK(config->steps.empty());
}

TEST_CASE("an action must state identity, window and duplicate response") {
  ConfigDir dir;
  auto config = dir.Load("actions:\n  a:\n    identity: {fields: [/id], version: v1}\n");
  REQUIRE_FALSE(config.ok());
  const std::string& m = config.status().message();
  CHECK(m.find("/actions/a/window: missing required key") != std::string::npos);
  CHECK(m.find("/actions/a/on_duplicate: missing required key") != std::string::npos);
}

TEST_CASE("ParseDuration reads every unit and forever") {
  CHECK(*ParseDuration("250ms") == 250);
  CHECK(*ParseDuration("30s") == 30'000);
  CHECK(*ParseDuration("5m") == 300'000);
  CHECK(*ParseDuration("24h") == 86'400'000);
  CHECK(*ParseDuration("7d") == 7 * 86'400'000LL);
  CHECK(*ParseDuration("forever") == 0);
  for (const char* bad : {"", "s", "10", "10x", "-5s", "1.5h", "10 s", "99999999999999999999d"}) {
    CAPTURE(bad);
    CHECK(ParseDuration(bad).status().code() == Code::kInvalidArgument);
  }
}

TEST_CASE("ParseDuration refuses a duration that now + it could overflow") {
  CHECK(*ParseDuration("36500d") == 36500 * 86'400'000LL);
  // Each fits in 64 bits, but added to "now" (an expiry) it would not.
  for (const char* big : {"36501d", "9223372036854775807ms", "106751991167d", "2562047788015h"}) {
    CAPTURE(big);
    StatusOr<int64_t> r = ParseDuration(big);
    CHECK(r.status().code() == Code::kInvalidArgument);
  }
}

TEST_CASE("FormatDuration picks the largest exact unit") {
  CHECK(FormatDuration(250) == "250ms");
  CHECK(FormatDuration(1500) == "1500ms");
  CHECK(FormatDuration(30'000) == "30s");
  CHECK(FormatDuration(90'000) == "90s");
  CHECK(FormatDuration(300'000) == "5m");
  CHECK(FormatDuration(86'400'000) == "24h");
  CHECK(FormatDuration(7 * 86'400'000LL) == "7d");
}

TEST_CASE("contracts state identity, window and duplicate response for each action and step") {
  auto config = LoadConfig(IDEM_SOURCE_DIR "/config/idem.yaml");
  REQUIRE(config.ok());
  std::string text = DescribeContracts(*config);
  CHECK(text.find("action send_reply: the same work is the same /ticket_id and /text (version "
                  "v1); it is remembered for 24h; a duplicate returns the original result.\n") !=
        std::string::npos);
  CHECK(text.find("step triage_ticket: the same work is the same input (ignoring received_at, "
                  "request_id and trace_id) sent to provider demo, model demo-1, prompt v1, "
                  "temperature 0") != std::string::npos);
  CHECK(text.find("it is remembered forever; a duplicate returns the cached decision") !=
        std::string::npos);

  ConfigDir dir;
  auto other = dir.Load(kMinimal + R"(  close_ticket:
    identity: {fields: [/ticket_id], version: v3}
    window: forever
    on_duplicate: conflict
  tag_ticket:
    identity: {fields: [/ticket_id, /tag], version: v1}
    window: 10m
    on_duplicate: ignore
)");
  REQUIRE_MESSAGE(other.ok(), other.status().ToString());
  text = DescribeContracts(*other);
  CHECK(text.find("action close_ticket: the same work is the same /ticket_id (version v3); it is "
                  "remembered forever; a duplicate is refused with a conflict error") !=
        std::string::npos);
  CHECK(text.find("action tag_ticket: the same work is the same /ticket_id and /tag (version "
                  "v1); it is remembered for 10m; a duplicate is silently ignored") !=
        std::string::npos);
  CHECK(text.find("temperature 0.5") != std::string::npos);
  CHECK(std::count(text.begin(), text.end(), '\n') == 4);
}

TEST_CASE("server.rate_limit is off by default and its burst defaults to one second's worth") {
  ConfigDir dir;
  auto config = dir.Load("# nothing here\n");
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());
  CHECK(config->server.rate_limit.requests_per_s == 0);

  config = dir.Load("server:\n  rate_limit: {requests_per_s: 2.5}\n");
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());
  CHECK(config->server.rate_limit.requests_per_s == 2.5);
  CHECK(config->server.rate_limit.burst == 3);

  config = dir.Load("server:\n  rate_limit: {requests_per_s: 50, burst: 200}\n");
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());
  CHECK(config->server.rate_limit.burst == 200);
}

TEST_CASE("server.rate_limit refuses a rate of zero, a burst below one and a missing rate") {
  ConfigDir dir;
  auto config = dir.Load("server:\n  rate_limit: {requests_per_s: 0}\n");
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().message().find("/server/rate_limit/requests_per_s") != std::string::npos);
  // Slower than one request in 1,000 s is a typo, not a rate (1e-300 made
  // the wait overflow and told callers to retry in 1 s).
  for (const char* tiny : {"0.0009", "1e-300"}) {
    CAPTURE(tiny);
    config = dir.Load(std::string("server:\n  rate_limit: {requests_per_s: ") + tiny + "}\n");
    REQUIRE_FALSE(config.ok());
    CHECK(config.status().message().find("/server/rate_limit/requests_per_s") != std::string::npos);
  }
  CHECK(dir.Load("server:\n  rate_limit: {requests_per_s: 0.001}\n").ok());

  config = dir.Load("server:\n  rate_limit: {requests_per_s: 5, burst: 0}\n");
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().message().find("/server/rate_limit/burst") != std::string::npos);

  config = dir.Load("server:\n  rate_limit: {burst: 5}\n");
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().message().find("/server/rate_limit/requests_per_s: missing required key") !=
        std::string::npos);
}

}  // namespace
}  // namespace idem

namespace idem {
namespace {

TEST_CASE("log_level_and_access_are_read_with_defaults_when_absent") {
  ConfigDir dir;
  auto plain = dir.Load(kMinimal);
  REQUIRE(plain.ok());
  CHECK(plain->log.level.empty());  // idem serve --log-level decides
  CHECK(plain->log.access);
  auto set = dir.Load(kMinimal + "log:\n  level: warn\n  access: false\n");
  REQUIRE_MESSAGE(set.ok(), set.status().ToString());
  CHECK(set->log.level == "warn");
  CHECK_FALSE(set->log.access);
}

TEST_CASE("an_unknown_log_level_is_an_error_naming_log_level") {
  ConfigDir dir;
  auto bad = dir.Load(kMinimal + "log:\n  level: verbose\n");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().ToString().find("/log/level") != std::string::npos);
  auto not_bool = dir.Load(kMinimal + "log:\n  access: sometimes\n");
  REQUIRE_FALSE(not_bool.ok());
  CHECK(not_bool.status().ToString().find("/log/access") != std::string::npos);
}

}  // namespace
}  // namespace idem
