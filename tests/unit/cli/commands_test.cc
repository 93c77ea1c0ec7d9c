#include <doctest/doctest.h>

#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "daemon/cli/cli.h"

namespace idem::cli {
namespace {

// An HttpClient that answers from a function and records each request.
class FakeHttp final : public HttpClient {
 public:
  std::function<StatusOr<HttpResponse>(const HttpRequest&)> answer;
  std::vector<HttpRequest> seen;
  StatusOr<HttpResponse> Send(const HttpRequest& r) override {
    seen.push_back(r);
    return answer(r);
  }
};

HttpResponse JsonAnswer(int status, const Json& body) {
  HttpResponse r;
  r.status = status;
  r.headers = {{"content-type", status >= 400 ? "application/problem+json" : "application/json"}};
  r.body = body.dump();
  return r;
}

Json Problem(int status, const std::string& detail) {
  return {{"type", "urn:idem:problem:x"}, {"title", "T"}, {"status", status}, {"detail", detail}};
}

std::string HeaderOf(const HttpRequest& r, const std::string& name) {
  for (const auto& [n, v] : r.headers) {
    if (n == name) return v;
  }
  return "";
}

// Captures what a command writes to out and err.
struct Captured {
  std::FILE* out = std::tmpfile();
  std::FILE* err = std::tmpfile();
  ~Captured() {
    std::fclose(out);
    std::fclose(err);
  }
  Output Make(bool json = false) const {
    Output o;
    o.out = out;
    o.err = err;
    o.json = json;
    o.now_ms = 1'700'000'100'000;
    return o;
  }
  static std::string Read(std::FILE* f) {
    std::fflush(f);
    std::rewind(f);
    std::string s;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
    return s;
  }
  std::string Out() const { return Read(out); }
  std::string Err() const { return Read(err); }
};

Json SamplePlan() {
  return Json::parse(R"({
    "plan_id": "plan_abc", "decision_id": "dec_1", "origin": "decision", "step": "triage_ticket",
    "state": "awaiting_approval",
    "actions": [{"kind": "refund", "args": {"amount": 150, "order": "o-1"}},
                {"kind": "send_reply", "args": {"text": "sorry"}}],
    "approval": {"required": true, "reasons": [{"index": 0, "kind": "refund",
                 "reason": "refunds over 100 need a human"}], "expires_at_ms": 1700086400000,
                 "on_timeout": "expire"},
    "created_by": "agent-1", "history": [{"from": "proposed", "to": "awaiting_approval",
    "actor": "agent-1", "note": "", "at_ms": 1700000000000}],
    "created_at_ms": 1700000000000, "updated_at_ms": 1700000000000,
    "decision": {"decision_id": "dec_1", "step": "triage_ticket", "input": {"ticket_id": 42},
                 "output": {"category": "refund"}, "provider": "demo", "model": "demo-1",
                 "prompt_version": "v1", "status": "ok", "cost_usd": 0.002, "attempts": 1,
                 "created_at_ms": 1700000000000}
  })");
}

TEST_CASE("an edit is a JSON pointer and a JSON value, else a string") {
  CHECK(ParseEdit("/0/args/amount=90").value() == Json{{"path", "/0/args/amount"}, {"value", 90}});
  CHECK(ParseEdit("/0/args/ok=true").value()["value"] == true);
  CHECK(ParseEdit("/0/args/to=bob@example.com").value()["value"] == "bob@example.com");
  CHECK(ParseEdit("/0/args/code=\"90\"").value()["value"] == "90");
  CHECK(ParseEdit("/0/args/note=").value()["value"] == "");
  CHECK(ParseEdit("/0/args/q=a=b").value() == Json{{"path", "/0/args/q"}, {"value", "a=b"}});
  CHECK(ParseEdit("/0/args/list=[1,2]").value()["value"] == Json::array({1, 2}));
  CHECK(ParseEdit("/0/args/a~1b=1").ok());
  CHECK(ParseEdit("amount=90").status().code() == Code::kInvalidArgument);
  CHECK(ParseEdit("/0/args/amount").status().code() == Code::kInvalidArgument);
  CHECK(ParseEdit("/0/a~2=1").status().code() == Code::kInvalidArgument);
}

TEST_CASE("the approve body carries the comment and edits only when given") {
  CHECK(ApproveBody({}, "") == Json::object());
  Json edit = {{"path", "/0/args/amount"}, {"value", 90}};
  CHECK(ApproveBody({edit}, "ok by me") ==
        Json{{"comment", "ok by me"}, {"edits", Json::array({edit})}});
}

TEST_CASE("HTTP statuses map to the documented exit codes") {
  CHECK(ExitCodeForHttp(200) == 0);
  CHECK(ExitCodeForHttp(202) == 0);
  CHECK(ExitCodeForHttp(400) == 1);
  CHECK(ExitCodeForHttp(401) == 5);
  CHECK(ExitCodeForHttp(403) == 5);
  CHECK(ExitCodeForHttp(404) == 3);
  CHECK(ExitCodeForHttp(409) == 4);
  CHECK(ExitCodeForHttp(503) == 2);
  CHECK(ExitCodeForHttp(429) == 2);  // rate limited: retry later, as for 503
  CHECK(ExitCodeForHttp(500) == 7);
}

TEST_CASE("the plan list is one aligned row per plan") {
  Json item = SamplePlan();
  item.erase("decision");
  std::string text = RenderPlanList(Json::array({item}), Style{}, 1'700'000'300'000);
  CHECK(text ==
        "PLAN      STATE              ACTIONS             REASON                         "
        "CREATED BY  AGE\n"
        "plan_abc  awaiting_approval  refund, send_reply  refunds over 100 need a human  "
        "agent-1     5m\n");
}

TEST_CASE("a plan's detail shows its actions, reasons, decision and history") {
  std::string text = RenderPlan(SamplePlan(), Style{}, 1'700'000'300'000);
  CHECK(text.find("plan:       plan_abc\n") != std::string::npos);
  CHECK(text.find("state:      awaiting_approval\n") != std::string::npos);
  CHECK(text.find("  #0 refund: refunds over 100 need a human\n") != std::string::npos);
  CHECK(text.find("0  refund      {\"amount\":150,\"order\":\"o-1\"}\n") != std::string::npos);
  CHECK(text.find("model:    demo/demo-1\n") != std::string::npos);
  CHECK(text.find("input:    {\"ticket_id\":42}\n") != std::string::npos);
  CHECK(text.find("History:") != std::string::npos);
  CHECK(text.find("Original actions") == std::string::npos);  // not edited
  CHECK(text.find('\033') == std::string::npos);
  Json edited = SamplePlan();
  edited["original_actions"] = edited["actions"];
  edited["actions"][0]["args"]["amount"] = 90;
  text = RenderPlan(edited, Style{true}, 1'700'000'300'000);
  CHECK(text.find("Original actions") != std::string::npos);
  CHECK(text.find("\033[33mawaiting_approval\033[0m") != std::string::npos);
}

TEST_CASE("plans ls follows cursors up to --limit and prints JSON for scripts") {
  FakeHttp http;
  http.answer = [](const HttpRequest& r) -> StatusOr<HttpResponse> {
    Json p = SamplePlan();
    if (r.url.find("cursor=c2") == std::string::npos) {
      p["plan_id"] = "plan_1";
      return JsonAnswer(200, {{"items", {p}}, {"next_cursor", "c2"}});
    }
    p["plan_id"] = "plan_2";
    return JsonAnswer(200, {{"items", {p}}});
  };
  DaemonClient api("http://127.0.0.1:9/", "tok-1", http);
  Captured c;
  CHECK(PlansLs(api, c.Make(/*json=*/true), "awaiting_approval", 10) == kExitOk);
  REQUIRE(http.seen.size() == 2);
  CHECK(http.seen[0].method == "GET");
  CHECK(http.seen[0].url == "http://127.0.0.1:9/v1/plans?limit=10&state=awaiting_approval");
  CHECK(http.seen[1].url ==
        "http://127.0.0.1:9/v1/plans?limit=9&state=awaiting_approval&cursor=c2");
  CHECK(HeaderOf(http.seen[0], "Authorization") == "Bearer tok-1");
  Json out = Json::parse(c.Out());
  REQUIRE(out["items"].size() == 2);
  CHECK(out["items"][1]["plan_id"] == "plan_2");
}

TEST_CASE("plans ls --limit stops paging and says there is more") {
  FakeHttp http;
  http.answer = [](const HttpRequest&) -> StatusOr<HttpResponse> {
    return JsonAnswer(200, {{"items", {SamplePlan()}}, {"next_cursor", "more"}});
  };
  DaemonClient api("http://h", "", http);
  Captured c;
  CHECK(PlansLs(api, c.Make(), "applied", 1) == kExitOk);
  CHECK(http.seen.size() == 1);
  CHECK(http.seen[0].url == "http://h/v1/plans?limit=1&state=applied");
  CHECK(HeaderOf(http.seen[0], "Authorization").empty());
  CHECK(c.Out().find("plan_abc") != std::string::npos);
  CHECK(c.Out().find("(more: raise --limit)") != std::string::npos);
}

Json SampleDeadLetter() {
  return Json::parse(R"({"work_id": "7d42aa", "kind": "send_reply", "attempts": 5,
    "last_error": "Unavailable: effector send_reply: POST http://127.0.0.1:9000/replies: refused",
    "args": {"ticket_id": 42}, "updated_at_ms": 1700000000000, "run_id": ""})");
}

TEST_CASE("the dead-letter list is one aligned row per item, the work id whole") {
  Json run = SampleDeadLetter();
  run["work_id"] = "9c0b";
  run["run_id"] = "nightly";
  run["attempts"] = 12;
  run["last_error"] = "line one\nline two";
  std::string text =
      RenderDeadLetters(Json::array({SampleDeadLetter(), run}), Style{}, 1'700'000'300'000);
  CHECK(text ==
        "WORK    KIND        ATTEMPTS  RUN      DIED  LAST ERROR\n"
        "7d42aa  send_reply  5         -        5m    Unavailable: effector send_reply: POST "
        "http://127.0.0.1:9000/replies: refused\n"
        "9c0b    send_reply  12        nightly  5m    line one line two\n");
  CHECK(text.find('\033') == std::string::npos);
  CHECK(RenderDeadLetters(Json::array({run}), Style{true}, 1'700'000'300'000)
            .find("\033[31mline one line two\033[0m") != std::string::npos);
}

TEST_CASE("text another caller wrote cannot drive the operator's terminal") {
  Json letter = SampleDeadLetter();
  // An agent's fail: set the window title, erase the line, paint it green.
  letter["last_error"] = "timeout\x1b]0;all clear\x07\x1b[2K\x1b[32mOK\u009b0m";
  std::string text = RenderDeadLetters(Json::array({letter}), Style{}, 1'700'000'300'000);
  CHECK(text.find('\x1b') == std::string::npos);
  CHECK(text.find('\x07') == std::string::npos);
  CHECK(text.find("\xc2\x9b") == std::string::npos);  // C1 CSI
  CHECK(text.find("timeout\\x1b]0;all clear\\x07\\x1b[2K") != std::string::npos);
  CHECK(Printable("line one\nline\ttwo, caf\xc3\xa9") == "line one\nline\ttwo, caf\xc3\xa9");
  CHECK(Printable(std::string("nul\0del\x7f", 8)) == "nul\\x00del\\x7f");
}

TEST_CASE("JSON the CLI prints escapes C1 controls and stays the same JSON") {
  // U+009B is CSI to a terminal that acts on UTF-8 C1 controls; JSON's own
  // escaping (nlohmann's dump) covers only U+0000-U+001F.
  Json j = {{"note", "x\u009b31mred\u0085 caf\u00e9 \u00a0"}, {"n", 1}};
  std::string text = JsonText(j, 2);
  CHECK(text.find("\xc2\x9b") == std::string::npos);
  CHECK(text.find("\xc2\x85") == std::string::npos);
  CHECK(text.find("\\u009b31mred\\u0085") != std::string::npos);
  CHECK(text.find("caf\xc3\xa9 \xc2\xa0") != std::string::npos);  // printable: as it is
  CHECK(Json::parse(text) == j);
  CHECK(Str(Json{{"o", {{"k", "\u009b"}}}}, "o") == "{\"k\":\"\\u009b\"}");
}

TEST_CASE("bidi controls an agent wrote cannot reorder what the operator reads") {
  // U+202E (right-to-left override) makes "approved ... failed" read backwards.
  const std::string marks =
      "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c";
  Json letter = SampleDeadLetter();
  letter["last_error"] = "refund \u202edeliaf\u202c ok" + marks;
  std::string text = RenderDeadLetters(Json::array({letter}), Style{}, 1'700'000'300'000);
  CAPTURE(text);
  for (const char* raw : {"\xe2\x80\xaa", "\xe2\x80\xab", "\xe2\x80\xac", "\xe2\x80\xad",
                          "\xe2\x80\xae", "\xe2\x81\xa6", "\xe2\x81\xa7", "\xe2\x81\xa8",
                          "\xe2\x81\xa9", "\xe2\x80\x8e", "\xe2\x80\x8f", "\xd8\x9c"}) {
    CHECK(text.find(raw) == std::string::npos);
  }
  CHECK(text.find("refund \\u202edeliaf\\u202c ok") != std::string::npos);
  CHECK(Printable("a\u200fb\u2069c\u061c") == "a\\u200fb\\u2069c\\u061c");
  // Other characters of those blocks are text: dashes, quotes, Arabic letters.
  CHECK(Printable("\u2014 \u201c\u201d \u2026 \u0627 \u2070") ==
        "\u2014 \u201c\u201d \u2026 \u0627 \u2070");

  // --json: the same escapes, and still the same JSON.
  Json j = {{"last_error", "refund \u202edeliaf\u202c ok" + marks}};
  std::string json = JsonText(j, 2);
  CAPTURE(json);
  CHECK(json.find("\xe2\x80\xae") == std::string::npos);
  CHECK(json.find("\xd8\x9c") == std::string::npos);
  CHECK(json.find("refund \\u202edeliaf\\u202c ok") != std::string::npos);
  CHECK(Json::parse(json) == j);
}

TEST_CASE(
    "characters that hide themselves (soft hyphen, zero width, variation selectors, tags) are "
    "shown as escapes, in tables and in JSON") {
  // "O-1<soft hyphen>000" reads "O-1000"; "O-1" and two tag digits, "O-1".
  CHECK(Printable("O-1\u00ad000") == "O-1\\u00ad000");
  CHECK(Printable("a\u200bb\u034fc\ufe0fd\u2064e\u180ef") ==
        "a\\u200bb\\u034fc\\ufe0fd\\u2064e\\u180ef");
  CHECK(Printable("O-1\U000E0030\U000E0030") == "O-1\\udb40\\udc30\\udb40\\udc30");
  // Visible neighbours stay text: accents, CJK, emoji, the not sign.
  CHECK(Printable("caf\u00e9 \u4e2d \U0001F600 \u00ac") == "caf\u00e9 \u4e2d \U0001F600 \u00ac");
  const Json j = {{"order_id", "O-1\u00ad000\U000E0030"}};
  const std::string json = JsonText(j, -1);
  CHECK(json == "{\"order_id\":\"O-1\\u00ad000\\udb40\\udc30\"}");
  CHECK(Json::parse(json) == j);
}

TEST_CASE("a record read prints its problem on stderr, or on stdout with --json for a pipe") {
  FakeHttp http;
  http.answer = [](const HttpRequest&) -> StatusOr<HttpResponse> {
    return JsonAnswer(404, Problem(404, "no such work: nope"));
  };
  DaemonClient api("http://h", "tok", http);
  {
    Captured c;
    CHECK(PrintCall(api, c.Make(), "GET", "/v1/work/nope", Json(), "") == kExitNotFound);
    CHECK(c.Out().empty());
    CHECK(c.Err().find("no such work") != std::string::npos);
  }
  {
    Captured c;
    CHECK(PrintCall(api, c.Make(/*json=*/true), "GET", "/v1/work/nope", Json(), "") ==
          kExitNotFound);
    CHECK(Json::parse(c.Out())["detail"] == "no such work: nope");
  }
}

TEST_CASE("dlq ls asks for --limit, prints the table or the daemon's JSON, and says when empty") {
  FakeHttp http;
  Json items = Json::array({SampleDeadLetter()});
  http.answer = [&items](const HttpRequest&) -> StatusOr<HttpResponse> {
    return JsonAnswer(200, {{"items", items}});
  };
  DaemonClient api("http://h", "tok", http);
  {
    Captured c;
    CHECK(DlqLs(api, c.Make(), 1) == kExitOk);
    REQUIRE(http.seen.size() == 1);
    CHECK(http.seen[0].url == "http://h/v1/dead-letters?limit=1");
    CHECK(c.Out().starts_with("WORK    KIND"));
    CHECK(c.Out().find("(maybe more: raise --limit)") != std::string::npos);
    CHECK(c.Out().find("idem dlq replay WORK") != std::string::npos);
  }
  {
    Captured c;
    CHECK(DlqLs(api, c.Make(/*json=*/true), 100) == kExitOk);
    CHECK(Json::parse(c.Out())["items"][0]["work_id"] == "7d42aa");
  }
  items = Json::array();
  {
    Captured c;
    CHECK(DlqLs(api, c.Make(), 100) == kExitOk);
    CHECK(c.Out() == "no dead letters\n");
  }
  http.answer = [](const HttpRequest&) -> StatusOr<HttpResponse> {
    return JsonAnswer(403, Problem(403, "needs the operator role"));
  };
  Captured c;
  CHECK(DlqLs(api, c.Make(), 100) == kExitForbidden);
  CHECK(c.Err().find("needs the operator role") != std::string::npos);
}

TEST_CASE("escalations is one row per open escalation with the reason it could not be decided") {
  Json e = {{"escalation_id", "esc_1"},
            {"step", "triage_ticket"},
            {"state", "open"},
            {"created_at_ms", 1700000000000},
            {"context", {{"summary", "could not decide step triage_ticket after 3 attempts"}}}};
  FakeHttp http;
  http.answer = [&e](const HttpRequest&) -> StatusOr<HttpResponse> {
    return JsonAnswer(200, {{"items", {e}}});
  };
  DaemonClient api("http://h", "", http);
  Captured c;
  CHECK(EscalationsLs(api, c.Make(), 100) == kExitOk);
  REQUIRE(http.seen.size() == 1);
  CHECK(http.seen[0].url == "http://h/v1/escalations?state=open&limit=100");
  CHECK(c.Out() ==
        "ESCALATION  STEP           AGE  WHY\n"
        "esc_1       triage_ticket  1m   could not decide step triage_ticket after 3 attempts\n"
        "resolve one: POST /v1/escalations/ESCALATION/resolve, or the page at /ui/\n");
  http.answer = [](const HttpRequest&) -> StatusOr<HttpResponse> {
    return JsonAnswer(200, {{"items", Json::array()}});
  };
  Captured none;
  CHECK(EscalationsLs(api, none.Make(), 100) == kExitOk);
  CHECK(none.Out() == "no open escalations\n");
}

TEST_CASE("approve posts the edits with a fresh Idempotency-Key each time") {
  FakeHttp http;
  http.answer = [](const HttpRequest&) -> StatusOr<HttpResponse> {
    Json p = SamplePlan();
    p["state"] = "applied";
    p["results"] = Json::parse(R"([{"index": 0, "kind": "refund", "state": "done",
                                    "external_ref": "re_77"}])");
    return JsonAnswer(200, p);
  };
  DaemonClient api("http://h", "op", http);
  Captured c;
  CHECK(Approve(api, c.Make(), "plan_abc", {"/0/args/amount=90"}, "halved") == kExitOk);
  CHECK(Approve(api, c.Make(), "plan_abc", {}, "") == kExitOk);
  REQUIRE(http.seen.size() == 2);
  CHECK(http.seen[0].method == "POST");
  CHECK(http.seen[0].url == "http://h/v1/plans/plan_abc/approve");
  CHECK(Json::parse(http.seen[0].body) ==
        Json::parse(R"({"comment":"halved","edits":[{"path":"/0/args/amount","value":90}]})"));
  CHECK(HeaderOf(http.seen[0], "Content-Type") == "application/json");
  std::string k1 = HeaderOf(http.seen[0], "Idempotency-Key");
  CHECK(k1.size() > 2);
  CHECK(k1.front() == '"');
  CHECK(k1 != HeaderOf(http.seen[1], "Idempotency-Key"));
  CHECK(
      c.Out().find(
          "approved plan_abc: now applied\n#  KIND    STATE  RESULT\n0  refund  done   re_77\n") !=
      std::string::npos);
}

TEST_CASE("a bad --edit is a usage error and sends nothing") {
  FakeHttp http;
  http.answer = [](const HttpRequest&) -> StatusOr<HttpResponse> { return HttpResponse{}; };
  DaemonClient api("http://h", "", http);
  Captured c;
  CHECK(Approve(api, c.Make(), "plan_abc", {"amount=90"}, "") == kExitUsage);
  CHECK(http.seen.empty());
  CHECK(c.Err().find("JSON pointer") != std::string::npos);
}

TEST_CASE("approve and reject answers become exit codes with the problem on stderr") {
  FakeHttp http;
  int status = 409;
  http.answer = [&status](const HttpRequest&) -> StatusOr<HttpResponse> {
    Json p = Problem(status, "plan is not awaiting approval");
    p["state"] = "applied";
    return JsonAnswer(status, p);
  };
  DaemonClient api("http://h", "op", http);
  {
    Captured c;
    CHECK(Approve(api, c.Make(), "plan_abc", {}, "") == kExitConflict);
    CHECK(c.Err() ==
          "idem: approve plan_abc: HTTP 409 T: plan is not awaiting approval (state applied)\n");
    CHECK(c.Out().empty());
  }
  status = 403;
  {
    Captured c;
    CHECK(Reject(api, c.Make(), "plan_abc", "no") == kExitForbidden);
    CHECK(Json::parse(http.seen.back().body) == Json{{"reason", "no"}});
  }
  status = 404;
  {
    Captured c;
    CHECK(Reject(api, c.Make(/*json=*/true), "plan_x", "no") == kExitNotFound);
    CHECK(Json::parse(c.Out())["status"] == 404);  // the problem, for scripts
  }
}

TEST_CASE("an unreachable daemon exits 2 and names the URL") {
  FakeHttp http;
  http.answer = [](const HttpRequest&) -> StatusOr<HttpResponse> {
    return Unavailable("GET http://h/v1/plans: connection refused", true);
  };
  DaemonClient api("http://h", "secret-token", http);
  Captured c;
  CHECK(PlansShow(api, c.Make(), "plan_abc") == kExitUnreachable);
  CHECK(c.Err().find("cannot reach the daemon at http://h") != std::string::npos);
  CHECK(c.Err().find("secret-token") == std::string::npos);
}

// A daemon's audit log for the fake: `n` chained events.
std::vector<AuditEvent> Chain(int n) {
  std::vector<AuditEvent> out;
  std::string prev;
  for (int i = 1; i <= n; ++i) {
    AuditEvent e;
    e.seq = static_cast<uint64_t>(i);
    e.at_ms = 1'700'000'000'000 + i;
    e.actor = "op-1";
    e.action = "plan.approved";
    e.detail = Json{{"plan_id", "plan_" + std::to_string(i)}};
    e.prev_hash = prev;
    e.hash = AuditChainHash(e).value();
    prev = e.hash;
    out.push_back(e);
  }
  return out;
}

// Serves GET /v1/audit (pages of `page` events) and /v1/audit/verify.
void ServeAudit(FakeHttp& http, const std::vector<AuditEvent>* events, const Json* verify,
                size_t page) {
  http.answer = [events, verify, page](const HttpRequest& r) -> StatusOr<HttpResponse> {
    if (r.url.find("/v1/audit/verify") != std::string::npos) {
      return JsonAnswer((*verify)["ok"] == true ? 200 : 409, *verify);
    }
    size_t from = std::stoul(r.url.substr(r.url.find("from_seq=") + 9));
    Json items = Json::array();
    uint64_t last = 0;
    for (const AuditEvent& e : *events) {
      if (e.seq >= from && items.size() < page) {
        items.push_back(e.ToJson());
        last = e.seq;
      }
    }
    Json next = items.size() == page ? Json(last + 1) : Json(nullptr);
    return JsonAnswer(200, {{"items", items}, {"next_from_seq", next}});
  };
}

TEST_CASE("audit verify recomputes every page and agrees with an intact daemon") {
  std::vector<AuditEvent> events = Chain(5);
  Json verify = {{"ok", true}, {"checked", 5}, {"head_seq", 5}, {"head_hash", events[4].hash}};
  FakeHttp http;
  ServeAudit(http, &events, &verify, 2);
  DaemonClient api("http://h", "op", http);
  Captured c;
  CHECK(AuditVerify(api, c.Make()) == kExitOk);
  CHECK(http.seen.size() == 4);  // verify + pages 1-2, 3-4, 5
  CHECK(c.Out().find("audit chain intact: 5 events, head seq 5") != std::string::npos);
}

TEST_CASE("audit verify finds a modified event even when the daemon says intact") {
  std::vector<AuditEvent> events = Chain(4);
  Json verify = {{"ok", true}, {"checked", 4}, {"head_seq", 4}, {"head_hash", events[3].hash}};
  events[2].actor = "mallory";  // seq 3, served as is
  FakeHttp http;
  ServeAudit(http, &events, &verify, 100);
  DaemonClient api("http://h", "op", http);
  Captured c;
  CHECK(AuditVerify(api, c.Make(/*json=*/true)) == kExitAuditBroken);
  Json out = Json::parse(c.Out());
  CHECK(out["ok"] == false);
  CHECK(out["broken_seq"] == 3);
  CHECK(out["client"]["broken_seq"] == 3);
}

TEST_CASE("audit verify finds events removed from the end against the daemon's head") {
  std::vector<AuditEvent> events = Chain(4);
  Json verify = {{"ok", true}, {"checked", 4}, {"head_seq", 4}, {"head_hash", events[3].hash}};
  events.pop_back();
  FakeHttp http;
  ServeAudit(http, &events, &verify, 100);
  DaemonClient api("http://h", "op", http);
  Captured c;
  CHECK(AuditVerify(api, c.Make()) == kExitAuditBroken);
  CHECK(c.Out().find("audit chain BROKEN at seq 4") != std::string::npos);
}

TEST_CASE("audit verify ignores events appended after the daemon's check") {
  std::vector<AuditEvent> events = Chain(4);
  Json verify = {{"ok", true}, {"checked", 3}, {"head_seq", 3}, {"head_hash", events[2].hash}};
  FakeHttp http;
  ServeAudit(http, &events, &verify, 100);
  DaemonClient api("http://h", "op", http);
  Captured c;
  CHECK(AuditVerify(api, c.Make()) == kExitOk);
}

TEST_CASE("audit verify reports the daemon's broken seq") {
  std::vector<AuditEvent> events = Chain(3);
  events.erase(events.begin() + 1);  // seq 2 removed
  Json verify = Problem(409, "audit chain broken at seq 2: event missing");
  verify["ok"] = false;
  verify["broken_seq"] = 2;
  FakeHttp http;
  ServeAudit(http, &events, &verify, 100);
  DaemonClient api("http://h", "op", http);
  Captured c;
  CHECK(AuditVerify(api, c.Make()) == kExitAuditBroken);
  std::string out = c.Out();
  CHECK(out.find("BROKEN at seq 2") != std::string::npos);
  CHECK(out.find("daemon: audit chain broken at seq 2") != std::string::npos);
  CHECK(out.find("client: seq 2: event missing") != std::string::npos);
}

}  // namespace
}  // namespace idem::cli
