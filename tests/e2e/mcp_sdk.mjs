// End-to-end: idem's /mcp endpoint driven by the official MCP TypeScript SDK
// (@modelcontextprotocol/sdk, pinned in package-lock.json): Client +
// StreamableHTTPClientTransport against a real daemon, with a fake effector
// (a plain HTTP server here that counts effects per Idempotency-Key).
//
// Usage: node tests/e2e/mcp_sdk.mjs path/to/idem
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:http';
import { tmpdir } from 'node:os';
import { join, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import assert from 'node:assert/strict';

import { startDaemon, stopDaemon, waitReady } from './daemon.mjs';

const idem = process.argv[2];
if (!idem) throw new Error('usage: node mcp_sdk.mjs path/to/idem');
const repo = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const sha = (s) => createHash('sha256').update(s).digest('hex');

// --- the fake effector: one effect per Idempotency-Key (level 1) ----------
const effects = new Map(); // key -> {status, body}
const bodies = [];
const effector = createServer((req, res) => {
  let data = '';
  req.on('data', (c) => (data += c));
  req.on('end', () => {
    const key = req.headers['idempotency-key'];
    if (!effects.has(key)) {
      bodies.push(JSON.parse(data));
      effects.set(key, { id: 'ext-' + effects.size });
    }
    res.writeHead(201, { 'content-type': 'application/json' });
    res.end(JSON.stringify(effects.get(key)));
  });
});
await new Promise((r) => effector.listen(0, '127.0.0.1', r));
const effectorUrl = `http://127.0.0.1:${effector.address().port}`;

// --- the daemon ----------------------------------------------------------
const dir = mkdtempSync(join(tmpdir(), 'idem-mcp-'));
const agentToken = 'agent-secret', operatorToken = 'op-secret';
writeFileSync(join(dir, 'rules.yaml'), `rules:
  - match: {step: tree_ticket}
    output: '{"category":"root","children":[{"category":"leaf","children":[]}]}'
  - match: {step: pair_ticket}
    output: '{"a":"x","b":"y"}'
default:
  output: '{"category":"question","priority":"low","summary":"s","actions":[]}'
`);
writeFileSync(join(dir, 'refund.args.json'), JSON.stringify({
  type: 'object', additionalProperties: false, required: ['order_id', 'amount'],
  properties: { order_id: { type: 'string' }, amount: { type: 'number', minimum: 0 } },
}));
// A step whose output schema refers to its own definitions (as OpenAI
// strict schemas often do): the tool's outputSchema must still resolve them.
writeFileSync(join(dir, 'refs.schema.json'), JSON.stringify({
  type: 'object', required: ['category'],
  definitions: { label: { type: 'string', minLength: 1 } },
  properties: { category: { $ref: '#/definitions/label' }, summary: { $ref: '#/definitions/label' } },
}));
// Step schemas whose references point at their own root: the whole schema
// ("#", a recursive tree), one of its properties, and definitions under an
// $id (resolved against that $id, not the tool's outputSchema).
writeFileSync(join(dir, 'tree.schema.json'), JSON.stringify({
  type: 'object', required: ['category'],
  properties: { category: { type: 'string' }, children: { type: 'array', items: { $ref: '#' } } },
}));
writeFileSync(join(dir, 'pair.schema.json'), JSON.stringify({
  type: 'object', required: ['a', 'b'],
  properties: { a: { type: 'string', minLength: 1 }, b: { $ref: '#/properties/a' } },
}));
writeFileSync(join(dir, 'lab.schema.json'), JSON.stringify({
  $id: 'https://example.com/schemas/lab.json',
  type: 'object', required: ['category'],
  definitions: { lab: { type: 'string', minLength: 1 } },
  properties: { category: { $ref: '#/definitions/lab' } },
}));
const step = (name, schema) => `  ${name}:
    provider: demo
    model: demo-1
    temperature: 0
    prompt: {template: ${repo}/config/prompts/triage_ticket.mustache, version: v1}
    output_schema: ${schema}
`;
writeFileSync(join(dir, 'idem.yaml'), `server:
  listen: 127.0.0.1:0
store:
  path: ${dir}/data
auth:
  tokens:
    - {name: agent-1, sha256: ${sha(agentToken)}, roles: [agent]}
    - {name: op-1, sha256: ${sha(operatorToken)}, roles: [operator]}
providers:
  demo: {type: scripted, rules: ${dir}/rules.yaml}
steps:
  triage_ticket:
    provider: demo
    model: demo-1
    temperature: 0
    prompt: {template: ${repo}/config/prompts/triage_ticket.mustache, version: v1}
    output_schema: ${repo}/schemas/examples/triage_ticket.v1.json
  label_ticket:
    provider: demo
    model: demo-1
    temperature: 0
    prompt: {template: ${repo}/config/prompts/triage_ticket.mustache, version: v1}
    output_schema: ${dir}/refs.schema.json
${step('tree_ticket', `${dir}/tree.schema.json`)}${step('pair_ticket', `${dir}/pair.schema.json`)}\
${step('id_ticket', `${dir}/lab.schema.json`)}actions:
  send_reply:
    identity: {fields: [/ticket_id, /text], version: v1}
    window: 24h
    on_duplicate: return_original
    effector: {http: {method: POST, url: "${effectorUrl}/replies", idempotency: header}}
  refund:
    identity: {fields: [/order_id], version: v1}
    window: forever
    on_duplicate: return_original
    args_schema: ${dir}/refund.args.json
    effector: {http: {method: POST, url: "${effectorUrl}/refunds", idempotency: header}}
    approval: {when: {">": [{"var": "args.amount"}, 100]}, reason: refunds over 100 need a human}
  post_note:
    identity: {fields: [/note_id], version: v1}
    window: 24h
    on_duplicate: return_original
`);
const daemon = startDaemon({ binary: idem, config: join(dir, 'idem.yaml'), workDir: dir,
  data: false, listen: false, inherit: true, args: ['--log-level', 'warn'] });
const base = await waitReady(daemon);

let failed = false;
try {
  const transport = new StreamableHTTPClientTransport(new URL(`${base}/mcp`), {
    requestInit: { headers: { Authorization: `Bearer ${agentToken}` } },
  });
  const client = new Client({ name: 'idem-e2e', version: '1.0.0' });
  await client.connect(transport);
  assert.ok(transport.sessionId, 'a session id was issued');
  // serverInfo names the release, as `idem --version` does.
  const release = (await new Promise((done) => {
    const p = spawn(idem, ['--version']);
    let out = '';
    p.stdout.on('data', (c) => (out += c));
    p.on('close', () => done(out));
  })).trim().replace(/^idem /, '');
  assert.deepEqual(client.getServerVersion(), { name: 'idem', version: release });

  // Tools: one per step, one per action kind, and the built-ins.
  const { tools } = await client.listTools();
  const names = tools.map((t) => t.name).sort();
  for (const n of ['decide_triage_ticket', 'do_send_reply', 'do_refund', 'claim_work',
    'complete_work', 'fail_work', 'get_plan', 'get_decision']) {
    assert.ok(names.includes(n), `tool ${n} listed (${names})`);
  }
  // A client-executed kind (no effector) has claim_work, not a do_ tool.
  assert.ok(!names.includes('do_post_note'), 'no do_ tool for a kind without an effector');
  const refundTool = tools.find((t) => t.name === 'do_refund');
  assert.deepEqual(refundTool.inputSchema.required, ['order_id', 'amount']);
  assert.equal(refundTool.annotations.idempotentHint, true);

  // A decide tool: structuredContent matches the declared outputSchema
  // (the SDK validates it).
  const decided = await client.callTool({ name: 'decide_triage_ticket',
    arguments: { input: { ticket_id: 'T-1', text: 'how do I reset my password?' } } });
  assert.equal(decided.isError, false);
  assert.equal(decided.structuredContent.output.category, 'question');
  assert.match(decided.content[0].text, /decision_id/);

  // A step schema with $ref: listed (above) and its answer validated by
  // the SDK against an outputSchema whose references resolve.
  const labelled = await client.callTool({ name: 'decide_label_ticket',
    arguments: { input: { ticket_id: 'T-2', text: 'hi' } } });
  assert.equal(labelled.isError, false, JSON.stringify(labelled));
  assert.equal(labelled.structuredContent.output.category, 'question');
  // References to the step schema's root resolve as in the step schema:
  // a recursive tree ("#"), a sibling property, definitions under an $id.
  for (const [name, expected] of [['tree_ticket', { category: 'root',
    children: [{ category: 'leaf', children: [] }] }], ['pair_ticket', { a: 'x', b: 'y' }],
  ['id_ticket', { category: 'question' }]]) {
    const got = await client.callTool({ name: `decide_${name}`,
      arguments: { input: { ticket_id: name, text: 'refs' } } });
    assert.equal(got.isError, false, JSON.stringify(got));
    for (const [field, value] of Object.entries(expected)) {
      assert.deepEqual(got.structuredContent.output[field], value, `${name}: ${field}`);
    }
  }
  // (The SDK checked each answer against the listed outputSchema: resolved
  // against the tool's root, "#" would have asked the child for a status.)
  const treeTool = tools.find((t) => t.name === 'decide_tree_ticket');
  assert.equal(treeTool.outputSchema.properties.output.properties.children.items.$ref,
    '#/properties/output');

  // A tool's argument cannot steer it onto another route: "export" is a
  // decision id here, not GET /v1/decisions/export (an operator's route).
  const exported = await client.callTool({ name: 'get_decision',
    arguments: { decision_id: 'export' } });
  assert.equal(exported.isError, true, JSON.stringify(exported).slice(0, 300));
  assert.ok(!JSON.stringify(exported).includes('T-1'), 'no decision came back');

  // cache "only" answers as the cache stands now: a miss, then (decided
  // over REST meanwhile) the hit, never the stored miss.
  const onlyArgs = { input: { ticket_id: 'T-50', text: 'later' }, cache: 'only' };
  const miss = await client.callTool({ name: 'decide_triage_ticket', arguments: onlyArgs });
  assert.equal(miss.isError, true, JSON.stringify(miss));
  const rest = await fetch(`${base}/v1/decide`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${agentToken}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ step: 'triage_ticket', input: onlyArgs.input }),
  });
  assert.equal(rest.status, 200);
  const hit = await client.callTool({ name: 'decide_triage_ticket', arguments: onlyArgs });
  assert.equal(hit.isError, false, JSON.stringify(hit));
  assert.equal(hit.structuredContent.cache, 'hit');

  // A client key is bounded as the Idempotency-Key header is.
  const longKey = await client.callTool({ name: 'do_send_reply',
    arguments: { ticket_id: 'T-L', text: 'x' }, _meta: { idempotencyKey: 'k'.repeat(300) } });
  assert.equal(longKey.isError, true);
  assert.match(longKey.content[0].text, /255/);

  // An action tool twice: one effect; the second says already_done with
  // the first result.
  const args = { ticket_id: 'T-1', text: 'hello' };
  const first = await client.callTool({ name: 'do_send_reply', arguments: args });
  assert.equal(first.isError, false, JSON.stringify(first));
  assert.equal(first.structuredContent.outcome, 'created');
  // The same call again in the same session (a retry after a timeout).
  const repeated = await client.callTool({ name: 'do_send_reply', arguments: args });
  assert.equal(repeated.structuredContent.outcome, 'already_done');
  assert.equal(repeated.structuredContent.external_ref, first.structuredContent.external_ref);
  // A new session (as after an agent restart) retries the same call.
  const client2 = new Client({ name: 'idem-e2e-2', version: '1.0.0' });
  await client2.connect(new StreamableHTTPClientTransport(new URL(`${base}/mcp`), {
    requestInit: { headers: { Authorization: `Bearer ${agentToken}` } } }));
  const second = await client2.callTool({ name: 'do_send_reply', arguments: args,
    _meta: { idempotencyKey: 'retry-after-timeout' } });
  assert.equal(second.structuredContent.outcome, 'already_done');
  assert.equal(second.structuredContent.external_ref, first.structuredContent.external_ref);
  assert.equal(effects.size, 1, 'one effect at the fake effector');

  // Bad arguments: an isError result naming the field.
  const bad = await client.callTool({ name: 'do_refund',
    arguments: { order_id: 'O-1', amount: 'lots' } });
  assert.equal(bad.isError, true);
  assert.match(bad.content[0].text, /amount/);

  // A call whose plan needs approval: awaiting_approval at once, no effect.
  const big = { order_id: 'O-2', amount: 500 };
  const waiting = await client.callTool({ name: 'do_refund', arguments: big });
  assert.equal(waiting.isError, false, JSON.stringify(waiting));
  assert.equal(waiting.structuredContent.outcome, 'awaiting_approval');
  const planId = waiting.structuredContent.plan_id;
  const plan = await client.callTool({ name: 'get_plan', arguments: { plan_id: planId } });
  assert.equal(plan.structuredContent.state, 'awaiting_approval');
  // A decide that asks for "refresh" decides again each time, as over REST.
  const refreshArgs = { input: { ticket_id: 'T-9', text: 'again' }, cache: 'refresh' };
  const fresh1 = await client.callTool({ name: 'decide_triage_ticket', arguments: refreshArgs });
  const fresh2 = await client.callTool({ name: 'decide_triage_ticket', arguments: refreshArgs });
  assert.equal(fresh1.structuredContent.cache, 'miss');
  assert.equal(fresh2.structuredContent.cache, 'miss');
  assert.notEqual(fresh1.structuredContent.decision_id, fresh2.structuredContent.decision_id,
    'a refresh is not answered from the first refresh');
  assert.equal(effects.size, 1);

  // An operator approves over REST (an edited amount); the same call then
  // returns the outcome.
  const approved = await fetch(`${base}/v1/plans/${planId}/approve`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${operatorToken}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ comment: 'ok', edits: [{ path: '/0/args/amount', value: 450 }] }),
  });
  assert.equal(approved.status, 200, await approved.clone().text());
  assert.equal(effects.size, 2);
  const outcome = await client.callTool({ name: 'do_refund', arguments: big });
  assert.equal(outcome.isError, false, JSON.stringify(outcome));
  assert.equal(outcome.structuredContent.outcome, 'already_done');
  assert.equal(effects.size, 2, 'approval applied it once; the call did not repeat it');
  assert.equal(bodies[1].amount, 450, 'the edited amount went out');
  // A poll of the plan sees the state as it is now, not its first answer.
  const polled = await client.callTool({ name: 'get_plan', arguments: { plan_id: planId } });
  assert.equal(polled.structuredContent.state, 'applied');

  // Client-executed work (a kind without an effector): the work routes
  // answer with text the tool result carries as an object.
  const claimed = await client.callTool({ name: 'claim_work',
    arguments: { kind: 'post_note', identity: { note_id: 'N-1' }, lease: '30s' } });
  assert.equal(claimed.isError, false, JSON.stringify(claimed));
  assert.equal(claimed.structuredContent.state, 'running');
  assert.match(claimed.structuredContent.lease_token, /^[0-9a-f]{32}$/);
  const done = await client.callTool({ name: 'complete_work', arguments: {
    work_id: claimed.structuredContent.work_id,
    lease_token: claimed.structuredContent.lease_token, result: { posted: true } } });
  assert.equal(done.isError, false, JSON.stringify(done));
  assert.equal(done.structuredContent.state, 'done');
  assert.deepEqual(done.structuredContent.result, { posted: true });
  const again = await client.callTool({ name: 'claim_work',
    arguments: { kind: 'post_note', identity: { note_id: 'N-1' } } });
  assert.equal(again.structuredContent.state, 'done');
  assert.equal(again.structuredContent.duplicate, true);

  // A claim excludes: a second agent (another session, the same token)
  // with the same arguments is told someone holds the work, and gets no
  // lease token; once the lease has run out it claims attempt 2 with a
  // token of its own.
  const note = { kind: 'post_note', identity: { note_id: 'N-2' }, lease: '1s' };
  const mine = await client.callTool({ name: 'claim_work', arguments: note });
  assert.equal(mine.isError, false, JSON.stringify(mine));
  const theirs = await client2.callTool({ name: 'claim_work', arguments: note });
  assert.equal(theirs.isError, true, JSON.stringify(theirs));
  assert.match(theirs.content[0].text, /holds this work under a live lease/);
  await new Promise((r) => setTimeout(r, 1200));
  const later = await client2.callTool({ name: 'claim_work', arguments: note });
  assert.equal(later.isError, false, JSON.stringify(later));
  assert.equal(later.structuredContent.attempt, 2);
  assert.notEqual(later.structuredContent.lease_token, mine.structuredContent.lease_token);
  const stale = await client.callTool({ name: 'complete_work', arguments: {
    work_id: mine.structuredContent.work_id, lease_token: mine.structuredContent.lease_token } });
  assert.equal(stale.isError, true, 'the first lease no longer holds the work');
  // The claimer's own retry (its answer lost) with its own key gets its lease back.
  const retryMeta = { idempotencyKey: 'claim-n3' };
  const n3 = { kind: 'post_note', identity: { note_id: 'N-3' } };
  const c1 = await client.callTool({ name: 'claim_work', arguments: n3, _meta: retryMeta });
  const c2 = await client.callTool({ name: 'claim_work', arguments: n3, _meta: retryMeta });
  assert.equal(c1.isError, false, JSON.stringify(c1));
  assert.equal(c2.structuredContent.lease_token, c1.structuredContent.lease_token);

  // Protocol faults are JSON-RPC errors; an unknown tool is -32602.
  await assert.rejects(client.callTool({ name: 'no_such_tool', arguments: {} }),
    (e) => e.code === -32602);
  await client.ping();

  // A wrong Origin is refused before anything runs.
  const evil = await fetch(`${base}/mcp`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${agentToken}`, 'Content-Type': 'application/json',
      Accept: 'application/json, text/event-stream', Origin: 'http://evil.example',
      'Mcp-Session-Id': transport.sessionId, 'MCP-Protocol-Version': '2025-11-25' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 9, method: 'tools/list' }),
  });
  assert.equal(evil.status, 403);

  // Ending the session: later requests under it are 404.
  const sid = transport.sessionId;
  const alive = await fetch(`${base}/mcp`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${agentToken}`, 'Content-Type': 'application/json',
      Accept: 'application/json', 'Mcp-Session-Id': sid },
    body: JSON.stringify({ jsonrpc: '2.0', id: 10, method: 'ping' }),
  });
  assert.equal(alive.status, 200);
  await transport.terminateSession();
  const gone = await fetch(`${base}/mcp`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${agentToken}`, 'Content-Type': 'application/json',
      Accept: 'application/json', 'Mcp-Session-Id': sid },
    body: JSON.stringify({ jsonrpc: '2.0', id: 11, method: 'ping' }),
  });
  assert.equal(gone.status, 404);
  await client.close();
  await client2.close();
  console.log('mcp_sdk: all checks passed');
} catch (e) {
  failed = true;
  console.error('mcp_sdk: FAILED:', e);
} finally {
  effector.close();
  const { code } = await stopDaemon(daemon);
  if (code !== 0) {
    // A clean stop exits 0 (under AddressSanitizer a leak makes it non-zero).
    failed = true;
    console.error(`mcp_sdk: FAILED: the daemon exited with ${code} after SIGTERM`);
  }
  rmSync(dir, { recursive: true, force: true });
}
process.exit(failed ? 1 : 0);
