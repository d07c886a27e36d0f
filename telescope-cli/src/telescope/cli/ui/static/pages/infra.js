// Infra: system samples (CPU, memory, GPU utilisation/memory/temperature/power when present),
// vLLM server metrics and torch memory per trainer rank, one chart per metric; per-core and
// per-GPU series share a chart.
import { COLORS, drawWhenVisible, empty, h, plot, runApi, titled } from '../common.js';

let ctx = null;

// 'cpu_core_3_utilization_percent' -> ['cpu_core_*_utilization_percent', 'core 3']; 'gpu/1/x' -> ['gpu/*/x', 'gpu 1']
function chartOf(key) {
  let m = key.match(/^cpu_core_(\d+)_(.*)$/);
  if (m) return [`cpu_core_*_${m[2]}`, `core ${m[1]}`];
  m = key.match(/^gpu\/(\d+)\/(.*)$/);
  if (m) return [`gpu/*/${m[2]}`, `gpu ${m[1]}`];
  return [key, key];
}

function chartsOf(data) {
  const sources = Object.keys(data.series).sort();
  // one time origin for every source, so a CPU spike lines up with the torch memory it caused
  const t0 = Math.min(...sources.map(s => data.series[s].time[0] || Infinity));
  return sources.map(source => {
    const { time, values } = data.series[source];
    const charts = new Map();
    for (const key of Object.keys(values).sort()) {
      const [chart, label] = chartOf(key);
      if (!charts.has(chart)) charts.set(chart, []);
      charts.get(chart).push([label, values[key]]);
    }
    return { source, charts: [...charts.entries()].map(([name, lines]) => ({ name, lines, x: time.map(t => t - t0) })) };
  });
}

// uirevision: new samples keep the user's zoom
function plotChart(el, { name, lines, x }) {
  return plot(el, lines.map(([label, ys], i) => ({ x, y: ys, name: label, mode: 'lines', line: { color: COLORS[i % COLORS.length], width: 1.2 } })),
    { uirevision: name, title: { text: titled(name), font: { size: 12 }, x: 0.02 }, xaxis: { title: { text: 'seconds since the first sample' } },
      // per-core and per-GPU lines: which is which, top right (hover shows it too)
      showlegend: lines.length > 1, legend: { orientation: 'h', x: 1, xanchor: 'right', y: 1.02, yanchor: 'bottom', font: { size: 10 } } });
}

function draw(data) {
  const sources = chartsOf(data);
  if (!sources.length) { ctx.root.replaceChildren(empty('No system samples yet (system.jsonl).')); ctx.els = null; return; }
  const shape = JSON.stringify(sources.map(s => [s.source, s.charts.map(c => c.name)]));
  ctx.charts = sources.flatMap(s => s.charts);
  if (ctx.els && shape === ctx.shape) {
    // the same charts: new samples drawn into those on screen (a zoom or a scroll position stays)
    ctx.charts.forEach((chart, i) => { if (ctx.els[i].dataset.drawn) plotChart(ctx.els[i], chart); });
    return;
  }
  ctx.shape = shape;
  ctx.els = [];
  ctx.root.replaceChildren(...sources.map(({ source, charts }) => h('details', { class: 'section', open: true, 'data-source': source },
    h('summary', {}, source), h('div', { class: 'grid' }, charts.map(chart => {
      const el = h('div', { class: 'chart', 'data-key': chart.name }), i = ctx.els.push(el) - 1;
      drawWhenVisible(el, () => plotChart(el, ctx.charts[i]));  // the latest samples when it scrolls into view
      return el;
    })))));
}

export async function render(main, { selected }) {
  if (!selected.length) { main.append(empty('No runs found.')); return; }
  ctx = { run: selected[0], root: h('div', { id: 'infra' }) };
  main.append(ctx.root);
  draw(await runApi(ctx.run, 'system'));
}

export async function refresh({ changed }) {
  if (ctx && changed(['system'])) draw(await runApi(ctx.run, 'system'));
}
