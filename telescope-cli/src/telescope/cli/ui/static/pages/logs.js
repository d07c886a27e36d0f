// Logs: the run's log files (driver, its captured stdout with each Ray actor's lines, every
// inference server), filtered by component, level and text; "follow" appends new lines live.
import { empty, h, runApi, setParams } from '../common.js';

const DETAILED = 'driver (detailed)';
let ctx = null;

function line(e) {
  return h('div', { class: e.level }, h('span', { class: 'comp' }, `[${e.component}] `), e.text);
}

// Scrolls the log box to its first ERROR (or CRITICAL) line and marks it; says so when none.
function jumpToFirstError() {
  const first = ctx.box.querySelector('div.ERROR, div.CRITICAL');
  for (const el of ctx.box.querySelectorAll('.jumped')) el.classList.remove('jumped');
  if (!first) { ctx.count.textContent = 'no ERROR line among the lines shown'; return; }
  ctx.filters.follow = false;  // following would scroll away from it at the next line
  const follow = document.getElementById('log-follow');
  if (follow) follow.checked = false;
  first.classList.add('jumped');
  ctx.box.scrollTop = first.offsetTop - ctx.box.offsetTop;
}

function query(extra = {}) {
  const f = ctx.filters;
  return runApi(ctx.run, 'logs', { components: (f.components || []).join(','), level: f.level, q: f.q, limit: 2000, ...extra });
}

async function load() {
  const f = ctx.filters;
  let data = await query();
  if (!f.components && data.components.length) {
    // nothing chosen (no link): every component but the detailed log, which repeats the
    // driver's lines with file:line; asked again, since the first answer had them all
    f.components = data.components.filter(c => c !== DETAILED);
    data = await query();
  }
  if (f.components && !f.components.length) data = { ...data, entries: [], matched: 0 };  // every box unticked
  setParams({ components: (f.components || []).join(','), level: f.level, q: f.q, follow: f.follow ? '' : '0' });
  ctx.seq = data.seq;
  ctx.known = data.components;
  drawControls(data.components);
  ctx.count.textContent = `${data.matched} lines match${data.matched > data.entries.length ? `, showing the last ${data.entries.length}` : ''}`;
  const none = data.components.length ? 'No log lines match.' : 'No log files yet (logs/: the driver\'s telescope.log, its captured output, the servers\').';
  ctx.box.replaceChildren(...(data.entries.length ? data.entries.map(line) : [empty(none)]));
  if (f.follow) ctx.box.scrollTop = ctx.box.scrollHeight;
}

function drawControls(components) {
  const f = ctx.filters;
  ctx.controls.replaceChildren(
    h('span', { class: 'controls' }, components.map(c => h('label', {}, h('input', { type: 'checkbox', checked: (f.components || []).includes(c), 'data-component': c,
      onchange: e => { const on = (f.components || []).filter(x => x !== c); f.components = e.target.checked ? [...on, c] : on; load(); } }), c))),
    h('label', {}, 'level', h('select', { id: 'log-level', onchange: e => { f.level = e.target.value; load(); } },
      ['DEBUG', 'INFO', 'WARNING', 'ERROR'].map(l => h('option', { value: l, selected: l === (f.level || 'DEBUG') }, l)))),
    h('label', {}, 'text', h('input', { type: 'search', id: 'log-search', value: f.q, onchange: e => { f.q = e.target.value; load(); } })),
    h('button', { id: 'jump-error', onclick: jumpToFirstError, title: 'scroll to the first ERROR line shown' }, 'jump to first error'),
    h('label', {}, h('input', { type: 'checkbox', id: 'log-follow', checked: f.follow, onchange: e => { f.follow = e.target.checked; load(); } }), 'follow'),
    ctx.count);
}

export async function render(main, { params, selected }) {
  if (!selected.length) { main.append(empty('No runs found.')); return; }
  ctx = { run: selected[0], seq: 0, known: [], status: undefined, controls: h('div', { class: 'controls' }), count: h('span', { class: 'muted', id: 'log-count' }),
          box: h('div', { class: 'logs', id: 'log-lines' }),
          filters: { components: params.components ? params.components.split(',') : null, level: params.level || '', q: params.q || '', follow: params.follow !== '0' } };
  main.append(ctx.controls, ctx.box);
  await load();
}

export async function refresh({ revisions }) {
  if (!ctx || !ctx.filters.follow) return;
  // a run that has stopped writes no more lines: one last request after it stopped, then none
  const status = (revisions[ctx.run] || {}).status, was = ctx.status;
  ctx.status = status;
  if (status !== 'running' && was !== undefined && was !== 'running') return;
  const data = await query({ after: ctx.seq });
  const added = data.components.filter(c => !ctx.known.includes(c));
  if (added.length) {
    // a component that started logging after the page opened (a server, an actor): shown
    // ticked (but the detailed log), with its lines so far
    if (ctx.filters.components) ctx.filters.components.push(...added.filter(c => c !== DETAILED));
    await load();
    return;
  }
  ctx.seq = data.seq;
  if (!data.entries.length || (ctx.filters.components && !ctx.filters.components.length)) return;
  if (ctx.box.querySelector('p.muted')) ctx.box.replaceChildren();
  ctx.box.append(...data.entries.map(line));
  ctx.box.scrollTop = ctx.box.scrollHeight;
}
