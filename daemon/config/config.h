// Config: idem's YAML configuration, validated against
// schemas/config.schema.json (valijson) and then resolved into typed structs.
//
// Relative paths inside a config file (prompt templates, output schemas,
// checks, scripted rules) resolve against the directory of that file.
// Provider keys are never in the file: a provider names the environment
// variable that holds its key (api_key_env).
//
// Errors: LoadConfig returns InvalidArgument whose message names the file,
// the line, the JSON pointer inside it (field()) and the reason, e.g.
//   "config/idem.yaml:12: /steps/triage_ticket/temperature: must be <= 2".
// When the schema finds several problems, each is on its own line; field()
// is the first one's pointer. Unknown keys are errors. A file that cannot
// be read (the config, a prompt template, an output schema, a rules or
// checks file) is InvalidArgument too, naming the key that referred to it.
//
// Thread-safety: a loaded Config is immutable and may be shared freely.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "daemon/core/status.h"

namespace idem {

using Json = nlohmann::json;

// A token bucket per caller (daemon/http/rate_limiter.h): past it, 429
// with Retry-After. requests_per_s 0: off.
struct RateLimitConfig {
  double requests_per_s = 0;
  int burst = 0;  // bucket size; 0 when unset: requests_per_s rounded up (at least 1)
};

struct ServerConfig {
  std::string listen = "127.0.0.1:7411";
  // Also serve on a Unix-domain socket at this path (empty: no); only
  // processes that may write the socket file (mode below, its folder's
  // permissions) can connect.
  std::string unix_socket;
  int unix_socket_mode = 0600;
  int threads = 64;
  size_t max_body_bytes = 1 << 20;
  int max_json_depth = 64;
  int max_connections = 1024;         // past it: 503 and close
  int max_queue = 256;                // requests waiting for a handler thread; past it: 503
  int64_t drain_timeout_ms = 10'000;  // SIGTERM: how long running handlers may finish
  // Browser-facing checks (daemon/http/request_guard.h): web origins
  // ("https://console.example.com") whose requests are served, and host
  // names besides the listen host and loopback names that clients put in
  // Host. Both lower case.
  std::vector<std::string> allowed_origins;
  std::vector<std::string> allowed_hosts;
  RateLimitConfig rate_limit;
};

struct StoreConfig {
  std::string engine = "rocksdb";  // rocksdb (embedded, one daemon) or postgres (many)
  // --- rocksdb
  std::string path = "./var/idem";  // resolved against the config file's directory
  bool sync = true;
  // Writes are refused (503) while the store's filesystem has less free
  // space than this, so RocksDB never meets a full disk mid-write (0: off).
  int64_t min_free_mb = 64;
  // Disk for the trace index (one entry per request); past it the oldest
  // entries go, a table file at a time.
  int64_t trace_budget_mb = 256;
  // Both engines: how long resolved escalations, finished plans (applied,
  // rejected, expired) and trace entries are kept after they finish, for
  // people to look back at; then the sweeper deletes them. 0: forever
  // (trace entries are still bounded by trace_budget_mb on rocksdb).
  int64_t finished_retention_ms = 30LL * 24 * 3600 * 1000;
  // --- postgres: any number of daemons on one database and schema
  // The NAME of the environment variable holding the libpq URL (the URL may
  // hold a password, so it is never in the file and never logged). Empty,
  // or the variable unset or empty: libpq's PG* variables.
  std::string url_env;
  std::string schema = "idem";  // created if missing; migrations applied at start-up
  int pool_size = 16;           // connections per daemon
  int64_t statement_timeout_ms = 5'000;
};

struct AuthToken {
  std::string name;
  std::string sha256;  // hex sha256 of the bearer token
  std::vector<std::string> roles;
};

struct AuthConfig {
  std::vector<AuthToken> tokens;  // empty: no auth, and the daemon listens only on loopback

  // Whether `token` holds one of `roles`; admin holds every role.
  static bool TokenHolds(const AuthToken& token, const std::vector<std::string>& roles) {
    for (const std::string& have : token.roles) {
      if (have == "admin") return true;
      for (const std::string& need : roles) {
        if (have == need) return true;
      }
    }
    return false;
  }
  // Whether the caller named `caller` (a token name) holds one of `roles`.
  // Always true without tokens (no identities: no roles to hold, as for
  // routes).
  bool Holds(const std::string& caller, const std::vector<std::string>& roles) const {
    if (tokens.empty()) return true;
    for (const AuthToken& t : tokens) {
      if (t.name == caller) return TokenHolds(t, roles);
    }
    return false;
  }
};

// The roles a token may hold (routes name them in daemon/http/api*.cc);
// admin may call every route. Any other name in auth.tokens[].roles is a
// config error, so a typo cannot silently lock a caller out.
inline constexpr std::string_view kAuthRoles[] = {"agent", "operator", "admin"};

// A caller name the daemon writes itself, in any case: "anonymous" (a
// caller without a token), "idem" (the daemon) or "inbox:<source>" (an
// inbox's events). No token and no Idem-Caller may take one: it would pass
// for that actor in the audit trail and in the approver-separation checks.
bool IsReservedCallerName(std::string_view name);

// The shortest idempotency.lease: renewed every third of it by a store
// write, a lease only a few writes long would lapse under a running request.
inline constexpr int64_t kMinIdempotencyLeaseMs = 100;

struct IdempotencyConfig {
  int64_t window_ms = 24LL * 3600 * 1000;           // default Idempotency-Key window
  int64_t lease_ms = 60'000;                        // an in_progress key is taken over after this
  std::map<std::string, int64_t> route_windows_ms;  // "POST /v1/decide" -> window
};

struct ProviderConfig {
  std::string name;
  std::string type;  // scripted | replay | openai | anthropic | openai_compatible
  std::string api_key_env;
  std::string base_url;
  std::string rules_path;  // scripted: the rules file (absolute after loading)
  std::string file_path;   // replay: the decisions export (JSONL; absolute after loading)
  // Sampling parameters a model refuses: (model pattern, parameter names).
  // A pattern is a model name, or a prefix ending in '*'. A step that sets a
  // refused parameter for a matching model fails at start-up.
  std::vector<std::pair<std::string, std::vector<std::string>>> unsupported_params;
  Json raw = Json::object();  // the provider's whole config node (for adapters)
};

struct PromptConfig {
  std::string template_path;  // absolute after loading
  std::string version;
  std::string text;    // the template's text
  std::string sha256;  // hex sha256 of text
  // ComputePromptHash(text, system, tools): everything that shapes the
  // prompt; in the decision key and guarded per version at start-up.
  std::string hash;
};

struct InputConfig {
  std::vector<std::string> drop;        // JSON pointers or top-level names to drop
  bool trim_strings = true;             // trim leading/trailing white space
  std::vector<std::string> url_fields;  // JSON pointers of URL-valued fields to normalize
};

// When a plan needs a human before it touches the outside world (R14);
// evaluated by daemon/plans/plan_engine.h. Written inline under `approval`
// or in a policy file (policies/*.yaml) that `approval` names.
struct ApprovalPolicy {
  std::string source;              // the policy file, or "<config>" for an inline policy
  std::string require = "always";  // never | always | when
  Json when;                       // JSONLogic over {plan, action, args, decision, input}
  std::string reason;              // shown to the operator
  int64_t timeout_ms = 24LL * 3600 * 1000;
  std::string on_timeout = "expire";  // expire | escalate
};

struct StepConfig {
  std::string name;
  std::string provider;
  std::string model;
  std::optional<double> temperature;  // unset: not sent, the provider's default applies
  std::string system_prompt;          // the step's `system` text; may be empty
  PromptConfig prompt;
  // Other prompt versions (`prompts: {v2: {template}}`), by version: loaded
  // and checked like `prompt` (their hash covers the step's system and
  // tools too) but used only by a replay that names one
  // (ReplayOptions::prompt_version); never by decide, never in a cache key.
  std::map<std::string, PromptConfig> other_prompts;
  std::string output_schema_path;
  Json output_schema;  // the parsed schema
  Json tools = Json::array();
  std::string output_schema_sha256;  // sha256 hex of JCS(output_schema); "" until loaded
  std::string tools_sha256;          // sha256 hex of JCS(tools); "" until loaded
  InputConfig input;
  std::string checks_path;  // empty: none
  int attempts = 3;
  int64_t timeout_ms = 30'000;  // the whole decide: every attempt and fallback
  int64_t retry_base_ms = 500;  // backoff between retryable failures (full jitter)
  int64_t retry_cap_ms = 10'000;
  Json fallback = Json::array();
  int64_t cache_window_ms = 0;             // 0: forever
  std::string plan_pointer;                // JSON pointer of the actions list in the output
  std::optional<ApprovalPolicy> approval;  // for every action of this step's plans
};

struct RetryConfig {
  int attempts = 5;
  int64_t base_ms = 200;
  int64_t cap_ms = 30'000;
  int64_t timeout_ms = 10'000;  // per call
};

struct ActionConfig {
  std::string name;
  std::vector<std::string> identity_fields;  // JSON pointers into args
  std::string identity_version = "v1";
  int64_t window_ms = 24LL * 3600 * 1000;        // 0: forever
  std::string on_duplicate = "return_original";  // return_original | conflict | ignore
  Json effector = Json::object();
  RetryConfig retry;
  std::optional<ApprovalPolicy> approval;  // unset: never needs a human
  std::string args_schema_path;            // "" : args are checked only for identity fields
  Json args_schema;                        // the parsed schema (null when none)
};

// A webhook sender (R29): POST /v1/inbox/<name> (daemon/http/api_inbox.cc).
struct InboxSource {
  std::string name;
  std::string id_pointer;                        // the event id: a JSON pointer into the body...
  std::string id_header;                         // ...or a header (lower case)
  std::string signature_header;                  // lower case; "" : no signature (loopback only)
  std::string signature_env;                     // the secret's environment variable
  std::string signature_scheme = "hmac_sha256";  // or token
  std::string signature_prefix;                  // e.g. "sha256="
  std::string decide_step;                       // on_event: one of these three
  std::string action_kind;
  bool record_only = false;
  std::string payload_pointer;  // the input or args inside the body ("" : all of it)
  int64_t window_ms = 7LL * 24 * 3600 * 1000;
};

// `notifications` (optional): where idem tells humans that something waits
// for them (daemon/plans/notifier.h). Secrets are never in the file or here:
// header values keep their `${VAR}` references (expanded from the
// environment when the daemon starts), and the Telegram bot token is named
// by an environment variable.
struct WebhookNotifyConfig {
  std::string url;  // http(s) URL; POSTed one JSON object per notification
  // {name, value} as written; `${VAR}` is expanded at start-up.
  std::vector<std::pair<std::string, std::string>> headers;
};

struct TelegramNotifyConfig {
  std::string base_url = "https://api.telegram.org";  // without a trailing '/'
  std::string bot_token_env;                          // the variable holding the token
  std::string chat_id;                                // as text (a number, or "@channel")
};

struct NotificationsConfig {
  std::string link_base;  // "http://host:port" for links in messages; "" none
  std::optional<WebhookNotifyConfig> webhook;
  std::optional<TelegramNotifyConfig> telegram;
  bool any() const { return webhook.has_value() || telegram.has_value(); }
};

struct LogConfig {
  std::string level;   // log.level: debug | info | warn | error; "" = idem serve --log-level
  bool access = true;  // log.access: an access log line per request
};

// `outbox` (optional): where idem pushes its outbox events (R29;
// daemon/outbox/outbox.h). Events are written whether or not anyone
// subscribes; GET /v1/events serves them to pullers.
struct OutboxSubscriberConfig {
  std::string name;
  std::string url;  // http(s); POSTed one event (JSON) per call
  // {name, value} as written; `${VAR}` is expanded at start-up.
  std::vector<std::pair<std::string, std::string>> headers;
  // signature.secret_env: the environment variable holding the key of the
  // Idem-Signature header (HMAC-SHA256); "" : deliveries are not signed.
  std::string signature_env;
  RetryConfig retry{.attempts = 5, .base_ms = 1'000, .cap_ms = 60'000, .timeout_ms = 10'000};
};

struct OutboxConfig {
  std::map<std::string, OutboxSubscriberConfig> subscribers;
  int64_t retention_ms = 7LL * 24 * 3600 * 1000;  // kept after every subscriber passed them
  int64_t poll_ms = 250;                          // how often subscribers look for new events
};

struct Config {
  std::string source_path;                  // the file it came from
  std::string base_dir;                     // its directory
  std::map<std::string, int> source_lines;  // JSON pointer -> 1-based line of its key
  ServerConfig server;
  StoreConfig store;
  AuthConfig auth;
  IdempotencyConfig idempotency;
  LogConfig log;
  std::map<std::string, ProviderConfig> providers;
  std::map<std::string, StepConfig> steps;
  std::map<std::string, ActionConfig> actions;
  std::map<std::string, InboxSource> inbox;
  // model -> {input_per_mtok, output_per_mtok, cached_input_per_mtok}
  Json prices = Json::object();
  NotificationsConfig notifications;
  OutboxConfig outbox;
};

// Reads, validates and resolves the config at `path`.
StatusOr<Config> LoadConfig(const std::string& path);

// An error found after loading, by a component built from `config`, whose
// field() is a pointer into the config file (an effector's header naming an
// unset variable): rewritten in LoadConfig's form, "FILE:LINE: POINTER:
// message", with its code and field kept. Any other status (OK, no field,
// a field that is no key of the file, a message that names the file
// already) is returned as it is.
Status LocateConfigError(const Config& config, Status status);

// "host:port" (an IPv6 host in brackets) -> host and port. InvalidArgument
// (field /server/listen) when malformed or the port is above 65535.
StatusOr<std::pair<std::string, int>> ParseListen(const std::string& listen);
// The daemon's URL for a bound host and port: "http://127.0.0.1:7411", an
// IPv6 literal in brackets (RFC 3986 3.2.2): "http://[::1]:7411".
std::string HttpUrl(const std::string& host, int port);

// Parses "250ms", "30s", "5m", "24h", "7d" or "forever" (0) into milliseconds.
// InvalidArgument beyond 36500d, so now + duration never overflows.
StatusOr<int64_t> ParseDuration(const std::string& text);

// "250ms", "30s", "5m", "24h", "7d": the largest unit that divides `ms`
// exactly (days only from 2 days on, so 24h stays "24h"). 0 is "0ms".
std::string FormatDuration(int64_t ms);

// One sentence per step and action kind on identity, window and duplicate
// response (R1-R3), for `idem contracts`; one per line, steps first, each
// group in name order.
std::string DescribeContracts(const Config& config);

// The text of schemas/config.schema.json, built into the binary.
std::string_view ConfigSchemaText();

}  // namespace idem
