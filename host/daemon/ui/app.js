// promptd inspector: a single page over the daemon's HTTP API (no framework, no build step).
//
// Every piece of data is put into the page as text (textContent, Text nodes, attributes set one
// by one): nothing from the daemon is ever parsed as HTML. Routes live in the hash:
//   #/sessions[?q=TEXT]   #/session/ID   #/session/ID/step/N[?format=F]   #/plugins
//   #/usage[?days=N&agent=A&key=K]
'use strict';

const FORMATS = ['neutral', 'openai', 'anthropic', 'openai-responses', 'gemini', 'bedrock'];
const TOKEN_KEY = 'promptd.token';
const FORMAT_KEY = 'promptd.format';
const RUNTIME_CONTEXT_HEADER =
  '[Runtime context: this snapshot supersedes any earlier runtime context.]';
// Bodies above this are shown raw only: a DOM node per JSON token would stall the tab.
const PRETTY_MAX = 2 * 1024 * 1024;

// ---------------------------------------------------------------------------------------------
// DOM helpers

/** An element: attributes set one by one, children appended as nodes or text. */
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v == null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  add(el, ...children);
  return el;
}

function add(el, ...children) {
  for (const c of children.flat(Infinity)) {
    if (c == null || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

/** Text with `backticked` names shown as code (the daemon's messages quote names that way). */
function quoted(text) {
  return String(text).split('`').map((piece, i) => (i % 2 ? h('code', {}, piece) : piece));
}

function short(sha, n = 12) {
  return sha ? String(sha).slice(0, n) : '';
}

function when(ms) {
  if (!ms) return '';
  return new Date(ms).toLocaleString();
}

function ago(ms) {
  if (!ms) return '';
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} d ago`;
}

function bytes(n) {
  if (n == null) return '';
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / 1024 / 1024).toFixed(2)} MiB`;
}

function percent(x) {
  return x == null || Number.isNaN(x) ? '' : `${(x * 100).toFixed(1)}%`;
}

function jsonDetails(label, value, attrs) {
  return h('details', Object.assign({ class: 'json-details' }, attrs || {}),
    h('summary', {}, label),
    h('pre', { class: 'json' }, JSON.stringify(value, null, 2)));
}

function badge(text, cls, attrs) {
  return h('span', Object.assign({ class: `badge ${cls || ''}` }, attrs || {}), text);
}

function notice(text, cls) {
  return h('p', { class: `notice ${cls || ''}` }, quoted(text));
}

function route(...parts) {
  return '#/' + parts.map((p) => encodeURIComponent(String(p))).join('/');
}

// ---------------------------------------------------------------------------------------------
// The API, with the token

class HttpError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function authHeaders() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? { Authorization: `Bearer ${token}` } : {};
}

/** GET `path`; JSON unless `text`. A 401 opens the token form and throws. */
async function api(path, { text = false, signal } = {}) {
  const response = await fetch(path, { headers: authHeaders(), signal, cache: 'no-store' });
  const body = await response.text();
  if (!response.ok) {
    let code = 'http';
    let message = body || response.statusText;
    try {
      const e = JSON.parse(body).error;
      if (e) ({ code, message } = e);
    } catch (_) { /* not an error body */ }
    if (response.status === 401) askToken();
    throw new HttpError(response.status, code, message);
  }
  return text ? body : JSON.parse(body);
}

/** `api`, but a route the daemon does not have (404 `not_found`) gives null. */
async function optional(path) {
  try {
    return await api(path);
  } catch (e) {
    if (e instanceof HttpError && e.status === 404 && e.code === 'not_found') return null;
    throw e;
  }
}

function askToken() {
  const panel = document.getElementById('token-panel');
  const error = document.getElementById('token-error');
  const had = sessionStorage.getItem(TOKEN_KEY);
  error.hidden = !had;
  error.textContent = had ? 'The daemon refused that token.' : '';
  if (had) sessionStorage.removeItem(TOKEN_KEY);
  panel.hidden = false;
  document.getElementById('token-input').focus();
}

function setupToken() {
  const form = document.getElementById('token-form');
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const input = document.getElementById('token-input');
    const token = input.value.trim();
    if (!token) return;
    sessionStorage.setItem(TOKEN_KEY, token);
    input.value = '';
    document.getElementById('token-panel').hidden = true;
    showTokenButton();
    render();
  });
  const forget = document.getElementById('forget-token');
  forget.addEventListener('click', () => {
    sessionStorage.removeItem(TOKEN_KEY);
    showTokenButton();
    render();
  });
  showTokenButton();
}

function showTokenButton() {
  document.getElementById('forget-token').hidden = !sessionStorage.getItem(TOKEN_KEY);
}

async function showHealth() {
  const el = document.getElementById('health');
  try {
    // Health needs no token.
    const r = await fetch('/v1/health', { cache: 'no-store' });
    const v = await r.json();
    el.textContent = v.status === 'ok'
      ? `promptd ${v.version} · ${v.plugins} plugins`
      : `promptd ${v.version || ''} · ${v.status}${v.total ? ` ${v.loaded}/${v.total}` : ''}`;
    el.className = v.status === 'ok' ? 'muted' : 'warn';
  } catch (e) {
    el.textContent = 'daemon unreachable';
    el.className = 'warn';
  }
}

// ---------------------------------------------------------------------------------------------
// Routing

let generation = 0;
let leaving = null; // what the current view must stop (the SSE stream)

function parseHash() {
  const raw = location.hash.replace(/^#/, '') || '/sessions';
  const [path, query] = raw.split('?');
  const parts = path.split('/').filter(Boolean).map((p) => {
    try { return decodeURIComponent(p); } catch (_) { return p; }
  });
  return { parts, query: new URLSearchParams(query || '') };
}

async function render() {
  const mine = ++generation;
  if (leaving) { leaving(); leaving = null; }
  const { parts, query } = parseHash();
  const view = document.getElementById('view');
  for (const a of document.querySelectorAll('#topbar nav a')) a.classList.remove('active');
  const page = h('div', { class: 'page' });
  let build;
  if (parts[0] === 'plugins') {
    document.getElementById('nav-plugins').classList.add('active');
    build = () => pluginsView(page, () => mine === generation);
  } else if (parts[0] === 'usage') {
    document.getElementById('nav-usage').classList.add('active');
    build = () => usageView(page, query);
  } else if (parts[0] === 'session' && parts[1] && parts[2] === 'step' && parts[3]) {
    document.getElementById('nav-sessions').classList.add('active');
    build = () => stepView(page, parts[1], Number(parts[3]), query);
  } else if (parts[0] === 'session' && parts[1]) {
    document.getElementById('nav-sessions').classList.add('active');
    build = () => sessionView(page, parts[1]);
  } else {
    document.getElementById('nav-sessions').classList.add('active');
    build = () => sessionsView(page, query);
  }
  view.replaceChildren(h('p', { class: 'muted loading', 'data-testid': 'loading' }, 'Loading…'));
  try {
    await build();
  } catch (e) {
    if (mine !== generation) return;
    page.replaceChildren(errorBox(e));
  }
  if (mine !== generation) return;
  view.replaceChildren(page);
}

function errorBox(e) {
  if (e instanceof HttpError) {
    return h('div', { class: 'error-box', 'data-testid': 'error' },
      h('strong', {}, `${e.status} ${e.code}`), ' ', quoted(e.message));
  }
  return h('div', { class: 'error-box', 'data-testid': 'error' }, String(e && e.message || e));
}

// ---------------------------------------------------------------------------------------------
// Sessions

async function sessionsView(page, query) {
  const q = query.get('q') || '';
  const search = h('input', {
    id: 'session-search', 'data-testid': 'session-search', type: 'search',
    placeholder: 'Filter by session id or agent', value: q, autocomplete: 'off',
  });
  const count = h('span', { id: 'session-count', class: 'muted' });
  const body = h('tbody');
  const table = h('table', { id: 'sessions-table', 'data-testid': 'sessions-table' },
    h('thead', {}, h('tr', {},
      h('th', {}, 'Session'), h('th', {}, 'Agent'), h('th', { class: 'num' }, 'Steps'),
      h('th', { class: 'num' }, 'Events'), h('th', {}, 'Last activity'), h('th', {}, 'Created'))),
    body);
  const open = h('form', { class: 'inline', id: 'open-session' },
    h('input', { id: 'open-session-id', placeholder: 'Session id', autocomplete: 'off' }),
    h('button', { type: 'submit' }, 'Open'));
  open.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const id = document.getElementById('open-session-id').value.trim();
    if (id) location.hash = route('session', id);
  });
  const refresh = h('button', { type: 'button', id: 'sessions-refresh' }, 'Refresh');
  const status = h('div', { id: 'sessions-status' });
  add(page,
    h('div', { class: 'title-row' }, h('h1', {}, 'Sessions'), count, refresh),
    h('div', { class: 'toolbar' }, search, open),
    status, table);

  let latest = 0;
  async function load() {
    const mine = ++latest;
    const text = search.value.trim();
    const params = new URLSearchParams({ limit: '200' });
    if (text) params.set('q', text);
    let list;
    try {
      list = await optional(`/v1/sessions?${params}`);
    } catch (e) {
      if (mine === latest) status.replaceChildren(errorBox(e));
      return;
    }
    if (mine !== latest) return; // a later search answered first
    if (list === null) {
      status.replaceChildren(notice(
        'This daemon has no session list (`GET /v1/sessions`): open a session by its id.', 'warn'));
      body.replaceChildren();
      count.textContent = '';
      return;
    }
    status.replaceChildren();
    const sessions = list.sessions || [];
    count.textContent = `${sessions.length} shown${text ? ` matching “${text}”` : ''}`;
    body.replaceChildren(...sessions.map(sessionRow));
    if (!sessions.length) {
      body.append(h('tr', {}, h('td', { colspan: 6, class: 'muted' },
        text ? 'No session matches.' : 'No sessions yet.')));
    }
  }
  let timer = null;
  search.addEventListener('input', () => {
    clearTimeout(timer);
    timer = setTimeout(() => {
      const text = search.value.trim();
      // Keeps the filter in the address without a new render.
      history.replaceState(null, '', text ? `#/sessions?q=${encodeURIComponent(text)}` : '#/sessions');
      load();
    }, 200);
  });
  refresh.addEventListener('click', load);
  await load();
}

function sessionRow(s) {
  const link = h('a', { href: route('session', s.id), class: 'session-link', 'data-testid': 'session-link' },
    s.id);
  return h('tr', { 'data-testid': 'session-row', 'data-session-id': s.id },
    h('td', { class: 'mono' }, link),
    h('td', { 'data-testid': 'session-agent' }, s.agent),
    h('td', { class: 'num', 'data-testid': 'session-steps' }, s.steps),
    h('td', { class: 'num' }, s.events),
    h('td', { title: when(s.last_ms) }, ago(s.last_ms)),
    h('td', { title: when(s.created_ms) }, when(s.created_ms)));
}

// ---------------------------------------------------------------------------------------------
// A session's log

/** The log read as steps: each marker with what came before it since the previous one. */
function stepsOf(events) {
  const steps = [];
  let pending = [];
  let header = null;
  let snapshot = null;
  for (const e of events) {
    if (e.kind === 'request/header') header = e;
    if (e.kind === 'context/snapshot') snapshot = e;
    if (e.kind === 'step') {
      steps.push({
        n: e.body.step,
        marker: e,
        events: pending,
        header, // the header this step sent (the last one recorded)
        newHeader: pending.find((p) => p.kind === 'request/header') || null,
        snapshot: snapshot && !snapshot.body.cleared ? snapshot : null,
      });
      pending = [];
    } else {
      pending.push(e);
    }
  }
  return steps;
}

/** Step number → the cache outcome recorded with the reply that followed it. */
function cacheOutcomes(events) {
  const out = new Map();
  let step = 0;
  for (const e of events) {
    if (e.kind === 'step') step = e.body.step;
    else if (e.kind === 'assistant/message' && e.body && e.body.cache && !out.has(step)) {
      out.set(step, e.body.cache);
    }
  }
  return out;
}

/** A cache outcome as a badge, its figures and cause in the title. */
function cacheBadge(c) {
  const words = [`expected to read ${c.expected_read} tokens`];
  if (c.lost) words.push(`lost ${c.lost} tokens`);
  if (c.gap_ms != null) words.push(`${(c.gap_ms / 1000).toFixed(1)} s after the previous request`);
  if (c.part) words.push(`at ${c.part}${c.plugin ? ` (plugin ${c.plugin})` : ''}`);
  if (c.cause) words.push(c.cause);
  const good = c.outcome === 'hit' || c.outcome === 'cold' || c.outcome === 'uncacheable';
  return badge(c.outcome + (c.plugin ? ` · ${c.plugin}` : ''), `cache ${good ? 'good' : 'bad'}`, {
    'data-testid': 'cache-outcome', 'data-outcome': c.outcome, title: words.join('; '),
  });
}

function contentText(content) {
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) {
    return content.map((b) => (b.type === 'text' ? b.text : `[${b.type}]`)).join(' ');
  }
  return content == null ? '' : JSON.stringify(content);
}

function preview(text, n = 160) {
  const t = String(text).replace(/\s+/g, ' ').trim();
  return t.length > n ? `${t.slice(0, n)}…` : t;
}

/** One line saying what an event is. */
function eventSummary(e, sessionId) {
  const b = e.body || {};
  switch (e.kind) {
    case 'session/created':
      return ['agent ', h('code', {}, b.agent)];
    case 'user/message':
    case 'message/user':
      return b.snapshot ? ['runtime context snapshot'] : [preview(contentText(b.content))];
    case 'assistant/message':
    case 'message/assistant': {
      const calls = (b.tool_calls || []).map((c) => h('code', {}, c.name));
      return [b.cache ? [cacheBadge(b.cache), ' '] : null, preview(b.content || ''),
        calls.length ? [' → calls ', calls] : null];
    }
    case 'tool/result':
      return [h('code', {}, b.tool_call_id), b.is_error ? badge('error', 'bad') : null, ' ',
        preview(contentText(b.content))];
    case 'context/snapshot':
      return b.cleared ? ['runtime context cleared'] : [preview(String(b.content || '')
        .replace(RUNTIME_CONTEXT_HEADER, ''))];
    case 'request/header': {
      const hd = b.header || {};
      return [badge(b.reason, `reason reason-${b.reason}`, { 'data-testid': 'header-reason' }), ' ',
        `${(hd.tools || []).length} tools, system ${Array.from(hd.system || '').length} chars`,
        hd.model && hd.model.model ? [', model ', h('code', {}, hd.model.model)] : null];
    }
    case 'step': {
      const u = b.usage;
      return [h('a', { href: route('session', sessionId, 'step', b.step), 'data-testid': 'step-link',
        class: 'step-link' }, `Step ${b.step} →`),
      u && u.total ? ` ${u.total.tokens} tokens (${u.tokenizer})` : null,
      b.facts && Object.keys(b.facts).length
        ? [' · facts ', Object.keys(b.facts).map((k) => h('code', {}, k))] : null];
    }
    case 'plugin/omitted':
      return ['plugin ', h('code', {}, b.plugin), ' left out ', h('code', {}, b.contribution), ': ',
        quoted(b.cause || '')];
    case 'history/dropped':
      return [`${(b.messages || b.seqs || []).length || b.count || ''} messages dropped to fit the budget`];
    case 'history/compacted':
      return [`events ${b.from}–${b.to} shown as a summary: `, preview(b.summary || '')];
    case 'gateway/request': {
      const added = ((b.splice && b.splice.edits) || []).reduce((n, e) => n + e.insert.length, 0);
      return [h('code', {}, b.ingress), ' → upstream ', h('code', {}, b.upstream), ', joined by ',
        badge(b.joined_by, 'muted-badge'), `, ${added} bytes added`,
        b.rewrote_at != null ? [' ', badge('client rewrote its history', 'bad')] : null];
    }
    default:
      return [];
  }
}

async function sessionView(page, id) {
  const log = await api(`/v1/sessions/${encodeURIComponent(id)}/events`);
  const events = log.events || [];
  const steps = stepsOf(events);
  const created = events.find((e) => e.kind === 'session/created');
  const agent = created ? created.body.agent : '';
  const first = events.length ? events[0].at_ms : 0;
  const last = events.length ? events[events.length - 1].at_ms : 0;

  add(page,
    h('nav', { class: 'crumbs' }, h('a', { href: '#/sessions' }, 'Sessions'), ' › ',
      h('span', { class: 'mono' }, id)),
    h('div', { class: 'title-row' },
      h('h1', {}, 'Session ', h('span', { class: 'mono', id: 'session-id' }, id)),
      h('span', { class: 'muted' }, `agent `, h('code', { id: 'session-agent' }, agent),
        ` · ${steps.length} steps · ${events.length} events · ${when(first)} – ${when(last)}`)));

  const outcomes = cacheOutcomes(events);
  const stepRows = steps.map((s) => {
    const u = s.marker.body.usage;
    const cache = outcomes.get(s.n);
    const messages = s.events.filter((e) => /message|tool\/result/.test(e.kind) && !(e.body && e.body.snapshot));
    return h('tr', { 'data-testid': 'step-row', 'data-step': s.n },
      h('td', {}, h('a', { href: route('session', id, 'step', s.n), 'data-testid': 'step-link' }, `Step ${s.n}`)),
      h('td', {}, s.newHeader ? badge(`header: ${s.newHeader.body.reason}`,
        `reason reason-${s.newHeader.body.reason}`) : h('span', { class: 'muted' }, 'same header')),
      h('td', { class: 'num' }, messages.length),
      h('td', { class: 'num' }, u && u.total ? u.total.tokens : ''),
      h('td', { class: 'num' }, u ? u.message_count : ''),
      h('td', {}, cache ? cacheBadge(cache) : h('span', { class: 'muted' }, '—')),
      h('td', { title: when(s.marker.at_ms) }, when(s.marker.at_ms)));
  });
  add(page, h('h2', {}, 'Steps'),
    steps.length
      ? h('table', { id: 'steps-table', 'data-testid': 'steps-table' },
        h('thead', {}, h('tr', {}, h('th', {}, 'Step'), h('th', {}, 'Header'),
          h('th', { class: 'num' }, 'New messages'), h('th', { class: 'num' }, 'Tokens (est.)'),
          h('th', { class: 'num' }, 'Messages sent'), h('th', {}, 'Cache'), h('th', {}, 'At'))),
        h('tbody', {}, stepRows))
      : h('p', { class: 'muted' }, 'No steps yet.'));

  // Kinds to show: messages can be hidden to see the structure of a long session.
  const toggle = h('input', { type: 'checkbox', id: 'timeline-messages', checked: true });
  const list = h('ol', { id: 'timeline', 'data-testid': 'timeline', class: 'timeline' },
    events.map((e) => h('li', {
      'data-testid': 'event', 'data-kind': e.kind, 'data-seq': e.seq,
      class: `event kind-${e.kind.replace('/', '-')}`,
    },
    h('span', { class: 'seq' }, `#${e.seq}`),
    h('span', { class: 'at', title: when(e.at_ms) }, `+${((e.at_ms - first) / 1000).toFixed(3)} s`),
    h('span', { class: 'kind' }, e.kind),
    h('span', { class: 'summary' }, eventSummary(e, id)),
    jsonDetails('body', e.body))));
  toggle.addEventListener('change', () => list.classList.toggle('hide-messages', !toggle.checked));
  add(page, h('div', { class: 'title-row' }, h('h2', {}, 'Timeline'),
    h('label', { class: 'muted' }, toggle, ' messages')), list);
}

// ---------------------------------------------------------------------------------------------
// A step

/**
 * Splits `text` into the named parts it was joined from (non-empty ones, by one blank line),
 * using each part's length in code points as the step's usage recorded it. Null when the
 * lengths do not add up (an older log, or a text that is not such a join).
 */
function splitJoined(text, parts) {
  if (!Array.isArray(parts)) return null;
  const cps = Array.from(text);
  const out = [];
  let pos = 0;
  let any = false;
  for (const p of parts) {
    const n = p.chars || 0;
    if (!n) { out.push({ name: p.name, text: '' }); continue; }
    if (any) {
      if (cps[pos] !== '\n' || cps[pos + 1] !== '\n') return null;
      pos += 2;
    }
    if (pos + n > cps.length) return null;
    out.push({ name: p.name, text: cps.slice(pos, pos + n).join('') });
    pos += n;
    any = true;
  }
  return pos === cps.length ? out : null;
}

/** The parts of a join when no lengths are known: only when the blank lines count them. */
function splitByBlankLines(text, names) {
  const pieces = text ? text.split('\n\n') : [];
  if (pieces.length !== names.length) return null;
  return names.map((name, i) => ({ name, text: pieces[i] }));
}

function provenanceLabel(origin, plugins, extra) {
  if (!origin) return badge('origin unknown', 'muted-badge');
  const sha = plugins && plugins[origin.plugin];
  return h('span', { class: 'label', 'data-testid': 'part-label', 'data-plugin': origin.plugin },
    h('span', { class: 'label-plugin' }, origin.plugin),
    h('span', { class: 'label-scope' }, origin.scope),
    sha ? h('span', { class: 'label-sha', title: sha }, short(sha, 8)) : null,
    extra || null);
}

function byName(list) {
  const m = new Map();
  for (const o of list || []) m.set(o.name, o);
  return m;
}

/** Names a diff's text points at: `tool `bash`` → tool bash. */
function namedParts(texts) {
  const found = { tool: new Set(), section: new Set(), context: new Set(), variable: new Set() };
  for (const t of texts) {
    const re = /\b(tool|section|context|variable)s? `([^`]+)`/g;
    let m;
    while ((m = re.exec(String(t)))) found[m[1]].add(m[2]);
  }
  return found;
}

function causeText(c) {
  return typeof c === 'string' ? c : (c && (c.text || c.message || c.cause)) || JSON.stringify(c);
}

/** Whether a cause broke the cached prefix: the server says so, or the prefix broke and the
 * cause is not one of the harmless kinds. */
function causeBreaks(c, diff) {
  if (c && typeof c === 'object' && typeof (c.breaks ?? c.breaking) === 'boolean') {
    return c.breaks ?? c.breaking;
  }
  const prev = diff && diff.previous;
  if (!prev || prev.prefix_kept) return false;
  return !/prefix kept|only new messages|unchanged/i.test(causeText(c));
}

async function stepView(page, id, n, query) {
  const enc = encodeURIComponent(id);
  let format = query.get('format') || sessionStorage.getItem(FORMAT_KEY) || 'neutral';
  if (!FORMATS.includes(format)) format = 'neutral';
  sessionStorage.setItem(FORMAT_KEY, format);
  const base = `/v1/sessions/${enc}/steps/${n}`;
  const [log, raw, explain, diff] = await Promise.all([
    api(`/v1/sessions/${enc}/events`),
    api(`${base}/request?format=${format}`, { text: true }),
    optional(`${base}/explain?format=${format}`).catch((e) => ({ error: e })),
    optional(`${base}/diff?format=${format}`).catch((e) => ({ error: e })),
  ]);
  const steps = stepsOf(log.events || []);
  const step = steps.find((s) => s.n === n);
  if (!step) throw new HttpError(404, 'unknown_step', `session \`${id}\` has no step ${n}`);

  // Where each part came from: the explain route, else what the log recorded.
  const provenance = (explain && !explain.error && explain.provenance)
    || step.marker.body.provenance
    || (step.header && step.header.body.provenance) || null;
  const plugins = (provenance && provenance.plugins) || {};
  const diffOk = diff && !diff.error ? diff : null;
  const divergence = diffOk && diffOk.previous && diffOk.previous.first_divergence;
  const changed = namedParts([...(diffOk ? (diffOk.causes || []).map(causeText) : []),
    divergence ? divergence.part : '']);

  // Header: crumbs, step navigation, format switcher.
  const prev = steps.find((s) => s.n === n - 1);
  const next = steps.find((s) => s.n === n + 1);
  const stepHref = (k) => `${route('session', id, 'step', k)}?format=${format}`;
  add(page,
    h('nav', { class: 'crumbs' }, h('a', { href: '#/sessions' }, 'Sessions'), ' › ',
      h('a', { href: route('session', id), class: 'mono' }, id), ' › ', `Step ${n}`),
    h('div', { class: 'title-row' },
      h('h1', { id: 'step-title' }, `Step ${n}`, h('span', { class: 'muted' }, ` of ${steps.length}`)),
      prev ? h('a', { href: stepHref(n - 1), id: 'step-prev', class: 'button' }, '← previous') : null,
      next ? h('a', { href: stepHref(n + 1), id: 'step-next', class: 'button' }, 'next →') : null,
      step.newHeader ? badge(`new header: ${step.newHeader.body.reason}`,
        `reason reason-${step.newHeader.body.reason}`, { 'data-testid': 'step-header-reason' })
        : badge('same header as the step before', 'muted-badge')),
    h('div', { id: 'format-switcher', class: 'switcher', 'data-testid': 'format-switcher', role: 'group' },
      FORMATS.map((f) => h('a', {
        href: stepHref(n).replace(`format=${format}`, `format=${f}`),
        class: f === format ? 'active' : '', 'aria-pressed': f === format ? 'true' : 'false',
        'data-testid': `format-${f}`, 'data-format': f,
      }, f))));

  add(page, diffPanel(diff, n, format));
  const held = heldPanel(step, explain);
  if (held) add(page, held);
  add(page, partsPanel(step, provenance, plugins, usageOf(step), changed));
  add(page, requestPanel(raw, format, provenance, plugins, changed, n));
  const gateway = gatewayOf(log.events || [], n);
  if (gateway) add(page, await gatewayPanel(gateway, base));
  add(page, provenanceTable(provenance, plugins, explain));
}

/** Step `n`'s `gateway/request` (it follows the step's marker) and the reply after it. */
function gatewayOf(events, n) {
  let step = 0;
  let request = null;
  for (const e of events) {
    if (e.kind === 'step') {
      if (request) break;
      step = e.body.step;
    } else if (step === n && e.kind === 'gateway/request') {
      request = e;
    } else if (request && e.kind === 'assistant/message') {
      return { request, reply: e };
    }
  }
  return request ? { request, reply: null } : null;
}

// G4: a gateway step, side by side: what the client sent, what promptd added where, what went
// upstream (rebuilt from the log) and what the upstream answered.
async function gatewayPanel({ request, reply }, base) {
  const b = request.body;
  const splice = b.splice || {};
  const upstream = await api(`${base}/upstream`, { text: true }).catch((e) => `(${e.message})`);
  const edits = (splice.edits || []).map((e) => h('li', { 'data-testid': 'gateway-edit', 'data-part': e.part },
    badge(e.part, 'muted-badge'), ` at byte ${e.at}`, e.remove ? `, replacing ${e.remove} bytes` : '',
    ': ', h('code', {}, preview(e.insert, 120))));
  return h('section', { class: 'panel', id: 'gateway', 'data-testid': 'gateway-panel' },
    h('h2', {}, 'Through the gateway'),
    h('p', {}, h('code', {}, b.ingress), ' to upstream ', h('code', {}, b.upstream), ', joined by ',
      badge(b.joined_by, 'muted-badge'), `; the client's messages ${b.new_from}–${b.messages} were new`,
      b.rewrote_at != null ? [' ', badge(`the client rewrote its history at message ${b.rewrote_at}`, 'bad')] : null,
      b.degraded ? [' ', badge(`degraded: ${b.degraded}`, 'bad')] : null),
    h('h3', {}, 'What promptd added'),
    edits.length ? h('ol', { class: 'edits' }, edits) : h('p', { class: 'muted' }, 'nothing'),
    splice.denied && splice.denied.length
      ? h('p', {}, 'client tools taken out: ', splice.denied.map((t) => h('code', {}, t))) : null,
    splice.deferred && splice.deferred.length
      ? h('p', {}, 'client tools deferred (loaded on a tool search): ', splice.deferred.map((t) => h('code', {}, t))) : null,
    (splice.skipped || []).map((s) => h('p', { class: 'muted' }, s)),
    h('p', {}, `client breakpoints: ${splice.client_breakpoints || 0}`,
      splice.breakpoint_added ? '; promptd added one after its sections' : ''),
    h('details', { class: 'json-details', 'data-testid': 'gateway-client' },
      h('summary', {}, `What the client sent (${bytes(b.client_body.length)})`),
      h('pre', { class: 'json' }, b.client_body)),
    h('details', { class: 'json-details', 'data-testid': 'gateway-upstream' },
      h('summary', {}, `What went upstream (${bytes(upstream.length)})`),
      h('pre', { class: 'json', 'data-testid': 'gateway-upstream-body' }, upstream)),
    reply ? jsonDetails('What the upstream answered (as recorded)', reply.body, { 'data-testid': 'gateway-reply' })
      : h('p', { class: 'muted' }, 'no reply recorded'));
}

// K7: what the step held for a cache-cold point, and what its header applied of what was held.
// The explain route words it; the log's marker and header say the same without it.
function heldPanel(step, explain) {
  const held = step.marker.body.held || [];
  const released = step.newHeader && step.newHeader.body.released;
  if (!held.length && !released) return null;
  const said = (explain && !explain.error && explain.said) || [
    ...held.map((p) => `${p.kind} \`${p.name}\` of plugin \`${p.plugin}\` held since step ${p.since_step}, ${Math.ceil(p.kept_bytes / 1000)} kB of cached prefix kept`),
    ...(released ? [`applied ${released.held.length} held change${released.held.length === 1 ? '' : 's'} (${released.cause})`] : []),
  ];
  return h('section', { id: 'held', 'data-testid': 'held', class: 'panel' },
    h('h2', {}, 'Held changes'),
    h('ul', {}, said.map((line) => h('li', { 'data-testid': 'held-line' }, line))));
}

function usageOf(step) {
  return step.marker.body.usage || null;
}

function diffPanel(diff, n, format) {
  const panel = h('section', { id: 'diff', 'data-testid': 'diff', class: 'panel' },
    h('h2', {}, n > 1 ? `What changed since step ${n - 1}` : 'What changed'));
  if (diff === null) {
    return add(panel, notice('This daemon has no step diffs (`GET …/steps/{n}/diff`).', 'warn'));
  }
  if (diff.error) return add(panel, errorBox(diff.error));
  const prev = diff.previous;
  if (!prev) {
    add(panel, h('p', { 'data-testid': 'diff-first' },
      `The first step: all ${bytes(diff.bytes)} are new to the provider's cache.`));
  } else {
    const share = diff.bytes ? prev.shared_bytes / diff.bytes : 0;
    const bar = h('div', { class: 'bar', id: 'prefix-bar', 'data-testid': 'prefix-bar' },
      h('div', { class: prev.prefix_kept ? 'shared kept' : 'shared broke' }));
    // Set through the CSSOM: the page's policy forbids inline style attributes.
    bar.firstChild.style.width = `${Math.min(100, (share * 100)).toFixed(2)}%`;
    add(panel, bar,
      h('p', { 'data-testid': 'prefix-summary' },
        `${bytes(prev.shared_bytes)} of this step's ${bytes(diff.bytes)} (${format}) are a prefix shared with step ${prev.step} (${percent(share)}). `,
        prev.prefix_kept
          ? badge('prefix kept: step ' + prev.step + "'s whole request is this one's start", 'good', { 'data-testid': 'prefix-kept' })
          : badge('cache prefix broke', 'bad', { 'data-testid': 'prefix-broke' }),
        prev.first_divergence ? [' at ', h('strong', { 'data-testid': 'first-divergence' },
          quoted(prev.first_divergence.part)), ` (byte ${prev.first_divergence.offset})`] : null));
  }
  const causes = diff.causes || [];
  if (causes.length) {
    add(panel, h('h3', {}, 'Why'),
      h('ul', { id: 'diff-causes', 'data-testid': 'diff-causes', class: 'causes' },
        causes.map((c) => {
          const breaks = causeBreaks(c, diff);
          return h('li', { 'data-testid': 'diff-cause', class: breaks ? 'cause breaks' : 'cause',
            'data-breaks': breaks ? 'true' : 'false' },
          breaks ? badge('breaks the cache', 'bad') : null, ' ', quoted(causeText(c)));
        })));
  }
  const same = diff.same_header;
  if (same) {
    // An earlier step with this very header: a provider may still hold its cache.
    add(panel, h('p', { 'data-testid': 'same-header' },
      badge(`same header as step ${same.step}`, 'good'), ' ',
      `Step ${same.step} sent this same header, so a provider may still hold its cache: `,
      `${bytes(same.shared_bytes)} of this request are a prefix shared with it`,
      same.first_divergence ? [', up to ', quoted(same.first_divergence.part)] : null, '.'));
  }
  const cs = diff.cached_share;
  if (cs) {
    add(panel, h('p', { 'data-testid': 'cached-share' }, 'A provider cache could serve ',
      h('strong', {}, percent(cs.bytes)), ' of this request',
      cs.tokens ? [` (${cs.tokens.shared} of ${cs.tokens.total} tokens by `, h('code', {}, cs.tokens.tokenizer), ')'] : null,
      same ? ', the better of the two comparisons.' : '.'));
  }
  for (const note of diff.notes || []) add(panel, h('p', { class: 'muted note' }, quoted(causeText(note))));
  return panel;
}

function partsPanel(step, provenance, plugins, usage, changed) {
  const panel = h('section', { id: 'parts', 'data-testid': 'parts', class: 'panel' },
    h('h2', {}, 'Where each part came from'));
  const sections = byName(provenance && provenance.sections);
  const contexts = byName(provenance && provenance.contexts);
  const tools = byName(provenance && provenance.tools);

  const header = step.header ? step.header.body.header || {} : {};
  const system = header.system || '';
  // Sections in output order: the usage's order (it lists empty ones too), else provenance's.
  const sectionNames = usage && usage.sections ? usage.sections.map((s) => s.name)
    : (provenance ? (provenance.sections || []).map((s) => s.name) : []);
  let parts = splitJoined(system, usage && usage.sections)
    || splitByBlankLines(system, sectionNames.filter((name) => {
      const u = usage && usage.sections && usage.sections.find((s) => s.name === name);
      return !u || u.chars > 0;
    }));
  const sys = h('div', { id: 'system-parts', 'data-testid': 'system-parts' });
  if (parts) {
    for (const p of parts) {
      const o = sections.get(p.name);
      sys.append(h('div', {
        class: `part${changed.section.has(p.name) ? ' changed' : ''}${p.text ? '' : ' empty'}`,
        'data-testid': 'system-part', 'data-section': p.name, 'data-plugin': o ? o.plugin : '',
      },
      h('div', { class: 'part-head' }, h('span', { class: 'part-kind' }, 'section'),
        h('code', { class: 'part-name' }, p.name), provenanceLabel(o, plugins),
        changed.section.has(p.name) ? badge('changed', 'bad') : null,
        p.text ? null : h('span', { class: 'muted' }, ' empty: left out')),
      p.text ? h('pre', { class: 'part-text', 'data-testid': 'system-text' }, p.text) : null));
    }
  } else {
    // The text cannot be cut into its sections: show it whole, with every section's label.
    sys.append(h('div', { class: 'part', 'data-testid': 'system-part' },
      h('div', { class: 'part-head' }, h('span', { class: 'part-kind' }, 'system'),
        [...sections.values()].map((o) => [h('code', {}, o.name), provenanceLabel(o, plugins)])),
      h('pre', { class: 'part-text', 'data-testid': 'system-text' }, system)));
  }
  add(panel, h('h3', {}, 'System text'), system ? sys : h('p', { class: 'muted' }, 'No system text.'));

  // The runtime context this step sent (the last snapshot, appended when it changed).
  if (step.snapshot) {
    const content = String(step.snapshot.body.content || '');
    const bodyText = content.startsWith(`${RUNTIME_CONTEXT_HEADER}\n\n`)
      ? content.slice(RUNTIME_CONTEXT_HEADER.length + 2) : null;
    const cparts = bodyText != null ? (splitJoined(bodyText, usage && usage.contexts)
      || splitByBlankLines(bodyText, [...contexts.keys()])) : null;
    const ctx = h('div', { id: 'context-parts', 'data-testid': 'context-parts' },
      h('p', { class: 'muted' }, `Sent as a user message (event #${step.snapshot.seq}), after `,
        h('code', {}, RUNTIME_CONTEXT_HEADER)));
    for (const p of cparts || [{ name: null, text: content }]) {
      if (!p.text) continue;
      const o = p.name ? contexts.get(p.name) : null;
      ctx.append(h('div', { class: `part${p.name && changed.context.has(p.name) ? ' changed' : ''}`,
        'data-testid': 'context-part', 'data-context': p.name || '' },
      h('div', { class: 'part-head' }, h('span', { class: 'part-kind' }, 'context'),
        p.name ? [h('code', { class: 'part-name' }, p.name), provenanceLabel(o, plugins)]
          : [...contexts.values()].map((c) => [h('code', {}, c.name), provenanceLabel(c, plugins)])),
      h('pre', { class: 'part-text' }, p.text)));
    }
    add(panel, h('h3', {}, 'Runtime context'), ctx);
  }

  // Tools, in the order sent; those the step did not show are marked.
  const shown = step.marker.body.shown_tools ? new Set(step.marker.body.shown_tools) : null;
  const rows = (header.tools || []).map((t) => {
    const o = tools.get(t.name);
    const isChanged = changed.tool.has(t.name);
    return h('tr', { 'data-testid': 'tool-row', 'data-tool': t.name, 'data-plugin': o ? o.plugin : '',
      class: `${isChanged ? 'changed' : ''}${shown && !shown.has(t.name) ? ' not-shown' : ''}` },
    h('td', {}, h('code', { class: 'tool-name', 'data-testid': 'tool-name' }, t.name),
      isChanged ? badge('changed', 'bad', { 'data-testid': 'tool-changed' }) : null,
      shown && !shown.has(t.name) ? badge('not shown this step', 'muted-badge') : null),
    h('td', {}, provenanceLabel(o, plugins)),
    h('td', {}, preview(t.description || '', 200)),
    h('td', {}, jsonDetails('parameters', t.parameters)));
  });
  add(panel, h('h3', {}, `Tools (${rows.length})`), rows.length
    ? h('table', { id: 'tool-parts', 'data-testid': 'tool-parts' },
      h('thead', {}, h('tr', {}, h('th', {}, 'Tool'), h('th', {}, 'From'), h('th', {}, 'Description'),
        h('th', {}, 'Schema'))), h('tbody', {}, rows))
    : h('p', { class: 'muted' }, 'No tools.'));

  const variables = (provenance && provenance.variables) || [];
  if (variables.length) {
    add(panel, h('h3', {}, 'Variables used'), h('ul', { id: 'variable-parts', class: 'inline-list' },
      variables.map((v) => h('li', { 'data-testid': 'variable-part', 'data-variable': v.name },
        h('code', {}, `{{${v.name}}}`), ' ', provenanceLabel(v, plugins)))));
  }
  return panel;
}

/** A JSON text laid out with two-space indents, its tokens kept byte for byte, with labels
 * after the tool names and the system text. */
function prettyJson(raw, annotate) {
  const pre = h('pre', { class: 'json pretty', id: 'request-pretty', 'data-testid': 'request-pretty' });
  const stack = []; // open containers: {arr, key, index}
  let expectKey = false;
  let buf = '';
  const flush = () => { if (buf) { pre.append(buf); buf = ''; } };
  const span = (cls, text) => { flush(); pre.append(h('span', { class: cls }, text)); };
  let label = null; // shown at the end of the value's line, after its comma
  const newline = () => {
    if (label) { flush(); pre.append(' ', label); label = null; }
    buf += `\n${'  '.repeat(stack.length)}`;
  };
  const path = () => stack.map((s) => (s.arr ? s.index : s.key));
  const nextNonSpace = (j) => { while (j < raw.length && /\s/.test(raw[j])) j++; return j; };
  let i = 0;
  while (i < raw.length) {
    const c = raw[i];
    if (/\s/.test(c)) { i++; continue; }
    if (c === '{' || c === '[') {
      const close = c === '{' ? '}' : ']';
      const j = nextNonSpace(i + 1);
      if (raw[j] === close) { buf += c + close; i = j + 1; continue; }
      buf += c;
      stack.push({ arr: c === '[', key: null, index: 0 });
      expectKey = c === '{';
      newline();
      i++;
    } else if (c === '}' || c === ']') {
      stack.pop();
      newline();
      buf += c;
      i++;
    } else if (c === ',') {
      buf += ',';
      const top = stack[stack.length - 1];
      if (top.arr) top.index++; else expectKey = true;
      newline();
      i++;
    } else if (c === ':') {
      buf += ': ';
      i++;
    } else if (c === '"') {
      let j = i + 1;
      while (j < raw.length && raw[j] !== '"') j += raw[j] === '\\' ? 2 : 1;
      const token = raw.slice(i, j + 1);
      i = j + 1;
      const top = stack[stack.length - 1];
      if (top && !top.arr && expectKey) {
        top.key = JSON.parse(token);
        expectKey = false;
        span('k', token);
      } else {
        span('s', token);
        label = annotate(path(), token);
      }
    } else {
      let j = i;
      while (j < raw.length && !/[\s,\]}:]/.test(raw[j])) j++;
      const token = raw.slice(i, j);
      span(/^[-\d]/.test(token) ? 'n' : 'l', token);
      i = j;
    }
  }
  if (label) { flush(); pre.append(' ', label); }
  flush();
  return pre;
}

function requestPanel(raw, format, provenance, plugins, changed, n) {
  const tools = byName(provenance && provenance.tools);
  const sections = (provenance && provenance.sections) || [];
  let parsed = null;
  try { parsed = JSON.parse(raw); } catch (_) { /* shown raw */ }
  const firstRole = parsed && parsed.messages && parsed.messages[0] && parsed.messages[0].role;
  const isSystem = (p) => (p.length === 1 && (p[0] === 'system' || p[0] === 'instructions'))
    || (p.length === 3 && p[0] === 'system' && p[2] === 'text')
    || (format === 'openai' && p.length === 3 && p[0] === 'messages' && p[1] === 0
      && p[2] === 'content' && (firstRole === 'system' || firstRole === 'developer'));
  const annotate = (p, token) => {
    const isToolName = p[0] === 'tools' && p[p.length - 1] === 'name'
      && (p.length === 3 || (p.length === 4 && p[2] === 'function'));
    if (isToolName) {
      const name = JSON.parse(token);
      const o = tools.get(name);
      return h('span', { class: `inline-label${changed.tool.has(name) ? ' changed' : ''}`,
        'data-testid': 'body-tool-label', 'data-tool': name },
      '← ', provenanceLabel(o, plugins), changed.tool.has(name) ? badge('changed', 'bad') : null);
    }
    if (isSystem(p) && sections.length) {
      return h('span', { class: 'inline-label block', 'data-testid': 'body-system-label' },
        '↑ the system text: sections ',
        sections.map((s) => [h('code', {}, s.name), ' ', provenanceLabel(s, plugins), ' ']));
    }
    return null;
  };
  const panel = h('section', { id: 'request', 'data-testid': 'request', class: 'panel' },
    h('div', { class: 'title-row' }, h('h2', {}, `The request as sent (${format})`),
      h('span', { class: 'muted', id: 'request-bytes' }, `${bytes(new TextEncoder().encode(raw).length)}, rebuilt from the log: byte for byte what step ${n} returned`)));
  const rawPre = h('pre', { class: 'json raw', id: 'request-raw', 'data-testid': 'request-raw' }, raw);
  const pretty = parsed && raw.length <= PRETTY_MAX ? prettyJson(raw, annotate) : null;
  const showRaw = h('input', { type: 'checkbox', id: 'request-show-raw', checked: !pretty });
  const copy = h('button', { type: 'button', id: 'request-copy' }, 'Copy the exact bytes');
  copy.addEventListener('click', async () => {
    try { await navigator.clipboard.writeText(raw); copy.textContent = 'Copied'; } catch (_) { copy.textContent = 'Copy refused'; }
  });
  const sync = () => {
    rawPre.hidden = !showRaw.checked;
    if (pretty) pretty.hidden = showRaw.checked;
  };
  showRaw.addEventListener('change', sync);
  if (!pretty) showRaw.disabled = true;
  sync();
  add(panel, h('div', { class: 'toolbar' },
    h('label', {}, showRaw, ' exact bytes (no indentation)'), copy,
    pretty ? h('span', { class: 'muted' }, 'Indented view: every token as sent, labels after tool names and the system text.') : null),
  pretty, rawPre);
  return panel;
}

function provenanceTable(provenance, plugins, explain) {
  const panel = h('section', { id: 'provenance', 'data-testid': 'provenance', class: 'panel' },
    h('h2', {}, 'Provenance'));
  if (!provenance) {
    if (explain && explain.error) add(panel, errorBox(explain.error));
    return add(panel, notice('No provenance for this step: the daemon has no `GET …/steps/{n}/explain`, and the log recorded none.', 'warn'));
  }
  const rows = [];
  for (const kind of ['sections', 'contexts', 'variables', 'tools']) {
    for (const o of provenance[kind] || []) {
      rows.push(h('tr', { 'data-testid': 'provenance-row', 'data-kind': kind.slice(0, -1), 'data-name': o.name },
        h('td', {}, kind.slice(0, -1)), h('td', {}, h('code', {}, o.name)),
        h('td', {}, h('code', {}, o.plugin)), h('td', {}, o.scope),
        h('td', { class: 'mono', title: plugins[o.plugin] || '' }, short(plugins[o.plugin])),
        h('td', { class: 'mono' }, o.text || '')));
    }
  }
  add(panel, h('table', { id: 'provenance-table', 'data-testid': 'provenance-table' },
    h('thead', {}, h('tr', {}, h('th', {}, 'Kind'), h('th', {}, 'Name'), h('th', {}, 'Plugin'),
      h('th', {}, 'Scope'), h('th', {}, 'Plugin sha256'), h('th', {}, 'Text hash'))),
    h('tbody', {}, rows)));
  const ids = Object.keys(plugins);
  if (ids.length) {
    add(panel, h('p', { class: 'muted' }, 'Plugins serving this step: ',
      ids.map((p) => [h('code', {}, p), ' ', h('span', { class: 'mono', title: plugins[p] }, short(plugins[p])), ' '])));
  }
  return panel;
}

// ---------------------------------------------------------------------------------------------
// Plugins and the live registry events

function declaresSummary(d) {
  if (!d || typeof d !== 'object') return [];
  const out = [];
  for (const [k, v] of Object.entries(d)) {
    if (Array.isArray(v) && v.length) {
      out.push(h('div', { class: 'declares-line' }, h('span', { class: 'muted' }, `${k}: `),
        v.map((x) => (x && typeof x === 'object' && x.name ? h('code', {}, x.name) : null))));
    }
  }
  return out;
}

function pluginRow(p) {
  const stale = p.serving_sha256 && p.serving_sha256 !== p.sha256;
  return h('tr', { 'data-testid': 'plugin-row', 'data-plugin': p.id, class: `row-state-${p.state}` },
    h('td', {}, h('code', {}, p.id), h('div', { class: 'muted' }, p.file)),
    h('td', {}, badge(p.state, `state state-${p.state}`, { 'data-testid': 'plugin-state' })),
    h('td', { class: 'mono', title: p.sha256 }, short(p.sha256),
      stale ? h('div', { class: 'warn', title: p.serving_sha256 }, `serving ${short(p.serving_sha256)}`) : null),
    h('td', {}, p.last_error ? h('div', { class: 'error', 'data-testid': 'plugin-error' },
      h('code', {}, p.last_error.code), ' ', quoted(p.last_error.message)) : h('span', { class: 'muted' }, '—')),
    h('td', {}, declaresSummary(p.declares), p.declares ? jsonDetails('declaration', p.declares) : null));
}

async function pluginsView(page, current) {
  const body = h('tbody');
  const status = h('div');
  const live = h('ol', { id: 'registry-events', 'data-testid': 'registry-events', class: 'registry-events', reversed: true });
  const streamState = h('span', { id: 'stream-state', 'data-testid': 'stream-state', class: 'muted' }, 'connecting…');
  add(page,
    h('div', { class: 'title-row' }, h('h1', {}, 'Plugins')),
    status,
    h('table', { id: 'plugins-table', 'data-testid': 'plugins-table' },
      h('thead', {}, h('tr', {}, h('th', {}, 'Plugin'), h('th', {}, 'State'), h('th', {}, 'sha256'),
        h('th', {}, 'Last error'), h('th', {}, 'Declares'))),
      body),
    h('div', { class: 'title-row' }, h('h2', {}, 'Registry events'), streamState),
    h('p', { class: 'muted' }, 'Every load, reload, unload, refusal and quarantine since the daemon started (the last 1,024), then live.'),
    live);

  async function refresh() {
    try {
      const v = await api('/v1/plugins');
      status.replaceChildren();
      body.replaceChildren(...(v.plugins || []).map(pluginRow));
      if (!(v.plugins || []).length) body.append(h('tr', {}, h('td', { colspan: 5, class: 'muted' }, 'No plugin files.')));
    } catch (e) {
      status.replaceChildren(errorBox(e));
    }
  }
  await refresh();

  const controller = new AbortController();
  leaving = () => controller.abort();
  let since = 0;
  let refreshTimer = null;
  const onEvent = (name, data, id) => {
    if (name === 'lagged') {
      // Changes were lost: the list is read again, and the stream resumes after them.
      since += (data && data.missed) || 0;
      live.prepend(h('li', { class: 'warn' }, `${data && data.missed} events missed: plugins reloaded`));
      refresh();
      return;
    }
    if (id) since = Math.max(since, Number(id));
    live.prepend(h('li', { 'data-testid': 'registry-event', 'data-kind': name, 'data-seq': id || '' },
      h('span', { class: 'seq' }, `#${data.seq}`), badge(data.kind, `change change-${data.kind}`), ' ',
      h('code', {}, data.plugin), ' ', h('span', { class: 'muted' }, data.file), ' ',
      h('span', { class: 'mono', title: data.sha256 }, short(data.sha256)),
      data.error ? h('div', { class: 'error' }, h('code', {}, data.error.code), ' ', quoted(data.error.message)) : null));
    // A burst of changes reads the list once.
    clearTimeout(refreshTimer);
    refreshTimer = setTimeout(refresh, 150);
  };
  (async () => {
    while (!controller.signal.aborted && current()) {
      try {
        streamState.textContent = 'live';
        streamState.className = 'good-text';
        await streamSse(`/v1/events?since=${since}`, controller.signal, onEvent);
      } catch (e) {
        if (controller.signal.aborted) return;
        streamState.textContent = e instanceof HttpError ? `${e.status} ${e.code}` : 'disconnected';
        streamState.className = 'warn';
        if (e instanceof HttpError && e.status === 401) return; // the token form is open
      }
      if (controller.signal.aborted) return;
      streamState.textContent = 'reconnecting…';
      streamState.className = 'warn';
      await new Promise((r) => setTimeout(r, 1000));
    }
  })();
}

/** Reads a server-sent event stream with fetch (EventSource cannot send the token). */
async function streamSse(path, signal, onEvent) {
  const response = await fetch(path, { headers: authHeaders(), signal, cache: 'no-store' });
  if (!response.ok) {
    if (response.status === 401) askToken();
    throw new HttpError(response.status, 'http', await response.text());
  }
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += decoder.decode(value, { stream: true }).replace(/\r\n?/g, '\n');
    let end;
    while ((end = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, end);
      buf = buf.slice(end + 2);
      let name = 'message';
      let id = null;
      const data = [];
      for (const line of block.split('\n')) {
        if (line.startsWith(':')) continue; // keep-alive comment
        const colon = line.indexOf(':');
        const field = colon < 0 ? line : line.slice(0, colon);
        const val = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
        if (field === 'event') name = val;
        else if (field === 'data') data.push(val);
        else if (field === 'id') id = val;
      }
      if (!data.length) continue;
      let parsed;
      try { parsed = JSON.parse(data.join('\n')); } catch (_) { continue; }
      onEvent(name, parsed, id);
    }
  }
}

// ---------------------------------------------------------------------------------------------

window.addEventListener('hashchange', render);
window.addEventListener('DOMContentLoaded', () => {
  setupToken();
  showHealth();
  setInterval(showHealth, 10000);
  render();
});
