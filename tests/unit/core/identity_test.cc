#include "daemon/core/identity.h"

#include <doctest/doctest.h>

#include <limits>
#include <string>

#include "daemon/core/json.h"

namespace idem {
namespace {

DecisionKeyParts BaseParts() {
  DecisionKeyParts p;
  p.step = "triage";
  p.prompt_hash = "ph";
  p.provider = "openai";
  p.model = "gpt-x";
  p.prompt_version = "p1";
  p.temperature = 0.2;
  p.tools = Json::array();
  p.output_schema = Json::object();
  p.input = Json{{"a", 1}};
  return p;
}

std::string DecisionKey(const DecisionKeyParts& parts) {
  StatusOr<KeyMaterial> k = ComputeDecisionKey(parts);
  REQUIRE_MESSAGE(k.ok(), k.status().ToString());
  return k->key;
}

Json Normalized(const Json& input, const Normalizers& n) {
  StatusOr<Json> v = NormalizeInput(input, n);
  REQUIRE_MESSAGE(v.ok(), v.status().ToString());
  return *v;
}

std::string Url(std::string_view url) {
  StatusOr<std::string> u = NormalizeUrl(url);
  REQUIRE_MESSAGE(u.ok(), u.status().ToString());
  return *u;
}

// --- decision keys ---------------------------------------------------------

TEST_CASE("the decision key is sha256 of the documented canonical material") {
  // Expected values computed outside this code base:
  //   T=$(printf '%s' '[]' | sha256sum)   -> 4f53cda1...b945
  //   S=$(printf '%s' '{}' | sha256sum)   -> 44136fa3...aff8a
  //   printf '%s' '{"input":{"a":1},"model":"gpt-x","prompt_hash":"ph","prompt_version":"p1",
  //     "provider":"openai","schema_hash":"'$S'","step":"triage","temperature":0.2,
  //     "tools_hash":"'$T'","v":2}' | sha256sum        (one line, no spaces)
  StatusOr<KeyMaterial> k = ComputeDecisionKey(BaseParts());
  REQUIRE(k.ok());
  CHECK(k->canonical ==
        R"({"input":{"a":1},"model":"gpt-x","prompt_hash":"ph","prompt_version":"p1",)"
        R"("provider":"openai",)"
        R"("schema_hash":"44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",)"
        R"("step":"triage","temperature":0.2,)"
        R"("tools_hash":"4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945",)"
        R"("v":2})");
  CHECK(k->key == "f201652cb0cdd03c2099c3a006fb0795d548ded9cf3184aa68819c6242564e34");
}

TEST_CASE("two steps with the same provider, model, prompt label, schema and input get two keys") {
  DecisionKeyParts triage = BaseParts();
  DecisionKeyParts spam = BaseParts();
  spam.step = "spam_check";
  CHECK(DecisionKey(triage) != DecisionKey(spam));
}

TEST_CASE("an unset temperature is not temperature 0 in the key material") {
  DecisionKeyParts unset = BaseParts();
  unset.temperature.reset();
  DecisionKeyParts zero = BaseParts();
  zero.temperature = 0;
  StatusOr<KeyMaterial> k = ComputeDecisionKey(unset);
  REQUIRE(k.ok());
  CHECK(k->canonical.find(R"("temperature":null)") != std::string::npos);
  CHECK(DecisionKey(unset) != DecisionKey(zero));
}

TEST_CASE("the prompt hash covers template, system text and tools") {
  auto hash = [](std::string_view t, std::string_view s, const Json& tools) {
    StatusOr<std::string> h = ComputePromptHash(t, s, tools);
    REQUIRE(h.ok());
    return *h;
  };
  // printf '%s' '{"system":"be brief","template":"Ticket: {{x}}","tools":[]}' | sha256sum
  CHECK(hash("Ticket: {{x}}", "be brief", Json::array()) ==
        "ad765fe07bafe36b877736184ca39643be3530385e5db02d4bfad4c1f2cc49db");
  const std::string base = hash("Ticket: {{x}}", "be brief", Json::array());
  CHECK(hash("Ticket: {{y}}", "be brief", Json::array()) != base);
  CHECK(hash("Ticket: {{x}}", "be thorough", Json::array()) != base);
  CHECK(hash("Ticket: {{x}}", "be brief", Json::array({{{"name", "t"}}})) != base);
  // The parts cannot blur into each other.
  CHECK(hash("ab", "", Json::array()) != hash("a", "b", Json::array()));
}

TEST_CASE("reordered keys and a changed volatile field give the same decision key") {
  Normalizers n;
  n.drop = {"received_at", "/meta/trace_id"};
  const Json first = Json::parse(
      R"({"user":"ann","text":"hi","received_at":"2024-01-01","meta":{"trace_id":"t1","lang":"en"}})");
  const Json second = Json::parse(
      R"({"meta":{"lang":"en","trace_id":"t2"},"received_at":"2025-06-30","text":"hi","user":"ann"})");
  DecisionKeyParts a = BaseParts();
  a.input = Normalized(first, n);
  DecisionKeyParts b = BaseParts();
  b.input = Normalized(second, n);
  CHECK(DecisionKey(a) == DecisionKey(b));
}

TEST_CASE("reordered members inside tools and schema give the same decision key") {
  DecisionKeyParts a = BaseParts();
  a.tools = Json::parse(R"([{"name":"search","parameters":{"type":"object","required":["q"]}}])");
  a.output_schema = Json::parse(R"({"type":"object","properties":{"x":{"type":"string"}}})");
  DecisionKeyParts b = BaseParts();
  b.tools = Json::parse(R"([{"parameters":{"required":["q"],"type":"object"},"name":"search"}])");
  b.output_schema = Json::parse(R"({"properties":{"x":{"type":"string"}},"type":"object"})");
  CHECK(DecisionKey(a) == DecisionKey(b));
}

TEST_CASE("each field that shapes the output changes the decision key") {
  const std::string base = DecisionKey(BaseParts());
  struct Change {
    const char* what;
    void (*apply)(DecisionKeyParts&);
  };
  for (const Change& c : {
           Change{"provider", [](DecisionKeyParts& p) { p.provider = "anthropic"; }},
           Change{"model", [](DecisionKeyParts& p) { p.model = "gpt-y"; }},
           Change{"prompt_version", [](DecisionKeyParts& p) { p.prompt_version = "p2"; }},
           Change{"step", [](DecisionKeyParts& p) { p.step = "spam_check"; }},
           Change{"prompt_hash", [](DecisionKeyParts& p) { p.prompt_hash = "other"; }},
           Change{"temperature", [](DecisionKeyParts& p) { p.temperature = 0.3; }},
           Change{"tools",
                  [](DecisionKeyParts& p) {
                    p.tools = Json::array({{{"name", "t"}}});
                  }},
           Change{"schema",
                  [](DecisionKeyParts& p) {
                    p.output_schema = {{"type", "object"}};
                  }},
           Change{"input value", [](DecisionKeyParts& p) { p.input["a"] = 2; }},
           Change{"input added field", [](DecisionKeyParts& p) { p.input["b"] = 1; }},
           Change{"input type", [](DecisionKeyParts& p) { p.input["a"] = "1"; }},
       }) {
    CAPTURE(c.what);
    DecisionKeyParts p = BaseParts();
    c.apply(p);
    CHECK(DecisionKey(p) != base);
  }
}

TEST_CASE("a non-finite temperature or input number is refused with its field") {
  DecisionKeyParts t = BaseParts();
  t.temperature = std::numeric_limits<double>::quiet_NaN();
  StatusOr<KeyMaterial> k = ComputeDecisionKey(t);
  REQUIRE_FALSE(k.ok());
  CHECK(k.status().code() == Code::kInvalidArgument);
  CHECK(k.status().field() == "/temperature");

  DecisionKeyParts i = BaseParts();
  i.input = Json{{"x", Json::array({std::numeric_limits<double>::infinity()})}};
  StatusOr<KeyMaterial> ki = ComputeDecisionKey(i);
  REQUIRE_FALSE(ki.ok());
  CHECK(ki.status().field() == "/input/x/0");
}

TEST_CASE(
    "an input number of magnitude 2^53 or more is refused with its pointer, as a string it keys") {
  // 2^53 + 1 and 2^53 are one double: they would share a decision.
  for (const char* text :
       {R"({"order":{"ids":[1,9007199254740993]}})", R"({"order":{"ids":[1,9007199254740992]}})",
        R"({"order":{"ids":[1,-9007199254740993]}})",
        R"({"order":{"ids":[1,18446744073709551615]}})",
        // Past 64 bits the literal is read as a double: ...901 and ...999
        // would be one key. And 1e16 comes back from JCS as an integer.
        R"({"order":{"ids":[1,123456789012345678901]}})", R"({"order":{"ids":[1,1e16]}})",
        R"({"order":{"ids":[1,-1.5e20]}})",
        // From 1e21 JCS writes an exponent, but the doubles are no closer:
        // 10000000000000000000001, 1e22 and 1.00000000000000001e22 are one.
        R"({"order":{"ids":[1,10000000000000000000001]}})", R"({"order":{"ids":[1,1e21]}})",
        R"({"order":{"ids":[1,1e22]}})", R"({"order":{"ids":[1,-1.5e300]}})",
        R"({"order":{"ids":[1,10000000000000000000001.5]}})"}) {
    CAPTURE(text);
    DecisionKeyParts p = BaseParts();
    p.input = Json::parse(text);
    StatusOr<KeyMaterial> k = ComputeDecisionKey(p);
    REQUIRE_FALSE(k.ok());
    CHECK(k.status().code() == Code::kInvalidArgument);
    CHECK(k.status().field() == "/input/order/ids/1");
  }
  DecisionKeyParts a = BaseParts();
  a.input = Json::parse(R"({"id":"9007199254740993"})");
  DecisionKeyParts b = BaseParts();
  b.input = Json::parse(R"({"id":"9007199254740992"})");
  CHECK(DecisionKey(a) != DecisionKey(b));
  // The largest exact integers, and floats below 2^53, are fine.
  DecisionKeyParts edge = BaseParts();
  edge.input =
      Json::parse(R"({"a":9007199254740991,"b":-9007199254740991,"c":9007199254740991.0,"d":0.5,)"
                  R"("e":-4503599627370495.5,"f":8.5e15,"g":1e-300})");
  CHECK(ComputeDecisionKey(edge).ok());
}

// --- NormalizeInput --------------------------------------------------------

TEST_CASE("strings are trimmed at every depth but member names are not") {
  Normalizers n;
  const Json in = Json::parse(R"({" k ":"  a  ","list":["\tb\n",{"c":" c"}],"n":1})");
  CHECK(Normalized(in, n) == Json::parse(R"({" k ":"a","list":["b",{"c":"c"}],"n":1})"));
}

TEST_CASE("trimming removes Unicode white space such as no-break and ideographic spaces") {
  Normalizers n;
  const Json in = Json("\xc2\xa0\xe3\x80\x80 x y\xe2\x80\xa8\xef\xbb\xbf");
  CHECK(Normalized(in, n) == Json("x y"));
}

TEST_CASE("trimming can be switched off") {
  Normalizers n;
  n.trim_strings = false;
  CHECK(Normalized(Json(" a "), n) == Json(" a "));
}

TEST_CASE("a dropped member name is dropped at any depth") {
  Normalizers n;
  n.drop = {"received_at"};
  const Json in = Json::parse(R"({"received_at":1,"a":{"received_at":2,"b":[{"received_at":3}]}})");
  CHECK(Normalized(in, n) == Json::parse(R"({"a":{"b":[{}]}})"));
}

TEST_CASE("a dropped pointer is dropped at that place only") {
  Normalizers n;
  n.drop = {"/meta/trace_id", "/a~1b", "/items/1"};
  const Json in =
      Json::parse(R"({"trace_id":1,"meta":{"trace_id":2,"x":3},"a/b":4,"items":["k0","k1","k2"]})");
  CHECK(Normalized(in, n) == Json::parse(R"({"trace_id":1,"meta":{"x":3},"items":["k0","k2"]})"));
}

TEST_CASE("url fields are normalized where the pointer says") {
  Normalizers n;
  n.url_fields = {"/link", "/refs/0"};
  const Json in = Json::parse(
      R"({"link":" HTTP://Example.COM:80/a?utm_source=x&b=2&a=1#frag ","refs":["https://x.org:443"],"other":"HTTP://A"})");
  CHECK(
      Normalized(in, n) ==
      Json::parse(
          R"({"link":"http://example.com/a?a=1&b=2","refs":["https://x.org/"],"other":"HTTP://A"})"));
}

TEST_CASE("a url field that is not a URL is refused with its pointer") {
  Normalizers n;
  n.url_fields = {"/site/home"};
  StatusOr<Json> bad = NormalizeInput(Json::parse(R"({"site":{"home":"not a url"}})"), n);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == Code::kInvalidArgument);
  CHECK(bad.status().field() == "/site/home");

  StatusOr<Json> number = NormalizeInput(Json::parse(R"({"site":{"home":7}})"), n);
  REQUIRE_FALSE(number.ok());
  CHECK(number.status().code() == Code::kInvalidArgument);
  CHECK(number.status().field() == "/site/home");
}

TEST_CASE("a url field that is absent or dropped is not an error") {
  Normalizers n;
  n.url_fields = {"/link"};
  CHECK(NormalizeInput(Json::parse(R"({"x":1})"), n).ok());
  n.drop = {"link"};
  CHECK(Normalized(Json::parse(R"({"link":5})"), n) == Json::object());
}

// --- NormalizeUrl ----------------------------------------------------------

TEST_CASE("scheme and host are lower-cased but path and query keep their case") {
  CHECK(Url("HTTPS://WWW.Example.COM/Path/To?Q=V") == "https://www.example.com/Path/To?Q=V");
}

TEST_CASE("the default port is dropped and other ports are kept") {
  CHECK(Url("http://example.com:80/") == "http://example.com/");
  CHECK(Url("https://example.com:443/") == "https://example.com/");
  CHECK(Url("http://example.com:443/") == "http://example.com:443/");
  CHECK(Url("https://example.com:8443/x") == "https://example.com:8443/x");
  CHECK(Url("http://example.com:/") == "http://example.com/");
  CHECK(Url("http://[::1]:80/") == "http://[::1]/");
  CHECK(Url("http://[::1]:8080") == "http://[::1]:8080/");
}

TEST_CASE("the fragment is dropped and an empty path becomes a slash") {
  CHECK(Url("https://example.com#top") == "https://example.com/");
  CHECK(Url("https://example.com/a#b?c=d") == "https://example.com/a");
  CHECK(Url("https://example.com?x=1") == "https://example.com/?x=1");
}

TEST_CASE("tracking parameters are dropped") {
  CHECK(Url("https://e.com/p?utm_source=a&utm_medium=b&utm_campaign=c&gclid=1&fbclid=2&id=7") ==
        "https://e.com/p?id=7");
  CHECK(Url("https://e.com/p?dclid=1&msclkid=2&mc_cid=3&mc_eid=4&_ga=5&yclid=6&igshid=7") ==
        "https://e.com/p");
  // Only exact names (and the utm_ prefix) are tracking parameters.
  CHECK(Url("https://e.com/p?gclid_x=1&xutm_a=2") == "https://e.com/p?gclid_x=1&xutm_a=2");
}

TEST_CASE("remaining query parameters are sorted by name then value") {
  CHECK(Url("https://e.com/?b=2&a=9&a=1&c&&a=") == "https://e.com/?a=&a=1&a=9&b=2&c");
}

TEST_CASE("user info is kept as written") {
  CHECK(Url("https://User:Pw@Example.com/") == "https://User:Pw@example.com/");
}

TEST_CASE("text without scheme://host is not a URL") {
  for (const char* bad : {"", "example.com/path", "mailto:a@b.c", "http://", "http:///path",
                          "1http://x", "http://exa mple.com/", "http://x.com:99999/",
                          "http://x.com:8a/", "http://[::1/", "http://x.com/a b"}) {
    CAPTURE(bad);
    StatusOr<std::string> u = NormalizeUrl(bad);
    REQUIRE_FALSE(u.ok());
    CHECK(u.status().code() == Code::kInvalidArgument);
  }
}

// --- work ids --------------------------------------------------------------

TEST_CASE("the work id is sha256 of kind, version and the canonical identity") {
  // printf '%s' 'send_reply:v1:{"a":1}' | sha256sum
  StatusOr<KeyMaterial> w = ComputeWorkId("send_reply", "v1", Json::parse(R"({ "a" : 1 })"));
  REQUIRE(w.ok());
  CHECK(w->canonical == R"(send_reply:v1:{"a":1})");
  CHECK(w->key == "a7c12717acfd0f669776cc0874438dc41d1bb765d77a2aa8ff8b220dcc0bc9ce");
}

TEST_CASE("bumping the action version changes the work id") {
  // printf '%s' 'send_reply:v2:{"a":1}' | sha256sum
  StatusOr<KeyMaterial> w = ComputeWorkId("send_reply", "v2", Json{{"a", 1}});
  REQUIRE(w.ok());
  CHECK(w->key == "bc3b2deda0db0f03ebc8995df067101c2c07b93d7117b47692ada07083d89e4f");
}

TEST_CASE("two identities with distinct integers beyond 2^53 are refused, not merged") {
  StatusOr<KeyMaterial> a =
      ComputeWorkId("send_reply", "v1", Json::parse(R"({"/ticket_id":9007199254740993})"));
  REQUIRE_FALSE(a.ok());
  CHECK(a.status().code() == Code::kInvalidArgument);
  CHECK(a.status().field() == "/~1ticket_id");
  StatusOr<KeyMaterial> s1 =
      ComputeWorkId("send_reply", "v1", Json::parse(R"({"id":"9007199254740993"})"));
  StatusOr<KeyMaterial> s2 =
      ComputeWorkId("send_reply", "v1", Json::parse(R"({"id":"9007199254740992"})"));
  REQUIRE(s1.ok());
  REQUIRE(s2.ok());
  CHECK(s1->key != s2->key);
}

TEST_CASE("a kind or version that could blur the separator is refused") {
  CHECK_FALSE(ComputeWorkId("send:reply", "v1", Json::object()).ok());
  CHECK_FALSE(ComputeWorkId("send_reply", "v:1", Json::object()).ok());
  CHECK_FALSE(ComputeWorkId("", "v1", Json::object()).ok());
  CHECK_FALSE(ComputeWorkId("send_reply", "", Json::object()).ok());
}

}  // namespace
}  // namespace idem

namespace idem {

TEST_CASE("stored key material gives back its decision key, and an edited one does not") {
  DecisionKeyParts parts;
  parts.step = "triage";
  parts.provider = "openai";
  parts.model = "gpt-x";
  parts.prompt_version = "p1";
  parts.prompt_hash = "ph";
  parts.temperature = 0.2;
  parts.tools = Json::array({{{"name", "t"}}});
  parts.output_schema = {{"type", "object"}};
  parts.input = {{"text", "refund please"}, {"n", 3}};
  auto key = ComputeDecisionKey(parts);
  REQUIRE(key.ok());
  const Json material = Json::parse(key->canonical);  // what a Decision stores

  auto again = DecisionKeyOfMaterial(material);
  REQUIRE_MESSAGE(again.ok(), again.status().ToString());
  CHECK(again->key == key->key);
  CHECK(again->canonical == key->canonical);

  Json unset = material;  // an unset temperature is null, and stays so
  unset["temperature"] = nullptr;
  auto unset_key = DecisionKeyOfMaterial(unset);
  REQUIRE(unset_key.ok());
  CHECK(unset_key->key != key->key);

  for (const char* member : {"step", "provider", "model", "prompt_version", "prompt_hash",
                             "tools_hash", "schema_hash"}) {
    Json edited = material;
    edited[member] = edited[member].get<std::string>() + "x";
    auto k = DecisionKeyOfMaterial(edited);
    REQUIRE(k.ok());
    CHECK_MESSAGE(k->key != key->key, member);
  }
  Json edited_input = material;
  edited_input["input"]["text"] = "refund please!";
  CHECK(DecisionKeyOfMaterial(edited_input)->key != key->key);

  Json extra = material;
  extra["note"] = "rides along";
  auto extra_key = DecisionKeyOfMaterial(extra);
  REQUIRE_FALSE(extra_key.ok());
  CHECK(extra_key.status().field() == "/material");

  Json old_version = material;
  old_version["v"] = 1;
  CHECK(DecisionKeyOfMaterial(old_version).status().field() == "/material/v");
  Json no_model = material;
  no_model.erase("model");
  CHECK(DecisionKeyOfMaterial(no_model).status().field() == "/material/model");
  CHECK(DecisionKeyOfMaterial(Json::array()).status().field() == "/material");
  Json huge = material;
  huge["input"]["n"] = int64_t{1} << 60;  // past 2^53: refused, not hashed
  CHECK(DecisionKeyOfMaterial(huge).status().field() == "/material/input/n");
}

}  // namespace idem
