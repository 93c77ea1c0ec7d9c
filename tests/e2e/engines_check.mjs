#!/usr/bin/env node
// Every package pinned in package-lock.json (next to this file) must run on
// the Node.js that Debian 12 ships, since scripts/deps.sh installs Debian's
// nodejs on a fresh machine: 18.19.0 in bookworm's release (18.20.4 in its
// security updates). A machine with a newer Node (a CI image with Node 20)
// would not notice a package that needs more: playwright-core 1.65.1
// declares node >=20 and refuses to start on 18 ("Playwright requires
// Node.js 20 or higher").
//
//   node tests/e2e/engines_check.mjs [--node=18.19.0]
//
// The lockfile's engines.node ranges are all of the form ">= X[.Y[.Z]]"; a
// range of another form fails the check (read it, and extend this script
// if it is fine), so nothing passes unread.

import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const arg = process.argv.find((a) => a.startsWith("--node="));
const target = (arg ? arg.slice(7) : "18.19.0").split(".").map(Number);

function parts(v) {
  const p = v.split(".").map(Number);
  while (p.length < 3) p.push(0);
  return p;
}

function atLeast(have, want) {
  for (let i = 0; i < 3; i++) {
    if (have[i] !== want[i]) return have[i] > want[i];
  }
  return true;
}

const lock = JSON.parse(readFileSync(join(here, "package-lock.json"), "utf8"));
const problems = [];
let checked = 0;
for (const [path, pkg] of Object.entries(lock.packages ?? {})) {
  const range = pkg.engines?.node;
  if (path === "" || range === undefined) continue;
  checked++;
  const m = /^>=\s*(\d+(?:\.\d+){0,2})$/.exec(range.trim());
  if (!m) {
    problems.push(`${path}@${pkg.version}: engines.node "${range}" is not a ">= X.Y.Z" range`);
  } else if (!atLeast(target, parts(m[1]))) {
    problems.push(`${path}@${pkg.version}: needs node ${range}, Debian 12 has ${target.join(".")}`);
  }
}
for (const p of problems) console.log(p);
console.log(`${checked} engines ranges checked against node ${target.join(".")}, ` +
            `${problems.length} problems`);
process.exit(problems.length === 0 ? 0 : 1);
