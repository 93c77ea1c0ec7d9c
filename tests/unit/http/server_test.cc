// HttpServer start-up (schemas), the Prefer: wait parser and the names of
// the metrics served at /metrics.
#include "daemon/http/server.h"

#include <doctest/doctest.h>

#include <filesystem>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "daemon/core/json_schema.h"
#include "daemon/http/api_schemas.h"
#include "daemon/http/idempotency_key.h"
#include "daemon/http/problem.h"
#include "daemon/obs/metrics.h"

namespace idem {
namespace {

struct ServerFixture {
  ServerFixture() {
    path = std::filesystem::temp_directory_path() /
           ("idem-server-test-" + std::to_string(::getpid()) + "-" + std::to_string(++counter));
    auto opened = OpenRocksStore(StoreOptions{path.string(), false});
    REQUIRE_MESSAGE(opened.ok(), opened.status().ToString());
    store = std::move(opened).value();
  }
  ~ServerFixture() {
    store.reset();
    std::filesystem::remove_all(path);
  }
  ServerDeps Deps() {
    return ServerDeps{config, store->idem_keys(), store->journal(), clock, metrics};
  }

  static inline int counter = 0;
  std::filesystem::path path;
  std::unique_ptr<Store> store;
  Config config;
  StableClock clock{Env::Real()};
  Metrics metrics;
};

std::vector<Route> OneRoute(const std::string& schema) {
  Route r;
  r.method = "POST";
  r.pattern = "/v1/thing";
  r.request_schema = schema;
  r.handler = [](RequestContext&) -> StatusOr<RouteResponse> { return RouteResponse{}; };
  return {r};
}

TEST_CASE("a handler that throws gives an Internal status, not an exception out of the pipeline") {
  Route r = OneRoute("")[0];
  r.handler = [](RequestContext&) -> StatusOr<RouteResponse> {
    return RouteResponse{200, Json(5).get<std::string>(), {}};  // throws type_error
  };
  RequestContext ctx;
  StatusOr<RouteResponse> out = RunHandler(r, ctx);
  REQUIRE_FALSE(out.ok());
  CHECK(out.status().code() == Code::kInternal);
  CHECK(out.status().message().find("handler failed") != std::string::npos);
  r.handler = [](RequestContext&) -> StatusOr<RouteResponse> { return RouteResponse{204, {}, {}}; };
  CHECK(RunHandler(r, ctx)->status == 204);
}

TEST_CASE("an API schema that is not JSON or does not compile fails server creation") {
  ServerFixture f;
  auto good = HttpServer::Create(f.Deps(), OneRoute("thing"), {{"thing", R"({"type":"object"})"}});
  CHECK_MESSAGE(good.ok(), good.status().ToString());

  auto not_json = HttpServer::Create(f.Deps(), OneRoute("thing"), {{"thing", "{\"type\":"}});
  REQUIRE_FALSE(not_json.ok());
  CHECK(not_json.status().code() == Code::kInternal);
  CHECK(not_json.status().message().find("thing") != std::string::npos);

  // Even a schema that no route uses: a broken file in schemas/api is a bug.
  auto broken = HttpServer::Create(f.Deps(), OneRoute("thing"),
                                   {{"thing", R"({"type":"object"})"}, {"other", R"({"type":5})"}});
  REQUIRE_FALSE(broken.ok());
  CHECK(broken.status().message().find("other") != std::string::npos);

  auto missing = HttpServer::Create(f.Deps(), OneRoute("absent"), {{"thing", "{}"}});
  CHECK_FALSE(missing.ok());
}

TEST_CASE("an idempotency window for a route that takes no Idempotency-Key fails server creation") {
  ServerFixture f;
  std::vector<Route> keyed = OneRoute("thing");
  keyed[0].key_policy = KeyPolicy::kOptional;
  const std::map<std::string, std::string> schemas = {{"thing", R"({"type":"object"})"}};
  f.config.idempotency.route_windows_ms = {{"POST /v1/thing", 1000}};
  CHECK(HttpServer::Create(f.Deps(), keyed, schemas).ok());
  f.config.idempotency.route_windows_ms = {{"POST /v1/thingy", 1000}};
  auto typo = HttpServer::Create(f.Deps(), keyed, schemas);
  REQUIRE_FALSE(typo.ok());
  CHECK(typo.status().field() == "/idempotency/routes/POST ~1v1~1thingy");
  CHECK(typo.status().message().find("POST /v1/thing)") != std::string::npos);  // the real one
  // A route that exists but takes no key has no window to set either.
  f.config.idempotency.route_windows_ms = {{"POST /v1/thing", 1000}};
  CHECK_FALSE(HttpServer::Create(f.Deps(), OneRoute("thing"), schemas).ok());
}

TEST_CASE("an encoded slash in a path is data within its segment, never a separator") {
  Route reject{.method = "POST", .pattern = "/v1/plans/{id}/reject"};
  Route one{.method = "GET", .pattern = "/v1/plans/{id}"};
  CompileRoute(reject);
  CompileRoute(one);
  std::vector<std::string> params;
  // What the parser leaves of /v1/plans/X%2Freject (http1::DecodePath).
  CHECK_FALSE(MatchPath(reject, "/v1/plans/X%2Freject", &params));
  CHECK(params.empty());
  REQUIRE(MatchPath(one, "/v1/plans/X%2Freject", &params));
  CHECK(params == std::vector<std::string>{"X/reject"});
  params.clear();
  REQUIRE(MatchPath(one, "/v1/plans/100%25", &params));
  CHECK(params == std::vector<std::string>{"100%"});
}

TEST_CASE("a path matches only a route of its own depth, its parameters appended in order") {
  Route two{.method = "POST", .pattern = "/v1/runs/{run}/items/{item}"};
  CompileRoute(two);
  std::vector<std::string> params = {"kept"};
  REQUIRE(MatchPath(two, "/v1/runs/r%201/items/i2", &params));
  CHECK(params == std::vector<std::string>{"kept", "r 1", "i2"});
  // A failed match leaves what was there, whichever segment fails.
  for (std::string_view path :
       {"/v1/runs/r1/items", "/v1/runs/r1/items/i2/x", "/v1/runs//items/i2", "/v1/runs/r1/item/i2",
        "/v2/runs/r1/items/i2", "v1/runs/r1/items/i2", "/v1/runs/r1/items/", ""}) {
    CAPTURE(path);
    std::vector<std::string> before = {"kept"};
    CHECK_FALSE(MatchPath(two, path, &before));
    CHECK(before == std::vector<std::string>{"kept"});
  }
  Route root{.method = "GET", .pattern = "/"};
  CompileRoute(root);
  params.clear();
  CHECK(MatchPath(root, "/", &params));
  CHECK_FALSE(MatchPath(root, "//", &params));
  CHECK(params.empty());
}

TEST_CASE("every shipped API schema compiles") {
  for (const auto& schema : ApiSchemaTexts()) {
    const auto& [name, text] = schema;
    CAPTURE(schema.first);  // clang 14 cannot capture a structured binding
    Json j = Json::parse(text, nullptr, false);
    REQUIRE_FALSE(j.is_discarded());
    CHECK(JsonSchema::Create(j).ok());
  }
}

TEST_CASE("the work lane's request bodies are checked directly, before valijson") {
  // A keyword the direct check does not know, added to one of these
  // schemas, would send every claim, complete and fail through valijson.
  for (const char* name : {"work.claim.request", "work.complete.request", "work.fail.request"}) {
    CAPTURE(name);
    auto schema = JsonSchema::Create(Json::parse(ApiSchemaTexts().at(name)));
    REQUIRE(schema.ok());
    CHECK((*schema)->HasDirectCheck());
  }
}

TEST_CASE("the decide request has no wait field, since nothing reads one") {
  Json j = Json::parse(ApiSchemaTexts().at("decide.request"));
  auto schema = JsonSchema::Create(j);
  REQUIRE(schema.ok());
  Json body = {{"step", "s"}, {"input", Json::object()}};
  CHECK((*schema)->Validate(body).ok());
  body["wait"] = false;
  Status refused = (*schema)->Validate(body);
  CHECK_FALSE(refused.ok());
}

TEST_CASE("Prefer: wait is read in seconds, clamped, and ignored when absent") {
  CHECK(ParsePreferWait({}, 60'000).value() == 0);
  CHECK(ParsePreferWait({"respond-async"}, 60'000).value() == 0);
  CHECK(ParsePreferWait({"wait=10"}, 60'000).value() == 10'000);
  CHECK(ParsePreferWait({"respond-async, Wait = 3 ; foo=bar"}, 60'000).value() == 3'000);
  CHECK(ParsePreferWait({"return=minimal", "wait=\"2\""}, 60'000).value() == 2'000);
  CHECK(ParsePreferWait({"wait=0"}, 60'000).value() == 0);
  CHECK(ParsePreferWait({"wait=3600"}, 60'000).value() == 60'000);
  CHECK(ParsePreferWait({"wait=2147483647"}, 60'000).value() == 60'000);
  CHECK(ParsePreferWait({"waiting=5"}, 60'000).value() == 0);
}

TEST_CASE("Prefer: wait that overflows or is not a number is refused with the header as pointer") {
  for (const char* bad : {"wait=2305843009213693960", "wait=99999999999999999999999999",
                          "wait=2147483648", "wait=-5", "wait=1.5", "wait=", "wait=abc"}) {
    CAPTURE(bad);
    StatusOr<int64_t> r = ParsePreferWait({bad}, 60'000);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == Code::kInvalidArgument);
    CHECK(r.status().field() == "header:Prefer");
  }
}

TEST_CASE("refusals before any route are typed for retries: 503 and 408 retryable, 413 a limit") {
  struct Case {
    int http;
    Code code;
    bool retryable;
  };
  for (const Case& c :
       {Case{503, Code::kUnavailable, true}, Case{408, Code::kDeadlineExceeded, true},
        Case{413, Code::kResourceExhausted, false}, Case{431, Code::kResourceExhausted, false},
        Case{400, Code::kInvalidArgument, false}, Case{501, Code::kInvalidArgument, false}}) {
    CAPTURE(c.http);
    Status st = StatusForRefusal(c.http, "why");
    CHECK(st.code() == c.code);
    CHECK(st.retryable() == c.retryable);
    CHECK(st.message() == "why");
    nlohmann::json body = ProblemBody(c.http, st, "rid");
    CHECK(body["status"] == c.http);
    CHECK(body.value("retryable", false) == c.retryable);
  }
}

TEST_CASE("a database message under a context (store: postgres: ...) names no host or port") {
  const std::string words =
      "postgres: cannot connect: connection to server at \"localhost\" (127.0.0.1), port "
      "18399 failed: Connection refused";
  for (const Status& st : {Unavailable(words), Unavailable("store: " + words),
                           Unavailable(words).Annotate("reading plan pln_1")}) {
    CAPTURE(st.message());
    const std::string detail = ProblemBody(503, st, "rid-7")["detail"];
    CHECK(detail.find("127.0.0.1") == std::string::npos);
    CHECK(detail.find("18399") == std::string::npos);
    CHECK(detail.find("localhost") == std::string::npos);
    CHECK(detail.find("http.store_error") != std::string::npos);
    CHECK(detail.find("rid-7") != std::string::npos);
    CHECK(CallerDetail(503, st, "rid-7") == detail);
  }
  // A 4xx's message is the caller's own business: kept.
  CHECK(CallerDetail(409, InvalidArgument("store: postgres: x"), "r") == "store: postgres: x");
  // So is a message that merely mentions PostgreSQL.
  CHECK(CallerDetail(503, Unavailable("the postgres store is draining"), "r") ==
        "the postgres store is draining");
}

// Prometheus naming: one idem_ prefix, _total on counters only, base units.
TEST_CASE("every metric name follows the Prometheus naming rules") {
  Metrics m;
  std::istringstream text(m.RenderPrometheus());
  std::map<std::string, std::string> types;  // family -> type
  std::vector<std::string> samples;
  std::string line;
  while (std::getline(text, line)) {
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream fields(line.substr(7));
      std::string name, type;
      fields >> name >> type;
      types[name] = type;
    } else if (!line.empty() && line[0] != '#') {
      samples.push_back(line.substr(0, line.find_first_of("{ ")));
    }
  }
  REQUIRE(types.size() > 10);
  const std::regex valid("^idem_[a-z0-9_]+$");
  const std::regex non_base_unit("_(ms|milliseconds|us|ns|minutes|hours|days|kb|mb|bytes_kb)(_|$)");
  for (const auto& metric : types) {
    const auto& [name, type] = metric;
    CAPTURE(metric.first);  // clang 14 cannot capture a structured binding
    CHECK(std::regex_match(name, valid));
    CHECK(name.find("idem_idem") == std::string::npos);
    CHECK_FALSE(std::regex_search(name, non_base_unit));
    bool total = name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0;
    CHECK(total == (type == "counter"));
  }
  for (const std::string& sample : samples) {
    CAPTURE(sample);
    bool known = types.count(sample) > 0;
    for (const char* suffix : {"_sum", "_count", "_bucket"}) {
      std::string s(suffix);
      const std::string& name = sample;
      if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
        std::string family = name.substr(0, name.size() - s.size());
        known = known || (types.count(family) > 0 && types[family] == "histogram");
      }
    }
    CHECK(known);
  }
}

}  // namespace
}  // namespace idem
