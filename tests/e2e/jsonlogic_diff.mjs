#!/usr/bin/env node
// Differential test of idem's JSONLogic evaluator (daemon/decide/jsonlogic.h)
// against the reference implementation, npm json-logic-js (pinned in
// package-lock.json next to this file).
//
//   node tests/e2e/jsonlogic_diff.mjs BUILD/idem_jsonlogic_eval [--n=2000] [--seed=1]
//
// Cases come from three sources:
//   1. jsonlogic_cases.json: hand-written cases for every operator (the npm
//      package does not ship json-logic-js's own tests.json);
//   2. a coercion matrix: tricky values (including undefined, NaN, -0 and
//      +-Infinity, which only rules can produce) against each other under
//      every operator that coerces;
//   3. N random rules (seeded; N=2000, or --n / JSONLOGIC_DIFF_N) over
//      random data, from a grammar of the supported operators.
// Each case is serialized to JSON text once; json-logic-js evaluates the
// parsed text and the C++ program the same text, so both see the same input.
//
// Results are compared as JSON. What JSON cannot hold is mapped the way
// JSON.stringify maps it, on both sides: undefined, NaN and +-Infinity
// become null (also inside arrays), undefined object members are dropped,
// -0 becomes 0. Numbers are equal when they are the same double. A case
// passes when both results are equal or both sides raised an error (the
// messages are not compared).
//
// The last line of output is "N passed, M failed"; the exit status is 0
// only when nothing failed. The first 20 mismatches are listed before it.

import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const require = createRequire(import.meta.url);
const PINNED_VERSION = "2.0.5";

function fail(message) {
  console.error("jsonlogic_diff: " + message);
  console.log("0 passed, 1 failed");
  process.exit(2);
}

// ---------------------------------------------------------------------------
// Arguments and the reference implementation.

let evaluator = null;
let count = Number(process.env.JSONLOGIC_DIFF_N ?? 2000);
let seed = Number(process.env.JSONLOGIC_DIFF_SEED ?? 1);
for (const arg of process.argv.slice(2)) {
  if (arg.startsWith("--n=")) count = Number(arg.slice(4));
  else if (arg.startsWith("--seed=")) seed = Number(arg.slice(7));
  else if (evaluator === null) evaluator = arg;
  else fail("unexpected argument " + arg);
}
if (evaluator === null) fail("usage: jsonlogic_diff.mjs PATH/TO/idem_jsonlogic_eval [--n=N] [--seed=S]");
if (!Number.isInteger(count) || count < 0) fail("--n must be a non-negative integer");
if (!Number.isInteger(seed)) fail("--seed must be an integer");

let jsonLogic;
try {
  jsonLogic = require("json-logic-js");
} catch (e) {
  fail("json-logic-js is not installed in " + join(here, "node_modules") + " (" + e.code + ")\n" +
       "run: npm ci --prefix tests/e2e");
}
const installed = require("json-logic-js/package.json").version;
if (installed !== PINNED_VERSION) {
  fail("json-logic-js " + installed + " is installed, the test is pinned to " + PINNED_VERSION +
       "\nrun: npm ci --prefix tests/e2e");
}

// ---------------------------------------------------------------------------
// Comparison.

// JSON.stringify's view of a value; undefined (no JSON text at all) is null.
function asJson(value) {
  const text = JSON.stringify(value);
  return text === undefined ? null : JSON.parse(text);
}

function sameJson(a, b) {
  if (typeof a === "number" && typeof b === "number") return a === b;
  if (a === null || b === null || typeof a !== "object" || typeof b !== "object") return a === b;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  if (Array.isArray(a)) return a.length === b.length && a.every((x, i) => sameJson(x, b[i]));
  const keys = Object.keys(a);
  if (keys.length !== Object.keys(b).length) return false;
  return keys.every((k) => Object.prototype.hasOwnProperty.call(b, k) && sameJson(a[k], b[k]));
}

function evalReference(rule, data) {
  // json-logic-js's `log` prints with console.log; keep stdout for the report.
  const consoleLog = console.log;
  console.log = () => {};
  try {
    return { result: asJson(jsonLogic.apply(rule, data)) };
  } catch (e) {
    return { error: String(e && e.message) };
  } finally {
    console.log = consoleLog;
  }
}

// ---------------------------------------------------------------------------
// Source 1: hand-written cases.

const cases = [];
function addCase(source, rule, data) {
  const text = JSON.stringify({ rule, data: data === undefined ? null : data });
  cases.push({ source, text });
}

{
  const file = join(here, "jsonlogic_cases.json");
  const entries = JSON.parse(readFileSync(file, "utf8"));
  let section = "cases";
  let index = 0;
  for (const entry of entries) {
    if (typeof entry === "string") {
      section = entry;
      continue;
    }
    addCase(`cases#${index++} (${section})`, entry.rule, entry.data);
  }
}

// ---------------------------------------------------------------------------
// Source 2: the coercion matrix.

const MATRIX_DATA = {
  arr: [1, 2],
  obj: { a: 1, b: 2 },
  with_to_string: { toString: 1, k: 2 },
  with_index_of: { indexOf: 1, k: 2 },
  with_length: { length: "3", k: 1 },
  s: "abc",
};

const MATRIX_VALUES = [
  0, 1, -1, 2.5, 10, 1e21,
  "0", "1", "", "abc", "10", "9", " 1 ", "1e1", "0x1A", "-0", "a,b", "Infinity",
  true, false, null,
  [], [1], [1, 2], ["1"], [[]], [null], ["a", "b"],
  {}, { a: 1, b: 2 },
  { and: [] },            // undefined
  { "/": [0, 0] },        // NaN
  { "/": [1, 0] },        // Infinity
  { "/": [-1, 0] },       // -Infinity
  { "-": [0] },           // -0
  { var: "arr" }, { var: "obj" }, { var: "with_to_string" }, { var: "with_index_of" },
  { var: "with_length" },
];

const MATRIX_BINARY = ["==", "===", "!=", "!==", "<", "<=", ">", ">=", "+", "-", "*", "/", "%",
  "min", "max", "in", "cat", "merge", "substr", "var", "missing_some", "and", "or", "log"];
const MATRIX_UNARY = ["!", "!!", "-", "+", "*", "min", "max", "cat", "merge", "var", "missing",
  "in", "log", "if", "and", "or"];

for (const op of MATRIX_BINARY) {
  for (const [i, a] of MATRIX_VALUES.entries()) {
    for (const [j, b] of MATRIX_VALUES.entries()) {
      addCase(`matrix ${op} #${i} #${j}`, { [op]: [a, b] }, MATRIX_DATA);
    }
  }
}
for (const op of MATRIX_UNARY) {
  for (const [i, a] of MATRIX_VALUES.entries()) {
    addCase(`matrix ${op} #${i}`, { [op]: [a] }, MATRIX_DATA);
    addCase(`matrix ${op} #${i} (bare)`, { [op]: a }, MATRIX_DATA);
  }
}
for (const [i, v] of MATRIX_VALUES.entries()) {
  addCase(`matrix substr-start #${i}`, { substr: ["abcdef", v] }, MATRIX_DATA);
  addCase(`matrix substr-length #${i}`, { substr: ["abcdef", 1, v] }, MATRIX_DATA);
  addCase(`matrix between< #${i}`, { "<": [0, v, 10] }, MATRIX_DATA);
  addCase(`matrix between<= #${i}`, { "<=": [1, v, 10] }, MATRIX_DATA);
  addCase(`matrix if #${i}`, { if: [v, "yes", "no"] }, MATRIX_DATA);
  addCase(`matrix missing_some #${i}`, { missing_some: [v, ["arr", "nope", "s"]] }, MATRIX_DATA);
  addCase(`matrix map #${i}`, { map: [v, { var: "" }] }, MATRIX_DATA);
  addCase(`matrix filter #${i}`, { filter: [v, { "!!": { var: "" } }] }, MATRIX_DATA);
  addCase(`matrix reduce #${i}`, { reduce: [v, { cat: [{ var: "accumulator" }, { var: "current" }] }, "<"] }, MATRIX_DATA);
  addCase(`matrix all #${i}`, { all: [v, { var: "" }] }, MATRIX_DATA);
  addCase(`matrix some #${i}`, { some: [v, { var: "" }] }, MATRIX_DATA);
  addCase(`matrix none #${i}`, { none: [v, { var: "" }] }, MATRIX_DATA);
}

// ---------------------------------------------------------------------------
// Source 3: random rules over random data.

function makeRandom(seedValue) {
  let x = (seedValue >>> 0) ^ 0x5bd1e995;
  if (x === 0) x = 0x9e3779b9;
  const next = () => {
    // xorshift32
    x ^= x << 13; x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5; x >>>= 0;
    return x / 4294967296;
  };
  for (let i = 0; i < 8; i++) next();
  return next;
}
const random = makeRandom(seed);
const chance = (p) => random() < p;
const pick = (list) => list[Math.floor(random() * list.length)];
const between = (lo, hi) => lo + Math.floor(random() * (hi - lo + 1));

const NUMBERS = [0, -0, 1, -1, 2, 3, 7, 10, 0.5, -2.5, 1.1, 0.1, 0.2, 100, 1e21, 1e-7, 255, -7];
const NUMERIC_STRINGS = ["0", "1", "-1", "2.5", " 3 ", "1e3", "0x10", "0b11", "0o17", "007", "-0",
  "+4", ".5", "5.", "Infinity", "-Infinity", "1_000", "1,2", "\t7\n", "12abc", "abc12", "1e",
  "\u00a012", "0x", "."];
const STRINGS = ["", "a", "abc", "hello world", "b", "A", "ab", "\u00e9t\u00e9", "\u65e5\u672c",
  "a.b", "@", "x@y.z", "true", "false", "null", "undefined", "NaN", "[object Object]", ","];

function literalScalar() {
  const r = random();
  if (r < 0.3) return pick(NUMBERS);
  if (r < 0.5) return pick(NUMERIC_STRINGS);
  if (r < 0.75) return pick(STRINGS);
  if (r < 0.9) return chance(0.5);
  return null;
}

function literalData(depth) {
  const r = random();
  if (depth > 0 && r < 0.12) return Array.from({ length: between(0, 3) }, () => literalData(depth - 1));
  if (depth > 0 && r < 0.18) return { x: literalData(depth - 1), y: literalScalar() };
  return literalScalar();
}

function randomData() {
  if (chance(0.05)) return literalData(2);
  const data = {
    a: literalData(2),
    b: literalData(1),
    n: pick(NUMBERS),
    s: pick(STRINGS.concat(NUMERIC_STRINGS)),
    t: chance(0.5),
    z: null,
    e: "",
    arr: Array.from({ length: between(0, 4) }, () => literalScalar()),
    nums: Array.from({ length: between(0, 5) }, () => pick(NUMBERS)),
    objs: Array.from({ length: between(0, 3) }, () => ({ x: literalScalar(), y: pick(NUMBERS) })),
    obj: { x: literalScalar(), y: { z: literalScalar() } },
  };
  if (chance(0.3)) data[""] = literalScalar();
  if (chance(0.3)) data["0"] = literalScalar();
  return data;
}

const TOP_PATHS = ["a", "b", "n", "s", "t", "z", "e", "arr", "arr.0", "arr.1", "arr.length", "nums",
  "nums.2", "objs", "objs.0.x", "objs.1.y", "obj", "obj.x", "obj.y.z", "obj.q", "s.0", "s.length",
  "missing", "a.b.c", "", "0", "a.x", "a.0", "obj.y"];
const ELEMENT_PATHS = ["", "x", "y", "0", "length", "x.0", "q"];
const REDUCE_PATHS = ["current", "accumulator", "current.x", "current.y", "accumulator.0",
  "accumulator.length", "", "q"];

const OPERATORS = ["==", "===", "!=", "!==", ">", ">=", "<", "<=", "!", "!!", "or", "and", "if",
  "?:", "var", "missing", "missing_some", "in", "cat", "substr", "+", "-", "*", "/", "%", "min",
  "max", "merge", "map", "filter", "reduce", "all", "some", "none", "log"];

function varRule(paths) {
  const path = pick(paths);
  const r = random();
  if (r < 0.55) return { var: path };
  if (r < 0.75) return { var: [path] };
  if (r < 0.95) return { var: [path, literalScalar()] };
  return { var: pick([0, 1, null, [], 1.5, true]) };
}

function leaf(paths) {
  if (chance(0.5)) return varRule(paths);
  if (chance(0.1)) return Array.from({ length: between(0, 3) }, () => literalScalar());
  return literalScalar();
}

function list(n, depth, paths) {
  return Array.from({ length: n }, () => rule(depth, paths));
}

// `{op: [args]}`, sometimes `{op: arg}` when there is one argument.
function op(name, args) {
  if (args.length === 1 && chance(0.3)) return { [name]: args[0] };
  return { [name]: args };
}

function iterable(depth, paths) {
  const r = random();
  if (r < 0.5) return { var: pick(["nums", "objs", "arr", "a", "s", "missing"]) };
  if (r < 0.7) return list(between(0, 4), Math.min(depth, 1), paths);
  return rule(depth, paths);
}

function rule(depth, paths = TOP_PATHS) {
  if (depth <= 0 || chance(0.25)) return leaf(paths);
  const d = depth - 1;
  if (chance(0.01)) return { [pick(["method", "foo", "+.x", "Var"])]: list(between(0, 2), d, paths) };
  const name = pick(OPERATORS);
  switch (name) {
    case "==": case "===": case "!=": case "!==": case ">": case ">=":
      return op(name, list(chance(0.9) ? 2 : between(0, 3), d, paths));
    case "<": case "<=":
      return op(name, list(chance(0.7) ? 2 : between(1, 3), d, paths));
    case "!": case "!!": case "log":
      return op(name, list(chance(0.9) ? 1 : between(0, 2), d, paths));
    case "or": case "and":
      return op(name, list(between(0, 4), d, paths));
    case "if": case "?:":
      return op(name, list(between(0, 6), d, paths));
    case "var":
      return chance(0.7) ? varRule(paths) : op("var", list(between(1, 2), d, paths));
    case "missing": {
      if (chance(0.3)) return op("missing", [list(between(0, 3), 0, paths)]);
      return op("missing", Array.from({ length: between(0, 3) }, () => pick(paths)));
    }
    case "missing_some":
      return op("missing_some", [chance(0.8) ? between(0, 3) : rule(d, paths),
        chance(0.85) ? Array.from({ length: between(0, 3) }, () => pick(paths)) : rule(d, paths)]);
    case "in":
      return op("in", [rule(d, paths), chance(0.5) ? rule(d, paths)
        : chance(0.5) ? pick(STRINGS) : list(between(0, 3), 0, paths)]);
    case "cat":
      return op("cat", list(between(0, 4), d, paths));
    case "substr":
      return op("substr", [rule(d, paths),
        chance(0.7) ? between(-5, 5) : rule(d, paths),
        ...(chance(0.6) ? [chance(0.7) ? between(-5, 5) : rule(d, paths)] : [])]);
    case "+": case "*": case "min": case "max": case "merge":
      return op(name, list(between(0, 4), d, paths));
    case "-": case "/": case "%":
      return op(name, list(chance(0.8) ? 2 : between(0, 3), d, paths));
    case "map": case "filter": case "all": case "some": case "none":
      return op(name, [iterable(d, paths), rule(d, ELEMENT_PATHS)]);
    case "reduce": {
      const args = [iterable(d, paths), rule(d, REDUCE_PATHS)];
      if (chance(0.8)) args.push(rule(d, paths));
      return op("reduce", args);
    }
  }
  throw new Error("no generator for " + name);
}

for (let i = 0; i < count; i++) {
  addCase(`random#${i} (seed ${seed})`, rule(between(1, 4)), randomData());
}

// ---------------------------------------------------------------------------
// Run both sides and compare.

const input = cases.map((c) => c.text).join("\n") + "\n";
const run = spawnSync(evaluator, [], { input, encoding: "utf8", maxBuffer: 1 << 30 });
if (run.error) fail("cannot run " + evaluator + ": " + run.error.message);
if (run.status !== 0) fail(evaluator + " exited with " + run.status + "\n" + run.stderr);
const lines = run.stdout.split("\n");
if (lines[lines.length - 1] === "") lines.pop();
if (lines.length !== cases.length) {
  fail(evaluator + " answered " + lines.length + " lines for " + cases.length + " cases");
}

let passed = 0;
const mismatches = [];
const outcomes = {};  // source kind -> outcome kind -> count, to see what the cases exercise
const outcomeKind = (o) => "error" in o ? "error"
  : o.result === null ? "null" : Array.isArray(o.result) ? "array" : typeof o.result;
for (const [i, c] of cases.entries()) {
  const { rule: r, data } = JSON.parse(c.text);
  const expected = evalReference(r, data);
  const kind = c.source.split(/[ #]/)[0];
  outcomes[kind] ??= {};
  outcomes[kind][outcomeKind(expected)] = (outcomes[kind][outcomeKind(expected)] ?? 0) + 1;
  const actual = JSON.parse(lines[i]);
  const ok = "error" in expected ? "error" in actual
    : "result" in actual && sameJson(expected.result, actual.result);
  if (ok) passed++;
  else mismatches.push({ c, expected, actual });
}

for (const m of mismatches.slice(0, 20)) {
  console.log("MISMATCH " + m.c.source);
  console.log("  input:         " + m.c.text);
  console.log("  json-logic-js: " + JSON.stringify(m.expected));
  console.log("  idem:          " + JSON.stringify(m.actual));
}
if (mismatches.length > 20) console.log(`(${mismatches.length - 20} more mismatches not shown)`);
for (const [kind, counts] of Object.entries(outcomes)) {
  const total = Object.values(counts).reduce((a, b) => a + b, 0);
  const parts = Object.entries(counts).sort((a, b) => b[1] - a[1]).map(([k, v]) => `${k} ${v}`);
  console.log(`${kind}: ${total} cases; reference results: ${parts.join(", ")}`);
}
console.log(`${passed} passed, ${mismatches.length} failed`);
process.exit(mismatches.length === 0 ? 0 : 1);
