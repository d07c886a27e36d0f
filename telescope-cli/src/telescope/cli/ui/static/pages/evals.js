// Evals: every eval metric (pass@k, pass^k, ...) over steps, one chart per eval and metric,
// and the samples of one eval run.
import { drawWhenVisible, empty, fmt, h, plot, runApi } from '../common.js';

let ctx = null;

async function showSamples(name, step) {
  const data = await runApi(ctx.run, 'eval_samples', { name, step });
  const cols = [...new Set(data.rows.flatMap(r => Object.keys(r)))].filter(c => !['name', 'step'].includes(c));
  ctx.samples.replaceChildren(h('h2', {}, `${name} at step ${step}: ${data.rows.length} samples`),
    h('div', { class: 'scroll' }, h('table', {}, h('tr', {}, cols.map(c => h('th', {}, c))),
      data.rows.map(r => h('tr', {}, cols.map(c => h('td', {}, h('div', { class: 'preview' }, typeof r[c] === 'object' ? JSON.stringify(r[c]) : fmt(r[c])))))))));
}

// Why there is nothing to show: no eval configured (the quickstart's case), or none finished yet.
async function whyEmpty() {
  const { config } = await runApi(ctx.run, 'config');
  const evals = (config && config.evals) || [];
  if (!evals.length) {
    return empty('No evals: this run\'s config has none (its evals list is empty). Add one to the run config, '
      + 'e.g. evals: [{name: <an eval or environment>, eval_every: 10}], to chart its pass@k and other metrics over steps here.');
  }
  const periodic = config.eval_num_servers === 0 ? null : evals.map(e => `${e.name} every ${e.eval_every ?? 10} steps`).join(', ');
  const when = [periodic, config.eval_before_training !== false ? 'before training' : null,
    config.eval_after_training !== false ? 'after training' : null].filter(Boolean);
  return empty(`No eval results yet (evals/metrics.jsonl). Evals run: ${when.join('; ') || 'never (no periodic evals, none before or after training)'}.`);
}

async function draw(records) {
  if (!records.length) { ctx.root.replaceChildren(await whyEmpty()); return; }
  const byName = new Map();
  for (const r of records) { if (!byName.has(r.name)) byName.set(r.name, []); byName.get(r.name).push(r); }
  const blocks = [...byName.entries()].sort().map(([name, recs]) => {
    recs.sort((a, b) => a.step - b.step);
    const metrics = [...new Set(recs.flatMap(r => Object.keys(r.metrics || {})))].sort();
    return h('details', { class: 'section', open: true }, h('summary', {}, `${name} (${recs.length} runs)`),
      h('div', { class: 'grid' }, metrics.map(m => {
        const el = h('div', { class: 'chart', 'data-key': `${name}/${m}` });
        drawWhenVisible(el, async () => {
          await plot(el, [{ x: recs.map(r => r.step), y: recs.map(r => (r.metrics || {})[m] ?? null), mode: 'lines+markers', name: m }],
            { title: { text: `${name} · ${m}`, font: { size: 12 }, x: 0.02 }, xaxis: { title: { text: 'step' } } });
          el.on && el.on('plotly_click', ev => showSamples(name, ev.points[0].x));
        });
        return el;
      })),
      h('table', {}, h('tr', {}, ['step', 'samples', ...metrics].map(t => h('th', {}, t))),
        recs.map(r => h('tr', { class: 'clickable', onclick: () => showSamples(name, r.step) }, h('td', {}, r.step), h('td', {}, r.samples),
          metrics.map(m => h('td', { class: 'num' }, fmt((r.metrics || {})[m])))))));
  });
  ctx.root.replaceChildren(...blocks, ctx.samples);
}

export async function render(main, { selected }) {
  if (!selected.length) { main.append(empty('No runs found.')); return; }
  ctx = { run: selected[0], root: h('div', { id: 'evals' }), samples: h('div') };
  main.append(ctx.root);
  await draw((await runApi(ctx.run, 'evals')).records);
}

export async function refresh({ changed }) {
  if (ctx && changed(['evals'])) await draw((await runApi(ctx.run, 'evals')).records);
}
