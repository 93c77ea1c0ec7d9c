// PlanEngine with a fake clock: approval timeouts (expire, escalate once),
// fail-closed rules, what Apply refuses, and long polls on plans.
#include "daemon/plans/plan_engine.h"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "tests/unit/apply/apply_test_util.h"

namespace idem::testing {
namespace {

class RecordingNotifier final : public Notifier {
 public:
  void Notify(const Notification& n) override {
    std::lock_guard<std::mutex> lock(mu);
    sent.push_back(n);
  }
  std::vector<Notification> Sent() {
    std::lock_guard<std::mutex> lock(mu);
    return sent;
  }
  std::mutex mu;
  std::vector<Notification> sent;
};

struct PlanHarness : ApplyHarness {
  RecordingNotifier notifier;
  std::unique_ptr<PlanEngine> plans;

  // A kind gated by `approval`, executed by the fake effector.
  void Kind(const std::string& name, ApprovalPolicy approval) {
    ActionConfig& k =
        AddKind(name, {"/id"},
                Json{{"url", Url("/records")}, {"method", "POST"}, {"idempotency", "header"}});
    k.approval = std::move(approval);
  }
  PlanEngine& Plans() {
    if (!plans) {
      auto made = PlanEngine::Create(config_, *store_, engine(), clock_, metrics_, notifier);
      REQUIRE_MESSAGE(made.ok(), made.status().ToString());
      plans = std::move(made).value();
    }
    return *plans;
  }
  // The step "triage", whose decisions plan the actions at /actions.
  void TriageStep() {
    config_.steps["triage"].name = "triage";
    config_.steps["triage"].plan_pointer = "/actions";
  }
  // A triage decision "dec_" + 32 × `id` that plans one action.
  static Decision OneAction(char id, const std::string& kind, Json args) {
    Decision d;
    d.decision_id = "dec_" + std::string(32, id);
    d.step = "triage";
    d.output = {{"actions", Json::array({{{"kind", kind}, {"args", std::move(args)}}})}};
    return d;
  }
  Plan Gated(const std::string& kind, const Json& args) {
    auto gate = Plans().GateAction(config_.actions.at(kind), args, "action", "agent-1");
    REQUIRE_MESSAGE(gate.ok(), gate.status().ToString());
    REQUIRE_FALSE(gate->allowed);
    return gate->plan;
  }
};

ApprovalPolicy Always(int64_t timeout_ms, const std::string& on_timeout) {
  ApprovalPolicy p;
  p.require = "always";
  p.reason = "every one";
  p.timeout_ms = timeout_ms;
  p.on_timeout = on_timeout;
  return p;
}

// Gates amounts over 100 (`args.amount`).
ApprovalPolicy OverHundred(const std::string& reason = "refunds over 100") {
  ApprovalPolicy p;
  p.require = "when";
  p.when = Json::parse(R"({">": [{"var": "args.amount"}, 100]})");
  p.reason = reason;
  return p;
}

}  // namespace

TEST_CASE("an approval that times out expires the plan; one not yet due stays") {
  PlanHarness h;
  h.Kind("wire", Always(60'000, "expire"));
  Plan due = h.Gated("wire", {{"id", "w-1"}});
  h.env_.Advance(30'000);
  Plan later = h.Gated("wire", {{"id", "w-2"}});
  h.env_.Advance(30'001);
  auto changed = h.Plans().ExpireDue();
  REQUIRE(changed.ok());
  CHECK(*changed == 1);
  CHECK(h.store_->plans().Get(due.plan_id)->state == "expired");
  CHECK(h.store_->plans().Get(later.plan_id)->state == "awaiting_approval");
  // Nothing can approve or apply it now.
  CHECK(h.Plans().Approve(due.plan_id, "op-1", "", Json(), "r").status().code() ==
        Code::kFailedPrecondition);
  CHECK(h.Plans().Apply(due.plan_id, "op-1", "r").status().code() == Code::kFailedPrecondition);
  CHECK(h.fake().stats().raw_calls == 0);
  // The audit chain holds the expiry, by idem.
  auto events = h.store_->audit().Scan(1, 100);
  REQUIRE(events.ok());
  bool expired = false;
  for (const AuditEvent& e : *events) {
    expired = expired || (e.action == "plan.expired" && e.actor == "idem" &&
                          e.detail["plan_id"] == due.plan_id);
  }
  CHECK(expired);
}

TEST_CASE("an approval that arrives after the plan's deadline is refused and expires it") {
  PlanHarness h;
  h.Kind("wire", Always(60'000, "expire"));
  Plan p = h.Gated("wire", {{"id", "w-1"}});
  h.env_.Advance(60'001);  // no sweep has run
  auto late = h.Plans().Approve(p.plan_id, "op-1", "", Json(), "r");
  CHECK(late.status().code() == Code::kFailedPrecondition);
  CHECK(late.status().message().find("expired") != std::string::npos);
  CHECK(h.store_->plans().Get(p.plan_id)->state == "expired");
  CHECK(h.fake().stats().raw_calls == 0);
  // The direct call that made it gets the expiry too, not a new plan.
  auto again =
      h.Plans().GateAction(h.config_.actions.at("wire"), {{"id", "w-1"}}, "action", "agent-1");
  CHECK(again.status().code() == Code::kFailedPrecondition);
}

TEST_CASE("the expiry sweep reaches every waiting plan, however many wait around it") {
  PlanHarness h;
  h.Kind("wire", Always(3'600'000, "expire"));
  h.Kind("quick", Always(1'000, "expire"));
  auto made = PlanEngine::Create(h.config_, *h.store_, h.engine(), h.clock_, h.metrics_, h.notifier,
                                 PlanEngineOptions{.expiry_batch = 5});
  REQUIRE(made.ok());
  h.plans = std::move(made).value();
  for (int i = 0; i < 25; ++i) h.Gated("wire", {{"id", "old-" + std::to_string(i)}});
  Plan quick = h.Gated("quick", {{"id", "q-1"}});
  for (int i = 0; i < 25; ++i) h.Gated("wire", {{"id", "new-" + std::to_string(i)}});
  h.env_.Advance(1'001);
  // Each pass reads 4 pages of 5: the whole queue of 51 within 3 passes.
  for (int pass = 0; pass < 3; ++pass) REQUIRE(h.Plans().ExpireDue().ok());
  CHECK(h.store_->plans().Get(quick.plan_id)->state == "expired");
}

TEST_CASE(
    "a plan left approved by a daemon that stopped before the submit is applied by the settle "
    "sweep, once; an applying plan whose work is gone from the journal is not submitted again") {
  PlanHarness h;
  h.Kind("wire", Always(60'000, "expire"));
  Plan p = h.Gated("wire", {{"id", "w-1"}});
  // The approval's write landed; the daemon died before the submit.
  auto approved = h.store_->plans().Change(p.plan_id, PlanChange{.from = "awaiting_approval",
                                                                 .to = "approved",
                                                                 .actor = "op-1",
                                                                 .now_ms = h.clock_.NowMillis()});
  REQUIRE_MESSAGE(approved.ok(), approved.status().ToString());
  // Not at once: the apply that follows an approval may be running.
  REQUIRE(h.Plans().SettleFromJournal().ok());
  CHECK(h.fake().stats().raw_calls == 0);
  CHECK(h.store_->plans().Get(p.plan_id)->state == "approved");
  h.env_.Advance(5'001);
  auto settled = h.Plans().SettleFromJournal();
  REQUIRE_MESSAGE(settled.ok(), settled.status().ToString());
  CHECK(*settled == 1);
  CHECK(h.store_->plans().Get(p.plan_id)->state == "applied");
  CHECK(h.fake().stats().effects == 1);
  h.env_.Advance(5'001);
  REQUIRE(h.Plans().SettleFromJournal().ok());
  CHECK(h.fake().stats().effects == 1);

  // `applying` means its work was submitted (an approved plan moves on only
  // after the submit): work missing from the journal was done and
  // forgotten after its window, or renamed by a new identity version. It
  // is never submitted again.
  Plan q = h.Gated("wire", {{"id", "w-2"}});
  REQUIRE(h.store_->plans()
              .Change(q.plan_id, PlanChange{.from = "awaiting_approval",
                                            .to = "approved",
                                            .actor = "op-1",
                                            .now_ms = h.clock_.NowMillis()})
              .ok());
  REQUIRE(h.store_->plans()
              .Change(q.plan_id, PlanChange{.from = "approved",
                                            .to = "applying",
                                            .actor = "op-1",
                                            .now_ms = h.clock_.NowMillis()})
              .ok());
  h.env_.Advance(60'000);
  REQUIRE(h.Plans().SettleFromJournal().ok());
  CHECK(h.fake().stats().effects == 1);
  CHECK(h.store_->plans().Get(q.plan_id)->state == "applying");
}

TEST_CASE("an overdue plan whose policy escalates is notified once and keeps waiting") {
  PlanHarness h;
  h.Kind("wire", Always(1'000, "escalate"));
  Plan p = h.Gated("wire", {{"id", "w-1"}});
  REQUIRE(h.notifier.Sent().size() == 1);  // awaiting_approval
  CHECK(h.notifier.Sent()[0].kind == "awaiting_approval");
  CHECK(h.notifier.Sent()[0].command.find("idem approve " + p.plan_id) != std::string::npos);
  h.env_.Advance(1'001);
  CHECK(*h.Plans().ExpireDue() == 1);
  CHECK(*h.Plans().ExpireDue() == 0);  // once
  auto now = h.store_->plans().Get(p.plan_id);
  CHECK(now->state == "awaiting_approval");
  CHECK(now->approval["escalated"] == true);
  auto sent = h.notifier.Sent();
  REQUIRE(sent.size() == 2);
  CHECK(sent[1].kind == "approval_overdue");
  CHECK(sent[1].event_id == p.plan_id + ":approval_overdue:" +
                                std::to_string(p.approval["expires_at_ms"].get<int64_t>()));
  // It says what waits, as the first message did.
  CHECK(sent[1].detail["actions"] == p.actions);
  CHECK(sent[1].reason.find("every one") != std::string::npos);
  // It can still be approved, and then it is applied once.
  auto approved = h.Plans().Approve(p.plan_id, "op-1", "late but fine", Json(), "r");
  REQUIRE_MESSAGE(approved.ok(), approved.status().ToString());
  CHECK(approved->plan.state == "applied");
  CHECK(h.fake().stats().effects == 1);
}

TEST_CASE("approval sweeps of several daemons racing escalate each overdue plan once") {
  PlanHarness h;
  h.Kind("wire", Always(1'000, "escalate"));
  constexpr int kPlans = 30;
  for (int i = 0; i < kPlans; ++i) h.Gated("wire", {{"id", "w-" + std::to_string(i)}});
  h.env_.Advance(1'001);
  PlanEngine& plans = h.Plans();
  // Each sweep lists the overdue plans, then escalates them one by one: two
  // daemons (here threads) list the same plans before either writes.
  std::atomic<int> changed{0};
  std::atomic<int> ready{0};
  std::vector<std::thread> sweeps;
  for (int t = 0; t < 4; ++t) {
    sweeps.emplace_back([&] {
      ready++;
      while (ready.load() < 4) std::this_thread::yield();  // all start together
      auto n = plans.ExpireDue();
      if (n.ok()) changed += static_cast<int>(*n);
    });
  }
  for (auto& t : sweeps) t.join();
  CHECK(changed == kPlans);
  int overdue = 0;
  for (const Notification& n : h.notifier.Sent()) overdue += n.kind == "approval_overdue";
  CHECK(overdue == kPlans);
}

TEST_CASE("a rule that cannot be evaluated gates the action instead of letting it through") {
  PlanHarness h;
  ApprovalPolicy p;
  p.require = "when";
  p.source = "policies/broken.yaml";
  // Statically fine, but past the evaluation budget for a long list.
  p.when = Json::parse(R"({"some": [{"var": "args.list"}, {"==": [{"var": ""}, -1]}]})");
  h.Kind("spend", p);
  h.Plans();
  Json list = Json::array();
  for (int i = 0; i < 200'000; ++i) list.push_back(0);
  Plan gated = h.Gated("spend", {{"id", "s-1"}, {"list", list}});
  CHECK(gated.approval["reasons"][0]["reason"].get<std::string>().find("could not be evaluated") !=
        std::string::npos);
}

TEST_CASE(
    "a rule that passes an action only because a value it reads is absent gates it, unless the "
    "rule gave that value a default") {
  PlanHarness h;
  ApprovalPolicy over_100 = OverHundred();
  over_100.source = "policies/refund.yaml";
  h.Kind("refund", over_100);
  // No args_schema: the agent names the field otherwise; `>` of null is
  // false, and the rule alone would let 5000 through.
  Plan gated = h.Gated("refund", {{"id", "r-1"}, {"total", 5000}});
  const std::string reason = gated.approval["reasons"][0]["reason"];
  CHECK(reason.find("args.amount is absent") != std::string::npos);
  CHECK(reason.find("policies/refund.yaml") != std::string::npos);
  // Null, or there but no number: not judged "not over 100" either.
  for (const Json& amount : {Json(nullptr), Json("5,000"), Json("5000 EUR"), Json{{"value", 5000}},
                             Json(""), Json(true)}) {
    CAPTURE(amount.dump());
    Plan odd = h.Gated("refund", {{"id", "r-odd-" + amount.dump()}, {"amount", amount}});
    CHECK_FALSE(odd.approval["reasons"][0]["reason"].get<std::string>().empty());
  }
  // Present and small: through, as before.
  auto small = h.Plans().GateAction(h.config_.actions.at("refund"), {{"id", "r-2"}, {"amount", 50}},
                                    "action", "agent-1");
  REQUIRE_MESSAGE(small.ok(), small.status().ToString());
  CHECK(small->allowed);
  CHECK(small->plan.plan_id.empty());
  // Present, over: gated for the rule's own reason.
  Plan big = h.Gated("refund", {{"id", "r-3"}, {"amount", 500}});
  CHECK(big.approval["reasons"][0]["reason"] == "refunds over 100");

  // A rule that says what absence means is taken at its word.
  PlanHarness d;
  ApprovalPolicy defaulted = over_100;
  defaulted.when = Json::parse(R"({">": [{"var": ["args.amount", 0]}, 100]})");
  d.Kind("refund", defaulted);
  auto absent =
      d.Plans().GateAction(d.config_.actions.at("refund"), {{"id", "r-1"}}, "action", "agent-1");
  REQUIRE_MESSAGE(absent.ok(), absent.status().ToString());
  CHECK(absent->allowed);
  // And a branch the rule did not take reads nothing.
  PlanHarness m;
  ApprovalPolicy guarded = over_100;
  guarded.when = Json::parse(
      R"({"if": [{"missing": "args.amount"}, false, {">": [{"var": "args.amount"}, 100]}]})");
  m.Kind("refund", guarded);
  auto guarded_absent =
      m.Plans().GateAction(m.config_.actions.at("refund"), {{"id", "r-1"}}, "action", "agent-1");
  REQUIRE_MESSAGE(guarded_absent.ok(), guarded_absent.status().ToString());
  CHECK(guarded_absent->allowed);
}

TEST_CASE("a plan's own creator cannot approve it, and an edit outside args is refused") {
  PlanHarness h;
  AuthToken t;
  t.name = "agent-1";
  t.sha256 = std::string(64, 'a');
  t.roles = {"agent"};
  h.config_.auth.tokens.push_back(t);
  h.Kind("wire", Always(60'000, "expire"));
  Plan p = h.Gated("wire", {{"id", "w-1"}});
  CHECK(h.Plans().Approve(p.plan_id, "agent-1", "", Json(), "r").status().code() ==
        Code::kPermissionDenied);
  auto bad = h.Plans().Approve(p.plan_id, "op-1", "",
                               Json::array({{{"path", "/0/kind"}, {"value", "other"}}}), "r");
  CHECK(bad.status().field() == "/edits/0/path");
  auto missing = h.Plans().Approve(p.plan_id, "op-1", "",
                                   Json::array({{{"path", "/3/args/id"}, {"value", "x"}}}), "r");
  CHECK(missing.status().field() == "/edits/0/path");
  CHECK(h.store_->plans().Get(p.plan_id)->state == "awaiting_approval");
  CHECK(h.fake().stats().raw_calls == 0);
}

TEST_CASE("a rejection of only blanks and an edit path into a string are refused in plain words") {
  PlanHarness h;
  h.Kind("wire", Always(60'000, "expire"));
  Plan p = h.Gated("wire", {{"id", "w-1"}, {"memo", "x"}});
  for (const char* blank : {"", "   ", "\t\n"}) {
    auto r = h.Plans().Reject(p.plan_id, "op-1", blank);
    CHECK(r.status().code() == Code::kInvalidArgument);
    CHECK(r.status().field() == "/reason");
  }
  auto into_string = h.Plans().Approve(
      p.plan_id, "op-1", "", Json::array({{{"path", "/0/args/memo/0"}, {"value", 1}}}), "r");
  CHECK(into_string.status().code() == Code::kInvalidArgument);
  CHECK(into_string.status().field() == "/edits/0/path");
  CHECK(into_string.status().message().find("json.exception") == std::string::npos);
  CHECK(into_string.status().message().find("/0/args/memo/0") != std::string::npos);
  // A '~' that is neither ~0 nor ~1 is named as such, not as a wrong place.
  for (const char* bad : {"/0/args/a~2", "/0/args/a~", "/0/args/~x/b"}) {
    CAPTURE(bad);
    auto escape =
        h.Plans().Approve(p.plan_id, "op-1", "", Json::array({{{"path", bad}, {"value", 1}}}), "r");
    CHECK(escape.status().field() == "/edits/0/path");
    CHECK(escape.status().message().find("~0") != std::string::npos);
  }
  CHECK(h.store_->plans().Get(p.plan_id)->state == "awaiting_approval");
}

TEST_CASE(
    "an edit changes a list's item or adds one at its end, never an index further on, and writes "
    "into no null") {
  PlanHarness h;
  h.Kind("wire", Always(60'000, "expire"));
  Plan p = h.Gated("wire", {{"id", "w-1"}, {"list", {1, 2}}, {"nothing", nullptr}});
  // One short edit once made a list of two million nulls.
  for (const char* far : {"/0/args/list/2000000", "/0/args/list/3", "/0/args/list/01",
                          "/0/args/nothing/a", "/0/args/nothing/0"}) {
    CAPTURE(far);
    auto r =
        h.Plans().Approve(p.plan_id, "op-1", "", Json::array({{{"path", far}, {"value", 9}}}), "r");
    CHECK(r.status().code() == Code::kInvalidArgument);
    CHECK(r.status().field() == "/edits/0/path");
  }
  CHECK(h.store_->plans().Get(p.plan_id)->state == "awaiting_approval");
  auto ok = h.Plans().Approve(p.plan_id, "op-1", "",
                              Json::array({{{"path", "/0/args/list/1"}, {"value", 7}},
                                           {{"path", "/0/args/list/2"}, {"value", 8}},
                                           {{"path", "/0/args/list/-"}, {"value", 9}}}),
                              "r");
  REQUIRE_MESSAGE(ok.ok(), ok.status().ToString());
  CHECK(h.store_->plans().Get(p.plan_id)->actions[0]["args"]["list"] == Json({1, 7, 8, 9}));
}

TEST_CASE("an approval cannot edit its action into work whose own plan waits or was refused") {
  PlanHarness h;
  h.Kind("wire", Always(60'000, "expire"));
  Plan waiting = h.Gated("wire", {{"id", "w-1"}});
  Plan refused = h.Gated("wire", {{"id", "w-2"}});
  REQUIRE(h.Plans().Reject(refused.plan_id, "op-2", "fraud").ok());
  Plan mine = h.Gated("wire", {{"id", "w-3"}});
  for (const char* other : {"w-1", "w-2"}) {
    CAPTURE(other);
    auto retarget = h.Plans().Approve(
        mine.plan_id, "op-1", "", Json::array({{{"path", "/0/args/id"}, {"value", other}}}), "r");
    CHECK(retarget.status().code() == Code::kFailedPrecondition);
    CHECK(retarget.status().field() == "/edits/0/value");
  }
  CHECK(h.store_->plans().Get(waiting.plan_id)->state == "awaiting_approval");
  CHECK(h.store_->plans().Get(refused.plan_id)->state == "rejected");
  CHECK(h.store_->plans().Get(mine.plan_id)->state == "awaiting_approval");
  CHECK(h.fake().stats().raw_calls == 0);
  // Work no other plan gates: the approver's edit is what runs.
  auto approved = h.Plans().Approve(mine.plan_id, "op-1", "",
                                    Json::array({{{"path", "/0/args/id"}, {"value", "w-9"}}}), "r");
  REQUIRE_MESSAGE(approved.ok(), approved.status().ToString());
  CHECK(h.fake().stats().raw_calls == 1);
  CHECK(h.store_->plans().Get(waiting.plan_id)->state == "awaiting_approval");
}

TEST_CASE(
    "an approval cannot edit its action into work a decision's plan holds back for a human, "
    "whoever created it") {
  PlanHarness h;
  h.Kind("payout", Always(60'000, "expire"));
  h.TriageStep();
  auto decided = [&](char c, const std::string& id, int amount, const std::string& by) {
    Decision d = PlanHarness::OneAction(c, "payout", {{"id", id}, {"amount", amount}});
    auto plan = h.Plans().ProposeFromDecision(d, by);
    REQUIRE_MESSAGE(plan.ok(), plan.status().ToString());
    REQUIRE(plan->state == "awaiting_approval");
    return *plan;
  };
  // admin-1's own payout waits; agent-1's small one waits too.
  Plan own = decided('c', "O-92", 9000, "admin-1");
  Plan other = decided('d', "O-93", 5, "agent-1");
  auto through = h.Plans().Approve(other.plan_id, "admin-1", "",
                                   Json::array({{{"path", "/0/args/id"}, {"value", "O-92"}},
                                                {{"path", "/0/args/amount"}, {"value", 9000}}}),
                                   "r");
  CHECK(through.status().code() == Code::kFailedPrecondition);
  CHECK(through.status().message().find(own.plan_id) != std::string::npos);
  CHECK(h.fake().stats().raw_calls == 0);
  CHECK(h.store_->plans().Get(own.plan_id)->state == "awaiting_approval");
}

TEST_CASE(
    "a decision plan's approval lets its client-executed action through with the approved "
    "args: the client's claim opens no approval of its own") {
  PlanHarness h;
  h.TriageStep();
  ActionConfig& note = h.AddKind("note", {"/id"}, Json());
  note.effector = Json();  // executed by a client's claim
  note.approval = Always(60'000, "expire");
  Decision d = PlanHarness::OneAction('n', "note", {{"id", "n-1"}, {"amount", 50}});
  auto plan = h.Plans().ProposeFromDecision(d, "agent-1");
  REQUIRE_MESSAGE(plan.ok(), plan.status().ToString());
  REQUIRE(plan->state == "awaiting_approval");
  auto approved = h.Plans().Approve(plan->plan_id, "op-1", "",
                                    Json::array({{{"path", "/0/args/amount"}, {"value", 7}}}), "r");
  REQUIRE_MESSAGE(approved.ok(), approved.status().ToString());
  // The client claims with other args: it gets the approved ones, and no
  // plan waits for a second approval.
  auto gate = h.Plans().GateAction(h.config_.actions.at("note"), {{"id", "n-1"}, {"amount", 999}},
                                   "claim", "agent-1");
  REQUIRE_MESSAGE(gate.ok(), gate.status().ToString());
  CHECK(gate->allowed);
  CHECK(gate->args == Json{{"id", "n-1"}, {"amount", 7}});
  CHECK(gate->plan.approved_by == "op-1");
}

TEST_CASE("a gate plan that waits again for a new call is notified again, once") {
  PlanHarness h;
  ApprovalPolicy p = Always(60'000, "expire");
  h.Kind("wire", p);
  h.config_.actions["wire"].window_ms = 1'000;
  Plan first = h.Gated("wire", {{"id", "w-1"}});
  REQUIRE(h.Plans().Approve(first.plan_id, "op-1", "", Json(), "r").ok());
  REQUIRE(h.store_->plans().Get(first.plan_id)->state == "applied");
  h.env_.Advance(2'000);  // the work's window ends: the same work is new again
  Plan again = h.Gated("wire", {{"id", "w-1"}});
  CHECK(again.plan_id == first.plan_id);
  std::vector<Notification> sent = h.notifier.Sent();
  REQUIRE(sent.size() == 2);
  CHECK(sent[0].kind == "awaiting_approval");
  CHECK(sent[1].kind == "awaiting_approval");
  CHECK(sent[0].event_id != sent[1].event_id);    // the journal sends each
  Plan third = h.Gated("wire", {{"id", "w-1"}});  // still waiting: no new message
  CHECK(third.plan_id == first.plan_id);
  CHECK(h.notifier.Sent().size() == 2);
}

TEST_CASE(
    "a decision's plan whose args break the kind's schema waits for a human, who must edit or "
    "reject it") {
  PlanHarness h;
  ApprovalPolicy over_100 = OverHundred();
  // First without a rule over the amount (a rule that reads it would gate
  // an amount that is no number by itself).
  ApprovalPolicy never;
  never.require = "never";
  h.Kind("refund", never);
  h.TriageStep();
  // A model (steered by a ticket) puts the amount where the rule reads
  // nothing: `>` of an object is false, so the rule alone lets it through.
  Decision d =
      PlanHarness::OneAction('a', "refund", {{"id", "r-1"}, {"amount", {{"value", 9000}}}});
  {
    // Without a schema the kind takes any args: the rule is all there is.
    auto proposed = h.Plans().ProposeFromDecision(d, "agent-1");
    REQUIRE_MESSAGE(proposed.ok(), proposed.status().ToString());
    CHECK(proposed->state == "proposed");
  }
  // The kind gets its schema (a new config); the plan made before it is
  // never executed with args the schema refuses.
  h.plans.reset();
  h.config_.actions["refund"].approval = over_100;
  h.config_.actions["refund"].args_schema = Json::parse(
      R"({"type":"object","required":["id","amount"],"properties":{"amount":{"type":"number"}}})");
  auto stale = h.Plans().Apply("plan_" + std::string(32, 'a'), "agent-1", "r");
  REQUIRE_MESSAGE(stale.ok(), stale.status().ToString());
  REQUIRE(stale->actions.size() == 1);
  CHECK(stale->actions[0].outcome.status().code() == Code::kInvalidArgument);
  CHECK(stale->actions[0].outcome.status().field() == "/actions/0/args/amount");
  CHECK(h.fake().stats().raw_calls == 0);

  d.decision_id = "dec_" + std::string(32, 'b');
  auto gated = h.Plans().ProposeFromDecision(d, "agent-1");
  REQUIRE_MESSAGE(gated.ok(), gated.status().ToString());
  CHECK(gated->state == "awaiting_approval");
  std::string reason;  // the schema's, beside the rule's own doubt
  for (const Json& r : gated->approval["reasons"]) {
    if (r["reason"].get<std::string>().find("args_schema") != std::string::npos)
      reason = r["reason"];
  }
  CHECK(reason.find("args_schema") != std::string::npos);
  CHECK(reason.find("/0/args/amount") != std::string::npos);
  // Approving it as it is would run those args: refused, with what to edit.
  auto unedited = h.Plans().Approve(gated->plan_id, "op-1", "", Json(), "r");
  CHECK(unedited.status().code() == Code::kInvalidArgument);
  CHECK(unedited.status().field() == "/edits");
  CHECK(unedited.status().message().find("/0/args/amount") != std::string::npos);
  CHECK(h.store_->plans().Get(gated->plan_id)->state == "awaiting_approval");
  CHECK(h.fake().stats().raw_calls == 0);
  auto edited = h.Plans().Approve(gated->plan_id, "op-1", "",
                                  Json::array({{{"path", "/0/args/amount"}, {"value", 90}}}), "r");
  REQUIRE_MESSAGE(edited.ok(), edited.status().ToString());
  CHECK(h.fake().stats().raw_calls == 1);
}

TEST_CASE(
    "a waiting plan whose decision another took the place of is refused at its approval and "
    "leaves the new decision's plan free to run") {
  PlanHarness h;
  h.Kind("refund", Always(3'600'000, "expire"));
  h.TriageStep();
  auto decision = [](char id, int amount) {
    Decision d = PlanHarness::OneAction(id, "refund", {{"id", "r-7"}, {"amount", amount}});
    d.decision_key = std::string(64, 'f');  // one input, so one key
    d.material = {{"input", {{"ticket", 7}}}};
    return d;
  };
  const Decision first = decision('a', 500);
  REQUIRE(h.store_->decisions().PutIfAbsent(first, h.clock_.NowMillis()).ok());
  auto old_plan = h.Plans().ProposeFromDecision(first, "agent-1");
  REQUIRE_MESSAGE(old_plan.ok(), old_plan.status().ToString());
  REQUIRE(old_plan->state == "awaiting_approval");

  // A promote (or a refresh) stores another answer for the same input.
  const Decision second = decision('b', 50);
  REQUIRE(h.store_->decisions().Replace(second).ok());

  // Approving the old plan would refund 500 beside the new decision's 50.
  auto approved = h.Plans().Approve(old_plan->plan_id, "op-1", "", Json(), "r-1");
  REQUIRE(approved.status().code() == Code::kFailedPrecondition);
  CHECK(approved.status().message().find("superseded") != std::string::npos);
  CHECK(approved.status().message().find(second.decision_id) != std::string::npos);
  auto stored = h.store_->plans().Get(old_plan->plan_id);
  REQUIRE(stored.ok());
  CHECK(stored->state == "rejected");
  CHECK(stored->rejected_by == "idem");
  // Applying it by the old decision's id is refused as well.
  CHECK(h.Plans().Apply(first.decision_id, "agent-1", "r-2").status().code() ==
        Code::kFailedPrecondition);
  CHECK(h.fake().stats().raw_calls == 0);

  // The retired plan leaves no hold: the new decision's plan, for the same
  // work, is approved and runs once.
  auto new_plan = h.Plans().ProposeFromDecision(second, "agent-1");
  REQUIRE_MESSAGE(new_plan.ok(), new_plan.status().ToString());
  auto ran = h.Plans().Approve(new_plan->plan_id, "op-1", "", Json(), "r-3");
  REQUIRE_MESSAGE(ran.ok(), ran.status().ToString());
  REQUIRE(ran->actions.size() == 1);
  CHECK(ran->actions[0].outcome.ok());
  CHECK(h.fake().stats().raw_calls == 1);
}

TEST_CASE(
    "two actions of one plan on one unit of work with other args: the first runs, the second "
    "says it was not run") {
  PlanHarness h;
  h.Kind("refund", Always(3'600'000, "expire"));
  h.TriageStep();
  Decision d = PlanHarness::OneAction('t', "refund", {{"id", "D-3"}, {"amount", 500}});
  d.decision_key = std::string(64, '7');
  d.output["actions"].push_back({{"kind", "refund"}, {"args", {{"id", "D-3"}, {"amount", 700}}}});
  d.output["actions"].push_back({{"kind", "refund"}, {"args", {{"id", "D-3"}, {"amount", 500}}}});
  REQUIRE(h.store_->decisions().PutIfAbsent(d, h.clock_.NowMillis()).ok());
  auto plan = h.Plans().ProposeFromDecision(d, "agent-1");
  REQUIRE_MESSAGE(plan.ok(), plan.status().ToString());
  auto ran = h.Plans().Approve(plan->plan_id, "op-1", "", Json(), "r-1");
  REQUIRE_MESSAGE(ran.ok(), ran.status().ToString());
  REQUIRE(ran->actions.size() == 3);
  CHECK(ran->actions[0].outcome.ok());
  // The 700 would have reported the 500's effect as its own.
  REQUIRE_FALSE(ran->actions[1].outcome.ok());
  CHECK(ran->actions[1].outcome.status().code() == Code::kFailedPrecondition);
  CHECK(ran->actions[1].outcome.status().message().find("same unit of work as action 0") !=
        std::string::npos);
  CHECK(ran->actions[1].outcome.status().field() == "/actions/1/args");
  // The very same effect asked twice is done once, and both say so.
  CHECK(ran->actions[2].outcome.ok());
  CHECK(h.fake().stats().raw_calls == 1);
  CHECK(ran->plan.state == "partially_failed");
}

TEST_CASE(
    "a promote retires the original decision's waiting plan at once, and only a waiting one") {
  PlanHarness h;
  h.Kind("refund", Always(3'600'000, "expire"));
  h.TriageStep();
  Decision d = PlanHarness::OneAction('c', "refund", {{"id", "r-9"}});
  d.decision_key = std::string(64, 'e');
  REQUIRE(h.store_->decisions().PutIfAbsent(d, h.clock_.NowMillis()).ok());
  auto plan = h.Plans().ProposeFromDecision(d, "agent-1");
  REQUIRE(plan.ok());
  // Still its key's decision: nothing to retire.
  auto none = h.Plans().RetireSupersededPlan(d.decision_id, "op-1");
  REQUIRE(none.ok());
  CHECK(none->empty());
  CHECK(h.store_->plans().Get(plan->plan_id)->state == "awaiting_approval");

  Decision promoted = d;
  promoted.decision_id = "dec_" + std::string(32, 'd');
  REQUIRE(h.store_->decisions().Replace(promoted).ok());
  auto retired = h.Plans().RetireSupersededPlan(d.decision_id, "op-1");
  REQUIRE_MESSAGE(retired.ok(), retired.status().ToString());
  CHECK(*retired == plan->plan_id);
  auto stored = h.store_->plans().Get(plan->plan_id);
  CHECK(stored->state == "rejected");
  CHECK(stored->rejected_by == "op-1");
  CHECK(stored->reason.find(promoted.decision_id) != std::string::npos);
  // Once rejected there is nothing left to retire.
  CHECK(h.Plans().RetireSupersededPlan(d.decision_id, "op-1")->empty());
}

TEST_CASE("of promotes at once retiring one plan, exactly one says it retired it") {
  PlanHarness h;
  h.Kind("refund", Always(3'600'000, "expire"));
  h.TriageStep();
  for (int round = 0; round < 20; ++round) {
    CAPTURE(round);
    Decision d = PlanHarness::OneAction('c', "refund", {{"id", "r-" + std::to_string(round)}});
    d.decision_id = "dec_" + std::to_string(1000 + round) + std::string(28, 'c');
    d.decision_key = std::to_string(1000 + round) + std::string(60, 'e');
    REQUIRE(h.store_->decisions().PutIfAbsent(d, h.clock_.NowMillis()).ok());
    auto plan = h.Plans().ProposeFromDecision(d, "agent-1");
    REQUIRE(plan.ok());
    Decision promoted = d;
    promoted.decision_id = "dec_" + std::to_string(1000 + round) + std::string(28, 'd');
    REQUIRE(h.store_->decisions().Replace(promoted).ok());
    constexpr int kCallers = 4;
    std::atomic<int> ready{0};
    std::vector<StatusOr<std::string>> got(kCallers, std::string());
    std::vector<std::thread> callers;
    for (int i = 0; i < kCallers; ++i) {
      callers.emplace_back([&, i] {
        ready.fetch_add(1);
        while (ready.load() < kCallers) std::this_thread::yield();
        got[i] = h.Plans().RetireSupersededPlan(d.decision_id, "op-" + std::to_string(i));
      });
    }
    for (std::thread& t : callers) t.join();
    int said_retired = 0;
    for (const auto& g : got) {
      REQUIRE_MESSAGE(g.ok(), g.status().ToString());
      if (!g->empty()) {
        CHECK(*g == plan->plan_id);
        ++said_retired;
      }
    }
    CHECK(said_retired == 1);
    CHECK(h.store_->plans().Get(plan->plan_id)->state == "rejected");
  }
}

TEST_CASE(
    "an approval covers one execution: once the approved work's window is over, the same identity "
    "waits for a new approval of its own args") {
  PlanHarness h;
  ApprovalPolicy over_100 = OverHundred("big tips need a human");
  over_100.timeout_ms = 3'600'000;
  h.Kind("tip", over_100);
  h.config_.actions["tip"].window_ms = 3'000;
  // The target keeps no key of its own (with the work_id as its key, it
  // would refuse the later work's other body).
  h.config_.actions["tip"].effector["http"]["idempotency"] = "none";
  const ActionConfig& tip = h.config_.actions.at("tip");
  Plan first = h.Gated("tip", {{"id", "u1"}, {"amount", 500}});
  auto approved = h.Plans().Approve(first.plan_id, "op-1", "", Json(), "r-1");
  REQUIRE_MESSAGE(approved.ok(), approved.status().ToString());
  CHECK(h.fake().stats().raw_calls == 1);

  // Within the window the identity is the same work: the approval stands.
  auto same = h.Plans().GateAction(tip, {{"id", "u1"}, {"amount", 500}}, "action", "agent-2");
  REQUIRE(same.ok());
  CHECK(same->allowed);

  // After it, the same identity is new work: nothing runs until a human
  // approves it, with the args this call brought.
  h.env_.Advance(5'000);
  auto later = h.Plans().GateAction(tip, {{"id", "u1"}, {"amount", 9999}}, "action", "agent-2");
  REQUIRE_MESSAGE(later.ok(), later.status().ToString());
  CHECK_FALSE(later->allowed);
  CHECK(later->plan.plan_id == first.plan_id);
  CHECK(later->plan.state == "awaiting_approval");
  CHECK(later->plan.created_by == "agent-2");
  CHECK(later->plan.approved_by.empty());
  CHECK(later->plan.actions[0]["args"]["amount"] == 9999);
  CHECK(h.fake().stats().raw_calls == 1);
  // A second call meanwhile waits on the same plan.
  auto waiting = h.Plans().GateAction(tip, {{"id", "u1"}, {"amount", 9999}}, "run", "agent-3");
  REQUIRE(waiting.ok());
  CHECK_FALSE(waiting->allowed);
  auto again = h.Plans().Approve(first.plan_id, "op-1", "", Json(), "r-2");
  REQUIRE_MESSAGE(again.ok(), again.status().ToString());
  CHECK(h.fake().stats().raw_calls == 2);

  // After that window too, an amount the rule lets through runs with its
  // own args, not the approved ones.
  h.env_.Advance(5'000);
  CHECK(h.store_->plans().Get(first.plan_id)->state == "applied");
  auto small = h.Plans().GateAction(tip, {{"id", "u1"}, {"amount", 1}}, "run", "agent-2");
  REQUIRE(small.ok());
  CHECK(small->allowed);
  CHECK(small->args["amount"] == 1);
}

TEST_CASE("a plan's state follows its actions in the journal after the apply call returned") {
  PlanHarness h;
  h.Kind("wire", Always(60'000, "expire"));
  h.config_.actions["wire"].retry.attempts = 2;
  Plan p = h.Gated("wire", {{"id", "w-1"}});
  h.fake().FailNext(2, 503);
  auto approved = h.Plans().Approve(p.plan_id, "op-1", "", Json(), "r");
  REQUIRE_MESSAGE(approved.ok(), approved.status().ToString());
  CHECK(approved->moving);
  CHECK(h.store_->plans().Get(p.plan_id)->state == "applying");
  // Nothing has ended yet: nothing to settle.
  CHECK(*h.Plans().SettleFromJournal() == 0);
  // The workers' retry fails too: the work is a dead letter, long after the
  // approval answered. The plan says so without anyone applying it again.
  h.env_.Advance(10'001);
  CHECK(h.RunDue() == 1);
  const std::string work_id = h.WorkId("wire", {{"id", "w-1"}});
  REQUIRE(h.Get(work_id).state == WorkState::kDead);
  CHECK(h.store_->plans().Get(p.plan_id)->state == "applying");
  CHECK(*h.Plans().SettleFromJournal() == 1);
  CHECK(h.store_->plans().Get(p.plan_id)->state == "partially_failed");
  CHECK(*h.Plans().SettleFromJournal() == 0);
  // The dead letter replayed and done: the plan is applied.
  auto replayed = h.engine().Replay(work_id);
  REQUIRE_MESSAGE(replayed.ok(), replayed.status().ToString());
  h.RunDue();
  REQUIRE(h.Get(work_id).state == WorkState::kDone);
  CHECK(*h.Plans().SettleFromJournal() == 1);
  Plan settled = *h.store_->plans().Get(p.plan_id);
  CHECK(settled.state == "applied");
  CHECK(h.fake().stats().effects == 1);
}

// A plan awaiting approval: a wire (kind "wire" always waits, 60 s).
Plan WaitingWire(PlanHarness& h) {
  if (h.config_.actions.count("wire") == 0) h.Kind("wire", Always(60'000, "expire"));
  return h.Gated("wire", {{"id", "w-1"}});
}

// Counts the times a long poll fired, and lets a test wait for the first.
struct FireCounter {
  std::mutex mu;
  std::condition_variable cv;
  int fired = 0;
  std::function<void()> Fire() {
    return [this] {
      {
        std::lock_guard<std::mutex> lock(mu);
        ++fired;
      }
      cv.notify_all();
    };
  }
  bool WaitFired(std::chrono::milliseconds within) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, within, [&] { return fired > 0; });
  }
  int Count() {
    std::lock_guard<std::mutex> lock(mu);
    return fired;
  }
};

TEST_CASE("polls are bounded: past max_waiters a watch is refused and never fires") {
  PlanHarness h;
  h.Kind("wire", Always(60'000, "expire"));  // before the engine reads the config
  auto made = PlanEngine::Create(h.config_, *h.store_, h.engine(), h.clock_, h.metrics_, h.notifier,
                                 PlanEngineOptions{.max_waiters = 1});
  REQUIRE(made.ok());
  h.plans = std::move(made).value();
  Plan p = WaitingWire(h);
  FireCounter first, second;
  const uint64_t seen = h.Plans().Generation();
  CHECK(h.Plans().Watch(p.plan_id, seen, p.updated_at_ms, 30'000, first.Fire()));
  CHECK_FALSE(h.Plans().Watch(p.plan_id, seen, p.updated_at_ms, 30'000, second.Fire()));
  CHECK(h.Plans().Reject(p.plan_id, "op-1", "no").ok());
  CHECK(first.Count() == 1);
  CHECK(second.Count() == 0);
}

TEST_CASE("a poll fires once when its plan changes, not when another plan does") {
  PlanHarness h;
  Plan p = WaitingWire(h);
  Plan other = h.Gated("wire", {{"id", "w-2"}});
  FireCounter c;
  REQUIRE(h.Plans().Watch(p.plan_id, h.Plans().Generation(), p.updated_at_ms, 30'000, c.Fire()));
  REQUIRE(h.Plans().Reject(other.plan_id, "op-1", "not that one").ok());
  CHECK(c.Count() == 0);
  REQUIRE(h.Plans().Reject(p.plan_id, "op-1", "this one").ok());
  CHECK(c.Count() == 1);  // fired on the rejecting thread, after the write
  CHECK(h.store_->plans().Get(p.plan_id)->state == "rejected");
}

TEST_CASE("a poll whose plan changed before it was registered fires at once") {
  PlanHarness h;
  Plan p = WaitingWire(h);
  const uint64_t seen = h.Plans().Generation();  // the caller reads the plan now...
  REQUIRE(h.Plans().Reject(p.plan_id, "op-1", "meanwhile").ok());  // ...it changes...
  FireCounter c;
  REQUIRE(h.Plans().Watch(p.plan_id, seen, p.updated_at_ms, 30'000, c.Fire()));  // ...then it polls
  CHECK(c.Count() == 1);
}

TEST_CASE("a poll with no change fires at its deadline from the timer") {
  PlanHarness h;
  Plan p = WaitingWire(h);
  FireCounter c;
  REQUIRE(h.Plans().Watch(p.plan_id, h.Plans().Generation(), p.updated_at_ms, 150, c.Fire()));
  CHECK(c.Count() == 0);
  CHECK(c.WaitFired(std::chrono::seconds(5)));
  CHECK(c.Count() == 1);
}

TEST_CASE("polls still registered fire when the engine goes away") {
  PlanHarness h;
  Plan p = WaitingWire(h);
  FireCounter c;
  REQUIRE(h.Plans().Watch(p.plan_id, h.Plans().Generation(), p.updated_at_ms, 60'000, c.Fire()));
  h.plans.reset();
  CHECK(c.Count() == 1);
}

TEST_CASE(
    "a decision's plan whose action names its kind with no string is held for a human, never "
    "thrown on") {
  PlanHarness h;
  h.Kind("payout", Always(60'000, "expire"));
  h.TriageStep();
  // A model's output the step's schema did not pin down: the kind a number,
  // an object, an action that is not an object.
  Decision d = PlanHarness::OneAction('e', "payout", {{"id", "p-1"}, {"amount", 5}});
  d.output["actions"].push_back({{"kind", 5}, {"args", {{"id", "p-2"}}}});
  d.output["actions"].push_back({{"kind", {{"name", "payout"}}}, {"args", {{"id", "p-3"}}}});
  d.output["actions"].push_back("payout");
  std::optional<StatusOr<Plan>> proposed;
  REQUIRE_NOTHROW(proposed.emplace(h.Plans().ProposeFromDecision(d, "agent-1")));
  REQUIRE_MESSAGE(proposed->ok(), proposed->status().ToString());
  const Plan& plan = **proposed;
  CHECK(plan.state == "awaiting_approval");
  // Approving (with an edit of one action, which checks every other one
  // too) applies it: the one action of a configured kind runs, each other
  // one says why not.
  std::optional<StatusOr<PlanApplyResult>> applied;
  REQUIRE_NOTHROW(applied.emplace(h.Plans().Approve(
      plan.plan_id, "op-1", "", Json::array({{{"path", "/1/args/id"}, {"value", "p-9"}}}), "r")));
  REQUIRE_MESSAGE(applied->ok(), applied->status().ToString());
  REQUIRE((*applied)->actions.size() == 4);
  CHECK((*applied)->actions[0].outcome.ok());
  for (size_t i = 1; i < 4; ++i) {
    const Status& why = (*applied)->actions[i].outcome.status();
    CHECK(why.code() == Code::kNotFound);
    CHECK(why.message().find("the action names no kind") != std::string::npos);
  }
  REQUIRE_NOTHROW((void)h.Plans().Apply(plan.plan_id, "op-1", "r"));
  CHECK(h.fake().stats().raw_calls == 1);
}

}  // namespace idem::testing
