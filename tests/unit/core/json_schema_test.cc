#include "daemon/core/json_schema.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

namespace idem {
namespace {

std::unique_ptr<JsonSchema> MustCreate(const Json& schema) {
  auto created = JsonSchema::Create(schema);
  REQUIRE_MESSAGE(created.ok(), created.status().ToString());
  return std::move(created).value();
}

const Json kTriageSchema = Json::parse(R"({
  "type": "object",
  "additionalProperties": false,
  "required": ["category", "priority", "steps"],
  "properties": {
    "category": {"type": "string", "enum": ["refund", "bug", "question"]},
    "priority": {"type": "integer", "minimum": 0, "maximum": 2},
    "steps": {
      "type": "array",
      "items": {
        "type": "object",
        "additionalProperties": false,
        "required": ["kind"],
        "properties": {"kind": {"type": "string", "minLength": 1}, "a/b~c": {"type": "string"}}
      }
    }
  }
})");

TEST_CASE("a document that satisfies the schema validates with no errors") {
  auto schema = MustCreate(kTriageSchema);
  Json doc = {{"category", "bug"}, {"priority", 1}, {"steps", Json::array({{{"kind", "x"}}})}};
  CHECK(schema->Validate(doc).ok());
  CHECK(schema->Errors(doc).empty());
}

TEST_CASE("an error inside an array item is reported at its JSON pointer") {
  auto schema = MustCreate(kTriageSchema);
  Json doc = {{"category", "bug"}, {"priority", 1}, {"steps", Json::array({{{"kind", 7}}})}};
  Status st = schema->Validate(doc);
  CHECK(st.code() == Code::kInvalidArgument);
  CHECK(st.field() == "/steps/0/kind");
  CHECK(st.message() == "/steps/0/kind: must be string, not integer");
}

TEST_CASE("every error is listed once and summary lines are left out") {
  auto schema = MustCreate(kTriageSchema);
  Json doc = {{"category", "cake"}, {"priority", 5}, {"steps", Json::array({Json::object()})}};
  auto errors = schema->Errors(doc);
  REQUIRE(errors.size() == 3);
  std::vector<std::string> pointers;
  for (const auto& e : errors) pointers.push_back(e.pointer);
  CHECK(std::find(pointers.begin(), pointers.end(), "/category") != pointers.end());
  CHECK(std::find(pointers.begin(), pointers.end(), "/priority") != pointers.end());
  // A missing key is pointed at where it belongs, not at its object.
  CHECK(std::find(pointers.begin(), pointers.end(), "/steps/0/kind") != pointers.end());
  for (const auto& e : errors) {
    if (e.pointer == "/category") CHECK(e.message == "must be one of refund, bug or question");
    if (e.pointer == "/priority") CHECK(e.message == "must be <= 2");
    if (e.pointer == "/steps/0/kind") CHECK(e.message == "missing required key");
  }
  Status st = schema->Validate(doc);
  CHECK(st.message().find("; ") != std::string::npos);
  CHECK(st.field() == errors.front().pointer);
}

TEST_CASE("an unknown key is reported at the key's own pointer") {
  auto schema = MustCreate(kTriageSchema);
  Json doc = {{"category", "bug"}, {"priority", 1}, {"steps", Json::array()}, {"colour", "red"}};
  auto errors = schema->Errors(doc);
  REQUIRE(errors.size() == 1);
  CHECK(errors[0].pointer == "/colour");
  CHECK(errors[0].message == "unknown key");
}

TEST_CASE("pointer tokens escape tilde and slash as RFC 6901 requires") {
  auto schema = MustCreate(kTriageSchema);
  Json doc = {{"category", "bug"},
              {"priority", 1},
              {"steps", Json::array({{{"kind", "x"}, {"a/b~c", 1}}})}};
  auto errors = schema->Errors(doc);
  REQUIRE(errors.size() == 1);
  CHECK(errors[0].pointer == "/steps/0/a~1b~0c");
}

TEST_CASE("an error at the document itself has the empty pointer") {
  auto schema = MustCreate(kTriageSchema);
  Status st = schema->Validate(Json::array());
  CHECK(st.field() == "");
  CHECK(st.message() == "(root): must be object, not array");
}

TEST_CASE("local $ref definitions resolve, and pattern errors use the description") {
  auto schema = MustCreate(Json::parse(R"({
    "definitions": {"duration": {"type": "string", "pattern": "^[0-9]+s$",
                                 "description": "a duration like 30s"}},
    "type": "object",
    "properties": {"timeout": {"$ref": "#/definitions/duration"}}
  })"));
  CHECK(schema->Validate({{"timeout", "30s"}}).ok());
  auto errors = schema->Errors({{"timeout", "soon"}});
  REQUIRE(errors.size() == 1);
  CHECK(errors[0].pointer == "/timeout");
  CHECK(errors[0].message == "must be a duration like 30s");
}

TEST_CASE("an anyOf failure reports the branch that fits the value, or the allowed forms") {
  auto schema = MustCreate(Json::parse(R"({
    "definitions": {"model": {"type": "string", "minLength": 1}},
    "type": "array",
    "items": {"anyOf": [
      {"type": "string", "enum": ["escalate"]},
      {"type": "object", "additionalProperties": false, "required": ["model"],
       "properties": {"model": {"$ref": "#/definitions/model"}}}
    ]}
  })"));
  CHECK(schema->Validate(Json::parse(R"(["escalate", {"model": "m"}])")).ok());

  auto errors = schema->Errors(Json::parse(R"([{"model": 3}, "escalat", 7])"));
  REQUIRE(errors.size() == 3);
  CHECK(errors[0].pointer == "/0/model");
  CHECK(errors[0].message == "must be string, not integer");
  CHECK(errors[1].pointer == "/1");
  CHECK(errors[1].message == "must be escalate");
  CHECK(errors[2].pointer == "/2");
  CHECK(errors[2].message == "must be escalate, or an object with keys model");
}

TEST_CASE(
    "a value matching two oneOf forms is told to give one; an if-then-else summary is left out") {
  auto schema = MustCreate(Json::parse(R"({
    "type": "object",
    "properties": {
      "event_id": {"oneOf": [{"type": "object", "required": ["pointer"]},
                             {"type": "object", "required": ["header"]}]},
      "mode": {"type": "string"}
    },
    "if": {"required": ["mode"], "properties": {"mode": {"const": "upsert"}}},
    "then": {"required": ["upsert_key"]}
  })"));
  auto both = schema->Errors(Json::parse(R"({"event_id": {"pointer": "/id", "header": "X-Id"}})"));
  REQUIRE(both.size() == 1);
  CHECK(both[0].pointer == "/event_id");
  CHECK(both[0].message.find("matches more than one of its allowed forms: give exactly one") == 0);
  auto upsert = schema->Errors(Json::parse(R"({"mode": "upsert"})"));
  REQUIRE(upsert.size() == 1);
  CHECK(upsert[0].pointer == "/upsert_key");
  CHECK(upsert[0].message.find("conditional") == std::string::npos);
}

TEST_CASE("every unknown key of an object is reported, not only the first valijson meets") {
  auto schema = MustCreate(kTriageSchema);
  auto errors = schema->Errors(Json::parse(
      R"({"category": "bug", "priority": 1, "steps": [], "zeta": 1, "alpha": 2, "mid": 3})"));
  std::vector<std::string> pointers;
  for (const SchemaError& e : errors) {
    CHECK(e.message == "unknown key");
    pointers.push_back(e.pointer);
  }
  std::sort(pointers.begin(), pointers.end());
  CHECK(pointers == std::vector<std::string>{"/alpha", "/mid", "/zeta"});
}

TEST_CASE("integers and numbers are told apart strictly") {
  auto schema = MustCreate({{"type", "integer"}});
  CHECK(schema->Validate(3).ok());
  CHECK_FALSE(schema->Validate(3.5).ok());
  CHECK_FALSE(schema->Validate("3").ok());
}

TEST_CASE("a malformed schema is InvalidArgument, not an exception") {
  for (const char* text : {R"({"type": "strin"})", R"({"type": 5})", R"({"pattern": "(["})",
                           R"({"$ref": "http://example.com/s.json"})", R"({"minLength": "x"})",
                           R"("just a string")"}) {
    CAPTURE(text);
    auto created = JsonSchema::Create(Json::parse(text));
    CHECK_FALSE(created.ok());
    if (!created.ok()) CHECK(created.status().code() == Code::kInvalidArgument);
  }
}

TEST_CASE(
    "a long string is checked against a pattern without exhausting the stack (std::regex "
    "recursed per character and killed the daemon at 20,000)") {
  // A repeated group keeps a frame per repeat on the heap: 100,000 of them
  // fit in the limit (the length that crashed the daemon).
  // No structured binding: clang 14 cannot capture one in CAPTURE.
  for (const auto& each : {std::pair<const char*, size_t>{"^[a-z]+$", 1'000'000},
                           std::pair<const char*, size_t>{"^([a-z]|[0-9])*$", 100'000}}) {
    const char* pattern = each.first;
    const size_t length = each.second;
    CAPTURE(pattern);
    auto schema = MustCreate({{"type", "string"}, {"pattern", pattern}});
    const std::string long_text(length, 'a');
    CHECK(schema->Errors(long_text).empty());
    auto errors = schema->Errors(long_text + "!");
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].message == std::string("must match ") + pattern);
  }
  // Past the heap limit: refused, with the reason.
  auto group = MustCreate({{"type", "string"}, {"pattern", "^([a-z]|[0-9])*$"}});
  auto errors = group->Errors(std::string(1'000'000, 'a'));
  REQUIRE(errors.size() == 1);
  CHECK(errors[0].message.find("within its limits") != std::string::npos);
}

TEST_CASE("a pattern reads as ECMAScript: unanchored, $ only at the very end, \\u escapes") {
  auto search = MustCreate({{"type", "string"}, {"pattern", "b+"}});
  CHECK(search->Errors("abbc").empty());
  CHECK_FALSE(search->Errors("ac").empty());
  auto whole = MustCreate({{"type", "string"}, {"pattern", "^[a-z]+$"}});
  CHECK_FALSE(whole->Errors("abc\n").empty());
  auto escaped = MustCreate({{"type", "string"}, {"pattern", "^\\u0041\\u00e9$"}});
  CHECK(escaped->Errors("A\xc3\xa9").empty());
  CHECK_FALSE(escaped->Errors("Ae").empty());
  // A non-string is not the keyword's to judge.
  CHECK(MustCreate({{"pattern", "^a$"}})->Errors(5).empty());
}

TEST_CASE("a pattern that backtracks without end on a value is refused quickly, not run for ever") {
  auto schema = MustCreate({{"type", "string"}, {"pattern", "^(a+)+$"}});
  auto errors = schema->Errors(std::string(100, 'a') + "!");
  REQUIRE(errors.size() == 1);
  CHECK(errors[0].message.find("backtracks too much") != std::string::npos);
}

TEST_CASE("a pattern the regular expression engine cannot compile names its place in the schema") {
  auto created = JsonSchema::Create(
      Json::parse(R"({"type": "object", "properties": {"code": {"pattern": "a(b"}}})"));
  REQUIRE_FALSE(created.ok());
  CHECK(created.status().code() == Code::kInvalidArgument);
  CHECK(created.status().field() == "/properties/code/pattern");
  // A property named pattern, or a value listing the word, is no pattern.
  MustCreate(Json::parse(
      R"({"properties": {"pattern": {"type": "string"}}, "enum": [{"pattern": "("}]})"));
}

TEST_CASE("date, time and date-time formats follow RFC 3339, and a long value is no danger") {
  struct Case {
    const char* format;
    std::string value;
    bool valid;
  };
  const std::vector<Case> cases = {
      {"date", "2024-02-29", true},
      {"date", "2023-02-29", false},
      {"date", "2024-04-31", false},
      {"date", "2024-13-01", false},
      {"date", "24-01-01", false},
      {"date", "2024-01-01x", false},
      {"date", std::string(100'000, '9') + "-01-01", false},
      {"time", "23:59:60Z", true},
      {"time", "16:52:45.123+02:00", true},
      {"time", "16:52:45z", true},
      {"time", "24:00:00Z", false},
      {"time", "16:52:45", false},
      {"time", "16:52:45.Z", false},
      {"time", "16:52:45." + std::string(100'000, '0') + "Z", true},
      {"date-time", "2022-07-18T16:52:45Z", true},
      {"date-time", "2022-07-18t16:52:45-05:30", true},
      {"date-time", "2022-07-18 16:52:45Z", false},
      {"date-time", "2022-07-18T16:52:45+24:00", false},
  };
  for (const Case& c : cases) {
    CAPTURE(c.format);
    CAPTURE(c.value.substr(0, 40));
    auto schema = MustCreate({{"type", "string"}, {"format", c.format}});
    auto errors = schema->Errors(c.value);
    CHECK(errors.empty() == c.valid);
    if (!errors.empty()) CHECK(errors[0].message == std::string("must be an RFC 3339 ") + c.format);
  }
}

TEST_CASE("a key too long to match against patternProperties is refused at its pointer") {
  auto schema = MustCreate(
      Json::parse(R"({"type": "object", "patternProperties": {"^[a-z]+$": {"type": "integer"}}})"));
  CHECK(schema->Errors({{"abc", 1}}).empty());
  const std::string key(1025, 'a');
  auto errors = schema->Errors({{"inner", {{key, 1}}}});
  REQUIRE(errors.size() == 1);
  CHECK(errors[0].pointer == "/inner/" + key);
  CHECK(errors[0].message.find("patternProperties") != std::string::npos);
  CHECK(schema->Errors({{std::string(1024, 'a'), 1}}).empty());
}

TEST_CASE("one schema validates from many threads at once") {
  auto schema = MustCreate(Json::parse(R"({"type": "object", "properties":
      {"id": {"type": "string", "pattern": "^t-[0-9]+$"}}, "required": ["id"]})"));
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 300; ++i) {
        bool good = (i + t) % 2 == 0;
        Json doc = {{"id", good ? "t-" + std::to_string(i) : "x" + std::to_string(i)}};
        if (schema->Validate(doc).ok() != good) ++wrong;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(wrong.load() == 0);
}

}  // namespace
}  // namespace idem

namespace idem {
namespace {

// The work lane's body schemas, in the shape they have (schemas/api).
const Json kBodySchema = Json::parse(R"({
  "$schema": "http://json-schema.org/draft-07/schema#",
  "title": "a body",
  "type": "object",
  "required": ["kind", "identity"],
  "additionalProperties": false,
  "properties": {
    "kind": {"type": "string", "minLength": 1, "maxLength": 4},
    "identity": {"type": "object"},
    "lease": {"type": ["string", "integer"]},
    "result": {"description": "anything"},
    "never": false
  }
})");

TEST_CASE("a schema of only the common keywords gets a direct check; any other keyword, none") {
  CHECK(MustCreate(kBodySchema)->HasDirectCheck());
  CHECK(MustCreate(Json(true))->HasDirectCheck());
  for (const char* other :
       {R"({"type": "string", "pattern": "^a"})", R"({"enum": [1]})", R"({"allOf": [{}]})",
        R"({"type": "object", "additionalProperties": {"type": "string"}})",
        R"({"type": "integer", "minimum": 0})", R"({"type": "array", "items": {}})",
        R"({"properties": {"a": {"$ref": "#/definitions/x"}}, "definitions": {"x": {}}})",
        R"({"type": "decimal"})", R"({"type": []})"}) {
    CAPTURE(other);
    auto schema = JsonSchema::Create(Json::parse(other));
    if (schema.ok()) CHECK_FALSE((*schema)->HasDirectCheck());
  }
}

TEST_CASE("the direct check accepts only what valijson accepts, and leaves the rest to it") {
  auto schema = MustCreate(kBodySchema);
  // The same schema under allOf: valijson alone decides.
  auto alone = MustCreate(Json{{"allOf", Json::array({kBodySchema})}});
  REQUIRE_FALSE(alone->HasDirectCheck());
  struct Case {
    const char* doc;
    bool direct;  // the direct check accepts it
  };
  for (const Case& c : {
           Case{R"({"kind": "k", "identity": {}})", true},
           Case{R"({"kind": "ké€😀", "identity": {"a": [1]}, "lease": 30, "result": null})", true},
           Case{R"({"kind": "k", "identity": {}, "lease": "30s"})", true},
           Case{R"({"kind": "", "identity": {}})", false},           // minLength
           Case{R"({"kind": "kkkkk", "identity": {}})", false},      // maxLength
           Case{R"({"kind": "k\u0000kk", "identity": {}})", false},  // valijson stops at NUL
           Case{R"({"kind": "k", "identity": []})", false},          // type
           Case{R"({"kind": "k", "identity": {}, "lease": 1.0})", false},
           Case{R"({"kind": "k", "identity": {}, "lease": true})", false},
           Case{R"({"kind": "k"})", false},                              // required
           Case{R"({"kind": "k", "identity": {}, "other": 1})", false},  // closed
           Case{R"({"kind": "k", "identity": {}, "never": 1})", false},  // false schema
           Case{R"([1])", false},
       }) {
    CAPTURE(c.doc);
    const Json doc = Json::parse(c.doc);
    CHECK(schema->DirectlyAccepts(doc) == c.direct);
    const bool valijson = alone->Errors(doc).empty();
    if (c.direct) CHECK(valijson);
    // Whoever decides, the verdict and the errors are valijson's.
    CHECK(schema->Validate(doc).ok() == valijson);
    CHECK(schema->Errors(doc).empty() == valijson);
  }
}

}  // namespace
}  // namespace idem
