// Metrics: every step metric, in sections and groups by the key convention (no '/' -> General,
// 'a/b' -> section a, 'a/b/c' -> section a, group b), several runs overlaid, smoothing, x = step
// or time; y fixed to the declared range (reward_min/max, metrics_ranges) when there is one.
// The Overview section (reward, entropy, mismatch KL, grad norm, discards, step time,
// throughput) comes first; sections can be collapsed and pinned. The Custom view holds the
// user's own sections, kept on the server next to the runs (layouts.py).
import { api, COLORS, drawWhenVisible, empty, h, plot, runApi, setParams, smooth, titled } from '../common.js';

const CUSTOM_KEY = 'telescope.metrics.custom';
const PINNED_KEY = 'telescope.metrics.pinned';
const COLLAPSED_KEY = 'telescope.metrics.collapsed';
const OVERVIEW = 'Overview';
const MARKERS_UP_TO = 200;
// The Overview section, in this order: each entry's first alternative present, every key it matches
// (reward per environment, entropy, mismatch KL, grad norm, discards, step time, throughput).
const OVERVIEW_KEYS = [[/^reward\/mean$/], [/^reward\/[^/]+\/mean$/], [/^entropy$/], [/^kl_divergence_inference$/], [/^grad_norm$/],
  [/^discarded\/pct$/, /^discarded\/count$/], [/^perf\/step_time_s$/, /^timing_step_total$/], [/^perf\/tokens_per_s$/]];
let ctx = null;   // {runs, options, catalog: Map key -> item, series: {run: data}, charts: [{el, key}], zoom: Map key -> ranges}
const stored = (name, fallback) => { try { return JSON.parse(localStorage.getItem(name)) ?? fallback; } catch { return fallback; } };

// The Custom view's layout lives on the server next to the runs (layouts.py), so another host
// name, port or browser sees it. A layout left in this browser's localStorage by an earlier
// version is moved there once.
export async function loadCustom() {
  let data;
  try { data = await api('/api/layout'); } catch (err) {
    // a damaged layout file must not take the Metrics page down: the Custom view says what is wrong
    return { sections: [], exported: [], path: '', error: `layout not loaded: ${err.message}` };
  }
  let old = null;
  try { old = JSON.parse(localStorage.getItem(CUSTOM_KEY)); } catch { old = null; }
  if (!data.sections.length && Array.isArray(old) && old.length) {
    await sendLayout('PUT', '/api/layout', { sections: old });
    localStorage.removeItem(CUSTOM_KEY);
    return { ...data, sections: old };
  }
  return data;
}

async function sendLayout(method, path, body) {
  const response = await fetch(path, { method, headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
  const answer = await response.json();
  if (!response.ok) throw new Error(answer.error || response.statusText);
  return answer;
}

async function fetchData(runs) {
  const catalog = new Map();
  const series = {}, health = {};
  await Promise.all(runs.map(async run => {
    const [cat, data, about] = await Promise.all([runApi(run, 'catalog'), runApi(run, 'metrics', { keys: '*' }), runApi(run, 'config')]);
    for (const item of cat.keys) if (!catalog.has(item.key)) catalog.set(item.key, item);
    series[run] = data;
    health[run] = ((about.meta || {}).info || {}).health || null;
  }));
  return { catalog, series, health };
}

// The health sentinel's verdict of each run (run.json info.health, docs/health.md): its state and
// its latest findings, above the Overview charts. Runs without a sentinel show nothing.
const FINDINGS_SHOWN = 5;
function healthBox() {
  const rows = ctx.runs.filter(run => ctx.health[run]).map(run => {
    const { state = 'ok', count = 0, rollbacks = 0, findings = [] } = ctx.health[run];
    const head = `${run}: ${state}${count ? `, ${count} finding${count > 1 ? 's' : ''}` : ''}${rollbacks ? `, ${rollbacks} rollback${rollbacks > 1 ? 's' : ''}` : ''}`;
    return h('div', { class: `health-run ${state}`, 'data-run': run },
      h('div', { class: 'health-state' }, head),
      findings.slice(-FINDINGS_SHOWN).map(f => h('div', { class: 'finding' }, `step ${f.step} ${f.name} (${f.action}): ${f.evidence}`)));
  });
  return rows.length ? h('div', { id: 'health-findings' }, h('div', { class: 'group-title' }, 'Health'), rows) : null;
}

function traces(key) {
  const { smoothing, x } = ctx.options;
  const out = [];
  ctx.runs.forEach((run, i) => {
    const data = ctx.series[run];
    if (!data || !data.values[key]) return;
    const xs = x === 'time' ? data.time.map(t => t - (data.created_at || data.time[0] || 0)) : data.step;
    const color = COLORS[i % COLORS.length];
    if (smoothing > 0) out.push({ x: xs, y: data.values[key], name: `${run} raw`, mode: 'lines', line: { color, width: 1 }, opacity: 0.25, hoverinfo: 'skip' });
    // a marker per point helps on short runs; on long ones it only costs drawing time (SVG nodes)
    out.push({ x: xs, y: smooth(data.values[key], smoothing), name: run, mode: xs.length > MARKERS_UP_TO ? 'lines' : 'lines+markers',
               marker: { size: 3 }, line: { color, width: 1.5 } });
  });
  return out;
}

// A constant non-zero series (a fixed learning rate) on plotly's automatic [v-1, v+1] reads as
// zero: centre it on its value instead.
function constantRange(data) {
  const values = data.flatMap(t => t.y).filter(v => typeof v === 'number' && Number.isFinite(v));
  if (!values.length || values.some(v => v !== values[0]) || values[0] === 0) return null;
  const v = values[0];
  return [v - Math.abs(v) / 2, v + Math.abs(v) / 2];
}

function drawChart(el, key) {
  const item = ctx.catalog.get(key);
  const range = item && item.range;
  const pad = range ? (range[1] - range[0]) * 0.03 : 0;
  const data = traces(key);
  const flat = range ? null : constantRange(data);
  const zoom = ctx.zoom.get(key) || {};
  el._afterPlot = () => listen(el, key);
  const yaxis = zoom.y ? { range: zoom.y, autorange: false } : range ? { range: [range[0] - pad, range[1] + pad], autorange: false }
    : flat ? { range: flat, autorange: false } : { autorange: true };
  el._setY = yaxis.range;  // what the page chose: a different y range on the chart is the user's zoom
  return plot(el, data, {
    uirevision: key,  // a live run's new steps keep the user's zoom
    title: { text: titled(key) + (range ? `  [${range[0]}, ${range[1]}]` : ''), font: { size: 12 }, x: 0.02 },
    xaxis: { title: { text: ctx.options.x === 'time' ? 'seconds since the run started' : 'step' },
             ...(zoom.x ? { range: zoom.x, autorange: false } : {}) },
    yaxis,
  });
}

// A zoom is remembered per key, so a redraw (a new metric key joined the catalog) keeps it; and
// hovering a chart shows the same step in every other drawn chart (synced hover).
function listen(el, key) {
  if (el._listening || !el.on) return;
  el._listening = true;
  el.on('plotly_relayout', ev => {
    const zoom = { ...(ctx.zoom.get(key) || {}) };
    if (ev['xaxis.autorange']) delete zoom.x;
    if (ev['yaxis.autorange']) delete zoom.y;
    if ('xaxis.range[0]' in ev) zoom.x = [ev['xaxis.range[0]'], ev['xaxis.range[1]']];
    if ('yaxis.range[0]' in ev) zoom.y = [ev['yaxis.range[0]'], ev['yaxis.range[1]']];
    if (Array.isArray(ev['xaxis.range'])) zoom.x = ev['xaxis.range'];
    if (Array.isArray(ev['yaxis.range'])) zoom.y = ev['yaxis.range'];
    ctx.zoom.set(key, zoom);
  });
  el.on('plotly_hover', ev => syncHover(el, ev.xvals ? ev.xvals[0] : ev.points[0].x));
  el.on('plotly_unhover', () => syncHover(el, null));
}

// Before a redraw, the zoom each drawn chart shows (also one whose relayout event came before the
// page listened): kept per key, so the new charts open zoomed the same.
function rememberZoom() {
  for (const { el, key } of ctx.charts) {
    const layout = el._fullLayout && el.layout;
    if (!layout) continue;
    const zoom = { ...(ctx.zoom.get(key) || {}) };
    const { xaxis = {}, yaxis = {} } = layout;
    if (xaxis.autorange === false && Array.isArray(xaxis.range)) zoom.x = [...xaxis.range];
    if (yaxis.autorange === false && Array.isArray(yaxis.range) && JSON.stringify(yaxis.range) !== JSON.stringify(el._setY)) zoom.y = [...yaxis.range];
    ctx.zoom.set(key, zoom);
  }
}

let syncing = false;
function syncHover(source, x) {
  if (syncing) return;
  syncing = true;
  try {
    for (const { el } of ctx.charts) {
      if (el === source || !el._fullLayout || !el.isConnected) continue;
      if (x === null) Plotly.Fx.unhover(el);
      else Plotly.Fx.hover(el, { xval: x }, 'xy');
    }
  } finally { syncing = false; }
}

function chart(key) {
  const item = ctx.catalog.get(key) || {};
  // the registry's sentence (metric_docs.py) is the chart's tooltip
  const el = h('div', { class: 'chart', 'data-key': key, title: item.description ? `${key}: ${item.description}` : key });
  ctx.charts.push({ el, key });
  drawWhenVisible(el, () => drawChart(el, key));
  return el;
}

function overviewKeys(keys) {
  return OVERVIEW_KEYS.flatMap(alternatives => {
    for (const re of alternatives) {
      const found = keys.filter(k => re.test(k)).sort();
      if (found.length) return found;
    }
    return [];
  });
}

// A section: collapsible (remembered), pinnable (pinned ones come first, after the Overview).
function section(name, count, body) {
  const collapsed = stored(COLLAPSED_KEY, []), pinned = stored(PINNED_KEY, []);
  const isPinned = pinned.includes(name);
  const pin = h('button', { class: `pin${isPinned ? ' on' : ''}`, title: isPinned ? 'unpin' : 'pin to the top',
    onclick: e => { e.preventDefault(); localStorage.setItem(PINNED_KEY, JSON.stringify(isPinned ? pinned.filter(n => n !== name) : [...pinned, name])); draw(); } }, isPinned ? '📌 pinned' : 'pin');
  const el = h('details', { class: 'section', open: !collapsed.includes(name), 'data-section': name, 'data-pinned': isPinned ? '1' : null },
    h('summary', {}, `${name} (${count})`, name === OVERVIEW ? null : pin), body);
  el.addEventListener('toggle', () => {
    const now = stored(COLLAPSED_KEY, []).filter(n => n !== name);
    localStorage.setItem(COLLAPSED_KEY, JSON.stringify(el.open ? now : [...now, name]));
  });
  return el;
}

function visibleKeys(filter) {
  return [...ctx.catalog.keys()].filter(k => !filter || k.toLowerCase().includes(filter));
}

function sectionsView(filter) {
  const bySection = new Map();
  for (const key of visibleKeys(filter)) {
    const item = ctx.catalog.get(key);
    if (!bySection.has(item.section)) bySection.set(item.section, new Map());
    const groups = bySection.get(item.section);
    if (!groups.has(item.group)) groups.set(item.group, []);
    groups.get(item.group).push(item.key);
  }
  const pinned = stored(PINNED_KEY, []);
  const rank = name => (pinned.includes(name) ? 0 : name === 'General' ? 1 : 2);
  const names = [...bySection.keys()].sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
  if (!names.length) return empty(filter ? `No metric key contains "${filter}".` : 'No step metrics yet.');
  const overview = overviewKeys(visibleKeys(filter));
  return [healthBox(), overview.length ? section(OVERVIEW, overview.length, h('div', { class: 'grid' }, overview.map(chart))) : null,
    names.map(name => {
      const groups = bySection.get(name);
      const groupNames = [...groups.keys()].sort();
      return section(name, [...groups.values()].reduce((n, g) => n + g.length, 0),
        groupNames.map(g => h('div', {},
          g ? h('div', { class: 'group-title' }, g) : null,
          h('div', { class: 'grid' }, groups.get(g).sort().map(chart)))));
    })];
}

// Drag and drop (the HTML5 API): a section by its handle onto another section, a metric chip
// onto another chip (before it) or onto a section (at its end).
function dragStart(e, what) {
  e.stopPropagation();
  e.dataTransfer.setData('text/plain', JSON.stringify(what));
  e.dataTransfer.effectAllowed = 'move';
}

function dropTarget(el, onDrop) {
  el.addEventListener('dragover', e => { e.preventDefault(); el.classList.add('drag-over'); });
  el.addEventListener('dragleave', () => el.classList.remove('drag-over'));
  el.addEventListener('drop', e => {
    e.preventDefault(); e.stopPropagation(); el.classList.remove('drag-over');
    try { onDrop(JSON.parse(e.dataTransfer.getData('text/plain'))); } catch { /* not ours */ }
  });
  return el;
}

export function moveSection(sections, from, to) {
  const [moved] = sections.splice(from, 1);
  sections.splice(to, 0, moved);
}

export function moveKey(sections, from, to) {
  const [fs, fk] = from, [ts, tk] = to;
  const [key] = sections[fs].keys.splice(fk, 1);
  const target = sections[ts].keys.filter(k => k !== key);
  const at = tk === null ? target.length : Math.min(fs === ts && fk < tk ? tk - 1 : tk, target.length);
  target.splice(at, 0, key);
  sections[ts].keys = target;
}

function customView() {
  const sections = ctx.layout.sections;
  const keys = [...ctx.catalog.keys()].sort();
  const save = async () => {
    try { ctx.layout = { ...ctx.layout, ...(await sendLayout('PUT', '/api/layout', { sections })) }; ctx.layoutError = ''; }
    catch (err) { ctx.layoutError = `layout not saved: ${err.message}`; }
    draw();
  };
  const datalist = h('datalist', { id: 'metric-catalog' }, keys.map(k => h('option', { value: k })));
  const blocks = sections.map((section, i) => {
    const input = h('input', { list: 'metric-catalog', placeholder: 'search the metric catalog…', size: 40 });
    input.addEventListener('change', () => { if (ctx.catalog.has(input.value) && !section.keys.includes(input.value)) { section.keys.push(input.value); save(); } });
    const handle = h('span', { class: 'drag-handle', draggable: 'true', title: 'drag to reorder sections' }, '⠿');
    handle.addEventListener('dragstart', e => dragStart(e, { section: i }));
    const chips = section.keys.map((k, j) => {
      const chip = h('span', { class: 'chip', draggable: 'true', 'data-key': k, title: 'drag to reorder (or onto another section)' }, k,
        h('button', { onclick: () => { section.keys.splice(j, 1); save(); }, title: 'remove' }, '×'));
      chip.addEventListener('dragstart', e => dragStart(e, { section: i, key: j }));
      return dropTarget(chip, what => { if (what.key !== undefined) { moveKey(sections, [what.section, what.key], [i, j]); save(); } });
    });
    const block = h('div', { class: 'custom-section', 'data-section': section.name },
      h('div', { class: 'controls' }, handle, h('strong', {}, section.name),
        h('button', { onclick: () => { sections.splice(i, 1); save(); } }, 'remove section'), input),
      h('div', { class: 'chips' }, chips),
      h('div', { class: 'grid' }, section.keys.filter(k => ctx.catalog.has(k)).map(chart)));
    return dropTarget(block, what => {
      if (what.key !== undefined) moveKey(sections, [what.section, what.key], [i, null]);
      else if (what.section !== i) moveSection(sections, what.section, i);
      else return;
      save();
    });
  });
  const name = h('input', { placeholder: 'new section name', id: 'new-section' });
  return [datalist, ctx.layoutError ? h('p', { class: 'error', id: 'layout-error' }, ctx.layoutError) : null,
    h('p', { class: 'muted' }, `Saved on the server in ${ctx.layout.path} (any browser, host name or port serving these runs sees it). Drag ⠿ to reorder sections, drag a metric onto another metric or section.`),
    blocks.length ? blocks : empty('No custom sections yet: add one, then add metrics from the catalog.'),
    h('div', { class: 'controls' }, name, h('button', { id: 'add-section', onclick: () => {
      sections.push({ name: name.value || `Section ${sections.length + 1}`, keys: [] }); save(); } }, 'Add section')),
    exportControls(sections)];
}

// Export the layout under a name (a file next to the runs) or as a download; import either back.
function exportControls(sections) {
  const name = h('input', { id: 'export-name', placeholder: 'name', size: 14 });
  const pick = h('select', { id: 'import-name' }, (ctx.layout.exported || []).map(n => h('option', { value: n }, n)));
  const act = async (path, body) => {
    try { ctx.layout = { ...ctx.layout, ...(await sendLayout('POST', path, body)) }; ctx.layoutError = ''; }
    catch (err) { ctx.layoutError = err.message; }
    draw();
  };
  const file = h('input', { type: 'file', accept: 'application/json', id: 'import-file', onchange: async e => {
    try {
      const parsed = JSON.parse(await e.target.files[0].text());
      ctx.layout = { ...ctx.layout, ...(await sendLayout('PUT', '/api/layout', { sections: parsed.sections || parsed })) };
      ctx.layoutError = '';
    } catch (err) { ctx.layoutError = `layout not imported: ${err.message}`; }
    draw();
  } });
  const blob = URL.createObjectURL(new Blob([JSON.stringify({ sections }, null, 2)], { type: 'application/json' }));
  return h('div', { class: 'controls', id: 'layout-io' },
    h('label', {}, 'export as', name), h('button', { id: 'export-layout', onclick: () => act('/api/layout/export', { name: name.value }) }, 'export'),
    h('label', {}, 'import', pick), h('button', { id: 'import-layout', onclick: () => act('/api/layout/import', { name: pick.value }) }, 'import'),
    h('a', { href: blob, download: 'telescope-layout.json', id: 'download-layout' }, 'download JSON'),
    h('label', {}, 'upload JSON', file));
}

function controls() {
  const o = ctx.options;
  const update = patch => {
    // a zoom in steps means nothing in seconds: a new x axis starts unzoomed
    if (patch.x && patch.x !== o.x) { ctx.charts = []; ctx.zoom.clear(); }
    Object.assign(o, patch); setParams({ view: o.view, smooth: o.smoothing || '', x: o.x, q: o.filter }); draw();
  };
  return h('div', { class: 'controls' },
    h('label', {}, 'view', h('select', { id: 'view', onchange: e => update({ view: e.target.value }) },
      ['sections', 'custom'].map(v => h('option', { value: v, selected: v === o.view }, v)))),
    h('label', {}, 'smoothing', h('input', { type: 'range', min: 0, max: 0.99, step: 0.01, value: o.smoothing, id: 'smoothing',
      onchange: e => update({ smoothing: Number(e.target.value) }) })),
    h('label', {}, 'x axis', h('select', { id: 'x-axis', onchange: e => update({ x: e.target.value }) },
      ['step', 'time'].map(v => h('option', { value: v, selected: v === o.x }, v)))),
    h('label', {}, 'filter', h('input', { id: 'metric-filter', value: o.filter, placeholder: 'key contains…',
      onchange: e => update({ filter: e.target.value.toLowerCase() }) })),
    h('span', { class: 'muted', id: 'metric-count' }, o.filter ? `${visibleKeys(o.filter).length} of ${ctx.catalog.size} metrics` : `${ctx.catalog.size} metrics`),
    // the legend: one colour per run, the same in every chart
    ctx.runs.map((run, i) => h('span', { class: 'chip', style: `color:${COLORS[i % COLORS.length]}` }, `━ ${run}`)));
}

function draw() {
  rememberZoom();
  ctx.charts = [];
  const scroll = window.scrollY;
  ctx.root.replaceChildren(controls(), ...[ctx.options.view === "custom" ? customView() : sectionsView(ctx.options.filter)].flat(Infinity));
  window.scrollTo(0, scroll);  // a redraw (a new key) leaves the reader where they were
}

export async function render(main, { params, selected }) {
  if (!selected.length) { main.append(empty('No runs found.')); return; }
  ctx = { runs: selected, root: h('div', { id: 'metrics' }), charts: [], zoom: new Map(),
          options: { view: params.view || 'sections', smoothing: Number(params.smooth || 0), x: params.x || 'step', filter: params.q || '' } };
  main.append(ctx.root);
  const [data, layout] = await Promise.all([fetchData(selected), loadCustom()]);
  Object.assign(ctx, data, { layout, layoutError: layout.error || '' });
  performance.mark('metrics-data');
  draw();
}

export async function refresh({ changed }) {
  if (!ctx || !changed(['metrics'])) return;
  const before = ctx.catalog.size;
  Object.assign(ctx, await fetchData(ctx.runs));
  if (ctx.catalog.size !== before) { draw(); return; }
  for (const { el, key } of ctx.charts) if (el.dataset.drawn) drawChart(el, key);
}
