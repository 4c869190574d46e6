// Inspections: the newest results with their evidence, a defect / review-queue filter, a result view
// (image, verdict, timings, rules) and the technician's review form, built from the bundle's schema
// by schema_form.js (loaded from here, so the page's HTML does not change).
"use strict";
(() => {
  const root = document.getElementById("inspection");
  if (!root) return;
  const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  const style = document.createElement("style");
  style.textContent = `#inspection { grid-column: 1 / -1; }
    #insp-list tr { cursor: pointer; } #insp-list[aria-busy=true] { opacity: .5; } #insp-list tr.sel { outline: 2px solid #4aa3ff; }
    #insp-list img { width: 64px; height: 48px; object-fit: contain; background: #000; border-radius: 3px; }
    .insp-body { display: grid; gap: 1rem; grid-template-columns: repeat(auto-fit, minmax(300px, 1fr)); align-items: start; }
    #insp-image-gone { color: var(--muted); font-style: italic; }
    #insp-image { width: 100%; max-height: 420px; object-fit: contain; background: #000; border-radius: 4px; }
    #review-form label, #review-form .sf-field { display: grid; grid-template-columns: 8rem 1fr auto; gap: .5rem; margin: .3rem 0; align-items: start; }
    #review-form input, #review-form select, #review-form button, #review-form textarea { font: inherit; padding: .3rem; }
    #review-form .sf-inline { display: inline-flex; gap: .3rem; align-items: center; margin: 0 .6rem 0 0; }
    #review-form fieldset { border: 1px solid #8884; border-radius: 4px; padding: .2rem .5rem; margin: 0; min-width: 0; }
    #review-form .sf-field { grid-template-columns: minmax(5rem, 8rem) minmax(0, 1fr) auto; }
    #review-form .sf-field .sf-field { display: block; margin: .2rem 0 .5rem; } /* nested: name above its field */
    #review-form .sf-field > :nth-child(2) { min-width: 0; }
    #review-form .sf-field input:not([type=checkbox]), #review-form .sf-field select, #review-form .sf-field textarea { width: 100%; box-sizing: border-box; }
    #review-form .sf-rows { margin: 0; padding: 0; list-style: none; }
    #review-form .sf-rows li { display: grid; grid-template-columns: minmax(0, 1fr) auto; gap: .4rem; align-items: start; margin: .3rem 0; }
    #review-form .sf-rows li > :first-child { width: 100%; box-sizing: border-box; }
    #review-form .sf-field > input[type=checkbox] { justify-self: start; }
    #review-form .sf-array button { min-width: 0; padding: .3rem .7rem; }
    #review-form .sf-off { opacity: .35; } #review-form .sf-json { font-family: monospace; }
    #review-form .sf-name { display: block; margin: 0; overflow-wrap: anywhere; }
    #review-form .buttons { display: flex; gap: .5rem; margin-top: .5rem; }
    #review-form button { min-height: 44px; min-width: 7rem; border-radius: 6px; border: 0; }`;
  document.head.appendChild(style);
  root.innerHTML = `<h2>Inspections
      <select id="insp-filter" aria-label="show">
        <option value="">all results</option><option value="defect=true">defects</option>
        <option value="review=pending">review queue</option></select></h2>
    <div class="insp-body">
      <table><thead><tr><th></th><th>time</th><th>camera</th><th>verdict</th></tr></thead><tbody id="insp-list"></tbody></table>
      <div id="insp-detail" hidden>
        <img id="insp-image" alt="evidence">
        <p id="insp-image-gone" hidden></p>
        <div id="insp-verdict" class="verdict"></div>
        <ul id="insp-regions" class="regions" hidden></ul>
        <div id="insp-info" class="kv"></div>
        <form id="review-form"><h2>Review</h2><div id="review-fields"></div>
          <label id="token-row" hidden><span>API token</span><input id="api-token" type="password" autocomplete="off"></label>
          <label><span>note</span><input name="__note" maxlength="500"></label>
          <div class="buttons"><button type="button" id="review-confirm" class="ok">Confirm</button>
          <button type="button" id="review-correct" class="warn">Save correction</button></div>
          <div id="review-status" role="status"></div></form>
      </div></div>`;
  const $ = (id) => document.getElementById(id);
  let schema = null, form = null, newest = 0, current = null, busy = false;
  const rows = new Map();

  const verdictText = (v) => !v ? "—" : typeof v.defect === "boolean"
    ? (v.defect ? `DEFECT${v.category ? " · " + v.category : ""}` : "OK") : JSON.stringify(v);
  const cls = (v) => v && v.defect === true ? "bad" : v && v.defect === false ? "ok" : "";

  function row(r) {
    const tr = document.createElement("tr");
    tr.dataset.id = r.id;
    // An image removed (retention, or by hand) is said so, not shown broken: the result says so
    // (evidence.removed), or its thumbnail answers 410 when the removal is found by that request.
    const thumb = r.evidence && r.evidence.uri
      ? `<img src="/api/v1/results/${encodeURIComponent(r.id)}/thumbnail.jpg" alt="">`
      : r.evidence && r.evidence.removed ? `<small class="gone">evidence removed</small>` : "";
    const state = r.review ? ` <small>${esc(r.review.state)}</small>` : "";
    tr.innerHTML = `<td>${thumb}</td><td>${esc(r.ts.slice(11, 19))}</td><td>${esc(r.camera)}</td>` +
      `<td class="${cls(r.verdict)}">${esc(verdictText(r.verdict))}${state}</td>`;
    tr.addEventListener("click", () => open(r.id));
    const img = tr.querySelector("img");
    if (img) img.addEventListener("error", () => img.replaceWith(Object.assign(document.createElement("small"),
      { className: "gone", textContent: "evidence removed" })), { once: true });
    return tr;
  }

  let resetPending = false; // a filter change whose query the device has not answered yet

  async function refresh(reset) {
    if (busy) { resetPending ||= reset; return; }
    busy = true;
    reset ||= resetPending;
    const list = $("insp-list");
    try {
      const filter = $("insp-filter").value;
      const after = reset ? 0 : newest;
      const q = `limit=20${filter ? "&" + filter : ""}${after ? "&after=" + after : ""}`;
      // Result queries are answered two at a time (429 beyond): app.js's fetchQuery asks again. The
      // list is cleared only once the answer is here, so a refusal never leaves it blank.
      if (reset) { resetPending = true; list.setAttribute("aria-busy", "true"); }
      const res = await fetchQuery(`/api/v1/inspections?${q}`);
      if (!res.ok) return; // still refused: the next poll asks again (a pending reset included)
      const { results } = await res.json();
      if (reset) { list.innerHTML = ""; rows.clear(); newest = 0; resetPending = false; list.removeAttribute("aria-busy"); }
      results.slice().reverse().forEach((r) => {
        newest = Math.max(newest, r.journal_seq);
        if (rows.has(r.id)) return;
        const tr = row(r);
        rows.set(r.id, tr);
        list.insertBefore(tr, list.firstChild);
      });
      while (list.children.length > 20) { rows.delete(list.lastChild.dataset.id); list.removeChild(list.lastChild); }
    } catch (e) { /* the status poll reports reachability */ } finally { busy = false; }
  }

  async function open(id, retried = false) {
    const r = await (await fetch(`/api/v1/results/${encodeURIComponent(id)}`, { cache: "no-store" })).json();
    current = r;
    rows.forEach((tr, k) => tr.classList.toggle("sel", k === id));
    $("insp-detail").hidden = false;
    const img = $("insp-image"), gone = $("insp-image-gone");
    const removed = r.evidence && r.evidence.removed;
    img.hidden = !(r.evidence && r.evidence.uri);
    gone.hidden = !removed;
    gone.textContent = removed ? `evidence removed (${removed.why === "retention" ? "deleted by retention"
      : "removed from the device's evidence folder"}, ${String(removed.at || "").slice(0, 19).replace("T", " ")})` : "";
    // Removed since the result was read: the image answers 410 and the result, read again, says why.
    img.onerror = () => {
      if (!current || current.id !== r.id || img.hidden) return;
      if (!retried) { open(r.id, true); return; }
      img.hidden = true;
      gone.hidden = false;
      gone.textContent = "evidence image unavailable";
    };
    if (r.evidence && r.evidence.uri) img.src = r.evidence.uri;
    $("insp-verdict").textContent = verdictText(r.verdict);
    $("insp-verdict").className = "verdict " + cls(r.verdict);
    if (typeof regionList === "function") regionList(r.regions, $("insp-regions")); // app.js: per-region outcomes
    const t = r.timings_ms || {};
    $("insp-info").innerHTML = `<span>camera</span><b>${esc(r.camera)}</b><span>time</span><b>${esc(r.ts)}</b>` +
      Object.entries(t).map(([k, v]) => `<span>${esc(k)} ms</span><b>${typeof v === "number" && Number.isFinite(v) ? v.toFixed(1) : "—"}</b>`).join("") +
      `<span>rules</span><b>${esc((r.rules || []).map((x) => x.name).join(", ") || "none")}</b>` +
      `<span>review</span><b id="insp-review">${esc(r.review ? r.review.state : "not reviewed")}</b>` +
      `<span>model said</span><b>${esc(r.text)}</b>`;
    const base = (r.review && r.review.correction) || r.verdict || {};
    await loadSchema(); // the bundle (and its schema) may have changed since the page opened
    $("review-status").textContent = "";
    if (!window.SchemaForm) {
      $("review-status").textContent = "the review form did not load: reload the page";
      return;
    }
    form = window.SchemaForm.build(schema, base, "rv");
    $("review-fields").replaceChildren(form.el);
  }

  async function send(action) {
    if (!current) return;
    const body = { action, note: $("review-form").elements.__note.value || undefined };
    if (action === "correct") {
      if (!form) return;
      const { value, errors } = form.read(); // checked here first; the server checks against the schema again
      if (errors.length) {
        $("review-status").textContent = `not saved: ${errors.join("; ")}`;
        $("review-status").className = "bad";
        return;
      }
      body.verdict = value;
    }
    const headers = { "Content-Type": "application/json" };
    const token = $("api-token").value;
    if (token) { headers.Authorization = `Bearer ${token}`; sessionStorage.setItem("edge-token", token); }
    const res = await fetch(`/api/v1/results/${encodeURIComponent(current.id)}/review`,
      { method: "POST", headers, body: JSON.stringify(body) });
    const data = await res.json();
    $("review-status").textContent = res.ok ? `saved: ${data.review.state}` : `not saved: ${data.error.message}`;
    $("review-status").className = res.ok ? "ok" : "bad";
    if (res.ok) {
      $("insp-review").textContent = data.review.state;
      const fresh = row({ ...current, review: data.review });
      const old = rows.get(current.id);
      if (old) { old.replaceWith(fresh); rows.set(current.id, fresh); }
    }
  }

  function load(src) {
    return new Promise((resolve, reject) => {
      const s = document.createElement("script");
      s.src = src;
      s.onload = resolve;
      s.onerror = () => reject(new Error(`${src} did not load`));
      document.head.appendChild(s);
    });
  }

  async function loadSchema() {
    try {
      const s = await (await fetch("/api/v1/review/schema", { cache: "no-store" })).json();
      schema = s.schema || { type: "object" };
      $("token-row").hidden = !s.token_required;
    } catch (e) { schema = { type: "object" }; }
  }

  async function start() {
    try {
      await load("/static/schema_form.js");
    } catch (e) {
      $("review-status").textContent = "the review form did not load: reload the page";
      $("review-status").className = "bad";
    }
    await loadSchema();
    $("api-token").value = sessionStorage.getItem("edge-token") || "";
    $("insp-filter").addEventListener("change", () => refresh(true));
    $("review-confirm").addEventListener("click", () => send("confirm"));
    $("review-correct").addEventListener("click", () => send("correct"));
    await refresh(true);
    // Polling with an `after` cursor costs one indexed query; it holds no server thread, unlike a stream.
    setInterval(() => { if (!document.hidden) refresh(false); }, 500);
  }
  start();
})();
