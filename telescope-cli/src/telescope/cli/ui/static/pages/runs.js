// Runs: every run with its status, step, reward and config highlights; tick runs to compare.
import { api, fmt, fmtTime, h } from '../common.js';

let root = null;
const ticked = new Set();

function statusBadge(run) {
  const health = run.health || {};
  const label = health.state === 'overdue' ? 'running: step overdue' : run.stale ? 'running? (no writes)' : run.status;
  return [h('span', { class: `badge ${run.stale ? 'stale' : run.status}` }, label),
    health.text && run.status === 'running' ? h('div', { class: `health-line ${health.state}` }, health.text) : null];
}

// The reward trend as a small inline SVG line (the latest steps), scaled to its own range.
export function sparkline(values, width = 120, height = 24) {
  const pts = values.map((v, i) => [i, v]).filter(([, v]) => typeof v === 'number');
  if (pts.length < 2) return h('span', { class: 'muted' }, '–');
  const ys = pts.map(([, v]) => v), lo = Math.min(...ys), hi = Math.max(...ys), span = hi - lo || 1;
  const x = i => (i / (values.length - 1)) * (width - 2) + 1, y = v => height - 1 - ((v - lo) / span) * (height - 2);
  const d = pts.map(([i, v], k) => `${k ? 'L' : 'M'}${x(i).toFixed(1)},${y(v).toFixed(1)}`).join('');
  const svg = document.createElementNS('http://www.w3.org/2000/svg', 'svg');
  svg.setAttribute('width', width); svg.setAttribute('height', height); svg.setAttribute('class', 'sparkline');
  const path = document.createElementNS('http://www.w3.org/2000/svg', 'path');
  path.setAttribute('d', d); path.setAttribute('fill', 'none'); path.setAttribute('stroke', '#3856d6'); path.setAttribute('stroke-width', '1.5');
  const title = document.createElementNS('http://www.w3.org/2000/svg', 'title');
  title.textContent = `reward/mean over the last ${values.length} steps: ${fmt(lo)} … ${fmt(hi)}`;
  svg.append(title, path);
  return svg;
}

export function duration(s) {
  if (s === null || s === undefined) return '–';
  const t = Math.round(s);
  if (t >= 3600) return `${Math.floor(t / 3600)}h${String(Math.floor((t % 3600) / 60)).padStart(2, '0')}m`;
  if (t >= 60) return `${Math.floor(t / 60)}m${String(t % 60).padStart(2, '0')}s`;
  return `${t}s`;
}

const speed = median => (median === null || median === undefined ? '–' : median < 0.01 ? '<0.01 s/step' : `${median.toFixed(2)} s/step`);

function lastUpdate(run) {
  const ago = (run.health || {}).last_step_ago;
  return ago === null || ago === undefined ? '–' : `${duration(ago)} ago`;
}

// What the readers skipped (torn or malformed lines, torn or corrupt compressed frames) and the
// steps a resumed run logged again.
function readNotes(read) {
  const damaged = Object.entries(read).filter(([, v]) => v && (v.torn_tail || v.bad_lines || v.skipped_frames));
  return [
    damaged.length ? h('span', { class: 'error', title: JSON.stringify(Object.fromEntries(damaged)) }, 'damaged records skipped') : null,
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
    h('td', { class: 'spark' }, sparkline(run.reward_trend || [])),
    h('td', { class: 'last-update' }, lastUpdate(run)),
    h('td', { class: 'num speed' }, speed((run.health || {}).median_step)),
    h('td', { class: 'num eta' }, run.eta_s === null || run.eta_s === undefined ? '–' : duration(run.eta_s)),
    h('td', {}, fmtTime(run.created_at)),
    h('td', {}, Object.entries(run.highlights).map(([k, v]) => h('span', { class: 'chip' }, `${k}: ${fmt(v)}`))),
    h('td', {}, readNotes(run.read)),
  ));
  root.replaceChildren(
    h('h2', {}, `Runs (${runs.length})`),
    h('table', { id: 'runs-table' },
      h('tr', {}, ['', 'run', 'status', 'step', 'reward/mean', 'reward trend', 'last step', 'speed', 'ETA', 'created', 'config', ''].map(t => h('th', {}, t))), rows),
    h('h2', {}, 'Compare'), compareTable(runs));
}

export async function render(main) {
  root = h('div');
  main.append(root);
  draw((await api('/api/runs')).runs);
}

export async function refresh({ changed, revisions }) {
  // every poll: the health line ("running for", "last step ago") moves with the clock
  if (changed(['metrics', 'status', 'step', 'health'], Object.keys(revisions)) && root) draw((await api('/api/runs')).runs);
}
