// What the daemon's sweeper does with a decision past its cache window: it
// goes, with the plan nobody approved, applied or rejected, and the next
// decide of the same input makes and proposes both again.
#include <doctest/doctest.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "daemon/store/rocksdb/rocksdb_plan_store.h"
#include "tests/integration/harness.h"
#include "tests/unit/store/forget_index.h"

namespace idem::testing {
namespace {

const char* kRules = R"(default:
  output: '{"category":"question","priority":"low","summary":"s","actions":[{"kind":"note","args":{"ticket_id":"{{input.ticket_id}}","text":"{{input.text}}"}}]}'
)";

// The step's decisions last one second; `note` runs nowhere (client work).
// `finished_retention`: store.finished_retention, when given.
std::string Config(const TempDir& dir, const std::string& finished_retention = "") {
  std::string path = WriteTestConfig(dir, kRules,
                                     "    plan: {pointer: /actions}\n"
                                     "actions:\n"
                                     "  note:\n"
                                     "    identity: {fields: [/ticket_id], version: v1}\n"
                                     "    window: 1h\n"
                                     "    on_duplicate: return_original\n");
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::string yaml = text.str();
  const std::string forever = "      window: forever\n";
  REQUIRE(yaml.find(forever) != std::string::npos);
  yaml.replace(yaml.find(forever), forever.size(), "      window: 1s\n");
  if (!finished_retention.empty()) {
    const std::string engine = "  engine: rocksdb\n";
    REQUIRE(yaml.find(engine) != std::string::npos);
    yaml.replace(yaml.find(engine), engine.size(),
                 engine + "  finished_retention: " + finished_retention + "\n");
  }
  return dir.File("idem.yaml", yaml);
}

Json Decide(httplib::Client& c) {
  auto r =
      c.Post("/v1/decide", R"({"step":"triage_ticket","input":{"ticket_id":"T-1","text":"hello"}})",
             "application/json");
  REQUIRE(r);
  REQUIRE_MESSAGE(r->status == 200, r->body);
  return Json::parse(r->body);
}

int PlanStatus(httplib::Client& c, const std::string& plan_id) {
  auto r = c.Get(("/v1/plans/" + plan_id).c_str());
  return r ? r->status : 0;
}

// A daemon with store.finished_retention `retention`: decides, rejects the
// plan, and waits until the sweeper has taken the decision (its window is
// 1 s), which it does in a pass that also sweeps finished plans. Returns
// the plan's id.
std::string RejectAndWaitForASweep(DaemonProcess& daemon) {
  auto c = daemon.Client();
  Json decided = Decide(*c);
  const std::string plan = decided["plan"]["plan_id"];
  auto rejected = c->Post(("/v1/plans/" + plan + "/reject").c_str(), R"({"reason":"not this one"})",
                          "application/json");
  REQUIRE(rejected);
  REQUIRE_MESSAGE(rejected->status == 200, rejected->body);
  const std::string decision = decided["decision_id"];
  REQUIRE(WaitFor([&] { return c->Get(("/v1/decisions/" + decision).c_str())->status == 404; },
                  15'000));
  return plan;
}

std::unique_ptr<DaemonProcess> StartSweepingEverySecond(const TempDir& dir,
                                                        const std::string& retention) {
  DaemonArgs args{Config(dir, retention), dir.path() + "/data", {}, {}};
  args.env["IDEM_FAILPOINTS"] = "daemon.sweep_every_second=error";
  std::string err;
  auto daemon = DaemonProcess::Start(args, &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);
  return daemon;
}

}  // namespace

TEST_CASE("a_decision_past_its_window_is_swept_with_the_plan_nobody_acted_on") {
  TempDir dir;
  DaemonArgs args{Config(dir), dir.path() + "/data", {}, {}};
  args.env["IDEM_FAILPOINTS"] = "daemon.sweep_every_second=error";
  std::string err;
  auto daemon = DaemonProcess::Start(args, &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);
  auto c = daemon->Client();

  Json first = Decide(*c);
  REQUIRE(first["plan"]["state"] == "proposed");
  const std::string plan = first["plan"]["plan_id"];
  const std::string decision = first["decision_id"];
  REQUIRE(PlanStatus(*c, plan) == 200);

  // Over after 1 s; the sweeper runs every second here.
  CHECK(WaitFor([&] { return PlanStatus(*c, plan) == 404; }, 15'000));
  CHECK(c->Get(("/v1/decisions/" + decision).c_str())->status == 404);
  CHECK(MetricValue(*c, "idem_retention_swept_total{kind=\"plans\"}") >= 1);
  CHECK(MetricValue(*c, "idem_retention_swept_total{kind=\"decisions\"}") >= 1);

  // The same input is decided again, and its plan proposed again.
  Json again = Decide(*c);
  CHECK(again["cache"] == "miss");
  CHECK(again["decision_id"] != decision);
  CHECK(again["plan"]["state"] == "proposed");
  CHECK(PlanStatus(*c, again["plan"]["plan_id"]) == 200);
}

TEST_CASE("a_rejected_plan_is_swept_once_store_finished_retention_has_passed") {
  TempDir dir;
  auto daemon = StartSweepingEverySecond(dir, "2s");
  auto c = daemon->Client();
  const std::string plan = RejectAndWaitForASweep(*daemon);
  CHECK(WaitFor([&] { return PlanStatus(*c, plan) == 404; }, 15'000));
  CHECK(MetricValue(*c, "idem_retention_swept_total{kind=\"plans\"}") >= 1);
}

TEST_CASE("with_store_finished_retention_forever_a_rejected_plan_outlives_every_sweep") {
  TempDir dir;
  auto daemon = StartSweepingEverySecond(dir, "forever");
  auto c = daemon->Client();
  const std::string plan = RejectAndWaitForASweep(*daemon);
  std::this_thread::sleep_for(std::chrono::milliseconds(2'500));  // two more passes
  REQUIRE(PlanStatus(*c, plan) == 200);
  CHECK(Json::parse(c->Get(("/v1/plans/" + plan).c_str())->body)["state"] == "rejected");
  CHECK(MetricValue(*c, "idem_retention_swept_total{kind=\"plans\"}") == 0);
}

// A store from before the finished-plan index: the daemon's first start
// indexes it, says so in its log, and sweeps by it; later starts do not.
TEST_CASE("an_older_store_is_indexed_once_at_start_and_the_log_says_so") {
  TempDir dir;
  const std::string data = dir.path() + "/data";
  // The harness appends each start's output to one log: what this start wrote.
  auto log_file = [&] {
    std::ifstream in(data + ".log");
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  };
  auto start = [&] {
    const size_t before = log_file().size();
    auto daemon = StartSweepingEverySecond(dir, "");
    return std::pair(std::move(daemon), log_file().substr(before));
  };
  // (Not structured bindings: clang 14 cannot capture them in doctest's
  // message lambdas.)
  {
    auto started = start();
    auto& daemon = started.first;
    const std::string& log = started.second;
    RejectAndWaitForASweep(*daemon);
    CHECK(log.find("store.indexing") == std::string::npos);  // a new store
    REQUIRE(daemon->Stop() == 0);
  }
  REQUIRE(ForgetIndex(data, rocks::Family::kPlansFinished, rocks::RocksPlanStore::kIndexedMarker) ==
          1);
  {
    auto started = start();
    auto& daemon = started.first;
    const std::string& log = started.second;
    const size_t indexing = log.find(R"("event":"store.indexing")");
    REQUIRE_MESSAGE(indexing != std::string::npos, log);
    CHECK(log.find(R"("index":"plans_finished")", indexing) != std::string::npos);
    const size_t indexed = log.find(R"("event":"store.indexed")");
    REQUIRE_MESSAGE(indexed != std::string::npos, log);
    CHECK(log.find(R"("indexed":1)", indexed) != std::string::npos);
    REQUIRE(daemon->Stop() == 0);
  }
  auto started = start();
  const std::string& log = started.second;
  CHECK_MESSAGE(log.find("store.indexing") == std::string::npos, log);
}

}  // namespace idem::testing
