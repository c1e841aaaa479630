// promptd inspector: the usage page (`#/usage`), loaded before app.js, whose helpers (`h`,
// `add`, `api`, `route`, `notice`, `percent`) it calls when the page renders. Like app.js, it
// puts the daemon's data into the page as text and attributes only.
'use strict';

// Usage (`GET /v1/usage` with a window): every number on this page is one the API answered;
// the charts are SVG drawn here, nothing is fetched from elsewhere.

// The SVG namespace, read from the empty <svg> in index.html (the HTML parser puts it there):
// the page names no URL, not even a namespace's.
function svgNamespace() {
  return document.getElementById('svg-namespace').namespaceURI;
}
const USAGE_WINDOWS = [7, 14, 30, 90];
// One colour per series (agent or key), in the order the series are listed; the last repeats.
const SERIES_COLOURS = ['#2456a6', '#d98c3a', '#1f7a3a', '#8e3b9e', '#a3320b', '#3a8fa0', '#7a7a2a', '#6b6f76'];

/** An SVG element, attributes set one by one. */
function svg(tag, attrs, ...children) {
  const el = document.createElementNS(svgNamespace(), tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v != null) el.setAttribute(k, String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c == null || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

/** A spend axis label: cents above a cent, four decimals below. */
function axisUsd(v) {
  return v === 0 ? '$0' : `$${v.toFixed(v < 0.01 ? 4 : 2)}`;
}

function usd(x) {
  return x == null ? '' : `$${Number(x).toFixed(4)}`;
}

function tokens(n) {
  return n == null ? '' : Number(n).toLocaleString('en-US');
}

/** A number cell: the API's value in `data-value`, shown formatted. */
function numCell(value, shown, testid) {
  return h('td', { class: 'num', 'data-testid': testid, 'data-value': value == null ? null : String(value) }, shown);
}

/** The chart's y-axis step: 1, 2 or 5 times a power of ten, about four steps to `max`. */
function niceStep(max) {
  if (!(max > 0)) return 1;
  const raw = max / 4;
  const p = 10 ** Math.floor(Math.log10(raw));
  for (const m of [1, 2, 5, 10]) if (m * p >= raw) return m * p;
  return 10 * p;
}

/** Stacked bars, one per day: `series` names, `value(day, name)` each day's part. */
function stackedBars(days, series, value, { testid, label, format }) {
  const W = 760, H = 220, left = 64, right = 12, top = 12, bottom = 34;
  const totals = days.map((d) => series.reduce((t, s) => t + (value(d, s) || 0), 0));
  const step = niceStep(Math.max(...totals, 0));
  const max = step * Math.max(1, Math.ceil(Math.max(...totals, 0) / step));
  const y = (v) => top + (H - top - bottom) * (1 - v / max);
  const slot = (W - left - right) / Math.max(1, days.length);
  const chart = svg('svg', { viewBox: `0 0 ${W} ${H}`, class: 'chart', role: 'img', 'aria-label': label, 'data-testid': testid });
  for (let v = 0; v <= max + step / 2; v += step) {
    chart.append(svg('line', { x1: left, x2: W - right, y1: y(v), y2: y(v), class: 'grid' }),
      svg('text', { x: left - 6, y: y(v) + 4, 'text-anchor': 'end', class: 'axis' }, format(v)));
  }
  const every = Math.ceil(days.length / 14); // at most ~14 day labels
  days.forEach((d, i) => {
    const x = left + i * slot + slot * 0.15;
    const w = slot * 0.7;
    let base = 0;
    series.forEach((s, k) => {
      const v = value(d, s);
      if (!v) return;
      const name = s == null ? '(no key)' : s;
      chart.append(svg('rect', {
        x, width: w, y: y(base + v), height: Math.max(0.5, y(base) - y(base + v)),
        fill: SERIES_COLOURS[Math.min(k, SERIES_COLOURS.length - 1)],
        'data-testid': 'bar', 'data-day': d.day, 'data-series': name, 'data-value': String(v),
      }, svg('title', {}, `${d.day} · ${name}: ${format(v)}`)));
      base += v;
    });
    if (i % every === 0) {
      chart.append(svg('text', { x: x + w / 2, y: H - bottom + 16, 'text-anchor': 'middle', class: 'axis' }, d.day.slice(5)));
    }
  });
  const legend = h('ul', { class: 'legend' }, series.map((s, k) => h('li', {},
    h('span', { class: `swatch swatch-${Math.min(k, SERIES_COLOURS.length - 1)}` }), s == null ? '(no key)' : s)));
  return h('div', { class: 'chart-box' }, chart, legend);
}

/** The share read from cache per day, as points joined by a line (a day without input: none). */
function shareLine(days) {
  const W = 760, H = 180, left = 64, right = 12, top = 12, bottom = 34;
  const y = (v) => top + (H - top - bottom) * (1 - v);
  const slot = (W - left - right) / Math.max(1, days.length);
  const chart = svg('svg', { viewBox: `0 0 ${W} ${H}`, class: 'chart', role: 'img',
    'aria-label': 'Share of input read from cache per day', 'data-testid': 'share-chart' });
  for (const v of [0, 0.25, 0.5, 0.75, 1]) {
    chart.append(svg('line', { x1: left, x2: W - right, y1: y(v), y2: y(v), class: 'grid' }),
      svg('text', { x: left - 6, y: y(v) + 4, 'text-anchor': 'end', class: 'axis' }, `${v * 100}%`));
  }
  const points = [];
  const every = Math.ceil(days.length / 14);
  days.forEach((d, i) => {
    const x = left + i * slot + slot / 2;
    if (d.cached_share != null) points.push([x, y(d.cached_share), d]);
    if (i % every === 0) {
      chart.append(svg('text', { x, y: H - bottom + 16, 'text-anchor': 'middle', class: 'axis' }, d.day.slice(5)));
    }
  });
  if (points.length > 1) {
    chart.append(svg('polyline', { points: points.map(([x, yy]) => `${x},${yy}`).join(' '), class: 'share-line' }));
  }
  for (const [x, yy, d] of points) {
    chart.append(svg('circle', { cx: x, cy: yy, r: 4, class: 'share-point', 'data-testid': 'share-point',
      'data-day': d.day, 'data-value': String(d.cached_share) },
    svg('title', {}, `${d.day}: ${percent(d.cached_share)} of ${tokens(d.input_tokens)} input tokens read from cache`)));
  }
  return h('div', { class: 'chart-box' }, chart);
}

/** A table of totals by name (cause or plugin), with a bar for each one's share of the cost. */
function missTable(entries, what, testid) {
  const worst = Math.max(0, ...entries.map(([, t]) => t.miss_cost));
  const body = h('tbody', {}, entries.map(([name, t]) => {
    const bar = h('span', { class: 'miss-bar' });
    bar.style.width = `${worst > 0 ? (100 * t.miss_cost) / worst : 0}%`;
    return h('tr', { 'data-testid': `${testid}-row`, 'data-name': name },
      h('td', {}, h('code', {}, name)),
      numCell(t.replies, tokens(t.replies), 'replies'),
      numCell(t.lost_tokens, tokens(t.lost_tokens), 'lost'),
      numCell(t.miss_cost, usd(t.miss_cost), 'miss-cost'),
      h('td', { class: 'bar-cell' }, bar));
  }));
  if (!entries.length) body.append(h('tr', {}, h('td', { colspan: 5, class: 'muted' }, `No misses ${what}.`)));
  return h('table', { 'data-testid': testid },
    h('thead', {}, h('tr', {}, h('th', {}, what === 'by plugin' ? 'Plugin' : 'Cause'),
      h('th', { class: 'num' }, 'Replies'), h('th', { class: 'num' }, 'Tokens lost'),
      h('th', { class: 'num' }, 'Miss cost'), h('th', {}, ''))),
    body);
}

async function usageView(page, query) {
  const days = Number(query.get('days')) || 14;
  const agent = query.get('agent') || '';
  const key = query.get('key') || '';
  const params = new URLSearchParams({ days: String(days), top: '10' });
  if (agent) params.set('agent', agent);
  if (key) params.set('key', key);
  const u = await api(`/v1/usage?${params}`);

  const goto = (changes) => {
    const next = new URLSearchParams({ days: String(days) });
    if (agent) next.set('agent', agent);
    if (key) next.set('key', key);
    for (const [k, v] of Object.entries(changes)) {
      if (v) next.set(k, v); else next.delete(k);
    }
    location.hash = `#/usage?${next}`;
  };
  const windowPick = h('select', { id: 'usage-days', 'data-testid': 'usage-days' },
    [...new Set([...USAGE_WINDOWS, days])].sort((a, b) => a - b).map((n) =>
      h('option', { value: n, selected: n === days }, `last ${n} days`)));
  windowPick.addEventListener('change', () => goto({ days: windowPick.value }));
  const agents = Object.keys(u.agents || {});
  const agentPick = h('select', { id: 'usage-agent', 'data-testid': 'usage-agent' },
    h('option', { value: '' }, 'every agent'),
    [...new Set([...agents, agent].filter(Boolean))].map((a) => h('option', { value: a, selected: a === agent }, a)));
  agentPick.addEventListener('change', () => goto({ agent: agentPick.value }));
  const keyNames = (u.keys || []).map((k) => k.key).filter((k) => k != null);
  const keyPick = h('select', { id: 'usage-key', 'data-testid': 'usage-key' },
    h('option', { value: '' }, 'every key'),
    [...new Set([...keyNames, key].filter(Boolean))].map((k) => h('option', { value: k, selected: k === key }, k)));
  keyPick.addEventListener('change', () => goto({ key: keyPick.value }));

  const total = u.total || {};
  const tile = (label, value, shown, testid) => h('div', { class: 'tile' },
    h('div', { class: 'tile-label' }, label),
    h('div', { class: 'tile-value', 'data-testid': testid, 'data-value': value == null ? null : String(value) }, shown));
  const cost = total.cost ? total.cost.total : null;
  const miss = total.cost ? total.cost.miss : null;
  const tiles = h('div', { class: 'tiles' },
    tile('Spend', cost, cost == null ? 'unpriced' : usd(cost), 'usage-cost'),
    tile('Replies', total.replies, tokens(total.replies), 'usage-replies'),
    tile('Read from cache', total.cached_share, total.cached_share == null ? '–' : percent(total.cached_share), 'usage-cached-share'),
    tile('Misses added', miss, miss == null ? '–' : usd(miss), 'usage-miss-cost'));

  const list = u.days || [];
  const agentNames = [...new Set(list.flatMap((d) => Object.keys(d.by_agent || {})))].sort();
  const keyList = [...new Set(list.flatMap((d) => (d.by_key || []).map((k) => k.key)))]
    .sort((a, b) => (a == null ? -1 : b == null ? 1 : a < b ? -1 : a > b ? 1 : 0));
  const keySpend = (d, k) => {
    const e = (d.by_key || []).find((x) => x.key === k);
    return e ? e.cost : 0;
  };

  // The numbers behind the spend chart, day by day.
  const dayRows = h('tbody', {}, list.slice().reverse().map((d) => h('tr', { 'data-testid': 'usage-day', 'data-day': d.day },
    h('td', { class: 'mono' }, d.day),
    numCell(d.replies, tokens(d.replies), 'replies'),
    numCell(d.input_tokens, tokens(d.input_tokens), 'input'),
    numCell(d.cached_share, d.cached_share == null ? '–' : percent(d.cached_share), 'cached-share'),
    numCell(d.cost ? d.cost.total : 0, usd(d.cost ? d.cost.total : 0), 'cost'),
    agentNames.map((a) => numCell(d.by_agent[a] ? d.by_agent[a].cost : 0,
      usd(d.by_agent[a] ? d.by_agent[a].cost : 0), `agent-cost:${a}`)))));
  const dayTable = h('table', { 'data-testid': 'usage-days-table' },
    h('thead', {}, h('tr', {}, h('th', {}, 'Day (UTC)'), h('th', { class: 'num' }, 'Replies'),
      h('th', { class: 'num' }, 'Input tokens'), h('th', { class: 'num' }, 'From cache'),
      h('th', { class: 'num' }, 'Spend'), agentNames.map((a) => h('th', { class: 'num' }, a)))),
    dayRows);

  const keyTable = h('table', { 'data-testid': 'usage-keys' },
    h('thead', {}, h('tr', {}, h('th', {}, 'Gateway key'), h('th', { class: 'num' }, 'Replies'),
      h('th', { class: 'num' }, 'Input tokens'), h('th', { class: 'num' }, 'Spend'), h('th', { class: 'num' }, 'Miss cost'))),
    h('tbody', {}, (u.keys || []).map((k) => h('tr', { 'data-testid': 'usage-key-row', 'data-key': k.key == null ? '' : k.key },
      h('td', {}, k.key == null ? h('span', { class: 'muted' }, '(no key)') : h('code', {}, k.key)),
      numCell(k.replies, tokens(k.replies), 'replies'),
      numCell(k.input_tokens, tokens(k.input_tokens), 'input'),
      numCell(k.cost, usd(k.cost), 'cost'),
      numCell(k.miss_cost, usd(k.miss_cost), 'miss-cost')))));

  const misses = Object.entries(total.outcomes || {}).filter(([kind]) => !['hit', 'cold', 'uncacheable'].includes(kind));
  const plugins = Object.entries(total.plugins || {});

  const top = h('table', { 'data-testid': 'usage-top' },
    h('thead', {}, h('tr', {}, h('th', {}, 'Session'), h('th', {}, 'Agent'), h('th', { class: 'num' }, 'Replies'),
      h('th', { class: 'num' }, 'Spend'), h('th', { class: 'num' }, 'Miss cost'), h('th', {}, 'Costliest step'))),
    h('tbody', {}, (u.top_sessions || []).map((s) => h('tr', { 'data-testid': 'usage-top-row', 'data-session-id': s.session },
      h('td', { class: 'mono' }, h('a', { href: route('session', s.session), 'data-testid': 'usage-session-link' }, s.session)),
      h('td', {}, s.agent),
      numCell(s.replies, tokens(s.replies), 'replies'),
      numCell(s.cost, usd(s.cost), 'cost'),
      numCell(s.miss_cost, usd(s.miss_cost), 'miss-cost'),
      h('td', {}, h('a', { href: route('session', s.session, 'step', s.top_step), 'data-testid': 'usage-step-link',
        'data-step': s.top_step, 'data-value': String(s.top_step_cost) }, `step ${s.top_step}`, ' · ', usd(s.top_step_cost)))))));

  const windowText = u.window ? `${u.window.from} to ${u.window.to} (UTC)` : '';
  let unpriced = null;
  if ((total.unpriced_models || []).length) {
    unpriced = notice(`No price for ${total.unpriced_models.map((m) => `\`${m}\``).join(', ')}: their replies count tokens but no cost (\`[pricing]\`).`, 'warn');
    unpriced.setAttribute('data-testid', 'usage-unpriced');
  }
  add(page,
    h('div', { class: 'title-row' }, h('h1', {}, 'Usage'),
      h('span', { class: 'muted', 'data-testid': 'usage-window' }, windowText)),
    h('div', { class: 'toolbar' }, windowPick, agentPick, keyPick,
      h('span', { class: 'muted' }, `${u.sessions} sessions read`)),
    unpriced, tiles,
    h('div', { class: 'panel' }, h('h2', {}, 'Spend per day, by agent'),
      stackedBars(list, agentNames, (d, a) => (d.by_agent[a] ? d.by_agent[a].cost : 0),
        { testid: 'spend-by-agent', label: 'Spend per day by agent', format: axisUsd })),
    h('div', { class: 'panel' }, h('h2', {}, 'Spend per day, by gateway key'),
      stackedBars(list, keyList, keySpend,
        { testid: 'spend-by-key', label: 'Spend per day by gateway key', format: axisUsd })),
    h('div', { class: 'panel' }, h('h2', {}, 'Share of input read from cache'), shareLine(list)),
    h('div', { class: 'panel two-col' },
      h('div', {}, h('h2', {}, 'Misses by cause'), missTable(misses, 'by cause', 'usage-causes')),
      h('div', {}, h('h2', {}, 'Misses by plugin'), missTable(plugins, 'by plugin', 'usage-plugins'))),
    h('div', { class: 'panel' }, h('h2', {}, 'Most expensive sessions'), top),
    h('div', { class: 'panel' }, h('h2', {}, 'By gateway key'), keyTable),
    h('div', { class: 'panel' }, h('h2', {}, 'Day by day'), dayTable));
}
