#include "daemon/config/yaml_document.h"

#include <doctest/doctest.h>

namespace idem {
namespace {

YamlDocument MustParse(const std::string& text) {
  auto doc = ParseYaml(text, "t.yaml");
  REQUIRE_MESSAGE(doc.ok(), doc.status().ToString());
  return std::move(doc).value();
}

TEST_CASE("plain scalars get YAML 1.2 core types and quoted ones stay strings") {
  YamlDocument doc = MustParse(R"(
int: 12
neg: -7
hex: 0x1f
octal: 0o17
float: 1.5
exp: 1e3
dot: .5
yes_bool: true
no_bool: False
null1: ~
null2:
word: hello
quoted_int: "12"
single_quoted_bool: 'true'
yes_word: yes
version: 1.2.3
block: |
  12
tagged: !!str 42
tagged_float: !!float 3
big: 123456789012345678901234
)");
  const Json& v = doc.value;
  CHECK(v["int"] == 12);
  CHECK(v["int"].is_number_integer());
  CHECK(v["neg"] == -7);
  CHECK(v["hex"] == 31);
  CHECK(v["octal"] == 15);
  CHECK(v["float"].is_number_float());
  CHECK(v["float"] == 1.5);
  CHECK(v["exp"] == 1000.0);
  CHECK(v["dot"] == 0.5);
  CHECK(v["yes_bool"] == true);
  CHECK(v["no_bool"] == false);
  CHECK(v["null1"].is_null());
  CHECK(v["null2"].is_null());
  CHECK(v["word"] == "hello");
  CHECK(v["quoted_int"] == "12");
  CHECK(v["single_quoted_bool"] == "true");
  CHECK(v["yes_word"] == "yes");
  CHECK(v["version"] == "1.2.3");
  CHECK(v["block"] == "12\n");
  CHECK(v["tagged"] == "42");
  CHECK(v["tagged_float"].is_number_float());
  CHECK(v["big"].is_number_float());
}

TEST_CASE("lines are remembered per JSON pointer, keys and list items alike") {
  YamlDocument doc = MustParse("a:\n  b: 1\n  list:\n    - x\n    - {c/d: 2}\ne: 3\n");
  CHECK(doc.LineOf("/a") == 1);
  CHECK(doc.LineOf("/a/b") == 2);
  CHECK(doc.LineOf("/a/list/0") == 4);
  CHECK(doc.LineOf("/a/list/1/c~1d") == 5);
  CHECK(doc.LineOf("/e") == 6);
  CHECK(doc.LineOf("/a/b/missing") == 2);  // the nearest known ancestor
  Status st = doc.Error("/a/list/1", "bad");
  CHECK(st.message() == "t.yaml:5: /a/list/1: bad");
  CHECK(st.field() == "/a/list/1");
}

TEST_CASE("a duplicate key is an error at its second occurrence") {
  auto doc = ParseYaml("a: 1\nb: 2\na: 3\n", "t.yaml");
  REQUIRE_FALSE(doc.ok());
  CHECK(doc.status().message() == "t.yaml:3: /a: duplicate key 'a'");
}

TEST_CASE("a second document is refused with its line, not dropped; --- before one is fine") {
  auto two = ParseYaml("server:\n  listen: x\n---\nauth:\n  tokens: []\n", "t.yaml");
  REQUIRE_FALSE(two.ok());
  CHECK(two.status().message().find("t.yaml:4") != std::string::npos);
  CHECK(two.status().message().find("second YAML document") != std::string::npos);
  // A syntax error in a later document is an error too.
  CHECK_FALSE(ParseYaml("a: 1\n---\nb: [1,\n", "t.yaml").ok());
  auto leading = ParseYaml("---\na: 1\n", "t.yaml");
  REQUIRE_MESSAGE(leading.ok(), leading.status().ToString());
  CHECK(leading->value["a"] == 1);
  auto trailing = ParseYaml("a: 1\n...\n", "t.yaml");
  REQUIRE_MESSAGE(trailing.ok(), trailing.status().ToString());
  CHECK(ParseYaml("", "t.yaml").ok());
}

TEST_CASE("a syntax error names the file and line") {
  auto doc = ParseYaml("a: 1\nb: [1,\n", "t.yaml");
  REQUIRE_FALSE(doc.ok());
  CHECK(doc.status().code() == Code::kInvalidArgument);
  CHECK(doc.status().message().find("t.yaml:") == 0);
  CHECK(doc.status().message().find("yaml syntax error") != std::string::npos);
}

TEST_CASE("a syntax error on a tab-indented line says YAML indents with spaces") {
  auto doc = ParseYaml("server:\n\tlisten: 127.0.0.1:1\n", "t.yaml");
  REQUIRE_FALSE(doc.ok());
  CHECK_MESSAGE(doc.status().message().find("YAML indents with spaces only") != std::string::npos,
                doc.status().message());
  auto other = ParseYaml("a: [1, 2\n", "t.yaml");
  REQUIRE_FALSE(other.ok());
  CHECK(other.status().message().find("tab") == std::string::npos);
}

TEST_CASE("infinities and NaN are refused because JSON cannot hold them") {
  auto doc = ParseYaml("a: .inf\n", "t.yaml");
  REQUIRE_FALSE(doc.ok());
  CHECK(doc.status().field() == "/a");
}

TEST_CASE("a number past a double is refused as such, not read as text") {
  // Read as the string "1e400", temperature: 1e400 was "must be number, not string".
  for (const char* text : {"a: 1e400\n", "a: -2.5e999\n"}) {
    CAPTURE(text);
    auto doc = ParseYaml(text, "t.yaml");
    REQUIRE_FALSE(doc.ok());
    CHECK(doc.status().field() == "/a");
    CHECK(doc.status().message().find("out of a double's range") != std::string::npos);
  }
  CHECK(MustParse("a: \"1e400\"\nb: 1e308\n").value == Json({{"a", "1e400"}, {"b", 1e308}}));
}

// Found by tests/fuzz/fuzz_config: a config string with a stray byte made
// the JSON Schema check (valijson's minLength) read past a table.
TEST_CASE("a value or a key that is not valid UTF-8 is refused with its place") {
  auto value = ParseYaml("a: ok\nb: caf\xe9\n", "t.yaml");
  REQUIRE_FALSE(value.ok());
  CHECK(value.status().code() == Code::kInvalidArgument);
  CHECK(value.status().field() == "/b");
  CHECK(value.status().message().find("t.yaml:2:") == 0);
  auto quoted = ParseYaml("a: \"\xff\xfe\"\n", "t.yaml");
  REQUIRE_FALSE(quoted.ok());
  CHECK(quoted.status().field() == "/a");
  auto key = ParseYaml("a:\n  k\xc3: 1\n", "t.yaml");
  REQUIRE_FALSE(key.ok());
  CHECK(key.status().field() == "/a/?");
  CHECK(MustParse("a: caf\xc3\xa9\n").value["a"] == "caf\xc3\xa9");
}

TEST_CASE("nesting deeper than the limit is an error, not a stack overflow") {
  std::string deep;
  for (int i = 0; i < 100; ++i) deep += "[";
  for (int i = 0; i < 100; ++i) deep += "]";
  auto doc = ParseYaml("a: " + deep + "\n", "t.yaml");
  REQUIRE_FALSE(doc.ok());
  CHECK(doc.status().message().find("nested deeper than 64") != std::string::npos);
}

TEST_CASE("aliases that expand past the value limit are refused, not expanded into all memory") {
  // Nine levels of nine aliases each: 9^9 values from 10 short lines.
  std::string text = "a0: &a0 [x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i <= 9; ++i) {
    const std::string prev = "*a" + std::to_string(i - 1);
    text += "a" + std::to_string(i) + ": &a" + std::to_string(i) + " [";
    for (int j = 0; j < 9; ++j) text += (j ? ", " : "") + prev;
    text += "]\n";
  }
  auto doc = ParseYaml(text, "t.yaml");
  REQUIRE_FALSE(doc.ok());
  CHECK_MESSAGE(doc.status().message().find("more than 100000 values once its aliases are "
                                            "expanded") != std::string::npos,
                doc.status().message());
  // A few aliases are fine.
  YamlDocument small = MustParse("base: &b {attempts: 3}\nother: *b\n");
  CHECK(small.value["other"]["attempts"] == 3);
}

TEST_CASE("aliases of a long string are refused past the expanded text limit") {
  // 380 KB of file, 4 GB once expanded.
  std::string text = "junk:\n  - &a \"" + std::string(100'000, 'x') + "\"\n";
  for (int i = 0; i < 40'000; ++i) text += "  - *a\n";
  auto doc = ParseYaml(text, "t.yaml");
  REQUIRE_FALSE(doc.ok());
  CHECK_MESSAGE(
      doc.status().message().find("MiB of text once its aliases are expanded") != std::string::npos,
      doc.status().message());
}

TEST_CASE("a merge key is refused with a way out; a quoted << is an ordinary key") {
  auto doc = ParseYaml("r: &r {attempts: 3}\nretry:\n  <<: *r\n  base: 1s\n", "t.yaml");
  REQUIRE_FALSE(doc.ok());
  CHECK_MESSAGE(doc.status().message().find("t.yaml:3: /retry/<<: YAML merge keys (<<) are not "
                                            "supported") != std::string::npos,
                doc.status().message());
  CHECK(MustParse("m:\n  \"<<\": 1\n").value["m"]["<<"] == 1);
}

TEST_CASE("a document larger than the size limit is refused before it is parsed") {
  auto doc = ParseYaml("k: " + std::string(5 << 20, 'x') + "\n", "t.yaml");
  REQUIRE_FALSE(doc.ok());
  CHECK_MESSAGE(doc.status().message().find("a config file may hold at most") != std::string::npos,
                doc.status().message());
}

TEST_CASE("schema errors are reported with their lines") {
  auto schema = JsonSchema::Create(Json::parse(
      R"({"type": "object", "additionalProperties": false, "properties": {"a": {"type": "integer"}}})"));
  REQUIRE(schema.ok());
  YamlDocument doc = MustParse("a: x\nb: 1\n");
  Status st = doc.Check(**schema);
  CHECK(st.message() == "t.yaml:1: /a: must be integer, not string\nt.yaml:2: /b: unknown key");
  CHECK(st.field() == "/a");
}

}  // namespace
}  // namespace idem
