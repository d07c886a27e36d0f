// Shared helpers of every page: the API client, a tiny element builder, the hash route,
// and chart helpers over Plotly (served from the installed plotly package).
import { drawPreview } from './preview.js';

export async function api(path, params = {}) {
  const query = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== '') query.set(k, v);
  }
  const response = await fetch(path + (query.toString() ? '?' + query : ''));
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

export function runApi(run, name, params) {
  return api(`/api/runs/${encodeURIComponent(run)}/${name}`, params);
}

// h('div', {class: 'x', onclick: fn}, child, 'text', [more children])
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'value') el.value = v;
    else el.setAttribute(k, v === true ? '' : v);
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

// The route: '#/page?a=1&b=2' -> {page, params}
export function currentRoute() {
  const [path, query] = location.hash.replace(/^#\/?/, '').split('?');
  return { page: path || 'runs', params: Object.fromEntries(new URLSearchParams(query || '')) };
}

// Keep the page's state in the URL (deep links) without re-rendering the page.
export function setParams(patch) {
  const { page, params } = currentRoute();
  const next = { ...params, ...patch };
  for (const k of Object.keys(next)) if (next[k] === '' || next[k] === null || next[k] === undefined) delete next[k];
  const query = new URLSearchParams(next).toString();
  history.replaceState(null, '', `#/${page}${query ? '?' + query : ''}`);
}

export function fmt(value, digits = 4) {
  if (value === null || value === undefined) return '–';
  if (typeof value === 'number') {
    if (Number.isInteger(value)) return String(value);
    return Math.abs(value) >= 1e5 || (Math.abs(value) < 1e-3 && value !== 0) ? value.toExponential(2) : value.toFixed(digits);
  }
  return String(value);
}

export function fmtTime(unix) {
  return unix ? new Date(unix * 1000).toLocaleString() : '–';
}

export function debounce(fn, ms = 300) {
  let timer;
  return (...args) => { clearTimeout(timer); timer = setTimeout(() => fn(...args), ms); };
}

// Exponential moving average (the usual "smoothing" slider), nulls kept as gaps.
export function smooth(values, weight) {
  if (!weight) return values;
  let last = null;
  return values.map(v => {
    if (v === null || v === undefined) return null;
    last = last === null ? v : last * weight + (1 - weight) * v;
    return last;
  });
}

// A metric's unit, from its name's conventions (timing_* in seconds, *_gb, *_percent, tokens/...),
// shown after its chart's title: '' when the name does not say. First match wins.
const UNITS = [
  [/tokens_per_s$/, 'tokens/s'],
  [/^timing[_/]|_s$|_seconds(_mean|_total)?$/, 's'],
  [/_gb$/, 'GB'], [/_mb$/, 'MB'], [/(^|[/_])bytes$/, 'bytes'],
  [/_percent$|(^|[/_])pct$/, '%'],
  [/_w$/, 'W'], [/_c$/, '°C'], [/_mhz$/, 'MHz'],
  [/(^|\/)tokens(\/|$)|_tokens(_total)?$/, 'tokens'],
];
export function unitOf(key) {
  const found = UNITS.find(([re]) => re.test(key));
  return found ? found[1] : '';
}
export const titled = key => (unitOf(key) ? `${key} (${unitOf(key)})` : key);

export const COLORS = ['#3856d6', '#e4572e', '#17a398', '#f3a712', '#8d5fd3', '#29335c', '#db3a34', '#4c956c'];

export const LAYOUT = {
  margin: { l: 48, r: 12, t: 28, b: 32 }, font: { size: 11 }, showlegend: false,
  paper_bgcolor: '#fff', plot_bgcolor: '#fff', hovermode: 'x unified',
  xaxis: { gridcolor: '#eee', zeroline: false }, yaxis: { gridcolor: '#eee', zeroline: false },
};

export const CONFIG = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ['select2d', 'lasso2d'] };

// plotly.min.js (preloaded by index.html) runs when loadPlotly() adds its tag: app.js calls it
// once the page has its data and its first charts are drawn as previews, since compiling 4.8 MB
// blocks the page's scripts for a second or more. plotlyReady resolves once it has run, or
// failed to load.
let plotlyLoaded;
const plotlyReady = new Promise(resolve => { plotlyLoaded = resolve; }).then(() => performance.mark('plotly-ready'));

export function loadPlotly() {
  if (document.getElementById('plotly-js')) return plotlyReady;
  const tag = document.createElement('script');
  tag.id = 'plotly-js';
  tag.src = '/vendor/plotly.min.js';
  tag.addEventListener('load', plotlyLoaded);
  tag.addEventListener('error', plotlyLoaded);
  document.head.append(tag);
  return plotlyReady;
}

// Draws with plotly; until plotly has run, a static preview of the same traces (preview.js),
// replaced by the plotly chart (with the latest traces) through the draw queue once it is ready.
export async function plot(el, traces, layout = {}) {
  const merged = { ...LAYOUT, ...layout, xaxis: { ...LAYOUT.xaxis, ...(layout.xaxis || {}) },
                   yaxis: { ...LAYOUT.yaxis, ...(layout.yaxis || {}) } };
  if (window.Plotly) {
    // a preview still waiting for its queued swap: hand it these traces rather than drawing twice
    if (el._pending) { el._pending = { traces, merged }; return; }
    return react(el, traces, merged);
  }
  if (!traces.every(previewable)) {
    await loadPlotly();
    if (!window.Plotly) { el.textContent = 'plotly is not installed: pip install "telescope-cli[ui]"'; return; }
    return react(el, traces, merged);
  }
  const waiting = el._pending;
  el._pending = { traces, merged };
  drawPreview(el, traces, merged);
  if (!performance.getEntriesByName('first-preview').length) performance.mark('first-preview');
  if (waiting) return;  // its upgrade is queued already and draws the latest traces
  plotlyReady.then(() => enqueue(() => {
    const { traces: t, merged: m } = el._pending;
    delete el._pending;
    if (!el.isConnected) return;
    if (!window.Plotly) { el.textContent = 'plotly is not installed: pip install "telescope-cli[ui]"'; return; }
    el.replaceChildren();
    return react(el, t, m);
  }));
}

const previewable = t => (!t.type || t.type === 'scatter') && (t.mode || 'lines').includes('lines') && Array.isArray(t.x) && Array.isArray(t.y);

async function react(el, traces, layout) {
  const drawn = await Plotly.react(el, traces, layout, CONFIG);
  if (el._afterPlot) el._afterPlot();  // a page's listeners (zoom memory, synced hover) on the plotly chart
  // bench/ui.py reads these marks: where the page's first seconds went
  if (!performance.getEntriesByName('first-chart').length) performance.mark('first-chart');
  return drawn;
}

// Draw a chart the first time it scrolls into view (pages with hundreds of metrics stay fast),
// one chart per task so the first shows at once and the page stays responsive meanwhile.
const drawers = new WeakMap();
const queue = [];
let draining = false;
async function drain() {
  draining = true;
  while (queue.length) {
    // a chart whose element left the page mid-draw may never settle: do not wait on it forever
    const timeout = new Promise(resolve => setTimeout(resolve, 5000));
    try { await Promise.race([queue.shift()(), timeout]); } catch (err) { console.warn('chart not drawn:', err); }
    await new Promise(resolve => setTimeout(resolve, 0));
  }
  draining = false;
}
function enqueue(draw) {
  queue.push(draw);
  if (!draining) drain();
}
const observer = new IntersectionObserver(entries => {
  for (const entry of entries) {
    if (!entry.isIntersecting) continue;
    const draw = drawers.get(entry.target);
    if (draw) { drawers.delete(entry.target); observer.unobserve(entry.target); enqueue(draw); }
  }
}, { rootMargin: '200px' });

// Resolves once the charts in view have been drawn (previews, before plotly has run).
export function drawsSettled() {
  return new Promise(resolve => {
    const check = () => (draining || queue.length ? setTimeout(check, 10) : resolve());
    requestAnimationFrame(() => setTimeout(check, 0));
  });
}

export function drawWhenVisible(el, draw) {
  if (el.dataset.drawn) { draw(); return; }
  drawers.set(el, () => { if (!el.isConnected) return; el.dataset.drawn = '1'; return draw(); });
  observer.observe(el);
}

export function empty(text) {
  return h('p', { class: 'muted' }, text);
}
