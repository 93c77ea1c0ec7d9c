// idem operator page: the approval queue, a plan's detail (approve, edit
// and approve, reject), dead letters (replay) and open escalations (resolve,
// checked against the step's output schema first). Plain JavaScript, no
// build step; the DOM is built with createElement and textContent only, so
// no server data is ever parsed as HTML. The bearer token is asked once and
// kept in sessionStorage (gone when the tab closes); a daemon without
// auth.tokens (it answers without one) is used without asking, under a
// banner that says anyone may act.
'use strict';

const TOKEN_KEY = 'idem.token';
const QUEUE_REFRESH_MS = 3000;
const QUEUE_PAGE = 50;  // plans a page of the queue
const DETAIL_REFRESH_MS = 2000;
const LIST_SHOWN = 100;  // dead letters and escalations a page shows
const STATES = ['awaiting_approval', 'proposed', 'approved', 'applying', 'applied',
                'partially_failed', 'rejected', 'expired'];

let timer = null;          // the current view's auto-refresh
let openDaemon = null;     // null: not asked yet; true: the daemon has no auth.tokens
let viewSeq = 0;           // bumps on every navigation; stale answers are dropped
let planNotice = null;     // a refusal to show above the plan once it is shown again
const replayKeys = new Map();  // work_id -> Idempotency-Key until the replay answered
const stepCache = new Map();   // step name -> {name, provider, model, output_schema}

// ---------------------------------------------------------------- DOM helpers

// Characters that reorder or hide text, and other controls, as \uXXXX
// (a surrogate pair above U+FFFF): Unicode's Default_Ignorable_Code_Point
// set (bidi controls and isolates, zero width characters, the soft hyphen,
// variation selectors, fillers, tags) and the format characters (Cf), as
// the CLI shows them: "O-9<RLO>0001" would otherwise read "O-91000", and
// "O-1<soft hyphen>000" "O-1000". In JSON text (only inside strings) the
// escape is JSON's own, so what the editors hold parses back to the same
// value. Line breaks and tabs stay.
const HIDDEN = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\p{Cf}\p{Default_Ignorable_Code_Point}]/gu;
function visible(s) {
  return String(s).replace(HIDDEN, c => Array.from(
      {length: c.length}, (_, i) => '\\u' + c.charCodeAt(i).toString(16).padStart(4, '0')).join(''));
}

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k === 'text') el.textContent = visible(v);
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'value') el.value = visible(v);
    else el.setAttribute(k, v === true ? '' : visible(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(visible(c)));
  }
  return el;
}

function pretty(v) { return JSON.stringify(v, null, 2); }

// JSON.parse rounds an integer beyond 2^53 (9007199254740993 becomes ...992).
// Where the browser has JSON.rawJSON (source text access, Chromium since
// 114), such an integer is kept as its digits instead:
// shown, compared, edited and sent back exactly (JSON.stringify writes a raw
// JSON value as it is). Elsewhere the page says it shows such numbers rounded
// and refuses to send them (inexactNumbers).
const exactJson = typeof JSON.rawJSON === 'function' && typeof JSON.isRawJSON === 'function';
function parseJson(text) {
  if (!exactJson) return JSON.parse(text);
  return JSON.parse(text, (k, v, ctx) =>
    typeof v === 'number' && Number.isInteger(v) && !Number.isSafeInteger(v) &&
    ctx && typeof ctx.source === 'string' ? JSON.rawJSON(ctx.source) : v);
}
function isRaw(v) { return exactJson && v !== null && typeof v === 'object' && JSON.isRawJSON(v); }
// A JSON object or array (not a raw number).
function isJsonObj(v) { return v !== null && typeof v === 'object' && !isRaw(v); }
function jsonBlock(v, label) {
  return h('pre', {class: 'json', tabindex: 0, 'aria-label': label || 'JSON'}, pretty(v));
}
function when(ms) {
  if (!ms) return '';
  const d = new Date(ms);
  return d.toLocaleString(undefined, {dateStyle: 'short', timeStyle: 'medium'});
}
function ago(ms) {
  if (!ms) return '';
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 60) return s + ' s ago';
  if (s < 3600) return Math.round(s / 60) + ' min ago';
  if (s < 86400) return Math.round(s / 3600) + ' h ago';
  return Math.round(s / 86400) + ' d ago';
}
function badge(state) { return h('span', {class: 'badge state-' + state}, state.replace(/_/g, ' ')); }
function main() { return document.getElementById('main'); }
function setView(...nodes) {
  const m = main();
  m.replaceChildren(...nodes);
}
function toast(msg) {
  const t = document.getElementById('toast');
  t.textContent = visible(msg);
  t.classList.add('show');
  clearTimeout(toast.t);
  toast.t = setTimeout(() => t.classList.remove('show'), 4000);
}

// ---------------------------------------------------------------- the API

class ApiError extends Error {
  constructor(status, problem) {
    super((problem && (problem.detail || problem.title)) || ('HTTP ' + status));
    this.status = status;
    this.problem = problem || {};
  }
}

function token() { return sessionStorage.getItem(TOKEN_KEY) || ''; }

// Does the daemon answer an operator's read without a token (no auth.tokens)?
async function answersWithoutToken() {
  try {
    const res = await fetch('/v1/plans?state=awaiting_approval&limit=1',
                            {headers: {'Accept': 'application/json'}, cache: 'no-store', credentials: 'omit'});
    return res.ok;
  } catch (e) {
    return false;
  }
}

async function api(method, path, body, headers) {
  const hs = {'Accept': 'application/json'};
  if (token()) hs['Authorization'] = 'Bearer ' + token();
  if (method !== 'GET') hs['Content-Type'] = 'application/json';
  Object.assign(hs, headers || {});
  let res;
  try {
    res = await fetch(path, {
      method, headers: hs, cache: 'no-store', credentials: 'omit',
      body: method === 'GET' ? undefined : JSON.stringify(body === undefined ? {} : body),
    });
  } catch (e) {
    throw new ApiError(0, {title: 'Network error', detail: 'the daemon did not answer (' + e.message + ')'});
  }
  const text = await res.text();
  let data = null;
  try { data = text ? parseJson(text) : null; } catch (e) { data = {detail: text}; }
  if (res.status === 401) {
    sessionStorage.removeItem(TOKEN_KEY);
    if (openDaemon) openDaemon = null;  // tokens were configured since: ask again
    route();
    throw new ApiError(401, data);
  }
  if (!res.ok) throw new ApiError(res.status, data);
  return {status: res.status, body: data};
}

// An RFC 9457 problem, readable: title, detail, the field it is about.
function problemBox(err) {
  const p = err instanceof ApiError ? err.problem : {detail: String(err && err.message || err)};
  const field = p.pointer || p.field;
  const extra = [];
  if (p.state) extra.push(h('li', {}, 'state: ', h('code', {}, p.state)));
  if (p.plan_id) extra.push(h('li', {}, 'plan: ', h('code', {}, p.plan_id)));
  if (p.request_id) extra.push(h('li', {}, 'request id: ', h('code', {}, p.request_id)));
  return h('div', {class: 'problem', role: 'alert'},
    h('strong', {}, (err.status ? err.status + ' ' : '') + (p.title || 'Error')),
    p.detail ? h('p', {}, p.detail) : null,
    field ? h('p', {}, 'Field: ', h('code', {}, field)) : null,
    extra.length ? h('ul', {}, extra) : null);
}

function newIdempotencyKey() {
  const b = new Uint8Array(16);
  crypto.getRandomValues(b);  // randomUUID needs a secure context; this works on plain http too
  return '"ui-' + Array.from(b, x => x.toString(16).padStart(2, '0')).join('') + '"';
}

// ---------------------------------------------------------------- routing

function stopTimer() { if (timer) { clearInterval(timer); timer = null; } }

function route() {
  stopTimer();
  const seq = ++viewSeq;
  const hash = location.hash || '#/plans';
  const [path, query] = hash.slice(1).split('?');
  const params = new URLSearchParams(query || '');
  const parts = path.split('/').filter(Boolean);
  const section = parts[0] || 'plans';
  for (const a of document.querySelectorAll('nav a')) {
    if (a.dataset.section === section) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  document.getElementById('forget').hidden = !token();
  if (!token() && openDaemon === null) {
    answersWithoutToken().then((open) => {
      openDaemon = open;
      if (live(seq)) route();
    });
    return;
  }
  document.getElementById('open-banner').hidden = !(openDaemon && !token());
  if (!token() && !openDaemon) return showLogin();
  if (section !== 'plans' || parts[1]) refreshCount();
  if (section === 'plans' && parts[1]) return showPlan(decodeURIComponent(parts[1]), seq);
  if (section === 'plans') return showQueue(params.get('state') || 'awaiting_approval', seq);
  if (section === 'dead-letters') return showDeadLetters(seq);
  if (section === 'escalations') return showEscalations(seq);
  setView(h('h1', {}, 'Not found'), h('p', {}, h('a', {href: '#/plans'}, 'Back to the queue')));
}

function live(seq) { return seq === viewSeq; }

// ---------------------------------------------------------------- login

function showLogin(error) {
  const input = h('input', {id: 'token', type: 'password', autocomplete: 'off', required: true,
                            spellcheck: 'false', 'aria-describedby': 'token-help'});
  const out = h('div', {}, error ? problemBox(error) : null);
  const form = h('form', {class: 'card login', onsubmit: async (e) => {
    e.preventDefault();
    const t = input.value.trim();
    if (!t) return;
    sessionStorage.setItem(TOKEN_KEY, t);
    try {
      // An operator's route: an agent's token reads the queue, and would
      // find every button refused.
      await api('GET', '/v1/dead-letters?limit=1');
      route();
    } catch (err) {
      sessionStorage.removeItem(TOKEN_KEY);
      showLogin(err.status === 401
          ? new ApiError(401, {title: 'Unauthorized', detail: 'the daemon does not know this token'})
          : err);
    }
  }},
    h('h1', {}, 'Sign in'),
    h('label', {for: 'token'}, 'Operator token'),
    input,
    h('p', {id: 'token-help', class: 'muted'},
      'A bearer token with the operator role. It stays in this tab (session storage) and is sent ',
      'only to this daemon.'),
    h('button', {type: 'submit', class: 'primary'}, 'Continue'),
    out);
  document.getElementById('forget').hidden = true;
  setView(form);
  input.focus();
}

// ---------------------------------------------------------------- the queue

function planKinds(p) {
  const kinds = (p.actions || []).map(a => a.kind);
  return kinds.length ? kinds.join(', ') : '(no actions)';
}

async function showQueue(state, seq) {
  const select = h('select', {id: 'state-filter', onchange: () => {
    location.hash = '#/plans' + (select.value === 'awaiting_approval' ? '' : '?state=' + select.value);
  }}, STATES.map(s => h('option', {value: s, selected: s === state}, s.replace(/_/g, ' '))));
  const body = h('div', {id: 'queue'}, h('p', {class: 'muted'}, 'Loading…'));
  const stamp = h('span', {class: 'muted small', 'aria-live': 'off'});
  setView(
    h('div', {class: 'title-row'},
      h('h1', {}, state === 'awaiting_approval' ? 'Approval queue' : 'Plans'),
      h('label', {class: 'inline'}, 'State ', select)),
    body, stamp);
  let last = '';
  let pages = 1;  // pages of 50 shown: "Show older" adds one, refreshes keep them
  const load = async () => {
    try {
      let items = [];
      let cursor = '';
      for (let n = 0; n < pages; ++n) {
        const r = await api('GET', '/v1/plans?state=' + encodeURIComponent(state) + '&limit=' + QUEUE_PAGE +
                                   (cursor ? '&cursor=' + encodeURIComponent(cursor) : ''));
        if (!live(seq)) return;
        const page = (r.body && r.body.items) || [];
        items = items.concat(page);
        cursor = (r.body && r.body.next_cursor) || '';
        if (n === 0 && state === 'awaiting_approval') setCount(page.length, cursor);
        if (!cursor) break;
      }
      stamp.textContent = 'Refreshed ' + new Date().toLocaleTimeString() +
                          ' · refreshes every ' + QUEUE_REFRESH_MS / 1000 + ' s';
      const key = JSON.stringify(items) + cursor;
      if (key === last) {
        // Unchanged: keep focus where it is, but the ages move on.
        for (const td of body.querySelectorAll('td[data-created]')) {
          td.textContent = ago(Number(td.dataset.created));
        }
        return;
      }
      last = key;
      const more = cursor
        ? h('p', {}, h('button', {type: 'button', id: 'more', onclick: async () => {
            // The list is drawn anew: focus goes to the first plan it added.
            const shown = body.querySelectorAll('tr[data-plan]').length;
            pages++;
            await load();
            const links = body.querySelectorAll('tr[data-plan] a');
            const next = links[shown] || document.getElementById('more') || links[links.length - 1];
            if (next) next.focus();
          }},
                      'Show older plans (' + items.length + ' shown, newest first)'))
        : null;
      body.replaceChildren(...[queueTable(items, state), more].filter(Boolean));
    } catch (err) {
      if (!live(seq)) return;
      last = '';
      body.replaceChildren(problemBox(err));
    }
  };
  await load();
  if (live(seq)) timer = setInterval(load, QUEUE_REFRESH_MS);
}

async function refreshCount() {
  try {
    const r = await api('GET', '/v1/plans?state=awaiting_approval&limit=50');
    setCount(((r.body && r.body.items) || []).length, r.body && r.body.next_cursor);
  } catch (e) { /* the view shows errors */ }
}

function setCount(n, more) {
  document.getElementById('queue-count').textContent = n ? '(' + n + (more ? '+' : '') + ')' : '';
}

function queueTable(items, state) {
  if (!items.length) {
    return h('p', {class: 'empty'},
      state === 'awaiting_approval' ? 'No plan awaits approval.' : 'No plan in this state.');
  }
  return h('table', {class: 'list'},
    h('thead', {}, h('tr', {},
      ['Plan', 'State', 'Actions', 'Why', 'Created by', 'Created'].map(t => h('th', {scope: 'col'}, t)))),
    h('tbody', {}, items.map(p => h('tr', {'data-plan': p.plan_id},
      h('td', {'data-label': 'Plan'}, h('a', {href: '#/plans/' + encodeURIComponent(p.plan_id)}, p.plan_id),
        p.step ? h('div', {class: 'muted small'}, 'step ' + p.step) : null),
      h('td', {'data-label': 'State'}, badge(p.state || '')),
      h('td', {'data-label': 'Actions'}, planKinds(p)),
      h('td', {'data-label': 'Why'}, ((p.approval && p.approval.reasons) || [])
          .map(r => r.reason).filter(Boolean).join('; ')),
      h('td', {'data-label': 'Created by'}, p.created_by || ''),
      h('td', {'data-label': 'Created', title: when(p.created_at_ms), 'data-created': p.created_at_ms},
        ago(p.created_at_ms))))));
}

// ---------------------------------------------------------------- plan detail

// The differences between two JSON values: [{path, before, after}], with
// JSON-pointer paths; a missing side is undefined.
function diffJson(a, b, path, out) {
  out = out || [];
  path = path || '';
  if (isJsonObj(a) && isJsonObj(b) && Array.isArray(a) === Array.isArray(b)) {
    const keys = Array.isArray(a)
        ? [...Array(Math.max(a.length, b.length)).keys()].map(String)
        : [...new Set([...Object.keys(a), ...Object.keys(b)])];
    for (const k of keys) {
      const esc = k.replace(/~/g, '~0').replace(/\//g, '~1');
      diffJson(a[k], b[k], path + '/' + esc, out);
    }
  } else if (JSON.stringify(a) !== JSON.stringify(b)) {
    out.push({path: path || '/', before: a, after: b});
  }
  return out;
}

// Paths in `v` of integers a browser cannot hold exactly: JSON.parse rounds
// any beyond 2^53 (9007199254740993 becomes ...992), so the page shows them
// rounded and must never send them back.
function inexactNumbers(v, path, out) {
  out = out || [];
  path = path || '';
  if (typeof v === 'number' && Number.isInteger(v) && !Number.isSafeInteger(v)) out.push(path || '/');
  else if (isJsonObj(v)) {
    for (const k of Object.keys(v)) inexactNumbers(v[k], path + '/' + k.replace(/~/g, '~0').replace(/\//g, '~1'), out);
  }
  return out;
}

// Paths in `v` of numbers JSON cannot carry (Infinity, from 1e400).
function nonFinite(v, path, out) {
  if (typeof v === 'number' && !Number.isFinite(v)) out.push(path || '/');
  else if (isJsonObj(v)) {
    for (const k of Object.keys(v)) nonFinite(v[k], path + '/' + k.replace(/~/g, '~0').replace(/\//g, '~1'), out);
  }
  return out;
}

// The edits ({path, value}) that turn `before` into `after` at `path`: only
// what changed, so a value the operator did not touch is never sent back as
// the page parsed it. An object that lost a field, or an array whose length
// changed, is sent whole.
function editsBetween(before, after, path, out) {
  const own = (o, k) => Object.prototype.hasOwnProperty.call(o, k);
  if (isJsonObj(before) && isJsonObj(after) && Array.isArray(before) === Array.isArray(after)) {
    const whole = Array.isArray(after) ? after.length !== before.length
                                       : Object.keys(before).some(k => !own(after, k));
    if (whole) {
      out.push({path, value: after});
      return out;
    }
    for (const k of Object.keys(after)) {
      editsBetween(own(before, k) ? before[k] : undefined, after[k],
                   path + '/' + k.replace(/~/g, '~0').replace(/\//g, '~1'), out);
    }
  } else if (JSON.stringify(before) !== JSON.stringify(after)) {
    out.push({path, value: after});
  }
  return out;
}

function diffTable(original, current) {
  const rows = diffJson(original, current);
  if (!rows.length) return h('p', {class: 'muted'}, 'The edits changed nothing.');
  const cell = (v, cls) => h('td', {class: cls}, v === undefined ? h('em', {}, '(absent)') : h('code', {}, JSON.stringify(v)));
  return h('table', {class: 'diff'},
    h('thead', {}, h('tr', {}, h('th', {scope: 'col'}, 'Path'), h('th', {scope: 'col'}, 'Original'),
                           h('th', {scope: 'col'}, 'Edited'))),
    h('tbody', {}, rows.map(r => h('tr', {}, h('td', {}, h('code', {}, r.path)),
                                          cell(r.before, 'del'), cell(r.after, 'ins')))));
}

function kv(pairs) {
  return h('dl', {class: 'kv'}, pairs.filter(p => p[1] !== undefined && p[1] !== null && p[1] !== '')
    .map(([k, v]) => [h('dt', {}, k), h('dd', {}, v instanceof Node ? v : String(v))]));
}

async function showPlan(id, seq) {
  setView(h('p', {class: 'muted'}, 'Loading plan ' + id + '…'));
  let last = '';
  const load = async () => {
    try {
      const r = await api('GET', '/v1/plans/' + encodeURIComponent(id));
      if (!live(seq)) return;
      const key = JSON.stringify(r.body);
      if (key !== last) {
        last = key;
        renderPlan(r.body, seq);
      }
      // Moving states refresh by themselves; a plan waiting for a decision
      // does not (the operator may be typing).
      const moving = ['approved', 'applying', 'proposed'].includes(r.body.state);
      if (moving && !timer && live(seq)) timer = setInterval(load, DETAIL_REFRESH_MS);
      if (!moving && timer) stopTimer();
    } catch (err) {
      if (!live(seq)) return;
      setView(h('p', {}, h('a', {href: '#/plans'}, '← Queue')), problemBox(err));
    }
  };
  await load();
}

function renderPlan(p, seq) {
  const actions = p.actions || [];
  const work = p.work || [];
  const d = p.decision;
  const sections = [];

  sections.push(h('p', {}, h('a', {href: '#/plans'}, '← Queue')));
  if (planNotice) {
    sections.push(h('div', {id: 'plan-notice'}, problemBox(planNotice),
      h('p', {class: 'muted'}, 'The plan as it is now:')));
    planNotice = null;
  }
  sections.push(h('div', {class: 'title-row'}, h('h1', {}, 'Plan ', h('code', {}, p.plan_id)), badge(p.state)));
  sections.push(kv([
    ['Origin', p.origin], ['Step', p.step], ['Decision', p.decision_id],
    ['Created by', p.created_by], ['Created', when(p.created_at_ms)], ['Updated', when(p.updated_at_ms)],
    ['Approved by', p.approved_by], ['Comment', p.comment],
    ['Rejected by', p.rejected_by], ['Rejection reason', p.reason],
    ['Expires', p.approval && p.approval.expires_at_ms ? when(p.approval.expires_at_ms) : ''],
  ]));

  const reasons = (p.approval && p.approval.reasons) || [];
  if (reasons.length) {
    sections.push(h('section', {class: 'card reasons'}, h('h2', {}, 'Why it needs a human'),
      h('ul', {}, reasons.map(r => h('li', {}, h('code', {}, '#' + r.index + ' ' + (r.kind || '')), ' ', r.reason || '')))));
  }

  const inexact = actions.flatMap((a, i) => inexactNumbers(a.args, '/' + i + '/args'));
  if (inexact.length) {
    sections.push(h('p', {class: 'card warning', id: 'inexact-numbers', role: 'note'},
      'Integers beyond 2^53 at ' + inexact.join(', ') + ' are shown rounded: a browser cannot hold ' +
      'them exactly. The daemon keeps and sends the exact values, and edits made here leave them ' +
      'untouched. To read them exactly: idem plans show ' + p.plan_id + ' --json'));
  }

  const actionBox = h('section', {class: 'card'}, h('h2', {}, 'Actions (' + actions.length + ')'),
    actions.map((a, i) => {
      const w = work.find(x => x.index === i) || work[i];
      return h('article', {class: 'action', 'data-index': i},
        h('h3', {}, '#' + i + ' ', h('code', {}, a.kind)),
        jsonBlock(a.args, 'arguments of action ' + i),
        w ? h('div', {class: 'work'}, 'Journal: ', badge(w.state || 'unknown'),
              w.attempt ? ' attempt ' + w.attempt : '',
              w.work_id ? h('span', {class: 'muted small'}, ' ', w.work_id) : null,
              w.external_ref ? h('span', {}, ' ref ', h('code', {}, w.external_ref)) : null,
              w.last_error ? h('div', {class: 'error small'}, w.last_error) : null)
          : h('div', {class: 'work muted small'}, 'Journal: not applied yet'));
    }));
  sections.push(actionBox);

  if (p.original_actions) {
    sections.push(h('section', {class: 'card'}, h('h2', {}, 'Edits (original → approved)'),
      diffTable(p.original_actions, actions)));
  }

  if (p.state === 'awaiting_approval') sections.push(decisionForms(p, seq));

  if (d) {
    sections.push(h('section', {class: 'card'}, h('h2', {}, 'Decision'),
      kv([['Step', d.step], ['Status', d.status], ['Provider', d.provider], ['Model', d.model],
          ['Prompt version', d.prompt_version],
          ['Cost', typeof d.cost_usd === 'number' ? '$' + d.cost_usd.toFixed(6) : d.cost_usd],
          ['Attempts', Array.isArray(d.attempts) ? d.attempts.length : d.attempts],
          ['Decided', when(d.created_at_ms)]]),
      h('div', {class: 'two'},
        h('div', {}, h('h3', {}, 'Input'), jsonBlock(d.input, 'decision input')),
        h('div', {}, h('h3', {}, 'Output'), jsonBlock(d.output, 'decision output')))));
  }

  const history = p.history || [];
  if (history.length) {
    sections.push(h('section', {class: 'card'}, h('h2', {}, 'History'),
      h('table', {class: 'list history'},
        h('thead', {}, h('tr', {}, ['When', 'From', 'To', 'Actor', 'Note'].map(t => h('th', {scope: 'col'}, t)))),
        h('tbody', {}, history.map(e => h('tr', {},
          h('td', {'data-label': 'When'}, when(e.at_ms)), h('td', {'data-label': 'From'}, e.from || ''),
          h('td', {'data-label': 'To'}, e.to || ''), h('td', {'data-label': 'Actor'}, e.actor || ''),
          h('td', {'data-label': 'Note'}, e.note || '')))))));
  }
  setView(...sections);
}

function decisionForms(p, seq) {
  const actions = p.actions || [];
  const out = h('div', {class: 'outcome', 'aria-live': 'polite'});
  const busy = (on) => { for (const b of box.querySelectorAll('button')) b.disabled = on; };
  const done = (r, verb) => {
    toast('Plan ' + p.plan_id + ' ' + verb);
    if (live(seq)) { route(); }
    return r;
  };
  // A 409 means the plan is not what this page shows (another operator
  // decided, it expired, was superseded, or waits again with other args):
  // the plan is shown as it is now, with the refusal above it.
  const refused = (err) => {
    if (err.status === 409 && live(seq)) {
      planNotice = err;
      route();
      return;
    }
    out.replaceChildren(problemBox(err));
    busy(false);
  };

  // Approve (with an optional comment).
  const comment = h('textarea', {id: 'approve-comment', rows: 2, placeholder: 'optional'});
  // Edit: one JSON text per action's args.
  const editors = actions.map((a, i) => h('textarea', {
    class: 'code', rows: Math.min(16, pretty(a.args).split('\n').length + 1),
    id: 'edit-args-' + i, spellcheck: 'false', 'aria-label': 'arguments of action ' + i + ' (' + a.kind + ')',
  }, pretty(a.args)));
  const editErrors = actions.map(() => h('div', {class: 'error small', 'aria-live': 'polite'}));
  const editBox = h('fieldset', {class: 'edit', hidden: true},
    h('legend', {}, 'Edit arguments (JSON), then approve'),
    actions.map((a, i) => h('div', {class: 'field'},
      h('label', {for: 'edit-args-' + i}, '#' + i + ' ', h('code', {}, a.kind), ' args'),
      editors[i], editErrors[i])),
    h('button', {type: 'button', id: 'approve-edited', class: 'primary', onclick: async () => {
      const edits = [];
      let bad = false;
      editors.forEach((t, i) => {
        editErrors[i].textContent = '';
        let v;
        try { v = parseJson(t.value); } catch (e) {
          editErrors[i].textContent = visible('Not JSON: ' + e.message); bad = true; return;
        }
        if (!isJsonObj(v) || Array.isArray(v)) {
          editErrors[i].textContent = 'The arguments must be a JSON object.'; bad = true; return;
        }
        const huge = nonFinite(v, '/' + i + '/args', []);
        if (huge.length) {
          // JSON.parse reads 1e400 as Infinity, which would be sent as null.
          editErrors[i].textContent = 'Not a number a JSON document can hold: ' + huge.join(', ');
          bad = true;
          return;
        }
        const changed = editsBetween(actions[i].args, v, '/' + i + '/args', []);
        const inexact = changed.flatMap(e => inexactNumbers(e.value, e.path));
        if (inexact.length) {
          editErrors[i].textContent = 'The page cannot send ' + inexact.join(', ') +
            ' exactly: an integer beyond 2^53, which a browser rounds. Edit it with the CLI: ' +
            'idem approve ' + p.plan_id + ' --edit PATH=VALUE';
          bad = true;
          return;
        }
        edits.push(...changed);
      });
      if (bad) { editors.find((t, i) => editErrors[i].textContent).focus(); return; }
      if (!edits.length) {
        out.replaceChildren(h('p', {class: 'error'}, 'Nothing was edited: use Approve, or change an argument.'));
        return;
      }
      const body = {edits, expect_updated_at_ms: p.updated_at_ms};
      if (comment.value.trim()) body.comment = comment.value.trim();
      busy(true);
      try {
        done(await api('POST', '/v1/plans/' + encodeURIComponent(p.plan_id) + '/approve', body), 'approved with edits');
      } catch (err) { refused(err); }
    }}, 'Approve with edits'));

  const reason = h('textarea', {id: 'reject-reason', rows: 2, required: true, 'aria-required': 'true'});

  const box = h('section', {class: 'card decide'}, h('h2', {}, 'Your decision'),
    h('div', {class: 'field'}, h('label', {for: 'approve-comment'}, 'Comment'), comment),
    h('div', {class: 'buttons'},
      h('button', {type: 'button', id: 'approve', class: 'primary', onclick: async () => {
        // What this page shows is what is approved: a plan changed since
        // (waiting again with another call's args) is refused, 409.
        const body = {expect_updated_at_ms: p.updated_at_ms};
        if (comment.value.trim()) body.comment = comment.value.trim();
        busy(true);
        try {
          done(await api('POST', '/v1/plans/' + encodeURIComponent(p.plan_id) + '/approve', body), 'approved');
        } catch (err) { refused(err); }
      }}, 'Approve'),
      h('button', {type: 'button', id: 'edit', 'aria-expanded': 'false', onclick: (e) => {
        editBox.hidden = !editBox.hidden;
        e.target.setAttribute('aria-expanded', String(!editBox.hidden));
        if (!editBox.hidden && editors[0]) editors[0].focus();
      }}, 'Edit…')),
    editBox,
    h('div', {class: 'field reject'}, h('label', {for: 'reject-reason'}, 'Reason for rejecting (required)'), reason),
    h('div', {class: 'buttons'},
      h('button', {type: 'button', id: 'reject', class: 'danger', onclick: async () => {
        if (!reason.value.trim()) {
          out.replaceChildren(h('p', {class: 'error'}, 'A rejection needs a reason.'));
          reason.focus();
          return;
        }
        busy(true);
        try {
          done(await api('POST', '/v1/plans/' + encodeURIComponent(p.plan_id) + '/reject',
                         {reason: reason.value.trim()}), 'rejected');
        } catch (err) { refused(err); }
      }}, 'Reject')),
    out);
  return box;
}

// ---------------------------------------------------------------- dead letters

// Says that a list shows only its first LIST_SHOWN items, and where the rest are.
function moreNote(more, what, order, command) {
  if (!more) return null;
  return h('p', {class: 'card warning', role: 'note'},
    'More than ' + LIST_SHOWN + ' ' + what + ': this page shows ' + LIST_SHOWN + ', ' + order +
    '. The CLI lists up to 1000: ', h('code', {}, command));
}

async function showDeadLetters(seq) {
  const body = h('div', {}, h('p', {class: 'muted'}, 'Loading…'));
  setView(h('h1', {}, 'Dead letters'),
          h('p', {class: 'muted'}, 'Work whose attempts ran out. Replay gives one item a fresh attempt budget.'),
          body);
  const load = async () => {
    try {
      const r = await api('GET', '/v1/dead-letters?limit=' + (LIST_SHOWN + 1));
      if (!live(seq)) return;
      const items = (r.body && r.body.items) || [];
      if (!items.length) { body.replaceChildren(h('p', {class: 'empty'}, 'No dead letters.')); return; }
      const more = items.length > LIST_SHOWN;
      if (more) items.length = LIST_SHOWN;
      body.replaceChildren(moreNote(more, 'dead letters', 'the oldest first', 'idem dlq ls --limit 1000') || '',
        h('table', {class: 'list'},
        h('thead', {}, h('tr', {}, ['Work', 'Kind', 'Attempts', 'Last error', 'Args', ''].map(t => h('th', {scope: 'col'}, t)))),
        h('tbody', {}, items.map(w => {
          const out = h('div', {'aria-live': 'polite'});
          const btn = h('button', {type: 'button', class: 'primary replay', 'data-work': w.work_id, onclick: async () => {
            if (!replayKeys.has(w.work_id)) replayKeys.set(w.work_id, newIdempotencyKey());
            btn.disabled = true;
            try {
              const res = await api('POST', '/v1/dead-letters/' + encodeURIComponent(w.work_id) + '/replay', {},
                                    {'Idempotency-Key': replayKeys.get(w.work_id)});
              replayKeys.delete(w.work_id);
              toast('Replayed ' + w.work_id + ': ' + ((res.body && res.body.state) || res.status));
              load();
            } catch (err) {
              // Any answer ends this replay (a 409 dead is its outcome): the
              // next click is a new replay with its own key. Only a replay
              // whose answer never came, or that is still running under the
              // key (409 without the work's state), is sent again as it was.
              const running = err.status === 409 && !(err.problem && err.problem.state);
              if (err.status && !running) replayKeys.delete(w.work_id);
              out.replaceChildren(problemBox(err));
              btn.disabled = false;
            }
          }}, 'Replay');
          return h('tr', {},
            h('td', {'data-label': 'Work'}, h('code', {}, w.work_id), w.run_id ? h('div', {class: 'muted small'}, 'run ' + w.run_id) : null),
            h('td', {'data-label': 'Kind'}, w.kind),
            h('td', {'data-label': 'Attempts'}, String(w.attempts)),
            h('td', {'data-label': 'Last error', class: 'error small'}, w.last_error || ''),
            h('td', {'data-label': 'Args'}, jsonBlock(w.args, 'arguments')),
            h('td', {}, btn, out));
        }))));
    } catch (err) {
      if (live(seq)) body.replaceChildren(problemBox(err));
    }
  };
  await load();
}

// ---------------------------------------------------------------- escalations

async function stepInfo(name) {
  if (!stepCache.has(name)) {
    const r = await api('GET', '/v1/steps/' + encodeURIComponent(name));
    stepCache.set(name, r.body);
  }
  return stepCache.get(name);
}

async function showEscalations(seq) {
  const body = h('div', {}, h('p', {class: 'muted'}, 'Loading…'));
  setView(h('h1', {}, 'Open escalations'),
          h('p', {class: 'muted'}, 'Decisions the model could not make. Your answer is checked against the step\'s output schema, then becomes the cached decision.'),
          body);
  try {
    const r = await api('GET', '/v1/escalations?state=open&limit=' + (LIST_SHOWN + 1));
    if (!live(seq)) return;
    const items = (r.body && r.body.items) || [];
    if (!items.length) { body.replaceChildren(h('p', {class: 'empty'}, 'No open escalations.')); return; }
    const more = items.length > LIST_SHOWN;
    if (more) items.length = LIST_SHOWN;
    body.replaceChildren(moreNote(more, 'open escalations', 'the newest first', 'idem escalations --limit 1000') || '',
                         ...items.map(e => escalationCard(e, seq)));
  } catch (err) {
    if (live(seq)) body.replaceChildren(problemBox(err));
  }
}

function escalationCard(e, seq) {
  const ctx = e.context || {};
  const id = e.escalation_id;
  const start = ctx.best_guess !== undefined ? ctx.best_guess : {};
  const text = h('textarea', {class: 'code', id: 'resolve-' + id, rows: Math.min(18, pretty(start).split('\n').length + 1),
                              spellcheck: 'false'}, pretty(start));
  const note = h('input', {type: 'text', id: 'note-' + id, placeholder: 'optional'});
  const errors = h('div', {class: 'check', 'aria-live': 'polite'});
  const out = h('div', {'aria-live': 'polite'});
  const check = async () => {
    // The daemon's answer to an earlier submission is about the old text.
    out.replaceChildren();
    let v;
    try { v = parseJson(text.value); } catch (err) {
      errors.replaceChildren(h('p', {class: 'error'}, 'Not JSON: ' + err.message));
      return null;
    }
    let step;
    try { step = await stepInfo(e.step); } catch (err) {
      errors.replaceChildren(problemBox(err));
      return null;
    }
    const problems = validate(step.output_schema || {}, v);
    if (problems.length) {
      errors.replaceChildren(h('p', {class: 'error'}, 'Does not match the output schema of ' + e.step + ':'),
        h('ul', {class: 'error'}, problems.map(p => h('li', {}, h('code', {}, p.path || '/'), ' ', p.message))));
      return null;
    }
    errors.replaceChildren(h('p', {class: 'ok'}, 'Matches the output schema of ' + e.step + '.'));
    return v;
  };
  let debounce = null;
  text.addEventListener('input', () => { clearTimeout(debounce); debounce = setTimeout(check, 300); });
  const btn = h('button', {type: 'button', class: 'primary resolve', onclick: async () => {
    // A check still pending from typing would clear the daemon's answer.
    clearTimeout(debounce);
    const v = await check();
    if (v === null) { text.focus(); return; }
    const bodyJson = {output: v};
    if (note.value.trim()) bodyJson.note = note.value.trim();
    btn.disabled = true;
    try {
      await api('POST', '/v1/escalations/' + encodeURIComponent(id) + '/resolve', bodyJson);
      toast('Escalation ' + id + ' resolved');
      if (live(seq)) route();
    } catch (err) {
      out.replaceChildren(problemBox(err));
      btn.disabled = false;
    }
  }}, 'Resolve');
  return h('section', {class: 'card escalation', 'data-escalation': id},
    h('h2', {}, h('code', {}, id)),
    kv([['Step', e.step], ['Created', when(e.created_at_ms)], ['Decision key', e.decision_key]]),
    ctx.summary ? h('p', {}, ctx.summary) : null,
    h('div', {class: 'two'},
      h('div', {}, h('h3', {}, 'Input'), jsonBlock(e.input, 'escalation input')),
      ctx.best_guess !== undefined ? h('div', {}, h('h3', {}, 'Best guess'), jsonBlock(ctx.best_guess, 'best guess')) : null),
    h('div', {class: 'field'}, h('label', {for: 'resolve-' + id}, 'Your answer (JSON, the step\'s output)'), text, errors),
    h('div', {class: 'field'}, h('label', {for: 'note-' + id}, 'Note'), note),
    h('div', {class: 'buttons'}, btn), out);
}

// ---------------------------------------------------------------- JSON Schema (draft-07 subset)

// The checks a human's answer most often fails: type, required, properties,
// additionalProperties, enum, const, items, lengths, bounds, pattern,
// allOf/anyOf/oneOf and local $refs. The daemon validates again in full.
function validate(schema, value, path, root, out) {
  out = out || [];
  path = path || '';
  root = root || schema;
  if (schema === true || schema === undefined) return out;
  if (schema === false) { out.push({path, message: 'is not allowed here'}); return out; }
  if (schema.$ref) {
    const target = resolveRef(root, schema.$ref);
    if (target !== undefined) validate(target, value, path, root, out);
    return out;
  }
  const typeOf = v => v === null ? 'null' : Array.isArray(v) ? 'array' : isRaw(v) ? 'number' : typeof v;
  const t = typeOf(value);
  // An exact big integer is compared as the number it rounds to; enum and
  // const compare its digits.
  const num = isRaw(value) ? Number(value.rawJSON) : value;
  if (schema.type !== undefined) {
    const types = [].concat(schema.type);
    const ok = types.some(ty => ty === t || (ty === 'integer' && t === 'number' && Number.isInteger(num)));
    if (!ok) { out.push({path, message: 'must be ' + types.join(' or ') + ', not ' + t}); return out; }
  }
  if (schema.enum && !schema.enum.some(x => JSON.stringify(x) === JSON.stringify(value))) {
    out.push({path, message: 'must be one of ' + schema.enum.map(x => JSON.stringify(x)).join(', ')});
  }
  if ('const' in schema && JSON.stringify(schema.const) !== JSON.stringify(value)) {
    out.push({path, message: 'must be ' + JSON.stringify(schema.const)});
  }
  if (t === 'string') {
    const n = [...value].length;
    if (schema.minLength !== undefined && n < schema.minLength) out.push({path, message: 'must have at least ' + schema.minLength + ' characters'});
    if (schema.maxLength !== undefined && n > schema.maxLength) out.push({path, message: 'must have at most ' + schema.maxLength + ' characters'});
    if (schema.pattern) {
      try { if (!new RegExp(schema.pattern, 'u').test(value)) out.push({path, message: 'must match ' + schema.pattern}); } catch (e) { /* the daemon checks it */ }
    }
  }
  if (t === 'number') {
    if (schema.minimum !== undefined && num < schema.minimum) out.push({path, message: 'must be >= ' + schema.minimum});
    if (schema.maximum !== undefined && num > schema.maximum) out.push({path, message: 'must be <= ' + schema.maximum});
    if (schema.exclusiveMinimum !== undefined && num <= schema.exclusiveMinimum) out.push({path, message: 'must be > ' + schema.exclusiveMinimum});
    if (schema.exclusiveMaximum !== undefined && num >= schema.exclusiveMaximum) out.push({path, message: 'must be < ' + schema.exclusiveMaximum});
    if (schema.multipleOf && Math.abs(num / schema.multipleOf - Math.round(num / schema.multipleOf)) > 1e-9) out.push({path, message: 'must be a multiple of ' + schema.multipleOf});
  }
  if (t === 'object') {
    const props = schema.properties || {};
    for (const k of schema.required || []) {
      if (!(k in value)) out.push({path: path + '/' + esc(k), message: 'is required'});
    }
    const n = Object.keys(value).length;
    if (schema.minProperties !== undefined && n < schema.minProperties) out.push({path, message: 'must have at least ' + schema.minProperties + ' properties'});
    if (schema.maxProperties !== undefined && n > schema.maxProperties) out.push({path, message: 'must have at most ' + schema.maxProperties + ' properties'});
    for (const [k, v] of Object.entries(value)) {
      const p = path + '/' + esc(k);
      if (k in props) { validate(props[k], v, p, root, out); continue; }
      let matched = false;
      for (const [re, s] of Object.entries(schema.patternProperties || {})) {
        try { if (new RegExp(re, 'u').test(k)) { matched = true; validate(s, v, p, root, out); } } catch (e) { /* skip */ }
      }
      if (matched) continue;
      if (schema.additionalProperties === false) out.push({path: p, message: 'is not a known property'});
      else if (typeof schema.additionalProperties === 'object') validate(schema.additionalProperties, v, p, root, out);
    }
  }
  if (t === 'array') {
    if (schema.minItems !== undefined && value.length < schema.minItems) out.push({path, message: 'must have at least ' + schema.minItems + ' items'});
    if (schema.maxItems !== undefined && value.length > schema.maxItems) out.push({path, message: 'must have at most ' + schema.maxItems + ' items'});
    if (schema.uniqueItems) {
      const seen = new Set(value.map(x => JSON.stringify(x)));
      if (seen.size !== value.length) out.push({path, message: 'must not repeat items'});
    }
    if (Array.isArray(schema.items)) {
      value.forEach((v, i) => {
        if (i < schema.items.length) validate(schema.items[i], v, path + '/' + i, root, out);
        else if (schema.additionalItems !== undefined) validate(schema.additionalItems, v, path + '/' + i, root, out);
      });
    } else if (schema.items !== undefined) {
      value.forEach((v, i) => validate(schema.items, v, path + '/' + i, root, out));
    }
  }
  for (const s of schema.allOf || []) validate(s, value, path, root, out);
  if (schema.anyOf && !schema.anyOf.some(s => validate(s, value, path, root).length === 0)) {
    out.push({path, message: 'matches none of the allowed shapes (anyOf)'});
  }
  if (schema.oneOf && schema.oneOf.filter(s => validate(s, value, path, root).length === 0).length !== 1) {
    out.push({path, message: 'must match exactly one allowed shape (oneOf)'});
  }
  if (schema.not && validate(schema.not, value, path, root).length === 0) {
    out.push({path, message: 'matches a shape that is not allowed'});
  }
  return out;
}

function esc(k) { return String(k).replace(/~/g, '~0').replace(/\//g, '~1'); }

function resolveRef(root, ref) {
  if (!ref.startsWith('#')) return undefined;
  let node = root;
  for (const part of ref.slice(1).split('/').filter(Boolean)) {
    const key = decodeURIComponent(part).replace(/~1/g, '/').replace(/~0/g, '~');
    if (node === null || typeof node !== 'object' || !(key in node)) return undefined;
    node = node[key];
  }
  return node;
}

// ---------------------------------------------------------------- start

document.getElementById('forget').addEventListener('click', () => {
  sessionStorage.removeItem(TOKEN_KEY);
  setCount(0);
  route();
});
window.addEventListener('hashchange', () => { route(); main().focus({preventScroll: true}); });
// Keyboard: g then q / d / e jumps to a section (outside text fields).
let pendingG = false;
document.addEventListener('keydown', (e) => {
  if (e.target.closest && e.target.closest('input, textarea, select')) return;
  if (e.ctrlKey || e.metaKey || e.altKey) return;
  if (pendingG) {
    pendingG = false;
    const to = {q: '#/plans', d: '#/dead-letters', e: '#/escalations'}[e.key];
    if (to) { location.hash = to; e.preventDefault(); }
    return;
  }
  if (e.key === 'g') { pendingG = true; setTimeout(() => { pendingG = false; }, 1000); }
});
route();
