// /mcp: the MCP endpoint (daemon/mcp/mcp.h) over the v1 API. Every tool
// call runs the REST route it stands for (its request schema, its handler,
// so the same engines, policies and journal): a call retried by an agent
// after a timeout is the same work. A tool whose answer is the same for
// every caller of the same arguments (do_<kind>, complete_work, fail_work)
// is also deduplicated under an Idempotency-Key derived from the tool name
// and JCS(arguments) (or _meta.idempotencyKey when the client sends one),
// scoped per caller: a retry replays the stored result, like the REST API's
// Idempotency-Key, kept as long as its route keeps keys (idempotency.routes
// or .window). claim_work and decide_<step> are deduplicated only under the
// client's own key: a claim's answer (a lease token) belongs to the one
// claimer, so two agents with the same arguments must not share it, and a
// claim after the lease ran out must claim again; a decide is answered by
// the decision cache as it stands now. Reads
// (get_plan, get_decision) are never deduplicated: a poll sees the state
// as it is now.
#include <algorithm>
#include <map>
#include <memory>

#include "daemon/core/crypto.h"
#include "daemon/core/json.h"
#include "daemon/core/json_schema.h"
#include "daemon/http/api.h"
#include "daemon/http/api_schemas.h"
#include "daemon/http/problem.h"
#include "daemon/mcp/mcp.h"

namespace idem {
namespace {

constexpr int64_t kToolKeyLeaseMs = 60'000;
// How long a call waits for the same call still running before it answers
// "still running", and the longest client key (as the Idempotency-Key header).
constexpr int64_t kInFlightWaitMs = 3'000;
constexpr size_t kMaxClientKey = 255;

// One tool: its MCP description and the REST route it runs.
struct Tool {
  Json spec;
  std::string method;
  std::string path;                       // with {placeholders} filled from the arguments
  std::function<Json(const Json&)> body;  // REST body from the arguments
  std::unique_ptr<JsonSchema> input;
  std::string kind;            // do_<kind>: the action kind
  int64_t kind_window_ms = 0;  // do_<kind>: the kind's window (0: forever)
  // Which calls share a stored answer (see the top of this file).
  enum class Dedup { kNone, kClientKey, kDerived } dedup = Dedup::kDerived;
};

Json Obj(Json properties, std::vector<std::string> required) {
  return {{"type", "object"}, {"properties", std::move(properties)}, {"required", required}};
}

// A tool's inputSchema: closed (additionalProperties: false), as the REST
// bodies are, so a mistyped argument ("Cache": "only") is an error naming
// it, not a call without it (a paid provider call instead of a cache
// lookup). Output schemas stay open: a client must accept new members.
Json Input(Json properties, std::vector<std::string> required) {
  Json schema = Obj(std::move(properties), std::move(required));
  schema["additionalProperties"] = false;
  return schema;
}

// The request schema `name` of schemas/api as a tool's inputSchema, with
// each of `path_params` (the route's {parameters}) a required string: what
// a call may carry is what the route takes, in one place.
Json RouteInput(const std::string& name, const std::vector<std::string>& path_params = {}) {
  auto text = ApiSchemaTexts().find(name);
  if (text == ApiSchemaTexts().end()) return Json();
  StatusOr<Json> schema = ParseJson(text->second, JsonLimits{});
  if (!schema.ok()) return Json();
  schema->erase("$schema");
  schema->erase("title");
  Json required = Json::array();
  for (const std::string& param : path_params) {
    (*schema)["properties"][param] = {{"type", "string"}, {"minLength", 1}};
    required.push_back(param);
  }
  for (const Json& r : schema->value("required", Json::array())) required.push_back(r);
  (*schema)["required"] = std::move(required);
  return std::move(schema).value();
}

// `schema`, to be nested at the JSON pointer `at` (a fragment, "#/…") of
// another document, with the references to its own document ("#", "#/…")
// pointing where they did. A schema with an "$id" (the root's or a
// subschema's) is a resource of its own, against which its references
// still resolve: it is left as it is. Values that are data, not schemas
// (const, enum, default, examples), are never touched, nor are the names of
// properties and definitions.
void RebaseRefs(Json& schema, const std::string& at) {
  if (!schema.is_object()) return;  // true, false: no references
  auto id = schema.find("$id");
  if (id != schema.end() && id->is_string() &&
      !id->get_ref<const std::string&>().starts_with("#")) {
    return;
  }
  for (auto& [keyword, value] : schema.items()) {
    if (keyword == "$ref") {
      if (!value.is_string()) continue;
      const std::string& ref = value.get_ref<const std::string&>();
      if (ref == "#" || ref.starts_with("#/")) value = at + ref.substr(1);
    } else if (keyword == "const" || keyword == "enum" || keyword == "default" ||
               keyword == "examples") {
      continue;
    } else if (keyword == "properties" || keyword == "patternProperties" ||
               keyword == "definitions" || keyword == "$defs" || keyword == "dependentSchemas" ||
               keyword == "dependencies") {
      if (!value.is_object()) continue;
      for (Json& sub : value) RebaseRefs(sub, at);  // by name: each value a schema
    } else if (value.is_array()) {
      for (Json& sub : value) RebaseRefs(sub, at);  // allOf, anyOf, oneOf, items, prefixItems
    } else {
      RebaseRefs(value, at);  // not, items, additionalProperties, if, then, else...
    }
  }
}

class ApiToolbox final : public McpToolbox {
 public:
  ApiToolbox(ApiDeps deps, std::shared_ptr<const std::vector<Route>> routes)
      : deps_(deps), routes_(std::move(routes)) {
    Build();
  }

  const std::vector<Json>& Tools() const override { return specs_; }

  Json Call(const std::string& name, const Json& arguments, const Json& meta,
            const std::string& caller, const std::string& request_id) override {
    auto it = tools_.find(name);
    if (it == tools_.end()) return Json();
    const Tool& tool = it->second;
    std::vector<SchemaError> errors = tool.input->Errors(arguments);
    if (!errors.empty()) {
      return ToolError("invalid arguments: " +
                       (errors[0].pointer.empty() ? std::string("(the arguments)")
                                                  : "argument " + errors[0].pointer) +
                       ": " + errors[0].message + ". Fix it and call again.");
    }
    bool final_answer = true;
    // The key: the client's, or the tool and its canonical arguments.
    const bool client_key = meta.is_object() && meta.contains("idempotencyKey");
    if (client_key) {
      // A key of another type is refused, not dropped: the caller meant to
      // pin its answer and would get the derived key's instead.
      const Json& given = meta["idempotencyKey"];
      if (!given.is_string()) {
        return ToolError("_meta.idempotencyKey must be a string (it is " +
                         std::string(given.type_name()) + "), as an Idempotency-Key header");
      }
      // Characters (code points; the text is valid UTF-8), not bytes.
      const size_t length = CodePoints(given.get_ref<const std::string&>());
      if (length == 0 || length > kMaxClientKey) {
        return ToolError("_meta.idempotencyKey must be 1 to " + std::to_string(kMaxClientKey) +
                         " characters, as an Idempotency-Key header");
      }
    }
    if (tool.dedup == Tool::Dedup::kNone ||
        (!client_key && tool.dedup == Tool::Dedup::kClientKey)) {
      return Run(tool, arguments, caller, request_id, "", &final_answer);
    }
    auto canonical = CanonicalJson(arguments);
    if (!canonical.ok()) return ToolError(canonical.status().message());
    std::string key = client_key ? meta["idempotencyKey"].get<std::string>()
                                 : Sha256Hex(name + "\n" + *canonical);
    // A client's key lives as an Idempotency-Key header does; a derived
    // one of a do_<kind> stands for the unit of work, so it lives no longer
    // than the kind remembers that work: past the kind's window the same
    // call is new work, as it is over REST.
    int64_t window_ms = KeyWindow(tool, arguments);
    if (!client_key && !tool.kind.empty()) {
      window_ms = ShorterWindow(window_ms, tool.kind_window_ms);
    }
    const std::string scope = caller + " MCP " + name;
    const std::string fingerprint = Sha256Hex(*canonical);
    // The same call still running (two workers on one token, a retry after
    // a timeout) is waited for, a while, as REST's Prefer: wait does: an
    // agent would read an error as a failed tool.
    int64_t pause_ms = 20;
    const int64_t give_up_ms = deps_.clock.NowMillis() + kInFlightWaitMs;
    for (;;) {
      const int64_t now = deps_.clock.NowMillis();
      auto begun = deps_.store.idem_keys().Begin(scope, key, fingerprint, request_id, now,
                                                 window_ms, kToolKeyLeaseMs);
      if (!begun.ok()) {
        return ToolError("idem's store: " + CallerDetail(HttpStatusFor(begun.status().code()),
                                                         begun.status(), request_id));
      }
      if (begun->outcome == BeginOutcome::kNew) break;
      if (begun->outcome == BeginOutcome::kReplay && !GrantHolds(tool, begun->record)) {
        return Run(tool, arguments, caller, request_id, RouteKey(name, key),
                   &final_answer);  // not stored
      }
      if (begun->outcome == BeginOutcome::kReplay) {
        // The stored answer is ours, bounded when it was made: it is read
        // back whole, not under a request's limits (a 600 KB result is
        // twice that stored, with its text copy; its wrapping nests a
        // request's or an upstream's deepest value a few levels further).
        const std::string& text = begun->record.response_body;
        auto stored = ParseJson(text, StoredAnswerLimits(deps_.config, text.size()));
        if (!stored.ok()) return ToolError("the stored result could not be read");
        return Replayed(tool, std::move(stored).value());
      }
      if (begun->outcome == BeginOutcome::kMismatch) {
        return ToolError("this idempotency key was used with other arguments");
      }
      if (now + pause_ms > give_up_ms) {
        return ToolError("the same call is still running; call again in a few seconds");
      }
      deps_.clock.env().SleepMillis(pause_ms);
      pause_ms = std::min<int64_t>(pause_ms * 2, 500);
    }
    Json result = Run(tool, arguments, caller, request_id, RouteKey(name, key), &final_answer);
    // An error changed nothing worth replaying: the call runs again when
    // retried (a resolved conflict, a fixed record), as REST drops a 4xx.
    if (result.value("isError", false)) final_answer = false;
    if (final_answer) {
      (void)deps_.store.idem_keys().Finish(scope, key, fingerprint, 200, result.dump(),
                                           "application/json", deps_.clock.NowMillis());
    } else {
      (void)deps_.store.idem_keys().Release(scope, key, fingerprint);
    }
    return result;
  }

 private:
  static Json ToolError(const std::string& text) {
    return {{"content", Json::array({{{"type", "text"}, {"text", text}}})}, {"isError", true}};
  }

  static Json ToolResult(Json structured) {
    std::string text = structured.dump(-1, ' ', false, Json::error_handler_t::replace);
    Json result = {{"content", Json::array({{{"type", "text"}, {"text", text}}})},
                   {"isError", false}};
    // MCP: structured content is a JSON object; anything else is text only.
    if (structured.is_object()) result["structuredContent"] = std::move(structured);
    return result;
  }

  // A stored answer given again: a do_<kind> whose first call created the
  // effect says already_done now (its description promises so).
  static Json Replayed(const Tool& tool, Json stored) {
    if (tool.kind.empty() || !stored.contains("structuredContent")) return stored;
    Json body = stored["structuredContent"];
    if (!body.is_object() || body.value("outcome", "") != "created") return stored;
    body["outcome"] = "already_done";
    return ToolResult(std::move(body));
  }

  // The tool's path with "~" in each {placeholder}, which no literal route holds.
  static std::string Probe(const Tool& tool) {
    std::string probe = tool.path;
    for (size_t open = probe.find('{'); open != std::string::npos; open = probe.find('{')) {
      probe.replace(open, probe.find('}', open) - open + 1, "~");
    }
    return probe;
  }

  // The route of `path` that is the tool's own: one that also matches the
  // tool's Probe. So an argument can never steer a call onto another route
  // (a decision_id of "export" onto GET /v1/decisions/export).
  const Route* Find(const Tool& tool, const std::string& path,
                    std::vector<std::string>* params) const {
    const std::string probe = Probe(tool);
    std::vector<std::string> probe_params;
    for (const Route& r : *routes_) {
      params->clear();
      if (r.method == tool.method && MatchPath(r, path, params) &&
          MatchPath(r, probe, &probe_params)) {
        return &r;
      }
    }
    return nullptr;
  }

  // How long the route the tool runs keeps an Idempotency-Key
  // (idempotency.routes, else idempotency.window). The route table is
  // complete only once every route is added, after this toolbox was built.
  // A grant (claim_work's lease) keeps its key no longer than it lasts, as
  // over REST (Route::grant_ms).
  int64_t KeyWindow(const Tool& tool, const Json& arguments) const {
    const IdempotencyConfig& idem = deps_.config.idempotency;
    std::vector<std::string> params;
    const Route* route = Find(tool, Probe(tool), &params);
    if (route == nullptr) return idem.window_ms;
    auto window = idem.route_windows_ms.find(route->method + " " + route->pattern);
    const int64_t ms = window != idem.route_windows_ms.end() ? window->second : idem.window_ms;
    if (!route->grant_ms) return ms;
    RequestContext ctx;
    ctx.body = tool.body ? tool.body(arguments) : Json();
    return ShorterWindow(ms, route->grant_ms(ctx));
  }

  // Whether a stored answer of the tool is a grant that still holds (its
  // route's Route::grant_holds; true for every other answer). The stored
  // answer is the tool result: its structuredContent is the route's body.
  bool GrantHolds(const Tool& tool, const IdemRecord& record) const {
    std::vector<std::string> params;
    const Route* route = Find(tool, Probe(tool), &params);
    if (route == nullptr || !route->grant_holds) return true;
    StatusOr<Json> stored = ParseJson(
        record.response_body, StoredAnswerLimits(deps_.config, record.response_body.size()));
    if (!stored.ok() || !stored->is_object() || !stored->contains("structuredContent")) {
      return true;  // an error result, or not a grant
    }
    const Json& body = (*stored)["structuredContent"];
    // claim_work answers 201 for a grant: the body has a lease_token then.
    return route->grant_holds(body.contains("lease_token") ? 201 : 200, body.dump());
  }

  // The Idempotency-Key the route sees for a call keyed `key`: its scope
  // and key, which no header's key equals (a header's has no newline), so
  // that the work a tool call makes names that call (WorkItem::call_id).
  static std::string RouteKey(const std::string& tool_name, const std::string& key) {
    return "MCP " + tool_name + "\n" + key;
  }

  // Runs the tool's REST route as the caller, with `route_key` as its
  // Idempotency-Key ("" for none; the key itself is kept here, not by the
  // route); *final_answer false when the answer reports work still moving
  // (it is then not stored).
  Json Run(const Tool& tool, const Json& args, const std::string& caller,
           const std::string& request_id, const std::string& route_key, bool* final_answer) {
    std::string path = tool.path;
    for (const char* field : {"plan_id", "decision_id", "work_id"}) {
      std::string hole = std::string("{") + field + "}";
      size_t at = path.find(hole);
      if (at == std::string::npos) continue;
      // As a client would send it: the value is one segment, whatever it holds.
      std::string value;
      for (char c : args.value(field, "")) {
        value += c == '%' ? std::string("%25") : c == '/' ? std::string("%2F") : std::string(1, c);
      }
      path.replace(at, hole.size(), value);
    }
    RequestContext ctx;
    const Route* route = Find(tool, path, &ctx.params);
    if (route == nullptr) return ToolError("no such record: " + path);
    // The route's roles, as the HTTP pipeline checks them for a REST call.
    if (!route->roles.empty() && !deps_.config.auth.Holds(caller, route->roles)) {
      return ToolError("this token lacks the role for " + route->method + " " + route->pattern);
    }
    ctx.method = tool.method;
    ctx.path = path;
    ctx.caller = caller;
    ctx.request_id = request_id;
    ctx.idempotency_key = route_key;
    ctx.body = tool.body ? tool.body(args) : Json();
    if (!route->request_schema.empty()) {
      auto sit = schemas_.find(route->request_schema);
      if (sit != schemas_.end()) {
        Status valid = sit->second->Validate(ctx.body);
        if (!valid.ok()) {
          return ToolError("invalid arguments: " + valid.message() + " (at " + valid.field() + ")");
        }
      }
    }
    StatusOr<RouteResponse> out = RunHandler(*route, ctx);
    if (out.ok() && out->long_poll != nullptr) out = out->long_poll->answer();  // no parking here
    if (!out.ok()) {
      *final_answer = out.status().code() != Code::kUnavailable;
      std::string where = out.status().field().empty() ? "" : " (at " + out.status().field() + ")";
      return ToolError(CallerDetail(HttpStatusFor(out.status().code()), out.status(), request_id) +
                       where);
    }
    if (out->transient || out->status == 202) *final_answer = false;
    Json body = BodyJson(*out);
    if (out->status >= 400) {
      std::string detail = body.is_object() ? body.value("detail", "") : "";
      std::string where = body.is_object() ? body.value("pointer", "") : "";
      // What the problem carries beyond its text (the result that stands,
      // the state of the work) is part of the answer, as it is over REST.
      Json extra = Json::object();
      if (body.is_object()) {
        for (auto& [name, value] : body.items()) {
          if (name != "type" && name != "title" && name != "status" && name != "detail" &&
              name != "pointer" && name != "instance" && name != "request_id") {
            extra[name] = value;
          }
        }
      }
      // REST says when to ask again in a header (busy work, a backoff, a
      // full queue); an agent reads only the text.
      std::string again;
      for (const auto& [name, value] : out->headers) {
        if (name == "Retry-After") again = ". Call again in " + value + " s";
      }
      return ToolError(
          detail + (where.empty() ? "" : " (at " + where + ")") +
          (extra.empty() ? "" : ". " + extra.dump(-1, ' ', false, Json::error_handler_t::replace)) +
          again);
    }
    if (!tool.kind.empty() && body.is_object()) {
      body["outcome"] = out->status == 201   ? "created"
                        : out->status == 200 ? "already_done"
                        : body.contains("plan_id") && !body.contains("work_id")
                            ? "awaiting_approval"
                            : "retrying";
    }
    return ToolResult(std::move(body));
  }

  void Add(Tool tool) {
    std::string name = tool.spec["name"];
    auto compiled = JsonSchema::Create(tool.spec["inputSchema"]);
    if (!compiled.ok()) return;  // a step whose schema valijson refuses: left out
    tool.input = std::move(compiled).value();
    specs_.push_back(tool.spec);
    tools_.emplace(name, std::move(tool));
  }

  void Build() {
    for (const auto& [name, text] : ApiSchemaTexts()) {
      auto parsed = ParseJson(text, JsonLimits{});
      if (!parsed.ok()) continue;
      auto compiled = JsonSchema::Create(*parsed);
      if (compiled.ok()) schemas_[name] = std::move(compiled).value();
    }
    const Json any_object = {{"type", "object"}};
    for (const auto& [name, step] : deps_.config.steps) {
      Tool t;
      // The decision cache already answers a repeat from the same input,
      // and answers it as it stands now (a resolved escalation, a refresh
      // by another caller): a derived key would replay a stale answer.
      t.dedup = Tool::Dedup::kClientKey;
      t.method = "POST";
      t.path = "/v1/decide";
      const std::string step_name = name;
      t.body = [step_name](const Json& a) {
        Json b = {{"step", step_name}, {"input", a.value("input", Json::object())}};
        if (a.contains("cache")) b["cache"] = a["cache"];
        return b;
      };
      Json output = step.output_schema.is_object() ? step.output_schema : any_object;
      // Nested under /properties/output, the step schema's references to
      // its own root ("#", "#/definitions/…", "#/properties/a") would be
      // resolved against the tool's outputSchema: they are moved with it.
      RebaseRefs(output, "#/properties/output");
      t.spec = {
          {"name", "decide_" + name},
          {"title", "Decide " + name},
          {"description",
           "Decide the step '" + name + "' (model " + step.model +
               ") for an input: the cached decision for the same input, or a new validated one. "
               "Deterministic per input; safe to call again."},
          {"inputSchema",
           Input({{"input", {{"type", "object"}, {"description", "the step's input"}}},
                  {"cache",
                   {{"type", "string"},
                    {"enum", {"default", "refresh", "only"}},
                    {"description",
                     "default: cached if any; refresh: ask again; only: cache only"}}}},
                 {"input"})},
          {"outputSchema", Obj({{"status", {{"type", "string"}}},
                                {"decision_id", {{"type", "string"}}},
                                {"output", output},
                                {"cache", {{"type", "string"}}},
                                {"plan", any_object}},
                               {"status"})},
          {"annotations", {{"readOnlyHint", false}, {"idempotentHint", true}}}};
      Add(std::move(t));
    }
    for (const auto& [name, kind] : deps_.config.actions) {
      // A kind without an effector is client-executed: claim_work is its
      // tool; a do_ tool for it could only ever fail.
      if (kind.effector.empty()) continue;
      Tool t;
      t.method = "POST";
      t.path = "/v1/actions/" + name;
      t.kind = name;
      t.body = [](const Json& a) { return Json{{"args", a}}; };
      Json input = kind.args_schema.is_object() ? kind.args_schema : any_object;
      if (!input.contains("type")) input["type"] = "object";
      t.kind_window_ms = kind.window_ms;
      std::string identity;
      for (const auto& f : kind.identity_fields) identity += (identity.empty() ? "" : ", ") + f;
      // What a call again gets: the same call (its stored answer), or
      // another with the same identity (the kind's on_duplicate).
      std::string again =
          "Calling again with the same identity " +
          (kind.window_ms == 0 ? std::string() : "within " + FormatDuration(kind.window_ms) + " ") +
          "never repeats the effect: ";
      if (kind.on_duplicate == "conflict") {
        again +=
            "the same call again (the same arguments or _meta.idempotencyKey) returns outcome "
            "already_done with the original result; any other call with that identity is "
            "refused with an error (the work was already done).";
      } else if (kind.on_duplicate == "ignore") {
        again +=
            "the same call again (the same arguments or _meta.idempotencyKey) returns outcome "
            "already_done with the original result; any other call with that identity returns "
            "outcome already_done without the result.";
      } else {
        again += "it returns outcome already_done with the original result.";
      }
      t.spec = {
          {"name", "do_" + name},
          {"title", "Do " + name},
          {"description",
           "Execute the action '" + name +
               "' exactly once per unit of work (identity: " + identity + "). " + again +
               " outcome awaiting_approval means a human must approve first: call again later "
               "with the same arguments."},
          {"inputSchema", input},
          {"outputSchema",
           Obj({{"outcome",
                 {{"type", "string"},
                  {"enum", {"created", "already_done", "awaiting_approval", "retrying"}}}},
                {"work_id", {{"type", "string"}}},
                {"state", {{"type", "string"}}},
                {"result", Json::object()},
                {"external_ref", {{"type", "string"}}},
                {"plan_id", {{"type", "string"}}}},
               {"outcome"})},
          {"annotations",
           {{"readOnlyHint", false}, {"destructiveHint", true}, {"idempotentHint", true}}}};
      Add(std::move(t));
    }
    auto builtin = [&](std::string name, std::string description, std::string method,
                       std::string path, Json input, std::function<Json(const Json&)> body,
                       bool read_only, Tool::Dedup dedup) {
      Tool t;
      t.dedup = dedup;
      t.method = std::move(method);
      t.path = std::move(path);
      t.body = std::move(body);
      t.spec = {
          {"name", name},
          {"description", description},
          {"inputSchema", std::move(input)},
          {"outputSchema", any_object},
          {"annotations",
           {{"readOnlyHint", read_only}, {"idempotentHint", dedup != Tool::Dedup::kClientKey}}}};
      Add(std::move(t));
    };
    auto pass = [](const Json& a) { return a; };
    auto without = [](const char* field) {
      return [field](const Json& a) {
        Json b = a;
        b.erase(field);
        return b;
      };
    };
    builtin("claim_work",
            "Claim client-executed work (a kind without an effector) before doing it: created "
            "means you own it until locked_until_ms and must complete_work or fail_work; "
            "already done work returns its original result; an error says another caller holds "
            "it (try again after its lease). To get your own lease back after losing an answer, "
            "send the same _meta.idempotencyKey again.",
            "POST", "/v1/work/claim", RouteInput("work.claim.request"), pass, false,
            Tool::Dedup::kClientKey);
    builtin("complete_work", "Record that claimed work is done, with its result.", "POST",
            "/v1/work/{work_id}/complete", RouteInput("work.complete.request", {"work_id"}),
            without("work_id"), false, Tool::Dedup::kDerived);
    builtin("fail_work", "Record that claimed work failed (retryable or not).", "POST",
            "/v1/work/{work_id}/fail", RouteInput("work.fail.request", {"work_id"}),
            without("work_id"), false, Tool::Dedup::kDerived);
    builtin("get_plan",
            "Read a plan: its approval state (awaiting_approval, approved, rejected, expired, "
            "applied...), its actions and each action's journal state.",
            "GET", "/v1/plans/{plan_id}", Input({{"plan_id", {{"type", "string"}}}}, {"plan_id"}),
            nullptr, true, Tool::Dedup::kNone);
    builtin("get_decision", "Read a stored decision with its trace.", "GET",
            "/v1/decisions/{decision_id}",
            Input({{"decision_id", {{"type", "string"}}}}, {"decision_id"}), nullptr, true,
            Tool::Dedup::kNone);
  }

  ApiDeps deps_;
  std::shared_ptr<const std::vector<Route>> routes_;
  std::map<std::string, std::unique_ptr<JsonSchema>> schemas_;
  std::vector<Json> specs_;
  std::map<std::string, Tool> tools_;
};

}  // namespace

void AddMcpRoutes(ApiDeps deps, std::shared_ptr<const std::vector<Route>> table,
                  std::vector<Route>& routes) {
  auto toolbox = std::make_shared<ApiToolbox>(deps, std::move(table));
  auto protocol = std::make_shared<McpProtocol>(*toolbox, McpOptions{});
  StableClock* clock = &deps.clock;
  auto handler = [toolbox, protocol, clock](RequestContext& ctx) -> StatusOr<RouteResponse> {
    McpHttpRequest req;
    req.method = ctx.method;
    auto header = [&ctx](const char* name) {
      auto it = ctx.headers.find(name);
      return it == ctx.headers.end() ? std::string() : it->second;
    };
    req.accept = header("accept");
    req.session_id = header("mcp-session-id");
    req.protocol_version = header("mcp-protocol-version");
    req.caller = ctx.caller;
    req.take_rate_token = ctx.take_rate_token;
    req.request_id = ctx.request_id;
    req.body = ctx.body;
    McpHttpResponse r = protocol->Handle(req, clock->NowMillis());
    RouteResponse out{r.status, std::move(r.body), std::move(r.headers)};
    out.content_type = r.content_type;
    return out;
  };
  const std::vector<std::string> headers = {"accept", "mcp-session-id", "mcp-protocol-version"};
  routes.push_back(Route{.method = "POST",
                         .pattern = "/mcp",
                         .summary = "MCP (Streamable HTTP): JSON-RPC initialize, ping, "
                                    "tools/list, tools/call over idem's steps and action kinds.",
                         .request_schema = "mcp.request",
                         // JSON-RPC answers (or SSE when the client accepts only
                         // that); transport refusals are JSON-RPC errors too.
                         .responses = {{200, "mcp.response"},
                                       {202, ""},
                                       {400, "problem"},
                                       {404, ""},
                                       {406, ""},
                                       {413, "problem"}},
                         .media = {{200, {{"text/event-stream", ""}}},
                                   {400, {{"application/json", "mcp.response"}}},
                                   {404, {{"application/json", "mcp.response"}}},
                                   {406, {{"application/json", "mcp.response"}}},
                                   {413, {{"application/json", "mcp.response"}}}},
                         .roles = {"agent"},
                         .handler = handler,
                         .request_headers = headers,
                         .body_refusal = [](const Status& why, bool not_json) {
                           std::string msg = why.message();
                           if (!why.field().empty()) msg += " (at " + why.field() + ")";
                           return McpBodyRefusal(msg, not_json);
                         }});
  routes.push_back(Route{.method = "GET",
                         .pattern = "/mcp",
                         .summary = "MCP: 405, this server opens no server-to-client stream.",
                         .responses = {{405, ""}},
                         .media = {{405, {{"application/json", "mcp.response"}}}},
                         .roles = {"agent"},
                         .handler = handler,
                         .request_headers = headers});
  routes.push_back(Route{.method = "DELETE",
                         .pattern = "/mcp",
                         .summary = "MCP: end the session named by Mcp-Session-Id.",
                         .responses = {{200, "empty"}, {400, ""}, {404, ""}},
                         .media = {{400, {{"application/json", "mcp.response"}}},
                                   {404, {{"application/json", "mcp.response"}}}},
                         .roles = {"agent"},
                         .handler = handler,
                         .request_headers = headers});
}

}  // namespace idem
