// `idem plans ls`, `plans show`, `approve` and `reject` run as a child
// process against the real daemon, on plans made by an agent calling an
// action kind whose policy needs approval; the effects are checked at the
// fake effector, the audit with `idem audit verify`.
#include <doctest/doctest.h>
#include <rocksdb/db.h>

#include <map>
#include <string>
#include <vector>

#include "daemon/core/crypto.h"
#include "tests/fakes/fake_effector.h"
#include "tests/integration/harness.h"

namespace idem::testing {
namespace {

using fakes::FakeEffectorServer;

const char* kRules = R"(default:
  output: '{"category":"question","priority":"normal","summary":"q","actions":[]}'
)";

const char* kAgent = "agent-secret";
const char* kOperator = "operator-secret";
const char* kBoth = "both-secret";  // agent and operator: may propose, may approve others' plans

struct Fixture {
  std::unique_ptr<FakeEffectorServer> target = FakeEffectorServer::Start();
  TempDir dir;
  std::string config;
  std::unique_ptr<DaemonProcess> daemon;
  std::unique_ptr<httplib::Client> client;

  Fixture() {
    REQUIRE(target != nullptr);
    target->SetBusinessKeyField("/invoice_id");
    auto token = [](const char* name, const char* secret, const char* roles) {
      return std::string("    - {name: ") + name + ", sha256: " + Sha256Hex(secret) + ", roles: [" +
             roles + "]}\n";
    };
    const std::string extra =
        "auth:\n  tokens:\n" + token("agent-1", kAgent, "agent") +
        token("op-1", kOperator, "operator") + token("both-1", kBoth, "agent, operator") +
        "actions:\n"
        "  send_invoice:\n"
        "    identity: {fields: [/invoice_id], version: v1}\n"
        "    window: forever\n"
        "    on_duplicate: return_original\n"
        "    effector: {http: {method: POST, url: \"" +
        target->base_url() +
        "/records\", idempotency: header}}\n"
        "    retry: {attempts: 3, base: 10ms, cap: 50ms, timeout: 5s}\n"
        "    approval: {require: always, reason: \"invoices need a human\"}\n";
    config = WriteTestConfig(dir, kRules, extra);
    Start();
  }
  void Start() {
    std::string err;
    daemon = DaemonProcess::Start({config, dir.path() + "/data", {}, {}}, &err);
    REQUIRE_MESSAGE(daemon != nullptr, err);
    client = daemon->Client();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(daemon->port()); }
  CliResult Cli(std::vector<std::string> args, const char* token = kOperator) {
    args.insert(args.begin(), {"--url", url()});
    return RunCli(args, "", {{"IDEM_TOKEN", token}});
  }
  // An agent asks for an invoice: the policy holds it as a plan.
  std::string Propose(const std::string& invoice_id, int amount, const char* token = kAgent) {
    Json body = {{"args", {{"invoice_id", invoice_id}, {"amount", amount}}}};
    auto res = client->Post("/v1/actions/send_invoice",
                            {{"Authorization", std::string("Bearer ") + token},
                             {"Idempotency-Key", "\"" + invoice_id + "\""}},
                            body.dump(), "application/json");
    REQUIRE(res);
    REQUIRE_MESSAGE(res->status == 202, res->body);
    Json j = Json::parse(res->body);
    REQUIRE(j["state"] == "awaiting_approval");
    return j["plan_id"].get<std::string>();
  }
  std::vector<Json> Invoices() const { return target->Records("records"); }
};

std::string SeqKey(uint64_t seq) {
  std::string key(8, '\0');
  for (int i = 7; i >= 0; --i, seq >>= 8) key[i] = static_cast<char>(seq & 0xff);
  return key;
}

// Rewrites the actor of audit event `seq` in a stopped daemon's store.
void ForgeAuditActor(const std::string& data_dir, uint64_t seq) {
  rocksdb::Options options;
  std::vector<std::string> names;
  REQUIRE(rocksdb::DB::ListColumnFamilies(options, data_dir, &names).ok());
  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  for (const std::string& n : names) descriptors.emplace_back(n, rocksdb::ColumnFamilyOptions());
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  REQUIRE(rocksdb::DB::Open(options, data_dir, descriptors, &handles, &db).ok());
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] != "audit") continue;
    std::string value;
    REQUIRE(db->Get(rocksdb::ReadOptions(), handles[i], SeqKey(seq), &value).ok());
    Json j = Json::parse(value);
    j["actor"] = "someone-else";
    REQUIRE(db->Put(rocksdb::WriteOptions(), handles[i], SeqKey(seq), j.dump()).ok());
  }
  for (rocksdb::ColumnFamilyHandle* h : handles)
    db->DestroyColumnFamilyHandle(h).PermitUncheckedError();
  db->Close().PermitUncheckedError();
  delete db;
}

}  // namespace

TEST_CASE("idem plans ls --json lists a plan awaiting approval, and plans show reads it") {
  Fixture f;
  const std::string plan_id = f.Propose("INV-1", 120);
  CliResult ls = f.Cli({"plans", "ls", "--json"});
  REQUIRE_MESSAGE(ls.exit_code == 0, ls.err);
  Json j = Json::parse(ls.out);
  REQUIRE(j["items"].size() == 1);
  CHECK(j["items"][0]["plan_id"] == plan_id);
  CHECK(j["items"][0]["state"] == "awaiting_approval");

  CliResult table = f.Cli({"plans", "ls"});
  CHECK(table.exit_code == 0);
  CHECK(table.out.rfind("PLAN", 0) == 0);
  CHECK(table.out.find(plan_id + "  awaiting_approval  send_invoice") != std::string::npos);
  CHECK(table.out.find("invoices need a human") != std::string::npos);
  CHECK(table.out.find('\033') == std::string::npos);  // not a terminal: no colour

  CliResult show = f.Cli({"plans", "show", plan_id});
  CHECK_MESSAGE(show.exit_code == 0, show.err);
  CHECK(show.out.find("INV-1") != std::string::npos);
  CHECK(show.out.find("created by: agent-1") != std::string::npos);
  CHECK(f.Cli({"plans", "show", "plan_nope"}).exit_code == 3);
  CHECK(f.Invoices().empty());  // nothing happened yet
}

TEST_CASE("idem approve applies a plan once; a second approve exits 4") {
  Fixture f;
  const std::string plan_id = f.Propose("INV-2", 120);
  CliResult agent = f.Cli({"approve", plan_id}, kAgent);  // not an operator
  CHECK(agent.exit_code == 5);
  CliResult first = f.Cli({"approve", plan_id, "--comment", "looks right"});
  CHECK_MESSAGE(first.exit_code == 0, first.err);
  CHECK(first.out.find("approved " + plan_id) != std::string::npos);
  CliResult second = f.Cli({"approve", plan_id});
  CHECK(second.exit_code == 4);
  CHECK(second.err.find("409") != std::string::npos);
  CHECK(f.Invoices().size() == 1);
  CHECK(f.target->stats().effects == 1);
  Json shown = Json::parse(f.Cli({"plans", "show", plan_id, "--json"}).out);
  CHECK(shown["approved_by"] == "op-1");
  CHECK(shown["comment"] == "looks right");
}

TEST_CASE("idem approve by the plan's own creator exits 5 (separation of duties)") {
  Fixture f;
  const std::string plan_id = f.Propose("INV-7", 120, kBoth);
  CliResult own = f.Cli({"approve", plan_id}, kBoth);
  CHECK(own.exit_code == 5);
  CHECK(own.err.find("HTTP 403") != std::string::npos);
  CHECK(f.Invoices().empty());
  CHECK(f.Cli({"approve", plan_id}).exit_code == 0);  // another operator may
  CHECK(f.Invoices().size() == 1);
}

TEST_CASE("idem approve --edit applies the edited arguments") {
  Fixture f;
  const std::string plan_id = f.Propose("INV-3", 150);
  CliResult r = f.Cli({"approve", plan_id, "--edit", "/0/args/amount=90", "--json"});
  REQUIRE_MESSAGE(r.exit_code == 0, (r.out + r.err));
  Json plan = Json::parse(r.out);
  CHECK(plan["actions"][0]["args"]["amount"] == 90);
  CHECK(plan["original_actions"][0]["args"]["amount"] == 150);
  std::vector<Json> invoices = f.Invoices();
  REQUIRE(invoices.size() == 1);
  CHECK(invoices[0].dump().find("\"amount\":90") != std::string::npos);
}

TEST_CASE("idem reject --reason rejects a plan, which is never applied") {
  Fixture f;
  const std::string plan_id = f.Propose("INV-4", 120);
  CliResult r = f.Cli({"reject", plan_id, "--reason", "not our customer"});
  CHECK_MESSAGE(r.exit_code == 0, r.err);
  CHECK(r.out.find("rejected " + plan_id) != std::string::npos);
  Json plan = Json::parse(f.Cli({"plans", "show", plan_id, "--json"}).out);
  CHECK(plan["state"] == "rejected");
  CHECK(plan["reason"] == "not our customer");
  CHECK(f.Cli({"approve", plan_id}).exit_code == 4);
  CHECK(f.Invoices().empty());
  CHECK(f.Cli({"plans", "ls", "--json"}).out.find(plan_id) == std::string::npos);
}

TEST_CASE("idem audit verify passes after approvals and exits 6 once an event is forged") {
  Fixture f;
  REQUIRE(f.Cli({"approve", f.Propose("INV-5", 120)}).exit_code == 0);
  REQUIRE(f.Cli({"reject", f.Propose("INV-6", 120), "--reason", "no"}).exit_code == 0);
  CliResult ok = f.Cli({"audit", "verify", "--json"});
  REQUIRE_MESSAGE(ok.exit_code == 0, (ok.out + ok.err));
  Json v = Json::parse(ok.out);
  CHECK(v["ok"] == true);
  CHECK(v["checked"].get<int>() >= 2);  // at least the approval and the rejection

  REQUIRE(f.daemon->Stop() == 0);  // intact across a restart
  f.Start();
  CliResult restarted = f.Cli({"audit", "verify"});
  CHECK_MESSAGE(restarted.exit_code == 0, (restarted.out + restarted.err));

  REQUIRE(f.daemon->Stop() == 0);
  ForgeAuditActor(f.dir.path() + "/data", 1);
  f.Start();
  CliResult broken = f.Cli({"audit", "verify"});
  CHECK_MESSAGE(broken.exit_code == 6, (broken.out + broken.err));
  CHECK(broken.out.find("BROKEN at seq 1") != std::string::npos);
}

TEST_CASE(
    "an id given to the CLI is one path segment: dlq replay of an id with ../ cannot approve a "
    "plan, work and decision cannot read another route") {
  Fixture f;
  const std::string plan_id = f.Propose("INV-PATH", 120);
  CliResult replay = f.Cli({"dlq", "replay", "0000/../../plans/" + plan_id + "/approve?"});
  CHECK(replay.exit_code != 0);
  CliResult shown = f.Cli({"plans", "show", plan_id, "--json"});
  REQUIRE_MESSAGE(shown.exit_code == 0, shown.err);
  CHECK(Json::parse(shown.out)["state"] == "awaiting_approval");
  CHECK(f.Invoices().empty());
  for (const char* command : {"work", "decision"}) {
    CAPTURE(command);
    CliResult read = f.Cli({"--json", command, "x/../../audit"});
    CHECK(read.exit_code != 0);
    CHECK(read.out.find("plan.awaiting_approval") == std::string::npos);
  }
}

}  // namespace idem::testing
