// End-to-end: a real daemon's /metrics, parsed with an independent
// Prometheus text-format parser (parse-prometheus-text-format, pinned in
// package-lock.json), before and after a scripted scenario: a decide miss, a
// decide hit, an action applied, the same action again (already done).
// Checks that every metric in the README's reference table has samples, and
// that the scenario moved its counters by exactly what it did (one blocked
// duplicate for its kind, one hit and one miss for its step, ...).
//
// Usage: node tests/e2e/metrics_scrape.mjs path/to/idem
import parsePrometheusTextFormat from 'parse-prometheus-text-format';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, writeFileSync, readFileSync, rmSync, statfsSync } from 'node:fs';
import { createServer } from 'node:http';
import { tmpdir } from 'node:os';
import { join, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import assert from 'node:assert/strict';

import { startDaemon, stopDaemon, waitReady } from './daemon.mjs';

const idem = process.argv[2];
if (!idem) throw new Error('usage: node metrics_scrape.mjs path/to/idem');
const repo = resolve(dirname(fileURLToPath(import.meta.url)), '../..');

// The documented names: the README's table (the one source of truth).
function documentedMetrics() {
  const readme = readFileSync(join(repo, 'README.md'), 'utf8');
  const begin = readme.indexOf('<!-- metrics-reference:begin -->');
  const end = readme.indexOf('<!-- metrics-reference:end -->');
  assert.ok(begin >= 0 && end > begin, 'README has the metrics reference table');
  const rows = [];
  for (const line of readme.slice(begin, end).split('\n')) {
    const m = line.match(/^\| `(idem_[a-z0-9_]+)` \| (counter|gauge|histogram) \|/);
    if (m) rows.push({ name: m[1], type: m[2] });
  }
  assert.ok(rows.length > 20, `the table lists the metrics (${rows.length} rows)`);
  return rows;
}

// --- the fake effector: one effect per Idempotency-Key -------------------
const effects = new Map();
const effector = createServer((req, res) => {
  let data = '';
  req.on('data', (c) => (data += c));
  req.on('end', () => {
    if (req.url.startsWith('/events')) {  // the outbox subscriber: takes every event
      res.writeHead(204);
      res.end();
      return;
    }
    if (req.url.startsWith('/fail')) {
      res.writeHead(400, { 'content-type': 'application/json' });
      res.end('{"error":"refused"}');
      return;
    }
    const key = req.headers['idempotency-key'];
    if (!effects.has(key)) effects.set(key, { id: 'ext-' + effects.size });
    res.writeHead(201, { 'content-type': 'application/json' });
    res.end(JSON.stringify(effects.get(key)));
  });
});
await new Promise((r) => effector.listen(0, '127.0.0.1', r));
const effectorUrl = `http://127.0.0.1:${effector.address().port}`;

// --- the daemon (no tokens: loopback only, any caller) -------------------
const dir = mkdtempSync(join(tmpdir(), 'idem-metrics-'));
writeFileSync(join(dir, 'rules.yaml'), `default:
  output: '{"category":"question","priority":"low","summary":"s","actions":[]}'
`);
writeFileSync(join(dir, 'idem.yaml'), `server:
  listen: 127.0.0.1:0
store:
  path: ${dir}/data
providers:
  demo: {type: scripted, rules: ${dir}/rules.yaml}
steps:
  triage_ticket:
    provider: demo
    model: demo-1
    temperature: 0
    prompt: {template: ${repo}/config/prompts/triage_ticket.mustache, version: v1}
    output_schema: ${repo}/schemas/examples/triage_ticket.v1.json
actions:
  send_reply:
    identity: {fields: [/ticket_id, /text], version: v1}
    window: 24h
    on_duplicate: return_original
    effector: {http: {method: POST, url: "${effectorUrl}/replies", idempotency: header}}
  refused_reply:
    identity: {fields: [/ticket_id], version: v1}
    window: 24h
    on_duplicate: return_original
    effector: {http: {method: POST, url: "${effectorUrl}/fail", idempotency: header}}
outbox:
  poll: 50ms
  subscribers:
    hook: {url: "${effectorUrl}/events"}
`);
const daemon = startDaemon({ binary: idem, config: join(dir, 'idem.yaml'), workDir: dir,
  data: false, listen: false, inherit: true, args: ['--log-level', 'warn'] });
const base = await waitReady(daemon);

// Parsed twice: as served (families, types, histograms), and with every
// histogram retyped untyped, so each of its _bucket/_sum/_count samples is a
// series with its labels (the parser merges a histogram's labelled series
// into one set of buckets and drops their _sum/_count).
async function scrape() {
  const res = await fetch(`${base}/metrics`);
  assert.equal(res.status, 200);
  assert.match(res.headers.get('content-type'), /^text\/plain; version=0\.0\.4/);
  const text = await res.text();
  const families = new Map(parsePrometheusTextFormat(text).map((f) => [f.name, f]));
  const samples = new Map(); // sample name -> [{labels, value}]
  const flat = text.replace(/^# TYPE (\S+) histogram$/gm, '# TYPE $1 untyped');
  for (const f of parsePrometheusTextFormat(flat)) {
    samples.set(f.name, (samples.get(f.name) || []).concat(f.metrics));
  }
  return { families, samples };
}

const labelKey = (labels) => JSON.stringify(Object.entries(labels || {}).sort());

// The value of the sample `name` (a counter, a gauge, or a histogram's
// x_count) with exactly these labels; 0 if absent.
function value(scraped, name, labels = {}) {
  const fam = scraped.families.get(name);
  const sampleName = fam && fam.type === 'HISTOGRAM' ? `${name}_count` : name;
  assert.ok(scraped.samples.has(sampleName), `${sampleName} is exposed`);
  const series = scraped.samples.get(sampleName).find((m) => labelKey(m.labels) === labelKey(labels));
  return series ? Number(series.value) : 0;
}

async function post(path, body, key) {
  const headers = { 'Content-Type': 'application/json' };
  if (key) headers['Idempotency-Key'] = `"${key}"`;
  const res = await fetch(`${base}${path}`, { method: 'POST', headers, body: JSON.stringify(body) });
  return { status: res.status, body: await res.json() };
}

let failed = false;
try {
  const before = await scrape();

  // The scenario.
  const input = { ticket_id: 'T-1', text: 'how do I reset my password?' };
  const miss = await post('/v1/decide', { step: 'triage_ticket', input });
  assert.equal(miss.status, 200, JSON.stringify(miss.body));
  assert.equal(miss.body.cache, 'miss');
  const hit = await post('/v1/decide', { step: 'triage_ticket', input });
  assert.equal(hit.status, 200);
  assert.equal(hit.body.cache, 'hit');
  const args = { ticket_id: 'T-1', text: 'hello' };
  const first = await post('/v1/actions/send_reply', { args }, 'a-1');
  assert.equal(first.status, 201, JSON.stringify(first.body));
  // Another key, the same effect: the journal blocks it (already done).
  const again = await post('/v1/actions/send_reply', { args }, 'a-2');
  assert.equal(again.status, 200, JSON.stringify(again.body));
  assert.equal(effects.size, 1, 'one effect at the fake effector');

  const after = await scrape();

  // Every documented metric has samples, with the documented type.
  for (const { name, type } of documentedMetrics()) {
    const fam = after.families.get(name);
    assert.ok(fam, `documented metric ${name} is in /metrics`);
    assert.equal(fam.type, type.toUpperCase(), `${name} is a ${type}`);
    assert.ok(fam.metrics.length > 0, `${name} has at least one series`);
    if (type === 'histogram') {
      assert.ok('+Inf' in fam.metrics[0].buckets, `${name} has a +Inf bucket`);
      const counts = after.samples.get(`${name}_count`);
      assert.ok(counts && counts.length > 0, `${name}_count samples`);
      for (const c of counts) {
        const inf = after.samples.get(`${name}_bucket`).find(
          (b) => labelKey(b.labels) === labelKey({ ...c.labels, le: '+Inf' }));
        assert.ok(inf, `${name}${labelKey(c.labels)} has a +Inf bucket`);
        assert.equal(Number(inf.value), Number(c.value), `${name}: +Inf bucket == count`);
        assert.ok(after.samples.get(`${name}_sum`).some((x) => labelKey(x.labels) === labelKey(c.labels)),
          `${name}${labelKey(c.labels)} has a _sum`);
      }
    }
  }

  // One build_info series, 1, labelled with what `idem --version` prints.
  const version = execFileSync(idem, ['--version'], { encoding: 'utf8' }).trim();
  const builds = after.samples.get('idem_build_info') || [];
  assert.equal(builds.length, 1, 'one idem_build_info series');
  assert.equal(`idem ${builds[0].labels.version}`, version, 'idem_build_info names this build');
  assert.equal(Number(builds[0].value), 1);

  const moved = (name, labels) => value(after, name, labels) - value(before, name, labels);
  // The blocked duplicate: exactly one, for its kind.
  assert.equal(moved('idem_work_duplicates_total', { kind: 'send_reply' }), 1);
  assert.equal(moved('idem_decide_cache_misses_total', { step: 'triage_ticket' }), 1);
  assert.equal(moved('idem_decide_cache_hits_total', { step: 'triage_ticket' }), 1);
  assert.equal(moved('idem_provider_latency_seconds', { provider: 'demo', model: 'demo-1' }), 1);
  assert.equal(moved('idem_http_requests_total', { route: 'POST /v1/decide', code: '2xx' }), 2);
  assert.equal(moved('idem_http_request_duration_seconds', { route: 'POST /v1/decide' }), 2);
  assert.equal(moved('idem_http_requests_total',
    { route: 'POST /v1/actions/{kind}', code: '2xx' }), 2);
  assert.equal(moved('idem_key_in_progress_seconds'), 2, 'two keyed requests stored outcomes');
  assert.equal(moved('idem_effector_calls_total'), 1);
  assert.ok(moved('idem_store_write_seconds') > 0, 'store writes were timed');
  assert.equal(value(after, 'idem_dead_letters'), 0);

  // The store-count gauges: a bounded scan redone when the last is older
  // than 5 s. A 400 from the effector makes a dead letter at once.
  const dead = await post('/v1/actions/refused_reply', { args: { ticket_id: 'T-9' } }, 'd-1');
  assert.ok(dead.status >= 400, JSON.stringify(dead.body));
  await new Promise((r) => setTimeout(r, 5200));
  const later = await scrape();
  assert.equal(value(later, 'idem_dead_letters'), 1, 'the dead-letter gauge counts it');
  assert.equal(value(later, 'idem_work_dead_total') - value(after, 'idem_work_dead_total'), 1);
  assert.equal(value(later, 'idem_plans', { state: 'awaiting_approval' }), 0);
  // Where the store's memory is: the decisions above sit in the decision
  // cache, and writes in the memtables; the pinned part is in the cache.
  for (const part of ['memtables', 'block_cache', 'decision_cache']) {
    assert.ok(value(later, 'idem_store_memory_bytes', { part }) > 0, `${part} bytes reported`);
  }
  assert.ok(value(later, 'idem_store_memory_bytes', { part: 'block_cache_pinned' }) <=
    value(later, 'idem_store_memory_bytes', { part: 'block_cache' }));
  // Where the store's disk is: the writes above are in the WAL; every
  // family has its series; the free space is the filesystem's, as statfs
  // reads it (10% apart at most: other processes write too).
  assert.ok(value(later, 'idem_store_disk_bytes', { part: 'wal' }) > 0, 'WAL bytes reported');
  for (const part of ['decisions', 'journal', 'other']) {
    assert.ok((later.samples.get('idem_store_disk_bytes') || [])
      .some((m) => labelKey(m.labels) === labelKey({ part })), `${part} disk reported`);
  }
  const fs = statfsSync(join(dir, 'data'));
  const free = fs.bavail * fs.bsize;
  const reported = value(later, 'idem_store_disk_free_bytes');
  assert.ok(Math.abs(reported - free) <= free / 10, `free bytes ${reported} against ${free}`);
  // A healthy store has met no damaged data (the count is there to alert on).
  assert.ok(later.samples.has('idem_store_corruptions_total'), 'the corruption count is rendered');
  assert.equal(value(later, 'idem_store_corruptions_total'), 0);
  console.log('metrics_scrape: all checks passed');
} catch (e) {
  failed = true;
  console.error('metrics_scrape: FAILED:', e);
} finally {
  effector.close();
  const { code } = await stopDaemon(daemon);
  if (code !== 0) {
    failed = true;
    console.error(`metrics_scrape: FAILED: the daemon exited with ${code} after SIGTERM`);
  }
  rmSync(dir, { recursive: true, force: true });
}
process.exit(failed ? 1 : 0);
