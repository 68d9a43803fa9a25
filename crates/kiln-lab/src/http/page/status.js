// The status page: every job with its state and progress (cancel on live ones, the event
// log of a selected one tailed over SSE), and the memory picture from /stats. It refreshes
// every two seconds, updating rows in place so keyboard focus on a button is never lost.
"use strict";
(() => {
  const { $, el, api, report } = Lab;
  const LIVE = new Set(["queued", "running"]);
  const KINDS = [["", "all kinds"], ["quantize", "quantize"], ["finetune", "finetune"], ["dataset", "dataset"]];

  Lab.route("status", { title: "Status", render });

  function render(view, ctx) {
    const st = { ctx, tail: null, tailId: null };
    view.append(el("h1", { text: "Status" }),
      el("section", { "aria-labelledby": "st-mem-h" },
        el("h2", { id: "st-mem-h", text: "Memory" }),
        el("div", { id: "st-memory", "aria-busy": "true" }, el("p", { class: "muted", text: "Loading /stats…" }))),
      el("section", { "aria-labelledby": "st-jobs-h" },
        el("h2", { id: "st-jobs-h", text: "Jobs" }),
        el("div", { class: "actions" },
          el("label", { for: "st-kind", text: "Show" }),
          el("select", { id: "st-kind", onchange: () => refresh(st) }, KINDS.map(([v, t]) => el("option", { value: v, text: t }))),
          el("button", { id: "st-refresh", type: "button", text: "Refresh now", onclick: () => refresh(st) })),
        el("div", { class: "table-wrap", tabindex: "0", role: "region", "aria-label": "Jobs" },
          el("table", { id: "st-jobs", class: "jobs", "data-loaded": "0" },
            el("thead", {}, el("tr", {}, ["Job", "Kind", "State", "Progress", "Message", "Started"].map((h) => el("th", { scope: "col", text: h })))),
            el("tbody", { id: "st-rows" }))),
        el("p", { id: "st-empty", class: "muted", hidden: true, text: "No jobs yet. Start one from Quantize, Fine-tune or Dataset." })),
      el("section", { id: "st-tail", hidden: true, "aria-labelledby": "st-log-title" },
        el("h2", { id: "st-log-title", text: "Events" }),
        el("p", { id: "st-log-state", class: "muted" }),
        el("pre", { class: "log", id: "st-log", tabindex: "0" })));
    ctx.reload = () => refresh(st);
    Lab.every(2000, () => refresh(st), ctx.signal);
  }

  async function refresh(st) {
    await Promise.all([jobs(st), stats(st)]);
  }

  // ---- jobs ----------------------------------------------------------------------------
  async function jobs(st) {
    const kind = $("st-kind") ? $("st-kind").value : "";
    try {
      const body = await api("/api/jobs?limit=50" + (kind ? "&kind=" + encodeURIComponent(kind) : ""), { signal: st.ctx.signal });
      const list = Array.isArray(body.jobs) ? body.jobs : [];
      const tbody = $("st-rows");
      if (!tbody) return;
      const keep = new Set(list.map((j) => "st-job-" + j.id));
      for (const tr of [...tbody.children]) if (!keep.has(tr.id)) tr.remove();
      list.forEach((j, i) => {
        const tr = $("st-job-" + j.id) || newRow(st, j);
        update(tr, j);
        if (tbody.children[i] !== tr) tbody.insertBefore(tr, tbody.children[i] || null);
      });
      $("st-empty").hidden = list.length > 0;
      $("st-jobs").dataset.loaded = "1";
      Lab.clearError("refresh");
    } catch (e) {
      report(e, "refresh");
    }
  }
  // A row is built once; later refreshes only change its text and buttons. The buttons sit
  // under the job's id, in the first column, so a phone shows them without scrolling.
  function newRow(st, j) {
    const id = j.id;
    return el("tr", { id: "st-job-" + id },
      el("td", {}, el("code", { text: id }),
        el("div", { class: "st-actions row-actions" },
          el("button", { id: "st-tail-" + id, type: "button", "aria-pressed": "false", "aria-label": "Events of " + id, text: "Events", onclick: () => tail(st, id) }))),
      el("td", { class: "st-kind", text: j.kind || "–" }),
      el("td", {}, el("span", { class: "state st-status" })),
      el("td", {}, el("progress", { class: "st-progress", max: "1", value: "0", "aria-label": "progress of " + id }),
        el("span", { class: "st-pct muted" })),
      el("td", { class: "cell st-msg" }),
      el("td", { class: "st-started" }));
  }
  function update(tr, j) {
    const status = j.status || "unknown";
    tr.dataset.status = status;
    const s = tr.querySelector(".st-status");
    s.textContent = status;
    s.className = "state st-status state-" + status;
    const p = Math.max(0, Math.min(1, Number(j.progress) || 0));
    tr.querySelector(".st-progress").value = status === "done" ? 1 : p;
    tr.querySelector(".st-pct").textContent = " " + Lab.pct(status === "done" ? 1 : p);
    const msg = j.error ? "error: " + j.error : [j.stage, j.message].filter(Boolean).join(": ");
    setText(tr.querySelector(".st-msg"), msg || (j.output_path ? "output: " + j.output_path : ""));
    setText(tr.querySelector(".st-started"), Lab.time(j.started_at));
    actions(tr.querySelector(".st-actions"), j);
  }
  const setText = (node, text) => { if (node.textContent !== text) node.textContent = text; };
  // Cancel while the job can still stop; a link back to its wizard for the lab's kinds.
  function actions(cell, j) {
    const live = LIVE.has(j.status);
    let cancel = cell.querySelector(".st-cancel");
    if (live && !cancel) {
      cancel = el("button", { id: "st-cancel-" + j.id, class: "danger st-cancel", type: "button", "aria-label": "Cancel " + j.id, text: "Cancel", onclick: () => cancelJob(j.id, cancel) });
      cell.append(cancel);
    } else if (!live && cancel) {
      if (document.activeElement === cancel) cell.querySelector("button").focus(); // keep focus in the row
      cancel.remove();
    }
    if ((j.kind === "quantize" || j.kind === "finetune") && !cell.querySelector(".st-open")) {
      cell.append(el("a", { class: "st-open", id: "st-open-" + j.id, href: `#/${j.kind}?job=${encodeURIComponent(j.id)}`,
        "aria-label": `Open ${j.id} in the ${j.kind} wizard`, text: "Open" }));
    }
  }
  async function cancelJob(id, button) {
    button.disabled = true;
    try {
      const body = await api(`/api/jobs/${encodeURIComponent(id)}/cancel`, { method: "POST" });
      const tr = $("st-job-" + id);
      if (tr && body.job) update(tr, body.job);
    } catch (e) {
      button.disabled = false;
      report(e);
    }
  }

  // ---- the event log of one job --------------------------------------------------------
  async function tail(st, id) {
    if (st.tail) st.tail.abort();
    const controller = new AbortController();
    st.tail = controller;
    st.ctx.signal.addEventListener("abort", () => controller.abort(), { once: true });
    for (const tr of $("st-rows").children) {
      const on = tr.id === "st-job-" + id;
      if (on) tr.dataset.selected = ""; else delete tr.dataset.selected;
      const b = tr.querySelector("button[aria-pressed]");
      if (b) b.setAttribute("aria-pressed", String(on));
    }
    $("st-tail").hidden = false;
    $("st-log-title").textContent = "Events of " + id;
    $("st-log-state").textContent = "following…";
    $("st-tail").dataset.job = id;
    const log = $("st-log");
    log.textContent = "";
    try {
      await Lab.stream(`/api/jobs/${encodeURIComponent(id)}/stream`, (ev) => {
        log.append(line(ev) + "\n");
        log.scrollTop = log.scrollHeight;
      }, controller.signal);
      $("st-log-state").textContent = "the job has ended";
    } catch (e) {
      if (e.name === "AbortError") return;
      $("st-log-state").textContent = "the stream stopped: " + e.message;
      report(e);
    }
  }
  // One event as a line of text.
  function line(ev) {
    switch (ev.type) {
      case "log": return ev.line ?? "";
      case "stage": return `[${ev.stage}] ${ev.progress != null ? Lab.pct(ev.progress) + " " : ""}${ev.message || ""}`;
      case "failed": return "failed: " + (ev.error || "");
      case "cancelled": return "cancelled" + (ev.reason ? ": " + ev.reason : "");
      case "done": return "done" + (ev.output_dir ? ": " + ev.output_dir : "");
      default: { // metric and the rest: `metric train step=3 loss=2.41 …`
        const { type, ts, kind, ...rest } = ev;
        const v = (x) => (typeof x === "number" ? Lab.num(x) : x && typeof x === "object"
          ? "{" + Object.entries(x).map(([k, y]) => `${k}: ${typeof y === "number" ? Lab.num(y) : JSON.stringify(y)}`).join(", ") + "}" : String(x));
        return [type, kind, ...Object.entries(rest).map(([k, x]) => `${k}=${v(x)}`)].filter(Boolean).join(" ");
      }
    }
  }

  // ---- memory --------------------------------------------------------------------------
  async function stats(st) {
    const box = $("st-memory");
    try {
      const s = await api("/stats", { signal: st.ctx.signal });
      if (!box) return;
      box.replaceChildren(memory(s || {}));
      box.removeAttribute("aria-busy");
      Lab.clearError("refresh");
    } catch (e) {
      if (box && box.hasAttribute("aria-busy")) box.replaceChildren(el("p", { class: "muted", text: "/stats could not be read." }));
      report(e, "refresh");
    }
  }
  function memory(s) {
    const adm = s.admission || {}, kv = s.kv || {}, pc = s.prompt_cache || {}, jobs = s.jobs || {};
    const kvCap = kv.reserved_bytes ?? adm.kv_bytes;
    const parts = [["weights", adm.weights_bytes, "weights"], ["kv", kv.bytes, "KV cache"], ["cache", pc.bytes, "prompt cache"]];
    const budget = Number(adm.budget_bytes) || 0;
    return el("div", {},
      budget ? memBar(parts, budget) : el("p", { class: "muted", text: "No memory budget is known (the machine's memory could not be read and no --memory-budget was given)." }),
      el("dl", { class: "kv", id: "st-mem" },
        el("dt", { text: "Weights" }), el("dd", { id: "st-mem-weights", text: Lab.bytes(adm.weights_bytes) }),
        el("dt", { text: "KV cache" }), el("dd", { id: "st-mem-kv", text: `${Lab.bytes(kv.bytes)} of ${Lab.bytes(kvCap)}${kv.scheme ? " · " + kv.scheme : ""}` }),
        el("dt", { text: "Prompt cache" }), el("dd", { id: "st-mem-cache", text: `${Lab.bytes(pc.bytes)} of ${Lab.bytes(pc.max_bytes)}` }),
        el("dt", { text: "Budget" }), el("dd", { id: "st-mem-budget", text: budget ? Lab.bytes(budget) + (adm.budget_source ? ` (${adm.budget_source})` : "") : "unknown" }),
        el("dt", { text: "Max safe context" }), el("dd", { id: "st-mem-ctx", text: adm.max_safe_context != null ? Number(adm.max_safe_context).toLocaleString() + " tokens" : "unknown" }),
        el("dt", { text: "Heavy job" }), el("dd", { id: "st-mem-lease", text: jobs.lease_holder
          ? `${jobs.lease_holder} holds the execution lease${jobs.inference_gated ? " (chat requests wait until it ends)" : ""}` : "none running" })));
  }
  // One stacked bar: weights, KV and prompt cache against the budget.
  function memBar(parts, budget) {
    const bar = Lab.svg("svg", { class: "membar", viewBox: "0 0 1000 24", preserveAspectRatio: "none", role: "img",
      "aria-label": parts.map(([, v, name]) => `${name} ${Lab.bytes(v)}`).join(", ") + ` of a ${Lab.bytes(budget)} budget` });
    let x = 0;
    bar.append(Lab.svg("rect", { class: "m-free", x: 0, y: 0, width: 1000, height: 24 }));
    for (const [key, v, name] of parts) {
      const w = Math.max(0, Math.min(1000 - x, (Number(v) || 0) / budget * 1000));
      if (w > 0) bar.append(Lab.svg("rect", { class: "m-" + key, x: x.toFixed(1), y: 0, width: w.toFixed(1), height: 24 },
        Lab.svg("title", { text: `${name}: ${Lab.bytes(v)}` })));
      x += w;
    }
    return el("div", {}, bar, Lab.legend([...parts.map(([k, , name]) => [k, name]), ["free", "rest of the budget"]]));
  }
})();
