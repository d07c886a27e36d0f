// Sandboxes: the sandbox/* step metrics (create-to-ready and command p50/p95, live sandboxes,
// timeouts, OOM kills, non-zero exits, infrastructure errors, CPU seconds per sample), one chart
// each, and one step's failing or slowest commands with the tails of their output (text, never markup).
// A metric no step reported was not measured (never charted as 0): its place says so, and why.
import { drawWhenVisible, empty, fmt, h, plot, runApi, titled } from '../common.js';

let ctx = null;

function notMeasured(item) {
  return h('div', { class: 'chart not-measured', 'data-key': item.key },
    h('p', {}, h('b', {}, titled(item.key)), ': not measured'), h('p', { class: 'muted' }, item.why));
}

function charts(series, missing) {
  const absent = new Set(missing.map(m => m.key));
  const keys = Object.keys(series.values).filter(k => !absent.has(k)).sort();
  return h('div', { class: 'grid' }, missing.map(notMeasured), keys.map(key => {
    const el = h('div', { class: 'chart', 'data-key': key });
    drawWhenVisible(el, async () => {
      await plot(el, [{ x: series.step, y: series.values[key], mode: 'lines+markers', name: key }],
        { title: { text: titled(key), font: { size: 12 }, x: 0.02 }, xaxis: { title: { text: 'step' } } });
      el.on && el.on('plotly_click', ev => show(ev.points[0].x));
    });
    return el;
  }));
}

function commandRow(c) {
  const what = c.error || (c.timed_out ? 'timed out' : c.oom ? 'OOM kill' : `exit ${c.exit_code ?? '-'}`);
  return [
    h('tr', { class: c.failing ? 'failing' : '' }, h('td', {}, c.sandbox_id), h('td', {}, c.env || '-'),
      h('td', { class: 'num' }, fmt(c.duration_s, 3)), h('td', { class: 'num' }, c.cpu_s == null ? 'not measured' : fmt(c.cpu_s, 3)),
      h('td', {}, what), h('td', {}, h('code', {}, c.command))),
    h('tr', {}, h('td', { colspan: 6 }, h('details', {}, h('summary', {}, 'stdout / stderr (tails)'),
      h('pre', { class: 'msg' }, c.stdout_tail || '(empty stdout)'), h('pre', { class: 'msg' }, c.stderr_tail || '(empty stderr)')))),
  ];
}

function commands(data) {
  if (!data.commands.length) return empty(`No sandbox commands in step ${data.step}.`);
  return h('table', { id: 'sandbox-commands' }, h('tr', {}, ['sandbox', 'env', 'seconds', 'CPU s', 'outcome', 'command'].map(t => h('th', {}, t))),
    data.commands.map(commandRow));
}

async function show(step) {
  const data = await runApi(ctx.run, 'sandboxes', step == null ? {} : { step });
  ctx.step = step;
  if (!Object.keys(data.series.values).length && !data.commands.length) {
    ctx.root.replaceChildren(empty('No sandboxes in this run (no sandbox/* metrics; environments that run code record them).'));
    return;
  }
  const picker = h('select', { onchange: ev => show(Number(ev.target.value)) },
    data.steps.map(s => h('option', { value: s, selected: s === data.step }, `step ${s}`)));
  ctx.root.replaceChildren(h('details', { class: 'section', open: true }, h('summary', {}, 'sandbox metrics by step'), charts(data.series, data.not_measured || [])),
    h('h2', {}, `Failing or slowest commands of `, picker), commands(data));
}

export async function render(main, { selected }) {
  if (!selected.length) { main.append(empty('No runs found.')); return; }
  ctx = { run: selected[0], root: h('div', { id: 'sandboxes' }), step: null };
  main.append(ctx.root);
  await show(null);
}

export async function refresh({ changed }) {
  if (ctx && ctx.step == null && changed(['metrics'])) await show(null);
}
