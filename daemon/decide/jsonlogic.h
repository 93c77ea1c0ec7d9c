// JSONLogic: the rule language of value checks (R31), evaluated in the
// daemon with the semantics of the reference implementation, npm
// json-logic-js 2.0.5 (differentially tested against it by
// tests/e2e/jsonlogic_diff.mjs).
//
// Supported operators: == === != !== > >= < <= (and the 3-argument
// "between" forms of < and <=), ! !!, or and (short-circuit, returning the
// deciding value), if ?: (chained), var (dot paths, array indices, a default,
// "" for the whole data), missing, missing_some, in, cat, substr, + - * / %,
// min max, merge, map filter reduce all some none, log (returns its argument,
// prints nothing). There is no `method` operator and no other way for a rule
// to reach outside the data it is given.
//
// JavaScript semantics are kept where they show: truthiness ([] is falsy,
// "0" is truthy), loose equality (1 == "1", [] == false, null == undefined),
// relational comparison (two strings compare by UTF-16 code units, anything
// else as numbers), parseFloat in + and *, string-to-number coercion in
// - / % < min max, `var` reading "length" and indices of strings and arrays.
// A rule sees values JSON cannot hold (undefined, NaN, Infinity) while it is
// evaluated; the result maps them the way JSON.stringify does: undefined,
// NaN and +-Infinity become null (in arrays too), undefined object members
// are left out, -0 becomes 0. Integral numbers below 2^53 come back as JSON
// integers.
//
// Known differences from json-logic-js, all outside JSON data:
//   - inherited JavaScript members (`constructor`, `__proto__`, `toString`
//     ...) are not data: {"var": "a.constructor"} is "not found";
//   - dotted operator names ("+.prototype.constructor") are unknown
//     operators;
//   - a substring that would split a UTF-16 surrogate pair (substr, or an
//     index into a string) yields U+FFFD for the lone half;
//   - the limits below make hostile rules fail where JavaScript would run.
//
// Errors (never an exception):
//   InvalidArgument   an unknown operator (named in the message) or what
//                     json-logic-js throws a TypeError for (e.g. {"*": []});
//   ResourceExhausted a rule nested deeper than limits.max_depth, an
//                     evaluation that needs more than limits.max_operations
//                     work units (one per operator application, plus one per
//                     array element and per 16 bytes of text an operator
//                     builds or scans), or a built value nested deeper than
//                     128 levels.
//
// Thread-safety: pure functions; any number of threads may evaluate rules
// concurrently.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "daemon/core/status.h"

namespace idem {

using Json = nlohmann::json;

struct JsonLogicLimits {
  int max_depth = 64;                // nesting of rules being applied
  int64_t max_operations = 100'000;  // work units per evaluation
};

// Applies `rule` to `data`. Both are borrowed for the call only.
StatusOr<Json> EvalJsonLogic(const Json& rule, const Json& data,
                             const JsonLogicLimits& limits = {});

// The same, also listing in `unresolved` (when not null; at most 16) what
// the evaluation could not judge, in the order met: each `var` it read
// that was absent or null and had no default ("args.amount is absent",
// "... is null"), and each comparison (< <= > >=) with an operand that is
// not a number ("5,000", {}), which is false whichever way it is asked.
// Branches not taken are not read; what a falsy operand of an `or` could
// not read is dropped when a next operand follows (a fallback the author
// wrote); `missing` asks about absence and is not a read.
StatusOr<Json> EvalJsonLogic(const Json& rule, const Json& data, const JsonLogicLimits& limits,
                             std::vector<std::string>* unresolved);

// JSONLogic truthiness: false for null, false, 0, "", and [] (unlike plain
// JavaScript); true for everything else, including "0" and {}.
bool JsonLogicTruthy(const Json& value);

// A static check for rules loaded from files: every operator in the rule
// (wherever it sits, including branches an evaluation may skip) is a
// supported one and the rule is no deeper than limits.max_depth. Returns
// InvalidArgument (unknown operator) or ResourceExhausted (too deep) with
// field() = the JSON pointer of the offending node inside `rule`.
Status CheckJsonLogicRule(const Json& rule, const JsonLogicLimits& limits = {});

}  // namespace idem
