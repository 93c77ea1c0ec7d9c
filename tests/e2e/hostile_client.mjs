// A hostile client for every operation the daemon documents: it reads the
// daemon's own /openapi.json, builds a plausible request for each operation
// (real ids from a set-up phase, bodies from the request schemas, the
// known step and action kinds of config/idem.yaml), and then sends
// hundreds of variations of each over raw sockets (half of them to the
// daemon's Unix socket, half to its TCP port): the request chunked and
// with Expect: 100-continue; bodies with a member removed, of the wrong
// type, out of its bounds, random, deeply nested, invalid UTF-8,
// truncated, not JSON, with a wrong or missing Content-Type; odd path
// parameters (long, %00, %2F, invalid percent escapes, overlong UTF-8);
// odd query values and Idempotency-Key / Prefer headers. The config adds
// three inbox sources (a token, an HMAC, none), whose events it delivers
// signed and broken, and one of each eight times at once; over MCP it
// calls every tool with broken arguments.
//
//   node tests/e2e/hostile_client.mjs build/idem [response-log-dir]
//
// Every answer must be one a client can act on:
//   - never a 500 (an internal error on bad input), and no 5xx but a 503
//     or 504 (overload, an upstream timeout), each with Retry-After;
//   - every 4xx and 5xx is application/problem+json whose `status` is the
//     HTTP status, with `type`, `title` and `detail` (on /mcp, a JSON-RPC
//     error); every body is valid UTF-8;
//   - a body that breaks one member of a request the daemon otherwise
//     takes is refused at that member: a 400's `pointer` is that member's
//     (or within it); a tool's refusal names the broken argument;
//   - an inbox event delivered eight times at once is processed once;
//   - every connection gets an answer within 20 s (no crash, no reset, no
//     hang), the daemon is ready (/readyz) at the end, and a SIGTERM stops
//     it with exit code 0 (under AddressSanitizer, no leak and no error).
// With a response-log dir, every answer is also written there (the
// integration tests' JSONL format), for tests/e2e/openapi_check.mjs to check
// against the spec: each status documented, each body valid.
// IDEM_HOSTILE_SEED varies the random choices (default 1); the run prints
// its seed, its counts, and the first failures of each kind
// (IDEM_HOSTILE_VERBOSE=1: also each operation's first answer). Exit code 0
// when every answer passes, 1 otherwise.
import crypto from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import {fileURLToPath} from 'node:url';

import {startDaemon, stopDaemon, waitReady, logTail} from './daemon.mjs';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const binary = path.resolve(process.argv[2] || path.join(root, 'build/idem'));
const logDir = process.argv[3] ? path.resolve(process.argv[3]) : '';
const seed = parseInt(process.env.IDEM_HOSTILE_SEED || '1', 10);

// ------------------------------------------------------------ randomness
let state = seed >>> 0 || 1;
function rand() {  // xorshift32: the same seed, the same run
  state ^= state << 13; state >>>= 0;
  state ^= state >>> 17;
  state ^= state << 5; state >>>= 0;
  return state / 4294967296;
}
const pick = (xs) => xs[Math.floor(rand() * xs.length)];

// ------------------------------------------------------------ raw HTTP/1.1
let port = 0;
let socketPath = '';  // the daemon's Unix socket: half the requests go there
const viaTransport = {tcp: 0, unix: 0};
// Sends `head` lines and `body` (a Buffer or string) on a new connection
// with Connection: close, and reads the whole answer. Resolves
// {status, headers, body} or {error}. Every answer must pass the same
// checks whichever of the daemon's listeners took the connection.
// With `chunked`, the body goes in chunks of random sizes (RFC 9112 7.1).
function send(method, target, {headers = {}, body = null, chunked = false} = {}) {
  return new Promise((resolve) => {
    let payload = body === null ? Buffer.alloc(0) : Buffer.from(body);
    let head = `${method} ${target} HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nConnection: close\r\n`;
    for (const [k, v] of Object.entries(headers)) head += `${k}: ${v}\r\n`;
    if (chunked) {
      head += 'Transfer-Encoding: chunked\r\n';
      const parts = [];
      for (let at = 0; at < payload.length;) {
        const n = Math.min(payload.length - at, 1 + Math.floor(rand() * 64));
        parts.push(Buffer.from(n.toString(16) + (rand() < 0.2 ? ';ext=1' : '') + '\r\n'),
                   payload.subarray(at, at + n), Buffer.from('\r\n'));
        at += n;
      }
      parts.push(Buffer.from('0\r\n\r\n'));
      payload = Buffer.concat(parts);
    } else if (body !== null) {
      head += `Content-Length: ${payload.length}\r\n`;
    }
    const unix = socketPath !== '' && rand() < 0.5;
    viaTransport[unix ? 'unix' : 'tcp']++;
    const sock = unix ? net.connect(socketPath) : net.connect(port, '127.0.0.1');
    const chunks = [];
    let settled = false;
    const done = (r) => { if (!settled) { settled = true; clearTimeout(timer); sock.destroy(); resolve(r); } };
    const timer = setTimeout(() => done({error: 'no answer within 20 s'}), 20000);
    sock.on('connect', () => sock.end(Buffer.concat([Buffer.from(head + '\r\n', 'latin1'), payload])));
    sock.on('data', (c) => chunks.push(c));
    sock.on('error', (e) => done({error: `connection error: ${e.code || e.message}`}));
    sock.on('close', () => done(parseAnswer(Buffer.concat(chunks))));
  });
}

const utf8 = new TextDecoder('utf-8', {fatal: true});
function parseAnswer(buf) {
  // An interim 100 Continue (an Expect: 100-continue) comes first.
  while (/^HTTP\/1\.1 1\d\d /.test(buf.subarray(0, 13).toString('latin1'))) {
    const interim = buf.indexOf('\r\n\r\n');
    if (interim < 0) break;
    buf = buf.subarray(interim + 4);
  }
  const end = buf.indexOf('\r\n\r\n');
  if (end < 0) return {error: buf.length === 0 ? 'connection closed with no answer' : 'truncated head'};
  const lines = buf.subarray(0, end).toString('latin1').split('\r\n');
  const m = /^HTTP\/1\.1 (\d{3}) /.exec(lines[0] + ' ');
  if (!m) return {error: `bad status line: ${JSON.stringify(lines[0])}`};
  const headers = {};
  for (const l of lines.slice(1)) {
    const i = l.indexOf(':');
    headers[l.slice(0, i).trim().toLowerCase()] = l.slice(i + 1).trim();
  }
  let body = buf.subarray(end + 4);
  if ('content-length' in headers) {
    const n = parseInt(headers['content-length'], 10);
    if (body.length < n) return {error: `body cut short: ${body.length} of ${n} bytes`};
    body = body.subarray(0, n);
  }
  let text;
  try {
    text = utf8.decode(body);
  } catch {
    return {error: `the body is not valid UTF-8: ${JSON.stringify(body.toString('latin1').slice(0, 200))}`};
  }
  return {status: parseInt(m[1], 10), headers, body: text};
}

// ------------------------------------------------------------ the daemon
// The default config with three inbox sources (the route webhook senders
// reach): a shared token, an HMAC of the body, and none.
const secrets = {HOSTILE_TG_SECRET: 'tg-secret-' + seed, HOSTILE_HMAC_SECRET: 'hmac-secret-' + seed};
function writeConfig(dir) {
  const configDir = path.join(root, 'config');
  // Its relative paths resolve against config/; written elsewhere, they
  // are spelled out.
  let text = fs.readFileSync(path.join(configDir, 'idem.yaml'), 'utf8').replace(
    /(\b(?:rules|template|output_schema|checks|args_schema|path):\s*)(?![\/"])([\w.][^\s,}#]*)/g,
    (_, key, value) => key + path.join(configDir, value));
  text += `
inbox:
  tg:
    event_id: {pointer: /update_id}
    signature: {header: X-Telegram-Bot-Api-Secret-Token, secret_env: HOSTILE_TG_SECRET, scheme: token}
    on_event: {decide: triage_ticket, pointer: /message}
  git:
    event_id: {header: X-Event-Id}
    signature: {header: X-Signature, secret_env: HOSTILE_HMAC_SECRET, prefix: "sha256="}
    on_event: {action: send_reply, pointer: /data}
  rec:
    event_id: {pointer: /id}
    on_event: {record: true}
`;
  const file = path.join(dir, 'idem.yaml');
  fs.writeFileSync(file, text);
  return file;
}

// ------------------------------------------------------------ bodies
let spec;
const deref = (s) => (s && s.$ref ? spec.components.schemas[s.$ref.split('/').pop()] : s);

// Values the default config knows, by member name: a request built from
// them gets past the schema and into the route's own checks.
const known = {
  step: 'triage_ticket',
  kind: 'send_reply',
  input: {ticket_id: 42, text: 'refund please', received_at: 'now'},
  identity: {ticket_id: 7, text: 'hello'},
  args: {ticket_id: 7, text: 'hello'},
  items: [{ticket_id: 9, text: 'one'}],
  holder: 'hostile',
  ttl: '5s',
  lease: '30s',
  retry_after: 1,
  error: 'it broke',
  result: {ok: true},
};

function sample(schema, name, depth = 0) {
  schema = deref(schema) || {};
  if (name in known && depth === 1) return structuredClone(known[name]);
  if ('default' in schema) return structuredClone(schema.default);
  if (schema.enum) return schema.enum[0];
  if ('const' in schema) return schema.const;
  const type = Array.isArray(schema.type) ? schema.type[0] : schema.type;
  switch (type) {
    case 'object': {
      const o = {};
      for (const k of schema.required || []) o[k] = sample(schema.properties?.[k], k, depth + 1);
      return o;
    }
    case 'array': return Array.from({length: schema.minItems || 0}, () => sample(schema.items, name, depth + 1));
    case 'string': return 'x'.repeat(Math.max(1, schema.minLength || 1));
    case 'integer': return Math.max(1, schema.minimum || 1);
    case 'number': return 1.5;
    case 'boolean': return true;
    default: return 'x';
  }
}

// A random JSON value: odd strings, numbers at the edges, nesting.
function randomValue(depth = 0) {
  const strings = ['', 'a', '\u0000', '\u001f', '\ud83d\ude00', '\ud800x', '\\', '"', '\u2028', 'é', '%00',
                   '30s', '-1s', '0', 'null', '{}', '<script>', 'a'.repeat(1 + Math.floor(rand() * 600))];
  const numbers = [0, -0, 1, -1, 0.1, 1e-320, 2 ** 31, 2 ** 53 + 2, -(2 ** 63), 1e300, 123456789012345680000];
  const r = rand();
  if (depth > 6 || r < 0.35) return pick(strings);
  if (r < 0.55) return pick(numbers);
  if (r < 0.62) return pick([true, false, null]);
  if (r < 0.8) return Array.from({length: Math.floor(rand() * 5)}, () => randomValue(depth + 1));
  const o = {};
  for (let i = Math.floor(rand() * 5); i > 0; i--) o[pick(strings).slice(0, 40)] = randomValue(depth + 1);
  return o;
}

// The JSON types a member's schema allows ([] when it names none).
const typesOf = (schema) => (Array.isArray(schema?.type) ? schema.type : schema?.type ? [schema.type] : []);

// A value of each JSON type `schema` does not allow (none for a schema
// that names no type: it takes anything).
function wrongTypeValues(schema) {
  const t = typesOf(schema);
  return [[null, 'null'], [true, 'boolean'], [12345, 'integer'], ['str', 'string'], [[1], 'array'], [{a: 1}, 'object']]
    .filter(([, ty]) => t.length > 0 && !t.includes(ty) && !(ty === 'integer' && t.includes('number')))
    .map(([v]) => v);
}

function nest(depth, leaf) {
  let v = leaf;
  for (let i = 0; i < depth; i++) v = i % 2 ? [v] : {a: v};
  return v;
}

// Wrong or extreme values for one member, each with whether the member's
// own schema could still take it (then any answer but a 5xx will do).
function hostileValues(schema) {
  schema = deref(schema) || {};
  const types = new Set(typesOf(schema));
  const out = [null, true, 0, -1, 1.5, -0, 1e308, 9007199254740993, -9223372036854775809, '', 'x',
               [], {}, [1, 'a', null], {'': {'\u0000': 1}}, '\u0000', '\ud800', '\u202e\u0000💥',
               'x'.repeat(70000), nest(60, 1), nest(200, 'deep'), ' '.repeat(300), '../../etc/passwd',
               '5s', '-5s', '99999999999999999999h', '1e3', 'NaN', 'Infinity'];
  if (schema.maxLength) out.push('y'.repeat(schema.maxLength + 1), 'é'.repeat(schema.maxLength));
  if (schema.enum) out.push(schema.enum[0] + ' ', String(schema.enum[0]).toUpperCase());
  if (schema.maxItems) out.push(Array.from({length: schema.maxItems + 1}, () => ({})));
  if (types.has('object')) out.push(Object.fromEntries(Array.from({length: 2000}, (_, i) => ['k' + i, i])));
  return out;
}

// ------------------------------------------------------------ checks
const failures = new Map();  // kind -> [messages]
let answers = 0;
let pointerChecks = 0;  // answers to one broken member of a request the daemon takes
const statuses = new Map();
function fail(kind, msg) {
  if (!failures.has(kind)) failures.set(kind, []);
  failures.get(kind).push(msg);
}

let logFile = '';
if (logDir) fs.mkdirSync(logDir, {recursive: true});

// Checks one answer; `expect.pointer` is the member a 400 must name.
function judge(what, method, target, r, expect = {}) {
  const label = `${method} ${target.length > 120 ? target.slice(0, 120) + '…' : target} (${what})`;
  if (r.error) return fail('no answer', `${label}: ${r.error}`), undefined;
  answers++;
  statuses.set(r.status, (statuses.get(r.status) || 0) + 1);
  if (logFile) {
    const line = {method, path: target.split('?')[0], status: r.status,
                  content_type: r.headers['content-type'] || '', body: r.body, headers: {}};
    for (const h of ['retry-after', 'location', 'idempotent-replayed']) {
      if (h in r.headers) line.headers[h.replace(/(^|-)([a-z])/g, (s) => s.toUpperCase())] = r.headers[h];
    }
    // Paths the spec has no template for (a %2F in a parameter) are the
    // spec checker's to judge; it reads the path as sent, undecoded.
    fs.appendFileSync(logFile, JSON.stringify(line) + '\n');
  }
  if (r.status >= 500 && r.status !== 503 && r.status !== 504) {
    fail('5xx', `${label}: ${r.status} ${r.body.slice(0, 300)}`);
  }
  if ((r.status === 503 || r.status === 429) && !('retry-after' in r.headers)) {
    fail('no Retry-After', `${label}: ${r.status} without Retry-After`);
  }
  if (r.status >= 400) {
    const ct = (r.headers['content-type'] || '').split(';')[0].trim();
    if (target.startsWith('/mcp') && ct === 'application/json') {
      // The MCP transport answers its own errors as JSON-RPC (MCP,
      // Streamable HTTP): an error object with a code and a message.
      let e;
      try { e = JSON.parse(r.body); } catch { fail('malformed JSON-RPC error', `${label}: body is not JSON`); return r; }
      if (e.jsonrpc !== '2.0' || !Number.isInteger(e.error?.code) || typeof e.error?.message !== 'string') {
        fail('malformed JSON-RPC error', `${label}: ${r.body.slice(0, 300)}`);
      }
      return r;
    }
    if (method !== 'HEAD' && ct !== 'application/problem+json') {
      fail('not problem+json', `${label}: ${r.status} with Content-Type ${ct}`);
      return r;
    }
    let p;
    try { p = JSON.parse(r.body); } catch { fail('not problem+json', `${label}: body is not JSON`); return r; }
    if (p.status !== r.status || typeof p.type !== 'string' || typeof p.title !== 'string' ||
        typeof p.detail !== 'string' || ('pointer' in p && typeof p.pointer !== 'string')) {
      fail('malformed problem', `${label}: ${r.body.slice(0, 300)}`);
    }
    if (expect.pointer !== undefined) pointerChecks++;
    // A body that is not JSON at all (a lone surrogate's escape) has no
    // member to name: the whole body, "".
    const unparsed = p.pointer === '' && p.detail.startsWith('invalid JSON');
    if (r.status === 400 && expect.pointer !== undefined && !unparsed) {
      // Header names are case-insensitive (RFC 9110 5.1).
      const norm = (x) => (typeof x === 'string' && x.startsWith('header:') ? x.toLowerCase() : x);
      const ptr = norm(p.pointer);
      const want = norm(expect.pointer);
      if (typeof ptr !== 'string' || !(ptr === want || ptr.startsWith(want + '/'))) {
        fail('wrong pointer', `${label}: 400 names ${JSON.stringify(ptr)}, not ${expect.pointer}: ${p.detail.slice(0, 200)}`);
      }
    }
  }
  return r;
}

// ------------------------------------------------------------ the run
async function pool(tasks, width) {
  let next = 0;
  await Promise.all(Array.from({length: width}, async () => {
    while (next < tasks.length) await tasks[next++]();
  }));
}

const json = {'Content-Type': 'application/json'};
const mcpAccept = {'Accept': 'application/json, text/event-stream'};
let keys = 0;  // a fresh Idempotency-Key per request that carries one

// Real ids for the path parameters: a claimed work item (and its lease
// token), a decision, a plan awaiting approval, an escalation-free step.
async function setUp() {
  const ids = {};
  const claim = await send('POST', '/v1/work/claim', {headers: json,
    body: JSON.stringify({kind: 'send_reply', identity: {ticket_id: 1, text: 'setup'}})});
  const claimed = JSON.parse(claim.body);
  ids.work = claimed.work_id;
  ids.lease_token = claimed.lease_token;
  const dec = await send('POST', '/v1/decide', {headers: json,
    body: JSON.stringify({step: 'triage_ticket', input: known.input})});
  ids.decision = JSON.parse(dec.body).decision_id;
  const plan = await send('POST', '/v1/actions/refund', {headers: {...json, 'Idempotency-Key': '"setup-1"'},
    body: JSON.stringify({args: {order_id: 'o-1', amount: 500}})});
  const planBody = JSON.parse(plan.body);
  ids.plan = planBody.plan_id || planBody.id;
  const init = await send('POST', '/mcp', {headers: {...json, ...mcpAccept}, body: JSON.stringify({
    jsonrpc: '2.0', id: 1, method: 'initialize',
    params: {protocolVersion: '2025-06-18', capabilities: {}, clientInfo: {name: 'hostile', version: '1'}}})});
  ids.mcp_session = init.headers?.['mcp-session-id'];
  ids.trace = /^00-([0-9a-f]{32})-/.exec(dec.headers?.traceresponse || '')?.[1];
  // DELETE /mcp ends the session it names: its own, not the one the POSTs use.
  const init2 = await send('POST', '/mcp', {headers: {...json, ...mcpAccept}, body: JSON.stringify({
    jsonrpc: '2.0', id: 1, method: 'initialize',
    params: {protocolVersion: '2025-06-18', capabilities: {}, clientInfo: {name: 'hostile', version: '1'}}})});
  ids.mcp_session_to_delete = init2.headers?.['mcp-session-id'];
  const listed = await send('POST', '/mcp', {headers: {...json, ...mcpAccept, 'Mcp-Session-Id': ids.mcp_session},
    body: JSON.stringify({jsonrpc: '2.0', id: 2, method: 'tools/list'})});
  try { ids.tools = JSON.parse(listed.body).result.tools; } catch { ids.tools = []; }
  if (ids.tools.length === 0) throw new Error(`set-up failed: tools/list answered ${listed.status} ${listed.body}`);
  if (!ids.work || !ids.lease_token || !ids.decision || !ids.plan || !ids.mcp_session ||
      !ids.trace || !ids.mcp_session_to_delete) {
    throw new Error(`set-up failed: ${claim.status} ${claim.body} / ${dec.status} ${dec.body} / ${plan.status} ${plan.body} / ${init.status} ${init.body}`);
  }
  return ids;
}

function fillPath(template, ids) {
  return template.replace(/\{([^}]+)\}/g, (_, name) => {
    if (template.startsWith('/v1/work/')) return ids.work;
    if (template.startsWith('/v1/decisions/')) return ids.decision;
    if (template.startsWith('/v1/plans/')) return ids.plan;
    if (template.startsWith('/v1/actions/')) return 'send_reply';
    if (template.startsWith('/v1/steps/')) return 'triage_ticket';
    if (template.startsWith('/v1/traces/')) return ids.trace;
    if (template.startsWith('/ui/')) return 'app.js';
    if (name === 'seq') return '1';
    return 'hostile-' + name;
  });
}

const oddSegments = ['x'.repeat(9000), '%00', 'a%2Fb', '%zz', '%', '%C0%AF', '%ED%A0%80', '..', '.',
                     '%2e%2e', 'é', '%E2%80%AE', '-1', '99999999999999999999', '%20', 'a;b', '*'];
const oddQueryValues = ['', '-1', '0', 'abc', '99999999999999999999', '1e3', '%00', '%zz', 'x'.repeat(5000),
                        '1&limit=2', '%FF', '%C0%80'];
const oddKeys = ['', '""', '"' + 'k'.repeat(300) + '"', 'token with spaces', '"\\x"', '"a"b', '"\u00e9"', ':abc:',
                 '"ok", "two"', '"\\\\"'];
const oddPrefer = ['wait=abc', 'wait=-1', 'wait=99999999999', 'wait=', 'wait=1, wait=2', 'respond-async; wait=0',
                   'wait="5"', ',,,', 'x'.repeat(5000)];

function operations() {
  const ops = [];
  for (const [template, item] of Object.entries(spec.paths)) {
    for (const [method, op] of Object.entries(item)) {
      if (!['get', 'post', 'put', 'delete', 'patch'].includes(method)) continue;
      if (template === '/mcp' && method === 'get') continue;  // an event stream, not a request/answer
      ops.push({template, method: method.toUpperCase(), op});
    }
  }
  return ops;
}

function tasksFor({template, method, op}, ids) {
  const tasks = [];
  const target = fillPath(template, ids);
  const schema = deref(op.requestBody?.content?.['application/json']?.schema);
  const query = (op.parameters || []).filter((p) => p.in === 'query').map((p) => p.name);
  let base = schema ? sample(schema, '', 0) : null;
  if (base && template === '/v1/work/{id}/complete') base.lease_token = ids.lease_token;
  if (base && template === '/v1/work/{id}/fail') base.lease_token = ids.lease_token;
  if (template === '/mcp' && method === 'POST') {
    base = {jsonrpc: '2.0', id: 7, method: 'tools/call',
            params: {name: 'decide_triage_ticket', arguments: {ticket_id: 42, text: 'refund please'}}};
  }
  const baseText = base === null ? null : JSON.stringify(base);
  const fixed = {...(base === null ? {} : json),
                 ...(template === '/mcp' ? {...mcpAccept, 'Mcp-Session-Id':
                     method === 'DELETE' ? ids.mcp_session_to_delete : ids.mcp_session} : {})};
  // Actions take only keyed calls; other writes get a key now and then,
  // so that both of their paths meet the same trouble.
  const keyed = template.startsWith('/v1/actions/') || template.endsWith('/apply') ||
                (method === 'POST' && template !== '/mcp' && rand() < 0.3);
  const withKey = (h) => (keyed && !('Idempotency-Key' in h) ? {...h, 'Idempotency-Key': `"h-${++keys}"`} : h);
  const send1 = (t, h, body, chunked = false) =>
    send(method, t, {headers: withKey({...fixed, ...h}), body, chunked});
  const post = (what, body, extra = {}, expect = {}, t = target) => tasks.push(async () =>
    judge(what, method, t, await send1(t, extra, body), expect));
  // The request as it is, framed otherwise.
  if (baseText !== null) {
    for (let i = 0; i < 3; i++) {
      tasks.push(async () => judge('chunked', method, target,
        await send1(target, {}, baseText, true)));
    }
    post('Expect: 100-continue', baseText, {'Expect': '100-continue'});
    post('Expect: something else', baseText, {'Expect': 'teapot'});
  }

  // Is the plain request taken? Then a single broken member must be
  // refused at that member. Decided when the base answer comes back.
  tasks.push(async () => {
    const r = judge('base', method, target, await send1(target, {}, baseText));
    // The same request chunked: framed otherwise, read the same.
    if (baseText !== null && r && !r.error) {
      const c = judge('base, chunked', method, target,
                      await send1(target, {}, baseText, true));
      if (c && !c.error && (c.status === 400) !== (r.status === 400)) {
        fail('chunked read otherwise', `${method} ${target}: ${r.status} as sent, ${c.status} chunked: ${c.body.slice(0, 200)}`);
      }
    }
    if (process.env.IDEM_HOSTILE_VERBOSE) console.log(`base ${method} ${target}: ${r?.status} ${r?.body?.slice(0, 160)}`);
    if (!schema || !r || r.error) return;
    const taken = r.status < 400 || ![400, 413, 415, 422].includes(r.status);
    if (!taken) return;
    const members = Object.keys(schema.properties || {});
    const more = [];
    for (const m of members) {
      const ms = deref(schema.properties[m]);
      const t = typesOf(ms);
      for (const v of wrongTypeValues(ms)) {
        more.push(async () => judge(`/${m} of a wrong type`, method, target,
          await send1(target, {}, JSON.stringify({...base, [m]: v})), {pointer: `/${m}`}));
      }
      if (ms?.maxLength && t.includes('string')) {
        more.push(async () => judge(`/${m} too long`, method, target,
          await send1(target, {}, JSON.stringify({...base, [m]: 'z'.repeat(ms.maxLength + 1)})),
          {pointer: `/${m}`}));
      }
      if ((schema.required || []).includes(m)) {
        const without = {...base};
        delete without[m];
        // A missing member is named by the member or by the object holding it.
        more.push(async () => {
          const r2 = judge(`/${m} missing`, method, target,
            await send1(target, {}, JSON.stringify(without)));
          if (r2 && r2.status === 400) {
            const p = JSON.parse(r2.body).pointer;
            pointerChecks++;
            if (p !== '' && p !== `/${m}`) fail('wrong pointer', `${method} ${target}: missing /${m} named ${JSON.stringify(p)}`);
          }
        });
      }
    }
    if (schema.additionalProperties === false) {
      more.push(async () => judge('an unknown member', method, target,
        await send1(target, {}, JSON.stringify({...base, zz_unknown: 1})), {pointer: '/zz_unknown'}));
    }
    for (const f of more) await f();
  });

  if (schema) {
    // Any value in any member, and in members the schema does not list.
    for (const m of [...Object.keys(schema.properties || {}), 'zz_unknown']) {
      for (const v of hostileValues(schema.properties?.[m])) {
        post(`/${m} = ${JSON.stringify(v).slice(0, 40)}`, JSON.stringify({...base, [m]: v}));
      }
    }
    // Random values in random members, a few at a time.
    const members = Object.keys(schema.properties || {});
    for (let i = 0; i < 24; i++) {
      const body = structuredClone(base);
      for (let k = 1 + Math.floor(rand() * 3); k > 0; k--) body[pick([...members, 'zz'])] = randomValue();
      post('random members', JSON.stringify(body));
    }
    // Bodies that are not the object asked for.
    const raw = ['', 'null', '[]', '"x"', '1', '{', '{"a":', '{"a":1,}', '{"a":1}{"b":2}', '\ufeff' + baseText,
                 '{"kind":"a","kind":"b"}', '{"\\ud800":1}', '{"a":"\\u0000"}', '{"a":1e99999}',
                 '{"a":-99999999999999999999999999999}', '{"a":00}', '{"a":.5}', "{'a':1}", '{"a":NaN}',
                 '[' .repeat(100000), '{"a":'.repeat(5000), ' '.repeat(100) + baseText];
    for (const b of raw) post(`body ${JSON.stringify(b).slice(0, 30)}`, b);
    post('invalid UTF-8 in a string', Buffer.concat([Buffer.from('{"kind":"'), Buffer.from([0xc3, 0x28, 0xff]), Buffer.from('"}')]));
    post('overlong UTF-8', Buffer.concat([Buffer.from('{"kind":"'), Buffer.from([0xc0, 0xaf]), Buffer.from('"}')]));
    post('a body over the size limit', '{"a":"' + 'b'.repeat(2 * 1024 * 1024) + '"}');
    // Content types.
    for (const ct of ['', 'text/plain', 'application/x-www-form-urlencoded', 'application/json; charset=latin1',
                      'application/json; charset=utf-8', 'application/jsonx', 'multipart/form-data; boundary=x',
                      'application/json, text/plain', 'APPLICATION/JSON']) {
      post(`Content-Type ${JSON.stringify(ct)}`, baseText, {'Content-Type': ct});
    }
    tasks.push(async () => judge('no Content-Type', method, target,
      await send(method, target, {headers: withKey({}), body: baseText})));
  } else if (method === 'POST' || method === 'DELETE') {
    post('an unexpected body', '{"a":1}', json);
    post('an unexpected non-JSON body', 'hello', {'Content-Type': 'text/plain'});
  }

  // Headers that carry meaning.
  for (const k of oddKeys) post(`Idempotency-Key ${JSON.stringify(k).slice(0, 30)}`, baseText, {'Idempotency-Key': k});
  for (const p of oddPrefer) post(`Prefer ${JSON.stringify(p).slice(0, 30)}`, baseText, {'Prefer': p});
  post('Authorization for no configured token', baseText, {'Authorization': 'Bearer ' + 'x'.repeat(100)});
  post('a cross-site Origin', baseText, {'Origin': 'http://evil.example'});

  // Path parameters.
  if (template.includes('{')) {
    for (const seg of oddSegments) {
      const t = template.replace(/\{[^}]+\}/g, seg);
      post(`path ${seg.slice(0, 20)}`, baseText, {}, {}, t);
    }
  }
  // Query parameters.
  for (const q of query) {
    for (const v of oddQueryValues) post(`?${q}=${v.slice(0, 20)}`, baseText, {}, {}, `${target}?${q}=${v}`);
    post(`?${q} twice`, baseText, {}, {}, `${target}?${q}=1&${q}=2`);
    post(`?${q} without =`, baseText, {}, {}, `${target}?${q}`);
  }
  post('an unknown query parameter', baseText, {}, {}, `${target}?zz=1`);
  return tasks;
}

// The checks, on made-up answers each of them must refuse: a judge that
// passes everything fails here.
function selfCheck() {
  const problem = (status, extra = {}) => JSON.stringify({type: 'urn:x', title: 't', status, detail: 'd', ...extra});
  const pj = {'content-type': 'application/problem+json'};
  const cases = [
    ['5xx', {status: 500, headers: pj, body: problem(500)}, {}],
    ['no Retry-After', {status: 503, headers: pj, body: problem(503)}, {}],
    ['not problem+json', {status: 400, headers: {'content-type': 'text/plain'}, body: 'bad'}, {}],
    ['malformed problem', {status: 404, headers: pj, body: problem(400)}, {}],
    ['wrong pointer', {status: 400, headers: pj, body: problem(400, {pointer: '/other'})}, {pointer: '/kind'}],
    ['wrong pointer', {status: 400, headers: pj, body: problem(400, {pointer: '/kindness'})}, {pointer: '/kind'}],
    ['wrong pointer', {status: 400, headers: pj, body: problem(400, {pointer: 'header:x-other'})}, {pointer: 'header:X-Event-Id'}],
    ['wrong pointer', {status: 400, headers: pj, body: problem(400, {pointer: ''})}, {pointer: '/kind'}],
    ['malformed JSON-RPC error', {status: 400, headers: {'content-type': 'application/json'}, body: '{"error":"x"}'}, {}, '/mcp'],
    ['no answer', {error: 'connection closed with no answer'}, {}],
    ['no answer', parseAnswer(Buffer.from('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n\xff\xfe', 'latin1')), {}],
  ];
  for (const [kind, answer, expect, t = '/v1/x'] of cases) {
    failures.clear();
    judge('self-check', 'POST', t, answer, expect);
    if (!failures.has(kind)) throw new Error(`self-check: the judge took a made-up answer it must refuse as "${kind}"`);
  }
  for (const [pointer, want] of [['/kind/0', '/kind'], ['header:x-event-id', 'header:X-Event-Id']]) {
    failures.clear();
    judge('self-check', 'POST', '/v1/x', {status: 400, headers: pj, body: problem(400, {pointer})}, {pointer: want});
    if (failures.size !== 0) throw new Error(`self-check: the judge refused a good answer (${pointer})`);
  }
  failures.clear();
  answers = 0;
  statuses.clear();
  pointerChecks = 0;
}

// Deliveries to the inbox: each source's event as its sender signs it,
// then with the signature, the event id and the payload broken, and the
// same event delivered eight times at once (processed once: at most one
// answer that is not a duplicate, the others duplicates or 503).
let events = 0;
function inboxTasks() {
  const tasks = [];
  const hmac = (body) => 'sha256=' + crypto.createHmac('sha256', secrets.HOSTILE_HMAC_SECRET).update(body).digest('hex');
  const sources = {
    tg: (id, payload) => ({
      body: JSON.stringify({update_id: id, message: payload}),
      headers: {'X-Telegram-Bot-Api-Secret-Token': secrets.HOSTILE_TG_SECRET}, idPointer: '/update_id',
      payloadPointer: '/message'}),
    git: (id, payload) => {
      const body = JSON.stringify({data: payload});
      return {body, headers: {'X-Event-Id': String(id), 'X-Signature': hmac(body)}, idPointer: 'header:X-Event-Id',
              payloadPointer: '/data'};
    },
    rec: (id, payload) => ({body: JSON.stringify({id, note: payload}), headers: {}, idPointer: '/id'}),
  };
  const payload = () => ({ticket_id: 1000 + events, text: 'event ' + events});
  const deliver = (what, source, ev, extra = {}, expect = {}) => tasks.push(async () => {
    const t = `/v1/inbox/${source}`;
    return judge(what, 'POST', t, await send('POST', t, {headers: {...json, ...ev.headers, ...extra}, body: ev.body}), expect);
  });
  for (const [source, make] of Object.entries(sources)) {
    for (let i = 0; i < 4; i++) deliver('an event', source, make(`${++events}`, payload()));
    // Signatures.
    if (source !== 'rec') {
      const ev = make(`${++events}`, payload());
      const name = Object.keys(ev.headers).find((h) => h !== 'X-Event-Id');
      const good = ev.headers[name];
      for (const sig of ['', 'x', good.toUpperCase(), good.slice(0, -1), good + '0', 'sha256=' + 'g'.repeat(64),
                         good.replace('sha256=', ''), 's'.repeat(10000), good + ' ', '\t' + good]) {
        deliver(`signature ${JSON.stringify(sig).slice(0, 20)}`, source, ev, {[name]: sig});
      }
      const unsigned = {...ev, headers: Object.fromEntries(Object.entries(ev.headers).filter(([h]) => h !== name))};
      deliver('no signature', source, unsigned);
    }
    // Event ids.
    for (const id of [null, '', 1.5, -1, 2 ** 64, 'x'.repeat(255), 'x'.repeat(256), 'é'.repeat(200), {a: 1}, [1],
                      true, '\u0000', ' ', 'id with spaces']) {
      if (source === 'git' && typeof id !== 'string') continue;  // a header is text
      const ev = make(id, payload());
      // A control byte in a header is the HTTP parser's to refuse, before
      // any route (RFC 9110 5.5): no member to name.
      const framing = source === 'git' && /[\u0000-\u001f]/.test(id);
      deliver(`event id ${JSON.stringify(id).slice(0, 20)}`, source, ev, {}, framing ? {} : {pointer: ev.idPointer});
    }
    if (source === 'git') deliver('no event id', source, make('x', payload()), {'X-Event-Id': ''});
    // Payloads: what the event carries to its decide, action or record.
    for (const v of [...hostileValues({}), ...Array.from({length: 10}, () => randomValue())]) {
      const ev = make(`${++events}`, v);
      // Refused, it is refused where the sender put it.
      deliver(`payload ${JSON.stringify(v)?.slice(0, 30)}`, source, ev, {},
              ev.payloadPointer ? {pointer: ev.payloadPointer} : {});
    }
    // Bodies that are not the event.
    for (const raw of ['', 'not json', '{', '[]', 'null', '{"a":'.repeat(5000), '{"update_id":1,"update_id":2}']) {
      const ev = make(`${++events}`, payload());
      const body = raw;
      const headers = {...ev.headers};
      if (source === 'git') headers['X-Signature'] = hmac(body);
      deliver(`body ${JSON.stringify(raw).slice(0, 20)}`, source, {...ev, body, headers});
    }
    for (const ct of ['text/plain', 'application/x-www-form-urlencoded', '']) {
      deliver(`Content-Type ${JSON.stringify(ct)}`, source, make(`${++events}`, payload()), {'Content-Type': ct});
    }
    // One event, eight deliveries at once.
    const same = make(`${++events}`, payload());
    tasks.push(async () => {
      const t = `/v1/inbox/${source}`;
      const rs = await Promise.all(Array.from({length: 8}, () =>
        send('POST', t, {headers: {...json, ...same.headers}, body: same.body})));
      let firsts = 0;
      for (const r of rs) {
        judge('the same event, eight at once', 'POST', t, r);
        if (r.error || r.status >= 300) continue;
        let b;
        try { b = JSON.parse(r.body); } catch { b = {}; }
        if (b.duplicate !== true) firsts++;
      }
      if (firsts > 1) fail('processed twice', `${t}: ${firsts} of 8 concurrent deliveries of one event were processed`);
      if (source === 'rec' && firsts !== 1) fail('processed twice', `${t}: ${firsts} of 8 deliveries of one event recorded it`);
    });
  }
  return tasks;
}

// Tool calls over MCP, as an agent might get them wrong: each tool with
// arguments built from its input schema, then each argument removed, of a
// wrong type, odd or random, and arguments that are no object. Every
// answer is JSON-RPC with the call's id: a result (a refused call is a
// result with isError and a text saying why, which names the one broken
// argument of a call the tool otherwise takes) or an error.
let rpcIds = 100;
function mcpTasks(ids) {
  const tasks = [];
  const headers = {...json, ...mcpAccept, 'Mcp-Session-Id': ids.mcp_session};
  const call = async (what, name, args, argument) => {
    const id = ++rpcIds;
    const params = args === undefined ? {name} : {name, arguments: args};
    const r = judge(`${name}: ${what}`, 'POST', '/mcp',
      await send('POST', '/mcp', {headers, body: JSON.stringify({jsonrpc: '2.0', id, method: 'tools/call', params})}));
    if (!r || r.error || r.status !== 200) return r;
    let b;
    try { b = JSON.parse(r.body); } catch { fail('malformed JSON-RPC answer', `tools/call ${name} (${what}): not JSON`); return r; }
    if (b.jsonrpc !== '2.0' || b.id !== id || ('result' in b) === ('error' in b)) {
      fail('malformed JSON-RPC answer', `tools/call ${name} (${what}): ${r.body.slice(0, 200)}`);
      return r;
    }
    const texts = (b.result?.content || []).filter((c) => c.type === 'text').map((c) => c.text);
    if (b.result && (texts.length === 0 || texts.some((t) => typeof t !== 'string' || t === ''))) {
      fail('malformed JSON-RPC answer', `tools/call ${name} (${what}): a result without text: ${r.body.slice(0, 200)}`);
    }
    if (argument !== undefined) {
      pointerChecks++;
      if (b.result?.isError === true && !texts.join(' ').includes(argument)) {
        fail('wrong pointer', `tools/call ${name} (${what}): refused without naming ${argument}: ${texts.join(' ').slice(0, 200)}`);
      }
    }
    return {...r, rpc: b};
  };
  const knownArgs = {work_id: ids.work, lease_token: ids.lease_token, plan_id: ids.plan, decision_id: ids.decision,
                     order_id: 'o-2', amount: 50, ticket_id: 5, text: 'hi'};
  for (const tool of ids.tools) {
    const schema = tool.inputSchema || {};
    const base = sample(schema, '', 0);
    for (const k of Object.keys(schema.properties || {})) if (k in knownArgs) base[k] = knownArgs[k];
    if (tool.name === 'do_send_reply') Object.assign(base, {ticket_id: 5, text: 'hi'});
    const members = Object.keys(schema.properties || {});
    tasks.push(async () => {
      const r = await call('base', tool.name, base);
      if (process.env.IDEM_HOSTILE_VERBOSE) console.log(`base tool ${tool.name}: ${JSON.stringify(r?.rpc)?.slice(0, 200)}`);
      // Taken: answered, and not for its arguments (a call may still be
      // refused for the work's state: done, busy, a dead letter).
      const text = (r?.rpc?.result?.content || []).map((c) => c.text).join(' ');
      const taken = r?.rpc?.result && !(r.rpc.result.isError === true && /argument/i.test(text));
      if (!taken) return;
      for (const m of members) {
        for (const v of wrongTypeValues(deref(schema.properties[m]))) {
          await call(`/${m} of a wrong type`, tool.name, {...base, [m]: v}, `/${m}`);
        }
        if ((schema.required || []).includes(m)) {
          const without = {...base};
          delete without[m];
          await call(`/${m} missing`, tool.name, without);
        }
      }
      if (schema.additionalProperties === false) await call('an unknown argument', tool.name, {...base, zz_unknown: 1}, 'zz_unknown');
    });
    for (const m of [...members, 'zz']) {
      for (const v of hostileValues(schema.properties?.[m])) {
        tasks.push(() => call(`/${m} = ${JSON.stringify(v).slice(0, 30)}`, tool.name, {...base, [m]: v}));
      }
    }
    for (let i = 0; i < 8; i++) {
      const args = structuredClone(base);
      for (let k = 1 + Math.floor(rand() * 3); k > 0; k--) args[pick([...members, 'zz'])] = randomValue();
      tasks.push(() => call('random arguments', tool.name, args));
    }
    for (const args of [undefined, null, [], 'x', 5, nest(200, 1)]) {
      tasks.push(() => call(`arguments ${JSON.stringify(args)?.slice(0, 20)}`, tool.name, args));
    }
  }
  for (const name of ['', 'nope', 'do_', 'x'.repeat(5000), '\u0000', 'decide_triage_ticket ']) {
    tasks.push(() => call('an unknown tool', name, {}));
  }
  return tasks;
}

async function main() {
  selfCheck();
  if (logDir) logFile = path.join(logDir, `responses-hostile-${process.pid}.jsonl`);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'idem-hostile-'));
  const d = startDaemon({binary, config: writeConfig(dir), workDir: dir, cwd: root,
                         env: {...process.env, ...secrets},
                         args: ['--unix-socket', path.join(dir, 'idem.sock')]});
  const started = Date.now();
  let code = 1;
  try {
    port = Number(new URL(await waitReady(d, {probe: '/readyz', timeoutMs: 120000})).port);
    socketPath = path.join(dir, 'idem.sock');
    spec = JSON.parse((await send('GET', '/openapi.json')).body);
    const ids = await setUp();
    const ops = operations();
    const tasks = [];
    for (const o of ops) tasks.push(...tasksFor(o, ids));
    tasks.push(...inboxTasks(), ...mcpTasks(ids));
    // Shuffled, so that no route sees only its own kind of trouble.
    for (let i = tasks.length - 1; i > 0; i--) {
      const j = Math.floor(rand() * (i + 1));
      [tasks[i], tasks[j]] = [tasks[j], tasks[i]];
    }
    await pool(tasks, 8);
    const ready = await send('GET', '/readyz');
    if (ready.status !== 200) fail('not ready at the end', `/readyz answered ${ready.status ?? ready.error}`);
    const exit = await stopDaemon(d, {timeoutMs: 30000});
    if (exit.code !== 0) {
      fail('unclean stop', `SIGTERM: exit ${exit.code} signal ${exit.signal}; log tail:\n` +
           logTail(d, 3000));
    }
    const counts = [...statuses.entries()].sort((a, b) => a[0] - b[0]).map(([s, n]) => `${s}: ${n}`).join(', ');
    console.log(`hostile client (seed ${seed}): ${ops.length} operations, ${tasks.length} requests ` +
                `(connections: ${viaTransport.tcp} TCP, ${viaTransport.unix} Unix socket), ` +
                `${answers} answers in ${((Date.now() - started) / 1000).toFixed(1)} s (${counts}); ` +
                `${pointerChecks} refusals of one broken member checked for its pointer`);
    if (failures.size === 0) {
      console.log('every answer passed');
      code = 0;
    } else {
      for (const [kind, msgs] of failures) {
        console.log(`FAIL ${kind}: ${msgs.length}`);
        for (const m of msgs.slice(0, 8)) console.log('  ' + m);
      }
    }
  } catch (e) {
    console.log('FAIL: ' + (e.stack || e));
  } finally {
    if (!d.exited) d.proc.kill('SIGKILL');
    if (code === 0) fs.rmSync(dir, {recursive: true, force: true});
    else console.log(`daemon log and store kept in ${dir}`);
  }
  process.exit(code);
}

main();
