// The dashboard's shell: routes '#/<page>?...' to a page module, keeps the run picker, and
// polls /api/poll every second so each page refreshes when its runs change (live runs).
import { api, currentRoute, drawsSettled, h, loadPlotly, setParams } from './common.js';
import * as runs from './pages/runs.js';
import * as metrics from './pages/metrics.js';
import * as rollouts from './pages/rollouts.js';
import * as timeline from './pages/timeline.js';
import * as infra from './pages/infra.js';
import * as sandboxes from './pages/sandboxes.js';
import * as evals from './pages/evals.js';
import * as logs from './pages/logs.js';

const PAGES = { runs, metrics, rollouts, timeline, infra, sandboxes, evals, logs };
const POLL_MS = 1000;
const state = { runs: [], page: null, revisions: {}, rendering: false, paused: false };

export function selectedRuns() {
  const { params } = currentRoute();
  const keys = state.runs.map(r => r.key);
  const chosen = (params.runs || '').split(',').filter(k => keys.includes(k));
  return chosen.length ? chosen : keys.slice(0, 1);
}

// Run health of the selected run on every page, from run.json progress (server: health.py):
// "step N running for T (median step S) · last step T ago", yellow when slow, red when overdue.
function renderHealth() {
  const el = document.getElementById('health');
  const key = selectedRuns()[0];
  const health = (state.revisions[key] || {}).health || {};
  el.className = `health ${health.state || ''}`;
  el.dataset.state = health.state || '';
  const word = { slow: 'slow: ', overdue: 'overdue: ' }[health.state] || '';
  el.textContent = health.text ? `${key}: ${word}${health.text}` : '';
  const dot = document.getElementById('live');
  for (const s of ['slow', 'overdue']) dot.classList.toggle(s, health.state === s);
  el.title = el.textContent + (health.state === 'overdue' ? ': the current step has run far longer than the median step, ranks may be stuck (see Logs, Infra)' : '');
}

function renderPicker(page) {
  const box = document.getElementById('run-picker');
  box.replaceChildren();
  if (page === 'runs' || !state.runs.length) return;
  const chosen = selectedRuns();
  const choose = keys => { setParams({ runs: keys.join(',') }); render(); };
  if (page === 'metrics' && state.runs.length <= 8) {
    // overlay: a tick box per run
    box.append(h('span', { class: 'controls', id: 'run-boxes' }, state.runs.map(r => h('label', {},
      h('input', { type: 'checkbox', checked: chosen.includes(r.key), 'data-run': r.key, onchange: () => {
        const keys = [...box.querySelectorAll('input:checked')].map(i => i.dataset.run);
        if (keys.length) choose(keys);
      } }), r.key))));
    return;
  }
  const multi = page === 'metrics';
  const select = h('select', { id: 'run-select', multiple: multi, size: multi ? Math.min(state.runs.length, 4) : null,
    title: multi ? 'ctrl-click to overlay several runs' : null,
    onchange: () => choose([...select.selectedOptions].map(o => o.value)) },
    state.runs.map(r => h('option', { value: r.key, selected: chosen.includes(r.key) }, r.key)));
  box.append(h('label', {}, multi ? 'runs ' : 'run ', select));
}

async function render() {
  const { page, params } = currentRoute();
  const module = PAGES[page] || runs;
  for (const a of document.querySelectorAll('#nav a')) a.classList.toggle('active', a.dataset.page === page);
  state.page = module;
  renderPicker(page);
  renderHealth();
  const main = document.getElementById('page');
  main.replaceChildren();
  state.rendering = true;
  try {
    await module.render(main, { params, runs: state.runs, selected: selectedRuns() });
  } catch (err) {
    console.warn(err);
    main.append(h('p', { class: 'error' }, String(err.message || err)));
  } finally {
    state.rendering = false;
  }
}

// A hidden tab (another tab in front, a minimised window) does not poll: a forgotten dashboard
// tab would otherwise have the server read and send its page's data every second or two for
// good. It polls at once when shown again.
async function poll() {
  if (document.hidden) { state.paused = true; return; }
  try {
    const { runs: revs } = await api('/api/poll');
    const previous = state.revisions;
    // changed(['metrics']): did one of these counters move for the selected runs (or any run)?
    const changed = (fields, keys = selectedRuns()) => keys.some(k => fields.some(f => (revs[k] || {})[f] !== (previous[k] || {})[f]));
    const newRuns = Object.keys(revs).length !== Object.keys(previous).length;
    state.revisions = revs;
    document.getElementById('live').classList.add('on');
    renderHealth();
    if (newRuns) state.runs = (await api('/api/runs')).runs;
    if (!state.rendering && state.page && state.page.refresh) await state.page.refresh({ changed, revisions: revs });
  } catch (err) {
    document.getElementById('live').classList.remove('on');
  }
  setTimeout(poll, POLL_MS);
}

async function main() {
  const [runList, revisions] = await Promise.all([api('/api/runs'), api('/api/poll')]);
  state.runs = runList.runs;
  state.revisions = revisions.runs;
  window.addEventListener('hashchange', render);
  await render();
  // plotly compiles only now: until then the page fetched its data and drew previews of its charts
  await drawsSettled();
  loadPlotly();
  document.addEventListener('visibilitychange', () => {
    if (!document.hidden && state.paused) { state.paused = false; poll(); }
  });
  setTimeout(poll, POLL_MS);
}

main();
