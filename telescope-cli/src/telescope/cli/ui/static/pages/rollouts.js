// Rollouts: one step's samples with filters (environment, outcome, reward, advantage, length,
// text), the step's aggregates, one sample in full (conversation, tool calls, reward
// components, timings, tokens) and its prompt group side by side.
import { empty, fmt, h, runApi, setParams } from '../common.js';

let ctx = null;
const FILTERS = ['env', 'outcome', 'tag', 'reward_min', 'reward_max', 'adv_min', 'adv_max', 'len_min', 'len_max', 'q'];

function filterControls(data) {
  const f = ctx.filters;
  const input = (name, type = 'number', attrs = {}) => h('input', { id: `f-${name}`, type, value: f[name] || '', step: 'any', ...attrs,
    onchange: e => { f[name] = e.target.value; load(); } });
  const steps = data.steps || [];
  const stepAt = d => { const i = steps.indexOf(data.step) + d; if (i >= 0 && i < steps.length) { ctx.step = steps[i]; load(); } };
  return h('div', { class: 'controls' },
    h('label', {}, 'step', h('button', { onclick: () => stepAt(-1), id: 'prev-step' }, '‹'),
      h('select', { id: 'step', onchange: e => { ctx.step = Number(e.target.value); load(); } },
        steps.map(s => h('option', { value: s, selected: s === data.step }, s))),
      h('button', { onclick: () => stepAt(1), id: 'next-step' }, '›')),
    h('label', {}, 'env', h('select', { id: 'f-env', onchange: e => { f.env = e.target.value; load(); } },
      h('option', { value: '' }, 'any'), data.options.envs.map(e => h('option', { value: e, selected: e === f.env }, e)))),
    h('label', {}, 'outcome', h('select', { id: 'f-outcome', onchange: e => { f.outcome = e.target.value; load(); } },
      // the reasons this step has (a newer runtime or a plugin may add its own) after the groups
      [...new Set(['', 'kept', 'discarded', 'cancelled', ...Object.keys(data.options.outcomes), f.outcome || ''])]
        .map(o => h('option', { value: o, selected: o === (f.outcome || '') }, o || 'any')))),
    data.options.tags.length || f.tag ? h('label', {}, 'tag', h('select', { id: 'f-tag', onchange: e => { f.tag = e.target.value; load(); } },
      [...new Set(['', ...data.options.tags, f.tag || ''])].map(t => h('option', { value: t, selected: t === (f.tag || '') }, t || 'any')))) : null,
    h('label', {}, 'reward', input('reward_min'), '…', input('reward_max')),
    h('label', {}, 'advantage', input('adv_min'), '…', input('adv_max')),
    h('label', {}, 'completion tokens', input('len_min'), '…', input('len_max')),
    h('label', {}, 'text', input('q', 'search', { placeholder: 'in prompt or completion' })));
}

function summaryPanel(s, filtered) {
  const row = (name, st) => h('tr', {}, h('td', {}, name), ['mean', 'std', 'min', 'max', 'gini_mean'].map(k => h('td', { class: 'num' }, fmt(st[k]))));
  return h('div', { class: 'panel', id: 'step-summary' },
    h('div', { class: 'muted' }, filtered ? 'summary of the rollouts the filters show' : 'summary of the step'),
    h('div', {}, Object.entries(s.outcomes).map(([k, v]) => h('span', { class: 'chip' }, `${k}: ${v}`))),
    h('table', {}, h('tr', {}, ['kept samples', 'mean', 'std', 'min', 'max', 'gini (group mean)'].map(t => h('th', {}, t))),
      row('reward', s.reward), row('advantage', s.advantage), row('completion tokens', s.completion_tokens),
      Object.entries(s.sample_metrics).map(([k, st]) => row(k, st))));
}

// column -> [sort key, width]; the completion gets the rest: it is cut to fit rather than pushed out of view
const COLUMNS = { group: ['group_id', 50], sample: ['sample_id', 58], env: ['env', 90], reward: ['reward', 64],
  advantage: ['advantage', 84], outcome: ['outcome', 132], stop: ['stop_reason', 52], tokens: ['completion_tokens', 58], completion: [null, null] };

function header() {
  const [key, desc] = [ctx.sort.replace(/^-/, ''), ctx.sort.startsWith('-')];
  return h('tr', {}, Object.entries(COLUMNS).map(([name, [sortKey, w]]) => h('th', {
    style: w ? `width:${w}px` : null, class: sortKey ? 'sortable' : null, 'data-sort': sortKey,
    title: sortKey ? 'click to sort (again: reverse)' : null,
    onclick: sortKey ? () => { ctx.sort = key === sortKey && !desc ? `-${sortKey}` : sortKey; load(); } : null,
  }, name, key === sortKey ? (desc ? ' ▼' : ' ▲') : '')));
}

function table(data) {
  if (!data.rows.length) return empty('No rollouts match.');
  return h('table', { id: 'rollout-table' }, header(),
    data.rows.map(r => h('tr', { class: 'clickable', 'data-reward': r.reward, 'data-group': r.group_id, 'data-sample': r.sample_id,
      onclick: e => { select(r); markSelected(e.currentTarget); } },
      h('td', { class: 'num' }, r.group_id), h('td', { class: 'num' }, r.sample_id), h('td', { title: r.env }, r.env),
      h('td', { class: 'num' }, fmt(r.reward)), h('td', { class: 'num' }, fmt(r.advantage)),
      h('td', { title: r.outcome }, r.outcome), h('td', { title: r.stop_reason }, r.stop_reason), h('td', { class: 'num' }, r.completion_tokens),
      h('td', {}, h('div', { class: 'preview' }, r.completion_preview)))));
}

// A deep-linked sample (?group=&sample=): its row scrolled into view and marked.
function revealRow(groupId, sampleId) {
  const tr = document.querySelector(`#rollout-table tr[data-group="${groupId}"][data-sample="${sampleId}"]`);
  if (!tr) return;
  markSelected(tr);
  tr.scrollIntoView({ block: 'center' });
}

function markSelected(tr) {
  for (const el of document.querySelectorAll('#rollout-table tr.selected')) el.classList.remove('selected');
  tr.classList.add('selected');
}

function conversationView(messages) {
  return messages.map(m => h('div', { class: `msg ${m.role}` }, h('div', { class: 'role' }, m.role + (m.generated ? ' (generated)' : '')),
    m.parts.map(p => h('div', { class: `part ${p.kind}` }, p.kind === 'text' ? null : h('div', { class: 'role' }, p.kind.replace('_', ' ')), p.text))));
}

// The token view: each completion token (its text when the record holds the token view's
// fields, else its id), coloured by the sampler's probability (hue 120 * p: green sure, red
// unlikely) when the record holds logprobs; environment-written tokens (logprob null) stay grey.
// No per-token trainer/sampler mismatch: the trainer computes its logprobs after the record is
// written, so no record holds them (the step's mismatch KL is on the Metrics page).
function tokenView(record) {
  const ids = record.completion_ids || [];
  const texts = record.completion_token_texts;
  const lp = record.completion_logprobs;
  if (!ids.length) return null;
  const spans = ids.map((id, i) => {
    let cls = 'tok', style = null, title = `id ${id}`;
    if (Array.isArray(lp) && typeof lp[i] === 'number') {
      const p = Math.exp(lp[i]);
      style = `background:hsl(${Math.round(120 * p)}, 70%, 85%)`;
      title += `  logprob ${lp[i].toFixed(3)}  p ${p.toFixed(3)}`;
    } else if (Array.isArray(lp)) { cls += ' env'; title += '  written by the environment'; }
    const text = Array.isArray(texts) && typeof texts[i] === 'string' ? texts[i] : String(id);
    // whitespace stays visible: a newline token shows as ↵ and breaks the line after it
    return [h('span', { class: cls, style, title }, text.replace(/\n/g, '↵')), text.includes('\n') ? h('br') : null];
  });
  const what = lp ? 'coloured by sampler probability (green p≈1, red p≈0; grey: environment tokens; hover for the logprob)'
    : `${texts ? 'texts' : 'ids'} (the record holds no logprobs)`;
  return h('div', {}, h('h3', {}, `completion tokens (${ids.length}), ${what}`), h('div', { class: 'tokens', id: 'token-view' }, spans));
}

// Unix times (generation_start, ...) read better as 24-hour local clock times with milliseconds
// (10:00:00.250; a locale's '10:00:00 AM' would put them after the AM).
function value(k, v) {
  if (typeof v === 'number' && v > 1e9 && /(_start|_end|time)$/.test(k)) {
    const d = new Date(v * 1000), two = n => String(n).padStart(2, '0');
    return `${two(d.getHours())}:${two(d.getMinutes())}:${two(d.getSeconds())}.${String(d.getMilliseconds()).padStart(3, '0')}`;
  }
  return fmt(v);
}

function kv(obj) {
  return h('div', { class: 'kv' }, Object.entries(obj || {}).map(([k, v]) => [h('span', { class: 'k' }, k), h('span', {}, value(k, v))]));
}

// A compacted rollout: its trained sequences in order, the policy's summaries marked.
function segmentView(segments) {
  if (!(segments || []).length) return null;
  return [h('h3', {}, `segments (${segments.length}), each trained as its own sequence`),
    segments.map((s, i) => h('div', { class: 'segment' },
      h('div', { class: s.kind === 'summary' ? 'k' : 'muted' },
        `${i + 1}. ${s.kind === 'summary' ? 'SUMMARY (written by the policy)' : 'conversation'} · prompt ${s.prompt_tokens} · completion ${s.completion_tokens} · trained ${s.trained_tokens}`),
      h('pre', { class: 'msg' }, s.text)))];
}

function recordPanel(record, messages) {
  const facts = { reward: record.reward, raw_reward: record.raw_reward, advantage: record.advantage, outcome: record.discard_reason || 'kept',
    zero_advantage_kind: record.zero_advantage_kind, stop_reason: record.stop_reason, env_stop_reason: record.env_stop_reason,
    model_version: record.model_version,
    off_policy_steps: record.off_policy_steps, server: record.server, lane: record.lane, turns: record.num_turns,
    prompt_tokens: record.prompt_tokens, completion_tokens: record.completion_tokens };
  return h('div', {},
    h('h3', {}, `step ${record.step} · group ${record.group_id} · sample ${record.sample_id} · ${record.env}`),
    kv(facts), h('h3', {}, 'reward components (sample metrics)'), kv(record.sample_metrics),
    Object.keys(record.sample_tags || {}).length ? [h('h3', {}, 'tags'), kv(record.sample_tags)] : null,
    Object.keys(record.golden_answers || {}).length ? [h('h3', {}, 'golden answers'), kv(record.golden_answers)] : null,
    h('h3', {}, 'timings'), kv(record.timings), h('h3', {}, 'conversation'), conversationView(messages),
    segmentView(record.segments),
    (record.info_turns || []).length ? [h('h3', {}, 'environment info'), record.info_turns.map(t => h('pre', { class: 'msg' }, JSON.stringify(t, null, 1)))] : null,
    tokenView(record));
}

async function select(row) {
  ctx.detail.replaceChildren(h('p', { class: 'muted' }, 'loading…'));
  const data = await runApi(ctx.run, 'sample', { step: row.step, group: row.group_id, sample: row.sample_id });
  setParams({ group: row.group_id, sample: row.sample_id });
  ctx.detail.replaceChildren(
    h('button', { id: 'show-group', onclick: () => showGroup(row) }, `Show group ${row.group_id} side by side`),
    recordPanel(data.record, data.conversation));
}

async function showGroup(row) {
  const data = await runApi(ctx.run, 'group', { step: row.step, group: row.group_id });
  const prompt = data.rows.length ? data.rows[0].conversation.filter(m => !m.generated) : [];
  ctx.groupBox.replaceChildren(h('h2', {}, `Group ${row.group_id} of step ${row.step} (${data.rows.length} samples)`),
    h('details', {}, h('summary', {}, 'prompt'), conversationView(prompt)),
    h('div', { class: 'group-cols', id: 'group-cols' }, data.rows.map(({ record, conversation }) => h('div', { class: 'panel' },
      h('strong', {}, `#${record.sample_id} reward ${fmt(record.reward)} adv ${fmt(record.advantage)} ${record.discard_reason || ''}`),
      conversationView(conversation.filter(m => m.generated))))));
  ctx.groupBox.scrollIntoView();
}

async function load() {
  const params = { step: ctx.step };
  for (const k of FILTERS) params[k] = ctx.filters[k];
  setParams({ ...params, sort: ctx.sort, group: '', sample: '' });
  const data = await runApi(ctx.run, 'rollouts', { ...params, sort: ctx.sort });
  ctx.lastCount = data.total;
  // ctx.step stays as it was (null: the latest step), or a live run opened before its first step
  // would stay on the empty step 0
  if (!data.total && !(data.steps || []).length) { ctx.root.replaceChildren(empty('No rollouts logged yet.')); return; }
  ctx.step = data.step;
  ctx.steps = data.steps;
  ctx.detail = h('div', { class: 'panel scroll', id: 'rollout-detail' }, h('p', { class: 'muted' }, 'Click a rollout to see it in full.'));
  ctx.groupBox = h('div');
  const filtered = FILTERS.some(k => ctx.filters[k]);
  ctx.root.replaceChildren(filterControls(data), summaryPanel(data.summary, filtered),
    h('p', { class: 'muted', id: 'rollout-count' }, `${data.matched} of ${data.total} rollouts of step ${data.step}`),
    h('div', { class: 'split wide-left' }, h('div', { class: 'scroll', id: 'rollout-list' }, table(data)), ctx.detail), ctx.groupBox);
}

export async function render(main, { params, selected }) {
  if (!selected.length) { main.append(empty('No runs found.')); return; }
  ctx = { run: selected[0], step: params.step ? Number(params.step) : null, filters: {}, sort: params.sort || '', root: h('div', { id: 'rollouts' }) };
  for (const k of FILTERS) ctx.filters[k] = params[k] || '';
  main.append(ctx.root);
  await load();
  if (params.group && params.sample) {
    revealRow(Number(params.group), Number(params.sample));
    await select({ step: ctx.step, group_id: Number(params.group), sample_id: Number(params.sample) });
  }
}

export async function refresh({ changed, revisions }) {
  if (!ctx) return;
  // A live run's latest step may still be filling: reload the list when its count may have changed.
  if (ctx.lastCount === 0 && changed(['metrics'])) { await load(); return; }
  // Newer steps: offered in the step picker (and by ›), the list shown stays as it is. Every step
  // logged since is asked for: steps can finish faster than the poll, which sees only the latest.
  const latest = (revisions[ctx.run] || {}).step, steps = ctx.steps || [];
  const select = document.getElementById('step');
  if (select && steps.length && typeof latest === 'number' && latest > steps[steps.length - 1]) {
    const data = await runApi(ctx.run, 'rollouts', { step: ctx.step });
    for (const s of data.steps || []) {
      if (s > steps[steps.length - 1]) { steps.push(s); select.append(h('option', { value: s }, s)); }
    }
  }
}
