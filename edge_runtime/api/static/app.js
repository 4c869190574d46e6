// Status page: polls /api/v1/status, listens to /api/v1/events for new results, draws its own SVG charts.
"use strict";
const $ = (id) => document.getElementById(id);
const latencies = [];
const temps = [];
const STAGE_COLORS = { capture: "#6c7a89", preprocess: "#9b59b6", encode: "#4aa3ff", prefill: "#2fa84f", decode: "#d9a42b" };

function esc(s) { return String(s ?? "").replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]); }

function verdictText(v) {
  if (!v) return "—";
  if (typeof v.defect === "boolean") return v.defect ? `DEFECT${v.category ? " · " + v.category : ""}` : "OK";
  return JSON.stringify(v);
}
function verdictClass(v) { return v && v.defect === true ? "bad" : v && v.defect === false ? "ok" : ""; }

function line(svg, values) {
  if (!values.length) { svg.innerHTML = ""; return; }
  const max = Math.max(...values) * 1.1 || 1;
  const step = values.length > 1 ? 300 / (values.length - 1) : 0;
  const pts = values.map((v, i) => `${(i * step).toFixed(1)},${(80 - (v / max) * 76).toFixed(1)}`).join(" ");
  svg.innerHTML = `<polyline points="${pts}"/><text x="4" y="12" fill="#8b96a1" font-size="10">${max.toFixed(0)}</text>`;
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
      <img alt="latest frame of ${esc(cam.name)}"><div class="verdict"></div><div class="kv info"></div>`;
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
}

function refreshFrame(name) {
  const card = document.querySelector(`[data-camera="${CSS.escape(name)}"]`);
  if (card) card.querySelector("img").src = `/api/v1/cameras/${encodeURIComponent(name)}/frame.jpg?t=${Date.now()}`;
}

function addResult(r) {
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

async function poll() {
  try {
    const s = await (await fetch("/api/v1/status", { cache: "no-store" })).json();
    $("device").textContent = s.device;
    $("ready").textContent = s.ready ? "ready" : "loading";
    $("ready").className = "badge " + (s.ready ? "ok" : "warn");
    const m = s.mqtt || {};
    $("mqtt").textContent = m.enabled ? (m.connected ? "MQTT connected" : "MQTT offline") : "MQTT off";
    $("mqtt").className = "badge " + (m.enabled ? (m.connected ? "ok" : "bad") : "");
    s.cameras.forEach((c) => { cameraCard(c); refreshFrame(c.name); });
    const model = s.model || {};
    $("model").innerHTML = `<span>model</span><b>${esc(model.name)}@${esc(model.version)}</b>` +
      `<span>version</span><b>${esc(s.version)}</b><span>uptime</span><b>${Math.round(s.uptime_s)} s</b>` +
      `<span>queue</span><b>${s.inspection.queue_depth}/${s.inspection.queue_size}</b>` +
      `<span>journal</span><b>${s.journal.total}${m.enabled ? ` (${s.journal.unsent} not yet on MQTT)` : ""}</b>`;
    const g = s.governor;
    $("governor-panel").hidden = !g;
    if (g) {
      $("governor").textContent = g.level;
      $("governor").className = "badge " + (g.level === "normal" ? "ok" : g.level === "paused" ? "bad" : "warn");
      const hottest = Math.max(...Object.values(g.temperatures || { none: 0 }));
      temps.push(hottest);
      if (temps.length > 120) temps.shift();
      line($("thermal"), temps);
      $("thermal-now").innerHTML = Object.entries(g.temperatures || {}).map(([k, v]) => `<span>${esc(k)}</span><b>${v.toFixed(1)} °C</b>`).join("") +
        (g.power_w != null ? `<span>power</span><b>${g.power_w.toFixed(1)} W</b>` : "") +
        (g.reasons && g.reasons.length ? `<span>why</span><b>${esc(g.reasons.join("; "))}</b>` : "");
    }
  } catch (e) {
    $("ready").textContent = "unreachable";
    $("ready").className = "badge bad";
  }
}

async function loadRecent() {
  try {
    const { results } = await (await fetch("/api/v1/results?limit=20", { cache: "no-store" })).json();
    results.reverse().forEach(addResult);
  } catch (e) { /* the poll loop reports reachability */ }
}

function listen() {
  const es = new EventSource("/api/v1/events");
  es.addEventListener("open", () => { $("live").textContent = "live"; $("live").className = "badge ok"; });
  es.addEventListener("result", (ev) => addResult(JSON.parse(ev.data)));
  es.addEventListener("error", () => { $("live").textContent = "reconnecting"; $("live").className = "badge warn"; });
}

poll().then(loadRecent).then(listen);
setInterval(poll, 3000);
