// Timeline: a Gantt chart of one or several steps (at most 50). Rows: the trainer (train_step
// spans), its phases (from the timing_* metrics, drawn inside the step, one colour each), weight
// syncs, evals, checkpoints, then one row per inference server with its samples' generation and
// reward spans (expand a server to see one row per lane). The legend is above the chart.
// Zoom with the mouse (drag a box, double-click to reset). A bad range is said on the page.
import { COLORS, empty, fmt, h, plot, runApi, setParams } from '../common.js';

let ctx = null;
const MAX_STEPS = 50;  // as the server (data.py MAX_TIMELINE_STEPS)
const TYPE_COLORS = { generation: COLORS[0], reward: COLORS[2], trainer: COLORS[1],
  weight_sync: COLORS[4], eval: COLORS[5], checkpoint: COLORS[6] };
// each trainer phase its own colour (data.py/timeline.py TRAINER_PHASES)
const PHASE_COLORS = { waiting_for_data: '#b0b0b8', prepare_tensors: '#f3a712', data_to_device: '#8d5fd3', forward: '#17a398',
  loss: '#db3a34', backward: '#29335c', 'weight_sync (trainer)': '#4c956c' };
const FIXED_ROWS = ['trainer', 'trainer phases', 'weight sync', 'evals', 'checkpoints'];

function rowKey(row) {
  const fixed = FIXED_ROWS.indexOf(row);
  if (fixed >= 0) return [0, fixed, -1];
  const n = (row.match(/\d+/g) || []).map(Number);
  return [1, n[0] ?? 0, n[1] ?? -1];
}

function rowOrder(rows) {
  return [...rows].sort((a, b) => {
    const x = rowKey(a), y = rowKey(b);
    for (let i = 0; i < 3; i++) if (x[i] !== y[i]) return x[i] - y[i];
    return a.localeCompare(b);
  });
}

// 'server 3 / lane 17' -> 'server 3' unless server 3 is expanded
export function displayRow(row, expanded) {
  const m = /^(server [^/]+?) \/ lane /.exec(row);
  return m && !expanded.has(m[1]) ? m[1] : row;
}

function label(s) {
  const ids = s.group_id !== null && s.group_id !== undefined ? ` g${s.group_id}/s${s.sample_id}` : '';
  const seconds = s.derived ? s.attrs.seconds : s.end - s.start;
  const scaled = s.derived && s.attrs.scale < 1 ? ` (drawn ×${fmt(s.attrs.scale, 2)} to fit the step)` : '';
  return `${s.type} ${s.name || ''} step ${s.step}${ids} ${fmt(seconds, 3)} s${s.open ? ' (open)' : ''}${s.derived ? ' (from timing metrics)' : ''}${scaled}`;
}

function traceName(s) {
  return s.type === 'trainer_phase' ? `phase: ${s.name}` : s.type;
}

function serverToggles(data) {
  const lanes = {};
  for (const s of data.spans) {
    const m = /^(server [^/]+?) \/ lane (.+)$/.exec(s.row);
    if (m) (lanes[m[1]] ||= new Set()).add(m[2]);
  }
  const servers = Object.keys(lanes).sort((a, b) => rowKey(a)[1] - rowKey(b)[1]);
  if (!servers.length) return null;
  return h('span', { class: 'controls', id: 'tl-servers' }, h('span', { class: 'muted' }, 'lanes:'), servers.map(name =>
    h('button', { 'data-server': name, class: ctx.expanded.has(name) ? 'on' : null,
      onclick: () => {
        ctx.expanded.has(name) ? ctx.expanded.delete(name) : ctx.expanded.add(name);
        setParams({ lanes: [...ctx.expanded].join(',') });
        draw(ctx.data);
      } },
    `${ctx.expanded.has(name) ? '▾' : '▸'} ${name} (${lanes[name].size} lanes)`)));
}

function legend(traces) {
  return h('div', { class: 'controls', id: 'tl-legend' }, traces.map((t, i) => h('span', {
    class: 'chip legend-item', 'data-trace': t.name, title: 'click to hide or show',
    onclick: e => { const on = e.currentTarget.classList.toggle('off'); Plotly.restyle(ctx.chart, { visible: on ? 'legendonly' : true }, [i]); },
  }, h('span', { class: 'swatch', style: `background:${t.marker.color}` }), t.name)));
}

function draw(data) {
  ctx.data = data;
  if (!data.spans.length && !data.instants.length) {
    ctx.legend.replaceChildren();
    ctx.chart.replaceChildren(empty(data.steps.length ? `No events for steps ${data.lo}..${data.hi} (events/).`
      : 'No step logged yet: each step\'s generation, reward, trainer and weight-sync spans show here once it is.'));
    return;
  }
  const t0 = Math.min(...data.spans.map(s => s.start), ...data.instants.map(i => i.time));
  const row = r => displayRow(r, ctx.expanded);
  const rows = rowOrder(new Set([...data.spans.map(s => row(s.row)), ...data.instants.map(i => row(i.row))]));
  const byName = {};
  for (const s of data.spans) (byName[traceName(s)] ||= []).push(s);
  const traces = Object.entries(byName).map(([name, spans]) => ({
    type: 'bar', orientation: 'h', name, y: spans.map(s => row(s.row)), base: spans.map(s => s.start - t0),
    x: spans.map(s => Math.max(s.end - s.start, 1e-3)),
    marker: { color: spans[0].type === 'trainer_phase' ? PHASE_COLORS[spans[0].name] || '#888' : TYPE_COLORS[spans[0].type] || '#888', opacity: 0.85 },
    text: spans.map(label), hoverinfo: 'text', textposition: 'none',
  }));
  if (data.instants.length) traces.push({ type: 'scatter', mode: 'markers', name: 'instant', y: data.instants.map(i => row(i.row)),
    x: data.instants.map(i => i.time - t0), marker: { symbol: 'diamond', size: 9, color: '#000' },
    text: data.instants.map(i => `${i.type} ${i.name} step ${i.step}`), hoverinfo: 'text' });
  ctx.servers.replaceChildren(serverToggles(data) || '');
  ctx.legend.replaceChildren(legend(traces));
  ctx.chart.style.height = `${Math.max(320, rows.length * 22 + 100)}px`;
  // the time axis on top (an expanded server makes the chart taller than the window)
  plot(ctx.chart, traces, { barmode: 'overlay', showlegend: false, hovermode: 'closest',
    xaxis: { side: 'top', title: { text: `seconds since ${new Date(t0 * 1000).toLocaleTimeString()}`, standoff: 4 } },
    yaxis: { categoryorder: 'array', categoryarray: [...rows].reverse(), automargin: true, type: 'category' }, margin: { l: 130, r: 12, t: 60, b: 20 } });
}

// 'from' and 'to' checked before asking: a bad range is said on the page, the last chart stays
export function rangeError(from, to) {
  const bad = v => v !== '' && !/^-?\d+$/.test(String(v));
  if (bad(from) || bad(to)) return `steps must be whole numbers (got from=${from}, to=${to})`;
  if (from === '' || to === '') return '';
  const lo = Number(from), hi = Number(to);
  if (lo > hi) return `'from' (${lo}) is after 'to' (${hi}): set 'to' to ${lo} or more, or 'from' to ${hi} or less`;
  if (hi - lo + 1 > MAX_STEPS) return `steps ${lo}..${hi} are ${hi - lo + 1} steps: the timeline shows at most ${MAX_STEPS}; set 'to' to ${lo + MAX_STEPS - 1} or less`;
  return '';
}

function showError(text) {
  ctx.error.textContent = text;
  ctx.error.hidden = !text;
}

async function load() {
  // an answer to an older request (the user edited the range meanwhile) is dropped
  const seq = ctx.seq = (ctx.seq || 0) + 1;
  const typed = ctx.typed;
  const problem = rangeError(ctx.from, ctx.to);
  showError(problem);
  if (problem) return;
  if (!ctx.follow) setParams({ from: ctx.from, to: ctx.to });
  let data;
  try {
    data = await runApi(ctx.run, 'timeline', { from: ctx.from, to: ctx.to });
  } catch (err) {
    if (seq === ctx.seq) showError(`timeline not loaded: ${err.message}`);
    return;
  }
  if (seq !== ctx.seq) return;
  ctx.from = data.lo; ctx.to = data.hi;
  // the boxes take the range answered unless the user has typed in them since the request
  if (typed === ctx.typed) { ctx.fromInput.value = data.lo; ctx.toInput.value = data.hi; }
  ctx.count.textContent = `${data.spans.length} spans, ${data.instants.length} marks; steps logged: ${data.steps.length ? data.steps[0] + '..' + data.steps[1] : 'none'}`;
  draw(data);
}

export async function render(main, { params, selected }) {
  if (!selected.length) { main.append(empty('No runs found.')); return; }
  // without an explicit range the page follows the newest step of a live run
  ctx = { run: selected[0], from: params.from || '', to: params.to || '', follow: !params.to,
          expanded: new Set((params.lanes || '').split(',').filter(Boolean)) };
  // the range is what the two boxes show at the time of an edit (never a value an older answer wrote)
  const edit = () => { ctx.from = ctx.fromInput.value; ctx.to = ctx.toInput.value; ctx.follow = false; load(); };
  const typing = () => { ctx.typed += 1; };
  ctx.typed = 0;
  ctx.fromInput = h('input', { type: 'number', id: 'tl-from', onchange: edit, oninput: typing });
  ctx.toInput = h('input', { type: 'number', id: 'tl-to', onchange: edit, oninput: typing });
  ctx.count = h('span', { class: 'muted' });
  ctx.error = h('div', { class: 'error', id: 'timeline-error', hidden: true });
  ctx.servers = h('span');
  ctx.legend = h('div');
  ctx.chart = h('div', { class: 'chart tall', id: 'timeline-chart' });
  main.append(h('div', { class: 'controls' }, h('label', {}, 'steps', ctx.fromInput, '…', ctx.toInput), ctx.count, ctx.servers),
    ctx.error, ctx.legend, ctx.chart);
  await load();
}

export async function refresh({ changed }) {
  if (ctx && ctx.follow && changed(['metrics'])) { ctx.from = ''; ctx.to = ''; await load(); }
}
