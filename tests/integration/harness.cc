#include "tests/integration/harness.h"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string_view>
#include <thread>

#include "daemon/core/crypto.h"

namespace idem::testing {
namespace fs = std::filesystem;

TempDir::TempDir() {
  char tmpl[] = "/tmp/idem-test-XXXXXX";
  char* p = mkdtemp(tmpl);
  if (p == nullptr) std::abort();
  path_ = p;
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

std::string TempDir::File(const std::string& name, const std::string& content) const {
  std::string p = path_ + "/" + name;
  fs::create_directories(fs::path(p).parent_path());
  std::ofstream(p) << content;
  return p;
}

std::string ReadFile(const std::string& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

namespace {

void LogResponse(const httplib::Request& req, const httplib::Response& res) {
  std::map<std::string, std::string> headers;
  for (const char* h : {"Retry-After", "Allow"}) {
    if (res.has_header(h)) headers[h] = res.get_header_value(h);
  }
  RecordResponse(req.method, req.path, res.status, res.get_header_value("Content-Type"), res.body,
                 headers);
}

}  // namespace

void RecordResponse(const std::string& method, const std::string& path, int status,
                    const std::string& content_type, const std::string& body,
                    const std::map<std::string, std::string>& headers) {
  static std::mutex mu;
  static std::string file = [] {
    const char* dir = std::getenv("IDEM_RESPONSE_LOG");
    if (dir == nullptr || *dir == '\0') return std::string();
    fs::create_directories(dir);
    return std::string(dir) + "/responses-" + std::to_string(getpid()) + ".jsonl";
  }();
  if (file.empty()) return;
  Json line = {{"method", method},
               {"path", path.substr(0, path.find('?'))},
               {"status", status},
               {"content_type", content_type},
               {"body", body}};
  for (const auto& [name, value] : headers) line["headers"][name] = value;
  std::lock_guard<std::mutex> lock(mu);
  std::ofstream(file, std::ios::app)
      << line.dump(-1, ' ', false, Json::error_handler_t::replace) << "\n";
}

void RecordResponses(httplib::Client& client) {
  if (std::getenv("IDEM_RESPONSE_LOG") != nullptr) client.set_logger(LogResponse);
}

long DaemonProcess::CpuMillis() const {
  std::string stat = ReadFile("/proc/" + std::to_string(pid_) + "/stat");
  // Fields after the command name (which may hold spaces) start after ')'.
  size_t close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream in(stat.substr(close + 2));
  std::string field;
  long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && in >> field; ++i) {
    if (i == 14) utime = std::stol(field);
    if (i == 15) stime = std::stol(field);
  }
  return (utime + stime) * 1000 / sysconf(_SC_CLK_TCK);
}

void DaemonProcess::Signal(int sig) const {
  if (pid_ > 0) kill(pid_, sig);
}

namespace {

// A child of this multi-threaded process, its argv, environment and
// descriptors all prepared before fork(): between fork and exec the child
// may make only async-signal-safe calls. A malloc there can deadlock on a
// lock another thread held at the fork (AddressSanitizer's allocator has no
// fork handler in Debian 12's toolchains), which once hung a daemon start
// for 60 s in CI with nothing in its log.
struct ChildSpec {
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;  // added to (or replacing in) this process's
  std::string stdin_path;                  // "": inherited
  std::string stdout_path;                 // "": inherited
  std::string stderr_path;                 // "": inherited; same as stdout_path: shared
  bool append = false;                     // O_APPEND instead of O_TRUNC
  int max_open_files = 0;                  // > 0: RLIMIT_NOFILE of the child
};

pid_t SpawnChild(const ChildSpec& spec) {
  std::vector<std::string> env_s;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view entry(*e);
    std::string_view name = entry.substr(0, entry.find('='));
    if (spec.env.count(std::string(name)) == 0) env_s.emplace_back(entry);
  }
  for (const auto& [k, v] : spec.env) env_s.push_back(k + "=" + v);
  std::vector<char*> argv, envp;
  std::vector<std::string> argv_s = spec.argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  for (auto& s : env_s) envp.push_back(s.data());
  envp.push_back(nullptr);
  const int out_flags = O_WRONLY | O_CREAT | (spec.append ? O_APPEND : O_TRUNC);
  const bool shared_err = !spec.stderr_path.empty() && spec.stderr_path == spec.stdout_path;
  const rlimit lim{static_cast<rlim_t>(spec.max_open_files),
                   static_cast<rlim_t>(spec.max_open_files)};
  pid_t pid = fork();
  if (pid != 0) return pid;
  // The child: system calls only from here on.
  auto redirect = [](const std::string& path, int flags, int target) {
    if (path.empty()) return;
    int fd = open(path.c_str(), flags, 0644);
    if (fd < 0) _exit(127);
    if (fd != target) {  // open may return the target itself when it was closed
      dup2(fd, target);
      close(fd);
    }
  };
  redirect(spec.stdin_path, O_RDONLY, 0);
  redirect(spec.stdout_path, out_flags, 1);
  if (shared_err) {
    dup2(1, 2);
  } else {
    redirect(spec.stderr_path, out_flags, 2);
  }
  if (spec.max_open_files > 0) setrlimit(RLIMIT_NOFILE, &lim);
  execve(argv[0], argv.data(), envp.data());
  _exit(127);
}

}  // namespace

std::unique_ptr<DaemonProcess> DaemonProcess::Start(const DaemonArgs& args, std::string* error) {
  auto d = std::unique_ptr<DaemonProcess>(new DaemonProcess());
  std::string port_file = args.data_dir + ".port";
  d->log_path_ = args.data_dir + ".log";
  unlink(port_file.c_str());
  ChildSpec spec;
  spec.argv = {IDEM_BINARY, "serve",  "--config",    args.config_path, "--listen",
               args.listen, "--data", args.data_dir, "--port-file",    port_file};
  for (const auto& a : args.extra_args) spec.argv.push_back(a);
  spec.env = args.env;
  spec.stdout_path = spec.stderr_path = d->log_path_;
  spec.append = true;
  spec.max_open_files = args.max_open_files;
  pid_t pid = SpawnChild(spec);
  d->pid_ = pid;
  // 60 s: a daemon under AddressSanitizer on a loaded two-core machine (CI
  // runs two test binaries at once) once took longer than 20 s to come up.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      d->pid_ = -1;
      if (error != nullptr) *error = ReadFile(d->log_path_);
      return nullptr;
    }
    std::ifstream pf(port_file);
    int port = 0;
    if (pf >> port && port > 0) {
      d->port_ = port;
      auto c = d->Client();
      auto res = c->Get("/healthz");
      if (res && res->status == 200) return d;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (error != nullptr) *error = "daemon did not come up in 60 s: " + ReadFile(d->log_path_);
  return nullptr;
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) Kill9();
}

std::unique_ptr<httplib::Client> DaemonProcess::Client() const {
  auto c = std::make_unique<httplib::Client>("127.0.0.1", port_);
  c->set_connection_timeout(5, 0);
  c->set_read_timeout(30, 0);
  RecordResponses(*c);
  return c;
}

void DaemonProcess::Kill9() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
}

int DaemonProcess::Stop() {
  if (pid_ <= 0) return -1;
  kill(pid_, SIGTERM);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

bool DaemonProcess::WaitExit(int timeout_ms) {
  if (pid_ <= 0) return true;
  for (int waited = 0; waited < timeout_ms; waited += 5) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

CliResult RunShell(const std::string& command) {
  CliResult r;
  FILE* p = popen(command.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

CliResult RunCli(const std::vector<std::string>& args, const std::string& stdin_text,
                 const std::map<std::string, std::string>& env) {
  TempDir dir;
  std::string out = dir.path() + "/stdout", err = dir.path() + "/stderr";
  ChildSpec spec;
  spec.argv = {IDEM_BINARY};
  for (const auto& a : args) spec.argv.push_back(a);
  spec.env = env;
  spec.stdin_path = dir.File("stdin", stdin_text);
  spec.stdout_path = out;
  spec.stderr_path = err;
  pid_t pid = SpawnChild(spec);
  int status = 0;
  waitpid(pid, &status, 0);
  CliResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = ReadFile(out);
  r.err = ReadFile(err);
  return r;
}

std::string OnPostgres(const TempDir& dir, const std::string& config_path,
                       const std::string& store_yaml) {
  std::string text = ReadFile(config_path);
  const std::string rocks = "  engine: rocksdb\n  path: " + dir.path() + "/data\n";
  const size_t at = text.find(rocks);
  REQUIRE_MESSAGE(at != std::string::npos, "not a WriteTestConfig config: " << config_path);
  text.replace(at, rocks.size(), "  engine: postgres\n" + store_yaml);
  return dir.File("idem-pg.yaml", text);
}

std::string TokenYaml(const std::string& name, const std::string& secret,
                      const std::string& roles) {
  return "    - {name: " + name + ", sha256: " + Sha256Hex(secret) + ", roles: [" + roles + "]}\n";
}

std::string WriteTestConfig(const TempDir& dir, const std::string& rules_yaml,
                            const std::string& extra_yaml) {
  const std::string src = IDEM_SOURCE_DIR;
  std::string rules = dir.File("rules.yaml", rules_yaml);
  std::string config =
      "server:\n"
      "  listen: 127.0.0.1:0\n"
      "  threads: 96\n"
      "store:\n"
      "  engine: rocksdb\n"
      "  path: " +
      dir.path() +
      "/data\n"
      "providers:\n"
      "  demo:\n"
      "    type: scripted\n"
      "    rules: " +
      rules +
      "\n"
      "steps:\n"
      "  triage_ticket:\n"
      "    provider: demo\n"
      "    model: demo-1\n"
      "    temperature: 0\n"
      "    prompt:\n"
      "      template: " +
      src +
      "/config/prompts/triage_ticket.mustache\n"
      "      version: v1\n"
      "    output_schema: " +
      src +
      "/schemas/examples/triage_ticket.v1.json\n"
      "    input:\n"
      "      drop: [received_at, request_id, trace_id]\n"
      "    attempts: 3\n"
      "    timeout: 30s\n"
      "    cache:\n"
      "      window: forever\n" +
      extra_yaml;
  return dir.File("idem.yaml", config);
}

long MetricValue(httplib::Client& client, const std::string& name) {
  auto res = client.Get("/metrics");
  if (!res || res->status != 200) return -1;
  std::istringstream in(res->body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + " ", 0) == 0) return std::atol(line.c_str() + name.size() + 1);
  }
  return -1;
}

}  // namespace idem::testing
