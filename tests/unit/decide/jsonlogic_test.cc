#include "daemon/decide/jsonlogic.h"

#include <doctest/doctest.h>

#include <string>
#include <thread>
#include <vector>

namespace idem {
namespace {

// One row: a rule and data (JSON text) and the expected result (JSON text).
// Expected values are what json-logic-js 2.0.5 answers, mapped to JSON as
// jsonlogic.h says (undefined, NaN, Infinity -> null; -0 -> 0).
struct Row {
  const char* rule;
  const char* data;
  const char* want;
};

void CheckRows(const std::vector<Row>& rows) {
  for (const Row& row : rows) {
    CAPTURE(row.rule);
    CAPTURE(row.data);
    StatusOr<Json> got = EvalJsonLogic(Json::parse(row.rule), Json::parse(row.data));
    REQUIRE_MESSAGE(got.ok(), got.status().ToString());
    CHECK(got->dump() == Json::parse(row.want).dump());
  }
}

Status EvalError(const char* rule, const char* data = "null", const JsonLogicLimits& limits = {}) {
  StatusOr<Json> got = EvalJsonLogic(Json::parse(rule), Json::parse(data), limits);
  if (got.ok()) return Internal("unexpectedly evaluated to " + got->dump());
  return got.status();
}

TEST_CASE("truthiness follows JSONLogic: [] is falsy, \"0\" and {} are truthy") {
  CHECK_FALSE(JsonLogicTruthy(Json::parse("null")));
  CHECK_FALSE(JsonLogicTruthy(Json::parse("false")));
  CHECK_FALSE(JsonLogicTruthy(Json::parse("0")));
  CHECK_FALSE(JsonLogicTruthy(Json::parse("0.0")));
  CHECK_FALSE(JsonLogicTruthy(Json::parse("\"\"")));
  CHECK_FALSE(JsonLogicTruthy(Json::parse("[]")));
  CHECK(JsonLogicTruthy(Json::parse("\"0\"")));
  CHECK(JsonLogicTruthy(Json::parse("\"false\"")));
  CHECK(JsonLogicTruthy(Json::parse("{}")));
  CHECK(JsonLogicTruthy(Json::parse("[0]")));
  CHECK(JsonLogicTruthy(Json::parse("-1")));
  CheckRows({
      {R"({"!!": [[]]})", "null", "false"},
      {R"({"!!": ["0"]})", "null", "true"},
      {R"({"!!": {"/": [0, 0]}})", "null", "false"},
      {R"({"!": [[]]})", "null", "true"},
      {R"({"!": []})", "null", "true"},
      {R"({"!": true})", "null", "false"},
      {R"({"!": [false, true]})", "null", "true"},
  });
}

TEST_CASE("== is JavaScript's loose equality") {
  CheckRows({
      {R"({"==": [1, "1"]})", "null", "true"},
      {R"({"==": [0, ""]})", "null", "true"},
      {R"({"==": [0, " \t\n"]})", "null", "true"},
      {R"({"==": ["1", "01"]})", "null", "false"},
      {R"({"==": [1, "01"]})", "null", "true"},
      {R"({"==": ["0x10", 16]})", "null", "true"},
      {R"({"==": [null, 0]})", "null", "false"},
      {R"({"==": [null, false]})", "null", "false"},
      {R"({"==": [null, {"and": []}]})", "null", "true"},
      {R"({"==": [null]})", "null", "true"},
      {R"({"==": [true, "1"]})", "null", "true"},
      {R"({"==": [false, []]})", "null", "true"},
      {R"({"==": [false, [0]]})", "null", "true"},
      {R"({"==": [[1, 2], "1,2"]})", "null", "true"},
      {R"({"==": [[1], [1]]})", "null", "false"},  // two array literals: two objects
      {R"({"==": [{"var": "a"}, {"var": "a"}]})", R"({"a": [1]})", "true"},  // one object
      {R"({"==": [{"var": "o"}, "[object Object]"]})", R"({"o": {"k": 1}})", "true"},
      {R"({"==": [{"/": [0, 0]}, {"/": [0, 0]}]})", "null", "false"},
      {R"({"==": [{"-": [0]}, 0]})", "null", "true"},
      {R"({"!=": [1, "1"]})", "null", "false"},
      {R"({"!=": [1, 2]})", "null", "true"},
  });
}

TEST_CASE("=== and !== compare type and value; arrays and objects by identity") {
  CheckRows({
      {R"({"===": [1, 1]})", "null", "true"},
      {R"({"===": [1, "1"]})", "null", "false"},
      {R"({"===": [1.0, 1]})", "null", "true"},
      {R"({"===": [null, {"and": []}]})", "null", "false"},
      {R"({"===": []})", "null", "true"},  // undefined === undefined
      {R"({"===": [[], []]})", "null", "false"},
      {R"({"===": [{"var": "a"}, {"var": "a"}]})", R"({"a": {"x": 1}})", "true"},
      {R"({"!==": [1, "1"]})", "null", "true"},
      {R"({"!==": ["a"]})", "null", "true"},
  });
}

TEST_CASE("relational operators compare strings by code unit and anything else as numbers") {
  CheckRows({
      {R"({">": [2, 1]})", "null", "true"},
      {R"({">": ["10", "9"]})", "null", "false"},  // both strings
      {R"({">": ["10", 9]})", "null", "true"},     // one number
      {R"({">": ["abc", 1]})", "null", "false"},   // NaN
      {R"({">": [null, -1]})", "null", "true"},
      {R"({">": [[2], 1]})", "null", "true"},
      {R"({">": [[1, 2], 1]})", "null", "false"},
      {R"({">": [{"var": "missing"}, 0]})", "{}", "false"},
      {R"({">=": ["1", 1]})", "null", "true"},
      {R"({">=": [null, 0]})", "null", "true"},
      {R"({">=": [{"/": [0, 0]}, 0]})", "null", "false"},
      {R"({"<": ["a", "aa"]})", "null", "true"},
      {R"({"<": ["B", "a"]})", "null", "true"},
      // U+FF61 sorts after the surrogates of U+1F600 in UTF-16.
      {R"({"<": ["\uff61", "\ud83d\ude00"]})", "null", "false"},
      {R"({"<": [[], 1]})", "null", "true"},
      {R"({"<=": [1, 1]})", "null", "true"},
      {R"({"<=": ["a", {"var": "missing"}]})", "{}", "false"},
  });
}

TEST_CASE("< and <= with three arguments test that the middle one is between") {
  CheckRows({
      {R"({"<": [1, 2, 3]})", "null", "true"},
      {R"({"<": [1, 1, 3]})", "null", "false"},
      {R"({"<": [1, 4, 3]})", "null", "false"},
      {R"({"<": ["1", 2, "3"]})", "null", "true"},
      {R"({"<": [1, 2, {"and": []}]})", "null", "true"},  // undefined third: two-argument form
      {R"({"<=": [1, 1, 3]})", "null", "true"},
      {R"({"<=": [1, 4, 3]})", "null", "false"},
      {R"({"<=": [{"var": "n"}, 5, 10]})", R"({"n": "4"})", "true"},
  });
}

TEST_CASE("and / or short-circuit and return the deciding value") {
  CheckRows({
      {R"({"and": [true, 1, "x"]})", "null", R"("x")"},
      {R"({"and": [true, 0, "x"]})", "null", "0"},
      {R"({"and": [true, [], "x"]})", "null", "[]"},
      {R"({"and": []})", "null", "null"},
      {R"({"and": "x"})", "null", R"("x")"},
      {R"({"or": [false, 0, "", "x", "y"]})", "null", R"("x")"},
      {R"({"or": [false, 0, [], null]})", "null", "null"},
      {R"({"or": []})", "null", "null"},
      // The second argument would throw; it is never applied.
      {R"({"and": [{"var": "a"}, {"*": []}]})", R"({"a": 0})", "0"},
      {R"({"or": [{"var": "a"}, {"*": []}]})", R"({"a": 1})", "1"},
  });
}

TEST_CASE("if and ?: chain conditions and return null without an else") {
  CheckRows({
      {R"({"if": [true, "yes", "no"]})", "null", R"("yes")"},
      {R"({"if": [[], "yes", "no"]})", "null", R"("no")"},
      {R"({"if": ["0", "yes", "no"]})", "null", R"("yes")"},
      {R"({"if": [false, "a", true, "b", "c"]})", "null", R"("b")"},
      {R"({"if": [false, "a", false, "b", "c"]})", "null", R"("c")"},
      {R"({"if": [false, "a", false, "b"]})", "null", "null"},
      {R"({"if": []})", "null", "null"},
      {R"({"if": "only"})", "null", R"("only")"},
      {R"({"?:": [{"<": [{"var": "t"}, 0]}, "ice", {"<": [{"var": "t"}, 100]}, "water", "steam"]})",
       R"({"t": 55})", R"("water")"},
      {R"({"if": [true, "safe", {"*": []}]})", "null", R"("safe")"},
  });
}

TEST_CASE("var reads dot paths, indices and lengths, with a default, and \"\" is the data") {
  CheckRows({
      {R"({"var": "a"})", R"({"a": 1})", "1"},
      {R"({"var": ["a"]})", R"({"a": 1})", "1"},
      {R"({"var": "a.b.c"})", R"({"a": {"b": {"c": "deep"}}})", R"("deep")"},
      {R"({"var": "a.b"})", R"({"a": {"b": null}})", "null"},
      {R"({"var": ["a.b.c", "d"]})", R"({"a": {"b": null}})", R"("d")"},
      {R"({"var": ["a.b", "d"]})", R"({"a": {"b": null}})", "null"},  // found: null
      {R"({"var": ["x", 5]})", R"({"x": 0})", "0"},
      {R"({"var": ["x", "d"]})", "{}", R"("d")"},
      {R"({"var": ""})", R"({"a": 1})", R"({"a": 1})"},
      {R"({"var": []})", "[1, 2]", "[1, 2]"},
      {R"({"var": null})", R"("whole")", R"("whole")"},
      {R"({"var": 1})", R"(["a", "b"])", R"("b")"},
      {R"({"var": "01"})", R"(["a", "b"])", "null"},
      {R"({"var": "length"})", R"(["a", "b"])", "2"},
      {R"({"var": "a.length"})", R"({"a": "h\u00e9llo"})", "5"},
      {R"({"var": "a.1"})", R"({"a": "h\u00e9llo"})", R"("\u00e9")"},
      {R"({"var": "a.length"})", R"({"a": {"length": 7}})", "7"},
      {R"({"var": 1.5})", "[[0], [1, 2, 3, 4, 5, 6]]", "6"},
      {R"({"var": [["a", "b"]]})", R"({"a,b": "joined"})", R"("joined")"},
      {R"({"var": "a..b"})", R"({"a": {"": {"b": 3}}})", "3"},
      {R"({"var": "x"})", "5", "null"},
      {R"({"var": {"cat": ["a", ".", "b"]}})", R"({"a": {"b": "built"}})", R"("built")"},
      {R"({"var": "objs.1.x"})", R"({"objs": [{"x": 1}, {"x": 2}]})", "2"},
      {R"({"var": "a.constructor"})", R"({"a": {}})", "null"},  // inherited: not data
  });
}

TEST_CASE("an evaluation lists what it could not judge: absent or null vars, comparisons of NaN") {
  auto unresolved = [](const char* rule, const char* data) {
    std::vector<std::string> out;
    StatusOr<Json> r = EvalJsonLogic(Json::parse(rule), Json::parse(data), JsonLogicLimits{}, &out);
    REQUIRE_MESSAGE(r.ok(), r.status().ToString());
    return out;
  };
  using V = std::vector<std::string>;
  const std::string nan = "a comparison has a value that is not a number";
  // The read first, then the comparison it spoiled.
  CHECK(unresolved(R"({">": [{"var": "args.amount"}, 100]})", R"({"args": {}})") ==
        V{"args.amount is absent", nan});
  CHECK(unresolved(R"({">": [{"var": "args.amount"}, 100]})", "{}") ==
        V{"args.amount is absent", nan});
  CHECK(unresolved(R"({">": [{"var": "a"}, 1]})", R"({"a": null})") == V{"a is null", nan});
  CHECK(unresolved(R"({">": [{"var": "a"}, 1]})", R"({"a": true})") == V{nan});
  CHECK(unresolved(R"({"==": [{"var": "a"}, 1]})", R"({"a": null})") == V{"a is null"});
  // A value that is there but no number cannot be compared either.
  CHECK(unresolved(R"({">": [{"var": "a"}, 100]})", R"({"a": "5,000"})") == V{nan});
  CHECK(unresolved(R"({">": [{"var": "a"}, 100]})", R"({"a": {"value": 5000}})") == V{nan});
  // An array compares as its text ([50] as 50): no amount was judged.
  for (const char* a : {R"([50])", R"(["50"])", R"([[99]])", R"([])"}) {
    CAPTURE(a);
    CHECK(unresolved(R"({">": [{"var": "a"}, 100]})",
                     (std::string(R"({"a": )") + a + "}").c_str()) == V{nan});
    CHECK(unresolved(R"({"<=": [0, {"var": "a"}, 100]})",
                     (std::string(R"({"a": )") + a + "}").c_str())
              .size() >= 1);
  }
  CHECK(unresolved(R"({">": [{"var": "a"}, 100]})", R"({"a": "5000"})").empty());  // a number
  CHECK(unresolved(R"({">": [{"var": "a"}, 1]})", R"({"a": 2})").empty());
  // A default says what absence means.
  CHECK(unresolved(R"({">": [{"var": ["a", 0]}, 1]})", "{}").empty());
  // missing and missing_some ask about absence; they are not reads.
  CHECK(unresolved(R"({"missing": ["a", "b"]})", "{}").empty());
  // A branch not taken reads nothing; one taken does.
  CHECK(unresolved(R"({"if": [true, 1, {"var": "x"}]})", "{}").empty());
  CHECK(unresolved(R"({"if": [false, 1, {"var": "x"}]})", "{}") == V{"x is absent"});
  // An `or` that falls back to a next operand covers what the first missed;
  // its last operand does not.
  CHECK(unresolved(R"({">": [{"or": [{"var": "a"}, 0]}, 1]})", "{}").empty());
  CHECK(unresolved(R"({"or": [{"var": "x"}, {"var": "y"}]})", "{}") == V{"y is absent"});
  // An `and` that stops at a falsy read keeps it.
  CHECK(unresolved(R"({"and": [{"var": "x"}, true]})", "{}") == V{"x is absent"});
  // Inside map, paths are the element's.
  CHECK(unresolved(R"({"map": [{"var": "xs"}, {"var": "k"}]})", R"({"xs": [{"k": 1}, {}]})") ==
        V{"k is absent"});
}

TEST_CASE("missing lists absent or empty keys; missing_some needs a minimum present") {
  CheckRows({
      {R"({"missing": ["a", "b"]})", R"({"a": "apple", "c": "carrot"})", R"(["b"])"},
      {R"({"missing": ["a", "b"]})", R"({"a": "apple", "b": "banana"})", "[]"},
      {R"({"missing": "a"})", "{}", R"(["a"])"},
      {R"({"missing": [["a", "b"], "c"]})", R"({"b": 1})", R"(["a"])"},  // first array wins
      {R"({"missing": ["a"]})", R"({"a": ""})", R"(["a"])"},
      {R"({"missing": ["a"]})", R"({"a": 0})", "[]"},
      {R"({"missing": ["a.c"]})", R"({"a": {"b": 1}})", R"(["a.c"])"},
      {R"({"missing": {"merge": ["a", "b"]}})", R"({"b": 2})", R"(["a"])"},
      {R"({"missing_some": [1, ["a", "b", "c"]]})", R"({"a": "apple"})", "[]"},
      {R"({"missing_some": [2, ["a", "b", "c"]]})", R"({"a": "apple"})", R"(["b", "c"])"},
      {R"({"missing_some": ["1", ["a", "b"]]})", R"({"a": 1})", "[]"},
      {R"({"missing_some": [1, "a"]})", "{}", R"(["a"])"},
      {R"({"missing_some": [1, {"var": "opts"}]})", R"({"opts": ["x", "y"], "y": 1})", "[]"},
  });
  CHECK(EvalError(R"({"missing_some": [1, null]})", "{}").code() == Code::kInvalidArgument);
  // The keys are applied as a rule once more: a one-key object is an operator.
  CHECK(
      EvalError(R"({"missing_some": [1, {"var": "opts"}]})", R"({"opts": {"length": 2}})").code() ==
      Code::kInvalidArgument);
}

TEST_CASE("in finds substrings and array members (strictly equal)") {
  CheckRows({
      {R"({"in": ["Spring", "Springfield"]})", "null", "true"},
      {R"({"in": ["spring", "Springfield"]})", "null", "false"},
      {R"({"in": ["", "abc"]})", "null", "true"},
      {R"({"in": ["", ""]})", "null", "false"},  // an empty haystack is falsy
      {R"({"in": [1, "a1b"]})", "null", "true"},
      {R"({"in": [null, "xnullx"]})", "null", "true"},
      {R"({"in": ["b", ["a", "b"]]})", "null", "true"},
      {R"({"in": [1, ["1", 2]]})", "null", "false"},
      {R"({"in": [{"/": [0, 0]}, [{"/": [0, 0]}]]})", "null", "false"},
      {R"({"in": ["a", null]})", "null", "false"},
      {R"({"in": [1, 12]})", "null", "false"},
      {R"({"in": ["a", {"var": "o"}]})", R"({"o": {"a": 1}})", "false"},
      {R"({"in": [{"var": "l.0"}, {"var": "l"}]})", R"({"l": [{"k": 1}]})", "true"},
      {R"({"in": ["@", {"var": "email"}]})", R"({"email": "someone@example.com"})", "true"},
  });
}

TEST_CASE("cat joins JavaScript string forms; null and undefined are empty") {
  CheckRows({
      {R"({"cat": ["I love", " pie"]})", "null", R"("I love pie")"},
      {R"({"cat": []})", "null", R"("")"},
      {R"({"cat": [1, 2.5, true, null, {"and": []}, "x"]})", "null", R"("12.5truex")"},
      {R"({"cat": [[1, [2, 3]], [null], []]})", "null", R"("1,2,3")"},
      {R"({"cat": [0.1, 1e21, 1e-7, -0.0]})", "null", R"("0.11e+211e-70")"},
      {R"({"cat": [{"/": [1, 3]}, " ", {"/": [0, 0]}, " ", {"/": [-1, 0]}]})", "null",
       R"("0.3333333333333333 NaN -Infinity")"},
      {R"({"cat": [{"var": "o"}]})", R"({"o": {"a": 1}})", R"("[object Object]")"},
  });
}

TEST_CASE("substr takes negative starts and PHP-style negative lengths") {
  CheckRows({
      {R"({"substr": ["jsonlogic", 4]})", "null", R"("logic")"},
      {R"({"substr": ["jsonlogic", -5]})", "null", R"("logic")"},
      {R"({"substr": ["jsonlogic", 1, 3]})", "null", R"("son")"},
      {R"({"substr": ["jsonlogic", 4, -2]})", "null", R"("log")"},
      {R"({"substr": ["jsonlogic", 0, -20]})", "null", R"("")"},
      {R"({"substr": ["jsonlogic", 20]})", "null", R"("")"},
      {R"({"substr": ["jsonlogic", -20]})", "null", R"("jsonlogic")"},
      {R"({"substr": ["jsonlogic", 0, null]})", "null", R"("")"},
      {R"({"substr": ["jsonlogic", "2", "3"]})", "null", R"("onl")"},
      {R"({"substr": ["jsonlogic", 2, "-1"]})", "null", R"("")"},  // 7 + "-1" is "7-1"
      {R"({"substr": ["jsonlogic", 1.9, 2.9]})", "null", R"("so")"},
      {R"({"substr": [12345, 1, 2]})", "null", R"("23")"},
      {R"({"substr": [null, 1]})", "null", R"("ull")"},
      {R"({"substr": ["h\u00e9llo", 1, 3]})", "null", R"("\u00e9ll")"},
  });
}

TEST_CASE("+ and * use parseFloat; a lone * argument comes back unchanged") {
  CheckRows({
      {R"({"+": [1, 2]})", "null", "3"},
      {R"({"+": []})", "null", "0"},
      {R"({"+": "3.14"})", "null", "3.14"},
      {R"({"+": ["3.14abc"]})", "null", "3.14"},
      {R"({"+": ["abc"]})", "null", "null"},  // NaN
      {R"({"+": [" \n 12"]})", "null", "12"},
      {R"({"+": ["0x10"]})", "null", "0"},
      {R"({"+": ["1e"]})", "null", "1"},
      {R"({"+": ["-.5e1"]})", "null", "-5"},
      {R"({"+": [true]})", "null", "null"},
      {R"({"+": [[1, 2]]})", "null", "1"},
      {R"({"+": [0.1, 0.2]})", "null", "0.30000000000000004"},
      {R"({"+": ["1", "2"]})", "null", "3"},
      {R"({"+": [1e308, 1e308]})", "null", "null"},  // Infinity
      {R"({"*": [2, 3, 4]})", "null", "24"},
      {R"({"*": ["2", "3x"]})", "null", "6"},
      {R"({"*": ["3"]})", "null", R"("3")"},
      {R"({"*": [[1, 2]]})", "null", "[1, 2]"},
      {R"({"*": [null, 5]})", "null", "null"},
      {R"({"<": [{"/": [1, {"*": [-1, 0]}]}, 0]})", "null", "true"},      // -0
      {R"({"<": [{"/": [1, {"*": [-1, 0, 5]}]}, 0]})", "null", "false"},  // parseFloat(-0) is 0
  });
  Status no_args = EvalError(R"({"*": []})");
  CHECK(no_args.code() == Code::kInvalidArgument);
}

TEST_CASE("- / % use JavaScript's ToNumber") {
  CheckRows({
      {R"({"-": [5, 3]})", "null", "2"},
      {R"({"-": [2]})", "null", "-2"},
      {R"({"-": ["5", "3"]})", "null", "2"},
      {R"({"-": ["5x", 3]})", "null", "null"},
      {R"({"-": ["", 3]})", "null", "-3"},
      {R"({"-": [" 0x10 ", 1]})", "null", "15"},
      {R"({"-": ["0b101", 0]})", "null", "5"},
      {R"({"-": ["0o17", 0]})", "null", "15"},
      {R"({"-": ["-0x10", 0]})", "null", "null"},
      {R"({"-": [null, 1]})", "null", "-1"},
      {R"({"-": [[5], [2]]})", "null", "3"},
      {R"({"-": []})", "null", "null"},
      {R"({"-": [5, {"and": []}]})", "null", "-5"},  // undefined second: negation
      {R"({"-": ["1e400", 1]})", "null", "null"},
      {R"({"/": [1, 3]})", "null", "0.3333333333333333"},
      {R"({"/": [1, 0]})", "null", "null"},
      {R"({"/": ["9", "3"]})", "null", "3"},
      {R"({"%": [-7, 3]})", "null", "-1"},
      {R"({"%": [5.5, 2]})", "null", "1.5"},
      {R"({"%": [1, 0]})", "null", "null"},
      {R"({"%": [5, {"/": [1, 0]}]})", "null", "5"},
  });
}

TEST_CASE("min and max coerce to numbers; no arguments give infinities") {
  CheckRows({
      {R"({"min": [1, 2, 3]})", "null", "1"},
      {R"({"max": [1, 2, 3]})", "null", "3"},
      {R"({"min": []})", "null", "null"},
      {R"({"max": ["a", 10]})", "null", "null"},
      {R"({"min": ["5", 10]})", "null", "5"},
      {R"({"max": [null, -1]})", "null", "0"},
      {R"({"<": [{"/": [1, {"min": [0, {"-": [0]}]}]}, 0]})", "null", "true"},
      {R"({"<": [{"/": [1, {"max": [{"-": [0]}, 0]}]}, 0]})", "null", "false"},
  });
}

TEST_CASE("merge flattens one level") {
  CheckRows({
      {R"({"merge": []})", "null", "[]"},
      {R"({"merge": [[1, 2], [3, 4]]})", "null", "[1, 2, 3, 4]"},
      {R"({"merge": [1, 2, [3, 4]]})", "null", "[1, 2, 3, 4]"},
      {R"({"merge": [[[1]], [2]]})", "null", "[[1], 2]"},
      {R"({"merge": ["ab", null, {"and": []}]})", "null", R"(["ab", null, null])"},
  });
}

TEST_CASE("map filter reduce all some none apply a rule to each element") {
  CheckRows({
      {R"({"map": [{"var": "i"}, {"*": [{"var": ""}, 2]}]})", R"({"i": [1, 2, 3]})", "[2, 4, 6]"},
      {R"({"map": ["abc", {"var": ""}]})", "null", "[]"},
      {R"({"map": [[1, 2]]})", "null", "[null, null]"},
      {R"({"map": [[1, 2], {"var": "outer"}]})", R"({"outer": 1})", "[null, null]"},
      {R"({"filter": [{"var": "i"}, {"%": [{"var": ""}, 2]}]})", R"({"i": [1, 2, 3, 4, 5]})",
       "[1, 3, 5]"},
      {R"({"filter": [[0, 1, "", "a", [], [0], null], {"var": ""}]})", "null", R"([1, "a", [0]])"},
      {R"({"reduce": [{"var": "i"}, {"+": [{"var": "current"}, {"var": "accumulator"}]}, 0]})",
       R"({"i": [1, 2, 3, 4, 5]})", "15"},
      // Without an initial value the accumulator starts as null: parseFloat(null) is NaN.
      {R"({"reduce": [[1, 2], {"+": [{"var": "current"}, {"var": "accumulator"}]}]})", "null",
       "null"},
      {R"({"reduce": ["abc", {"var": "current"}, "init"]})", "null", R"("init")"},
      {R"({"reduce": [[1, 2], {"var": ""}, 0]})", "null",
       R"({"current": 2, "accumulator": {"current": 1, "accumulator": 0}})"},
      {R"({"all": [[1, 2, 3], {">": [{"var": ""}, 0]}]})", "null", "true"},
      {R"({"all": [[1, 2, 3], {">": [{"var": ""}, 1]}]})", "null", "false"},
      {R"({"all": [[], true]})", "null", "false"},
      {R"({"some": [[-1, 0, 1], {">": [{"var": ""}, 0]}]})", "null", "true"},
      {R"({"some": [[], true]})", "null", "false"},
      {R"({"none": [[-3, -2], {">": [{"var": ""}, 0]}]})", "null", "true"},
      {R"({"none": [null, true]})", "null", "true"},
      {R"({"some": [{"var": "pies"}, {"==": [{"var": "filling"}, "apple"]}]})",
       R"({"pies": [{"filling": "pumpkin"}, {"filling": "apple"}]})", "true"},
  });
}

TEST_CASE("log returns its argument and literals come back as they are") {
  CheckRows({
      {R"({"log": "apple"})", "null", R"("apple")"},
      {R"({"log": [[1, 2]]})", "null", "[1, 2]"},
      {R"({"log": []})", "null", "null"},
      {"1", "null", "1"},
      {R"([1, "a", {"var": "a"}])", R"({"a": [1]})", R"([1, "a", [1]])"},
      {"{}", "null", "{}"},
      {R"({"a": 1, "b": 2})", "null", R"({"a": 1, "b": 2})"},
  });
}

TEST_CASE("results map NaN, Infinity and undefined to null and -0 to 0") {
  CheckRows({
      {R"({"/": [0, 0]})", "null", "null"},
      {R"({"/": [-1, 0]})", "null", "null"},
      {R"({"and": []})", "null", "null"},
      {R"({"-": [0]})", "null", "0"},
      {R"({"merge": [{"and": []}, {"/": [0, 0]}]})", "null", "[null, null]"},
      {R"({"reduce": [[{"and": []}], {"var": ""}, 1]})", "null", R"({"accumulator": 1})"},
  });
  StatusOr<Json> integral = EvalJsonLogic(Json::parse(R"({"*": [2, 1.5]})"), nullptr);
  REQUIRE(integral.ok());
  CHECK(integral->is_number_integer());
}

TEST_CASE("unknown operators and method are rejected, naming the operator") {
  Status method = EvalError(R"({"method": ["abc", "toUpperCase"]})");
  CHECK(method.code() == Code::kInvalidArgument);
  CHECK(method.message().find("\"method\"") != std::string::npos);
  Status nope = EvalError(R"({"if": [true, {"nope": [1]}, 0]})");
  CHECK(nope.code() == Code::kInvalidArgument);
  CHECK(nope.message().find("unknown operator \"nope\"") != std::string::npos);
  CHECK(EvalError(R"({"+.length": []})").code() == Code::kInvalidArgument);
  CHECK(EvalError(R"({"toString": []})").code() == Code::kInvalidArgument);
  // An operator in a branch that is not taken is never looked at, as in
  // json-logic-js; CheckJsonLogicRule finds it without evaluating.
  CHECK(EvalJsonLogic(Json::parse(R"({"if": [false, {"nope": []}, 1]})"), nullptr).ok());
}

TEST_CASE("what json-logic-js throws a TypeError for is InvalidArgument") {
  // An own toString or indexOf member shadows the function JavaScript calls.
  CHECK(EvalError(R"({"cat": [{"var": "o"}]})", R"({"o": {"toString": "x"}})").code() ==
        Code::kInvalidArgument);
  CHECK(EvalError(R"({"==": [{"var": "o"}, "x"]})", R"({"o": {"toString": 1}})").code() ==
        Code::kInvalidArgument);
  CHECK(EvalError(R"({"in": ["a", {"var": "o"}]})", R"({"o": {"indexOf": 1}})").code() ==
        Code::kInvalidArgument);
  CHECK(EvalError(R"({"some": [[1], {"*": []}]})").code() == Code::kInvalidArgument);
}

TEST_CASE("a rule nested deeper than the limit is ResourceExhausted, not a stack overflow") {
  const auto nested_not = [](int levels) {
    Json rule = true;
    for (int i = 0; i < levels; ++i) rule = Json{{"!", Json::array({rule})}};
    return rule;
  };
  CHECK(EvalJsonLogic(nested_not(63), nullptr).ok());  // 63 operators + the literal = 64 levels
  StatusOr<Json> too_deep = EvalJsonLogic(nested_not(64), nullptr);
  REQUIRE_FALSE(too_deep.ok());
  CHECK(too_deep.status().code() == Code::kResourceExhausted);

  Json hostile = true;
  for (int i = 0; i < 100000; ++i) {
    Json wrapper = Json::object();
    wrapper["!"] = std::move(hostile);
    hostile = std::move(wrapper);
  }
  StatusOr<Json> r = EvalJsonLogic(hostile, nullptr);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == Code::kResourceExhausted);

  JsonLogicLimits shallow;
  shallow.max_depth = 3;
  CHECK(EvalError(R"({"!": {"!": {"!": true}}})", "null", shallow).code() ==
        Code::kResourceExhausted);
  CHECK(EvalJsonLogic(Json::parse(R"({"!": {"!": true}})"), nullptr, shallow).ok());
}

TEST_CASE("a rule that needs too many operations is ResourceExhausted") {
  Json data = Json::object();
  data["xs"] = Json::array();
  for (int i = 0; i < 1000; ++i) data["xs"].push_back(i);
  const Json sum = Json::parse(
      R"({"reduce": [{"var": "xs"}, {"+": [{"var": "current"}, {"var": "accumulator"}]}, 0]})");
  StatusOr<Json> ok = EvalJsonLogic(sum, data);
  REQUIRE(ok.ok());
  CHECK(*ok == 499500);

  JsonLogicLimits tight;
  tight.max_operations = 1000;
  StatusOr<Json> over = EvalJsonLogic(sum, data, tight);
  REQUIRE_FALSE(over.ok());
  CHECK(over.status().code() == Code::kResourceExhausted);

  // Doubling an accumulator would need 2^40 elements: stopped by the budget.
  Json forty = Json::array();
  for (int i = 0; i < 40; ++i) forty.push_back(i);
  const Json doubling = {
      {"reduce",
       {forty, Json::parse(R"({"merge": [{"var": "accumulator"}, {"var": "accumulator"}]})"),
        Json::array({1})}}};
  CHECK(EvalJsonLogic(doubling, nullptr).status().code() == Code::kResourceExhausted);
  const Json doubling_text = {
      {"reduce",
       {forty, Json::parse(R"({"cat": [{"var": "accumulator"}, {"var": "accumulator"}]})"), "ab"}}};
  CHECK(EvalJsonLogic(doubling_text, nullptr).status().code() == Code::kResourceExhausted);

  // Each reduce step nests the scope object once more.
  Json many = Json::array();
  for (int i = 0; i < 500; ++i) many.push_back(i);
  const Json nesting = {{"reduce", {many, {{"var", ""}}, 0}}};
  CHECK(EvalJsonLogic(nesting, nullptr).status().code() == Code::kResourceExhausted);
}

TEST_CASE("CheckJsonLogicRule finds unknown operators anywhere, with their pointer") {
  CHECK(CheckJsonLogicRule(Json::parse(R"({"and": [{"var": "a"}, {"in": ["x", [1, 2]]}]})")).ok());
  CHECK(CheckJsonLogicRule(Json::parse(R"({"a": 1, "b": {"nope": 1}})")).ok());  // a literal

  Status s = CheckJsonLogicRule(Json::parse(R"({"if": [false, {"method": ["a", "b"]}, 1]})"));
  CHECK(s.code() == Code::kInvalidArgument);
  CHECK(s.field() == "/if/1");
  CHECK(s.message().find("\"method\"") != std::string::npos);

  Status bare = CheckJsonLogicRule(Json::parse(R"({"!": {"a/b": 1}})"));
  CHECK(bare.field() == "/!");
  Status in_array = CheckJsonLogicRule(Json::parse(R"([1, [{"x": 2}]])"));
  CHECK(in_array.field() == "/1/0");

  JsonLogicLimits shallow;
  shallow.max_depth = 2;
  Status deep = CheckJsonLogicRule(Json::parse(R"({"!": {"!": {"!": true}}})"), shallow);
  CHECK(deep.code() == Code::kResourceExhausted);
  CHECK(deep.field() == "/!/!");
}

TEST_CASE("evaluations on many threads at once do not interfere") {
  const Json rule = Json::parse(
      R"({"reduce": [{"var": "xs"}, {"+": [{"var": "current"}, {"var": "accumulator"}]}, 0]})");
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const Json data = {{"xs", {t, t, t}}};
      for (int i = 0; i < 200; ++i) {
        StatusOr<Json> r = EvalJsonLogic(rule, data);
        if (r.ok() && *r == 3 * t) ++ok[t];
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < 4; ++t) CHECK(ok[t] == 200);
}

}  // namespace
}  // namespace idem
