// The client commands of cli.h.
#include <algorithm>
#include <cctype>
#include <string>
#include <utility>
#include <vector>

#include "daemon/cli/cli.h"
#include "daemon/core/crypto.h"
#include "daemon/core/http_client.h"
#include "daemon/core/json.h"

namespace idem::cli {

std::string Str(const Json& j, const char* key) {
  if (!j.is_object()) return "";
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return "";
  if (it->is_string()) return Printable(it->get<std::string>());
  return JsonText(*it);
}

std::string JsonText(const Json& j, int indent) {
  return WithC1Escaped(j.dump(indent, ' ', false, Json::error_handler_t::replace));
}

int64_t Int(const Json& j, const char* key) {
  if (!j.is_object()) return 0;
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return 0;
  return it->get<int64_t>();
}

namespace {

const Json& Member(const Json& j, const char* key) {
  static const Json* null = new Json();
  if (!j.is_object()) return *null;
  auto it = j.find(key);
  return it == j.end() ? *null : *it;
}

std::string Compact(const Json& j) {
  if (j.is_null()) return "";
  return JsonText(j);
}

Color StateColor(const std::string& state) {
  if (state == "awaiting_approval" || state == "proposed") return Color::kYellow;
  if (state == "approved" || state == "applied" || state == "done") return Color::kGreen;
  if (state == "applying" || state == "running" || state == "pending") return Color::kCyan;
  if (state == "rejected" || state == "expired" || state == "partially_failed" || state == "dead" ||
      state == "failed") {
    return Color::kRed;
  }
  return Color::kNone;
}

std::string ActionKinds(const Json& actions) {
  if (!actions.is_array()) return "";
  std::string out;
  for (const Json& a : actions) {
    if (!out.empty()) out += ", ";
    out += Str(a, "kind");
  }
  return out;
}

std::string FirstReason(const Json& plan) {
  const Json& reasons = Member(Member(plan, "approval"), "reasons");
  if (!reasons.is_array() || reasons.empty()) return "";
  std::string out = Str(reasons[0], "reason");
  if (reasons.size() > 1) out += " (+" + std::to_string(reasons.size() - 1) + ")";
  return out;
}

Table ActionTable(const Json& actions) {
  Table t({"#", "KIND", "ARGS"});
  t.SetMaxWidth(2, 100);
  if (actions.is_array()) {
    for (size_t i = 0; i < actions.size(); ++i) {
      t.AddRow({std::to_string(i), Str(actions[i], "kind"), Compact(Member(actions[i], "args"))});
    }
  }
  return t;
}

void Print(std::FILE* f, const std::string& text) { std::fwrite(text.data(), 1, text.size(), f); }

void PrintJson(const Output& o, const Json& j) { Print(o.out, JsonText(j, 2) + "\n"); }

// An error answer: the problem body on stdout with --json (scripts read it
// and the exit code), else one line on stderr.
int ReportError(const Output& o, const std::string& what, const ApiAnswer& a) {
  if (o.json && !a.body.is_null()) {
    PrintJson(o, a.body);
  } else {
    Print(o.err, "idem: " + what + ": " + DescribeProblem(a) + "\n");
  }
  return ExitCodeForHttp(a.status);
}

int ReportUnreachable(const Output& o, const Status& s) {
  Print(o.err, "idem: " + s.message() + "\n");
  return kExitUnreachable;
}

}  // namespace

int ExitCodeForHttp(int status) {
  if (status >= 200 && status < 300) return kExitOk;
  switch (status) {
    case 400:
    case 413:
    case 422:
      return kExitUsage;
    case 401:
    case 403:
      return kExitForbidden;
    case 404:
      return kExitNotFound;
    case 409:
      return kExitConflict;
    case 429:  // rate limited: come back later, as for an overloaded daemon
    case 502:
    case 503:
    case 504:
      return kExitUnreachable;
    default:
      return kExitFailed;
  }
}

DaemonClient::DaemonClient(std::string url, std::string token, HttpClient& http)
    : url_(std::move(url)), token_(std::move(token)), http_(http) {
  while (!url_.empty() && url_.back() == '/') url_.pop_back();
}

StatusOr<ApiAnswer> DaemonClient::Call(const std::string& method, const std::string& path,
                                       const Json& body, const std::string& idempotency_key) {
  HttpRequest req;
  req.method = method;
  req.url = url_ + path;
  req.connect_timeout_ms = 5'000;
  req.timeout_ms = 90'000;  // GET /v1/plans/{id}?wait= may hold up to 60 s
  req.headers.emplace_back("Accept", "application/json");
  if (!token_.empty()) req.headers.emplace_back("Authorization", "Bearer " + token_);
  if (!idempotency_key.empty()) req.headers.emplace_back("Idempotency-Key", idempotency_key);
  if (!body.is_null()) {
    req.headers.emplace_back("Content-Type", "application/json");
    req.body = body.dump();
  }
  return Exchange(req);
}

StatusOr<ApiAnswer> DaemonClient::Exchange(const HttpRequest& req) {
  StatusOr<HttpResponse> res = http_.Send(req);
  if (!res.ok()) {
    // The URL may carry a proxy's user:password: never shown.
    return Unavailable("cannot reach the daemon at " + UrlForMessages(url_) + " (" +
                       res.status().message() + ")");
  }
  ApiAnswer a;
  a.status = res->status;
  a.headers = std::move(res->headers);
  a.text = std::move(res->body);
  Json parsed = Json::parse(a.text, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_discarded()) a.body = std::move(parsed);
  return a;
}

StatusOr<Json> ParseEdit(const std::string& arg) {
  size_t eq = arg.find('=');
  if (eq == std::string::npos) {
    return InvalidArgument("--edit takes PATH=VALUE (e.g. /0/args/amount=90), got '" + arg + "'");
  }
  std::string path = arg.substr(0, eq), text = arg.substr(eq + 1);
  if (path.empty() || path[0] != '/') {
    return InvalidArgument(
        "--edit PATH must be a JSON pointer into the actions, such as "
        "/0/args/amount; got '" +
        path + "'");
  }
  for (size_t i = 0; i < path.size(); ++i) {
    if (path[i] == '~' && (i + 1 == path.size() || (path[i + 1] != '0' && path[i + 1] != '1'))) {
      return InvalidArgument("--edit PATH '" + path + "': '~' must be followed by 0 or 1");
    }
  }
  Json value = text;
  if (StatusOr<Json> parsed = ParseJson(text); parsed.ok()) value = *std::move(parsed);
  return Json{{"path", path}, {"value", value}};
}

Json ApproveBody(const std::vector<Json>& edits, const std::string& comment) {
  Json body = Json::object();
  if (!comment.empty()) body["comment"] = comment;
  if (!edits.empty()) body["edits"] = edits;
  return body;
}

std::string DescribeProblem(const ApiAnswer& a) {
  std::string title = Str(a.body, "title");
  std::string out = "HTTP " + std::to_string(a.status) + (title.empty() ? "" : " " + title);
  std::string detail = Str(a.body, "detail");
  if (detail.empty() && a.body.is_null()) detail = Truncate(Printable(a.text), 200);
  if (!detail.empty()) out += ": " + detail;
  std::string pointer = Str(a.body, "pointer");
  if (!pointer.empty()) out += " (at " + pointer + ")";
  std::string state = Str(a.body, "state");
  if (!state.empty()) out += " (state " + state + ")";
  return out;
}

std::string RenderPlanList(const Json& items, const Style& style, int64_t now_ms) {
  Table t({"PLAN", "STATE", "ACTIONS", "REASON", "CREATED BY", "AGE"});
  t.SetMaxWidth(2, 40);
  t.SetMaxWidth(3, 60);
  if (items.is_array()) {
    for (const Json& p : items) {
      std::string state = Str(p, "state");
      t.AddRow({Str(p, "plan_id"),
                {state, StateColor(state)},
                ActionKinds(Member(p, "actions")),
                FirstReason(p),
                Str(p, "created_by"),
                Age(Int(p, "created_at_ms"), now_ms)});
    }
  }
  return t.Render(style);
}

std::string RenderPlan(const Json& plan, const Style& style, int64_t now_ms) {
  std::string state = Str(plan, "state");
  std::vector<std::pair<std::string, std::string>> kv = {
      {"plan", Str(plan, "plan_id")}, {"state", style.Paint(state, StateColor(state))}};
  auto add = [&kv](const std::string& label, const std::string& value) {
    if (!value.empty()) kv.emplace_back(label, value);
  };
  add("origin", Str(plan, "origin"));
  add("step", Str(plan, "step"));
  add("decision", Str(plan, "decision_id"));
  add("created by", Str(plan, "created_by"));
  int64_t created = Int(plan, "created_at_ms");
  if (created > 0) add("created", UtcTime(created) + " (" + Age(created, now_ms) + " ago)");
  const Json& approval = Member(plan, "approval");
  if (int64_t expires = Int(approval, "expires_at_ms");
      expires > 0 && state == "awaiting_approval") {
    add("expires", UtcTime(expires) + " (then " + Str(approval, "on_timeout") + ")");
  }
  add("approved by", Str(plan, "approved_by"));
  add("comment", Str(plan, "comment"));
  add("rejected by", Str(plan, "rejected_by"));
  add("reason", Str(plan, "reason"));
  std::string out = KeyValues(kv, style);

  const Json& reasons = Member(approval, "reasons");
  if (reasons.is_array() && !reasons.empty()) {
    out += "\n" + style.Paint("Approval reasons:", Color::kBold) + "\n";
    for (const Json& r : reasons) {
      out += "  #" + Str(r, "index") + " " + Str(r, "kind") + ": " + Str(r, "reason") + "\n";
    }
  }
  out += "\n" + style.Paint("Actions:", Color::kBold) + "\n" +
         ActionTable(Member(plan, "actions")).Render(style);
  const Json& original = Member(plan, "original_actions");
  if (original.is_array()) {
    out += "\n" + style.Paint("Original actions (before the operator's edits):", Color::kBold) +
           "\n" + ActionTable(original).Render(style);
  }
  const Json& d = Member(plan, "decision");
  if (d.is_object()) {
    const Json& attempts = Member(d, "attempts");
    std::string attempt_text =
        attempts.is_array() ? std::to_string(attempts.size()) : Str(d, "attempts");
    std::vector<std::pair<std::string, std::string>> dkv;
    auto dadd = [&dkv](const std::string& label, const std::string& value) {
      if (!value.empty()) dkv.emplace_back(label, value);
    };
    dadd("decision", Str(d, "decision_id"));
    dadd("step", Str(d, "step"));
    std::string model = Str(d, "provider");
    if (!Str(d, "model").empty()) model += "/" + Str(d, "model");
    dadd("model", model);
    dadd("prompt", Str(d, "prompt_version"));
    dadd("status", Str(d, "status"));
    dadd("cost_usd", Str(d, "cost_usd"));
    dadd("attempts", attempt_text);
    dadd("input", Truncate(Compact(Member(d, "input")), 200));
    dadd("output", Truncate(Compact(Member(d, "output")), 200));
    out += "\n" + style.Paint("Decision:", Color::kBold) + "\n" + KeyValues(dkv, style);
  }
  const Json& work = Member(plan, "work");
  if (work.is_array() && !work.empty()) {
    Table t({"#", "KIND", "STATE", "ATTEMPT", "EXTERNAL_REF", "LAST_ERROR"});
    t.SetMaxWidth(5, 60);
    for (const Json& w : work) {
      std::string ws = Str(w, "state");
      t.AddRow({Str(w, "index"),
                Str(w, "kind"),
                {ws, StateColor(ws)},
                Str(w, "attempt"),
                Str(w, "external_ref"),
                Str(w, "last_error")});
    }
    out += "\n" + style.Paint("Work:", Color::kBold) + "\n" + t.Render(style);
  }
  const Json& history = Member(plan, "history");
  if (history.is_array() && !history.empty()) {
    Table t({"AT", "FROM", "TO", "ACTOR", "NOTE"});
    t.SetMaxWidth(4, 60);
    for (const Json& h : history) {
      std::string to = Str(h, "to");
      t.AddRow({UtcTime(Int(h, "at_ms")),
                Str(h, "from"),
                {to, StateColor(to)},
                Str(h, "actor"),
                Str(h, "note")});
    }
    out += "\n" + style.Paint("History:", Color::kBold) + "\n" + t.Render(style);
  }
  return out;
}

std::string RenderDeadLetters(const Json& items, const Style& style, int64_t now_ms) {
  Table t({"WORK", "KIND", "ATTEMPTS", "RUN", "DIED", "LAST ERROR"});
  t.SetMaxWidth(5, 80);
  if (items.is_array()) {
    for (const Json& w : items) {
      t.AddRow({Str(w, "work_id"),
                Str(w, "kind"),
                std::to_string(Int(w, "attempts")),
                Str(w, "run_id").empty() ? "-" : Str(w, "run_id"),
                Age(Int(w, "updated_at_ms"), now_ms),
                {Str(w, "last_error"), Color::kRed}});
    }
  }
  return t.Render(style);
}

std::string RenderEscalations(const Json& items, const Style& style, int64_t now_ms) {
  Table t({"ESCALATION", "STEP", "AGE", "WHY"});
  t.SetMaxWidth(3, 100);
  if (items.is_array()) {
    for (const Json& e : items) {
      t.AddRow({Str(e, "escalation_id"),
                Str(e, "step"),
                Age(Int(e, "created_at_ms"), now_ms),
                {Str(Member(e, "context"), "summary"), Color::kYellow}});
    }
  }
  return t.Render(style);
}

namespace {

// A list command of one GET: the daemon's JSON with --json; else `render`
// of its items, or `none` when there are none, and `hint` under the table.
int ListCommand(DaemonClient& api, const Output& o, const std::string& what,
                const std::string& path, size_t limit, const std::string& none,
                const std::string& hint,
                std::string (*render)(const Json&, const Style&, int64_t)) {
  StatusOr<ApiAnswer> a = api.Call("GET", path);
  if (!a.ok()) return ReportUnreachable(o, a.status());
  if (a->status != 200) return ReportError(o, what, *a);
  if (o.json) {
    PrintJson(o, a->body);
    return kExitOk;
  }
  const Json& items = Member(a->body, "items");
  if (!items.is_array() || items.empty()) {
    Print(o.out, none + "\n");
    return kExitOk;
  }
  Print(o.out, render(items, o.style, o.now_ms));
  if (items.size() >= limit) {
    Print(o.out, o.style.Paint("(maybe more: raise --limit)", Color::kDim) + "\n");
  }
  Print(o.out, o.style.Paint(hint, Color::kDim) + "\n");
  return kExitOk;
}

}  // namespace

int DlqLs(DaemonClient& api, const Output& o, size_t limit) {
  return ListCommand(api, o, "dlq ls", "/v1/dead-letters?limit=" + std::to_string(limit), limit,
                     "no dead letters", "replay one: idem dlq replay WORK", RenderDeadLetters);
}

int EscalationsLs(DaemonClient& api, const Output& o, size_t limit) {
  return ListCommand(api, o, "escalations",
                     "/v1/escalations?state=open&limit=" + std::to_string(limit), limit,
                     "no open escalations",
                     "resolve one: POST /v1/escalations/ESCALATION/resolve, or the page at /ui/",
                     RenderEscalations);
}

int PlansLs(DaemonClient& api, const Output& o, const std::string& state, size_t limit) {
  Json items = Json::array();
  std::string cursor;
  while (items.size() < limit) {
    size_t page = std::min<size_t>(limit - items.size(), 100);
    std::string path = "/v1/plans?limit=" + std::to_string(page);
    if (!state.empty()) path += "&state=" + PercentEncode(state);
    if (!cursor.empty()) path += "&cursor=" + PercentEncode(cursor);
    StatusOr<ApiAnswer> a = api.Call("GET", path);
    if (!a.ok()) return ReportUnreachable(o, a.status());
    if (a->status != 200) return ReportError(o, "plans ls", *a);
    const Json& got = Member(a->body, "items");
    if (got.is_array()) {
      for (const Json& p : got) items.push_back(p);
    }
    cursor = Str(a->body, "next_cursor");
    if (cursor.empty() || !got.is_array() || got.empty()) break;
  }
  if (o.json) {
    Json body = {{"items", items}};
    if (!cursor.empty()) body["next_cursor"] = cursor;
    PrintJson(o, body);
    return kExitOk;
  }
  if (items.empty()) {
    std::string which = state.empty() ? "" : " " + state;
    Print(o.out, "no plans" + which + "\n");
    return kExitOk;
  }
  Print(o.out, RenderPlanList(items, o.style, o.now_ms));
  if (!cursor.empty()) {
    Print(o.out, o.style.Paint("(more: raise --limit)", Color::kDim) + "\n");
  }
  return kExitOk;
}

int PlansShow(DaemonClient& api, const Output& o, const std::string& plan_id) {
  StatusOr<ApiAnswer> a = api.Call("GET", "/v1/plans/" + PercentEncode(plan_id));
  if (!a.ok()) return ReportUnreachable(o, a.status());
  if (a->status != 200) return ReportError(o, "plans show " + plan_id, *a);
  if (o.json) {
    PrintJson(o, a->body);
  } else {
    Print(o.out, RenderPlan(a->body, o.style, o.now_ms));
  }
  return kExitOk;
}

namespace {

// approve / reject: one POST, its own Idempotency-Key (each invocation is
// a new operator intention: a second approve must be told 409, not get the
// first answer replayed).
int PostVerdict(DaemonClient& api, const Output& o, const std::string& verb,
                const std::string& plan_id, const Json& body) {
  const std::string key = "\"cli-" + verb + "-" + RandomHex(8) + "\"";
  StatusOr<ApiAnswer> a =
      api.Call("POST", "/v1/plans/" + PercentEncode(plan_id) + "/" + verb, body, key);
  if (!a.ok()) return ReportUnreachable(o, a.status());
  if (a->status < 200 || a->status >= 300) return ReportError(o, verb + " " + plan_id, *a);
  if (o.json) {
    PrintJson(o, a->body);
    return kExitOk;
  }
  std::string state = Str(a->body, "state");
  std::string done = verb == "approve" ? "approved" : "rejected";
  Print(o.out, done + " " + plan_id +
                   (state.empty() ? "" : ": now " + o.style.Paint(state, StateColor(state))) +
                   "\n");
  // An approval applies at once: what each action did.
  const Json& results = Member(a->body, "results");
  if (results.is_array() && !results.empty()) {
    Table t({"#", "KIND", "STATE", "RESULT"});
    t.SetMaxWidth(3, 80);
    for (const Json& r : results) {
      std::string rs = Str(r, "state");
      std::string what = Str(r, "error");
      if (what.empty()) what = Str(r, "external_ref");
      if (what.empty()) what = Str(r, "last_error");
      t.AddRow({Str(r, "index"), Str(r, "kind"), {rs, StateColor(rs)}, what});
    }
    Print(o.out, t.Render(o.style));
  }
  return kExitOk;
}

}  // namespace

int Approve(DaemonClient& api, const Output& o, const std::string& plan_id,
            const std::vector<std::string>& edits, const std::string& comment) {
  std::vector<Json> parsed;
  for (const std::string& e : edits) {
    StatusOr<Json> edit = ParseEdit(e);
    if (!edit.ok()) {
      Print(o.err, "idem approve: " + edit.status().message() + "\n");
      return kExitUsage;
    }
    parsed.push_back(*std::move(edit));
  }
  return PostVerdict(api, o, "approve", plan_id, ApproveBody(parsed, comment));
}

int Reject(DaemonClient& api, const Output& o, const std::string& plan_id,
           const std::string& reason) {
  if (reason.empty()) {
    Print(o.err, "idem reject: --reason must not be empty\n");
    return kExitUsage;
  }
  return PostVerdict(api, o, "reject", plan_id, Json{{"reason", reason}});
}

int AuditVerify(DaemonClient& api, const Output& o) {
  // The daemon first: its head bounds the client's walk, so events
  // appended meanwhile are not mistaken for a break.
  StatusOr<ApiAnswer> v = api.Call("GET", "/v1/audit/verify");
  if (!v.ok()) return ReportUnreachable(o, v.status());
  if (v->status != 200 && v->status != 409) return ReportError(o, "audit verify", *v);
  const bool daemon_ok = v->status == 200 && Member(v->body, "ok") == Json(true);
  const uint64_t head_seq = static_cast<uint64_t>(Int(v->body, "head_seq"));
  const std::string head_hash = Str(v->body, "head_hash");

  AuditChainCheck check;
  uint64_t from = 1;
  bool past_head = false;
  while (check.ok() && !past_head) {
    StatusOr<ApiAnswer> page =
        api.Call("GET", "/v1/audit?from_seq=" + std::to_string(from) + "&limit=1000");
    if (!page.ok()) return ReportUnreachable(o, page.status());
    if (page->status != 200) return ReportError(o, "audit verify (GET /v1/audit)", *page);
    const Json& items = Member(page->body, "items");
    if (!items.is_array()) {
      check.Fail(check.checked() + 1, "GET /v1/audit answered without items");
      break;
    }
    for (const Json& item : items) {
      StatusOr<AuditEvent> e = AuditEvent::FromJson(item);
      if (!e.ok()) {
        check.Fail(check.checked() + 1, "malformed event: " + e.status().message());
        break;
      }
      if (daemon_ok && e->seq > head_seq) {
        past_head = true;  // appended after the daemon's check
        break;
      }
      if (!check.Add(*e)) break;
    }
    const Json& next = Member(page->body, "next_from_seq");
    if (!next.is_number_unsigned() || next.get<uint64_t>() <= from) break;
    from = next.get<uint64_t>();
  }
  // The end of the chain is known only from an intact daemon answer.
  if (daemon_ok) check.Finish(head_seq, head_hash);

  const uint64_t daemon_broken = daemon_ok ? 0 : static_cast<uint64_t>(Int(v->body, "broken_seq"));
  uint64_t first = daemon_broken;
  if (!check.ok() && (first == 0 || check.broken_seq() < first)) first = check.broken_seq();
  const bool ok = daemon_ok && check.ok();
  if (o.json) {
    Json client = {{"ok", check.ok()}, {"checked", check.checked()}};
    if (!check.ok()) {
      client["broken_seq"] = check.broken_seq();
      client["detail"] = check.detail();
    }
    Json body = {{"ok", ok},
                 {"checked", check.checked()},
                 {"head_seq", head_seq},
                 {"daemon", v->body},
                 {"client", client}};
    if (!ok) body["broken_seq"] = first == 0 ? 1 : first;
    PrintJson(o, body);
  } else if (ok) {
    Print(o.out, o.style.Paint("audit chain intact", Color::kGreen) + ": " +
                     std::to_string(check.checked()) + " events, head seq " +
                     std::to_string(head_seq) + " (verified by the daemon and recomputed here)\n");
  } else {
    std::string text =
        o.style.Paint("audit chain BROKEN at seq " + std::to_string(first == 0 ? 1 : first),
                      Color::kRed) +
        "\n";
    text += "  daemon: " + (daemon_ok ? std::string("intact") : Str(v->body, "detail")) + "\n";
    text += "  client: " +
            (check.ok() ? "the " + std::to_string(check.checked()) + " events listed link"
                        : "seq " + std::to_string(check.broken_seq()) + ": " + check.detail()) +
            "\n";
    Print(o.out, text);
  }
  return ok ? kExitOk : kExitAuditBroken;
}

int PrintCall(DaemonClient& api, const Output& o, const std::string& method,
              const std::string& path, const Json& body, const std::string& idempotency_key) {
  StatusOr<ApiAnswer> a = api.Call(method, path, body, idempotency_key);
  if (!a.ok()) return ReportUnreachable(o, a.status());
  std::string text = a->body.is_null() ? Printable(a->text) : JsonText(a->body, 2);
  // --json: the answer (the problem body on errors) on stdout, for a pipe.
  Print(a->status < 300 || o.json ? o.out : o.err, text + "\n");
  return ExitCodeForHttp(a->status);
}

}  // namespace idem::cli
