// inferlab's page. Every number comes from the JSON API (the same reports as `inferlab ... --json`);
// this file only chooses what to ask, formats units (GB = 10^9 bytes) and draws. No model formula here.
"use strict";

const $ = (sel, root = document) => root.querySelector(sel);
const $$ = (sel, root = document) => Array.from(root.querySelectorAll(sel));
const GB = 1e9; // display unit: decimal gigabytes, as the reports' capacities are counted
let CATALOG = null;

class ApiError extends Error {
  constructor(message, status) { super(message); this.status = status; }
}

async function api(path, body) {
  const opts = body === undefined ? {} : { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) };
  const r = await fetch(path, opts);
  let j;
  try { j = await r.json(); } catch (e) { j = { error: `the server answered ${r.status} without JSON` }; }
  if (!r.ok) throw new ApiError(j.error || `HTTP ${r.status}`, r.status);
  return j;
}

// ---------------------------------------------------------------- formatting (units only)
function fixed(x, d) { return Number(x).toLocaleString("en-US", { minimumFractionDigits: d, maximumFractionDigits: d }); }
const fmt = {
  gb: (b) => b == null ? "—" : `${fixed(b / GB, 2)} GB`,
  tok: (x) => x == null ? "—" : `${fixed(x, x >= 100 ? 0 : 1)} tok/s`,
  pct: (f) => f == null ? "—" : `${fixed(f * 100, 0)} %`,
  s: (s) => s == null ? "—" : s < 1e-3 ? `${fixed(s * 1e6, 0)} µs` : s < 1 ? `${fixed(s * 1e3, 2)} ms` : `${fixed(s, 2)} s`,
  int: (n) => n == null ? "—" : Number(n).toLocaleString("en-US"),
  tokens: (n) => n == null ? "—" : `${Number(n).toLocaleString("en-US")} tokens`,
  flopb: (x) => x == null ? "—" : `${fixed(x, x >= 10 ? 0 : 1)} FLOP/byte`,
  tflops: (x) => x == null ? "—" : `${fixed(x, 1)} TFLOP/s`,
};

function el(tag, attrs = {}, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v == null || v === false) continue;
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else if (k === "style") e.style.cssText = v;
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const k of kids.flat(Infinity)) if (k != null) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  return e;
}

function put(node, ...kids) { node.replaceChildren(...kids.flat(Infinity).filter((k) => k != null)); }

function provText(p) { return p ? `${p.origin}: ${p.source}` : ""; }

// A number with its raw value (data-value, as the API gave it) and where it comes from (hover/focus).
function num(value, text, prov, testid) {
  return el("span", { class: "num", tabindex: "0", "data-value": value == null ? "" : String(value),
    "data-prov": provText(prov), "data-testid": testid, "aria-label": `${text}. ${provText(prov)}` }, text);
}

function stat(label, node, wide) { return el("div", { class: `stat${wide ? " wide" : ""}` }, el("span", { class: "label" }, label), node); }

function setupTooltip() {
  const tip = $("#tip");
  const show = (t) => {
    const p = t.getAttribute("data-prov");
    if (!p) return;
    tip.textContent = p; tip.hidden = false;
    const r = t.getBoundingClientRect();
    const left = Math.min(window.scrollX + r.left, window.scrollX + document.documentElement.clientWidth - 350);
    tip.style.left = `${Math.max(4, left)}px`; tip.style.top = `${window.scrollY + r.bottom + 6}px`;
  };
  const hide = () => { tip.hidden = true; };
  document.addEventListener("mouseover", (e) => { const t = e.target.closest("[data-prov]"); if (t) show(t); });
  document.addEventListener("mouseout", (e) => { if (e.target.closest("[data-prov]")) hide(); });
  document.addEventListener("focusin", (e) => { const t = e.target.closest("[data-prov]"); if (t) show(t); else hide(); });
  document.addEventListener("focusout", hide);
}

// ---------------------------------------------------------------- a small SVG chart (drawing only)
const SVGNS = "http://www.w3.org/2000/svg";
function svg(tag, attrs = {}, text) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs)) if (v != null) e.setAttribute(k, v);
  if (text != null) e.textContent = text;
  return e;
}
function niceTicks(lo, hi, n = 5) {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / n, mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw);
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Number(v.toPrecision(12)));
  return out;
}
function logTicks(lo, hi) {
  const out = [];
  for (let e = Math.floor(Math.log10(lo)); e <= Math.ceil(Math.log10(hi)); e++) {
    const v = 10 ** e;
    if (v >= lo * 0.999 && v <= hi * 1.001) out.push(v);
  }
  return out;
}
function tickLabel(v) {
  if (v === 0) return "0";
  const a = Math.abs(v);
  if (a < 1) return String(Number(v.toPrecision(2)));
  if (a >= 1e6) return `${v / 1e6}M`;
  if (a >= 1e3) return `${v / 1e3}k`;
  return String(Number(v.toPrecision(3)));
}

// spec: {title, x:{label, log, min, max}, y:{...}, series:[{name, color, points:[[x,y]], dash}], vlines, bands, marks}
function chart(spec) {
  const W = spec.width || Math.max(320, Math.min(720, document.documentElement.clientWidth - 48)), H = spec.height || 250, m = { l: 62, r: 16, t: 26, b: 44 };
  const all = spec.series.flatMap((s) => s.points).concat((spec.marks || []).map((p) => [p.x, p.y]));
  const xs = all.map((p) => p[0]).filter((v) => v != null), ys = all.map((p) => p[1]).filter((v) => v != null);
  const ax = (a, vals) => {
    let lo = a.min ?? Math.min(...vals), hi = a.max ?? Math.max(...vals);
    if (a.log) { lo = Math.max(lo, 1e-12); if (hi <= lo) hi = lo * 10; } else if (hi <= lo) { hi = lo + 1; }
    return { lo, hi, log: !!a.log };
  };
  const X = ax(spec.x, xs.length ? xs : [0, 1]), Y = ax(spec.y, ys.length ? ys : [0, 1]);
  const px = (v) => m.l + (W - m.l - m.r) * (X.log ? Math.log(v / X.lo) / Math.log(X.hi / X.lo) : (v - X.lo) / (X.hi - X.lo));
  const py = (v) => H - m.b - (H - m.t - m.b) * (Y.log ? Math.log(v / Y.lo) / Math.log(Y.hi / Y.lo) : (v - Y.lo) / (Y.hi - Y.lo));
  const root = svg("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": spec.title });
  root.append(svg("title", {}, spec.title));
  for (const b of spec.bands || []) {
    const x0 = px(Math.max(b.x0, X.lo)), x1 = px(Math.min(b.x1, X.hi));
    root.append(svg("rect", { x: x0, y: m.t, width: Math.max(0, x1 - x0), height: H - m.t - m.b, fill: b.color, opacity: 0.5 }));
    root.append(svg("text", { x: (x0 + x1) / 2, y: m.t + 14, "text-anchor": "middle", style: "fill:#b3261e" }, b.label));
  }
  const yt = Y.log ? logTicks(Y.lo, Y.hi) : niceTicks(Y.lo, Y.hi), xt = X.log ? logTicks(X.lo, X.hi) : niceTicks(X.lo, X.hi, 6);
  for (const v of yt) {
    root.append(svg("line", { class: "grid", x1: m.l, x2: W - m.r, y1: py(v), y2: py(v) }));
    root.append(svg("text", { x: m.l - 6, y: py(v) + 4, "text-anchor": "end" }, tickLabel(v)));
  }
  for (const v of xt) root.append(svg("text", { x: px(v), y: H - m.b + 16, "text-anchor": "middle" }, tickLabel(v)));
  root.append(svg("line", { class: "axis", x1: m.l, x2: W - m.r, y1: H - m.b, y2: H - m.b }));
  root.append(svg("line", { class: "axis", x1: m.l, x2: m.l, y1: m.t, y2: H - m.b }));
  root.append(svg("text", { x: (m.l + W - m.r) / 2, y: H - 6, "text-anchor": "middle" }, spec.x.label));
  root.append(svg("text", { x: 14, y: (m.t + H - m.b) / 2, "text-anchor": "middle", transform: `rotate(-90 14 ${(m.t + H - m.b) / 2})` }, spec.y.label));
  for (const s of spec.series) {
    let d = "", pen = false;
    for (const [x, y] of s.points) {
      if (x == null || y == null || (X.log && x <= 0) || (Y.log && y <= 0)) { pen = false; continue; }
      d += `${pen ? "L" : "M"}${px(x).toFixed(1)},${py(y).toFixed(1)}`; pen = true;
    }
    root.append(svg("path", { d, fill: "none", stroke: s.color, "stroke-width": s.width || 2.2, "stroke-dasharray": s.dash }));
  }
  for (const v of spec.vlines || []) {
    root.append(svg("line", { x1: px(v.x), x2: px(v.x), y1: m.t, y2: H - m.b, stroke: v.color, "stroke-width": 1.5, "stroke-dasharray": "4 3" }));
    root.append(svg("text", { x: px(v.x) + 4, y: m.t + 28, style: `fill:${v.color}` }, v.label));
  }
  (spec.marks || []).forEach((p, k) => {
    if (p.x == null || p.y == null) return;
    root.append(svg("circle", { cx: px(p.x), cy: py(p.y), r: 5, fill: p.color, stroke: "#fff", "stroke-width": 1.5 }));
    const below = k % 2 === 1, right = px(p.x) < W - 200;
    root.append(svg("text", { x: px(p.x) + (right ? 8 : -8), y: py(p.y) + (below ? 18 : -9), "text-anchor": right ? "start" : "end",
      style: `fill:${p.color};font-weight:600` }, p.label));
  });
  const legend = spec.series.filter((s) => s.name);
  legend.forEach((s, i) => {
    const x = m.l + 10 + i * 170;
    root.append(svg("line", { x1: x, x2: x + 18, y1: 10, y2: 10, stroke: s.color, "stroke-width": 3, "stroke-dasharray": s.dash }));
    root.append(svg("text", { x: x + 22, y: 14 }, s.name));
  });
  return root;
}

// ---------------------------------------------------------------- forms
function fillSelect(sel, items, value) {
  sel.replaceChildren(...items.map((it) => el("option", { value: it.id, selected: it.id === value }, it.label)));
  if (value != null) sel.value = value;
}
function populate(form, defaults = {}) {
  for (const s of $$("select[data-role]", form)) {
    const role = s.dataset.role;
    if (role === "model") fillSelect(s, CATALOG.models.map((m) => ({ id: m.id, label: m.origin === "file" ? `${m.name} (${m.id})` : m.name })), defaults.model || "llama-3.1-8b");
    if (role === "machine") fillSelect(s, CATALOG.machines.map((m) => ({ id: m.id, label: m.name })), defaults.machine || CATALOG.default_machine);
    if (role === "quant") fillSelect(s, CATALOG.quants.map((q) => ({ id: q, label: q })), defaults.quant || "Q4_K_M");
    if (role === "kv") fillSelect(s, CATALOG.kv_types.map((q) => ({ id: q, label: q })), "f16");
    if (role === "speed") fillSelect(s, CATALOG.speed_models.map((q) => ({ id: q, label: q })), "calibrated");
    if (role === "workload") fillSelect(s, CATALOG.workloads.map((q) => ({ id: q, label: q })), "seed-chat");
  }
}
function intOrNull(input) {
  const v = input.value.trim();
  if (v === "") return null;
  const n = Number(v);
  return Number.isFinite(n) ? n : v; // the server says what is wrong with anything else
}
function showError(section, err) {
  const e = $(".error", section);
  if (err) { e.textContent = `The server refused this: ${err.message}`; e.hidden = false; } else { e.hidden = true; e.textContent = ""; }
}
function modelInfo(id) { return CATALOG.models.find((m) => m.id === id); }

// Re-render a figure when its controls change; only the latest answer is drawn.
function wire(section, render) {
  let seq = 0, timer = null;
  // data-pending says whether an answer is still to come (tests wait on it; so could a spinner)
  const run = async () => {
    const my = ++seq;
    section.dataset.pending = "1";
    try {
      const draw = await render();
      if (my === seq && draw) { draw(); showError(section, null); }
    } catch (err) { if (my === seq) showError(section, err); }
    if (my === seq) section.dataset.pending = "0";
  };
  // a change supersedes the answer in flight at once (seq++): drawn after it, that answer would show
  // the settings before the change and clear data-pending while the new one is still to come
  const schedule = () => { seq++; section.dataset.pending = "1"; clearTimeout(timer); timer = setTimeout(run, 60); };
  section.addEventListener("input", (e) => { if (e.target.closest("form")) schedule(); });
  section.addEventListener("change", (e) => { if (e.target.closest("form")) schedule(); });
  return run;
}

function scenarioControl(form, defaults) {
  const sel = form.elements.scenario;
  fillSelect(sel, [...CATALOG.scenarios.map((s) => ({ id: s.id, label: s.label })), { id: "custom", label: "Your own choice below" }], defaults);
  const apply = () => {
    const s = CATALOG.scenarios.find((x) => x.id === sel.value);
    if (!s) return;
    form.elements.model.value = s.model; form.elements.machine.value = s.machine;
    if (form.elements.n_ctx) form.elements.n_ctx.value = s.n_ctx;
  };
  sel.addEventListener("change", apply);
  for (const n of ["model", "machine"]) form.elements[n].addEventListener("change", () => { sel.value = "custom"; });
  apply();
}

// ---------------------------------------------------------------- figure 5: the calculator
function memBar(dev, prov, i) {
  const cap = dev.capacity_bytes, over = dev.total_bytes > cap;
  const role = dev.kind === "gpu" ? (CATALOG_unified() ? "unified memory (GPU share)" : "VRAM") : "system RAM";
  const segs = [["w", dev.weights_bytes, "weights"], ["k", dev.kv_bytes, "KV cache"], ["b", dev.compute_bytes, "compute buffers"]];
  const track = el("div", { class: `track${over ? " over" : ""}`, role: "img",
    "aria-label": `${dev.name}: ${fmt.gb(dev.total_bytes)} of ${fmt.gb(cap)}` },
    segs.map(([c, b, name]) => el("div", { class: `seg ${c}${dev.kind === "cpu" ? " cpu" : ""}`, title: `${name}: ${fmt.gb(b)}`,
      style: `width:${Math.min(100, (100 * b) / cap)}%` })));
  return el("div", { class: "membar", "data-testid": `membar-${dev.kind}-${i}` },
    el("div", { class: "title" },
      el("span", {}, el("strong", {}, dev.kind === "cpu" ? "CPU + RAM" : dev.name), ` · ${role} · ${dev.n_blocks} blocks${dev.output_head ? " + output head" : ""}`),
      el("span", {}, num(dev.total_bytes, fmt.gb(dev.total_bytes), prov["devices.total_bytes"], `mem-total-${dev.kind}-${i}`), " of ",
        num(cap, fmt.gb(cap), prov["devices.capacity_bytes"], `mem-cap-${dev.kind}-${i}`), " (",
        num(dev.used_fraction, fmt.pct(dev.used_fraction), prov["devices.total_bytes"]), ")", over ? el("strong", { style: "color:var(--bad)" }, " over") : null)),
    track,
    el("div", { class: "legend" }, segs.map(([c, b, name]) => el("span", {}, el("i", { class: `seg ${c}${dev.kind === "cpu" ? " cpu" : ""}` }),
      `${name} `, num(b, fmt.gb(b), prov[`devices.${c === "w" ? "weights" : c === "k" ? "kv" : "compute"}_bytes`])))));
}
let CURRENT_MACHINE_UNIFIED = false;
function CATALOG_unified() { return CURRENT_MACHINE_UNIFIED; }

function setupCalc() {
  const section = $("#fig-calc"), form = $("form", section), out = $("[data-out=calc]", section);
  populate(form, { model: "qwen2.5-32b", machine: "rtx4060ti" });
  const slider = form.elements.n_gpu_layers, auto = form.elements.ngl_auto, shown = form.elements.ngl_value;
  const sweepCache = new Map();
  const syncSlider = () => {
    const m = modelInfo(form.elements.model.value);
    slider.max = String(m.n_gpu_layers_max);
    slider.setAttribute("aria-valuetext", auto.checked ? "auto" : `${slider.value} of ${m.n_gpu_layers_max} layers`);
  };
  form.elements.model.addEventListener("change", () => { syncSlider(); });
  slider.addEventListener("input", () => { auto.checked = false; });
  syncSlider();
  const body = () => ({
    model: form.elements.model.value, machine: form.elements.machine.value, quant: form.elements.quant.value,
    kv_type: form.elements.kv_type.value, n_ctx: intOrNull(form.elements.n_ctx), speed: form.elements.speed.value,
    n_gpu_layers: auto.checked ? null : Number(slider.value),
  });
  const render = async () => {
    syncSlider();
    const b = body();
    const key = JSON.stringify({ ...b, n_gpu_layers: null });
    const sweepP = sweepCache.has(key) ? Promise.resolve(sweepCache.get(key)) : api("/api/fit/ngl-sweep", { ...b, n_gpu_layers: null });
    const adviceP = api("/api/advise", b).catch((err) => ({ error: err.message }));
    const [r, sweep, adv] = await Promise.all([api("/api/fit", b), sweepP, adviceP]);
    sweepCache.set(key, sweep);
    CURRENT_MACHINE_UNIFIED = !!(CATALOG.machines.find((m) => m.id === b.machine) || {}).unified;
    return () => drawCalc(section, out, r, sweep, auto, slider, shown, adv);
  };
  return wire(section, render);
}

function drawCalc(section, out, r, sweep, auto, slider, shown, adv) {
  const prov = r.provenance;
  if (auto.checked) slider.value = String(r.n_gpu_layers);
  shown.textContent = `${auto.checked ? "auto → " : ""}${r.n_gpu_layers} / ${r.n_gpu_layers_max} layers on the GPU`;
  section.dataset.fits = String(r.fits);
  const verdict = r.fits
    ? el("div", { class: "verdict fits", "data-testid": "calc-verdict" }, `Fits: ${r.model} (${r.quant}) on ${r.machine}`)
    : el("div", { class: "verdict nofit", "data-testid": "calc-verdict" }, `Does not fit: ${r.reason}. It would not run, so no speed is shown.`);
  const dec = r.decode, pre = r.prefill;
  const stats = el("div", { class: "stats" },
    stat("decode speed", el("span", { class: "big" }, dec ? num(dec.tok_per_s, fmt.tok(dec.tok_per_s), prov.decode, "calc-decode") : num(null, "— (would not run)", prov.decode, "calc-decode"))),
    stat("prompt processing", el("span", { class: "big" }, pre ? num(pre.tok_per_s, fmt.tok(pre.tok_per_s), prov.prefill, "calc-prefill") : num(null, "— (would not run)", prov.prefill, "calc-prefill"))),
    stat("CPU share of a decode step", dec ? num(dec.cpu_share, fmt.pct(dec.cpu_share), prov.decode, "calc-cpu-share") : num(null, "—", prov.decode, "calc-cpu-share")),
    stat("GPU layers -ngl", el("span", {}, num(r.n_gpu_layers, `${r.n_gpu_layers} / ${r.n_gpu_layers_max}`, prov.n_gpu_layers, "calc-ngl"), r.auto_ngl ? " (chosen by --fit)" : " (set)")),
    stat("weights", el("span", {}, num(r.weights_bytes, fmt.gb(r.weights_bytes), prov.weights_bytes, "calc-weights"), " at ",
      num(r.bits_per_weight, `${fixed(r.bits_per_weight, 2)} bits/weight`, prov.bits_per_weight, "calc-bpw"))),
    stat("context -c", el("span", {}, num(r.n_ctx, fmt.tokens(r.n_ctx), prov.n_gpu_layers, "calc-nctx"), r.ctx_reduced ? " (shrunk by --fit)" : "", ` · KV ${r.kv_type}`)),
  );
  const detail = dec ? el("p", {}, `Decode at ${fmt.tokens(dec.context_tokens)} of context is ${dec.bound}-bound: ${dec.bottleneck}. Prompt processing for a ${fmt.tokens(pre.n_tokens)} prompt takes `,
    num(pre.s, fmt.s(pre.s), prov.prefill), ".") : null;
  const bars = el("div", {}, el("h3", {}, "Memory per device"), r.devices.slice().reverse().map((d, i) => memBar(d, prov, i)));
  const fitting = sweep.points.filter((p) => p.fits);
  const firstBad = sweep.points.find((p) => !p.fits);
  const sweepChart = chart({
    title: "Decode and prompt speed at each -ngl", x: { label: "-ngl (layers on the GPU)", min: 0, max: sweep.n_gpu_layers_max },
    y: { label: "decode tok/s", min: 0 },
    series: [{ name: "decode tok/s", color: "var(--gpu)", points: sweep.points.map((p) => [p.n_gpu_layers, p.decode_tok_per_s]) }],
    bands: firstBad ? [{ x0: firstBad.n_gpu_layers - 0.5, x1: sweep.n_gpu_layers_max + 0.5, color: "#fbe3e0", label: "does not fit" }] : [],
    vlines: [{ x: r.n_gpu_layers, color: "var(--kv)", label: `-ngl ${r.n_gpu_layers}` }],
    marks: dec ? [{ x: r.n_gpu_layers, y: dec.tok_per_s, color: "var(--kv)", label: fmt.tok(dec.tok_per_s) }] : [],
  });
  const sweepNote = el("p", { class: "lead" }, fitting.length
    ? `Fits up to -ngl ${fitting[fitting.length - 1].n_gpu_layers}; each point is inferlab's fit at that -ngl.` : "No -ngl fits on this machine.");
  const cmds = el("div", { "data-testid": "calc-commands" }, el("h3", {}, "Engine command lines"), adv.error ? el("p", { class: "lead" }, `No command lines: ${adv.error}`) : [
    el("p", { class: "lead" }, "llama.cpp with the settings above:"), cmdLine(adv.yours.text, "cmd-yours"),
    adv.advice ? [el("p", { class: "lead" }, `The advisor's pick for one user (${adv.advice.recipe_text}):`),
      adv.advice.engines.map((e) => el("div", {}, el("strong", {}, e.engine), e.tok_per_s != null ? el("span", {}, " · ", num(e.tok_per_s, fmt.tok(e.tok_per_s), adv.provenance.commands)) : null,
        cmdLine(e.command.text, `cmd-${e.engine}`), [...e.reports, ...e.command.notes].map((x) => el("div", { class: "lead" }, x))))]
      : el("p", { class: "lead" }, `The advisor has no pick: ${adv.advice_error}`)]);
  const notes = r.notes.length ? el("ul", {}, r.notes.map((n) => el("li", {}, n))) : null;
  const figs = el("details", {}, el("summary", {}, "Where the inputs come from"), el("div", { class: "tablewrap" }, el("table", {},
    el("thead", {}, el("tr", {}, el("th", {}, "figure"), el("th", {}, "value"), el("th", {}, "origin"), el("th", { style: "text-align:left" }, "source"))),
    el("tbody", {}, r.figures.map((f) => el("tr", {}, el("td", {}, f.name), el("td", {}, `${f.value ?? "—"} ${f.unit}`), el("td", {}, f.origin), el("td", { style: "text-align:left" }, f.source)))))));
  put(out, verdict, stats, detail, bars, el("h3", {}, "What each layer buys"), sweepChart, sweepNote, cmds, notes, figs,
    el("p", { class: "lead" }, `Speed model: ${r.speed_model}; layer order: ${r.order}.`));
}

function cmdLine(text, testid) {
  const btn = el("button", { type: "button", "aria-label": `Copy: ${text}` }, "Copy");
  btn.addEventListener("click", async () => {
    try { await navigator.clipboard.writeText(text); btn.textContent = "Copied"; } catch (e) { btn.textContent = "Select and copy"; }
  });
  return el("div", { class: "cmd", "data-testid": testid }, el("pre", {}, el("code", {}, text)), btn);
}

// ---------------------------------------------------------------- figure 1: loading step by step
const TIER_STATE = { empty: "not yet", mapped: "mapped (addressable, not read)", resident: "resident", allocated: "allocated", failed: "allocation fails" };
function setupLoad() {
  const section = $("#fig-load"), form = $("form", section), out = $("[data-out=load]", section);
  populate(form, {});
  scenarioControl(form, "partial");
  const label = $("[data-testid=load-step-label]", section);
  let step = 0, last = null;
  const draw = () => {
    if (!last) return;
    const r = last, tr = r.trace, steps = tr.steps, n = steps.length;
    step = Math.min(step, n - 1);
    const st = steps[step], prov = r.provenance;
    label.textContent = `Step ${step + 1} of ${n}: ${st.name}`;
    const list = el("ol", { class: "steps" }, steps.map((x, i) => el("li", { class: i < step ? "done" : i === step ? "current" : "" },
      `${x.name} · ${x.where}`, x.bytes_moved ? el("span", {}, " · ", num(x.bytes_moved, fmt.gb(x.bytes_moved), prov.steps)) : null,
      " · ", num(x.s, fmt.s(x.s), prov.steps, i === step ? "load-step-s" : null))));
    const detail = el("p", {}, el("strong", {}, st.name), `: ${st.detail}`);
    const tiers = r.tiers[step];
    const bars = r.fit.devices.map((d, i) => {
      const t = tiers[i], cap = d.capacity_bytes;
      const seg = (cls, bytes, state, name) => el("div", { class: `seg ${cls}${d.kind === "cpu" ? " cpu" : ""}`,
        title: `${name}: ${fmt.gb(bytes)} (${TIER_STATE[state]})`,
        style: `width:${Math.min(100, (100 * bytes) / cap)}%;opacity:${state === "empty" ? 0 : state === "mapped" ? 0.35 : 1}` });
      return el("div", { class: "membar", "data-testid": `load-tier-${i}` },
        el("div", { class: "title" }, el("span", {}, el("strong", {}, d.kind === "cpu" ? `${r.labels[i]} (RAM)` : `${r.labels[i]} (${CATALOG_unified() ? "unified" : "VRAM"})`)),
          el("span", {}, `weights ${TIER_STATE[t.weights]} · KV ${TIER_STATE[t.kv]} · buffers ${TIER_STATE[t.buffers]}`)),
        el("div", { class: `track${t.weights === "failed" ? " over" : ""}`, role: "img", "aria-label": `${r.labels[i]}: weights ${TIER_STATE[t.weights]}, KV ${TIER_STATE[t.kv]}, buffers ${TIER_STATE[t.buffers]}` },
          seg("w", d.weights_bytes, t.weights, "weights"), seg("k", d.kv_bytes, t.kv, "KV cache"), seg("b", d.compute_bytes, t.buffers, "compute buffers")),
        el("div", { class: "legend" }, `of `, num(cap, fmt.gb(cap), prov["devices.capacity_bytes"]), ": weights ", num(d.weights_bytes, fmt.gb(d.weights_bytes), prov["devices.weights_bytes"]),
          " · KV ", num(d.kv_bytes, fmt.gb(d.kv_bytes), prov["devices.kv_bytes"]), " · buffers ", num(d.compute_bytes, fmt.gb(d.compute_bytes), prov["devices.compute_bytes"])));
    });
    const totals = el("div", { class: "stats" },
      stat("first launch (file from the drive)", tr.total_s == null ? "—" : num(tr.total_s, fmt.s(tr.total_s), prov.steps, "load-total-s")),
      stat("second launch (file in the page cache)", tr.second_launch_s == null ? "—" : num(tr.second_launch_s, fmt.s(tr.second_launch_s), prov.steps, "load-second-s")),
      stat("configuration", el("span", {}, `${tr.model} · ${tr.quant} · -ngl ${tr.n_gpu_layers} · -c ${fmt.int(tr.n_ctx)}`), true));
    const verdict = tr.fits ? null : el("div", { class: "verdict nofit" }, `Does not fit: ${tr.reason}`);
    put(out, verdict, totals, detail, bars, list, tr.notes.length ? el("ul", {}, tr.notes.map((x) => el("li", {}, x))) : null);
  };
  $("[data-act=prev]", section).addEventListener("click", () => { step = Math.max(0, step - 1); draw(); });
  $("[data-act=next]", section).addEventListener("click", () => { step = step + 1; draw(); });
  return wire(section, async () => {
    const b = { model: form.elements.model.value, machine: form.elements.machine.value, quant: form.elements.quant.value, n_ctx: intOrNull(form.elements.n_ctx) };
    const r = await api("/api/trace/load", b);
    return () => { last = r; step = 0; CURRENT_MACHINE_UNIFIED = !!(CATALOG.machines.find((m) => m.id === b.machine) || {}).unified; draw(); };
  });
}

// ---------------------------------------------------------------- figure 2: time per token
function setupToken() {
  const section = $("#fig-token"), form = $("form", section), out = $("[data-out=token]", section);
  populate(form, { model: "llama-3.1-8b", machine: "rtx4090" });
  form.elements.context.addEventListener("input", (e) => { e.target.dataset.touched = "1"; });
  for (const n of ["model", "machine", "n_ctx", "batch"]) form.elements[n].addEventListener("change", () => { delete form.elements.context.dataset.touched; });
  return wire(section, async () => {
    const ctxInput = form.elements.context;
    const b = { model: form.elements.model.value, machine: form.elements.machine.value, quant: form.elements.quant.value,
      kv_type: form.elements.kv_type.value, n_ctx: intOrNull(form.elements.n_ctx), batch: intOrNull(form.elements.batch),
      context: ctxInput.dataset.touched ? Number(ctxInput.value) : null };
    const r = await api("/api/trace/decode", b);
    return () => {
      ctxInput.max = String(r.context_max);
      if (!ctxInput.dataset.touched && r.context_tokens != null) ctxInput.value = String(r.context_tokens);
      $("output[name=context_value]", form).textContent = fmt.tokens(r.context_tokens);
      if (!r.fits) { put(out, el("div", { class: "verdict nofit", "data-testid": "token-verdict" }, `Does not fit: ${r.reason}`)); return; }
      const prov = r.provenance;
      const kinds = [...new Set(r.curve.map((p) => p.kv_type))];
      const colors = ["var(--gpu)", "var(--kv)", "var(--buf)"];
      const c = chart({ title: "Decode tokens per second against the context, per KV-cache type", x: { label: "cached tokens of context", min: 0 },
        y: { label: "tok/s", min: 0 },
        series: kinds.map((k, i) => ({ name: `KV ${k}`, color: colors[i % 3], dash: i ? "6 4" : null, points: r.curve.filter((p) => p.kv_type === k).map((p) => [p.context_tokens, p.tok_per_s]) })),
        vlines: [{ x: r.context_tokens, color: "var(--bad)", label: "this step" }],
        marks: [{ x: r.context_tokens, y: r.tok_per_s, color: "var(--bad)", label: fmt.tok(r.tok_per_s) }] });
      const maxS = r.total_s;
      const stepRows = r.steps.map((x) => el("tr", {}, el("td", {}, x.where), el("td", {}, x.name), el("td", {}, num(x.bytes_moved, fmt.gb(x.bytes_moved), prov.bytes)),
        el("td", {}, num(x.s, fmt.s(x.s), prov.steps)), el("td", {}, x.bound),
        el("td", { style: "min-width:90px" }, el("div", { class: "track", style: "height:10px" }, el("div", { class: `seg ${x.name.includes("KV") ? "k" : x.bound === "overhead" ? "b" : "w"}`, style: `width:${(100 * x.s) / maxS}%` })))));
      const curveRows = r.curve.map((p) => el("tr", {}, el("td", {}, p.kv_type), el("td", {}, fmt.tokens(p.context_tokens)),
        el("td", {}, num(p.weights_bytes, fmt.gb(p.weights_bytes), prov.bytes)), el("td", {}, num(p.kv_bytes, fmt.gb(p.kv_bytes), prov.bytes)),
        el("td", {}, num(p.step_s, fmt.s(p.step_s), prov.curve)), el("td", {}, num(p.tok_per_s, fmt.tok(p.tok_per_s), prov.curve, `token-tok-s-${p.kv_type}`))));
      put(out, el("div", { class: "stats" },
          stat(`one step at ${fmt.tokens(r.context_tokens)}${r.batch > 1 ? ` × ${r.batch} sequences` : ""}`, el("span", { class: "big" }, num(r.tok_per_s, fmt.tok(r.tok_per_s), prov.steps, "token-now"))),
          stat("step time", num(r.total_s, fmt.s(r.total_s), prov.steps)),
          stat("configuration", `${r.model} · ${r.quant} · KV ${r.kv_type} · -ngl ${r.n_gpu_layers} · -c ${fmt.int(r.n_ctx)}`, true)),
        c, el("h3", {}, "What this decode step reads, per device"),
        el("div", { class: "tablewrap" }, el("table", { "data-testid": "token-steps" }, el("thead", {}, el("tr", {}, ["device", "step", "bytes", "time", "bound", ""].map((h) => el("th", {}, h)))), el("tbody", {}, stepRows))),
        el("details", {}, el("summary", {}, "The curve's numbers"), el("div", { class: "tablewrap" }, el("table", { "data-testid": "token-table" },
          el("thead", {}, el("tr", {}, ["KV type", "context", "weights read", "KV read", "step", "decode"].map((h) => el("th", {}, h)))), el("tbody", {}, curveRows)))),
        r.notes.length ? el("ul", {}, r.notes.map((x) => el("li", {}, x))) : null);
    };
  });
}

// ---------------------------------------------------------------- figure 3: prefill and decode on the hardware
function setupPhases() {
  const section = $("#fig-phases"), form = $("form", section), out = $("[data-out=phases]", section);
  populate(form, {});
  scenarioControl(form, "partial");
  let g = 0, last = null;
  const label = $("[data-testid=phase-step-label]", section);
  const BOUND_CLASS = { compute: "b", memory: "w", link: "k", overhead: "c", "cpu-kernels": "w cpu", disk: "k" };
  const gantt = (trace, phase, groups, prov) => {
    const total = trace.total_s;
    return el("div", { class: "membar" }, el("div", { class: "title" }, el("span", {}, el("strong", {}, phase === "prefill" ? `Prefill of ${fmt.tokens(trace.n_tokens)}` : "One decode step")),
      el("span", {}, num(total, fmt.s(total), prov, `phase-${phase}-s`), " · ", num(trace.tok_per_s, fmt.tok(trace.tok_per_s), prov, `phase-${phase}-tok`))),
      el("div", { class: "track", role: "img", "aria-label": `${phase}: ${fmt.s(total)}` }, trace.steps.map((x, i) => {
        const cur = groups[g] && groups[g].phase === phase && groups[g].steps.includes(i);
        return el("div", { class: `seg ${BOUND_CLASS[x.bound] || "w"}`, title: `${x.name} (${x.where}): ${fmt.s(x.s)}`,
          style: `width:${(100 * x.s) / total}%;opacity:${cur ? 1 : 0.35};${cur ? "outline:2px solid #1d232a;outline-offset:-2px" : ""}` });
      })));
  };
  const draw = () => {
    if (!last) return;
    const r = last, prov = r.provenance;
    if (!r.fits) { label.textContent = ""; put(out, el("div", { class: "verdict nofit" }, `Does not fit: ${r.reason}. It would not run.`)); return; }
    g = Math.min(g, r.groups.length - 1);
    const grp = r.groups[g], trace = grp.phase === "prefill" ? r.prefill : r.decode;
    label.textContent = `Step ${g + 1} of ${r.groups.length}: ${grp.label}`;
    const rows = grp.steps.map((i) => trace.steps[i]).map((x) => el("tr", {}, el("td", {}, x.name), el("td", {}, x.where),
      el("td", {}, num(x.bytes_moved, fmt.gb(x.bytes_moved), prov[grp.phase])), el("td", {}, num(x.flops / 1e12, `${fixed(x.flops / 1e12, 2)} TFLOP`, prov[grp.phase])),
      el("td", {}, num(x.s, fmt.s(x.s), prov[grp.phase])), el("td", {}, x.bound)));
    put(out, gantt(r.prefill, "prefill", r.groups, prov.prefill), gantt(r.decode, "decode", r.groups, prov.decode),
      el("div", { class: "legend" }, Object.entries({ compute: "b", memory: "w", link: "k", overhead: "c", "CPU kernels": "w cpu" }).map(([n, c]) => el("span", {}, el("i", { class: `seg ${c}` }), `${n}-bound`))),
      el("h3", {}, `${grp.label}: `, num(grp.s, fmt.s(grp.s), prov[grp.phase])),
      el("div", { class: "tablewrap" }, el("table", { "data-testid": "phase-steps" }, el("thead", {}, el("tr", {}, ["what", "where", "bytes", "FLOPs", "time", "bound"].map((h) => el("th", {}, h)))), el("tbody", {}, rows))),
      el("p", { class: "lead" }, grp.phase === "prefill" ? "One read of each weight serves every token of the micro-batch: the matmuls are compute-bound, and a CPU layer's weights cross PCIe to run on the GPU (op offload)."
        : "Each new token re-reads every weight and the cached K/V: memory-bound, and the layers in system RAM dominate."));
  };
  $("[data-act=prev]", section).addEventListener("click", () => { g = Math.max(0, g - 1); draw(); });
  $("[data-act=next]", section).addEventListener("click", () => { g = g + 1; draw(); });
  return wire(section, async () => {
    const b = { model: form.elements.model.value, machine: form.elements.machine.value, quant: form.elements.quant.value,
      n_ctx: 8192, n_prompt: intOrNull(form.elements.n_prompt), context: intOrNull(form.elements.context) };
    const r = await api("/api/trace/phases", b);
    return () => { last = r; draw(); };
  });
}

// ---------------------------------------------------------------- figure 4: the roofline
function setupRoofline() {
  const section = $("#fig-roofline"), form = $("form", section), out = $("[data-out=roofline]", section);
  populate(form, { model: "llama-3.1-8b", machine: "rtx4090" });
  const batch = form.elements.batch;
  return wire(section, async () => {
    const b = { model: form.elements.model.value, machine: form.elements.machine.value, quant: form.elements.quant.value, batch: Number(batch.value) };
    $("output[name=batch_value]", form).textContent = `${b.batch} ${b.batch === 1 ? "sequence" : "sequences"}`;
    const r = await api("/api/roofline", b);
    return () => {
      const prov = r.provenance, roof = r.roofs.find((x) => x.device === r.device) || r.roofs[0];
      const sel = r.selected_batch;
      const pick = (f) => r.points.find(f);
      const decW = pick((p) => p.op === "weights" && p.phase === "decode" && p.batch === sel);
      const preW = pick((p) => p.op === "weights" && p.phase === "prefill");
      const decM = pick((p) => p.op === "model" && p.phase === "decode" && p.batch === sel) || pick((p) => p.op === "model" && p.phase === "decode");
      const preM = pick((p) => p.op === "model" && p.phase === "prefill");
      const att = pick((p) => p.op === "attention" && p.phase === "decode");
      const T = 1e12; // the chart's y unit: TFLOP/s
      const marks = [
        decW && { x: decW.intensity_flop_per_byte, y: decW.attainable_flops / T, color: "var(--gpu)", label: `decode, batch ${sel}` },
        att && { x: att.intensity_flop_per_byte, y: att.attainable_flops / T, color: "var(--buf)", label: "decode attention" },
        preW && { x: preW.intensity_flop_per_byte, y: preW.attainable_flops / T, color: "var(--kv)", label: "prefill" },
      ].filter(Boolean);
      const c = chart({ title: `Roofline of ${roof.device}`, height: 300,
        x: { label: "arithmetic intensity (FLOP/byte, log scale)", log: true, min: 0.1, max: 10000 },
        y: { label: "attainable TFLOP/s (log)", log: true, min: Math.min(...r.roofs.map((x) => x.polyline[0][1] / T)) },
        series: r.roofs.map((x, i) => ({ name: `${x.kind === "cpu" ? "CPU" : x.device} roof`, color: i === 0 ? "#1d232a" : "#8a939b", dash: x.device === roof.device ? null : "5 4",
          points: x.polyline.map(([a, y]) => [a, y / T]) })),
        vlines: [{ x: roof.ridge_flop_per_byte, color: "var(--bad)", label: `ridge ${fixed(roof.ridge_flop_per_byte, 0)}` }], marks });
      const tp = r.throughput.find((t) => t.batch === sel);
      const refused = r.refused.find((t) => t.batch === sel);
      const pt = (p, name, tid) => p ? el("tr", {}, el("td", {}, name), el("td", {}, num(p.intensity_flop_per_byte, fmt.flopb(p.intensity_flop_per_byte), prov.points, tid)),
        el("td", {}, num(p.attainable_flops / 1e12, fmt.tflops(p.attainable_flops / 1e12), prov.points)), el("td", {}, num(p.utilization, fmt.pct(p.utilization), prov.points)), el("td", {}, p.bound)) : null;
      put(out, el("div", { class: "stats" },
          stat(`ridge point of ${roof.device}`, el("span", { class: "big" }, num(roof.ridge_flop_per_byte, fmt.flopb(roof.ridge_flop_per_byte), prov.roofs, "roof-ridge"))),
          stat(`batch where a ${fixed(r.bits_per_weight, 2)}-bpw weight matmul turns compute-bound`, num(r.ridge_batch, `${fixed(r.ridge_batch, 0)} tokens`, prov.points, "roof-ridge-batch")),
          stat(`decode throughput at batch ${sel}`, tp ? num(tp.tok_per_s, fmt.tok(tp.tok_per_s), prov.throughput, "roof-tok") : num(null, refused ? "— (cache too small)" : "—", prov.throughput, "roof-tok")),
          stat("peak / bandwidth", el("span", {}, num(roof.peak_flops / 1e12, fmt.tflops(roof.peak_flops / 1e12), prov.roofs), " · ", num(roof.bandwidth_bytes_per_s / 1e9, `${fixed(roof.bandwidth_bytes_per_s / 1e9, 0)} GB/s`, prov.roofs)))),
        c,
        el("div", { class: "tablewrap" }, el("table", { "data-testid": "roof-points" }, el("thead", {}, el("tr", {}, ["work", "intensity", "attainable", "of peak", "bound"].map((h) => el("th", {}, h)))),
          el("tbody", {}, pt(decW, `decode weight matmuls, batch ${sel}`, "roof-decode-intensity"), pt(decM, `whole decode step, batch ${decM ? decM.batch : sel}`), pt(att, `decode attention, ${att ? fmt.tokens(att.context_tokens) : ""}`),
            pt(preW, `prefill weight matmuls, micro-batch ${preW ? preW.batch : ""}`), pt(preM, "whole prefill")))),
        el("p", {}, r.saturation_note), refused ? el("p", { class: "lead" }, refused.reason) : null,
        r.notes.length ? el("ul", {}, r.notes.map((x) => el("li", {}, x))) : null);
    };
  });
}

// ---------------------------------------------------------------- figure 6: three KV managers
function setupKv() {
  const section = $("#fig-kv"), out = $("[data-out=kv]", section), form = $("form", section);
  populate(form, {});
  const slider = $("input[name=kv_step]", section), label = $("[data-testid=kv-step-label]", section);
  const playBtn = $("[data-act=play]", section);
  let sim = null, timer = null;
  const nSteps = () => Math.max(...Object.values(sim.frames).map((f) => f.length));
  const stop = () => { clearInterval(timer); timer = null; playBtn.textContent = "▶ Play"; playBtn.setAttribute("aria-pressed", "false"); };
  const go = (i) => { if (!sim) return; slider.value = String(Math.max(0, Math.min(nSteps() - 1, i))); drawKv(section, out, sim, Number(slider.value), label); };
  slider.addEventListener("input", () => go(Number(slider.value)));
  $("[data-act=prev]", section).addEventListener("click", () => { stop(); go(Number(slider.value) - 1); });
  $("[data-act=next]", section).addEventListener("click", () => { stop(); go(Number(slider.value) + 1); });
  $("[data-act=end]", section).addEventListener("click", () => { stop(); go(nSteps() - 1); });
  playBtn.addEventListener("click", () => {
    if (timer) { stop(); return; }
    if (!sim) return;
    if (Number(slider.value) >= nSteps() - 1) go(0);
    playBtn.textContent = "⏸ Pause"; playBtn.setAttribute("aria-pressed", "true");
    timer = setInterval(() => { const i = Number(slider.value) + 1; go(i); if (i >= nSteps() - 1) stop(); }, 140);
  });
  let seq = 0, lastKey = null;
  const runSim = async (ev) => {
    const b = { workload: form.elements.workload.value, capacity_tokens: intOrNull(form.elements.capacity_tokens), limit: intOrNull(form.elements.limit) };
    const key = JSON.stringify(b);
    if (ev && ev.type === "change" && key === lastKey) return; // a field lost focus without a new value
    lastKey = key;
    stop();
    const my = ++seq;
    section.dataset.pending = "1";
    try {
      const r = await api("/api/simulate", b);
      if (my !== seq) return;
      sim = { report: r, frames: framesOf(r) };
      slider.max = String(nSteps() - 1);
      showError(section, null);
      go(0);
    } catch (err) { if (my === seq) showError(section, err); }
    if (my === seq) section.dataset.pending = "0";
  };
  $("[data-act=run]", section).addEventListener("click", runSim);
  form.addEventListener("change", runSim);
  return runSim;
}

// one frame per simulator step, per engine: the simulator's own step records (events), with the
// state the server replayed from them (vLLM's blocks, SGLang's tree); a timed run falls back to its timeline
function framesOf(r) {
  const frames = {};
  for (const run of r.runs) {
    const a = r.animation[run.engine], st = a.state;
    if (a.events) {
      frames[run.engine] = a.events.map((s, i) => ({ step: s.step, t: s.t, used: s.kv_used_tokens, cached: s.kv_cached_tokens,
        prefill: s.prefill_tokens, decode: s.decode_tokens, events: s.events, state: st ? { kind: st.kind, block_size: st.block_size, frame: st.frames[i] } : null }));
    } else {
      const tl = a.timeline;
      frames[run.engine] = tl.t.map((t, i) => ({ step: i + 1, t, used: tl.kv_used_tokens[i], cached: tl.kv_cached_tokens[i], running: tl.running[i], waiting: tl.waiting[i] }));
    }
  }
  return frames;
}

function stateView(f, cap) {
  const s = f.state;
  if (s && s.kind === "blocks") {
    return el("div", {}, el("div", { class: "lead" }, `blocks of ${s.block_size} tokens (block 0 is vLLM's null block); hover for the prefix hash`),
      el("div", { class: "cells blocks", role: "img", "aria-label": "vLLM's blocks" }, s.frame.map(([held, hash], b) => el("span", {
        class: `cell big${held.length ? " used" : hash ? " cached" : ""}${b === 0 ? " null" : ""}`,
        title: `block ${b}${hash ? ` · hash ${hash}` : ""}${held.length ? ` · held by ${held.join(", ")}` : hash ? " · cached, free to reuse" : " · free"}` },
        held.length > 1 ? String(held.length) : ""))));
  }
  if (s && s.kind === "tree") {
    const fr = s.frame;
    return el("div", {}, el("div", { class: "lead" }, `radix tree: ${fmt.tokens(fr.tree_tokens)} in ${fr.nodes.length} nodes, ${fmt.tokens(fr.private_tokens)} private to running requests`),
      el("div", { class: "nodes", role: "list", "aria-label": "SGLang's radix-tree nodes" }, fr.nodes.map(([n, tok, locked]) =>
        el("span", { class: `node${locked.length ? " locked" : ""}`, role: "listitem", title: `node ${n}: ${tok} tokens inserted ending here${locked.length ? `; locked by ${locked.join(", ")}` : "; unlocked, evictable"}` },
          `#${n} · ${tok}${locked.length ? " · locked" : ""}`))));
  }
  return cap <= 2048 ? el("div", { class: "cells", role: "img", "aria-label": `${f.used} tokens in use, ${f.cached} cached, of ${cap}` },
    Array.from({ length: cap }, (_, k) => el("span", { class: `cell${k < f.used ? " used" : k < f.used + f.cached ? " cached" : ""}` }))) : null;
}

function eventText(e) {
  const who = e.request != null ? `request ${e.request}` : "";
  switch (e.kind) {
    case "admit": return `${who} admitted: ${e.cached_tokens} tokens cached, ${e.scheduled_tokens} computed now${e.resumed ? " (resumed)" : ""}`;
    case "prefix_hit": return `${who} prefix hit: ${e.tokens} tokens${e.blocks && e.blocks.length ? ` in blocks ${e.blocks.join(", ")}` : ""}${e.node != null ? ` (tree node ${e.node})` : ""}`;
    case "allocate": return `${who} allocates ${e.tokens} ${e.tokens === 1 ? "token" : "tokens"}${e.blocks && e.blocks.length ? ` in blocks ${e.blocks.join(", ")}` : ""}`;
    case "cache": return e.blocks && e.blocks.length ? `${who} registers full blocks ${e.blocks.join(", ")} by their prefix hash`
      : `${who} inserts ${e.tokens} tokens into the tree${e.node != null ? ` (ending at node ${e.node})` : ""}, ${e.new_tokens} of them new`;
    case "evict": return `evicts ${e.tokens} cached tokens${e.blocks && e.blocks.length ? ` (blocks ${e.blocks.join(", ")})` : ""}${e.nodes && e.nodes.length ? ` (nodes ${e.nodes.join(", ")})` : ""}`;
    case "free": return `${who} frees ${e.tokens} tokens`;
    case "preempt": return `${who} preempted: ${e.computed_tokens} tokens to recompute`;
    case "first_token": return `${who} first token`;
    case "finish": return `${who} finished after ${e.output_tokens} output tokens`;
    case "reject": return `${who} rejected: ${e.reason}`;
    default: return `${e.kind} ${who}`;
  }
}

const SUMMARY_ROWS = [
  ["kv_capacity_tokens", "KV pool", fmt.tokens], ["prompt_tokens", "prompt tokens", fmt.int], ["prefill_computed", "prefill computed", fmt.int],
  ["prefill_saved_frac", "prefill saved", fmt.pct], ["peak_concurrency", "peak concurrency", fmt.int], ["preemptions", "preemptions", fmt.int],
  ["recomputed_tokens", "recomputed (preemption)", fmt.int], ["hit_rate", "engine hit rate", fmt.pct], ["kv_peak_tokens", "KV peak", fmt.tokens],
  ["finished", "requests finished", fmt.int], ["steps", "steps", fmt.int],
];

function drawKv(section, out, sim, i, label) {
  const r = sim.report, prov = r.provenance;
  const total = Math.max(...Object.values(sim.frames).map((f) => f.length));
  const atEnd = i >= total - 1;
  label.textContent = `step ${i + 1} of ${total}${atEnd ? " (end: summary below)" : ""}`;
  const panels = r.runs.map((run) => {
    const frames = sim.frames[run.engine], f = frames[Math.min(i, frames.length - 1)];
    const cap = run.summary.kv_capacity_tokens, done = i >= frames.length - 1;
    const cells = stateView(f, cap);
    const evs = f.events ? el("ul", { class: "events", "aria-label": "What this step did" }, f.events.map((e) => el("li", {}, eventText(e)))) : null;
    return el("div", { class: "engine", "data-testid": `kv-engine-${run.engine}` },
      el("h3", {}, run.engine === "llamacpp" ? "llama.cpp (slots)" : run.engine === "vllm" ? "vLLM (paged blocks)" : "SGLang (radix tree)"),
      el("div", {}, `step ${f.step} of ${run.summary.steps}${done ? " · done" : ""} · t = ${fixed(f.t, 1)} ${r.time_unit === "s" ? "s" : "steps"}`,
        f.prefill != null ? ` · ${f.prefill} prefill + ${f.decode} decode tokens` : ""),
      el("div", {}, num(f.used, `${fmt.int(f.used)} in use`, prov.summary), " · ", num(f.cached, `${fmt.int(f.cached)} cached`, prov.summary), ` · of ${fmt.tokens(cap)}`,
        run.config.n_ctx_requested && run.config.n_ctx_requested !== cap ? ` (-c ${run.config.n_ctx_requested} padded to a multiple of ${run.config.ctx_pad})` : "",
        f.running != null ? ` · ${f.running} running, ${f.waiting} waiting` : ""),
      cells, evs);
  });
  const legend = el("div", { class: "legend" }, el("span", {}, el("i", { class: "cell used" }), "KV in use by running requests"),
    el("span", {}, el("i", { class: "cell cached" }), "cached for reuse"), el("span", {}, el("i", { class: "cell" }), "free"));
  let table = null;
  if (atEnd) {
    table = el("div", { class: "tablewrap" }, el("h3", {}, "Summary"), el("table", { "data-testid": "kv-summary" },
      el("thead", {}, el("tr", {}, el("th", {}, ""), r.runs.map((run) => el("th", {}, run.engine)))),
      el("tbody", {}, SUMMARY_ROWS.map(([k, name, f]) => el("tr", {}, el("td", {}, name),
        r.runs.map((run) => el("td", {}, num(run.summary[k], f(run.summary[k]), prov.summary, `kv-${run.engine}-${k}`))))))));
  }
  put(out, legend, el("div", { class: "engines" }, panels), table);
}

// ---------------------------------------------------------------- start
async function main() {
  setupTooltip();
  for (const f of $$("form")) f.addEventListener("submit", (e) => e.preventDefault()); // Enter in a field redraws, never navigates
  try { CATALOG = await api("/api/catalog"); } catch (err) { document.body.prepend(el("p", { class: "error", role: "alert" }, `Cannot reach the inferlab server: ${err.message}`)); return; }
  const runs = [setupLoad(), setupToken(), setupPhases(), setupRoofline(), setupCalc(), setupKv()];
  await Promise.all(runs.map((r) => r()));
  document.body.dataset.ready = "true";
}
document.addEventListener("DOMContentLoaded", main);
