// Status page: polls /api/v1/status, listens to /api/v1/events for new results, draws its own SVG charts.
"use strict";
const $ = (id) => document.getElementById(id);
const latencies = [];
const temps = [];
const powers = [];
const seen = new Set(); // result ids shown: the first page and the stream may overlap
let lastEventId = null; // resume point for the event stream (Last-Event-ID)
const STAGE_COLORS = { capture: "#6c7a89", preprocess: "#9b59b6", encode: "#4aa3ff", prefill: "#2fa84f", decode: "#d9a42b" };

function esc(s) { return String(s ?? "").replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]); }

function verdictText(v) {
  if (!v) return "—";
  if (typeof v.defect === "boolean") return v.defect ? `DEFECT${v.category ? " · " + v.category : ""}` : "OK";
  return JSON.stringify(v);
}
function verdictClass(v) { return v && v.defect === true ? "bad" : v && v.defect === false ? "ok" : ""; }

// An inspection program's regions, in the result's order: name and outcome (ok green, nok red, none grey:
// no verdict), the region's error or answer on hover. DOM calls only: names and texts come from results.
const OUTCOMES = { ok: ["ok", "OK"], nok: ["bad", "NOK"], none: ["none", "no verdict"] };
function regionList(regions, list = document.createElement("ul")) {
  list.className = "regions";
  list.replaceChildren();
  list.hidden = !Array.isArray(regions) || regions.length === 0;
  for (const g of (Array.isArray(regions) ? regions : []).slice(0, 64)) {
    const outcome = Object.hasOwn(OUTCOMES, g?.outcome) ? g.outcome : "none";
    const li = document.createElement("li");
    li.className = "badge " + OUTCOMES[outcome][0];
    li.dataset.region = String(g?.name ?? "");
    li.dataset.outcome = outcome;
    li.textContent = `${String(g?.name ?? "?").slice(0, 40)} · ${OUTCOMES[outcome][1]}`;
    li.title = String(g?.error || g?.text || "").slice(0, 300);
    list.appendChild(li);
  }
  return list;
}

// A line chart; fromZero=false scales between the lowest and highest value (temperatures).
function line(svg, raw, fromZero = true, unit = "") {
  const values = raw.filter(Number.isFinite);
  if (!values.length) { svg.innerHTML = ""; return; }
  let lo = fromZero ? 0 : Math.min(...values);
  let hi = Math.max(...values);
  if (hi - lo < 1e-9) { lo -= fromZero ? 0 : 1; hi += 1; }
  if (fromZero) hi *= 1.1; else { const pad = (hi - lo) * 0.1; lo -= pad; hi += pad; }
  const step = values.length > 1 ? 300 / (values.length - 1) : 0;
  const y = (v) => (78 - ((v - lo) / (hi - lo)) * 74).toFixed(1);
  const pts = values.map((v, i) => `${(i * step).toFixed(1)},${y(v)}`).join(" ");
  const label = (v, yy) => `<text x="4" y="${yy}" fill="#8b96a1" font-size="10">${v.toFixed(hi - lo < 10 ? 1 : 0)}${unit}</text>`;
  svg.innerHTML = `<polyline points="${pts}"/>${label(hi, 11)}${fromZero ? "" : label(lo, 77)}`;
}

function legend() {
  $("stage-legend").innerHTML = Object.entries(STAGE_COLORS)
    .map(([k, c]) => `<span><i style="background:${c}"></i>${k}</span>`).join("");
}

function stages(t) {
  const total = Object.keys(STAGE_COLORS).reduce((a, k) => a + (t[k] || 0), 0) || 1;
  $("stages").innerHTML = Object.entries(STAGE_COLORS)
    .map(([k, c]) => `<span title="${k} ${(t[k] || 0).toFixed(1)} ms" style="width:${(100 * (t[k] || 0)) / total}%;background:${c}"></span>`)
    .join("");
}

function cameraCard(cam) {
  let card = document.querySelector(`[data-camera="${CSS.escape(cam.name)}"]`);
  if (!card) {
    card = document.createElement("article");
    card.className = "card";
    card.dataset.camera = cam.name;
    card.innerHTML = `<h2><span>${esc(cam.name)}</span><span class="badge state"></span></h2>
      <img alt="latest frame of ${esc(cam.name)}"><div class="verdict"></div><ul class="regions" hidden></ul>
      <div class="kv info"></div>`;
    $("cameras").appendChild(card);
  }
  const badge = card.querySelector(".state");
  badge.textContent = cam.state;
  badge.className = "badge state " + (cam.state === "streaming" ? "ok" : cam.state === "failed" ? "bad" : "warn");
  const f = cam.frames;
  card.querySelector(".info").innerHTML =
    `<span>fps</span><b>${cam.fps}</b><span>inspected</span><b>${f.inspected}</b>` +
    `<span>dropped</span><b>${f.dropped}</b><span>trigger</span><b>${esc(cam.trigger)}</b>` +
    (cam.last_error && cam.state !== "streaming" ? `<span>error</span><b>${esc(cam.last_error)}</b>` : "");
  if (cam.last_result) showVerdict(card, cam.last_result);
  return card;
}

function showVerdict(card, r) {
  const el = card.querySelector(".verdict");
  el.textContent = verdictText(r.verdict);
  el.className = "verdict " + verdictClass(r.verdict);
  el.title = r.text;
  regionList(r.regions, card.querySelector(".regions"));
}

function refreshFrame(name) {
  const card = document.querySelector(`[data-camera="${CSS.escape(name)}"]`);
  if (card) card.querySelector("img").src = `/api/v1/cameras/${encodeURIComponent(name)}/frame.jpg?t=${Date.now()}`;
}

function addResult(r) {
  if (!r || !r.id || seen.has(r.id)) return;
  seen.add(r.id);
  if (seen.size > 500) seen.delete(seen.values().next().value);
  const row = document.createElement("tr");
  row.innerHTML = `<td>${esc(r.ts.slice(11, 19))}</td><td>${esc(r.camera)}</td>` +
    `<td class="${verdictClass(r.verdict)}">${esc(verdictText(r.verdict))}</td><td>${r.timings_ms.total.toFixed(0)}</td>`;
  const body = $("results");
  body.insertBefore(row, body.firstChild);
  while (body.children.length > 20) body.removeChild(body.lastChild);
  latencies.push(r.timings_ms.total);
  if (latencies.length > 60) latencies.shift();
  line($("latency"), latencies);
  stages(r.timings_ms);
  const card = document.querySelector(`[data-camera="${CSS.escape(r.camera)}"]`);
  if (card) { showVerdict(card, r); refreshFrame(r.camera); }
}

// api.auth: all — every read needs the token. The page trades it once for a read-only session cookie
// (POST /api/v1/session), which the browser then sends with every fetch, <img> and EventSource; the
// token itself stays in sessionStorage only for the review form's writes (review.js reads it there).
function askForToken() {
  $("signin").hidden = false;
  $("ready").textContent = "sign in"; $("ready").className = "badge warn";
}

async function signIn(ev) {
  ev.preventDefault();
  const token = $("signin-token").value;
  const res = await fetch("/api/v1/session", { method: "POST", headers: { Authorization: `Bearer ${token}` } });
  if (res.ok) { sessionStorage.setItem("edge-token", token); location.reload(); return; }
  $("signin-status").textContent = res.status === 401 ? "wrong token" : `refused (${res.status})`;
}

async function poll() {
  try {
    const res = await fetch("/api/v1/status", { cache: "no-store" });
    if (res.status === 401) { askForToken(); return false; }
    if (res.status === 403) { // api.auth: all without api.token: only the device itself may read
      $("ready").textContent = "local only"; $("ready").className = "badge warn";
      $("banner").hidden = false;
      $("banner").textContent = "This device shows its data only on itself until an API token is configured (api.token).";
      return false;
    }
    const s = await res.json();
    $("device").textContent = s.device;
    const loaded = s.model_loaded ?? s.ready;  // ready is also false while results cannot be journaled: the banner says why
    $("ready").textContent = loaded ? "ready" : "loading";
    $("ready").className = "badge " + (loaded ? "ok" : "warn");
    const m = s.mqtt || {};
    $("mqtt").textContent = m.enabled ? (m.connected ? "MQTT connected" : "MQTT offline") : "MQTT off";
    $("mqtt").className = "badge " + (m.enabled ? (m.connected ? "ok" : "bad") : "");
    s.cameras.forEach((c) => { cameraCard(c); refreshFrame(c.name); });
    const model = s.model || {};
    $("model").innerHTML = `<span>model</span><b>${esc(model.name)}@${esc(model.version)}</b>` +
      `<span>version</span><b>${esc(s.version)}</b><span>uptime</span><b>${Math.round(s.uptime_s)} s</b>` +
      `<span>queue</span><b>${s.inspection.queue_depth}/${s.inspection.queue_size}</b>` +
      `<span>journal</span><b>${s.journal.total}${m.enabled ? ` (${s.journal.unsent} not yet on MQTT)` : ""}</b>`;
    const h = s.health || { state: "ok", reasons: [] };
    $("banner").hidden = h.state !== "degraded";
    $("banner").textContent = h.state === "degraded" ? `Degraded: ${(h.reasons || []).join("; ") || "not ready"}` : "";
    lineStations(s.line_io);
    gateCameras(s.gate);
    const g = s.governor;
    $("governor-panel").hidden = !g;
    if (g) {
      $("governor").textContent = g.level;
      $("governor").className = "badge " + (g.level === "normal" ? "ok" : g.level === "paused" ? "bad" : "warn");
      const readings = Object.values(g.temperatures || {}).filter(Number.isFinite);
      if (readings.length) temps.push(Math.max(...readings)); // no sensors: no point, not -Infinity
      if (temps.length > 120) temps.shift();
      line($("thermal"), temps, false, " °C");
      if (Number.isFinite(g.power_w)) powers.push(g.power_w);
      if (powers.length > 120) powers.shift();
      line($("power"), powers, true, " W");
      $("thermal-now").innerHTML = Object.entries(g.temperatures || {}).map(([k, v]) => `<span>${esc(k)}</span><b>${v.toFixed(1)} °C</b>`).join("") +
        (Number.isFinite(g.power_w) ? `<span>power</span><b>${g.power_w.toFixed(1)} W</b>` : "") +
        (g.reasons && g.reasons.length ? `<span>why</span><b>${esc(g.reasons.join("; "))}</b>` : "");
    }
  } catch (e) {
    $("ready").textContent = "unreachable";
    $("ready").className = "badge bad";
  }
  return true;
}

// Line I/O (docs/line-io.md): one row per station, the signals as the PLC reads them.
const LINE_RESULT = ["none", "OK", "NOK", "error"];
function lineStations(lio) {
  $("line-panel").hidden = !(lio && lio.enabled);
  if (!lio || !lio.enabled) return;
  const flag = (on, bad) => `<span class="badge ${on ? (bad ? "bad" : "ok") : ""}">${on ? "1" : "0"}</span>`;
  $("line-stations").innerHTML = lio.stations.map((st) => {
    const g = st.signals;
    return `<tr><td>${esc(st.name)} <small>${esc(st.camera)}</small></td><td>${flag(g.ready)}</td>` +
      `<td>${flag(g.busy)}</td><td>${flag(g.acquisition_done)}</td><td>${flag(g.result_valid)}</td>` +
      `<td>${Number(g.inspection_seq)}</td><td>${esc(g.part_id)}</td><td>${esc(LINE_RESULT[g.result] ?? g.result)}</td>` +
      `<td>${Number(g.defect_code)}</td><td>${Number(g.buffer_count)}</td><td>${flag(g.overrun, true)}</td>` +
      `<td title="${esc(st.fault || "")}">${flag(g.fault, true)}</td><td>${Number(g.heartbeat)}</td></tr>`;
  }).join("");
}

// The anomaly gate (docs/inspection.md#in-the-daemon): one row per gated camera; a disagreement (an audit
// the model called NOK) is red and links to that result.
function gateCameras(gates) {
  const rows = Object.entries(gates || {});
  $("gate-panel").hidden = rows.length === 0;
  $("gate-cameras").innerHTML = rows.map(([name, g]) => {
    const dis = Number(g.disagreements);
    const last = g.last_disagreement ? ` <a href="/api/v1/results/${encodeURIComponent(g.last_disagreement)}">last</a>` : "";
    return `<tr><td>${esc(name)}</td><td>${esc(g.mode)}</td><td>${Number(g.threshold).toPrecision(4)}</td>` +
      `<td>${Number(g.gated)}</td><td>${Number(g.passed)}</td><td>${Number(g.skipped)}</td><td>${Number(g.audits)}</td>` +
      `<td><span class="badge ${dis ? "bad" : "ok"}">${dis}</span>${last}</td><td>${Number(g.errors)}</td></tr>`;
  }).join("");
}

// The device answers two result queries at a time (429 beyond): wait and ask again, up to 4 times
// 1 s apart. Also used by review.js (the Inspections list).
async function fetchQuery(url) {
  const get = () => fetch(url, { cache: "no-store" });
  let res = await get();
  for (let left = 4; res.status === 429 && left > 0; left--) {
    await new Promise((resolve) => setTimeout(resolve, 1000));
    res = await get();
  }
  return res;
}

async function loadRecent() {
  try {
    // Asked again on a 429 before the event stream starts from this page's last_event_id.
    const res = await fetchQuery("/api/v1/results?limit=20");
    const page = await res.json();
    lastEventId = page.last_event_id; // events after this one are replayed by the stream
    page.results.reverse().forEach(addResult);
  } catch (e) { /* the poll loop reports reachability */ }
}

function evalRate(r) {
  return r && r.rate != null ? `${(r.rate * 100).toFixed(2)}% (${r.count}/${r.of})` : "—";
}

async function loadEvaluations() {
  try {
    const page = await (await fetch("/api/v1/evaluations", { cache: "no-store" })).json();
    const rows = [];
    for (const ev of page.evaluations || []) {
      for (const v of ev.variants || []) {
        rows.push(`<tr><td>${esc(ev.generated)}</td><td>${esc(v.model)}</td><td>${esc(ev.dataset && ev.dataset.samples)}</td>` +
          `<td>${esc(evalRate(v.escape))}</td><td>${esc(evalRate(v.false_reject))}</td><td>${esc(ev.out)}</td></tr>`);
      }
    }
    $("evaluations").innerHTML = rows.join("");
    $("evaluations-panel").hidden = rows.length === 0;
  } catch (e) { /* the poll loop reports reachability */ }
}

function listen() {
  // The server ends each stream after a while; EventSource reconnects by itself with Last-Event-ID.
  // A refused connection (429: too many streams) closes it for good, so retry by hand from the last id.
  const url = "/api/v1/events" + (lastEventId != null ? `?last_event_id=${lastEventId}` : "");
  const es = new EventSource(url);
  es.addEventListener("open", () => { $("live").textContent = "live"; $("live").className = "badge ok"; });
  es.addEventListener("result", (ev) => {
    if (ev.lastEventId) lastEventId = Number(ev.lastEventId);
    addResult(JSON.parse(ev.data));
  });
  es.addEventListener("error", () => {
    $("live").textContent = "reconnecting"; $("live").className = "badge warn";
    if (es.readyState === EventSource.CLOSED) setTimeout(listen, 5000);
  });
}

legend();
$("signin").addEventListener("submit", signIn);
poll().then((signedIn) => { if (signedIn) { loadRecent().then(listen); loadEvaluations(); } });
setInterval(poll, 3000);
