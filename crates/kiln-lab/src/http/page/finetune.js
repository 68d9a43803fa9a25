// The fine-tune wizard: Base → Dataset → Hyperparams → Train → Done. Training shows the
// train and validation loss as they are reported and can be stopped with the adapter saved;
// when it is done the adapter can be mounted and one prompt asked with and without it.
"use strict";
(() => {
  const { $, el, field, api, report } = Lab;
  // The job's defaults (docs/lab.md, spec §8.3): fields left at these are not sent.
  const DEFAULTS = { rank: 8, iters: 100, batch_size: 1, max_seq_length: 512, steps_per_report: 10, steps_per_eval: 50 };
  const LR = { sft: 2e-4, dpo: 5e-5, orpo: 1e-5 };
  const METHODS = [
    ["sft", "SFT", "learn the answers (messages, prompt/completion or text rows)"],
    ["dpo", "DPO", "prefer the chosen answer over the rejected one (prompt/chosen/rejected rows)"],
    ["orpo", "ORPO", "SFT and a preference term in one (prompt/chosen/rejected rows)"],
  ];

  Lab.route("finetune", { title: "Fine-tune", render });

  function render(view, ctx) {
    view.append(el("h1", { text: "Fine-tune a LoRA adapter" }),
      el("p", { class: "muted", text: "Train a small adapter on your data on top of a model; the base stays as it is and the adapter can be served beside it." }));
    const wiz = Lab.wizard(view, "ft", ["Base", "Dataset", "Hyperparams", "Train", "Done"]);
    const st = { ctx, wiz, base: "", data: "", inspected: null, jobId: null };
    baseStep(wiz.panels[0], st);
    datasetStep(wiz.panels[1], st);
    paramsStep(wiz.panels[2], st);
    wiz.go(1, false);
    // #/finetune?job=ID reopens a job (from the status page).
    const job = ctx.params.get("job");
    if (job) api(`/api/jobs/${encodeURIComponent(job)}`, { signal: ctx.signal }).then((b) => train(st, b.job.id, b.job), report);
  }

  // ---- 1. Base -------------------------------------------------------------------------
  function baseStep(panel, st) {
    const holder = el("div", { id: "ft-base-box", "aria-busy": "true", text: "Loading the models…" });
    let picker = Lab.modelPicker("ft-base", "Models", []);
    const prefill = st.ctx.params.get("model_dir") || "";
    async function load() {
      try {
        const { list } = await Lab.models(st.ctx.signal);
        picker = Lab.modelPicker("ft-base", "Models", list);
        holder.replaceChildren(picker.node);
        Lab.clearError("models");
      } catch (e) {
        holder.replaceChildren(el("p", { class: "muted", text: "The model list could not be loaded." }), picker.node);
        report(e, "models");
      }
      if (prefill && !picker.path.value) picker.path.value = prefill;
      holder.removeAttribute("aria-busy");
    }
    st.ctx.reload = load;
    load();
    panel.append(holder, el("div", { class: "actions" },
      el("button", { id: "ft-next-1", class: "primary", type: "button", text: "Next: dataset", onclick: () => {
        st.base = picker.chosen();
        if (!st.base) { report("Choose a base model from the list or enter a path."); picker.path.focus(); return; }
        Lab.clearError();
        st.wiz.go(2);
        if ($("ft-data").value.trim() && !st.inspected) inspect(st);
      } })));
  }

  // ---- 2. Dataset ----------------------------------------------------------------------
  function datasetStep(panel, st) {
    const input = el("input", { id: "ft-data", type: "text", spellcheck: "false", required: true,
      value: st.ctx.params.get("data_dir") || "", placeholder: "/path/to/dataset" });
    input.addEventListener("input", () => { st.inspected = null; });
    panel.append(
      field("Dataset folder or .jsonl file", input, "A folder with train.jsonl (and optionally valid.jsonl), or one .jsonl file."),
      el("div", { class: "actions" }, el("button", { id: "ft-inspect", type: "button", text: "Inspect", onclick: () => inspect(st) })),
      el("div", { id: "ft-inspect-out", "data-state": "idle", "aria-live": "polite" }),
      el("p", { class: "muted" }, "No dataset yet? ", el("a", { href: "#/dataset", text: "Make one from a template" }), "."),
      el("div", { class: "actions" },
        el("button", { id: "ft-back-2", type: "button", text: "Back", onclick: () => st.wiz.go(1) }),
        el("button", { id: "ft-next-2", class: "primary", type: "button", text: "Next: hyper-parameters", onclick: async () => {
          if (!st.inspected && !(await inspect(st))) return;
          st.wiz.go(3);
        } })));
  }
  // Asks the server what the data is; true when it could read it.
  async function inspect(st) {
    const out = $("ft-inspect-out"), path = $("ft-data").value.trim();
    if (!path) { report("Enter the dataset's path."); $("ft-data").focus(); return false; }
    out.dataset.state = "loading";
    out.replaceChildren(el("p", { class: "muted", text: "Reading the dataset…" }));
    try {
      const info = await api("/api/finetune/inspect-dataset", { body: { path, limit: 5 }, signal: st.ctx.signal });
      st.data = path;
      st.inspected = info;
      out.replaceChildren(Lab.datasetSummary(info, "ft-data"));
      out.dataset.state = "ready";
      // Preference rows want a preference method; switch unless the user chose already.
      // (inspect-dataset calls them "preference", the templates' output_format "dpo".)
      const preference = info.format === "dpo" || info.format === "preference";
      if (preference && $("ft-method-sft").checked && !st.methodTouched) setMethod("dpo");
      Lab.clearError();
      return true;
    } catch (e) {
      out.replaceChildren(el("p", { class: "muted", text: "Could not read it: " + e.message }));
      out.dataset.state = "error";
      report(e);
      return false;
    }
  }

  // ---- 3. Hyperparams ------------------------------------------------------------------
  function paramsStep(panel, st) {
    const n = (id, value, opts = {}) => el("input", { id, type: "number", value, min: opts.min ?? "1", step: opts.step || "1", required: true });
    const form = el("form", { id: "ft-form", novalidate: true },
      el("fieldset", {}, el("legend", { text: "Method" }),
        el("div", {}, METHODS.map(([v, name, desc]) => el("label", { class: "check", for: "ft-method-" + v },
          el("input", { type: "radio", name: "ft-method", id: "ft-method-" + v, value: v, checked: v === "sft" }),
          el("span", {}, el("b", { text: name }), " — " + desc))))),
      el("div", { class: "grid" },
        field("LoRA rank", n("ft-rank", DEFAULTS.rank)),
        field("Iterations", n("ft-iters", DEFAULTS.iters)),
        field("Learning rate", n("ft-lr", LR.sft, { min: "0", step: "any" }), "Default by method: SFT 2e-4, DPO 5e-5, ORPO 1e-5."),
        field("Batch size", n("ft-batch", DEFAULTS.batch_size)),
        field("Max sequence length", n("ft-seq", DEFAULTS.max_seq_length)),
        field("Report every (steps)", n("ft-report", DEFAULTS.steps_per_report)),
        field("Validate every (steps)", n("ft-eval", DEFAULTS.steps_per_eval))),
      field("Adapter folder (optional)", el("input", { id: "ft-adapter-path", type: "text", spellcheck: "false" }),
        "Default: kiln's cache, adapters/adapter-<time>."),
      el("div", { class: "actions" },
        el("button", { id: "ft-back-3", type: "button", text: "Back", onclick: () => st.wiz.go(2) }),
        el("button", { id: "ft-submit", class: "primary", type: "submit", text: "Start training" })));
    // The learning rate follows the method until the user types one of their own.
    form.addEventListener("change", (e) => {
      if (e.target.name === "ft-method") { st.methodTouched = true; setMethod(e.target.value); }
    });
    form.querySelector("#ft-lr").addEventListener("input", (e) => { e.target.dataset.edited = "1"; });
    form.addEventListener("submit", (e) => { e.preventDefault(); submit(st); });
    panel.append(form);
  }
  function setMethod(m) {
    $("ft-method-" + m).checked = true;
    if (!$("ft-lr").dataset.edited) $("ft-lr").value = String(LR[m]);
  }
  function jobConfig(st) {
    const method = (document.querySelector('input[name="ft-method"]:checked') || {}).value || "sft";
    const c = { model_dir: st.base, data_dir: st.data || $("ft-data").value.trim(), method };
    const ids = { rank: "ft-rank", iters: "ft-iters", batch_size: "ft-batch", max_seq_length: "ft-seq", steps_per_report: "ft-report", steps_per_eval: "ft-eval" };
    for (const [k, id] of Object.entries(ids)) {
      const v = Number($(id).value);
      if (v !== DEFAULTS[k]) c[k] = v;
    }
    const lr = Number($("ft-lr").value);
    if (lr !== LR[method]) c.learning_rate = lr;
    const out = $("ft-adapter-path").value.trim();
    if (out) c.adapter_path = out;
    return c;
  }
  async function submit(st) {
    const form = $("ft-form");
    if (!form.checkValidity()) { form.reportValidity(); return; }
    $("ft-submit").disabled = true;
    try {
      const r = await api("/api/jobs", { body: { kind: "finetune", config: jobConfig(st) }, signal: st.ctx.signal });
      Lab.clearError();
      train(st, r.job_id || (r.job && r.job.id), r.job);
    } catch (e) {
      report(e);
    } finally {
      $("ft-submit").disabled = false;
    }
  }

  // ---- 4. Train ------------------------------------------------------------------------
  async function train(st, jobId, job) {
    st.jobId = jobId;
    const panel = st.wiz.panels[3], area = Lab.jobArea("ft");
    const chart = Lab.svg("svg", { id: "ft-loss-chart", class: "chart", "data-points": "0" });
    const loss = { train: [], val: [], last: null, iters: iterations(job) };
    panel.replaceChildren(panel.querySelector("h2"),
      el("p", {}, "Job ", el("code", { id: "ft-job-id", text: jobId })), area.node,
      el("h3", { text: "Loss" }), Lab.legend([["train", "train loss"], ["val", "validation loss"]]), chart,
      el("p", { id: "ft-latest", class: "muted" }),
      el("div", { class: "actions" },
        el("button", { id: "ft-stop", class: "primary", type: "button", text: "Stop and save", onclick: () => stop(st) }),
        el("button", { id: "ft-cancel", class: "danger", type: "button", text: "Cancel (discard)", onclick: () => cancel(st) }),
        el("button", { id: "ft-retry", type: "button", hidden: true, text: "Back to hyper-parameters", onclick: () => st.wiz.go(3) })));
    drawLoss(chart, loss);
    st.wiz.go(4);
    area.fromRow(job);
    let end;
    try {
      end = await Lab.follow(jobId, area, (ev) => {
        if (ev.type !== "metric" || !Number.isFinite(Number(ev.loss))) return;
        if (ev.kind === "train") { loss.train.push([Number(ev.step), Number(ev.loss)]); loss.last = ev; }
        else if (ev.kind === "val") loss.val.push([Number(ev.step), Number(ev.loss)]);
        drawLoss(chart, loss);
      }, st.ctx.signal);
    } catch (e) {
      report(e);
      return;
    }
    $("ft-stop").hidden = $("ft-cancel").hidden = true;
    if (end.type === "done") done(st, end, job, loss);
    else $("ft-retry").hidden = false;
  }
  function drawLoss(chart, loss) {
    Lab.lineChart(chart, [{ name: "train", key: "train", points: loss.train }, { name: "validation", key: "val", points: loss.val }],
      { xLabel: "step", xMax: loss.iters, empty: "waiting for the first loss…", label: `Loss: ${loss.train.length} train and ${loss.val.length} validation points` });
    chart.dataset.train = String(loss.train.length);
    chart.dataset.val = String(loss.val.length);
    const t = loss.last, v = loss.val[loss.val.length - 1];
    if (t) {
      $("ft-latest").textContent = `step ${t.step}: train loss ${Lab.num(t.loss)}` + (v ? ` · validation ${Lab.num(v[1])} (step ${v[0]})` : "") +
        (t.learning_rate != null ? ` · lr ${Lab.num(t.learning_rate)}` : "") + (t.tokens_per_sec != null ? ` · ${Lab.num(t.tokens_per_sec, 3)} tok/s` : "");
    }
  }
  // The run's iterations (the x axis's end) from the row's config, else the default.
  function iterations(job) {
    try { return Number(JSON.parse(job.config_json).iters) || DEFAULTS.iters; } catch { return DEFAULTS.iters; }
  }
  async function stop(st) {
    const b = $("ft-stop");
    b.disabled = true;
    b.textContent = "Stopping… (saving the adapter)";
    try { await api(`/api/jobs/${encodeURIComponent(st.jobId)}/stop`, { method: "POST", signal: st.ctx.signal }); }
    catch (e) { report(e); b.disabled = false; b.textContent = "Stop and save"; }
  }
  async function cancel(st) {
    $("ft-cancel").disabled = true;
    try { await api(`/api/jobs/${encodeURIComponent(st.jobId)}/cancel`, { method: "POST", signal: st.ctx.signal }); }
    catch (e) { report(e); $("ft-cancel").disabled = false; }
  }

  // ---- 5. Done: serve and compare ------------------------------------------------------
  function done(st, end, job, loss) {
    const s = end.summary || {};
    const out = end.output_dir || (job && job.output_path) || s.adapter_path || "";
    const lastTrain = loss.train[loss.train.length - 1], lastVal = loss.val[loss.val.length - 1];
    const panel = st.wiz.panels[4];
    panel.replaceChildren(panel.querySelector("h2"),
      el("dl", { class: "kv" },
        el("dt", { text: "Adapter" }), el("dd", {}, el("code", { id: "ft-output", text: out })),
        el("dt", { text: "Ended" }), el("dd", { id: "ft-stopped", text: s.stopped ? "stopped early, adapter saved" : "all iterations done" }),
        el("dt", { text: "Last train loss" }), el("dd", { text: lastTrain ? `${Lab.num(lastTrain[1])} (step ${lastTrain[0]})` : "–" }),
        el("dt", { text: "Last validation loss" }), el("dd", { text: lastVal ? `${Lab.num(lastVal[1])} (step ${lastVal[0]})` : "–" })),
      // The loss chart moves here from the Train step, so a finished run still shows it.
      el("h3", { text: "Loss" }), Lab.legend([["train", "train loss"], ["val", "validation loss"]]), $("ft-loss-chart"),
      el("details", {}, el("summary", { text: "Full summary" }), el("pre", { class: "log", text: JSON.stringify(s, null, 2) })),
      el("h3", { text: "Serve this adapter" }),
      field("Adapter id", el("input", { id: "ft-adapter-id", type: "text", spellcheck: "false", value: adapterId(out), required: true }),
        "Letters, digits, “.”, “_” and “-”; requests name it in their adapter field."),
      el("div", { class: "actions" }, el("button", { id: "ft-serve", class: "primary", type: "button", text: "Serve this adapter", onclick: () => serve(st, out) })),
      el("p", { id: "ft-serve-out", "data-state": "idle", "aria-live": "polite" }),
      compareSection(st));
    st.wiz.go(5);
  }
  const adapterId = (path) => {
    const base = (String(path).split(/[\\/]/).filter(Boolean).pop() || "").replace(/[^A-Za-z0-9._-]/g, "-").slice(0, 128);
    return base && base !== "none" ? base : "adapter";
  };
  async function serve(st, path) {
    const id = $("ft-adapter-id").value.trim(), out = $("ft-serve-out");
    $("ft-serve").disabled = true;
    out.dataset.state = "loading";
    out.textContent = "Mounting…";
    try {
      const r = await api("/v1/adapters", { body: { id, path }, signal: st.ctx.signal });
      out.textContent = `Serving “${r.id}”: ${r.mounted_layers} modules, rank ${r.rank}, scale ${r.scale}. Requests with "adapter": "${r.id}" use it.`;
      out.dataset.state = "ready";
      st.adapter = r.id || id;
      $("ft-compare").hidden = false;
      $("ft-answer-adapter-h").textContent = `With “${st.adapter}”`;
      Lab.clearError();
    } catch (e) {
      out.textContent = "Not mounted: " + e.message;
      out.dataset.state = "error";
      report(e);
    } finally {
      $("ft-serve").disabled = false;
    }
  }
  // A prompt from the data, so the difference the adapter makes is easy to see.
  function samplePrompt(info) {
    const r = info && Array.isArray(info.rows) && info.rows[0];
    if (!r) return "What is the capital of France?";
    if (Array.isArray(r.messages)) {
      const u = r.messages.find((m) => m.role === "user");
      if (u && typeof u.content === "string") return u.content;
    }
    if (typeof r.prompt === "string") return r.prompt;
    return typeof r.text === "string" ? r.text.slice(0, 80) : "What is the capital of France?";
  }
  function compareSection(st) {
    const column = (id, title) => el("div", { class: "answer", id, "aria-live": "polite" },
      el("h3", { id: id + "-h", text: title }), el("p", { class: "text", id: id + "-text" }));
    return el("section", { id: "ft-compare", hidden: true, "data-state": "idle", "aria-labelledby": "ft-compare-h" },
      el("h3", { id: "ft-compare-h", text: "Side by side: with the adapter and without" }),
      field("Prompt", el("textarea", { id: "ft-prompt", rows: "3", text: samplePrompt(st.inspected) })),
      field("Max tokens", el("input", { id: "ft-max-tokens", type: "number", min: "1", value: "64" })),
      el("div", { class: "actions" }, el("button", { id: "ft-ask", class: "primary", type: "button", text: "Ask both", onclick: () => ask(st) })),
      el("div", { class: "cols" }, column("ft-answer-adapter", "With the adapter"), column("ft-answer-base", "Base model (adapter: none)")));
  }
  // The same prompt twice, at temperature 0, so the only difference is the adapter.
  async function ask(st) {
    const prompt = $("ft-prompt").value.trim();
    if (!prompt) { report("Enter a prompt."); $("ft-prompt").focus(); return; }
    const box = $("ft-compare");
    box.dataset.state = "asking";
    $("ft-ask").disabled = true;
    const one = async (adapter, id) => {
      const col = $(id), text = $(id + "-text");
      delete col.dataset.done; delete col.dataset.error;
      text.textContent = "…";
      try {
        const r = await api("/v1/chat/completions", { signal: st.ctx.signal, body: {
          messages: [{ role: "user", content: prompt }], max_tokens: Number($("ft-max-tokens").value) || 64, temperature: 0, adapter } });
        const msg = r.choices && r.choices[0] && r.choices[0].message;
        text.textContent = (msg && msg.content) || "(empty answer)";
      } catch (e) {
        col.dataset.error = "1";
        text.textContent = e.message;
        report(e);
      }
      col.dataset.done = "1";
    };
    await Promise.all([one(st.adapter, "ft-answer-adapter"), one("none", "ft-answer-base")]);
    box.dataset.state = "done";
    $("ft-ask").disabled = false;
  }
})();
