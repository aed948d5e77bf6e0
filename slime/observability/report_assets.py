"""The inline CSS and JavaScript of `slime report`'s page (slime.observability.report).

Plain browser JavaScript, no library: SVG line charts with a shared, drag-to-zoom x range and
hover read-outs; the rollout browser; the machine and wall-time tables (the summary and the
arguments are static HTML from Python). The page's data is the JSON in `<script id="report-data">`.
A chart's full view uses the axes Python computed (report_ticks); a zoomed view computes them with
TICKS_JS, the same algorithm (tests/observability/test_report_ticks.py runs it under node).
Elements the browser test looks for: `svg.chart` with `circle.pt` data points and `text.ytick` /
`text.xtick` labels, `.group` per logged group, `.sample` per sample, `.tok.m1` / `.tok.m0` tokens.
"""

PAGE_CSS = r"""
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;padding:0 18px 40px;color:#1d2330;background:#fafbfc}
header{background:#fafbfc;border-bottom:1px solid #dde;padding:8px 0}
h1{font-size:18px;margin:4px 0}h2{font-size:16px;margin:22px 0 8px;border-bottom:1px solid #e3e6ea}
.sub{color:#667;font-size:12px}nav a{margin-right:14px;font-size:13px}
.notes{background:#fff7d6;border:1px solid #e8d48a;padding:4px 12px;margin-top:12px}.notes h2{border:0;margin:6px 0}
.hint{color:#667;font-size:12px;margin-bottom:6px}
.charts{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start}
.chart-box{background:#fff;border:1px solid #e3e6ea;border-radius:6px;padding:6px}
.chart-box h3{font-size:13px;margin:2px 4px 4px}
svg.chart{display:block;user-select:none;cursor:crosshair}
svg.chart .axis{stroke:#99a;stroke-width:1}svg.chart text{font-size:10px;fill:#556}
svg.chart .grid{stroke:#eef0f3}svg.chart .line{fill:none;stroke-width:1.6}
svg.chart .hover{stroke:#888;stroke-dasharray:3 3}svg.chart .brush{fill:rgba(70,120,220,.15)}
.legend-row{font-size:11px;margin:2px 4px}.legend-row span{margin-right:10px;white-space:nowrap}
.legend-row i{display:inline-block;width:10px;height:3px;margin-right:4px;vertical-align:middle}
.empty{color:#889;font-size:12px;padding:20px}
.tooltip{position:fixed;pointer-events:none;background:#222a;color:#fff;padding:4px 8px;border-radius:4px;font-size:12px;display:none;z-index:20;white-space:pre}
.controls{margin-bottom:8px}.controls label{margin-right:10px}
.browser{display:flex;gap:12px;align-items:flex-start}
.groups{flex:1 1 45%;max-height:80vh;overflow:auto}.detail{flex:1 1 55%;background:#fff;border:1px solid #e3e6ea;border-radius:6px;padding:8px;max-height:80vh;overflow:auto}
.group{background:#fff;border:1px solid #e3e6ea;border-radius:6px;margin-bottom:8px;padding:6px}
.group .prompt{white-space:pre-wrap;font-family:ui-monospace,Menlo,monospace;font-size:12px;color:#334;max-height:6em;overflow:auto;background:#f5f6f8;padding:4px}
.sample{display:flex;gap:10px;padding:3px 4px;border-top:1px solid #f0f1f3;cursor:pointer;font-size:12px}
.sample:hover,.sample.sel{background:#eef4ff}.sample .resp{flex:1;white-space:nowrap;overflow:hidden;text-overflow:ellipsis;font-family:ui-monospace,Menlo,monospace}
.status{padding:0 5px;border-radius:3px;font-size:11px}.st-completed{background:#dff3e4}.st-truncated{background:#fde9cf}
.st-failed{background:#f9d3d3;color:#900;font-weight:bold}.st-aborted{background:#e6e0f5}.st-pending{background:#eee}
.tokens{font-family:ui-monospace,Menlo,monospace;font-size:12px;line-height:1.9;white-space:pre-wrap;word-break:break-all}
.tok{border-radius:2px;padding:1px 0;margin:0 .5px}
.tok.m1{background:rgba(40,110,230,var(--a,.25))}.tok.m0{background:rgba(230,140,20,var(--a,.35));outline:1px dashed #c80}
.turn{border-left:3px solid #9ab;margin:6px 0;padding:2px 8px}.turn.env{border-color:#e8a33d;background:#fffaf1}
.turn h4{margin:2px 0;font-size:12px;color:#556}
.error{background:#fde8e8;border:1px solid #e99;color:#800;padding:6px;white-space:pre-wrap;font-size:12px}
.rollout-note{color:#8a5a00;font-size:12px;margin:4px 0}
table.kv{border-collapse:collapse;font-size:12px;margin-bottom:10px}table.kv td,table.kv th{border:1px solid #e3e6ea;padding:2px 8px;text-align:left;vertical-align:top}
table.kv th{background:#f1f3f6}details{margin:6px 0}
.tok.bytes{color:#7a2e8c;font-size:10px}
#summary .stage-sum{background:#fff;border:1px solid #e3e6ea;border-radius:6px;padding:4px 12px 10px;margin-bottom:10px}
#summary h3{font-size:14px;margin:6px 0}#summary .at{color:#889;font-size:11px}#summary td.final{font-weight:bold}
#summary .trend{margin:6px 0}.timebar{display:flex;height:14px;max-width:640px;border-radius:3px;overflow:hidden;background:#eef0f3;margin:6px 0 2px}
.timebar .seg{display:block;height:100%}.timetext{font-size:12px;color:#445}.timetext i{display:inline-block;width:9px;height:9px;margin-right:3px;border-radius:2px}
.t-0{background:#9aa5b1}.t-1{background:#2a6fdb}.t-2{background:#e0662b}.t-3{background:#2f9e44}.t-4{background:#b8336a}.t-5{background:#d6d9de}
"""

# The tick algorithm of slime/observability/report_ticks.py, for zoomed views (kept equal: a test runs both).
TICKS_JS = r"""
function pow10(e){ return e >= 0 ? Math.pow(10, e) : 1 / Math.pow(10, -e); }
function niceStep(span, n, minStep){ const raw = Math.max(span / n, minStep || 0); let e = Math.floor(Math.log10(raw));
  const norm = raw / pow10(e); let m = norm >= Math.sqrt(50) ? 10 : norm >= Math.sqrt(10) ? 5 : norm >= Math.sqrt(2) ? 2 : 1; if (m === 10){ m = 1; e += 1; } return [m, e]; }
function tickLabel(n, e, exponent){ if (n === 0) return '0'; const sign = n < 0 ? '-' : ''; let digits = String(Math.abs(n));
  if (exponent) return sign + digits[0] + (digits.length > 1 ? '.' + digits.slice(1) : '') + 'e' + (digits.length - 1 + e);
  if (e >= 0) return sign + digits + '0'.repeat(e);
  digits = digits.padStart(-e + 1, '0'); return sign + digits.slice(0, digits.length + e) + '.' + digits.slice(digits.length + e); }
function axisTicks(lo, hi, n, minStep){ if (!(isFinite(lo) && isFinite(hi)) || hi <= lo) return [];
  const [m, e] = niceStep(hi - lo, n, minStep); const step = m * pow10(e);
  const first = Math.ceil(lo / step - 1e-9), last = Math.floor(hi / step + 1e-9);
  if (Math.max(Math.abs(first), Math.abs(last)) > 1e15) return [];  // too narrow for its magnitude
  const biggest = Math.max(Math.abs(first), Math.abs(last)) * m * pow10(e); const exponent = biggest >= 1e6 || (biggest < 1e-3 && e < -4); const out = [];
  for (let k = first; k <= last; k++) out.push([k * m * pow10(e), tickLabel(k * m, e, exponent)]); return out; }
function yRange(lo, hi){ if (lo === hi){ const l = lo, h = hi; lo = l - Math.abs(l) * 0.1 - 0.5; hi = h + Math.abs(h) * 0.1 + 0.5; }
  const pad = (hi - lo) * 0.06; return [lo - pad, hi + pad]; }
"""


PAGE_JS = (
    r"""
(function(){
'use strict';"""
    + TICKS_JS
    + r"""
const D = JSON.parse(document.getElementById('report-data').textContent);
const COLORS = ['#2a6fdb','#e0662b','#2f9e44','#b8336a','#7950f2','#0b8a8a','#a67c00','#555'];
const tip = document.getElementById('tooltip');
let xDomain = null;  // shared zoom [x0, x1] or null
const charts = [];

function el(tag, attrs, text){ const e = document.createElement(tag);
  for (const k in (attrs||{})) e.setAttribute(k, attrs[k]); if (text !== undefined) e.textContent = text; return e; }
function svgEl(tag, attrs){ const e = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const k in (attrs||{})) e.setAttribute(k, attrs[k]); return e; }
// values read out on hover and in tables: 6 significant digits, so close values stay apart
function fmt(v){ if (v === null || v === undefined) return '–'; if (typeof v !== 'number') return String(v);
  const a = Math.abs(v); if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(4); return (+v.toPrecision(6)).toString(); }
function showTip(evt, text){ tip.textContent = text; tip.style.display = 'block';
  tip.style.left = (evt.clientX + 14) + 'px'; tip.style.top = (evt.clientY + 10) + 'px'; }
function hideTip(){ tip.style.display = 'none'; }

// ---- charts ------------------------------------------------------------------------------
function makeChart(container, title, keys, axes){
  const box = el('div', {'class': 'chart-box', 'data-title': title}); box.appendChild(el('h3', {}, title));
  const W = 460, H = 220, M = {l: 52, r: 10, t: 8, b: 26};
  const svg = svgEl('svg', {'class': 'chart', width: W, height: H, viewBox: `0 0 ${W} ${H}`});
  box.appendChild(svg);
  const legend = el('div', {'class': 'legend-row'});
  keys.forEach((k, i) => { const s = el('span'); const sw = el('i'); sw.style.background = COLORS[i % COLORS.length];
    s.appendChild(sw); s.appendChild(document.createTextNode(k)); legend.appendChild(s); });
  box.appendChild(legend); container.appendChild(box);
  const ch = {svg, keys, W, H, M, box, axes}; charts.push(ch); drawChart(ch); attachInteraction(ch); return ch;
}
function drawChart(ch){
  const {svg, keys, W, H, M} = ch; while (svg.firstChild) svg.removeChild(svg.firstChild);
  let all = []; keys.forEach(k => (D.series[k] || []).forEach(p => all.push(p)));
  let xs = all.map(p => p[0]);
  if (!xs.length){ const t = svgEl('text', {x: W / 2, y: H / 2, 'text-anchor': 'middle'}); t.textContent = 'no data';
    svg.appendChild(t); svg.setAttribute('data-points', '0'); ch.scale = null; return; }
  const ax = (!xDomain && ch.axes) ? ch.axes : zoomedAxes(all, xs); const {x0, x1, y0, y1} = ax;
  const sx = x => M.l + (x - x0) / (x1 - x0) * (W - M.l - M.r), sy = y => H - M.b - (y - y0) / (y1 - y0) * (H - M.t - M.b);
  ch.scale = {x0, x1, sx, inv: px => x0 + (px - M.l) / (W - M.l - M.r) * (x1 - x0)};
  ax.yticks.forEach(([t, label]) => { svg.appendChild(svgEl('line', {'class': 'grid', x1: M.l, x2: W - M.r, y1: sy(t), y2: sy(t)}));
    const tx = svgEl('text', {'class': 'ytick', x: M.l - 4, y: sy(t) + 3, 'text-anchor': 'end'}); tx.textContent = label; svg.appendChild(tx); });
  ax.xticks.forEach(([t, label]) => {  // steps are whole numbers: min step 1
    const tx = svgEl('text', {'class': 'xtick', x: sx(t), y: H - M.b + 13, 'text-anchor': 'middle'}); tx.textContent = label; svg.appendChild(tx); });
  svg.appendChild(svgEl('line', {'class': 'axis', x1: M.l, x2: M.l, y1: M.t, y2: H - M.b}));
  svg.appendChild(svgEl('line', {'class': 'axis', x1: M.l, x2: W - M.r, y1: H - M.b, y2: H - M.b}));
  const clipId = 'clip' + charts.indexOf(ch);
  const defs = svgEl('defs'); const cp = svgEl('clipPath', {id: clipId});
  cp.appendChild(svgEl('rect', {x: M.l, y: M.t - 3, width: W - M.l - M.r, height: H - M.t - M.b + 6})); defs.appendChild(cp); svg.appendChild(defs);
  const g = svgEl('g', {'clip-path': `url(#${clipId})`}); svg.appendChild(g);
  let n = 0;
  keys.forEach((k, i) => { const pts = (D.series[k] || []); const c = COLORS[i % COLORS.length];
    if (pts.length > 1) g.appendChild(svgEl('polyline', {'class': 'line', stroke: c, points: pts.map(p => `${sx(p[0])},${sy(p[1])}`).join(' ')}));
    pts.forEach(p => { if (p[0] < x0 || p[0] > x1) return; n++;
      g.appendChild(svgEl('circle', {'class': 'pt', cx: sx(p[0]), cy: sy(p[1]), r: 2.6, fill: c, 'data-key': k, 'data-x': p[0], 'data-y': p[1]})); }); });
  svg.setAttribute('data-points', String(n));
  ch.hover = svgEl('line', {'class': 'hover', y1: M.t, y2: H - M.b, x1: -10, x2: -10}); svg.appendChild(ch.hover);
  ch.brush = svgEl('rect', {'class': 'brush', y: M.t, height: H - M.t - M.b, x: 0, width: 0}); svg.appendChild(ch.brush);
}
// a zoomed view: the x range dragged, the y range of the points in it (the full view's axes come from Python)
function zoomedAxes(all, xs){
  let x0 = Math.min(...xs), x1 = Math.max(...xs);
  if (xDomain){ x0 = xDomain[0]; x1 = xDomain[1]; }
  const vis = all.filter(p => p[0] >= x0 && p[0] <= x1);
  const ys = (vis.length ? vis : all).map(p => p[1]); const [y0, y1] = yRange(Math.min(...ys), Math.max(...ys));
  if (x0 === x1){ x0 -= 0.5; x1 += 0.5; }
  return {x0, x1, y0, y1, yticks: axisTicks(y0, y1, 4), xticks: axisTicks(x0, x1, 6, 1)};
}
function attachInteraction(ch){
  const svg = ch.svg; let drag = null;
  const px = evt => { const r = svg.getBoundingClientRect(); return (evt.clientX - r.left) * ch.W / r.width; };
  svg.addEventListener('mousedown', evt => { if (!ch.scale) return; drag = px(evt); evt.preventDefault(); });
  svg.addEventListener('mousemove', evt => {
    if (!ch.scale) return; const p = px(evt);
    if (drag !== null){ ch.brush.setAttribute('x', Math.min(drag, p)); ch.brush.setAttribute('width', Math.abs(p - drag)); }
    const x = ch.scale.inv(p); let best = null;
    ch.keys.forEach(k => (D.series[k] || []).forEach(pt => { if (pt[0] < ch.scale.x0 || pt[0] > ch.scale.x1) return;
      if (best === null || Math.abs(pt[0] - x) < Math.abs(best - x)) best = pt[0]; }));
    if (best === null){ hideTip(); return; }
    ch.hover.setAttribute('x1', ch.scale.sx(best)); ch.hover.setAttribute('x2', ch.scale.sx(best));
    const lines = [`step ${best}`];
    ch.keys.forEach(k => { const pt = (D.series[k] || []).find(q => q[0] === best);
      if (pt) lines.push(`${k} = ${fmt(pt[1])}` + (pt[3] ? `  [${pt[3]}]` : '')); });
    showTip(evt, lines.join('\n'));
  });
  svg.addEventListener('mouseleave', () => { hideTip(); ch.hover.setAttribute('x1', -10); ch.hover.setAttribute('x2', -10); });
  window.addEventListener('mouseup', evt => { if (drag === null) return; const p = px(evt), d0 = drag; drag = null;
    ch.brush.setAttribute('width', 0); if (!ch.scale || Math.abs(p - d0) < 4) return;  // a click, not a drag
    setZoom([ch.scale.inv(Math.min(d0, p)), ch.scale.inv(Math.max(d0, p))]); });
  svg.addEventListener('dblclick', () => setZoom(null));
}
function setZoom(dom){ xDomain = dom; charts.forEach(drawChart); }

function buildCharts(){
  const host = document.getElementById('charts'); const used = new Set();
  // only panels with metrics this run logged come here (report.py leaves the others out)
  D.panels.forEach(p => { p.keys.forEach(k => used.add(k)); makeChart(host, p.title, p.keys, p.axes); });
  const sel = document.getElementById('any-metric'); const anyHost = document.getElementById('any-chart');
  sel.appendChild(el('option', {value: ''}, '(choose)'));
  D.all_keys.forEach(k => sel.appendChild(el('option', {value: k}, k + (used.has(k) ? '' : ' *'))));
  sel.addEventListener('change', () => { const idx = charts.findIndex(c => c.box.parentNode === anyHost);
    if (idx >= 0){ anyHost.removeChild(charts[idx].box); charts.splice(idx, 1); }
    if (sel.value) makeChart(anyHost, sel.value, [sel.value], D.key_axes[sel.value]); });
  document.getElementById('reset-zoom').addEventListener('click', () => setZoom(null));
}

// ---- rollout browser -----------------------------------------------------------------------
const STATUSES = ['completed', 'truncated', 'aborted', 'failed', 'pending'];
const statusOn = {}; STATUSES.forEach(s => statusOn[s] = true);
let current = null, selected = null;

function meanAdv(s){ const a = s.advantages; if (!a || !a.length) return null; const m = s.loss_mask || [];
  let sum = 0, n = 0; a.forEach((v, i) => { if (v !== null && (m[i] === undefined || m[i])) { sum += v; n++; } });
  return n ? sum / n : null; }
function rewardOf(s){ return (typeof s.reward === 'number') ? s.reward : null; }
function passes(s){ if (!statusOn[s.status] && STATUSES.includes(s.status)) return false;
  const lo = parseFloat(document.getElementById('reward-min').value), hi = parseFloat(document.getElementById('reward-max').value);
  const r = rewardOf(s); if (!isNaN(lo) && (r === null || r < lo)) return false; if (!isNaN(hi) && (r === null || r > hi)) return false; return true; }
function promptText(p){ if (typeof p === 'string') return p; if (Array.isArray(p)) return p.map(m => `[${m.role || '?'}] ${m.content === undefined ? JSON.stringify(m) : (typeof m.content === 'string' ? m.content : JSON.stringify(m.content))}`).join('\n'); return JSON.stringify(p); }

function buildBrowser(){
  const sel = document.getElementById('rollout-select');
  if (!D.rollouts.length){ sel.appendChild(el('option', {value: ''}, '(no sample log)'));
    document.getElementById('groups').appendChild(el('div', {'class': 'empty'}, 'No sample log in this run directory.')); }
  D.rollouts.forEach((r, i) => sel.appendChild(el('option', {value: String(i)},
    (r.kind === 'eval' ? (r.rollout_id < 0 ? 'eval before training' : `eval after rollout ${r.rollout_id}`)
      : `rollout ${r.rollout_id} (metrics step ${r.rollout_id + 1})`) + (r.stage ? ` [${r.stage}]` : ''))));
  const sf = document.getElementById('status-filters');
  STATUSES.forEach(s => { const lab = el('label'); const cb = el('input', {type: 'checkbox', 'data-status': s}); cb.checked = true;
    cb.addEventListener('change', () => { statusOn[s] = cb.checked; renderGroups(); });
    lab.appendChild(cb); lab.appendChild(el('span', {'class': 'status st-' + s}, s)); sf.appendChild(lab); });
  ['reward-min', 'reward-max'].forEach(id => document.getElementById(id).addEventListener('input', renderGroups));
  sel.addEventListener('change', () => selectRollout(sel.value === '' ? null : D.rollouts[+sel.value]));
  // the latest training rollout first
  let start = D.rollouts.length - 1; for (let i = D.rollouts.length - 1; i >= 0; i--) if (D.rollouts[i].kind === 'rollout'){ start = i; break; }
  if (start >= 0){ sel.value = String(start); selectRollout(D.rollouts[start]); }
}
function selectRollout(r){ current = r; selected = null; renderGroups();
  document.getElementById('sample-detail').innerHTML = '<em>Click a sample to see its tokens.</em>'; }
function renderGroups(){
  const host = document.getElementById('groups'); host.innerHTML = ''; const note = document.getElementById('rollout-note');
  if (!current){ note.textContent = ''; return; }
  const parts = [`${current.groups.length} of ${current.num_groups} groups logged (${current.num_samples} samples in the rollout)`];
  if (current.kind === 'rollout' && !current.has_advantages) parts.push('no advantages recorded (SFT, rollout-only, or the trainer has not reached this rollout)');
  if (current.num_failed_logged) parts.push(`${current.num_failed_logged} FAILED sample(s): kept and counted, never trained on`);
  note.textContent = parts.join(' · ');
  let shown = 0;
  current.groups.forEach(g => {
    const box = el('div', {'class': 'group', 'data-group': g.group});
    const rs = g.samples.map(rewardOf).filter(v => v !== null); const mr = rs.length ? rs.reduce((a, b) => a + b, 0) / rs.length : null;
    box.appendChild(el('div', {'class': 'ghead'}, `group ${g.group}${g.dataset ? ' · ' + g.dataset : ''} · ${g.samples.length} samples · mean reward ${fmt(mr)}` + (g.samples[0] && g.samples[0].label != null ? ` · label ${g.samples[0].label}` : '')));
    box.appendChild(el('div', {'class': 'prompt'}, g.samples.length ? promptText(g.samples[0].prompt) : ''));
    let visible = 0;
    g.samples.forEach((s, j) => { if (!passes(s)) return; visible++;
      const row = el('div', {'class': 'sample', 'data-status': s.status});
      row.appendChild(el('span', {'class': 'status st-' + s.status}, s.status));
      row.appendChild(el('span', {}, `r=${fmt(rewardOf(s))}`));
      const ma = meanAdv(s); row.appendChild(el('span', {}, `adv=${fmt(ma)}`));
      row.appendChild(el('span', {}, `w=${(s.weight_versions || []).join(',') || '–'}`));
      row.appendChild(el('span', {}, `${s.response_length} tok`));
      row.appendChild(el('span', {'class': 'resp'}, s.status === 'failed' && s.error ? s.error : s.response));
      row.addEventListener('click', () => { if (selected) selected.classList.remove('sel'); selected = row; row.classList.add('sel'); showSample(g, s, j); });
      box.appendChild(row); });
    if (!visible) box.appendChild(el('div', {'class': 'empty'}, 'no sample passes the filters'));
    host.appendChild(box); shown++;
  });
}
function tokSpan(s, i){
  const m = (s.loss_mask && s.loss_mask[i] !== undefined) ? s.loss_mask[i] : 1;
  const lp = s.log_probs ? s.log_probs[i] : null; const text = s.response_tokens ? s.response_tokens[i] : `⟨${s.response_ids[i]}⟩`;
  const sp = el('span', {'class': 'tok m' + (m ? 1 : 0)}, text);
  if (/^(<0x[0-9A-F]{2}>)+$/.test(text)) sp.classList.add('bytes');  // part of a character: its bytes
  // trained tokens: darker = less likely under the engine (alpha grows with 1 - p)
  if (m && lp !== null && lp !== undefined) sp.style.setProperty('--a', (0.12 + 0.78 * (1 - Math.exp(lp))).toFixed(3));
  const adv = s.advantages ? s.advantages[i] : null;
  sp.title = `#${i} id ${s.response_ids[i]} ${JSON.stringify(text)}\nloss_mask ${m}` + (lp !== null && lp !== undefined ? `\nlog-prob ${fmt(lp)} (p=${fmt(Math.exp(lp))})` : '') + (adv !== null && adv !== undefined ? `\nadvantage ${fmt(adv)}` : '');
  return sp;
}
function tokenBlock(s, a, b){ const d = el('div', {'class': 'tokens'}); for (let i = a; i < b; i++) d.appendChild(tokSpan(s, i)); return d; }
function kvTable(rows){ const t = el('table', {'class': 'kv'}); rows.forEach(([k, v]) => { const tr = el('tr'); tr.appendChild(el('th', {}, k));
  tr.appendChild(el('td', {}, typeof v === 'string' ? v : JSON.stringify(v))); t.appendChild(tr); }); return t; }
function showSample(g, s, j){
  const host = document.getElementById('sample-detail'); host.innerHTML = '';
  host.appendChild(el('h3', {}, `group ${g.group} · sample ${j} (index ${s.index})`));
  if (s.status === 'failed') host.appendChild(el('div', {'class': 'error'}, 'FAILED (never trained on): ' + (s.error || 'no error recorded')));
  host.appendChild(kvTable([['status', s.status + (s.stop_reason ? ` (${s.stop_reason})` : '')], ['reward', fmt(rewardOf(s))],
    ['reward (as returned)', s.reward_raw], ['advantage (mean over trained tokens)', fmt(meanAdv(s))],
    ['weight versions', (s.weight_versions || []).join(', ') || '–'], ['label', s.label],
    ['prompt / response tokens', `${s.prompt_length} / ${s.response_length}`],
    ['trained tokens', String((s.loss_mask || []).reduce((a, b) => a + b, 0))]].concat(s.remove_sample ? [['removed', 'by --rollout-sample-filter-path']] : [])));
  host.appendChild(el('h4', {}, 'Prompt')); host.appendChild(el('div', {'class': 'prompt tokens'}, promptText(s.prompt)));
  host.appendChild(el('h4', {}, 'Response tokens'));
  const n = (s.response_ids || []).length;
  if (s.turns && s.turns.length){
    let model = 0, env = 0, pos = 0;
    s.turns.forEach(t => { const isModel = t.role === 'model'; const box = el('div', {'class': 'turn ' + (isModel ? 'model' : 'env')});
      const head = isModel ? `model turn ${++model}` + (t.finish_reason ? ` · ${t.finish_reason}` : '') + (t.weight_version ? ` · weights ${t.weight_version}` : '')
        : `tool / environment output ${++env} (not trained on)`;
      box.appendChild(el('h4', {}, `${head} · tokens ${t.start}–${t.end}`)); box.appendChild(tokenBlock(s, Math.max(0, t.start), Math.min(n, t.end)));
      host.appendChild(box); pos = Math.max(pos, t.end); });
    if (pos < n){ const box = el('div', {'class': 'turn'}); box.appendChild(el('h4', {}, `tokens ${pos}–${n} (after the recorded turns)`)); box.appendChild(tokenBlock(s, pos, n)); host.appendChild(box); }
  } else {
    host.appendChild(tokenBlock(s, 0, n));
  }
  if (!n) host.appendChild(el('div', {'class': 'empty'}, 'no response tokens'));
  host.appendChild(el('h4', {}, 'Response text')); host.appendChild(el('div', {'class': 'prompt tokens'}, s.response || ''));
}

// ---- facts ------------------------------------------------------------------------------------
function buildFacts(){
  const host = document.getElementById('facts-body'); const f = D.facts || {};
  host.appendChild(el('h3', {}, 'Machine and versions')); host.appendChild(el('div', {'class': 'hint'}, D.facts_source));
  const rows = Object.entries(f.versions || {}).map(([k, v]) => [k, v === null ? 'not installed' : v]);
  ['python', 'platform', 'machine', 'processor', 'hostname', 'cpu_count', 'gpus'].forEach(k => { if (k in f) rows.push([k, f[k] === null ? '–' : f[k]]); });
  host.appendChild(kvTable(rows));
  host.appendChild(el('h3', {}, 'Wall time per stage'));
  if (!D.stages.length) host.appendChild(el('div', {'class': 'empty'}, 'no metrics rows'));
  else { const t = el('table', {'class': 'kv', id: 'stage-times'}); const hdr = el('tr');
    ['stage', 'rows', 'steps', 'wall (s)', 'start-up (s)', 'rollout (s)', 'train (s)', 'weight sync (s)', 'eval (s)'].forEach(h => hdr.appendChild(el('th', {}, h))); t.appendChild(hdr);
    D.stages.forEach(s => { const tr = el('tr'); [s.stage, s.rows, `${s.first_step}–${s.last_step}`, fmt(s.wall_s), fmt(s.startup_s), fmt(s['perf/rollout_time']), fmt(s['perf/train_time']), fmt(s['perf/update_weights_time']), fmt(s['perf/eval_time'])]
      .forEach(v => tr.appendChild(el('td', {}, String(v)))); t.appendChild(tr); }); host.appendChild(t); }
}

buildCharts(); buildBrowser(); buildFacts();
document.body.setAttribute('data-ready', '1');
})();
"""
)
