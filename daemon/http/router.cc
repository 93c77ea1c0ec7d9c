#include "daemon/http/router.h"

#include "daemon/http/api_schemas.h"

namespace idem {

void CompileRoute(Route& route) {
  std::string re = "^";
  route.param_names.clear();
  for (size_t i = 0; i < route.pattern.size(); ++i) {
    char c = route.pattern[i];
    if (c == '{') {
      size_t end = route.pattern.find('}', i);
      route.param_names.push_back(route.pattern.substr(i + 1, end - i - 1));
      re += "([^/]+)";
      i = end;
    } else if (c == '.' || c == '+' || c == '*' || c == '?' || c == '(' || c == ')') {
      re += '\\';
      re += c;
    } else {
      re += c;
    }
  }
  re += "$";
  route.compiled = std::regex(re);
}

namespace {

Json Ref(const std::string& name) { return {{"$ref", "#/components/schemas/" + name}}; }

std::string Lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

Json BuildOpenApi(const std::vector<Route>& routes) {
  Json doc = {
      {"openapi", "3.1.0"},
      {"info",
       {{"title", "idem"},
        {"version", "1"},
        {"description",
         "Makes LLM-driven automation safe to retry: cached decisions and exactly-once "
         "effects. Errors are RFC 9457 problem+json."}}},
      {"paths", Json::object()},
      {"components", {{"schemas", Json::object()}}},
  };
  Json& schemas = doc["components"]["schemas"];
  for (const auto& [name, text] : ApiSchemaTexts()) {
    Json s = Json::parse(text, nullptr, false);
    if (s.is_discarded()) continue;
    s.erase("$schema");
    s.erase("$id");
    schemas[name] = std::move(s);
  }
  for (const Route& r : routes) {
    Json op = {{"summary", r.summary}, {"responses", Json::object()}};
    Json params = Json::array();
    for (const auto& p : r.param_names) {
      params.push_back(
          {{"name", p}, {"in", "path"}, {"required", true}, {"schema", {{"type", "string"}}}});
    }
    if (r.key_policy != KeyPolicy::kNone) {
      params.push_back({{"name", "Idempotency-Key"},
                        {"in", "header"},
                        {"required", r.key_policy == KeyPolicy::kRequired},
                        {"description",
                         "An sf-string (\"...\") or token, at most 255 characters. Same key "
                         "and payload replays the stored response (Idempotent-Replayed: "
                         "true); another payload is 422; while the first runs, 409 (or wait "
                         "with Prefer: wait=N)."},
                        {"schema", {{"type", "string"}, {"maxLength", 257}}}});
    }
    if (!params.empty()) op["parameters"] = params;
    if (!r.request_schema.empty()) {
      op["requestBody"] = {
          {"required", true},
          {"content", {{"application/json", {{"schema", Ref(r.request_schema)}}}}}};
    }
    for (const auto& [status, schema] : r.responses) {
      Json resp = {{"description", status < 300 ? "success" : "see the body"}};
      std::string type = status >= 400 ? "application/problem+json"
                         : r.raw_text  ? "text/plain"
                                       : "application/json";
      if (!schema.empty()) resp["content"] = {{type, {{"schema", Ref(schema)}}}};
      op["responses"][std::to_string(status)] = resp;
    }
    doc["paths"][r.pattern][Lower(r.method)] = op;
  }
  return doc;
}

}  // namespace idem
