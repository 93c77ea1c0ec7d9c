// The operator's CLI (`idem plans`, `approve`, `reject`, `audit verify`) run
// as a child process against the real daemon, and the audit routes it uses.
#include <doctest/doctest.h>
#include <rocksdb/db.h>

#include <map>
#include <string>
#include <vector>

#include "daemon/core/crypto.h"
#include "daemon/store/store.h"
#include "tests/integration/harness.h"

namespace idem::testing {
namespace {

const char* kRules = R"(default:
  output: '{"category":"question","priority":"normal","summary":"q {{input.ticket_id}}","actions":[]}'
)";

const char* kAgent = "agent-secret";
const char* kOperator = "operator-secret";

std::string Tokens() {
  auto token = [](const char* name, const char* secret, const char* roles) {
    return std::string("    - {name: ") + name + ", sha256: " + Sha256Hex(secret) + ", roles: [" +
           roles + "]}\n";
  };
  return "auth:\n  tokens:\n" + token("agent-1", kAgent, "agent") +
         token("op-1", kOperator, "operator");
}

// The store's audit log, written while the daemon is stopped.
void SeedAudit(const std::string& data_dir, int n) {
  auto store = OpenRocksStore(StoreOptions{data_dir, true});
  REQUIRE_MESSAGE(store.ok(), store.status().ToString());
  for (int i = 0; i < n; ++i) {
    AuditEvent e;
    e.at_ms = 1'700'000'000'000 + i;
    e.actor = "op-1";
    e.action = "plan.approved";
    e.detail = Json{{"plan_id", "plan_" + std::to_string(i)}};
    REQUIRE((*store)->audit().Append(e).ok());
  }
}

std::string SeqKey(uint64_t seq) {
  std::string key(8, '\0');
  for (int i = 7; i >= 0; --i, seq >>= 8) key[i] = static_cast<char>(seq & 0xff);
  return key;
}

// Tampers with the stopped daemon's store through raw RocksDB, as someone
// with the disk would: `fn` gets the db and the "audit" family.
template <typename Fn>
void Tamper(const std::string& data_dir, Fn fn) {
  rocksdb::Options options;
  std::vector<std::string> names;
  REQUIRE(rocksdb::DB::ListColumnFamilies(options, data_dir, &names).ok());
  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  for (const std::string& n : names) descriptors.emplace_back(n, rocksdb::ColumnFamilyOptions());
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(options, data_dir, descriptors, &handles, &db);
  REQUIRE_MESSAGE(s.ok(), s.ToString());
  rocksdb::ColumnFamilyHandle* audit = nullptr;
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == "audit") audit = handles[i];
  }
  REQUIRE(audit != nullptr);
  fn(*db, audit);
  for (rocksdb::ColumnFamilyHandle* h : handles)
    db->DestroyColumnFamilyHandle(h).PermitUncheckedError();
  db->Close().PermitUncheckedError();
  delete db;
}

struct AuditFixture {
  AuditFixture() : config(WriteTestConfig(dir, kRules, Tokens())) {}
  void Start() {
    std::string err;
    daemon = DaemonProcess::Start(DaemonArgs{config, data(), {}, {}}, &err);
    REQUIRE_MESSAGE(daemon != nullptr, err);
  }
  std::string data() const { return dir.path() + "/data"; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(daemon->port()); }
  CliResult Cli(std::vector<std::string> args, const char* token = kOperator) {
    args.insert(args.begin(), {"--url", url()});
    return RunCli(args, "", {{"IDEM_TOKEN", token}, {"NO_COLOR", "1"}});
  }
  TempDir dir;
  std::string config;
  std::unique_ptr<DaemonProcess> daemon;
};

}  // namespace

TEST_CASE("idem audit verify exits 0 on an intact log and 6 after a record is modified") {
  AuditFixture f;
  SeedAudit(f.data(), 3);
  f.Start();
  CliResult ok = f.Cli({"audit", "verify"});
  CHECK_MESSAGE(ok.exit_code == 0, (ok.out + ok.err));
  CHECK(ok.out.find("audit chain intact: 3 events, head seq 3") != std::string::npos);

  REQUIRE(f.daemon->Stop() == 0);
  Tamper(f.data(), [](rocksdb::DB& db, rocksdb::ColumnFamilyHandle* audit) {
    std::string value;
    REQUIRE(db.Get(rocksdb::ReadOptions(), audit, SeqKey(2), &value).ok());
    Json j = Json::parse(value);
    j["actor"] = "mallory";
    REQUIRE(db.Put(rocksdb::WriteOptions(), audit, SeqKey(2), j.dump()).ok());
  });
  f.Start();
  CliResult broken = f.Cli({"audit", "verify"});
  CHECK_MESSAGE(broken.exit_code == 6, (broken.out + broken.err));
  CHECK(broken.out.find("audit chain BROKEN at seq 2") != std::string::npos);
  CliResult json = f.Cli({"audit", "verify", "--json"});
  CHECK(json.exit_code == 6);
  Json j = Json::parse(json.out);
  CHECK(j["ok"] == false);
  CHECK(j["broken_seq"] == 2);
  CHECK(j["daemon"]["broken_seq"] == 2);
  CHECK(j["client"]["broken_seq"] == 2);
}

TEST_CASE("idem audit verify exits 6 when the last audit record was removed before a restart") {
  AuditFixture f;
  SeedAudit(f.data(), 3);
  Tamper(f.data(), [](rocksdb::DB& db, rocksdb::ColumnFamilyHandle* audit) {
    REQUIRE(db.Delete(rocksdb::WriteOptions(), audit, SeqKey(3)).ok());
  });
  f.Start();
  CliResult r = f.Cli({"audit", "verify"});
  CHECK_MESSAGE(r.exit_code == 6, (r.out + r.err));
  CHECK(r.out.find("BROKEN at seq 3") != std::string::npos);
}

TEST_CASE("idem audit verify exits 6 when two audit records were swapped") {
  AuditFixture f;
  SeedAudit(f.data(), 3);
  Tamper(f.data(), [](rocksdb::DB& db, rocksdb::ColumnFamilyHandle* audit) {
    std::string one, two;
    REQUIRE(db.Get(rocksdb::ReadOptions(), audit, SeqKey(1), &one).ok());
    REQUIRE(db.Get(rocksdb::ReadOptions(), audit, SeqKey(2), &two).ok());
    REQUIRE(db.Put(rocksdb::WriteOptions(), audit, SeqKey(1), two).ok());
    REQUIRE(db.Put(rocksdb::WriteOptions(), audit, SeqKey(2), one).ok());
  });
  f.Start();
  CliResult r = f.Cli({"audit", "verify", "--json"});
  CHECK_MESSAGE(r.exit_code == 6, (r.out + r.err));
  CHECK(Json::parse(r.out)["broken_seq"] == 1);
}

TEST_CASE("GET /v1/audit pages in seq order and needs an operator token") {
  AuditFixture f;
  SeedAudit(f.data(), 5);
  f.Start();
  auto client = f.daemon->Client();
  httplib::Headers op = {{"Authorization", std::string("Bearer ") + kOperator}};
  auto page = client->Get("/v1/audit?from_seq=2&limit=2", op);
  REQUIRE(page);
  REQUIRE(page->status == 200);
  Json j = Json::parse(page->body);
  REQUIRE(j["items"].size() == 2);
  CHECK(j["items"][0]["seq"] == 2);
  CHECK(j["items"][1]["prev_hash"] == j["items"][0]["hash"]);
  CHECK(j["next_from_seq"] == 4);
  Json last = Json::parse(client->Get("/v1/audit?from_seq=4&limit=2", op)->body);
  CHECK(last["items"].size() == 2);
  Json end = Json::parse(client->Get("/v1/audit?from_seq=6&limit=2", op)->body);
  CHECK(end["items"].empty());
  CHECK(end["next_from_seq"].is_null());
  auto bad = client->Get("/v1/audit?from_seq=0", op);
  CHECK(bad->status == 400);
  CHECK(Json::parse(bad->body)["pointer"] == "query:from_seq");

  httplib::Headers agent = {{"Authorization", std::string("Bearer ") + kAgent}};
  CHECK(client->Get("/v1/audit", agent)->status == 403);
  CHECK(client->Get("/v1/audit/verify", agent)->status == 403);
  auto verify = client->Get("/v1/audit/verify", op);
  CHECK(verify->status == 200);
  Json v = Json::parse(verify->body);
  CHECK(v["ok"] == true);
  CHECK(v["checked"] == 5);
  CHECK(v["head_seq"] == 5);
  // The CLI with an agent token: forbidden.
  CHECK(f.Cli({"audit", "verify"}, kAgent).exit_code == 5);
}

TEST_CASE("a --port-file the daemon cannot write fails the start instead of leaving it unsaid") {
  TempDir dir;
  const std::string config = WriteTestConfig(dir, kQuestionRules);
  // `timeout` ends a daemon that started regardless (exit 124).
  CliResult r = RunShell("timeout 20 " + std::string(IDEM_BINARY) + " serve --config " + config +
                         " --data " + dir.path() + "/data --listen 127.0.0.1:0 --port-file " +
                         dir.path() + "/no/such/folder/port 2>&1");
  CHECK(r.exit_code == 1);
  CHECK(r.out.find("--port-file " + dir.path() + "/no/such/folder/port: cannot write it") !=
        std::string::npos);
}

TEST_CASE("client commands exit 2 when the daemon is unreachable and 1 on a usage error") {
  CliResult down = RunCli({"--url", "http://127.0.0.1:1", "plans", "ls"});
  CHECK(down.exit_code == 2);
  CHECK(down.err.find("cannot reach the daemon at http://127.0.0.1:1") != std::string::npos);
  // A proxy's password in the URL stays out of the message (CI logs).
  CliResult secret = RunCli({"--url", "http://deploy:Hunter2Secret@127.0.0.1:1", "dlq", "ls"});
  CHECK(secret.exit_code == 2);
  CHECK(secret.err.find("cannot reach the daemon at http://127.0.0.1:1") != std::string::npos);
  CHECK(secret.err.find("Hunter2") == std::string::npos);
  CliResult exported =
      RunCli({"--url", "http://deploy:Hunter2Secret@127.0.0.1:1", "decisions", "export"});
  CHECK(exported.exit_code == 2);
  CHECK(exported.err.find("Hunter2") == std::string::npos);
  CHECK(RunCli({"approve"}).exit_code == 1);                                  // no plan id
  CHECK(RunCli({"reject", "plan_x"}).exit_code == 1);                         // no --reason
  CHECK(RunCli({"approve", "plan_x", "--edit", "amount=1"}).exit_code == 1);  // not a pointer
  CHECK(RunCli({"plans", "ls", "--help"}).exit_code == 0);
  // A log level the daemon does not know is a usage error, not "info".
  CliResult level = RunCli({"serve", "--log-level", "verbose", "--config", "/nonexistent.yaml"});
  CHECK(level.exit_code != 0);
  CHECK_MESSAGE(level.err.find("--log-level") != std::string::npos, level.err);
  CHECK(level.err.find("/nonexistent.yaml") == std::string::npos);  // refused before the config
}

}  // namespace idem::testing
