// LoadConfig: YAML -> JSON (yaml_document.cc) -> schema check -> typed
// structs. The schema catches shapes and ranges; this file catches what a
// schema cannot: references between sections, files on disk, durations
// that overflow, templates and output schemas that do not compile.
#include <sys/un.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <kainjow/mustache.hpp>
#include <mutex>
#include <set>
#include <sstream>
#include <utility>

#include "daemon/config/config.h"
#include "daemon/config/yaml_document.h"
#include "daemon/core/crypto.h"
#include "daemon/core/file_read.h"
#include "daemon/core/identity.h"
#include "daemon/core/json.h"
#include "daemon/core/json_schema.h"

namespace idem {
namespace {

namespace fs = std::filesystem;

constexpr size_t kMaxSchemaFileBytes = 4 << 20;

const JsonSchema* CompiledConfigSchema(Status* error) {
  static std::once_flag once;
  static std::unique_ptr<JsonSchema> schema;
  static Status failure;
  std::call_once(once, [] {
    auto parsed = ParseJson(ConfigSchemaText(), JsonLimits{kMaxSchemaFileBytes, 64});
    if (!parsed.ok()) {
      failure = Internal("built-in config schema is not JSON: " + parsed.status().message());
      return;
    }
    auto created = JsonSchema::Create(*parsed);
    if (!created.ok()) {
      failure = Internal("built-in config schema is invalid: " + created.status().message());
      return;
    }
    schema = std::move(created).value();
  });
  if (!schema) *error = failure;
  return schema.get();
}

std::string Token(std::string_view name) { return "/" + JsonPointerToken(name); }

// The schema's #/definitions/name, checked here because valijson reports a
// failed propertyNames without saying which name failed.
bool IsName(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  if (!((name[0] >= 'A' && name[0] <= 'Z') || (name[0] >= 'a' && name[0] <= 'z'))) return false;
  for (char c : name) {
    bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == '-';
    if (!ok) return false;
  }
  return true;
}

// An environment variable's name: letters, digits and _, not starting with a digit.
bool IsEnvName(const std::string& name) {
  if (name.empty() || name.size() > 128 || (name[0] >= '0' && name[0] <= '9')) return false;
  for (char c : name) {
    bool ok =
        (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
    if (!ok) return false;
  }
  return true;
}

// A PostgreSQL identifier that needs no quoting (lower case, at most 63 bytes).
bool IsSqlName(const std::string& name) {
  if (name.empty() || name.size() > 63 || (name[0] >= '0' && name[0] <= '9')) return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
    if (!ok) return false;
  }
  return true;
}

// A prompt template or a JSON Schema file the config names: at most 4 MiB,
// however large the file says it is (/dev/zero says 0).
StatusOr<std::string> ReadFileText(const std::string& path) {
  return ReadFileAtMost(path, kMaxSchemaFileBytes, "");
}

std::string JoinWords(const std::vector<std::string>& words) {
  std::string out;
  for (size_t i = 0; i < words.size(); ++i) {
    if (i > 0) out += i + 1 == words.size() ? " and " : ", ";
    out += words[i];
  }
  return out;
}

// Resolves one validated document into a Config. Every error goes through
// doc_.Error so that it carries the file, line and pointer.
class Resolver {
 public:
  Resolver(const YamlDocument& doc, Config& config) : doc_(doc), config_(config) {}

  Status Run() {
    const Json& root = doc_.value;
    for (const char* section : {"providers", "steps", "actions"}) {
      if (!root.contains(section)) continue;
      for (const auto& [name, unused] : root[section].items()) {
        if (!IsName(name)) {
          return doc_.Error("/" + std::string(section) + Token(name),
                            "a name must start with a letter and hold only letters, digits, "
                            "_ . and - (at most 64 characters)");
        }
        if (std::string_view(section) == "actions" && name.starts_with("idem.")) {
          return doc_.Error("/actions" + Token(name),
                            "names starting with idem. are reserved for idem's own action kinds "
                            "(notifications)");
        }
      }
    }
    if (root.contains("server")) RETURN_IF_ERROR(Server(root["server"]));
    if (root.contains("store")) RETURN_IF_ERROR(Store(root["store"]));
    if (root.contains("auth")) RETURN_IF_ERROR(Auth(root["auth"]));
    if (root.contains("idempotency")) RETURN_IF_ERROR(Idempotency(root["idempotency"]));
    if (root.contains("log")) RETURN_IF_ERROR(Log(root["log"]));
    if (root.contains("providers")) {
      for (const auto& [name, node] : root["providers"].items()) {
        RETURN_IF_ERROR(Provider(name, node));
      }
    }
    if (root.contains("steps")) {
      for (const auto& [name, node] : root["steps"].items()) RETURN_IF_ERROR(Step(name, node));
    }
    if (root.contains("actions")) {
      for (const auto& [name, node] : root["actions"].items()) {
        RETURN_IF_ERROR(Action(name, node));
      }
    }
    if (root.contains("inbox")) {
      for (const auto& [name, node] : root["inbox"].items()) RETURN_IF_ERROR(Inbox(name, node));
    }
    if (root.contains("prices")) config_.prices = root["prices"];
    if (root.contains("notifications")) RETURN_IF_ERROR(Notifications(root["notifications"]));
    if (root.contains("outbox")) RETURN_IF_ERROR(Outbox(root["outbox"]));
    return Status::Ok();
  }

 private:
  std::string Path(const std::string& written) const {
    fs::path p(written);
    if (p.is_absolute()) return p.lexically_normal().string();
    return (fs::path(config_.base_dir) / p).lexically_normal().string();
  }

  // A path that must name a readable regular file.
  StatusOr<std::string> ExistingFile(const std::string& pointer, const std::string& written) {
    std::string path = Path(written);
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) {
      return doc_.Error(pointer, "no such file: " + path);
    }
    return path;
  }

  StatusOr<int64_t> Duration(const std::string& pointer, const Json& node, bool allow_forever) {
    const std::string text = node.get<std::string>();
    if (text == "forever" && !allow_forever) {
      return doc_.Error(pointer, "must be a finite duration, not forever");
    }
    auto ms = ParseDuration(text);
    if (!ms.ok()) return doc_.Error(pointer, ms.status().message());
    if (*ms == 0 && text != "forever") {
      return doc_.Error(pointer, allow_forever
                                     ? "must be longer than 0 (write forever for no expiry)"
                                     : "must be longer than 0");
    }
    return *ms;
  }

  Status Server(const Json& node) {
    ServerConfig& s = config_.server;
    s.listen = node.value("listen", s.listen);
    if (auto parsed = ParseListen(s.listen); !parsed.ok()) {
      return doc_.Error("/server/listen", parsed.status().message());
    }
    if (node.contains("unix_socket")) s.unix_socket = Path(node["unix_socket"].get<std::string>());
    if (s.unix_socket.size() >= sizeof(sockaddr_un::sun_path)) {
      return doc_.Error("/server/unix_socket",
                        "is " + std::to_string(s.unix_socket.size()) +
                            " bytes long (resolved against the config's folder); a Unix socket "
                            "path holds at most " +
                            std::to_string(sizeof(sockaddr_un::sun_path) - 1));
    }
    if (node.contains("unix_socket_mode")) {
      if (s.unix_socket.empty()) {
        return doc_.Error("/server/unix_socket_mode", "applies only with server.unix_socket");
      }
      s.unix_socket_mode = static_cast<int>(
          std::strtol(node["unix_socket_mode"].get<std::string>().c_str(), nullptr, 8));
      // Connecting takes write permission on the socket file: without the
      // owner's, the daemon's own user (its CLI, its supervisor) is shut out.
      if ((s.unix_socket_mode & 0200) == 0) {
        return doc_.Error("/server/unix_socket_mode",
                          "must let the daemon's own user connect (the owner's write bit, as in "
                          "\"0600\")");
      }
    }
    s.threads = node.value("threads", s.threads);
    s.max_body_bytes = node.value("max_body_bytes", s.max_body_bytes);
    s.max_json_depth = node.value("max_json_depth", s.max_json_depth);
    s.max_connections = node.value("max_connections", s.max_connections);
    s.max_queue = node.value("max_queue", s.max_queue);
    if (node.contains("drain_timeout")) {
      ASSIGN_OR_RETURN(s.drain_timeout_ms,
                       Duration("/server/drain_timeout", node["drain_timeout"], false));
    }
    if (node.contains("rate_limit")) {
      const Json& rl = node["rate_limit"];
      s.rate_limit.requests_per_s = rl["requests_per_s"].get<double>();
      s.rate_limit.burst =
          rl.value("burst", std::max(1, static_cast<int>(std::ceil(s.rate_limit.requests_per_s))));
    }
    for (const char* list : {"allowed_origins", "allowed_hosts"}) {
      std::vector<std::string>& out =
          std::string_view(list) == "allowed_origins" ? s.allowed_origins : s.allowed_hosts;
      for (const auto& v : node.value(list, std::vector<std::string>{})) {
        std::string lower = v;
        for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        out.push_back(std::move(lower));
      }
    }
    return Status::Ok();
  }

  Status Store(const Json& node) {
    StoreConfig& s = config_.store;
    s.engine = node.value("engine", s.engine);
    s.path = Path(node.value("path", s.path));
    s.sync = node.value("sync", s.sync);
    s.min_free_mb = node.value("min_free_mb", s.min_free_mb);
    s.trace_budget_mb = node.value("trace_budget_mb", s.trace_budget_mb);
    // The schema allows these; they mean something only to one engine.
    const bool postgres = s.engine == "postgres";
    for (const char* key : {"url_env", "schema", "pool_size", "statement_timeout"}) {
      if (node.contains(key) && !postgres) {
        return doc_.Error("/store/" + std::string(key),
                          "applies only to engine postgres (store.engine is " + s.engine + ")");
      }
    }
    for (const char* key : {"path", "sync", "min_free_mb", "trace_budget_mb"}) {
      if (node.contains(key) && postgres) {
        return doc_.Error("/store/" + std::string(key),
                          "applies only to engine rocksdb (store.engine is postgres)");
      }
    }
    s.url_env = node.value("url_env", s.url_env);
    if (!s.url_env.empty() && !IsEnvName(s.url_env)) {
      return doc_.Error("/store/url_env",
                        "must be the NAME of an environment variable (letters, digits and _), "
                        "never the URL itself");
    }
    s.schema = node.value("schema", s.schema);
    if (!IsSqlName(s.schema)) {
      return doc_.Error("/store/schema",
                        "must be a lower-case SQL name: a-z, 0-9 and _, starting with a letter or "
                        "_, at most 63 characters");
    }
    s.pool_size = node.value("pool_size", s.pool_size);
    if (node.contains("finished_retention")) {
      ASSIGN_OR_RETURN(s.finished_retention_ms,
                       Duration("/store/finished_retention", node["finished_retention"], true));
    }
    if (node.contains("statement_timeout")) {
      ASSIGN_OR_RETURN(s.statement_timeout_ms,
                       Duration("/store/statement_timeout", node["statement_timeout"], false));
    }
    return Status::Ok();
  }

  Status Auth(const Json& node) {
    std::set<std::string> names;
    std::map<std::string, std::string> hashes;  // lower-case sha256 -> the first name with it
    for (size_t i = 0; i < node.value("tokens", Json::array()).size(); ++i) {
      const Json& t = node["tokens"][i];
      AuthToken token{t["name"], t["sha256"], t["roles"].get<std::vector<std::string>>()};
      for (size_t r = 0; r < token.roles.size(); ++r) {
        if (std::find(std::begin(kAuthRoles), std::end(kAuthRoles), token.roles[r]) ==
            std::end(kAuthRoles)) {
          return doc_.Error(
              "/auth/tokens/" + std::to_string(i) + "/roles/" + std::to_string(r),
              "unknown role '" + token.roles[r] + "' (roles are agent, operator and admin)");
        }
      }
      // The actors the daemon writes itself: a token by such a name would
      // pass for a caller without a token, or for the daemon, in the audit
      // trail and in the approver-separation checks.
      if (IsReservedCallerName(token.name)) {
        return doc_.Error("/auth/tokens/" + std::to_string(i) + "/name",
                          "'" + token.name +
                              "' is reserved: anonymous is a caller without a token and idem the "
                              "daemon itself in the audit trail; choose another name");
      }
      if (!names.insert(token.name).second) {
        return doc_.Error("/auth/tokens/" + std::to_string(i) + "/name",
                          "duplicate token name '" + token.name + "'");
      }
      // One secret, two names: which name (and roles) a caller gets would
      // depend on the order of the list.
      std::string hash = token.sha256;
      std::transform(hash.begin(), hash.end(), hash.begin(),
                     [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      if (auto [it, fresh] = hashes.emplace(hash, token.name); !fresh) {
        return doc_.Error("/auth/tokens/" + std::to_string(i) + "/sha256",
                          "token '" + token.name + "' has the same sha256 as token '" + it->second +
                              "': one secret must name one caller");
      }
      config_.auth.tokens.push_back(std::move(token));
    }
    return Status::Ok();
  }

  Status Log(const Json& node) {
    // The schema allows only the four levels and a boolean; checked again
    // here so a caller of the loader without the schema gets the key path.
    if (node.contains("level")) {
      const Json& level = node["level"];
      if (!level.is_string() ||
          (level != "debug" && level != "info" && level != "warn" && level != "error")) {
        return doc_.Error("/log/level", "must be one of debug, info, warn, error");
      }
      config_.log.level = level.get<std::string>();
    }
    if (node.contains("access")) {
      if (!node["access"].is_boolean()) return doc_.Error("/log/access", "must be true or false");
      config_.log.access = node["access"].get<bool>();
    }
    return Status::Ok();
  }

  Status Idempotency(const Json& node) {
    IdempotencyConfig& c = config_.idempotency;
    if (node.contains("window")) {
      ASSIGN_OR_RETURN(c.window_ms, Duration("/idempotency/window", node["window"], false));
    }
    if (node.contains("lease")) {
      ASSIGN_OR_RETURN(c.lease_ms, Duration("/idempotency/lease", node["lease"], false));
      // The lease is renewed every third of it by a store write: a lease a
      // few writes long lapses while its request still runs, and a second
      // request with the key would run beside the first.
      if (c.lease_ms < kMinIdempotencyLeaseMs) {
        return doc_.Error("/idempotency/lease",
                          "must be at least 100ms: the key's lease is renewed every third of it "
                          "by a store write, and a shorter one lapses while its request runs");
      }
    }
    if (node.contains("routes")) {
      for (const auto& [route, window] : node["routes"].items()) {
        ASSIGN_OR_RETURN(c.route_windows_ms[route],
                         Duration("/idempotency/routes" + Token(route), window, false));
      }
    }
    return Status::Ok();
  }

  Status Provider(const std::string& name, const Json& node) {
    const std::string at = "/providers" + Token(name);
    ProviderConfig p;
    p.name = name;
    p.type = node["type"];
    p.api_key_env = node.value("api_key_env", "");
    p.base_url = node.value("base_url", "");
    p.raw = node;
    if (p.type == "scripted") {
      for (const auto& [key, value] : node.items()) {
        if (key != "type" && key != "rules") {
          return doc_.Error(at + Token(key),
                            "unknown key for a scripted provider (it takes rules)");
        }
      }
      if (!node.contains("rules")) return doc_.Error(at, "missing required key 'rules'");
      ASSIGN_OR_RETURN(p.rules_path, ExistingFile(at + "/rules", node["rules"]));
    } else if (p.type == "replay") {
      for (const auto& [key, value] : node.items()) {
        if (key != "type" && key != "file") {
          return doc_.Error(at + Token(key),
                            "unknown key for a replay provider (it takes file: a decisions "
                            "export)");
        }
      }
      if (!node.contains("file")) return doc_.Error(at, "missing required key 'file'");
      ASSIGN_OR_RETURN(p.file_path, ExistingFile(at + "/file", node["file"]));
    } else {
      if (node.contains("rules")) {
        return doc_.Error(at + "/rules", "only scripted providers take a rules file");
      }
      if (node.contains("file")) {
        return doc_.Error(at + "/file", "only replay providers take a file");
      }
      // A key another type reads would be ignored here, silently (an `api:
      // ollama` under type openai would call OpenAI).
      static constexpr std::pair<const char*, const char*> kOwnKeys[] = {
          {"api", "openai_compatible"},
          {"organization", "openai"},
          {"structured_output", "anthropic"}};
      for (const auto& [key, type] : kOwnKeys) {
        if (node.contains(key) && p.type != type) {
          return doc_.Error(at + Token(key), std::string("only ") + type + " providers take " +
                                                 key + " (this one is " + p.type + ")");
        }
      }
      const Json unsupported = node.value("unsupported_params", Json::object());
      for (const auto& [pattern, params] : unsupported.items()) {
        const size_t star = pattern.find('*');
        if (star != std::string::npos && star + 1 != pattern.size()) {
          return doc_.Error(at + "/unsupported_params" + Token(pattern),
                            "a model pattern is a model name or a prefix ending in one '*'");
        }
        p.unsupported_params.emplace_back(pattern, params.get<std::vector<std::string>>());
      }
      if (node.contains("headers") && node["headers"].is_object()) {
        for (const auto& [hname, value] : node["headers"].items()) {
          if (!value.is_string()) continue;  // the schema said so already
          RETURN_IF_ERROR(
              CheckEnvReferences(at + "/headers" + Token(hname), value.get<std::string>()));
        }
      }
    }
    config_.providers[name] = std::move(p);
    return Status::Ok();
  }

  Status CheckProvider(const std::string& pointer, const std::string& name) {
    if (config_.providers.count(name) != 0) return Status::Ok();
    std::vector<std::string> declared;
    for (const auto& [n, unused] : config_.providers) declared.push_back(n);
    return doc_.Error(pointer, "no provider named '" + name + "' (declared: " +
                                   (declared.empty() ? "none" : JoinWords(declared)) + ")");
  }

  // A step that sets a sampling parameter which the model of its provider
  // (or of a fallback) refuses would fail on every call: refuse the config
  // instead of dropping the parameter silently, which would change answers.
  Status CheckSampling(const std::string& at, const StepConfig& s) {
    if (!s.temperature) return Status::Ok();
    struct Use {
      std::string provider, model;
    };
    std::vector<Use> uses = {{s.provider, s.model}};
    for (const Json& f : s.fallback) {
      if (f.is_object()) {
        uses.push_back({f.value("provider", s.provider), f.value("model", s.model)});
      }
    }
    for (const Use& u : uses) {
      const ProviderConfig& p = config_.providers.at(u.provider);
      // The Messages API takes 0.0 to 1.0 (MessageCreateParams), OpenAI 0 to 2.
      if (p.type == "anthropic" && *s.temperature > 1) {
        return doc_.Error(at + "/temperature", "provider " + u.provider +
                                                   " (anthropic) takes a temperature from 0 to 1");
      }
      for (const auto& [pattern, params] : p.unsupported_params) {
        const bool matches = pattern.ends_with('*')
                                 ? u.model.starts_with(pattern.substr(0, pattern.size() - 1))
                                 : u.model == pattern;
        if (!matches || std::find(params.begin(), params.end(), "temperature") == params.end()) {
          continue;
        }
        return doc_.Error(at + "/temperature", "model " + u.model + " of provider " + u.provider +
                                                   " does not accept temperature (providers." +
                                                   u.provider + ".unsupported_params." + pattern +
                                                   "); remove temperature from the step");
      }
    }
    return Status::Ok();
  }

  Status Step(const std::string& name, const Json& node) {
    const std::string at = "/steps" + Token(name);
    StepConfig s;
    s.name = name;
    s.provider = node["provider"];
    RETURN_IF_ERROR(CheckProvider(at + "/provider", s.provider));
    s.model = node["model"];
    if (node.contains("temperature")) s.temperature = node["temperature"].get<double>();
    s.system_prompt = node.value("system", "");

    const Json& prompt = node["prompt"];
    ASSIGN_OR_RETURN(s.prompt.template_path,
                     ExistingFile(at + "/prompt/template", prompt["template"]));
    s.prompt.version = prompt["version"];
    auto text = ReadFileText(s.prompt.template_path);
    if (!text.ok()) {
      return doc_.Error(at + "/prompt/template",
                        "cannot read " + s.prompt.template_path + ": " + text.status().message());
    }
    s.prompt.text = std::move(text).value();
    s.prompt.sha256 = Sha256Hex(s.prompt.text);
    kainjow::mustache::mustache compiled(s.prompt.text);
    if (!compiled.is_valid()) {
      return doc_.Error(at + "/prompt/template",
                        s.prompt.template_path +
                            " is not a valid mustache template: " + compiled.error_message());
    }

    ASSIGN_OR_RETURN(s.output_schema_path,
                     ExistingFile(at + "/output_schema", node["output_schema"]));
    auto schema_text = ReadFileText(s.output_schema_path);
    if (!schema_text.ok()) {
      return doc_.Error(at + "/output_schema", "cannot read " + s.output_schema_path + ": " +
                                                   schema_text.status().message());
    }
    auto schema = ParseJson(*schema_text, JsonLimits{kMaxSchemaFileBytes, 64});
    if (!schema.ok()) {
      return doc_.Error(at + "/output_schema",
                        s.output_schema_path + " is not JSON: " + schema.status().message());
    }
    auto compiled_schema = JsonSchema::Create(*schema);
    if (!compiled_schema.ok()) {
      std::string where = compiled_schema.status().field().empty()
                              ? std::string()
                              : " at " + compiled_schema.status().field();
      return doc_.Error(at + "/output_schema",
                        s.output_schema_path + where + ": " + compiled_schema.status().message());
    }
    s.output_schema = std::move(schema).value();

    s.tools = node.value("tools", Json::array());
    // Hashed once here rather than on every decide (the key covers both).
    {
      auto schema_jcs = CanonicalJson(s.output_schema);
      if (!schema_jcs.ok()) return doc_.Error(at + "/output_schema", schema_jcs.status().message());
      s.output_schema_sha256 = Sha256Hex(*schema_jcs);
      auto tools_jcs = CanonicalJson(s.tools);
      if (!tools_jcs.ok()) return doc_.Error(at + "/tools", tools_jcs.status().message());
      s.tools_sha256 = Sha256Hex(*tools_jcs);
      auto prompt_hash = ComputePromptHash(s.prompt.text, s.system_prompt, s.tools);
      if (!prompt_hash.ok()) return doc_.Error(at + "/tools", prompt_hash.status().message());
      s.prompt.hash = std::move(prompt_hash).value();
    }
    if (node.contains("prompts")) {
      for (const auto& [version, other] : node["prompts"].items()) {
        const std::string where = at + "/prompts" + Token(version);
        if (version == s.prompt.version) {
          return doc_.Error(where,
                            "is the step's default prompt version (prompt.version); name "
                            "another version here");
        }
        PromptConfig p;
        p.version = version;
        ASSIGN_OR_RETURN(p.template_path, ExistingFile(where + "/template", other["template"]));
        auto other_text = ReadFileText(p.template_path);
        if (!other_text.ok()) {
          return doc_.Error(where + "/template", "cannot read " + p.template_path + ": " +
                                                     other_text.status().message());
        }
        p.text = std::move(other_text).value();
        p.sha256 = Sha256Hex(p.text);
        kainjow::mustache::mustache other_compiled(p.text);
        if (!other_compiled.is_valid()) {
          return doc_.Error(where + "/template", p.template_path +
                                                     " is not a valid mustache template: " +
                                                     other_compiled.error_message());
        }
        auto other_hash = ComputePromptHash(p.text, s.system_prompt, s.tools);
        if (!other_hash.ok()) return doc_.Error(where, other_hash.status().message());
        p.hash = std::move(other_hash).value();
        s.other_prompts.emplace(version, std::move(p));
      }
    }
    if (node.contains("input")) {
      const Json& input = node["input"];
      s.input.drop = input.value("drop", std::vector<std::string>{});
      s.input.trim_strings = input.value("trim", s.input.trim_strings);
      s.input.url_fields = input.value("urls", std::vector<std::string>{});
    }
    if (node.contains("checks")) {
      ASSIGN_OR_RETURN(s.checks_path, ExistingFile(at + "/checks", node["checks"]));
    }
    s.attempts = node.value("attempts", s.attempts);
    if (node.contains("timeout")) {
      ASSIGN_OR_RETURN(s.timeout_ms, Duration(at + "/timeout", node["timeout"], false));
    }
    if (node.contains("retry")) {
      const Json& r = node["retry"];
      if (r.contains("base")) {
        ASSIGN_OR_RETURN(s.retry_base_ms, Duration(at + "/retry/base", r["base"], false));
      }
      if (r.contains("cap")) {
        ASSIGN_OR_RETURN(s.retry_cap_ms, Duration(at + "/retry/cap", r["cap"], false));
      }
    }
    if (s.retry_cap_ms < s.retry_base_ms) {
      return doc_.Error(at + "/retry/cap",
                        "must not be shorter than base (" + FormatDuration(s.retry_base_ms) + ")");
    }
    s.fallback = node.value("fallback", Json::array());
    for (size_t i = 0; i < s.fallback.size(); ++i) {
      const Json& f = s.fallback[i];
      // Escalating ends the decide: a model after it would never be asked.
      if (f == "escalate" && i + 1 < s.fallback.size()) {
        return doc_.Error(at + "/fallback/" + std::to_string(i + 1),
                          "nothing after escalate is tried (a human answers from there); put "
                          "escalate last");
      }
      if (f.is_object() && f.contains("provider")) {
        RETURN_IF_ERROR(
            CheckProvider(at + "/fallback/" + std::to_string(i) + "/provider", f["provider"]));
      }
    }
    RETURN_IF_ERROR(CheckSampling(at, s));
    if (node.contains("cache") && node["cache"].contains("window")) {
      ASSIGN_OR_RETURN(s.cache_window_ms,
                       Duration(at + "/cache/window", node["cache"]["window"], true));
    }
    if (node.contains("plan")) s.plan_pointer = node["plan"]["pointer"];
    if (node.contains("approval")) {
      ASSIGN_OR_RETURN(s.approval, Approval(at + "/approval", node["approval"]));
    }
    config_.steps[name] = std::move(s);
    return Status::Ok();
  }

  Status Action(const std::string& name, const Json& node) {
    const std::string at = "/actions" + Token(name);
    ActionConfig a;
    a.name = name;
    a.identity_fields = node["identity"]["fields"].get<std::vector<std::string>>();
    a.identity_version = node["identity"]["version"];
    ASSIGN_OR_RETURN(a.window_ms, Duration(at + "/window", node["window"], true));
    a.on_duplicate = node["on_duplicate"];
    a.effector = node.value("effector", Json::object());
    if (node.contains("retry")) {
      const Json& r = node["retry"];
      a.retry.attempts = r.value("attempts", a.retry.attempts);
      if (r.contains("base")) {
        ASSIGN_OR_RETURN(a.retry.base_ms, Duration(at + "/retry/base", r["base"], false));
      }
      if (r.contains("cap")) {
        ASSIGN_OR_RETURN(a.retry.cap_ms, Duration(at + "/retry/cap", r["cap"], false));
      }
      if (r.contains("timeout")) {
        ASSIGN_OR_RETURN(a.retry.timeout_ms, Duration(at + "/retry/timeout", r["timeout"], false));
      }
    }
    if (a.retry.cap_ms < a.retry.base_ms) {
      return doc_.Error(at + "/retry/cap",
                        "must not be shorter than base (" + FormatDuration(a.retry.base_ms) + ")");
    }
    if (node.contains("approval")) {
      ASSIGN_OR_RETURN(a.approval, Approval(at + "/approval", node["approval"]));
    }
    if (node.contains("args_schema")) {
      ASSIGN_OR_RETURN(a.args_schema_path, ExistingFile(at + "/args_schema", node["args_schema"]));
      ASSIGN_OR_RETURN(a.args_schema, SchemaFile(at + "/args_schema", a.args_schema_path));
    }
    config_.actions[name] = std::move(a);
    return Status::Ok();
  }

  Status Inbox(const std::string& name, const Json& node) {
    const std::string at = "/inbox" + Token(name);
    if (!IsName(name)) return doc_.Error(at, "a source name is letters, digits, _ . -");
    InboxSource s;
    s.name = name;
    auto lower = [](std::string v) {
      for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      return v;
    };
    s.id_pointer = node["event_id"].value("pointer", "");
    s.id_header = lower(node["event_id"].value("header", ""));
    if (node.contains("signature")) {
      const Json& sig = node["signature"];
      s.signature_header = lower(sig["header"]);
      s.signature_env = sig["secret_env"];
      s.signature_scheme = sig.value("scheme", s.signature_scheme);
      s.signature_prefix = sig.value("prefix", "");
    }
    const Json& on = node["on_event"];
    s.payload_pointer = on.value("pointer", "");
    if (on.contains("decide")) {
      s.decide_step = on["decide"];
      if (!config_.steps.count(s.decide_step)) {
        return doc_.Error(at + "/on_event/decide", "no step named " + s.decide_step);
      }
    } else if (on.contains("action")) {
      s.action_kind = on["action"];
      if (!config_.actions.count(s.action_kind)) {
        return doc_.Error(at + "/on_event/action", "no action kind named " + s.action_kind);
      }
      if (config_.actions.at(s.action_kind).effector.empty()) {
        // Every event would be refused (409), and a sender drops a 4xx.
        return doc_.Error(at + "/on_event/action",
                          "action kind " + s.action_kind +
                              " has no effector: its work is done by clients (POST "
                              "/v1/work/claim), so the inbox could only refuse its events; give "
                              "the kind an effector");
      }
    } else {
      s.record_only = true;
    }
    if (node.contains("window")) {
      // Finite: event ids kept forever would grow the store without bound.
      ASSIGN_OR_RETURN(s.window_ms, Duration(at + "/window", node["window"], false));
    }
    config_.inbox[name] = std::move(s);
    return Status::Ok();
  }

  // `${VAR}` references in a header value must be well formed (the values
  // themselves are read from the environment at start-up, never here).
  Status CheckEnvReferences(const std::string& pointer, const std::string& value) {
    size_t pos = 0;
    while ((pos = value.find("${", pos)) != std::string::npos) {
      size_t end = value.find('}', pos);
      if (end == std::string::npos) return doc_.Error(pointer, "has an unclosed '${'");
      std::string_view var(value.data() + pos + 2, end - pos - 2);
      bool ok = !var.empty() && !std::isdigit(static_cast<unsigned char>(var[0]));
      for (char c : var) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
      if (!ok) {
        return doc_.Error(
            pointer,
            "${" + std::string(var) + "} is not an environment variable name (letters, digits, _)");
      }
      pos = end + 1;
    }
    return Status::Ok();
  }

  static std::string WithoutTrailingSlash(std::string url) {
    while (url.ends_with("/")) url.pop_back();
    return url;
  }

  Status Notifications(const Json& node) {
    NotificationsConfig& n = config_.notifications;
    n.link_base = WithoutTrailingSlash(node.value("link_base", ""));
    if (node.contains("webhook")) {
      const Json& w = node["webhook"];
      WebhookNotifyConfig webhook;
      webhook.url = w["url"];
      const Json no_headers = Json::object();
      const Json& headers = w.contains("headers") ? w["headers"] : no_headers;
      for (const auto& [name, value] : headers.items()) {
        const std::string at = "/notifications/webhook/headers" + Token(name);
        if (name.empty() || name.find_first_of(" :\r\n\t") != std::string::npos) {
          return doc_.Error(at, "is not a header name");
        }
        const std::string text = value.get<std::string>();
        if (text.find_first_of("\r\n") != std::string::npos) {
          return doc_.Error(at, "must not contain CR or LF");
        }
        RETURN_IF_ERROR(CheckEnvReferences(at, text));
        webhook.headers.emplace_back(name, text);
      }
      n.webhook = std::move(webhook);
    }
    if (node.contains("telegram")) {
      const Json& t = node["telegram"];
      TelegramNotifyConfig telegram;
      telegram.base_url = WithoutTrailingSlash(t.value("base_url", telegram.base_url));
      telegram.bot_token_env = t["bot_token_env"];
      const Json& chat = t["chat_id"];
      telegram.chat_id = chat.is_string() ? chat.get<std::string>() : chat.dump();
      n.telegram = std::move(telegram);
    }
    return Status::Ok();
  }

  Status Outbox(const Json& node) {
    OutboxConfig& o = config_.outbox;
    if (node.contains("retention")) {
      ASSIGN_OR_RETURN(o.retention_ms, Duration("/outbox/retention", node["retention"], false));
    }
    if (node.contains("poll")) {
      ASSIGN_OR_RETURN(o.poll_ms, Duration("/outbox/poll", node["poll"], false));
    }
    if (!node.contains("subscribers")) return Status::Ok();
    for (const auto& [name, sub] : node["subscribers"].items()) {
      const std::string at = "/outbox/subscribers" + Token(name);
      if (!IsName(name)) {
        return doc_.Error(at,
                          "a name must start with a letter and hold only letters, digits, "
                          "_ . and - (at most 64 characters)");
      }
      OutboxSubscriberConfig c;
      c.name = name;
      c.url = sub["url"];
      const Json no_headers = Json::object();
      const Json& headers = sub.contains("headers") ? sub["headers"] : no_headers;
      for (const auto& [hname, value] : headers.items()) {
        const std::string hat = at + "/headers" + Token(hname);
        if (hname.empty() || hname.find_first_of(" :\r\n\t") != std::string::npos) {
          return doc_.Error(hat, "is not a header name");
        }
        const std::string text = value.get<std::string>();
        if (text.find_first_of("\r\n") != std::string::npos) {
          return doc_.Error(hat, "must not contain CR or LF");
        }
        RETURN_IF_ERROR(CheckEnvReferences(hat, text));
        c.headers.emplace_back(hname, text);
      }
      if (sub.contains("signature")) c.signature_env = sub["signature"]["secret_env"];
      c.retry.attempts = sub.value("max_attempts", c.retry.attempts);
      if (sub.contains("backoff")) {
        const Json& b = sub["backoff"];
        if (b.contains("base")) {
          ASSIGN_OR_RETURN(c.retry.base_ms, Duration(at + "/backoff/base", b["base"], false));
        }
        if (b.contains("cap")) {
          ASSIGN_OR_RETURN(c.retry.cap_ms, Duration(at + "/backoff/cap", b["cap"], false));
        }
      }
      if (c.retry.cap_ms < c.retry.base_ms) {
        return doc_.Error(at + "/backoff/cap", "must not be shorter than base (" +
                                                   FormatDuration(c.retry.base_ms) + ")");
      }
      if (sub.contains("timeout")) {
        ASSIGN_OR_RETURN(c.retry.timeout_ms, Duration(at + "/timeout", sub["timeout"], false));
      }
      o.subscribers.emplace(name, std::move(c));
    }
    return Status::Ok();
  }

  // A JSON Schema file, parsed and checked to be usable.
  StatusOr<Json> SchemaFile(const std::string& pointer, const std::string& path) {
    auto text = ReadFileText(path);
    if (!text.ok())
      return doc_.Error(pointer, "cannot read " + path + ": " + text.status().message());
    auto schema = ParseJson(*text, JsonLimits{kMaxSchemaFileBytes, 64});
    if (!schema.ok())
      return doc_.Error(pointer, path + " is not JSON: " + schema.status().message());
    auto compiled = JsonSchema::Create(*schema);
    if (!compiled.ok()) {
      return doc_.Error(pointer, path + " is not a usable schema: " + compiled.status().message());
    }
    return std::move(schema).value();
  }

  // `approval`: a policy file's path, or the policy inline. The schema has
  // checked the inline shape; a file is checked here, with its own lines.
  StatusOr<ApprovalPolicy> Approval(const std::string& pointer, const Json& node) {
    ApprovalPolicy p;
    Json body = node;
    std::string where = pointer;
    if (node.is_string()) {
      ASSIGN_OR_RETURN(p.source, ExistingFile(pointer, node.get<std::string>()));
      auto file = ReadYamlFile(p.source);
      if (!file.ok()) return doc_.Error(pointer, file.status().message());
      body = file->value;
      if (!body.is_object()) return doc_.Error(pointer, p.source + ": a policy is a mapping");
      for (const auto& [key, value] : body.items()) {
        if (key != "require" && key != "when" && key != "reason" && key != "timeout" &&
            key != "on_timeout" && key != "description") {
          return file->Error("/" + key,
                             "unknown policy key (require, when, reason, timeout, "
                             "on_timeout, description)");
        }
      }
      where = p.source;
    } else {
      p.source = config_.source_path;
    }
    auto text = [&](const char* key, std::string& out,
                    std::initializer_list<std::string_view> allowed) -> Status {
      if (!body.contains(key)) return Status::Ok();
      if (!body[key].is_string()) return doc_.Error(pointer, where + ": " + key + " must be text");
      out = body[key].get<std::string>();
      if (allowed.size() == 0) return Status::Ok();
      for (std::string_view a : allowed) {
        if (out == a) return Status::Ok();
      }
      return doc_.Error(pointer, where + ": " + key + " '" + out + "' is not one of the choices");
    };
    p.require = body.contains("when") ? "when" : "always";
    RETURN_IF_ERROR(text("require", p.require, {"never", "always", "when"}));
    RETURN_IF_ERROR(text("reason", p.reason, {}));
    RETURN_IF_ERROR(text("on_timeout", p.on_timeout, {"expire", "escalate"}));
    if (body.contains("when")) p.when = body["when"];
    if (p.require == "when" && !body.contains("when")) {
      return doc_.Error(pointer, where + ": require: when needs a `when` rule");
    }
    if (p.when.is_boolean()) {  // when: true / false is always / never
      p.require = p.when.get<bool>() ? "always" : "never";
      p.when = Json();
    }
    if (body.contains("timeout")) {
      if (!body["timeout"].is_string())
        return doc_.Error(pointer, where + ": timeout must be text");
      ASSIGN_OR_RETURN(p.timeout_ms, Duration(pointer + "/timeout", body["timeout"], false));
    }
    if (p.reason.empty()) {
      p.reason = p.require == "always" ? "this action always needs a human's approval"
                                       : "the approval policy's rule matched";
    }
    return p;
  }

  const YamlDocument& doc_;
  Config& config_;
};

}  // namespace

StatusOr<Config> LoadConfig(const std::string& path) {
  Status schema_error;
  const JsonSchema* schema = CompiledConfigSchema(&schema_error);
  if (schema == nullptr) return schema_error;

  ASSIGN_OR_RETURN(YamlDocument doc, ReadYamlFile(path));
  if (doc.value.is_null()) doc.value = Json::object();  // an empty file: all defaults
  RETURN_IF_ERROR(doc.Check(*schema));

  Config config;
  config.source_path = path;
  config.source_lines = doc.lines;
  std::error_code ec;
  fs::path absolute = fs::absolute(fs::path(path), ec);
  if (ec) return InvalidArgument(path + ": cannot resolve its directory: " + ec.message());
  config.base_dir = absolute.lexically_normal().parent_path().string();
  // A schema-valid document has the types Resolver reads; nlohmann throws
  // only if that promise is broken, which is a bug worth naming.
  try {
    RETURN_IF_ERROR(Resolver(doc, config).Run());
  } catch (const std::exception& e) {
    return Internal(path + ": config passed its schema but could not be read: " + e.what());
  }
  return config;
}

Status LocateConfigError(const Config& config, Status status) {
  const std::string& field = status.field();
  if (status.ok() || !field.starts_with('/') ||
      status.message().starts_with(config.source_path + ":")) {
    return status;
  }
  YamlDocument doc{config.source_path, Json(), config.source_lines};
  const int line = doc.LineOf(field);
  if (line == 0 || config.source_lines.count(field.substr(0, field.find('/', 1))) == 0) {
    return status;
  }
  return Status(status.code(), doc.Error(field, status.message()).message(), field);
}

}  // namespace idem
