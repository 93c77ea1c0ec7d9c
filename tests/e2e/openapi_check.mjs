// Checks every response the integration tests saw against the daemon's own
// /openapi.json, with ajv (pinned in package-lock.json):
//
//   IDEM_RESPONSE_LOG=build/responses ctest -R integration   (tests/integration/harness.cc
//                                                            writes responses-<pid>.jsonl there)
//   node tests/e2e/openapi_check.mjs build/idem build/responses
//
// It starts the daemon (config/idem.yaml, a temp store) to fetch
// /openapi.json, then for each recorded response {method, path, status,
// content_type, body}:
//   - the path matches a documented path template and the method is
//     documented for it (a path no route has: 404 problem+json; a path
//     with another method: 405 problem+json);
//   - the status is documented for that operation (a HEAD: for the path's
//     GET, and its answer has no body);
//   - the Content-Type is one the status documents, and the body validates
//     against that content's schema, read closed: an object schema with
//     `properties` and no word on others refuses fields it does not list,
//     so an answer cannot grow undocumented fields. Bodies of non-JSON content types (the
//     /mcp JSON-RPC and SSE answers, /ui files, /metrics text) are not
//     validated; their content type still must be documented.
// A 429 must carry Retry-After. Before the log it checks itself on made-up
// responses that must be refused, so a checker that passes everything fails.
// Exit code 0 when every response conforms, 1 otherwise (the first failures
// of each kind printed). IDEM_OPENAPI_VERBOSE=1 lists every (operation,
// status) seen; IDEM_OPENAPI_SCHEMA_DIR=schemas/api checks against the
// schema files as edited, without rebuilding the daemon.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {fileURLToPath} from 'node:url';
import Ajv2020 from 'ajv/dist/2020.js';

import {startDaemon, waitReady} from './daemon.mjs';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const binary = path.resolve(process.argv[2] || path.join(root, 'build/idem'));
const logDir = path.resolve(process.argv[3] || path.join(root, 'build/responses'));

// ------------------------------------------------------------ the spec
async function fetchSpec() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'idem-openapi-'));
  const d = startDaemon({binary, config: path.join(root, 'config/idem.yaml'), workDir: dir, cwd: root});
  try {
    const res = await fetch(await waitReady(d, {probe: '/openapi.json'}) + '/openapi.json');
    return await res.json();
  } finally {
    d.proc.kill('SIGKILL');
    fs.rmSync(dir, {recursive: true, force: true});
  }
}

// Media types whose bodies are not JSON documents: their type is checked,
// their bytes are not.
const opaque = (type) => !/^application\/([a-z.+-]*\+)?json$/.test(type);
const mediaType = (ct) => (ct || '').split(';')[0].trim().toLowerCase();

// A copy of `schema` in which every object schema that lists `properties`
// and says nothing of others refuses others: a field the daemon answers but
// the spec does not describe is drift too. Free-form objects (no
// `properties`: decision outputs, args, results) and schemas that allow
// extra members on purpose (problem details' extension members) are left
// as they are.
function closed(schema) {
  if (Array.isArray(schema)) return schema.map(closed);
  if (schema === null || typeof schema !== 'object') return schema;
  const out = {};
  for (const [k, v] of Object.entries(schema)) {
    // Property names are data, not schemas: keep the map, close its values.
    out[k] = k === 'properties' || k === 'patternProperties'
      ? Object.fromEntries(Object.entries(v).map(([n, s]) => [n, closed(s)]))
      : closed(v);
  }
  if (out.properties && !('additionalProperties' in out) && !('patternProperties' in out)) {
    out.additionalProperties = false;
  }
  return out;
}

class Checker {
  constructor(spec) {
    this.spec = spec;
    this.ajv = new Ajv2020({strict: false, allErrors: false, validateFormats: false});
    for (const [name, schema] of Object.entries(spec.components?.schemas || {})) {
      this.ajv.addSchema(closed(schema), '#/components/schemas/' + name);
    }
    this.templates = Object.keys(spec.paths).map((t) => ({
      template: t,
      segments: t.split('/').slice(1),
      params: (t.match(/\{[^}]+\}/g) || []).length,
    }));
    // Literal segments win over parameters (/v1/plans/awaiting before /v1/plans/{id}).
    this.templates.sort((a, b) => a.params - b.params);
    this.validators = new Map();
  }

  match(p) {
    const segs = p.split('/').slice(1);
    const hits = [];
    for (const t of this.templates) {
      if (t.segments.length !== segs.length) continue;
      const ok = t.segments.every((s, i) =>
        /^\{[^}]+\}$/.test(s) ? segs[i] !== '' && !segs[i].includes('/') : s === segs[i]);
      if (ok) hits.push(t.template);
    }
    return hits;
  }

  validator(schema) {
    const key = JSON.stringify(schema);
    if (!this.validators.has(key)) {
      const ref = schema.$ref;
      this.validators.set(key, ref ? this.ajv.getSchema(ref) : this.ajv.compile(schema));
    }
    return this.validators.get(key);
  }

  // Errors (strings) for one recorded response, and what it was checked as.
  check(r) {
    const errors = [];
    // A HEAD is answered by the path's GET route (RFC 9110 9.3.2): the GET's
    // statuses, and never a body.
    const head = r.method === 'HEAD';
    const method = head ? 'get' : r.method.toLowerCase();
    const templates = this.match(r.path);
    const type = mediaType(r.content_type);
    let op = null, as = null;
    for (const t of templates) {
      if (this.spec.paths[t][method]) { op = this.spec.paths[t][method]; as = `${r.method} ${t}`; break; }
    }
    if (op === null) {
      // No route: the router's own 404/405, a problem.
      const want = templates.length === 0 ? 404 : 405;
      as = want === 404 ? '(no route) 404' : '(other method) 405';
      if (r.status !== want) errors.push(`${r.method} ${r.path}: undocumented, answered ${r.status}`);
      else if (head && r.body !== '') errors.push(`${r.method} ${r.path}: a HEAD answer with a body`);
      else if (!head) this.validateBody(r, type, {schema: {$ref: '#/components/schemas/problem'}},
                             'application/problem+json', errors);
      return {errors, as};
    }
    const resp = op.responses?.[String(r.status)] || op.responses?.default;
    if (!resp) {
      errors.push(`${as}: status ${r.status} is not documented (documented: ` +
                  `${Object.keys(op.responses || {}).join(', ')})`);
      return {errors, as};
    }
    if (r.status === 429 && !r.headers?.['Retry-After']) errors.push(`${as}: 429 without Retry-After`);
    if (head) {
      if (r.body !== '') errors.push(`${as} ${r.status}: a HEAD answer with a body`);
      return {errors, as: `${as} ${r.status}`};
    }
    const content = resp.content || {};
    if (Object.keys(content).length === 0) {
      if (r.body !== '') errors.push(`${as} ${r.status}: documents no body, got ${type || 'untyped'} bytes`);
      return {errors, as: `${as} ${r.status}`};
    }
    if (!content[type]) {
      errors.push(`${as} ${r.status}: Content-Type ${type || '(none)'} is not documented ` +
                  `(documented: ${Object.keys(content).join(', ')})`);
      return {errors, as: `${as} ${r.status}`};
    }
    this.validateBody(r, type, content[type], type, errors, `${as} ${r.status}`);
    return {errors, as: `${as} ${r.status}`};
  }

  validateBody(r, type, media, want, errors, as = `${r.method} ${r.path} ${r.status}`) {
    if (type !== want) { errors.push(`${as}: Content-Type ${type}, documented ${want}`); return; }
    if (opaque(type)) { this.opaque = (this.opaque || 0) + 1; return; }
    if (!media.schema) { errors.push(`${as}: ${type} without a schema`); return; }
    let body;
    try { body = JSON.parse(r.body); } catch { errors.push(`${as}: the body is not JSON`); return; }
    const validate = this.validator(media.schema);
    if (!validate) { errors.push(`${as}: schema ${JSON.stringify(media.schema)} is missing`); return; }
    if (!validate(body)) {
      const e = validate.errors[0];
      errors.push(`${as}: body breaks ${media.schema.$ref || 'the schema'} at '${e.instancePath}' ` +
                  `(${e.message}${e.params ? ' ' + JSON.stringify(e.params) : ''}): ` +
                  r.body.slice(0, 300));
    }
  }
}

// ------------------------------------------------------------ run
const spec = await fetchSpec();
// While editing schemas/api: check against the files as they are now
// instead of rebuilding the daemon for each change (the route table's
// statuses still come from the binary).
if (process.env.IDEM_OPENAPI_SCHEMA_DIR) {
  const dir = process.env.IDEM_OPENAPI_SCHEMA_DIR;
  for (const f of fs.readdirSync(dir).filter((n) => n.endsWith('.json'))) {
    const s = JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8'));
    delete s.$schema;
    delete s.$id;
    spec.components.schemas[f.slice(0, -5)] = s;
  }
}
const checker = new Checker(spec);

// The checker must be able to fail: made-up answers it has to refuse.
const problem = JSON.stringify({type: 'urn:idem:problem:NOT_FOUND', title: 'Not Found', status: 404,
                                detail: 'x'});
const mustFail = [
  {method: 'GET', path: '/healthz', status: 299, content_type: 'application/json', body: '{"status":"ok"}'},
  {method: 'GET', path: '/healthz', status: 200, content_type: 'application/json', body: '{"state":1}'},
  {method: 'GET', path: '/healthz', status: 200, content_type: 'text/html', body: '{"status":"ok"}'},
  {method: 'GET', path: '/healthz', status: 200, content_type: 'application/json',
   body: '{"status":"ok","undocumented":1}'},
  {method: 'PATCH', path: '/healthz', status: 404, content_type: 'application/problem+json', body: problem},
  {method: 'HEAD', path: '/healthz', status: 200, content_type: 'application/json', body: '{"status":"ok"}'},
  {method: 'HEAD', path: '/healthz', status: 299, content_type: 'application/json', body: ''},
  {method: 'GET', path: '/no/such/route', status: 200, content_type: 'application/json', body: '{}'},
  {method: 'GET', path: '/v1/decisions/x', status: 404, content_type: 'application/problem+json', body: '{}'},
];
for (const r of mustFail) {
  if (checker.check(r).errors.length === 0) {
    console.log(`FAIL the checker passed a made-up wrong answer: ${JSON.stringify(r)}`);
    process.exit(1);
  }
}

const files = fs.existsSync(logDir) ? fs.readdirSync(logDir).filter((f) => f.endsWith('.jsonl')) : [];
let total = 0;
const seen = new Map();  // "METHOD template status" -> count
const failures = new Map();  // first line of error -> {count, example}
for (const f of files) {
  for (const line of fs.readFileSync(path.join(logDir, f), 'utf8').split('\n')) {
    if (!line) continue;
    const r = JSON.parse(line);
    if (r.status <= 0) continue;  // no answer (connection refused, timeout): nothing to check
    total++;
    const {errors, as} = checker.check(r);
    seen.set(as, (seen.get(as) || 0) + 1);
    for (const e of errors) {
      const k = e.split('): ')[0];  // one entry per operation, status and kind of failure
      const f = failures.get(k) || {count: 0, example: e};
      f.count++;
      failures.set(k, f);
    }
  }
}

const ops = Object.values(spec.paths).reduce((n, p) => n + Object.keys(p).length, 0);
const pairs = Object.values(spec.paths).reduce(
  (n, p) => n + Object.values(p).reduce((m, op) => m + Object.keys(op.responses || {}).length, 0), 0);
// Documented operations only: a HEAD is its GET's (and is counted apart below).
const opsSeen = new Set([...seen.keys()].filter((k) => !k.startsWith('(') && !k.startsWith('HEAD '))
  .map((k) => k.split(' ').slice(0, 2).join(' ')));
const headsSeen = [...seen.keys()].filter((k) => k.startsWith('HEAD ')).length;
console.log(`${total} responses from ${files.length} file(s) in ${logDir}`);
console.log(`${opsSeen.size} of ${ops} documented operations seen; ${seen.size - headsSeen} ` +
            `distinct (operation, status) pairs seen of ${pairs} documented; ${headsSeen} HEAD ` +
            `(operation, status) pairs checked as their GET; ${checker.opaque || 0} non-JSON ` +
            'bodies (type checked only)');
if (process.env.IDEM_OPENAPI_VERBOSE) {
  for (const [k, n] of [...seen.entries()].sort()) console.log(`  ${String(n).padStart(6)}  ${k}`);
}
if (total === 0) {
  console.log('FAIL no responses recorded: was IDEM_RESPONSE_LOG set for the integration tests?');
  process.exit(1);
}
for (const [, f] of failures) console.log(`FAIL x${f.count} ${f.example}`);
if (failures.size > 0) process.exit(1);
console.log('ok   every recorded response conforms to /openapi.json');
