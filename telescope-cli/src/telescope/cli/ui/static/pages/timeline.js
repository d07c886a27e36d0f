// Timeline: a Gantt chart of one or several steps. Rows: the trainer (train_step spans), its
// phases (from the timing_* metrics, drawn inside the step), weight syncs, evals, checkpoints,
// then one row per inference server lane with each sample's generation and reward spans.
// Zoom with the mouse (drag a box, double-click to reset).
import { COLORS, empty, fmt, h, plot, runApi, setParams } from '../common.js';

let ctx = null;
const TYPE_COLORS = { generation: COLORS[0], reward: COLORS[2], trainer: COLORS[1], trainer_phase: COLORS[3],
  weight_sync: COLORS[4], eval: COLORS[5], checkpoint: COLORS[6] };
const FIXED_ROWS = ['trainer', 'trainer phases', 'weight sync', 'evals', 'checkpoints'];

function rowKey(row) {
  const fixed = FIXED_ROWS.indexOf(row);
  if (fixed >= 0) return [0, fixed, 0];
  const n = (row.match(/\d+/g) || []).map(Number);
  return [1, n[0] ?? 0, n[1] ?? 0];
}

function rowOrder(rows) {
  return [...rows].sort((a, b) => {
    const x = rowKey(a), y = rowKey(b);
    for (let i = 0; i < 3; i++) if (x[i] !== y[i]) return x[i] - y[i];
    return a.localeCompare(b);
  });
}

function draw(data) {
  if (!data.spans.length && !data.instants.length) {
    ctx.chart.replaceChildren(empty(data.steps.length ? `No events for steps ${data.lo}..${data.hi} (events/).`
      : 'No step logged yet: each step\'s generation, reward, trainer and weight-sync spans show here once it is.'));
    return;
  }
  const t0 = Math.min(...data.spans.map(s => s.start), ...data.instants.map(i => i.time));
  const rows = rowOrder(new Set([...data.spans.map(s => s.row), ...data.instants.map(i => i.row)]));
  const byType = {};
  for (const s of data.spans) (byType[s.type] ||= []).push(s);
  const traces = Object.entries(byType).map(([type, spans]) => ({
    type: 'bar', orientation: 'h', name: type, y: spans.map(s => s.row), base: spans.map(s => s.start - t0),
    x: spans.map(s => Math.max(s.end - s.start, 1e-3)), marker: { color: TYPE_COLORS[type] || '#888', opacity: 0.85 },
    text: spans.map(s => `${type} ${s.name || ''} step ${s.step}${s.group_id !== null && s.group_id !== undefined ? ` g${s.group_id}/s${s.sample_id}` : ''} ${fmt(s.end - s.start, 3)} s${s.open ? ' (open)' : ''}${s.derived ? ' (from timing metrics)' : ''}`),
    hoverinfo: 'text', textposition: 'none',
  }));
  if (data.instants.length) traces.push({ type: 'scatter', mode: 'markers', name: 'instant', y: data.instants.map(i => i.row),
    x: data.instants.map(i => i.time - t0), marker: { symbol: 'diamond', size: 9, color: '#000' },
    text: data.instants.map(i => `${i.type} ${i.name} step ${i.step}`), hoverinfo: 'text' });
  ctx.chart.style.height = `${Math.max(320, rows.length * 16 + 110)}px`;
  // the time axis on top (many lanes make the chart taller than the window), the legend below it
  plot(ctx.chart, traces, { barmode: 'overlay', showlegend: true, hovermode: 'closest', legend: { orientation: 'h', y: 0, yanchor: 'top' },
    xaxis: { side: 'top', title: { text: `seconds since ${new Date(t0 * 1000).toLocaleTimeString()}`, standoff: 4 } },
    yaxis: { categoryorder: 'array', categoryarray: [...rows].reverse(), automargin: true, type: 'category' }, margin: { l: 130, r: 12, t: 60, b: 40 } });
}

async function load() {
  if (!ctx.follow) setParams({ from: ctx.from, to: ctx.to });
  const data = await runApi(ctx.run, 'timeline', { from: ctx.from, to: ctx.to });
  ctx.from = data.lo; ctx.to = data.hi;
  ctx.fromInput.value = data.lo; ctx.toInput.value = data.hi;
  ctx.count.textContent = `${data.spans.length} spans, ${data.instants.length} marks; steps logged: ${data.steps.length ? data.steps[0] + '..' + data.steps[1] : 'none'}`;
  draw(data);
}

export async function render(main, { params, selected }) {
  if (!selected.length) { main.append(empty('No runs found.')); return; }
  // without an explicit range the page follows the newest step of a live run
  ctx = { run: selected[0], from: params.from || '', to: params.to || '', follow: !params.to };
  ctx.fromInput = h('input', { type: 'number', id: 'tl-from', onchange: e => { ctx.from = e.target.value; ctx.follow = false; load(); } });
  ctx.toInput = h('input', { type: 'number', id: 'tl-to', onchange: e => { ctx.to = e.target.value; ctx.follow = false; load(); } });
  ctx.count = h('span', { class: 'muted' });
  ctx.chart = h('div', { class: 'chart tall', id: 'timeline-chart' });
  main.append(h('div', { class: 'controls' }, h('label', {}, 'steps', ctx.fromInput, '…', ctx.toInput), ctx.count), ctx.chart);
  await load();
}

export async function refresh({ changed }) {
  if (ctx && ctx.follow && changed(['metrics'])) { ctx.from = ''; ctx.to = ''; await load(); }
}
