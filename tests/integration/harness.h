// Integration-test harness: runs the real `idem` binary as a child process
// on 127.0.0.1 port 0 (the bound port comes back through --port-file),
// with its own temp store folder and config, and talks to it over HTTP.
#pragma once

#include <httplib.h>
#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

namespace idem::testing {

using Json = nlohmann::json;

// A fresh folder under /tmp, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string File(const std::string& name, const std::string& content) const;

 private:
  std::string path_;
};

struct DaemonArgs {
  std::string config_path;
  std::string data_dir;
  std::vector<std::string> extra_args;
  std::map<std::string, std::string> env;  // e.g. IDEM_FAILPOINTS
  std::string listen = "127.0.0.1:0";      // --listen
  int max_open_files = 0;                  // > 0: RLIMIT_NOFILE (soft and hard) of the daemon
};

class DaemonProcess {
 public:
  ~DaemonProcess();
  // Starts the daemon and waits (up to 60 s) until it serves /healthz.
  // Returns null (and fills *error with its stderr) if it exits instead.
  static std::unique_ptr<DaemonProcess> Start(const DaemonArgs& args, std::string* error = nullptr);

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  // CPU time (user + system) the process has used, in milliseconds.
  long CpuMillis() const;
  // Sends `sig` to the process.
  void Signal(int sig) const;
  std::unique_ptr<httplib::Client> Client() const;
  // SIGKILL, as a crash would; waits for the process to be gone.
  void Kill9();
  // SIGTERM and wait; returns the exit status.
  int Stop();
  // Waits for the process to exit by itself (e.g. a crash failpoint); returns
  // true if it exited within timeout_ms.
  bool WaitExit(int timeout_ms);
  const std::string& log_path() const { return log_path_; }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  std::string log_path_;
};

// With IDEM_RESPONSE_LOG=dir set, `client` appends every response it gets
// to a JSON-lines file in dir (DaemonProcess::Client() does this already),
// one line each in dir/responses-<pid>.jsonl (one file per test process:
// ctest runs several at once), for tests/e2e/openapi_check.mjs.
void RecordResponses(httplib::Client& client);
// Appends one response to that file (IDEM_RESPONSE_LOG unset: nothing):
// for answers a test got another way (curl). `headers`: Retry-After, Allow.
void RecordResponse(const std::string& method, const std::string& path, int status,
                    const std::string& content_type, const std::string& body,
                    const std::map<std::string, std::string>& headers = {});

// Runs `idem <args>` to completion with `stdin_text`; returns exit code,
// stdout and stderr.
struct CliResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};
// `env` is added to the child's environment (e.g. IDEM_TOKEN).
CliResult RunCli(const std::vector<std::string>& args, const std::string& stdin_text = "",
                 const std::map<std::string, std::string>& env = {});
// Runs `command` with sh (popen) to completion: its exit code (-1 when it
// did not exit) and standard output; `err` stays empty.
CliResult RunShell(const std::string& command);

// Scripted-provider rules that answer every decide with the same plain
// question and no actions: for tests about everything but the decision.
inline constexpr char kQuestionRules[] = R"(default:
  output: '{"category":"question","priority":"normal","summary":"q","actions":[]}'
)";

// The whole file ("" when it cannot be read).
std::string ReadFile(const std::string& path);

// One line of auth.tokens: the token `name` with `secret` (stored as its
// sha256) and `roles` ("agent", "operator, admin", ...).
std::string TokenYaml(const std::string& name, const std::string& secret, const std::string& roles);

// A config file in `dir` for the demo step (scripted provider) plus
// whatever YAML `extra` adds at the top level; paths are absolute.
std::string WriteTestConfig(const TempDir& dir, const std::string& rules_yaml,
                            const std::string& extra_yaml = "");

// The config WriteTestConfig wrote at `config_path`, its store moved to
// PostgreSQL: `store_yaml` (the lines under `store:` after the engine,
// e.g. "  url_env: IDEM_PG_URL\n  schema: s\n") replaces the RocksDB
// store; written beside it as idem-pg.yaml, whose path is returned.
std::string OnPostgres(const TempDir& dir, const std::string& config_path,
                       const std::string& store_yaml);

// The value of a Prometheus counter from GET /metrics, or -1.
long MetricValue(httplib::Client& client, const std::string& name);

// Whether pred() holds within timeout_ms, asking every 20 ms (and once more
// at the end).
template <typename Pred>
bool WaitFor(Pred pred, int timeout_ms) {
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pred();
}

}  // namespace idem::testing
