#include "daemon/core/json.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace idem {
namespace {

std::string Canonical(const Json& value) {
  StatusOr<std::string> c = CanonicalJson(value);
  REQUIRE_MESSAGE(c.ok(), c.status().ToString());
  return *c;
}

// --- ParseJson -------------------------------------------------------------

TEST_CASE("a well-formed document parses into the same value nlohmann would build") {
  StatusOr<Json> v = ParseJson(R"({"a":[1,-2,3.5,"x",true,false,null],"b":{"c":{}}})");
  REQUIRE_MESSAGE(v.ok(), v.status().ToString());
  CHECK(*v == Json::parse(R"({"a":[1,-2,3.5,"x",true,false,null],"b":{"c":{}}})"));
}

TEST_CASE("a scalar is a valid top-level document") {
  StatusOr<Json> v = ParseJson(" 42 ");
  REQUIRE(v.ok());
  CHECK(*v == 42);
}

TEST_CASE("a duplicate member name is rejected with the pointer of the duplicate") {
  StatusOr<Json> top = ParseJson(R"({"a":1,"a":2})");
  REQUIRE_FALSE(top.ok());
  CHECK(top.status().code() == Code::kInvalidArgument);
  CHECK(top.status().field() == "/a");

  StatusOr<Json> nested = ParseJson(R"({"x":[0,{"a/b~":1,"a/b~":2}]})");
  REQUIRE_FALSE(nested.ok());
  CHECK(nested.status().code() == Code::kInvalidArgument);
  CHECK(nested.status().field() == "/x/1/a~1b~0");
}

TEST_CASE(
    "an integer literal past 64 bits is refused at its pointer when a caller's body asks for "
    "exact integers: two of them would be one double") {
  JsonLimits exact;
  exact.exact_integer_literals = true;
  for (const char* text : {R"({"identity":{"id":1000000000000000000000001}})",
                           R"({"identity":{"id":-1000000000000000000000002}})"}) {
    CAPTURE(text);
    auto refused = ParseJson(text, exact);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.status().code() == Code::kInvalidArgument);
    CHECK(refused.status().field() == "/identity/id");
  }
  auto in_array = ParseJson(R"({"a":[1,2,99999999999999999999999]})", exact);
  REQUIRE_FALSE(in_array.ok());
  CHECK(in_array.status().field() == "/a/2");
  CHECK(ParseJson("123456789012345678901234", exact).status().field() == "");
  // What fits 64 bits, and a float by its form, are values as ever.
  for (const char* text : {"18446744073709551615", "-9223372036854775808", "1e24", "1.5e300",
                           "1000000000000000000000001.0"}) {
    CAPTURE(text);
    CHECK(ParseJson(text, exact).ok());
  }
  // Without the flag (an upstream's answer), read as a double as before.
  auto lax = ParseJson(R"({"id":1000000000000000000000001})");
  REQUIRE(lax.ok());
  CHECK((*lax)["id"].is_number_float());
}

TEST_CASE("the same name in sibling objects is not a duplicate") {
  CHECK(ParseJson(R"([{"a":1},{"a":2}])").ok());
  CHECK(ParseJson(R"({"a":{"a":{"a":1}}})").ok());
}

TEST_CASE("nesting deeper than the limit is ResourceExhausted") {
  JsonLimits limits;
  limits.max_depth = 3;
  CHECK(ParseJson("[[[1]]]", limits).ok());
  CHECK(ParseJson(R"({"a":{"b":[1]}})", limits).ok());

  StatusOr<Json> arrays = ParseJson("[[[[1]]]]", limits);
  REQUIRE_FALSE(arrays.ok());
  CHECK(arrays.status().code() == Code::kResourceExhausted);
  CHECK(arrays.status().field() == "/0/0/0");

  StatusOr<Json> objects = ParseJson(R"({"a":{"b":{"c":{}}}})", limits);
  REQUIRE_FALSE(objects.ok());
  CHECK(objects.status().code() == Code::kResourceExhausted);
  CHECK(objects.status().field() == "/a/b/c");
}

TEST_CASE("a 100000-deep array is refused without exhausting the stack") {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  StatusOr<Json> v = ParseJson(deep);
  REQUIRE_FALSE(v.ok());
  CHECK(v.status().code() == Code::kResourceExhausted);

  // Unterminated, too: the limit fires before the missing end is noticed.
  StatusOr<Json> open = ParseJson(std::string(100000, '['));
  REQUIRE_FALSE(open.ok());
  CHECK(open.status().code() == Code::kResourceExhausted);
}

TEST_CASE("text longer than max_bytes is ResourceExhausted") {
  JsonLimits limits;
  limits.max_bytes = 10;
  CHECK(ParseJson("[1,2,3,4]", limits).ok());
  StatusOr<Json> v = ParseJson("[1,2,3,4,5]", limits);
  REQUIRE_FALSE(v.ok());
  CHECK(v.status().code() == Code::kResourceExhausted);
}

TEST_CASE("invalid UTF-8 is rejected with its byte offset") {
  for (const std::string& text : {
           std::string("\"ab\xff\""),              // never valid
           std::string("\"ab\xc0\xaf\""),          // overlong '/'
           std::string("\"ab\xed\xa0\x80\""),      // UTF-8-encoded surrogate
           std::string("\"ab\xf4\x90\x80\x80\""),  // above U+10FFFF
           std::string("\"ab\xe2\x82\""),          // truncated sequence
       }) {
    CAPTURE(text);
    StatusOr<Json> v = ParseJson(text);
    REQUIRE_FALSE(v.ok());
    CHECK(v.status().code() == Code::kInvalidArgument);
    CHECK(v.status().message().find("byte offset 3") != std::string::npos);
  }
}

TEST_CASE("well-formed multi-byte UTF-8 and escaped surrogate pairs are accepted") {
  StatusOr<Json> v = ParseJson("[\"\xe2\x82\xac\xf0\x9f\x98\x80\", \"\\ud83d\\ude00\"]");
  REQUIRE_MESSAGE(v.ok(), v.status().ToString());
  CHECK((*v)[0] == "\xe2\x82\xac\xf0\x9f\x98\x80");
  CHECK((*v)[1] == "\xf0\x9f\x98\x80");
}

TEST_CASE("a lone surrogate escape is rejected") {
  for (const char* text : {R"("\ud800")", R"("\udc00")", R"("\ud800x")", R"("\ud800\u0041")"}) {
    CAPTURE(text);
    StatusOr<Json> v = ParseJson(text);
    REQUIRE_FALSE(v.ok());
    CHECK(v.status().code() == Code::kInvalidArgument);
  }
}

TEST_CASE("NaN and Infinity spelled out are not JSON") {
  for (const char* text : {"NaN", "[NaN]", "Infinity", "-Infinity", R"({"a":Infinity})"}) {
    CAPTURE(text);
    StatusOr<Json> v = ParseJson(text);
    REQUIRE_FALSE(v.ok());
    CHECK(v.status().code() == Code::kInvalidArgument);
  }
}

TEST_CASE("a number too large for a double is rejected rather than becoming infinity") {
  StatusOr<Json> v = ParseJson("[1e400]");
  REQUIRE_FALSE(v.ok());
  CHECK(v.status().code() == Code::kInvalidArgument);
}

TEST_CASE("trailing garbage after the document is rejected") {
  for (const char* text : {"{} x", "[1] [2]", "1 2", "{\"a\":1}}"}) {
    CAPTURE(text);
    StatusOr<Json> v = ParseJson(text);
    REQUIRE_FALSE(v.ok());
    CHECK(v.status().code() == Code::kInvalidArgument);
  }
}

TEST_CASE("a syntax error names the byte offset where it was found") {
  StatusOr<Json> v = ParseJson("[1,,2]");
  REQUIRE_FALSE(v.ok());
  CHECK(v.status().code() == Code::kInvalidArgument);
  CHECK_MESSAGE(v.status().message().find("byte offset 3") != std::string::npos,
                v.status().message());
}

TEST_CASE("an error message stays valid UTF-8 when the input breaks off inside a character") {
  for (const std::string& text :
       {std::string("tru\xc3\xa9"), std::string("[\xc3\xa9]"), std::string("1\xe2\x82\xac")}) {
    CAPTURE(text);
    StatusOr<Json> v = ParseJson(text);
    REQUIRE_FALSE(v.ok());
    CHECK_MESSAGE(CanonicalJson(Json(v.status().message())).ok(), v.status().message());
  }
}

TEST_CASE("empty text, comments and raw control characters are rejected") {
  for (const std::string& text : {std::string(""), std::string("   "), std::string("[1 /* c */]"),
                                  std::string("\"a\tb\""), std::string("\"a\0b\"", 5)}) {
    CAPTURE(text);
    StatusOr<Json> v = ParseJson(text);
    REQUIRE_FALSE(v.ok());
    CHECK(v.status().code() == Code::kInvalidArgument);
  }
}

// --- CanonicalJson ---------------------------------------------------------

TEST_CASE("canonical form sorts members and drops insignificant white space") {
  CHECK(Canonical(Json::parse(R"({ "b" : [ 1 , 2 ] , "a" : { "d":null, "c":true } })")) ==
        R"({"a":{"c":true,"d":null},"b":[1,2]})");
}

TEST_CASE("NaN and infinities cannot be canonicalized") {
  for (double bad :
       {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
        -std::numeric_limits<double>::infinity()}) {
    StatusOr<std::string> c = CanonicalJson(Json{{"x", Json::array({1, bad})}});
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().code() == Code::kInvalidArgument);
    CHECK(c.status().field() == "/x/1");
  }
}

TEST_CASE("negative zero canonicalizes as 0") {
  CHECK(Canonical(Json(-0.0)) == "0");
  CHECK(Canonical(Json::array({-0.0, 0.0, 0})) == "[0,0,0]");
}

TEST_CASE("integers are canonicalized as IEEE-754 doubles") {
  CHECK(Canonical(Json(int64_t{9007199254740992})) == "9007199254740992");
  // 2^53 + 1 is not a double; JCS rounds it like JavaScript would.
  CHECK(Canonical(Json(int64_t{9007199254740993})) == "9007199254740992");
  CHECK(Canonical(Json(std::numeric_limits<uint64_t>::max())) == "18446744073709552000");
  CHECK(Canonical(Json(std::numeric_limits<int64_t>::min())) == "-9223372036854776000");
  CHECK(Canonical(Json(1e21)) == "1e+21");
  CHECK(Canonical(Json(-5)) == "-5");
}

TEST_CASE("member names sort by UTF-16 code units, not UTF-8 bytes") {
  // U+E000 is 0xEE.. in UTF-8 (before 0xF0.. of U+1F600), but its UTF-16
  // unit 0xE000 comes after the surrogate 0xD83D of U+1F600.
  Json v = {{"\xee\x80\x80", 1}, {"\xf0\x9f\x98\x80", 2}};
  CHECK(Canonical(v) == "{\"\xf0\x9f\x98\x80\":2,\"\xee\x80\x80\":1}");
}

TEST_CASE("strings escape only what RFC 8785 requires") {
  CHECK(Canonical(Json(std::string("\b\t\n\f\r\"\\/\x01\x1f\x7f\xc3\xa9", 13))) ==
        "\"\\b\\t\\n\\f\\r\\\"\\\\/\\u0001\\u001f\x7f\xc3\xa9\"");
}

TEST_CASE("text between and after escapes is kept whole and in order") {
  std::string out;
  AppendJsonStringContent("", out);
  CHECK(out.empty());
  AppendJsonStringContent("say \"hi\"\tto\x02 \xc3\xa9t\xc3\xa9\\done", out);
  CHECK(out == "say \\\"hi\\\"\\tto\\u0002 \xc3\xa9t\xc3\xa9\\\\done");
  std::string plain = "prefix:";
  AppendJsonStringContent("no escapes at all", plain);
  CHECK(plain == "prefix:no escapes at all");
}

// nlohmann's serializer, an implementation apart from ours, as the
// reference: it refuses text that is not UTF-8 (its own decoder: no
// overlong forms, no surrogates) and, with ensure_ascii off, escapes what
// AppendJsonStringContent escapes, in the same spelling.
std::optional<std::string> ReferenceEscaped(const std::string& s) {
  try {
    const std::string quoted = Json(s).dump();
    return quoted.substr(1, quoted.size() - 2);
  } catch (const Json::exception&) {
    return std::nullopt;
  }
}

void CheckAgainstReference(const std::string& s) {
  CAPTURE(Json(s).dump(-1, ' ', true, Json::error_handler_t::replace));
  const std::optional<std::string> reference = ReferenceEscaped(s);
  REQUIRE(IsValidUtf8(s) == reference.has_value());
  if (!reference) return;
  std::string out;
  AppendJsonStringContent(s, out);
  CHECK(out == *reference);
}

TEST_CASE("utf8_check_and_escaping_agree_with_the_reference_at_every_offset_and_length") {
  // The word-at-a-time scans look at eight bytes at once: each special
  // sequence at every offset of texts from empty to several words long.
  const std::vector<std::string> specials = {
      "\"",           "\\",           std::string(1, '\0'), "\x01", "\x1f", "\x7f", "\x20",
      "\xc3\xa9",     "\xe2\x82\xac", "\xf0\x9f\x98\x80",   "\xff", "\x80", "\xc3", "\xe2\x82",
      "\xed\xa0\x80", "\xc0\xaf",     "\xf4\x90\x80\x80"};
  for (const std::string& special : specials) {
    for (size_t length = 0; length <= 24; ++length) {
      for (size_t at = 0; at <= length; ++at) {
        std::string s(length, 'a');
        for (size_t i = 0; i < length; ++i) s[i] = static_cast<char>('a' + i % 26);
        s.insert(at, special);
        CheckAgainstReference(s);
      }
    }
  }
  // Random bytes, mostly printable ASCII with some of everything else.
  uint64_t state = 0x9e3779b97f4a7c15ull;
  auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  for (int n = 0; n < 20000; ++n) {
    std::string s(next() % 40, ' ');
    for (char& c : s) {
      const uint64_t r = next();
      c = r % 8 == 0 ? static_cast<char>(r >> 8) : static_cast<char>(0x20 + (r >> 8) % 95);
    }
    CheckAgainstReference(s);
  }
}

TEST_CASE("a string holding invalid UTF-8 cannot be canonicalized") {
  StatusOr<std::string> value = CanonicalJson(Json{{"k", std::string("a\xff")}});
  REQUIRE_FALSE(value.ok());
  CHECK(value.status().code() == Code::kInvalidArgument);
  CHECK(value.status().field() == "/k");

  StatusOr<std::string> key = CanonicalJson(Json{{std::string("\xc0\x80"), 1}});
  REQUIRE_FALSE(key.ok());
  CHECK(key.status().code() == Code::kInvalidArgument);
}

TEST_CASE("binary values cannot be canonicalized") {
  StatusOr<std::string> c = CanonicalJson(Json::binary({1, 2, 3}));
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().code() == Code::kInvalidArgument);
}

TEST_CASE("parsing the canonical form gives back the canonical form") {
  const Json v = Json::parse(R"({"z":[1.5e300,0.1,-1e-7,123456789012],"\u00e9":"\u0001","a":{}})");
  const std::string once = Canonical(v);
  StatusOr<Json> reparsed = ParseJson(once);
  REQUIRE(reparsed.ok());
  CHECK(Canonical(*reparsed) == once);
}

// --- FormatJcsNumber and JsonPointerToken ----------------------------------

TEST_CASE("numbers use plain notation from 1e-7 up to below 1e21 and exponents outside") {
  struct Case {
    double value;
    const char* expected;
  };
  for (const Case& c :
       {Case{0, "0"}, Case{-0.0, "0"}, Case{1, "1"}, Case{-1.5, "-1.5"}, Case{0.1, "0.1"},
        Case{100, "100"}, Case{1e20, "100000000000000000000"}, Case{1e21, "1e+21"},
        Case{1.5e21, "1.5e+21"}, Case{1e-6, "0.000001"}, Case{1.25e-6, "0.00000125"},
        Case{1e-7, "1e-7"}, Case{-1.5e-7, "-1.5e-7"}, Case{123.456, "123.456"},
        Case{5e-324, "5e-324"}, Case{1.7976931348623157e308, "1.7976931348623157e+308"},
        Case{333333333.33333329, "333333333.3333333"}}) {
    CAPTURE(c.value);
    CHECK(FormatJcsNumber(c.value) == c.expected);
  }
}

TEST_CASE("a pointer token escapes tilde before slash") {
  CHECK(JsonPointerToken("plain") == "plain");
  CHECK(JsonPointerToken("a/b") == "a~1b");
  CHECK(JsonPointerToken("~1") == "~01");
  CHECK(JsonPointerToken("") == "");
}

TEST_CASE("text cut at a byte limit never splits a UTF-8 character") {
  // "aé€😀": 1 + 2 + 3 + 4 bytes.
  const std::string text = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80";
  const size_t expected[] = {0, 1, 1, 3, 3, 3, 6, 6, 6, 6, 10, 10};
  for (size_t limit = 0; limit <= text.size() + 1; ++limit) {
    CAPTURE(limit);
    std::string_view cut = Utf8Prefix(text, limit);
    CHECK(cut.size() == expected[limit]);
    CHECK(IsValidUtf8(cut));
    std::string marked = CutUtf8(text, limit);
    CHECK(IsValidUtf8(marked));
    CHECK(CanonicalJson(Json(marked)).ok());
  }
  CHECK(CutUtf8(text, 2) == "a...[cut]");
  CHECK(CutUtf8(text, 10) == text);
  CHECK(CutUtf8("abc", 2, "~") == "ab~");
}

TEST_CASE("a byte cut inside text that is not UTF-8 stays a byte cut") {
  // Four continuation bytes in a row are no character: nothing to keep whole.
  const std::string junk = "ab\x80\x80\x80\x80\x80";
  CHECK(Utf8Prefix(junk, 6).size() == 6);
}

}  // namespace
TEST_CASE("json_object_writer_text_parses_back_to_the_members_it_was_given") {
  std::string text = JsonObjectWriter()
                         .Str("path", "/v1/x?\"q\"\t\xe2\x82\xac\x01")
                         .Int("n", -3)
                         .Double("ms", 1.25)
                         .Double("inf", std::numeric_limits<double>::infinity())
                         .Bool("ok", false)
                         .Raw("args", R"({"a":[1,2]})")
                         .Take();
  Json parsed = Json::parse(text);
  CHECK(parsed == Json{{"path", "/v1/x?\"q\"\t\xe2\x82\xac\x01"},
                       {"n", -3},
                       {"ms", 1.25},
                       {"inf", nullptr},
                       {"ok", false},
                       {"args", {{"a", {1, 2}}}}});
  CHECK(JsonObjectWriter().Take() == "{}");
}

TEST_CASE("json_object_writer_writes_text_that_is_not_utf8_as_empty_and_names_it") {
  JsonObjectWriter w;
  w.Str("good", "ok").Str("bad", "\xff\xfe").Str("worse", "\xc3");
  CHECK(w.bad() == "bad");
  std::string text = w.Take();
  CHECK(Json::parse(text) == Json{{"good", "ok"}, {"bad", ""}, {"worse", ""}});
}

TEST_CASE("text that is not UTF-8 is made storable by replacing only its bad bytes") {
  CHECK(ValidUtf8Text("plain") == "plain");
  CHECK(ValidUtf8Text("caf\xc3\xa9") == "caf\xc3\xa9");
  CHECK(ValidUtf8Text("caf\xe9 ok") == "caf\xef\xbf\xbd ok");
  CHECK(ValidUtf8Text("\xed\xa0\x80", "?") == "???");  // an encoded surrogate, byte by byte
  CHECK(ValidUtf8Text("ab\xe2\x82", "?") == "ab??");   // cut inside a character
  CHECK(IsValidUtf8(ValidUtf8Text("\xff\xfe\x80 x \xf4\x90\x80\x80")));
}

}  // namespace idem
