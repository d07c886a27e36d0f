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

function draw(data) {
  const sources = Object.keys(data.series).sort();
  if (!sources.length) { ctx.root.replaceChildren(empty('No system samples yet (system.jsonl).')); return; }
  // one time origin for every source, so a CPU spike lines up with the torch memory it caused
  const t0 = Math.min(...sources.map(s => data.series[s].time[0] || Infinity));
  ctx.root.replaceChildren(...sources.map(source => {
    const { time, values } = data.series[source];
    const charts = new Map();
    for (const key of Object.keys(values).sort()) {
      const [chart, label] = chartOf(key);
      if (!charts.has(chart)) charts.set(chart, []);
      charts.get(chart).push([label, values[key]]);
    }
    return h('details', { class: 'section', open: true, 'data-source': source }, h('summary', {}, source),
      h('div', { class: 'grid' }, [...charts.entries()].map(([name, lines]) => {
        const el = h('div', { class: 'chart', 'data-key': name });
        drawWhenVisible(el, () => plot(el, lines.map(([label, ys], i) => ({ x: time.map(t => t - t0), y: ys, name: label, mode: 'lines',
          line: { color: COLORS[i % COLORS.length], width: 1.2 } })), { title: { text: titled(name), font: { size: 12 }, x: 0.02 },
          xaxis: { title: { text: 'seconds since the first sample' } } }));
        return el;
      })));
  }));
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
