// A static SVG line chart drawn while plotly.min.js is still compiling (a second or more on a
// busy machine): the page shows its data at once, and plot() swaps in the interactive plotly
// chart (hover, zoom) when plotly is ready. Lines only, the y range as plotly would use it.
const NS = 'http://www.w3.org/2000/svg';
const M = { l: 48, r: 12, t: 28, b: 32 };

function svg(tag, attrs, text) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  if (text !== undefined) el.textContent = text;
  return el;
}

function extent(values) {
  let lo = Infinity, hi = -Infinity;
  for (const v of values) if (typeof v === 'number' && Number.isFinite(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  return lo <= hi ? [lo, hi] : null;
}

const label = v => (Math.abs(v) >= 1e4 || (Math.abs(v) < 1e-2 && v !== 0) ? v.toExponential(1) : String(+v.toFixed(3)));

export function drawPreview(el, traces, layout) {
  const w = el.clientWidth || 340, h = el.clientHeight || 230;
  const xs = extent(traces.flatMap(t => t.x || [])), auto = extent(traces.flatMap(t => t.y || []));
  const ys = layout.yaxis && layout.yaxis.range ? layout.yaxis.range : auto;
  const root = svg('svg', { class: 'preview-svg', width: w, height: h, viewBox: `0 0 ${w} ${h}` });
  const title = layout.title && layout.title.text;
  if (title) root.append(svg('text', { x: M.l * 0.4, y: 16, 'font-size': 12 }, title));
  if (xs && ys) {
    const sx = v => M.l + ((v - xs[0]) / (xs[1] - xs[0] || 1)) * (w - M.l - M.r);
    const sy = v => h - M.b - ((v - ys[0]) / (ys[1] - ys[0] || 1)) * (h - M.t - M.b);
    root.append(svg('rect', { x: M.l, y: M.t, width: w - M.l - M.r, height: h - M.t - M.b, fill: 'none', stroke: '#eee' }));
    for (const t of traces) {
      // a gap (null) starts a new segment, as in plotly
      const d = (t.x || []).map((x, i) => [x, t.y[i]]).reduce((acc, [x, y], i, all) => {
        if (typeof y !== 'number') return acc;
        const gap = i === 0 || typeof all[i - 1][1] !== 'number';
        return `${acc}${gap ? 'M' : 'L'}${sx(x).toFixed(1)},${sy(y).toFixed(1)}`;
      }, '');
      const line = t.line || {};
      root.append(svg('path', { d, fill: 'none', stroke: line.color || '#3856d6', 'stroke-width': line.width || 1.5, opacity: t.opacity ?? 1 }));
    }
    const text = (x, y, v, anchor) => root.append(svg('text', { x, y, 'font-size': 10, fill: '#666', 'text-anchor': anchor }, label(v)));
    text(M.l - 4, sy(ys[1]) + 4, ys[1], 'end');
    text(M.l - 4, sy(ys[0]), ys[0], 'end');
    text(M.l, h - M.b + 14, xs[0], 'start');
    text(w - M.r, h - M.b + 14, xs[1], 'end');
  }
  el.replaceChildren(root);
}
