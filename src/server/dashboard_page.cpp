#include "server/dashboard_page.h"

namespace kvs::server {

namespace {

const char* const kPage = R"KVSPAGE(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>kvserve dashboard</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
:root{--bg:#f7f7f8;--card:#fff;--ink:#1f2328;--mute:#6e7781;--line:#d0d7de;--free:#e6e8eb;--bad:#cf222e;--ok:#1a7f37}
*{box-sizing:border-box}body{margin:0;font:13px/1.4 system-ui,sans-serif;background:var(--bg);color:var(--ink)}
header{display:flex;gap:16px;align-items:baseline;padding:10px 16px;background:#24292f;color:#fff}
header h1{font-size:16px;margin:0}header .st{color:#9aa4ae}#conn.live{color:#7ee787}#conn.err{color:#ff938a}
main{display:grid;grid-template-columns:repeat(auto-fit,minmax(420px,1fr));gap:12px;padding:12px}
section{background:var(--card);border:1px solid var(--line);border-radius:6px;padding:10px 12px;min-width:0}
section.wide{grid-column:1/-1}h2{font-size:13px;margin:0 0 8px;text-transform:uppercase;letter-spacing:.04em;color:var(--mute)}
.kpis{display:flex;flex-wrap:wrap;gap:14px}.kpi b{display:block;font-size:20px;font-variant-numeric:tabular-nums}
.kpi span{color:var(--mute)}table{border-collapse:collapse;width:100%;font-variant-numeric:tabular-nums}
td,th{padding:3px 6px;border-bottom:1px solid #eaeef2;text-align:right}td:first-child,th:first-child{text-align:left}
th{color:var(--mute);font-weight:600}.legend{display:flex;gap:12px;margin:6px 0;color:var(--mute)}
.sw{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:4px;vertical-align:middle}
#map{display:block;max-width:100%;image-rendering:pixelated;cursor:crosshair}
#tip{position:fixed;pointer-events:none;background:#24292f;color:#fff;padding:4px 8px;border-radius:4px;font-size:12px;display:none;white-space:pre}
svg.chart{width:100%;height:170px;display:block}.chart text{font-size:10px;fill:var(--mute)}
.bar{height:8px;background:#eaeef2;border-radius:4px;overflow:hidden;min-width:40px}.bar i{display:block;height:100%;background:#0969da}
.bar i.over{background:var(--bad)}.mono{font-family:ui-monospace,monospace}#keybox{display:none;gap:6px;padding:8px 16px;background:#fff8c5}
.up{color:var(--ok)}.down{color:var(--bad)}a{color:#0969da}
</style></head>
<body data-snapshots="0">
<header><h1>kvserve</h1><span id="mode" class="st"></span><span id="model" class="st"></span>
<span id="conn" class="st">connecting…</span><span id="age" class="st"></span></header>
<div id="keybox"><span>Admin key:</span><input id="key" type="password" size="40"><button id="keygo">connect</button></div>
<main>
<section class="wide" id="pool-section"><h2>KV block pool</h2>
<div class="kpis">
<div class="kpi"><b id="blocks-total">–</b><span>total</span></div>
<div class="kpi"><b id="blocks-free">–</b><span>free</span></div>
<div class="kpi"><b id="blocks-used">–</b><span>in use</span></div>
<div class="kpi"><b id="blocks-cached">–</b><span>cached</span></div>
<div class="kpi"><b id="blocks-promised">–</b><span>promised</span></div>
<div class="kpi"><b id="blocks-headroom">–</b><span>headroom</span></div>
<div class="kpi"><b id="hit-rate">–</b><span>prefix hit rate</span></div>
</div>
<div class="legend"><span><i class="sw" style="background:var(--free)"></i>free</span>
<span><i class="sw" style="background:hsl(210,65%,45%)"></i>in use (tenant hue)</span>
<span><i class="sw" style="background:hsl(210,65%,80%)"></i>cached (tenant hue)</span>
<span><i class="sw" style="background:#111"></i>corner: shared (ref &gt; 1)</span><span id="group"></span></div>
<canvas id="map" width="10" height="10"></canvas></section>
<section><h2>Free blocks, last 10 minutes</h2><svg class="chart" id="chart-free" viewBox="0 0 600 170" preserveAspectRatio="none"></svg>
<div class="legend"><span><i class="sw" style="background:#0969da"></i>free + cached</span><span><i class="sw" style="background:#8c959f"></i>free</span>
<span><i class="sw" style="background:var(--bad)"></i>admission headroom</span></div></section>
<section><h2>Queue depth, last 10 minutes</h2><svg class="chart" id="chart-queue" viewBox="0 0 600 170" preserveAspectRatio="none"></svg>
<div class="legend"><span><i class="sw" style="background:#bf8700"></i>waiting</span><span><i class="sw" style="background:#1a7f37"></i>running</span></div></section>
<section><h2>Admission</h2><div class="kpis">
<div class="kpi"><b id="adm-submitted">–</b><span>submitted</span></div><div class="kpi"><b id="adm-admitted">–</b><span>admitted</span></div>
<div class="kpi"><b id="adm-finished">–</b><span>finished</span></div><div class="kpi"><b id="rejected-total">–</b><span>rejected</span></div>
<div class="kpi"><b id="preemptions">–</b><span>preemptions</span></div><div class="kpi"><b id="running">–</b><span>running</span></div>
<div class="kpi"><b id="waiting">–</b><span>waiting</span></div></div>
<table id="reasons"><thead><tr><th>rejection reason</th><th>count</th></tr></thead><tbody></tbody></table></section>
<section><h2>Recent rejections (worst-case blocks)</h2>
<table id="recent"><thead><tr><th>reason</th><th>class</th><th>tenant</th><th>need blocks</th><th>ago</th></tr></thead><tbody></tbody></table></section>
<section><h2>Latency per SLO class</h2><table id="latency"><thead><tr><th>class</th><th>requests</th><th>TTFT p50</th><th>TTFT p99</th>
<th>TPOT p50</th><th>TPOT p99</th></tr></thead><tbody></tbody></table></section>
<section><h2>Tenants</h2><table id="tenants"><thead><tr><th>tenant (hash)</th><th>in use</th><th>cached</th><th>requests' worst case</th>
<th>quota</th><th></th></tr></thead><tbody></tbody></table></section>
<section id="workers-section" class="wide" style="display:none"><h2>Workers</h2><table id="workers"><thead><tr><th>worker</th><th>state</th>
<th>load</th><th>in flight</th><th>KV free</th><th>KV used</th><th>KV cached</th><th>waiting</th><th>running</th><th>reason</th></tr></thead><tbody></tbody></table></section>
<section id="device-section" style="display:none"><h2>Device</h2><div class="kpis">
<div class="kpi"><b id="device-level">–</b><span>level</span></div><div class="kpi"><b id="device-transitions">–</b><span>transitions</span></div></div>
<p id="device-state" class="mono"></p></section>
<section id="tiers-section" style="display:none"><h2>KV tiers below RAM</h2><table id="tiers"><thead><tr><th>tier</th><th>state</th>
<th>hits</th><th>misses</th><th>stored</th><th>evicted</th><th>errors</th><th>bytes</th></tr></thead><tbody></tbody></table></section>
<section id="plots-section" style="display:none"><h2>Plots</h2><ul id="plots"></ul></section>
</main><div id="tip"></div>
<script>
"use strict";
const $ = id => document.getElementById(id);
const fmt = n => n == null ? "–" : Number(n).toLocaleString("en-US");
const ms = s => s > 0 ? (s < 1 ? (s * 1000).toFixed(0) + " ms" : s.toFixed(2) + " s") : "–";
const esc = s => String(s).replace(/[&<>"]/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c]));
function hue(h) { return h && h !== "?" ? parseInt(h.slice(0, 6), 16) % 360 : 0; }
function setNum(id, v) { const e = $(id); e.textContent = fmt(v); e.dataset.value = v; }
function rows(tbody, list) { $(tbody).querySelector("tbody").innerHTML = list.join(""); }
let last = null;

function drawMap(p) {
  const cv = $("map"), n = p.f.length, width = Math.min(cv.parentElement.clientWidth - 4, 1200);
  const px = Math.max(4, Math.min(24, Math.floor(Math.sqrt(width * 320 / Math.max(1, n)))));
  const cols = Math.max(1, Math.floor(width / px)), rws = Math.ceil(n / cols);
  cv.width = cols * px; cv.height = rws * px; cv.dataset.cols = cols; cv.dataset.px = px;
  const g = cv.getContext("2d"), gap = px > 6 ? 1 : 0;
  g.clearRect(0, 0, cv.width, cv.height);
  for (let i = 0; i < n; i++) {
    const x = (i % cols) * px, y = Math.floor(i / cols) * px, tot = p.f[i] + p.c[i] + p.u[i], s = px - gap;
    const hh = p.o[i] >= 0 ? hue(p.owners[p.o[i]]) : 0;
    g.fillStyle = "#e6e8eb"; g.fillRect(x, y, s, s);
    const hu = Math.round(s * p.u[i] / tot), hc = Math.round(s * p.c[i] / tot);
    if (hc > 0) { g.fillStyle = `hsl(${hh},65%,80%)`; g.fillRect(x, y + s - hu - hc, s, hc); }
    if (hu > 0) { g.fillStyle = `hsl(${hh},65%,45%)`; g.fillRect(x, y + s - hu, s, hu); }
    if (p.s[i] > 0) { g.fillStyle = "#111"; g.beginPath(); g.moveTo(x, y); g.lineTo(x + s / 2, y); g.lineTo(x, y + s / 2); g.fill(); }
  }
  $("group").textContent = p.group > 1 ? `each cell: ${p.group} blocks (bars: share in use / cached)` : "each cell: one block";
}

function tip(ev) {
  const t = $("tip");
  if (!last || !last.pool) return;
  const p = last.pool, cv = $("map"), r = cv.getBoundingClientRect(), k = cv.width / r.width;
  const px = +cv.dataset.px, cols = +cv.dataset.cols;
  const i = Math.floor((ev.clientY - r.top) * k / px) * cols + Math.floor((ev.clientX - r.left) * k / px);
  if (i < 0 || i >= p.f.length) { t.style.display = "none"; return; }
  const lo = i * p.group, hi = Math.min(p.total, lo + p.group) - 1, who = p.o[i] >= 0 ? p.owners[p.o[i]] || "?" : "–";
  const st = p.group === 1 ? (p.u[i] ? "in use" : p.c[i] ? "cached" : "free") : `${p.u[i]} in use, ${p.c[i]} cached, ${p.f[i]} free`;
  t.textContent = (p.group === 1 ? `block ${lo}` : `blocks ${lo}–${hi}`) + `\n${st}\nref count ${p.group === 1 ? "" : "max "}${p.r[i]}` +
      (p.s[i] ? ` (shared${p.group > 1 ? ": " + p.s[i] : ""})` : "") + `\ntenant ${who}` +
      (p.tables > 1 && p.t[i] >= 0 ? `\nKV table ${p.t[i]} of ${p.tables}` : "");
  t.style.display = "block"; t.style.left = ev.clientX + 12 + "px"; t.style.top = ev.clientY + 12 + "px";
}

// Lines over the history (age in seconds, newest last): the last ten
// minutes, or less while the server is younger than that.
function chart(id, series, hlines, ymax) {
  const W = 600, H = 170, L = 40, B = 16, ages = series[0].data.ages, top = Math.max(1, ymax);
  const span = Math.min(600, Math.max(30, ...ages));
  const X = a => L + (W - L) * (1 - Math.min(span, a) / span), Y = v => (H - B) - (H - B - 6) * v / top;
  const lbl = span >= 120 ? "−" + Math.round(span / 60) + " min" : "−" + Math.round(span) + " s";
  let out = `<line x1="${L}" y1="${H - B}" x2="${W}" y2="${H - B}" stroke="#d0d7de"/>` +
            `<text x="2" y="12">${fmt(top)}</text><text x="2" y="${H - B}">0</text>` +
            `<text x="${L}" y="${H - 3}">${lbl}</text><text x="${W - 20}" y="${H - 3}">now</text>`;
  for (const h of hlines) out += `<line x1="${L}" x2="${W}" y1="${Y(h.v)}" y2="${Y(h.v)}" stroke="${h.color}" stroke-dasharray="4 3"/>`;
  for (const s of series) {
    const pts = s.data.vals.map((v, j) => `${X(ages[j]).toFixed(1)},${Y(v).toFixed(1)}`).join(" ");
    out += `<polyline class="series" data-name="${s.name}" data-n="${s.data.vals.length}" data-max="${Math.max(0, ...s.data.vals)}" fill="none" stroke="${s.color}" stroke-width="1.5" points="${pts}"/>`;
  }
  $(id).innerHTML = out;
}

function renderServe(d) {
  const b = d.blocks;
  for (const k of ["total", "free", "used", "cached", "promised", "headroom"]) setNum("blocks-" + k, b[k]);
  $("hit-rate").textContent = (100 * d.prefix.hit_rate).toFixed(1) + " %";
  if (d.pool) drawMap(d.pool);
  const h = d.history, ser = k => ({ages: h.age_s, vals: h[k]});
  chart("chart-free", [{name: "available", color: "#0969da", data: ser("available")}, {name: "free", color: "#8c959f", data: ser("free")}],
        [{v: h.headroom, color: "#cf222e"}], h.total);
  chart("chart-queue", [{name: "queued", color: "#bf8700", data: ser("queued")}, {name: "running", color: "#1a7f37", data: ser("running")}],
        [], Math.max(4, ...h.queued, ...h.running));
  const a = d.admission;
  setNum("adm-submitted", a.submitted); setNum("adm-admitted", a.admitted); setNum("adm-finished", a.finished);
  setNum("rejected-total", a.rejected); setNum("preemptions", d.preemptions);
  setNum("running", d.running.requests); setNum("waiting", d.running.waiting_interactive + d.running.waiting_batch);
  const rs = Object.entries(a.by_reason).map(([k, v]) => `<tr id="rej-${k}"><td>${k}</td><td>${fmt(v)}</td></tr>`);
  for (const [k, v] of Object.entries(a.server_rejects)) rs.push(`<tr><td>${esc(k)} (server)</td><td>${fmt(v)}</td></tr>`);
  rows("reasons", rs);
  rows("recent", a.recent.slice(-12).reverse().map(r => `<tr><td>${r.reason}</td><td>${r.class}</td><td class="mono">${esc(r.tenant || "–")}</td>` +
       `<td>${fmt(r.need_blocks)}</td><td>${r.age_s.toFixed(0)} s</td></tr>`));
  rows("latency", Object.entries(d.latency).map(([k, v]) => `<tr><td>${k}</td><td>${fmt(v.requests)}</td><td>${ms(v.ttft_p50)}</td>` +
       `<td>${ms(v.ttft_p99)}</td><td>${ms(v.tpot_p50)}</td><td>${ms(v.tpot_p99)}</td></tr>`));
  rows("tenants", d.tenants.map(t => {
    const q = t.key_quota_blocks > 0 ? t.key_quota_blocks : t.quota_blocks, w = t.key_quota_blocks > 0 ? t.key_reserved_blocks : t.footprint_blocks;
    const pct = q ? Math.min(100, 100 * w / q) : 0;
    return `<tr><td class="mono"><i class="sw" style="background:hsl(${hue(t.tenant)},65%,45%)"></i>${esc(t.tenant)}</td><td>${fmt(t.used_blocks)}</td>` +
           `<td>${fmt(t.cached_blocks)}</td><td>${fmt(w)}</td><td>${q ? fmt(q) : "none"}</td>` +
           `<td><div class="bar"><i class="${pct >= 100 ? "over" : ""}" style="width:${pct}%"></i></div></td></tr>`;
  }));
  $("device-section").style.display = d.device ? "" : "none";
  if (d.device) {
    $("device-level").textContent = d.device.level; setNum("device-transitions", d.device.transitions);
    $("device-state").textContent = d.device.state;
  }
  const tr = d.tiers || [];
  $("tiers-section").style.display = tr.length ? "" : "none";
  rows("tiers", tr.map(t => `<tr id="tier-${esc(t.tier)}"><td>${esc(t.tier)}</td><td class="${t.available ? "up" : "down"}">${t.available ? "up" : "down"}</td>` +
       `<td>${fmt(t.hits)}</td><td>${fmt(t.misses)}</td><td>${fmt(t.stores)}</td><td>${fmt(t.evictions)}</td><td>${fmt(t.errors)}</td><td>${fmt(t.bytes)}</td></tr>`));
  const pl = d.plots || [];
  $("plots-section").style.display = pl.length ? "" : "none";
  $("plots").innerHTML = pl.map(n => `<li><a href="/dashboard/plots/${encodeURIComponent(n)}">${esc(n)}</a></li>`).join("");
}

function renderRouter(d) {
  $("pool-section").style.display = "none";
  $("workers-section").style.display = "";
  const w = d.workers, sum = k => w.reduce((s, x) => s + (x[k] || 0), 0);
  setNum("blocks-total", sum("kv_total")); setNum("blocks-free", sum("kv_free"));
  setNum("blocks-used", sum("kv_used")); setNum("blocks-cached", sum("kv_cached"));
  rows("workers", w.map(x => `<tr><td class="mono">${esc(x.url)}</td><td class="${x.up ? "up" : "down"}">${x.up ? "up" : "down"}</td>` +
       `<td>${x.load.toFixed(1)}</td><td>${fmt(x.inflight)}</td><td>${fmt(x.kv_free)}</td><td>${fmt(x.kv_used)}</td><td>${fmt(x.kv_cached)}</td>` +
       `<td>${fmt(x.waiting)}</td><td>${fmt(x.running)}</td><td>${esc(x.up ? "" : x.down_reason)}</td></tr>`));
  const h = d.history;
  chart("chart-free", [{name: "available", color: "#0969da", data: {ages: h.age_s, vals: h.available}}], [], Math.max(1, ...h.available));
  chart("chart-queue", [{name: "queued", color: "#bf8700", data: {ages: h.age_s, vals: h.queued}}, {name: "running", color: "#1a7f37", data: {ages: h.age_s, vals: h.running}}],
        [], Math.max(4, ...h.queued, ...h.running));
}

function render(d) {
  last = d;
  $("mode").textContent = d.mode; $("model").textContent = d.model || "";
  if (d.mode === "router") renderRouter(d); else renderServe(d);
  document.body.dataset.snapshots = +document.body.dataset.snapshots + 1;
  $("age").textContent = "updated " + new Date().toLocaleTimeString();
}

// SSE over fetch (EventSource cannot send the Authorization header).
async function connect() {
  const key = sessionStorage.getItem("kvserve-key") || "";
  const conn = $("conn");
  try {
    const res = await fetch("/dashboard/events", {headers: key ? {Authorization: "Bearer " + key} : {}});
    if (res.status === 401 || res.status === 403) {
      conn.textContent = res.status === 401 ? "admin key needed" : "not an admin key"; conn.className = "st err";
      $("keybox").style.display = "flex"; return;
    }
    if (!res.ok) throw new Error("HTTP " + res.status);
    conn.textContent = "live"; conn.className = "st live";
    const rd = res.body.getReader(), dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const {value, done} = await rd.read();
      if (done) break;
      buf += dec.decode(value, {stream: true});
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const ev = buf.slice(0, i); buf = buf.slice(i + 2);
        const data = ev.split("\n").filter(l => l.startsWith("data: ")).map(l => l.slice(6)).join("\n");
        if (data) render(JSON.parse(data));
      }
    }
    throw new Error("stream ended");
  } catch (e) {
    conn.textContent = "reconnecting (" + e.message + ")"; conn.className = "st err";
    setTimeout(connect, 2000);
  }
}
const m = location.hash.match(/key=([^&]+)/);
if (m) { sessionStorage.setItem("kvserve-key", decodeURIComponent(m[1])); history.replaceState(null, "", location.pathname); }
$("keygo").onclick = () => { sessionStorage.setItem("kvserve-key", $("key").value); $("keybox").style.display = "none"; connect(); };
$("map").addEventListener("mousemove", tip);
$("map").addEventListener("mouseleave", () => { $("tip").style.display = "none"; });
window.addEventListener("resize", () => { if (last && last.pool) drawMap(last.pool); });
connect();
</script></body></html>
)KVSPAGE";

}  // namespace

const std::string& dashboard_html() {
  static const std::string page(kPage);
  return page;
}

}  // namespace kvs::server
