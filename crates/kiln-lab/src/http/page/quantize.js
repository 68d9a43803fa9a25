// The quantize wizard: Source → Configure → Run → Done. Before anything runs, the fit
// preview asks the server what the result would weigh and how much context it would leave;
// while a mixed job runs, each module's measured sensitivity is drawn as it arrives.
"use strict";
(() => {
  const { $, el, field, api, report } = Lab;
  const GGUF_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"];
  const CANDIDATES = [2, 3, 4, 5, 6, 8];

  Lab.route("quantize", { title: "Quantize", render });

  function render(view, ctx) {
    view.append(el("h1", { text: "Quantize a model" }),
      el("p", { class: "muted", text: "Write a smaller copy of a model: every matrix at one width, or a mix chosen per module by how much each one's quantization changes the output." }));
    const wiz = Lab.wizard(view, "q", ["Source", "Configure", "Run", "Done"]);
    const st = { source: "", jobId: null, ctx, wiz };
    sourceStep(wiz.panels[0], st);
    configureStep(wiz.panels[1], st);
    wiz.go(1, false);
    // #/quantize?job=ID reopens a job's run (the status page links here).
    const job = ctx.params.get("job");
    if (job) api(`/api/jobs/${encodeURIComponent(job)}`, { signal: ctx.signal }).then((b) => run(st, b.job.id, b.job), report);
  }

  // ---- 1. Source -----------------------------------------------------------------------
  function sourceStep(panel, st) {
    const holder = el("div", { id: "q-source-box", "aria-busy": "true", text: "Loading the models…" });
    let picker = Lab.modelPicker("q-source", "Models", []);
    async function load() {
      try {
        const { list } = await Lab.models(st.ctx.signal);
        picker = Lab.modelPicker("q-source", "Models", list);
        holder.replaceChildren(picker.node);
        Lab.clearError("models");
      } catch (e) {
        holder.replaceChildren(el("p", { class: "muted", text: "The model list could not be loaded." }), picker.node);
        report(e, "models");
      }
      holder.removeAttribute("aria-busy");
    }
    st.ctx.reload = load;
    load();
    panel.append(holder, el("div", { class: "actions" },
      el("button", { id: "q-next-1", class: "primary", type: "button", text: "Next: configure", onclick: () => {
        st.source = picker.chosen();
        if (!st.source) { report("Choose a model from the list or enter a path."); picker.path.focus(); return; }
        Lab.clearError();
        $("q-source-chosen").textContent = st.source;
        st.wiz.go(2);
        preview(st);
      } })));
  }

  // ---- 2. Configure --------------------------------------------------------------------
  function radio(name, id, value, label, checked) {
    return el("label", { class: "check", for: id },
      el("input", { type: "radio", name, id, value, checked }), label);
  }
  function configureStep(panel, st) {
    const select = (id, values, value) => el("select", { id, value }, values.map(([v, t]) => el("option", { value: v, text: t })));
    const form = el("form", { id: "q-form", novalidate: true },
      el("p", {}, "Source: ", el("code", { id: "q-source-chosen" })),
      el("fieldset", {}, el("legend", { text: "Precision" }),
        el("div", { class: "inline" },
          radio("q-mode", "q-mode-uniform", "uniform", "Uniform: every matrix at one width", true),
          radio("q-mode", "q-mode-mixed", "mixed", "Mixed: widths per module, to a target size"))),
      el("fieldset", {}, el("legend", { text: "Format" }),
        el("div", { class: "inline" },
          radio("q-format", "q-format-gguf", "gguf", "GGUF (one file, llama.cpp's types)", true),
          radio("q-format", "q-format-mlx", "mlx", "MLX (safetensors folder)"))),
      el("div", { class: "grid" },
        field("Bits", select("q-bits", [["4", "4"], ["8", "8"]], "4"), "The width of the uniform layout (and of the embedding when mixed)."),
        el("div", { id: "q-gguf-type-box" }, field("GGUF type", select("q-gguf-type", [["", "default for the bits"], ...GGUF_TYPES.map((t) => [t, t])], ""), "Default: Q4_K for 4 bits, Q8_0 for 8.")),
        el("div", { id: "q-group-box" }, field("Group size", select("q-group", [["32", "32"], ["64", "64"], ["128", "128"]], "64"))),
        el("div", { id: "q-bpw-box" }, field("Target bits per weight", el("input", { id: "q-bpw", type: "number", min: "1", max: "16", step: "0.05", value: "5", required: true }), "Stored size per weight, scales included."))),
      el("fieldset", { id: "q-cand-box" }, el("legend", { text: "Candidate widths per module" }),
        el("div", { class: "inline" }, CANDIDATES.map((b) => el("label", { class: "check", for: "q-cand-" + b },
          el("input", { type: "checkbox", id: "q-cand-" + b, value: String(b), checked: b === 4 || b === 8 }), b + " bits")))),
      el("label", { class: "check", for: "q-evaluate" }, el("input", { type: "checkbox", id: "q-evaluate", checked: true }),
        "After writing, measure the result against the source (KL divergence, top-1 agreement)"),
      field("Output path (optional)", el("input", { id: "q-out", type: "text", spellcheck: "false" }),
        "Default: kiln's cache, models/<source>-kiln-<suffix>. It must not exist yet."),
      el("h3", { text: "Fit preview" }),
      el("div", { id: "q-preview-out", "data-state": "idle", "aria-live": "polite" }, el("p", { class: "muted", text: "…" })),
      el("div", { class: "actions" },
        el("button", { id: "q-back-2", type: "button", text: "Back", onclick: () => st.wiz.go(1) }),
        el("button", { id: "q-preview", type: "button", text: "Refresh preview", onclick: () => preview(st) }),
        el("button", { id: "q-submit", class: "primary", type: "submit", text: "Start quantizing" })));
    let timer = null;
    form.addEventListener("input", () => {
      showFields();
      // What it shows is stale now, and so is any answer still on its way.
      $("q-preview-out").dataset.state = "loading";
      if (previewing) previewing.abort();
      clearTimeout(timer);
      timer = setTimeout(() => preview(st), 400);
    });
    form.addEventListener("submit", (e) => { e.preventDefault(); submit(st); });
    panel.append(form);
    showFields();
  }
  // Only the fields that apply to the chosen mode and format are shown.
  function showFields() {
    const mixed = $("q-mode-mixed").checked, mlx = $("q-format-mlx").checked;
    $("q-gguf-type-box").hidden = mixed || mlx;
    $("q-group-box").hidden = !mlx;
    $("q-bpw-box").hidden = !mixed;
    $("q-cand-box").hidden = !mixed;
  }
  function settings(st) {
    const mixed = $("q-mode-mixed").checked;
    return {
      mixed, model_id: st.source, format: $("q-format-mlx").checked ? "mlx" : "gguf", bits: Number($("q-bits").value),
      gguf_type: $("q-gguf-type").value, group_size: Number($("q-group").value), target_bpw: Number($("q-bpw").value),
      candidate_bits: CANDIDATES.filter((b) => $("q-cand-" + b).checked),
      evaluate: $("q-evaluate").checked, out_dir: $("q-out").value.trim(),
    };
  }
  function jobConfig(st) {
    const s = settings(st);
    const c = { model_id: s.model_id, format: s.format, bits: s.bits };
    if (s.format === "gguf" && !s.mixed && s.gguf_type) c.gguf_type = s.gguf_type;
    if (s.format === "mlx") c.group_size = s.group_size;
    if (s.mixed) { c.target_bpw = s.target_bpw; c.candidate_bits = s.candidate_bits; }
    if (s.evaluate) c.evaluate = true;
    if (s.out_dir) c.out_dir = s.out_dir;
    return c;
  }

  // The preview runs on file headers only, so it is cheap enough to follow every edit.
  let previewing = null;
  async function preview(st) {
    const s = settings(st), out = $("q-preview-out");
    const body = { model_id: s.model_id, format: s.format, bits: s.bits };
    if (s.format === "gguf" && !s.mixed && s.gguf_type) body.gguf_type = s.gguf_type;
    if (s.mixed) { body.target_bpw = s.target_bpw; body.candidate_bits = s.candidate_bits; }
    if (previewing) previewing.abort();
    const mine = new AbortController();
    previewing = mine;
    st.ctx.signal.addEventListener("abort", () => mine.abort(), { once: true });
    out.dataset.state = "loading";
    out.setAttribute("aria-busy", "true");
    try {
      const r = await api("/api/quantize/preview", { body, signal: mine.signal });
      if (previewing !== mine) return; // a newer preview is on its way
      out.replaceChildren(previewView(r));
      out.dataset.state = "ready";
      Lab.clearError("preview");
    } catch (e) {
      if (e.name === "AbortError" || previewing !== mine) return;
      out.replaceChildren(el("p", { class: "muted", text: "No preview: " + e.message }));
      out.dataset.state = "error";
      report(e, "preview");
    } finally {
      if (previewing === mine) out.removeAttribute("aria-busy");
    }
  }
  function previewView(r) {
    const src = r.source || {}, res = r.result || {};
    const fits = res.fits === true ? "fits the memory budget" : res.fits === false ? "does not fit the memory budget" : "fit unknown";
    return el("dl", { class: "kv", id: "q-preview-dl" },
      el("dt", { text: "Source" }), el("dd", { text: `${Lab.bytes(src.size_bytes)}${src.params ? " · " + Lab.num(src.params / 1e6, 4) + " M parameters" : ""}` }),
      el("dt", { text: "Result" }), el("dd", { id: "q-preview-size", text: `${Lab.bytes(res.weights_bytes)} of weights · ${Lab.num(res.bits_per_weight, 3)} bits per weight` }),
      el("dt", { text: "Max context" }), el("dd", { id: "q-preview-ctx", text: res.max_context != null ? `${Number(res.max_context).toLocaleString()} tokens` : "unknown (no memory budget)" }),
      el("dt", { text: "Budget" }), el("dd", { id: "q-preview-fits", "data-fits": String(res.fits), text: `${Lab.bytes(res.budget_bytes)} · ${fits}` }));
  }

  async function submit(st) {
    const form = $("q-form");
    if (!form.checkValidity()) { form.reportValidity(); return; }
    const btn = $("q-submit");
    btn.disabled = true;
    try {
      const r = await api("/api/jobs", { body: { kind: "quantize", config: jobConfig(st) }, signal: st.ctx.signal });
      Lab.clearError();
      run(st, r.job_id || (r.job && r.job.id), r.job);
    } catch (e) {
      report(e);
    } finally {
      btn.disabled = false;
    }
  }

  // ---- 3. Run --------------------------------------------------------------------------
  async function run(st, jobId, job) {
    st.jobId = jobId;
    const panel = st.wiz.panels[2], area = Lab.jobArea("q");
    const chart = Lab.svg("svg", { id: "q-sens-chart", class: "chart", "data-bars": "0" });
    const sens = { groups: [], keys: [], total: 0, rows: el("tbody", {}) };
    const eval_ = { value: null };
    panel.replaceChildren(panel.querySelector("h2"),
      el("p", {}, "Job ", el("code", { id: "q-job-id", text: jobId })), area.node,
      el("section", { id: "q-sens", hidden: true, "aria-labelledby": "q-sens-h" },
        el("h3", { id: "q-sens-h", text: "Per-module sensitivity" }),
        el("p", { class: "muted", text: "KL divergence from the unquantized model when only that module is quantized, at each candidate width (log scale; taller is more sensitive)." }),
        el("div", { id: "q-sens-legend" }), chart,
        el("p", { id: "q-sens-summary" }),
        el("details", {}, el("summary", { text: "As a table" }),
          el("div", { class: "table-wrap" }, el("table", { id: "q-sens-table" }, el("thead", { id: "q-sens-head" }), sens.rows)))),
      el("div", { class: "actions" },
        el("button", { id: "q-cancel", class: "danger", type: "button", text: "Cancel job", onclick: () => cancel(st) }),
        el("button", { id: "q-retry", type: "button", hidden: true, text: "Back to configure", onclick: () => st.wiz.go(2) })));
    st.wiz.go(3);
    area.fromRow(job);
    let end;
    try {
      end = await Lab.follow(jobId, area, (ev) => {
        if (ev.type !== "metric") return;
        if (ev.kind === "sensitivity") addSensitivity(sens, chart, ev);
        if (ev.kind === "eval") eval_.value = ev;
      }, st.ctx.signal);
    } catch (e) {
      report(e);
      return;
    }
    $("q-cancel").hidden = true;
    if (end.type === "done") done(st, end, eval_.value);
    else $("q-retry").hidden = false;
  }
  function addSensitivity(sens, chart, ev) {
    const kl = ev.kl || {};
    if (!sens.keys.length) {
      sens.keys = Object.keys(kl).sort((a, b) => Number(a) - Number(b));
      $("q-sens").hidden = false;
      $("q-sens-legend").replaceChildren(Lab.legend(sens.keys.map((k, i) => [i, k + " bits"])));
      $("q-sens-head").append(el("tr", {}, el("th", { text: "#" }), el("th", { text: "module" }), sens.keys.map((k) => el("th", { text: "KL at " + k }))));
    }
    sens.total = Number(ev.total) || sens.total;
    const values = sens.keys.map((k) => Number(kl[k]));
    sens.groups.push({ label: ev.module || "module " + ev.index, values });
    sens.rows.append(el("tr", {}, el("td", { text: ev.index ?? sens.groups.length }),
      el("td", { text: ev.module || "" }), values.map((v) => el("td", { text: Lab.num(v) }))));
    Lab.barChart(chart, sens.groups, { keys: sens.keys.map((k) => k + " bits"), slots: sens.total, xLabel: "modules in order",
      label: `Sensitivity of ${sens.groups.length} of ${sens.total || "?"} modules` });
    const worst = sens.groups.reduce((a, g) => (g.values[0] > a.values[0] ? g : a));
    $("q-sens-summary").textContent = `${sens.groups.length} of ${sens.total || "?"} modules measured. Most sensitive so far: ${worst.label} (KL ${Lab.num(worst.values[0])} at ${sens.keys[0]} bits).`;
  }
  async function cancel(st) {
    $("q-cancel").disabled = true;
    try { await api(`/api/jobs/${encodeURIComponent(st.jobId)}/cancel`, { method: "POST", signal: st.ctx.signal }); }
    catch (e) { report(e); $("q-cancel").disabled = false; }
  }

  // ---- 4. Done -------------------------------------------------------------------------
  function done(st, end, evalMetric) {
    const s = end.summary || {};
    const ev = s.eval || evalMetric;
    const out = end.output_dir || s.output || "";
    const widths = {};
    for (const [, bits] of s.allocation || []) widths[bits] = (widths[bits] || 0) + 1;
    const rest = Object.fromEntries(Object.entries(s).filter(([k]) => k !== "tensors" && k !== "allocation"));
    st.wiz.panels[3].replaceChildren(st.wiz.panels[3].querySelector("h2"),
      el("dl", { class: "kv" },
        el("dt", { text: "Output" }), el("dd", {}, el("code", { id: "q-output", text: out })),
        el("dt", { text: "Format" }), el("dd", { text: s.format || "–" }),
        el("dt", { text: "Bits per weight" }), el("dd", { id: "q-bpw-out", text: Lab.num(s.achieved_bpw, 4) }),
        el("dt", { text: "Size on disk" }), el("dd", { id: "q-size-out", text: Lab.bytes(s.file_bytes) }),
        Object.keys(widths).length ? [el("dt", { text: "Widths chosen" }),
          el("dd", { text: Object.entries(widths).map(([b, n]) => `${b} bits × ${n}`).join(", ") })] : null,
        el("dt", { text: "Time" }), el("dd", { text: s.total_secs != null ? Lab.num(s.total_secs, 3) + " s" : "–" })),
      el("h3", { text: "Quality against the source" }),
      el("p", { id: "q-eval", "data-state": ev ? "ready" : "none", text: ev
        ? `mean KL ${Lab.num(ev.mean_kl)} nats · p99 KL ${Lab.num(ev.p99_kl)} · top-1 agreement ${top1(ev.top1_agreement)}`
        : "Not measured (turn on “measure the result” in Configure to get it)." }),
      el("details", {}, el("summary", { text: "Full summary" }), el("pre", { class: "log", id: "q-summary", text: JSON.stringify(rest, null, 2) })),
      el("div", { class: "actions" },
        el("a", { id: "q-finetune", class: "button", href: "#/finetune?model_dir=" + encodeURIComponent(out), text: "Fine-tune this model" }),
        el("button", { id: "q-again", type: "button", text: "Quantize another", onclick: () => st.wiz.go(1) })));
    st.wiz.go(4);
  }
  // top1_agreement is a fraction; show it as a percentage.
  const top1 = (v) => (v == null ? "–" : Number(v) <= 1 ? Lab.num(Number(v) * 100, 4) + "%" : Lab.num(v, 4) + "%");
})();
