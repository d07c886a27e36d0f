// Metrics: every step metric, in sections and groups by the key convention (no '/' -> General,
// 'a/b' -> section a, 'a/b/c' -> section a, group b), several runs overlaid, smoothing, x = step
// or time; y fixed to the declared range (reward_min/max, metrics_ranges) when there is one.
// The Custom view holds the user's own sections, kept in localStorage.
import { COLORS, drawWhenVisible, empty, h, plot, runApi, setParams, smooth, titled } from '../common.js';

const CUSTOM_KEY = 'telescope.metrics.custom';
const MARKERS_UP_TO = 200;
let ctx = null;   // {runs, options, catalog: Map key -> item, series: {run: data}, charts: [{el, key}]}

export function loadCustom() {
  try { return JSON.parse(localStorage.getItem(CUSTOM_KEY)) || []; } catch { return []; }
}
function saveCustom(sections) { localStorage.setItem(CUSTOM_KEY, JSON.stringify(sections)); }

async function fetchData(runs) {
  const catalog = new Map();
  const series = {};
  await Promise.all(runs.map(async run => {
    const [cat, data] = await Promise.all([runApi(run, 'catalog'), runApi(run, 'metrics', { keys: '*' })]);
    for (const item of cat.keys) if (!catalog.has(item.key)) catalog.set(item.key, item);
    series[run] = data;
  }));
  return { catalog, series };
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
  return plot(el, data, {
    uirevision: key,  // a live run's new steps keep the user's zoom
    title: { text: titled(key) + (range ? `  [${range[0]}, ${range[1]}]` : ''), font: { size: 12 }, x: 0.02 },
    xaxis: { title: { text: ctx.options.x === 'time' ? 'seconds since the run started' : 'step' } },
    yaxis: range ? { range: [range[0] - pad, range[1] + pad], autorange: false }
      : flat ? { range: flat, autorange: false } : { autorange: true },
  });
}

function chart(key) {
  const el = h('div', { class: 'chart', 'data-key': key });
  ctx.charts.push({ el, key });
  drawWhenVisible(el, () => drawChart(el, key));
  return el;
}

function sectionsView(filter) {
  const bySection = new Map();
  for (const item of ctx.catalog.values()) {
    if (filter && !item.key.toLowerCase().includes(filter)) continue;
    if (!bySection.has(item.section)) bySection.set(item.section, new Map());
    const groups = bySection.get(item.section);
    if (!groups.has(item.group)) groups.set(item.group, []);
    groups.get(item.group).push(item.key);
  }
  const names = [...bySection.keys()].sort((a, b) => (a === 'General' ? -1 : b === 'General' ? 1 : a.localeCompare(b)));
  if (!names.length) return empty('No step metrics yet.');
  return names.map(section => {
    const groups = bySection.get(section);
    const groupNames = [...groups.keys()].sort();
    return h('details', { class: 'section', open: true, 'data-section': section },
      h('summary', {}, `${section} (${[...groups.values()].reduce((n, g) => n + g.length, 0)})`),
      groupNames.map(g => h('div', {},
        g ? h('div', { class: 'group-title' }, g) : null,
        h('div', { class: 'grid' }, groups.get(g).sort().map(chart)))));
  });
}

function customView() {
  const sections = loadCustom();
  const keys = [...ctx.catalog.keys()].sort();
  const redraw = () => { saveCustom(sections); draw(); };
  const datalist = h('datalist', { id: 'metric-catalog' }, keys.map(k => h('option', { value: k })));
  const move = (list, i, d) => { const j = i + d; if (j < 0 || j >= list.length) return; [list[i], list[j]] = [list[j], list[i]]; redraw(); };
  const blocks = sections.map((section, i) => {
    const input = h('input', { list: 'metric-catalog', placeholder: 'search the metric catalog…', size: 40 });
    const add = () => { if (ctx.catalog.has(input.value) && !section.keys.includes(input.value)) { section.keys.push(input.value); redraw(); } };
    input.addEventListener('change', add);
    return h('div', { class: 'custom-section' },
      h('div', { class: 'controls' }, h('strong', {}, section.name),
        h('button', { onclick: () => move(sections, i, -1), title: 'move up' }, '↑'),
        h('button', { onclick: () => move(sections, i, 1), title: 'move down' }, '↓'),
        h('button', { onclick: () => { sections.splice(i, 1); redraw(); } }, 'remove section'), input),
      h('div', {}, section.keys.map((k, j) => h('span', { class: 'chip' }, k,
        h('button', { onclick: () => move(section.keys, j, -1), title: 'earlier' }, '←'),
        h('button', { onclick: () => move(section.keys, j, 1), title: 'later' }, '→'),
        h('button', { onclick: () => { section.keys.splice(j, 1); redraw(); } }, '×')))),
      h('div', { class: 'grid' }, section.keys.filter(k => ctx.catalog.has(k)).map(chart)));
  });
  const name = h('input', { placeholder: 'new section name', id: 'new-section' });
  return [datalist, blocks.length ? blocks : empty('No custom sections yet: add one, then add metrics from the catalog.'),
    h('div', { class: 'controls' }, name, h('button', { id: 'add-section', onclick: () => {
      sections.push({ name: name.value || `Section ${sections.length + 1}`, keys: [] }); redraw(); } }, 'Add section'))];
}

function controls() {
  const o = ctx.options;
  const update = patch => { Object.assign(o, patch); setParams({ view: o.view, smooth: o.smoothing || '', x: o.x, q: o.filter }); draw(); };
  return h('div', { class: 'controls' },
    h('label', {}, 'view', h('select', { id: 'view', onchange: e => update({ view: e.target.value }) },
      ['sections', 'custom'].map(v => h('option', { value: v, selected: v === o.view }, v)))),
    h('label', {}, 'smoothing', h('input', { type: 'range', min: 0, max: 0.99, step: 0.01, value: o.smoothing, id: 'smoothing',
      onchange: e => update({ smoothing: Number(e.target.value) }) })),
    h('label', {}, 'x axis', h('select', { id: 'x-axis', onchange: e => update({ x: e.target.value }) },
      ['step', 'time'].map(v => h('option', { value: v, selected: v === o.x }, v)))),
    h('label', {}, 'filter', h('input', { id: 'metric-filter', value: o.filter, placeholder: 'key contains…',
      onchange: e => update({ filter: e.target.value.toLowerCase() }) })),
    h('span', { class: 'muted' }, `${ctx.catalog.size} metrics`),
    // the legend: one colour per run, the same in every chart
    ctx.runs.map((run, i) => h('span', { class: 'chip', style: `color:${COLORS[i % COLORS.length]}` }, `━ ${run}`)));
}

function draw() {
  ctx.charts = [];
  ctx.root.replaceChildren(controls(), ...[ctx.options.view === "custom" ? customView() : sectionsView(ctx.options.filter)].flat(Infinity));
}

export async function render(main, { params, selected }) {
  if (!selected.length) { main.append(empty('No runs found.')); return; }
  ctx = { runs: selected, root: h('div', { id: 'metrics' }), charts: [],
          options: { view: params.view || 'sections', smoothing: Number(params.smooth || 0), x: params.x || 'step', filter: params.q || '' } };
  main.append(ctx.root);
  Object.assign(ctx, await fetchData(selected));
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
