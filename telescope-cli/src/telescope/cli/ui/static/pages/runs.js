// Runs: every run with its status, step, reward and config highlights; tick runs to compare.
import { api, fmt, fmtTime, h } from '../common.js';

let root = null;
const ticked = new Set();

function statusBadge(run) {
  const label = run.stale ? 'running? (no writes)' : run.status;
  return h('span', { class: `badge ${run.stale ? 'stale' : run.status}` }, label);
}

// What the readers skipped (torn or malformed lines) and the steps a resumed run logged again.
function readNotes(read) {
  const damaged = Object.entries(read).filter(([, v]) => v && (v.torn_tail || v.bad_lines));
  return [
    damaged.length ? h('span', { class: 'error', title: JSON.stringify(Object.fromEntries(damaged)) }, 'damaged lines skipped') : null,
    read.superseded_steps ? h('div', { class: 'muted' }, `${read.superseded_steps} steps logged again after a resume`) : null,
  ];
}

function compareTable(runs) {
  const chosen = runs.filter(r => ticked.has(r.key));
  if (chosen.length < 2) return h('p', { class: 'muted' }, 'Tick two or more runs to compare their configs and open their metrics together.');
  const keys = [...new Set(chosen.flatMap(r => Object.keys(r.highlights)))];
  const rows = keys.map(k => {
    const values = chosen.map(r => fmt(r.highlights[k]));
    const differs = new Set(values).size > 1;
    return h('tr', {}, h('th', {}, k), values.map(v => h('td', { style: differs ? 'font-weight:600' : null }, v)));
  });
  return h('div', {},
    h('p', {}, h('a', { href: `#/metrics?runs=${chosen.map(r => r.key).join(',')}`, id: 'compare-link' }, `Compare metrics of ${chosen.length} runs →`)),
    h('table', { id: 'compare-table' }, h('tr', {}, h('th', {}, 'config'), chosen.map(r => h('th', {}, r.key))), rows));
}

function draw(runs) {
  const rows = runs.map(run => h('tr', {},
    h('td', {}, h('input', { type: 'checkbox', checked: ticked.has(run.key), 'data-run': run.key,
      onchange: e => { e.target.checked ? ticked.add(run.key) : ticked.delete(run.key); draw(runs); } })),
    h('td', {}, h('a', { href: `#/metrics?runs=${run.key}` }, run.key), h('div', { class: 'muted' }, run.name)),
    h('td', {}, statusBadge(run), run.starts > 1 ? h('div', { class: 'muted' }, `${run.starts} starts`) : null,
      run.failure ? h('div', { class: 'error', title: run.failure }, run.failure.length > 80 ? run.failure.slice(0, 79) + '…' : run.failure) : null),
    h('td', { class: 'num' }, `${fmt(run.step)}${run.number_of_steps ? ' / ' + run.number_of_steps : ''}`),
    h('td', { class: 'num' }, fmt(run.reward)),
    h('td', {}, fmtTime(run.created_at)),
    h('td', {}, Object.entries(run.highlights).map(([k, v]) => h('span', { class: 'chip' }, `${k}: ${fmt(v)}`))),
    h('td', {}, readNotes(run.read)),
  ));
  root.replaceChildren(
    h('h2', {}, `Runs (${runs.length})`),
    h('table', { id: 'runs-table' },
      h('tr', {}, ['', 'run', 'status', 'step', 'reward/mean', 'created', 'config', ''].map(t => h('th', {}, t))), rows),
    h('h2', {}, 'Compare'), compareTable(runs));
}

export async function render(main) {
  root = h('div');
  main.append(root);
  draw((await api('/api/runs')).runs);
}

export async function refresh({ changed, revisions }) {
  if (changed(['metrics', 'status', 'step'], Object.keys(revisions)) && root) draw((await api('/api/runs')).runs);
}
