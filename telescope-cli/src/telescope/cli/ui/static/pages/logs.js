// Logs: the run's log files (driver, its captured stdout with each Ray actor's lines, every
// inference server), filtered by component, level and text; "follow" appends new lines live.
import { empty, h, runApi, setParams } from '../common.js';

let ctx = null;

function line(e) {
  return h('div', { class: e.level }, h('span', { class: 'comp' }, `[${e.component}] `), e.text);
}

async function load() {
  const f = ctx.filters;
  setParams({ components: f.components.join(','), level: f.level, q: f.q, follow: f.follow ? '' : '0' });
  const data = await runApi(ctx.run, 'logs', { components: f.components.join(','), level: f.level, q: f.q, limit: 2000 });
  ctx.seq = data.seq;
  if (!ctx.controlsDrawn) drawControls(data.components);
  ctx.count.textContent = `${data.matched} lines match${data.matched > data.entries.length ? `, showing the last ${data.entries.length}` : ''}`;
  ctx.box.replaceChildren(...(data.entries.length ? data.entries.map(line) : [empty('No log lines match.')]));
  if (f.follow) ctx.box.scrollTop = ctx.box.scrollHeight;
}

function drawControls(components) {
  const f = ctx.filters;
  if (!f.components.length) f.components = components.filter(c => c !== 'driver (detailed)');
  ctx.controls.replaceChildren(
    h('span', { class: 'controls' }, components.map(c => h('label', {}, h('input', { type: 'checkbox', checked: f.components.includes(c), 'data-component': c,
      onchange: e => { f.components = e.target.checked ? [...f.components, c] : f.components.filter(x => x !== c); load(); } }), c))),
    h('label', {}, 'level', h('select', { id: 'log-level', onchange: e => { f.level = e.target.value; load(); } },
      ['DEBUG', 'INFO', 'WARNING', 'ERROR'].map(l => h('option', { value: l, selected: l === (f.level || 'DEBUG') }, l)))),
    h('label', {}, 'text', h('input', { type: 'search', id: 'log-search', value: f.q, onchange: e => { f.q = e.target.value; load(); } })),
    h('label', {}, h('input', { type: 'checkbox', id: 'log-follow', checked: f.follow, onchange: e => { f.follow = e.target.checked; load(); } }), 'follow'),
    ctx.count);
  ctx.controlsDrawn = true;
}

export async function render(main, { params, selected }) {
  if (!selected.length) { main.append(empty('No runs found.')); return; }
  ctx = { run: selected[0], seq: 0, controlsDrawn: false, controls: h('div', { class: 'controls' }), count: h('span', { class: 'muted', id: 'log-count' }),
          box: h('div', { class: 'logs', id: 'log-lines' }),
          filters: { components: (params.components || '').split(',').filter(Boolean), level: params.level || '', q: params.q || '', follow: params.follow !== '0' } };
  main.append(ctx.controls, ctx.box);
  await load();
}

export async function refresh() {
  if (!ctx || !ctx.filters.follow) return;
  const f = ctx.filters;
  const data = await runApi(ctx.run, 'logs', { components: f.components.join(','), level: f.level, q: f.q, after: ctx.seq, limit: 2000 });
  ctx.seq = data.seq;
  if (!data.entries.length) return;
  if (ctx.box.querySelector('p.muted')) ctx.box.replaceChildren();
  ctx.box.append(...data.entries.map(line));
  ctx.box.scrollTop = ctx.box.scrollHeight;
}
