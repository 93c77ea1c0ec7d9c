// End-to-end test of the operator page (/ui/) in a real browser: headless
// Chromium (Debian's `chromium`) driven by playwright-core (pinned in
// package-lock.json).
//
//   node tests/e2e/ui_approvals.mjs build/idem
//
// It starts the daemon with two tokens (an agent and an operator), an
// action kind `refund` that always needs approval and whose effector is a
// fake HTTP server in this process, and a step that escalates. The agent
// creates three plans through POST /v1/actions/refund (each 202, nothing
// sent). In the browser the operator signs in, approves plan 1, edits and
// approves plan 2, rejects plan 3 and resolves the escalation through its
// schema-checked form, and replays a dead letter (a flaky action whose only
// attempt failed). Then the fake effector must have received plan 1's args
// once, plan 2's edited args once and plan 3 never.
//
// Then a second daemon on the repository's default config, which has no
// auth.tokens: the page must not ask for a token, must say that anyone may
// act, and approves a refund over 100 as anonymous.
//
// Screenshots go to build/e2e-artifacts/ (IDEM_E2E_ARTIFACTS overrides);
// IDEM_UPDATE_DOCS_IMG=1 also copies the queue to docs/img/ui-queue.png.
// Exit code 0 when every check passed, 1 otherwise.
import crypto from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import {fileURLToPath} from 'node:url';
import {chromium} from 'playwright-core';

import {logTail, startDaemon, stopDaemon, waitReady} from './daemon.mjs';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const binary = path.resolve(process.argv[2] || path.join(root, 'build/idem'));
const artifacts = path.resolve(process.env.IDEM_E2E_ARTIFACTS || path.join(root, 'build/e2e-artifacts'));
const chromiumPath = process.env.IDEM_CHROMIUM || '/usr/bin/chromium';
const started = Date.now();

const AGENT = 'agent-secret-' + crypto.randomBytes(8).toString('hex');
const OPERATOR = 'operator-secret-' + crypto.randomBytes(8).toString('hex');
const sha = (s) => crypto.createHash('sha256').update(s).digest('hex');

let failures = 0;
function check(ok, what) {
  console.log((ok ? 'ok   ' : 'FAIL ') + what);
  if (!ok) failures++;
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
async function until(what, fn, ms = 10000) {
  const end = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) throw new Error('timed out waiting for ' + what);
    await sleep(100);
  }
}

// ------------------------------------------------------------ fake effector
// Speaks what the daemon's http effector expects (tests/fakes/fake_effector.h):
// POST /refunds -> 201 {"id", ...body}; records every call. POST /flaky
// fails its first call (500), so that action becomes a dead letter to replay.
const calls = [];
const effector = http.createServer((req, res) => {
  let data = '';
  req.on('data', (c) => { data += c; });
  req.on('end', () => {
    let body = null;
    try { body = JSON.parse(data); } catch { body = data; }
    calls.push({method: req.method, path: req.url, headers: req.headers, body, raw: data});
    if (req.url === '/flaky' && calls.filter((c) => c.path === '/flaky').length === 1) {
      res.writeHead(500, {'Content-Type': 'application/json'});
      res.end('{"error":"down for a moment"}');
      return;
    }
    const id = 'rf_' + calls.length;
    res.writeHead(201, {'Content-Type': 'application/json'});
    res.end(JSON.stringify({id, ...(typeof body === 'object' && body ? body : {})}));
  });
});
await new Promise((r) => effector.listen(0, '127.0.0.1', r));
const effectorUrl = `http://127.0.0.1:${effector.address().port}`;

// ------------------------------------------------------------ the daemon
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'idem-ui-e2e-'));
// The model always answers a refund with low priority, which the step's value
// checks forbid: one attempt, then an escalation.
fs.writeFileSync(path.join(dir, 'rules.yaml'), `default:
  output: '{"category":"refund","priority":"low","summary":"wants money back","actions":[]}'
`);
const config = `server:
  listen: 127.0.0.1:0
  threads: 16
store:
  engine: rocksdb
  path: ${dir}/data
auth:
  tokens:
    - {name: agent-1, sha256: ${sha(AGENT)}, roles: [agent]}
    - {name: op-1, sha256: ${sha(OPERATOR)}, roles: [operator]}
providers:
  demo:
    type: scripted
    rules: ${dir}/rules.yaml
steps:
  triage_ticket:
    provider: demo
    model: demo-1
    temperature: 0
    prompt:
      template: ${root}/config/prompts/triage_ticket.mustache
      version: v1
    output_schema: ${root}/schemas/examples/triage_ticket.v1.json
    checks: ${root}/policies/triage_ticket.yaml
    attempts: 1
    fallback: [escalate]
    timeout: 30s
    cache:
      window: forever
actions:
  refund:
    identity: {fields: [/order_id], version: v1}
    window: 24h
    on_duplicate: return_original
    effector: {http: {method: POST, url: "${effectorUrl}/refunds", idempotency: header}}
    retry: {attempts: 3, base: 10ms, cap: 50ms, timeout: 5s}
    approval: {require: always, reason: "refunds need a human"}
  flaky_ping:
    identity: {fields: [/ping_id], version: v1}
    window: 24h
    on_duplicate: return_original
    effector: {http: {method: POST, url: "${effectorUrl}/flaky", idempotency: header}}
    retry: {attempts: 1, base: 10ms, cap: 50ms, timeout: 5s}
`;
fs.writeFileSync(path.join(dir, 'idem.yaml'), config);

const daemon = startDaemon({binary, config: path.join(dir, 'idem.yaml'), workDir: dir});
let openDaemon = null;
let browser = null;
async function cleanup() {
  if (browser) await browser.close().catch(() => {});
  await stopDaemon(daemon);
  await stopDaemon(openDaemon);
  effector.close();
}

async function main() {
  const base = await waitReady(daemon, {timeoutMs: 40000});

  const call = async (method, p, token, body, headers = {}) => {
    const res = await fetch(base + p, {
      method,
      headers: {Authorization: 'Bearer ' + token, ...(body ? {'Content-Type': 'application/json'} : {}), ...headers},
      body: body ? JSON.stringify(body) : undefined,
    });
    const text = await res.text();
    let json = null;
    try { json = JSON.parse(text); } catch { json = text; }
    return {status: res.status, body: json, headers: res.headers};
  };

  // The page's own answers: public, never cached, a strict CSP.
  const page0 = await fetch(base + '/ui/');
  check(page0.status === 200 && page0.headers.get('content-type').startsWith('text/html'), 'GET /ui/ is HTML');
  check(page0.headers.get('cache-control') === 'no-store', '/ui/ is Cache-Control: no-store');
  check(/default-src 'none'/.test(page0.headers.get('content-security-policy') || '') &&
        /script-src 'self'/.test(page0.headers.get('content-security-policy') || ''), '/ui/ has a strict CSP');
  check(page0.headers.get('x-content-type-options') === 'nosniff', '/ui/ is nosniff');
  const js = await fetch(base + '/ui/app.js');
  check(js.status === 200 && js.headers.get('content-type').startsWith('text/javascript'), '/ui/app.js is JavaScript');
  const redirect = await fetch(base + '/ui', {redirect: 'manual'});
  check([301, 302, 307, 308].includes(redirect.status) && redirect.headers.get('location') === '/ui/', 'GET /ui redirects to /ui/');
  check((await fetch(base + '/ui/nope.js')).status === 404, 'an unknown /ui/ file is 404');

  // Three refunds as the agent: each waits for a human, nothing is sent.
  const orders = [
    {order_id: 'A-1', amount: 120, currency: 'EUR'},
    {order_id: 'B-2', amount: 250, currency: 'EUR'},
    {order_id: 'C-3', amount: 999, currency: 'EUR'},
  ];
  const plans = [];
  for (const args of orders) {
    const r = await call('POST', '/v1/actions/refund', AGENT, {args}, {'Idempotency-Key': '"ui-e2e-' + args.order_id + '"'});
    check(r.status === 202 && typeof r.body.plan_id === 'string', `POST /v1/actions/refund ${args.order_id} -> 202 with a plan id (got ${r.status})`);
    if (r.status !== 202) throw new Error('cannot go on without plans: ' + JSON.stringify(r.body));
    plans.push(r.body.plan_id);
  }
  check(calls.length === 0, 'nothing reached the effector before approval');

  // A dead letter: the only attempt of a flaky ping fails.
  await call('POST', '/v1/actions/flaky_ping', AGENT, {args: {ping_id: 'P-1'}}, {'Idempotency-Key': '"ui-e2e-ping"'});
  const dead = await until('the dead letter', async () => {
    const r = await call('GET', '/v1/dead-letters', OPERATOR);
    return r.body.items?.length === 1 ? r.body.items[0] : null;
  });

  // An escalation: the step's only attempt fails its checks.
  const esc = await call('POST', '/v1/decide', AGENT, {step: 'triage_ticket', input: {ticket_id: '42', text: 'refund please'}});
  check(esc.status === 200 && esc.body.status === 'escalated', 'the decide escalates');
  const step = await call('GET', '/v1/steps/triage_ticket', OPERATOR);
  check(step.status === 200 && step.body.output_schema?.properties?.priority !== undefined, 'GET /v1/steps/{name} has the output schema');

  // ---------------------------------------------------------- the browser
  fs.mkdirSync(artifacts, {recursive: true});
  browser = await chromium.launch({executablePath: chromiumPath, headless: true});
  const pageErrors = [];
  // A page in a fresh context (its own sessionStorage) whose script errors
  // and CSP violations land in pageErrors.
  const newPage = async () => {
    const p = await (await browser.newContext({viewport: {width: 1280, height: 860}})).newPage();
    p.on('pageerror', (e) => pageErrors.push('pageerror: ' + e.message));
    p.on('console', (m) => { if (m.type() === 'error') pageErrors.push('console: ' + m.text()); });
    p.setDefaultTimeout(10000);
    return p;
  };
  const page = await newPage();

  await page.goto(base + '/ui/');
  // A wrong token is refused readably, then the operator's is taken.
  await page.fill('#token', 'not-a-token');
  await page.press('#token', 'Enter');
  await page.waitForSelector('.problem');
  check((await page.textContent('.problem')).includes('401'), 'a wrong token shows the 401 problem');
  check(!(await page.isVisible('#open-banner')), 'a daemon with tokens shows no open-daemon banner');
  // An agent's token reads the queue but may decide nothing: refused here.
  await page.fill('#token', AGENT);
  await page.press('#token', 'Enter');
  await until('the agent token refused', async () =>
    (await page.textContent('.problem')).includes('403') ? true : null);
  check(await page.$('#token') !== null, 'an agent\'s token is refused at sign-in (403), still asking for a token');
  pageErrors.length = 0;  // the browser logs the refused request itself
  await page.fill('#token', OPERATOR);
  await page.press('#token', 'Enter');
  for (const id of plans) await page.waitForSelector(`tr[data-plan="${id}"]`);
  check(true, 'the queue lists the three plans');
  check((await page.textContent('#queue')).includes('refunds need a human'), 'the queue shows the policy reason');
  const stored = await page.evaluate(() => sessionStorage.getItem('idem.token'));
  check(stored === OPERATOR, 'the token is kept in sessionStorage');
  await page.screenshot({path: path.join(artifacts, 'ui-queue.png')});

  // Plan 1: approve with a comment.
  await page.click(`a[href="#/plans/${plans[0]}"]`);
  await page.waitForSelector('#approve');
  check((await page.textContent('main')).includes('"order_id": "A-1"'), 'the detail shows the action args');
  await page.screenshot({path: path.join(artifacts, 'ui-plan.png'), fullPage: true});
  // With the keyboard only: type the comment, Tab to Approve, Enter.
  await page.focus('#approve-comment');
  await page.keyboard.type('ok, known customer');
  await page.keyboard.press('Tab');
  check(await page.evaluate(() => document.activeElement.id) === 'approve', 'Tab from the comment reaches Approve');
  await page.keyboard.press('Enter');
  await page.waitForSelector('h1 + .badge:not(.state-awaiting_approval)');
  const p1 = await call('GET', '/v1/plans/' + plans[0], OPERATOR);
  check(['approved', 'applying', 'applied'].includes(p1.body.state) && p1.body.approved_by === 'op-1' &&
        p1.body.comment === 'ok, known customer', `plan 1 approved by op-1 with the comment (state ${p1.body.state})`);

  // Plan 2: edit the amount, then approve; the detail then shows the diff.
  await page.goto(base + '/ui/#/plans/' + plans[1]);
  await page.waitForSelector('#edit');
  await page.click('#edit');
  await page.fill('#edit-args-0', JSON.stringify({order_id: 'B-2', amount: 90, currency: 'EUR'}, null, 2));
  await page.click('#approve-edited');
  await page.waitForSelector('table.diff');
  const diffText = await page.textContent('table.diff');
  check(diffText.includes('/0/args/amount') && diffText.includes('250') && diffText.includes('90'),
        'plan 2 detail shows the edit as a diff');
  await page.screenshot({path: path.join(artifacts, 'ui-plan-edited.png'), fullPage: true});

  // Plan 3: reject; an empty reason is refused in the page first.
  await page.goto(base + '/ui/#/plans/' + plans[2]);
  await page.waitForSelector('#reject');
  await page.click('#reject');
  await page.waitForSelector('.outcome .error');
  await page.fill('#reject-reason', 'amount too high for this order');
  await page.click('#reject');
  await page.waitForSelector('h1 + .badge.state-rejected');
  check(true, 'plan 3 shows rejected');

  // A second approve of plan 1 (another tab's stale page) is a readable 409.
  const again = await call('POST', `/v1/plans/${plans[0]}/approve`, OPERATOR, {});
  check(again.status === 409, 'approving plan 1 again is 409');

  // A stale page: plan S-5 is opened, then rejected elsewhere. Its Approve
  // sends the updated_at_ms it showed, is refused (409), and the page shows
  // the plan as it is now, with the refusal above it.
  const stale = await call('POST', '/v1/actions/refund', AGENT, {args: {order_id: 'S-5', amount: 77, currency: 'EUR'}},
                           {'Idempotency-Key': '"ui-e2e-S-5"'});
  const staleId = stale.body.plan_id;
  const staleRead = await call('GET', '/v1/plans/' + staleId, OPERATOR);
  await page.goto(base + '/ui/#/plans/' + staleId);
  await page.waitForSelector('#approve');
  const approveBodies = [];
  page.on('request', (r) => { if (r.url().endsWith('/' + staleId + '/approve')) approveBodies.push(r.postData()); });
  const elsewhere = await call('POST', `/v1/plans/${staleId}/reject`, OPERATOR, {reason: 'handled by phone'});
  check(elsewhere.status === 200, 'plan S-5 is rejected through the API while its page is open');
  await page.click('#approve');
  await page.waitForSelector('#plan-notice');
  check((await page.textContent('#plan-notice')).includes('409'), 'the stale page\'s Approve shows the 409');
  check(await page.$('h1 + .badge.state-rejected') !== null && await page.$('#approve') === null,
        'and then the plan as it is now: rejected, with no buttons');
  check((await page.textContent('main')).includes('handled by phone'), 'with the rejection\'s reason');
  check(approveBodies.length === 1 && JSON.parse(approveBodies[0]).expect_updated_at_ms === staleRead.body.updated_at_ms,
        `Approve sent the updated_at_ms the page showed (${approveBodies[0]})`);
  pageErrors.length = 0;  // the browser logs the refused approve itself

  // Text that reorders itself (a right-to-left override) is shown escaped:
  // "O-9<RLO>0001<PDF>" would read "O-91000".
  const bidi = await call('POST', '/v1/actions/refund', AGENT,
                          {args: {order_id: 'O-9\u202e0001\u202c', amount: 50, currency: 'EUR'}},
                          {'Idempotency-Key': '"ui-e2e-bidi"'});
  await page.goto(base + '/ui/#/plans/' + bidi.body.plan_id);
  await page.waitForSelector('#approve');
  const bidiText = await page.textContent('main');
  check(bidiText.includes('O-9\\u202e0001\\u202c') && !bidiText.includes('\u202e'),
        'a bidi control in the args is shown as \\u202e, not applied');
  check(JSON.parse(await page.inputValue('#edit-args-0')).order_id === 'O-9\u202e0001\u202c',
        'the args editor holds the escape, which parses back to the same value');
  await call('POST', `/v1/plans/${bidi.body.plan_id}/reject`, OPERATOR, {reason: 'not a real order'});

  // Characters that hide themselves: "O-1<soft hyphen>000" reads "O-1000",
  // and tag characters (above U+FFFF) show nothing at all.
  const hiddenId = 'O-1\u00ad000\u{E0030}\u2064';
  const hidden = await call('POST', '/v1/actions/refund', AGENT,
                            {args: {order_id: hiddenId, amount: 50, currency: 'EUR'}},
                            {'Idempotency-Key': '"ui-e2e-hidden"'});
  await page.goto(base + '/ui/#/plans/' + hidden.body.plan_id);
  await page.waitForSelector('#approve');
  const hiddenText = await page.textContent('main');
  check(hiddenText.includes('O-1\\u00ad000\\udb40\\udc30\\u2064') &&
            !hiddenText.includes('\u00ad') && !hiddenText.includes('\u{E0030}'),
        'a soft hyphen, a tag character and an invisible operator are shown as escapes');
  check(JSON.parse(await page.inputValue('#edit-args-0')).order_id === hiddenId,
        'and the args editor parses back to the same value');
  await call('POST', `/v1/plans/${hidden.body.plan_id}/reject`, OPERATOR, {reason: 'not a real order'});

  // Plan 4: an account number beyond 2^53, sent as raw JSON (JavaScript
  // cannot write it). Chromium has JSON.rawJSON: the page shows the account
  // exactly, an edit of it is sent exactly, and the diff tells the two
  // numbers apart (JSON.parse would make both ...992).
  const bigPlanFor = async (orderId) => {
    const res = await fetch(base + '/v1/actions/refund', {
      method: 'POST',
      headers: {Authorization: 'Bearer ' + AGENT, 'Content-Type': 'application/json', 'Idempotency-Key': `"ui-e2e-${orderId}"`},
      body: `{"args":{"order_id":"${orderId}","amount":300,"account":9007199254740993,"currency":"EUR"}}`,
    });
    check(res.status === 202, `a refund with a 2^53+1 account waits for approval (${res.status})`);
    return (await res.json()).plan_id;
  };
  const exactPlan = await bigPlanFor('D-3');
  await page.goto(base + '/ui/#/plans/' + exactPlan);
  await page.waitForSelector('#edit');
  check((await page.textContent('article.action pre.json')).includes('"account": 9007199254740993'),
        'the page shows the account exactly');
  check(!(await page.$('#inexact-numbers')), 'no "shown rounded" notice where the browser keeps the digits');
  await page.click('#edit');
  const exactShown = await page.inputValue('#edit-args-0');
  check(exactShown.includes('"account": 9007199254740993'), 'the editor holds the exact account');
  await page.fill('#edit-args-0', exactShown.replace('"account": 9007199254740993', '"account": 9007199254740995'));
  await page.click('#approve-edited');
  await page.waitForSelector('table.diff');
  const exactDiff = await page.textContent('table.diff');
  check(exactDiff.includes('/0/args/account') && exactDiff.includes('9007199254740993') &&
        exactDiff.includes('9007199254740995') && !exactDiff.includes('/0/args/amount'),
        `the diff shows the account's two exact values (${exactDiff})`);
  const forD3 = await until('refund D-3 at the effector', () =>
    calls.find((c) => c.path === '/refunds' && c.body && c.body.order_id === 'D-3'));
  check(forD3.raw.includes('"account":9007199254740995') && forD3.body.amount === 300,
        `the effector got the edited account exactly (${forD3.raw})`);

  // The same plan in a browser without JSON.rawJSON: the page says it shows
  // the account rounded, refuses to send it back, and an edit of the amount
  // sends only the amount: the exact account reaches the effector.
  const oldPage = await newPage();
  await oldPage.addInitScript(() => { delete JSON.rawJSON; delete JSON.isRawJSON; });
  const errorsBefore = pageErrors.length;
  await oldPage.goto(base + '/ui/');
  await oldPage.fill('#token', OPERATOR);
  await oldPage.press('#token', 'Enter');
  await oldPage.waitForSelector('#queue');
  // The browser logs the page's first, token-less look at the daemon (401).
  pageErrors.push(...pageErrors.splice(errorsBefore).filter((e) => !e.includes('status of 401')));
  const bigPlan = await bigPlanFor('D-4');
  await oldPage.goto(base + '/ui/#/plans/' + bigPlan);
  await oldPage.waitForSelector('#inexact-numbers');
  check((await oldPage.textContent('#inexact-numbers')).includes('/0/args/account'),
        'without JSON.rawJSON the page names the number it can only show rounded');
  await oldPage.click('#edit');
  const shown = await oldPage.inputValue('#edit-args-0');
  await oldPage.fill('#edit-args-0', shown.replace(/"account": \d+/, '"account": 9007199254740995'));
  await oldPage.click('#approve-edited');
  await oldPage.waitForSelector('.field .error:not(:empty)');
  check((await oldPage.textContent('.field .error')).includes('/0/args/account'),
        'an edit of that number is refused in the page, naming it');
  await oldPage.fill('#edit-args-0', shown.replace('"amount": 300', '"amount": 30'));
  await oldPage.click('#approve-edited');
  await oldPage.waitForSelector('table.diff');
  const bigDiff = await oldPage.textContent('table.diff');
  check(bigDiff.includes('/0/args/amount') && !bigDiff.includes('/0/args/account'),
        'the diff shows the amount alone');
  const forD = await until('refund D-4 at the effector', () =>
    calls.find((c) => c.path === '/refunds' && c.body && c.body.order_id === 'D-4'));
  check(forD.raw.includes('"account":9007199254740993') && forD.body.amount === 30,
        `the effector got the exact account and the edited amount (${forD.raw})`);
  await oldPage.context().close();

  // The escalation: a schema-invalid answer is caught in the browser, a valid one resolves it.
  await page.goto(base + '/ui/#/escalations');
  await page.waitForSelector('section.escalation textarea');
  // An answer the schema takes but the daemon's value checks refuse: the
  // daemon's problem is shown, and goes once the answer is edited again.
  const refused = {category: 'refund', priority: 'low', summary: 'refund approved', actions: []};
  await page.fill('section.escalation textarea', JSON.stringify(refused));
  await page.click('button.resolve');
  await page.waitForSelector('section.escalation .problem');
  check((await page.textContent('section.escalation .problem')).includes('value check'),
    'the daemon\'s value-check refusal is shown');
  // The browser logs that refused request itself; it is no script error.
  const logged = pageErrors.splice(0).filter((e) => !e.includes('status of 400'));
  pageErrors.push(...logged);
  const bad = {category: 'refund', priority: 'urgent', summary: 'refund approved', actions: []};
  await page.fill('section.escalation textarea', JSON.stringify(bad));
  await page.click('button.resolve');
  await page.waitForSelector('.check .error');
  check((await page.textContent('.check')).includes('/priority'), 'the form names the invalid field (/priority) before sending');
  check(await page.$('section.escalation .problem') === null,
    'the earlier refusal is gone: only the current problem is shown');
  const stillOpen = await call('GET', '/v1/escalations?state=open', OPERATOR);
  check(stillOpen.body.items?.length === 1, 'the invalid answer was not sent');
  const good = {category: 'refund', priority: 'high', summary: 'refund approved by ops', actions: []};
  await page.fill('section.escalation textarea', JSON.stringify(good, null, 2));
  await page.click('button.resolve');
  await page.waitForSelector('text=No open escalations.');
  const open = await call('GET', '/v1/escalations?state=open', OPERATOR);
  check(open.body.items?.length === 0, 'the escalation is resolved');
  const after = await call('POST', '/v1/decide', AGENT, {step: 'triage_ticket', input: {ticket_id: '42', text: 'refund please'}});
  check(after.body.status === 'decided' && after.body.decided_by === 'human' && after.body.output?.priority === 'high',
        "the human's answer is now the decision");

  // The dead letter: replayed from its page, the effector now takes it.
  await page.goto(base + '/ui/#/dead-letters');
  await page.waitForSelector(`button.replay[data-work="${dead.work_id}"]`);
  await page.click(`button.replay[data-work="${dead.work_id}"]`);
  await page.waitForSelector('text=No dead letters.');
  const pings = calls.filter((c) => c.path === '/flaky');
  check(pings.length === 2 && pings[1].body.ping_id === 'P-1', `the replay reached the effector (${pings.length} calls in all)`);

  // Back to the queue: empty.
  await page.goto(base + '/ui/#/plans');
  await page.waitForSelector('text=No plan awaits approval.');
  check(true, 'the queue is empty after the three decisions');
  // The queue on a phone, for the README's reviewers.
  await page.setViewportSize({width: 390, height: 844});
  await page.goto(base + '/ui/#/plans?state=applied');
  await page.waitForSelector(`tr[data-plan="${plans[0]}"]`);
  await page.screenshot({path: path.join(artifacts, 'ui-phone.png')});

  // A queue longer than a page: the older plans are a click away.
  await page.setViewportSize({width: 1280, height: 860});
  const many = [];
  for (let i = 0; i < 51; ++i) {
    const r = await call('POST', '/v1/actions/refund', AGENT, {args: {order_id: 'Q-' + i, amount: 1, currency: 'EUR'}},
                         {'Idempotency-Key': '"ui-e2e-q-' + i + '"'});
    many.push(r.body.plan_id);
  }
  await page.goto(base + '/ui/#/plans');
  await page.waitForSelector('#more');
  check(await page.$$eval('tr[data-plan]', (rows) => rows.length) === 50, 'the queue shows its newest 50');
  check(await page.$(`tr[data-plan="${many[0]}"]`) === null, 'the oldest waiting plan is not on the first page');
  await page.click('#more');
  await page.waitForSelector(`tr[data-plan="${many[0]}"]`);
  check(await page.$('#more') === null, 'all 51 are shown after one click, and nothing is left to show');
  check(pageErrors.length === 0, 'no script error or CSP violation in the page' + (pageErrors.length ? ': ' + pageErrors.join(' | ') : ''));

  // ---------------------------------------------------------- at the effector
  const forOrder = (id) => calls.filter((c) => c.path === '/refunds' && c.body && c.body.order_id === id);
  await until('both approved refunds at the effector', () => forOrder('A-1').length >= 1 && forOrder('B-2').length >= 1);
  await sleep(500);  // a duplicate would land now
  const a = forOrder('A-1'), b = forOrder('B-2'), c = forOrder('C-3');
  check(a.length === 1 && a[0].body.amount === 120, `plan 1's args reached the effector once (${a.length})`);
  check(b.length === 1 && b[0].body.amount === 90, `plan 2's edited args reached the effector once (${b.length}, amount ${b[0]?.body.amount})`);
  check(c.length === 0, `plan 3 never reached the effector (${c.length})`);
  const refunds = calls.filter((c) => c.path === '/refunds').length;
  check(refunds === 4, `four refunds in all: A-1, B-2, D-3, D-4 (${refunds})`);
  const p2 = await call('GET', '/v1/plans/' + plans[1], OPERATOR);
  check(p2.body.original_actions?.[0]?.args?.amount === 250 && p2.body.actions?.[0]?.args?.amount === 90,
        'plan 2 keeps both versions');

  // ---------------------------------------------------------- no auth.tokens
  // The repository's default config: nothing to sign in with, so the page
  // asks for nothing and says who may act.
  const openDir = path.join(dir, 'open');
  fs.mkdirSync(openDir);
  openDaemon = startDaemon({binary, config: path.join(root, 'config/idem.yaml'), workDir: openDir});
  const openBase = await waitReady(openDaemon, {timeoutMs: 40000});
  const refund = await fetch(openBase + '/v1/actions/refund', {
    method: 'POST',
    headers: {'Content-Type': 'application/json', 'Idempotency-Key': '"ui-e2e-open"'},
    body: JSON.stringify({args: {order_id: 'O-1', amount: 500}}),
  });
  const openPlan = (await refund.json()).plan_id;
  check(refund.status === 202, `a refund of 500 on the default config waits for approval (${refund.status})`);
  const openPage = await newPage();
  await openPage.goto(openBase + '/ui/');
  await openPage.waitForSelector(`tr[data-plan="${openPlan}"]`);
  check(await openPage.$('#token') === null, 'no token is asked for');
  check(await openPage.isVisible('#open-banner') &&
        (await openPage.textContent('#open-banner')).includes('anyone who can reach it'),
        'the page says that anyone may act');
  check((await openPage.textContent('#queue')).includes('refunds over 100 need a human'),
        'the queue shows the default config\'s policy reason');
  await openPage.screenshot({path: path.join(artifacts, 'ui-open.png')});
  await openPage.click(`a[href="#/plans/${openPlan}"]`);
  await openPage.waitForSelector('#approve');
  await openPage.click('#approve');
  await openPage.waitForSelector('h1 + .badge:not(.state-awaiting_approval)');
  const approvedOpen = await (await fetch(openBase + '/v1/plans/' + openPlan)).json();
  check(approvedOpen.approved_by === 'anonymous', `approved as anonymous (${approvedOpen.approved_by})`);
  check(pageErrors.length === 0, 'no script error on the open daemon\'s page' + (pageErrors.length ? ': ' + pageErrors.join(' | ') : ''));

  if (process.env.IDEM_UPDATE_DOCS_IMG === '1') {
    fs.mkdirSync(path.join(root, 'docs/img'), {recursive: true});
    fs.copyFileSync(path.join(artifacts, 'ui-queue.png'), path.join(root, 'docs/img/ui-queue.png'));
  }
}

try {
  await main();
} catch (e) {
  failures++;
  console.log('FAIL ' + (e.stack || e));
  for (const d of [daemon, openDaemon]) {
    if (d) console.log('daemon log (tail):\n' + logTail(d, 4000));
  }
} finally {
  await cleanup();
  fs.rmSync(dir, {recursive: true, force: true});
}
console.log(`${failures ? 'FAILED' : 'passed'}: ui_approvals in ${((Date.now() - started) / 1000).toFixed(1)} s; screenshots in ${artifacts}`);
process.exit(failures ? 1 : 0);
