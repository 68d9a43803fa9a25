// kiln lab, the core every lab page uses: DOM and format helpers, the API key, the API
// helper and its error area, the SSE reader, the hash router, the wizard steps, the live
// view of a job (the SVG charts are chart.js). Pages (quantize.js, finetune.js, dataset.js,
// status.js) register themselves with Lab.route(). No framework, no build step.
"use strict";

const Lab = (() => {
  const KEY = "kiln-api-key"; // the chat page at `/` reads the same entry
  const SVG = "http://www.w3.org/2000/svg";
  const routes = {};
  let current = null; // { name, controller, ctx } of the page on screen

  const $ = (id) => document.getElementById(id);

  // ---- DOM ---------------------------------------------------------------------------
  // el("button", {id, class, text, onclick, dataset, ...attributes}, ...children).
  // Text always goes in as text nodes, so API strings never reach innerHTML.
  function el(tag, props, ...kids) {
    return build(document.createElement(tag), props, kids);
  }
  function svg(tag, props, ...kids) {
    return build(document.createElementNS(SVG, tag), props, kids);
  }
  function build(node, props, kids) {
    let value;
    for (const [k, v] of Object.entries(props || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") node.setAttribute("class", v);
      else if (k === "text") node.textContent = String(v);
      else if (k === "value") value = v; // after the children: a select needs its options
      else if (k === "dataset") Object.assign(node.dataset, v);
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? "" : String(v));
    }
    append(node, kids);
    if (value !== undefined) node.value = String(value);
    return node;
  }
  function append(node, kids) {
    for (const kid of kids.flat(Infinity)) {
      if (kid === null || kid === undefined || kid === false) continue;
      node.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    }
    return node;
  }
  // For the few places that build HTML text: every API string goes through this.
  const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

  // A labelled form field: el + label + optional hint wired with aria-describedby.
  function field(label, control, hint) {
    const id = control.id;
    if (hint) control.setAttribute("aria-describedby", id + "-hint");
    return el("div", { class: "field" },
      el("label", { for: id, text: label }), control,
      hint ? el("span", { class: "hint", id: id + "-hint", text: hint }) : null);
  }

  // ---- formats -----------------------------------------------------------------------
  function bytes(n) {
    if (n === null || n === undefined || !Number.isFinite(Number(n))) return "unknown";
    n = Number(n);
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i === 0 ? String(n) : n.toFixed(n < 10 ? 2 : 1)) + " " + units[i];
  }
  function num(n, digits = 4) {
    if (n === null || n === undefined || n === "" || !Number.isFinite(Number(n))) return "–";
    n = Number(n);
    if (n !== 0 && (Math.abs(n) < 1e-3 || Math.abs(n) >= 1e6)) return n.toExponential(2);
    return String(Number(n.toPrecision(digits)));
  }
  // Job times are SQLite's `YYYY-MM-DD HH:MM:SS` in UTC; shown in the reader's local time.
  function time(s) {
    if (s === null || s === undefined || s === "") return "–";
    let d;
    if (typeof s === "number") d = new Date(s > 1e12 ? s : s * 1000);
    else d = new Date(/^\d{4}-\d\d-\d\d \d/.test(s) ? s.replace(" ", "T") + "Z" : s);
    return Number.isNaN(d.getTime()) ? String(s) : d.toLocaleString();
  }
  const pct = (p) => Math.round(Math.max(0, Math.min(1, Number(p) || 0)) * 100) + "%";
  const sleep = (ms, signal) => new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    if (signal) signal.addEventListener("abort", () => { clearTimeout(t); resolve(); }, { once: true });
  });

  // ---- API key and errors ------------------------------------------------------------
  const key = () => localStorage.getItem(KEY) || "";
  function setKey(k) {
    if (k) localStorage.setItem(KEY, k); else localStorage.removeItem(KEY);
  }
  function headers() {
    const h = {};
    if (key()) h.authorization = "Bearer " + key();
    return h;
  }

  class ApiError extends Error {
    constructor(message, status) { super(message); this.name = "ApiError"; this.status = status; }
  }
  // Two shapes: the lab routes answer {ok:false, error:"..."}, the OpenAI-style routes and
  // every 401 answer {error:{message, type}}.
  function errorMessage(body, status) {
    const e = body && body.error;
    if (e && typeof e === "object" && e.message) return String(e.message);
    if (typeof e === "string" && e) return e;
    return "HTTP " + status;
  }

  let errorSource = null; // who showed the error: a refresh loop clears only its own
  function report(err, source = "page") {
    if (!err || err.name === "AbortError") return;
    const text = err instanceof Error ? err.message : String(err);
    if ($("error-text").textContent !== text) $("error-text").textContent = text; // re-announce only news
    const unauthorized = err.status === 401;
    $("error-hint").hidden = !unauthorized;
    $("api-key").setAttribute("aria-invalid", unauthorized ? "true" : "false");
    $("error").hidden = false;
    errorSource = source;
  }
  function clearError(source) {
    if (source && errorSource !== source) return;
    $("error").hidden = true;
    $("error-text").textContent = "";
    $("api-key").removeAttribute("aria-invalid");
    errorSource = null;
  }

  // fetch + JSON, throwing ApiError with the API's own message on any failure.
  async function api(path, opts = {}) {
    const init = { method: opts.method || (opts.body !== undefined ? "POST" : "GET"), headers: headers(), signal: opts.signal };
    if (opts.body !== undefined) {
      init.body = JSON.stringify(opts.body);
      init.headers["content-type"] = "application/json";
    }
    let r;
    try { r = await fetch(path, init); } catch (e) {
      if (e.name === "AbortError") throw e;
      throw new ApiError("cannot reach the server (" + e.message + ")", 0);
    }
    const text = await r.text();
    let body = null;
    try { body = text ? JSON.parse(text) : null; } catch { body = null; }
    if (!r.ok || (body && body.ok === false)) {
      throw new ApiError(body ? errorMessage(body, r.status) : (text.trim() || "HTTP " + r.status), r.status);
    }
    return body;
  }

  // ---- SSE ---------------------------------------------------------------------------
  // EventSource cannot send the Authorization header, so streams are read with fetch and
  // their frames parsed here. Resolves after `event: end` (or after a terminal event when
  // the body closes); a connection that drops earlier is resumed with Last-Event-ID.
  const TERMINAL = new Set(["done", "failed", "cancelled"]);
  async function stream(path, onEvent, signal) {
    let lastId = null, finished = false;
    for (let attempt = 0; attempt < 8 && !finished; attempt++) {
      if (attempt) await sleep(1500, signal);
      if (signal && signal.aborted) throw new DOMException("aborted", "AbortError");
      const h = headers();
      if (lastId !== null) h["last-event-id"] = lastId;
      let r;
      try { r = await fetch(path, { headers: h, signal }); } catch (e) {
        if (e.name === "AbortError") throw e;
        continue; // the server may be restarting: try again
      }
      if (!r.ok) {
        const body = await r.json().catch(() => null);
        throw new ApiError(errorMessage(body, r.status), r.status);
      }
      finished = await readFrames(r.body, (frame) => {
        if (frame.id !== undefined) lastId = frame.id;
        if (frame.event === "end") return true;
        if (!frame.data) return false;
        let ev;
        try { ev = JSON.parse(frame.data); } catch { return false; }
        if (ev && TERMINAL.has(ev.type)) finished = true;
        onEvent(ev);
        return false;
      }) || finished;
    }
    if (!finished) throw new ApiError("the job's event stream kept dropping", 0);
  }
  // Splits the body into frames (blank-line separated `field: value` lines, spec WHATWG SSE).
  async function readFrames(body, onFrame) {
    const reader = body.getReader();
    const dec = new TextDecoder();
    let buf = "", frame = { data: [] };
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return false;
        buf += dec.decode(value, { stream: true });
        let nl;
        while ((nl = buf.indexOf("\n")) >= 0) {
          let line = buf.slice(0, nl);
          buf = buf.slice(nl + 1);
          if (line.endsWith("\r")) line = line.slice(0, -1);
          if (line === "") {
            const f = { event: frame.event, id: frame.id, data: frame.data.join("\n") };
            frame = { data: [] };
            if ((f.data || f.event) && onFrame(f)) return true;
            continue;
          }
          if (line.startsWith(":")) continue; // a comment / keep-alive
          const colon = line.indexOf(":");
          const name = colon < 0 ? line : line.slice(0, colon);
          let val = colon < 0 ? "" : line.slice(colon + 1);
          if (val.startsWith(" ")) val = val.slice(1);
          if (name === "data") frame.data.push(val);
          else if (name === "event") frame.event = val;
          else if (name === "id") frame.id = val;
        }
      }
    } finally {
      reader.cancel().catch(() => {});
    }
  }

  // ---- router ------------------------------------------------------------------------
  // `#/name?a=b`: the page name and its parameters (e.g. #/finetune?data_dir=/x).
  function parseHash() {
    const h = location.hash.replace(/^#\/?/, "");
    const q = h.indexOf("?");
    const name = (q < 0 ? h : h.slice(0, q)) || "status";
    return { name, params: new URLSearchParams(q < 0 ? "" : h.slice(q + 1)) };
  }
  function route(name, page) { routes[name] = page; }
  function render() {
    const { name, params } = parseHash();
    const page = routes[name];
    if (!page) { location.replace("#/status"); return; }
    if (current) current.controller.abort(); // stops the old page's streams and timers
    const controller = new AbortController();
    const ctx = { params, signal: controller.signal, reload: null };
    current = { name, controller, ctx };
    clearError();
    document.title = page.title + " · kiln lab";
    for (const a of document.querySelectorAll("nav a[data-route]")) {
      if (a.dataset.route === name) a.setAttribute("aria-current", "page");
      else a.removeAttribute("aria-current");
    }
    const view = $("view");
    view.replaceChildren();
    view.dataset.page = name;
    Promise.resolve(page.render(view, ctx)).catch((e) => report(e));
  }
  // Runs fn now and every ms until the page is left; never two at once.
  function every(ms, fn, signal) {
    let busy = false;
    const tick = async () => {
      if (busy || signal.aborted) return;
      busy = true;
      try { await fn(); } finally { busy = false; }
    };
    tick();
    const t = setInterval(tick, ms);
    signal.addEventListener("abort", () => clearInterval(t), { once: true });
  }

  // ---- wizard ------------------------------------------------------------------------
  // The steps as an ordered list over one panel per step; only the current panel shows,
  // and its list item carries aria-current="step". Ids: <p>-steps, <p>-step-N, <p>-panel-N.
  function wizard(view, prefix, labels) {
    const list = el("ol", { class: "steps", id: prefix + "-steps", "aria-label": "Steps" });
    const panels = labels.map((label, i) => {
      const n = i + 1;
      list.append(el("li", { id: `${prefix}-step-${n}` },
        el("span", { class: "num", "aria-hidden": "true", text: n }), label));
      return el("section", { id: `${prefix}-panel-${n}`, class: "panel", hidden: true, "aria-labelledby": `${prefix}-h-${n}` },
        el("h2", { id: `${prefix}-h-${n}`, tabindex: "-1", text: `Step ${n} of ${labels.length}: ${label}` }));
    });
    view.append(list, ...panels);
    let at = 0;
    function go(n, focus = true) {
      at = n;
      panels.forEach((p, i) => { p.hidden = i + 1 !== n; });
      list.querySelectorAll("li").forEach((li, i) => {
        if (i + 1 === n) li.setAttribute("aria-current", "step"); else li.removeAttribute("aria-current");
        if (i + 1 < n) li.dataset.done = ""; else delete li.dataset.done;
      });
      // Move focus to the new step's heading so keyboard and screen-reader users follow.
      if (focus) panels[n - 1].querySelector("h2").focus();
    }
    return { panels, go, get at() { return at; } };
  }

  // ---- a job, live -------------------------------------------------------------------
  // The progress area of one job: stages seen, a <progress>, the latest message, the log,
  // and data-state (queued/running/done/failed/cancelled) for styles and tests.
  function jobArea(prefix) {
    const progress = el("progress", { id: prefix + "-progress", max: "1", value: "0", "aria-labelledby": prefix + "-stage" });
    const node = el("div", { class: "job", id: prefix + "-job", "data-state": "queued" },
      // Only the state is announced (role=status): the stage and message change too often.
      el("p", {}, el("span", { class: "state state-queued", id: prefix + "-state", role: "status", text: "queued" }), " · ",
        el("span", { id: prefix + "-stage", text: "waiting to start" }), " ",
        el("span", { id: prefix + "-pct", class: "muted", text: "0%" })),
      progress,
      el("ol", { class: "stages", id: prefix + "-stages", "aria-label": "Stages" }),
      el("p", { id: prefix + "-message", class: "muted" }),
      el("details", { id: prefix + "-log-box" }, el("summary", { text: "Log" }),
        el("pre", { class: "log", id: prefix + "-log" })));
    const q = (s) => node.querySelector("#" + prefix + "-" + s);
    let lines = 0;
    function setState(state) {
      node.dataset.state = state;
      q("state").textContent = state;
      q("state").className = "state state-" + state;
    }
    function setProgress(p) {
      if (p === undefined || p === null || !Number.isFinite(Number(p))) return;
      progress.value = Math.max(0, Math.min(1, Number(p)));
      q("pct").textContent = pct(p);
    }
    function stage(name) {
      q("stage").textContent = name;
      const list = q("stages");
      let li = [...list.children].find((x) => x.dataset.stage === name);
      if (!li) li = list.appendChild(el("li", { dataset: { stage: name }, text: name }));
      for (const x of list.children) if (x === li) x.setAttribute("aria-current", "step"); else x.removeAttribute("aria-current");
    }
    function log(line) {
      const pre = q("log");
      if (lines++ > 2000) pre.textContent = pre.textContent.slice(pre.textContent.length / 2);
      pre.append(String(line) + "\n");
    }
    // One event of the job's stream (or its row, for the state it starts in).
    function update(ev) {
      switch (ev.type) {
        case "started": setState("running"); stage("started"); break;
        case "stage":
          setState("running");
          if (ev.stage) stage(ev.stage);
          setProgress(ev.progress);
          if (ev.message) q("message").textContent = ev.message;
          break;
        case "log": log(ev.line ?? ev.message ?? ""); break;
        case "metric": setProgress(ev.progress); break;
        case "done": setState("done"); setProgress(1); stage("done"); q("message").textContent = "finished"; break;
        case "failed": setState("failed"); stage("failed"); q("message").textContent = ev.error || "failed"; break;
        case "cancelled": setState("cancelled"); stage("cancelled"); q("message").textContent = ev.reason || "cancelled"; break;
      }
    }
    function fromRow(job) {
      if (!job) return;
      setState(job.status === "queued" ? "queued" : job.status || "queued");
      setProgress(job.progress);
      if (job.stage) stage(job.stage);
      if (job.error || job.message) q("message").textContent = job.error || job.message;
    }
    return { node, update, fromRow, setState, get state() { return node.dataset.state; } };
  }
  // Follows a job's stream into its area; onEvent sees every event. Resolves with the
  // terminal event (or the row's end state when the stream had none).
  async function follow(jobId, area, onEvent, signal) {
    let end = null;
    await stream(`/api/jobs/${encodeURIComponent(jobId)}/stream`, (ev) => {
      area.update(ev);
      if (TERMINAL.has(ev.type)) end = ev;
      if (onEvent) onEvent(ev);
    }, signal);
    if (!end) {
      const { job } = await api(`/api/jobs/${encodeURIComponent(jobId)}`, { signal });
      area.fromRow(job);
      end = { type: job.status === "done" ? "done" : job.status, error: job.error, output_dir: job.output_path };
    }
    if (end.type === "failed") report("The job failed: " + (end.error || "no reason given")); // announced, in view
    return end;
  }

  // ---- shared bits of the pages ------------------------------------------------------
  // The model list of /api/lab/models with the served model first (added when missing).
  async function models(signal) {
    const body = await api("/api/lab/models", { signal });
    const list = Array.isArray(body.models) ? body.models.slice() : [];
    const served = body.served || null;
    if (served && served.path) {
      const i = list.findIndex((m) => m.path === served.path);
      const m = i >= 0 ? list.splice(i, 1)[0] : { name: served.name, path: served.path, kind: "file" };
      list.unshift({ ...m, served: true });
    }
    return { list, served };
  }
  // Radio cards for a model list, with a free path field; returns the chosen source.
  function modelPicker(prefix, legendText, list) {
    const radios = list.map((m, i) => el("li", {}, el("label", { for: `${prefix}-${i}` },
      el("input", { type: "radio", name: prefix, id: `${prefix}-${i}`, value: m.path, checked: i === 0 }),
      el("span", {}, el("span", { class: "name", text: m.name || m.path }), m.served ? " (served now)" : "",
        el("span", { class: "desc", text: [m.path, m.kind, m.size_bytes ? bytes(m.size_bytes) : ""].filter(Boolean).join(" · ") })))));
    const path = el("input", { id: prefix + "-path", type: "text", spellcheck: "false", placeholder: "/path/to/model.gguf or folder" });
    const node = el("div", {},
      el("fieldset", {}, el("legend", { text: legendText }),
        list.length ? el("ul", { class: "choices", id: prefix + "-list" }, radios) : el("p", { class: "muted", text: "No models found in kiln's cache." })),
      field("Or a path (a GGUF file, a Hugging Face or MLX folder, or a name)", path, "When filled, this wins over the list."));
    const chosen = () => path.value.trim() || (node.querySelector(`input[name="${prefix}"]:checked`) || {}).value || "";
    return { node, chosen, path };
  }
  // A dataset's first rows as a table: one column per key; chat messages as role: text.
  function rowsTable(rows, id) {
    rows = Array.isArray(rows) ? rows : [];
    const cols = [...new Set(rows.flatMap((r) => (r && typeof r === "object" ? Object.keys(r) : ["value"])))];
    const cell = (v) => {
      if (typeof v === "string") return v;
      if (Array.isArray(v) && v.every((m) => m && typeof m === "object" && "role" in m)) {
        return v.map((m) => `${m.role}: ${typeof m.content === "string" ? m.content : JSON.stringify(m.content)}`).join("\n");
      }
      return v === undefined ? "" : JSON.stringify(v);
    };
    return el("div", { class: "table-wrap", tabindex: "0", role: "region", "aria-label": "First rows" },
      el("table", { id, "data-rows": rows.length },
        el("thead", {}, el("tr", {}, el("th", { scope: "col", text: "#" }), cols.map((c) => el("th", { scope: "col", text: c })))),
        el("tbody", {}, rows.map((r, i) => el("tr", {}, el("td", { text: i + 1 }),
          cols.map((c) => el("td", { class: "cell", text: cell(r && typeof r === "object" ? r[c] : r) })))))));
  }
  // inspect-dataset's answer: format, counts and the first rows.
  function datasetSummary(info, prefix) {
    return el("div", {},
      el("dl", { class: "kv" },
        el("dt", { text: "Format" }), el("dd", { id: prefix + "-format", text: info.format || "unknown" }),
        el("dt", { text: "Training rows" }), el("dd", { id: prefix + "-train", text: info.n_train ?? "–" }),
        el("dt", { text: "Validation rows" }), el("dd", { id: prefix + "-valid", text: info.n_valid ?? "–" })),
      rowsTable(info.rows, prefix + "-rows"));
  }

  // ---- start -------------------------------------------------------------------------
  function start() {
    $("api-key").value = key();
    $("key-form").addEventListener("submit", (e) => {
      e.preventDefault();
      setKey($("api-key").value.trim());
      clearError();
      // Reload what the page shows with the new key, keeping its state when it can.
      if (current && current.ctx.reload) current.ctx.reload(); else render();
    });
    $("error-close").addEventListener("click", () => clearError());
    window.addEventListener("hashchange", render);
    render();
  }
  document.addEventListener("DOMContentLoaded", start);

  return {
    $, el, svg, esc, field, bytes, num, time, pct, sleep, key, api, report, clearError, stream,
    route, every, wizard, jobArea, follow, models, modelPicker,
    rowsTable, datasetSummary, ApiError,
  };
})();
