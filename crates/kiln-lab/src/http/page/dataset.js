// The dataset wizard: Template → Inputs → Generate → Done. The templates come from the
// server with their fields, so the input form is built from them; the result is previewed
// with inspect-dataset and can go straight to the fine-tune wizard.
"use strict";
(() => {
  const { $, el, field, api, report } = Lab;
  const FORMATS = { messages: "chat messages", prompt_completion: "prompt / completion", dpo: "prompt / chosen / rejected", preference: "prompt / chosen / rejected", text: "plain text" };

  Lab.route("dataset", { title: "Dataset", render });

  function render(view, ctx) {
    view.append(el("h1", { text: "Make a dataset" }),
      el("p", { class: "muted", text: "Turn your examples into a training set in the format the fine-tune job reads." }));
    const wiz = Lab.wizard(view, "ds", ["Template", "Inputs", "Generate", "Done"]);
    const st = { ctx, wiz, templates: [], template: null, jobId: null, outputDir: "" };
    templateStep(wiz.panels[0], st);
    wiz.go(1, false);
  }

  // ---- 1. Template ---------------------------------------------------------------------
  function templateStep(panel, st) {
    const holder = el("div", { id: "ds-template-box", "aria-busy": "true", text: "Loading the templates…" });
    async function load() {
      try {
        const body = await api("/api/dataset/templates", { signal: st.ctx.signal });
        st.templates = Array.isArray(body.templates) ? body.templates : [];
        holder.replaceChildren(templateList(st.templates));
        Lab.clearError("templates");
      } catch (e) {
        holder.replaceChildren(el("p", { class: "muted", text: "The templates could not be loaded." }));
        report(e, "templates");
      }
      holder.removeAttribute("aria-busy");
    }
    st.ctx.reload = load;
    load();
    panel.append(holder, el("div", { class: "actions" },
      el("button", { id: "ds-next-1", class: "primary", type: "button", text: "Next: inputs", onclick: () => {
        const picked = document.querySelector('input[name="ds-template"]:checked');
        const t = picked && st.templates.find((x) => x.id === picked.value);
        if (!t) { report("Choose a template."); return; }
        Lab.clearError();
        if (!st.template || st.template.id !== t.id) inputsStep(st, t);
        st.wiz.go(2);
      } })));
  }
  function templateList(templates) {
    if (!templates.length) return el("p", { class: "muted", text: "The server has no dataset templates." });
    return el("fieldset", {}, el("legend", { text: "Templates" }),
      el("ul", { class: "choices", id: "ds-template-list" }, templates.map((t, i) => el("li", {},
        el("label", { for: "ds-template-" + t.id },
          el("input", { type: "radio", name: "ds-template", id: "ds-template-" + t.id, value: t.id, checked: i === 0 }),
          el("span", {}, el("span", { class: "name", text: t.label || t.id }),
            el("span", { class: "desc", text: t.description || "" }),
            el("span", { class: "desc", text: [FORMATS[t.output_format] || t.output_format, t.llm ? "the served model writes the rows" : "no model needed"].filter(Boolean).join(" · ") })))))));
  }

  // ---- 2. Inputs: built from the template's fields -------------------------------------
  function inputsStep(st, t) {
    st.template = t;
    const fields = Array.isArray(t.fields) ? t.fields : [];
    const form = el("form", { id: "ds-form" },
      el("p", {}, "Template: ", el("b", { id: "ds-template-chosen", text: t.label || t.id })),
      fields.map((f) => field(f.label || f.name, control(f), f.hint)),
      t.llm ? field("Model (optional)", el("input", { id: "ds-model-name", type: "text", spellcheck: "false" }),
        "Which model writes the rows; default: the one the server runs.") : null,
      field("Output folder (optional)", el("input", { id: "ds-output-dir", type: "text", spellcheck: "false" }),
        "Default: kiln's cache, datasets/dataset-<template>-<time>."),
      el("div", { class: "actions" },
        el("button", { id: "ds-back-2", type: "button", text: "Back", onclick: () => st.wiz.go(1) }),
        el("button", { id: "ds-submit", class: "primary", type: "submit", text: "Generate" })));
    form.addEventListener("submit", (e) => { e.preventDefault(); submit(st); });
    const panel = st.wiz.panels[1];
    panel.replaceChildren(panel.querySelector("h2"), form);
  }
  function control(f) {
    const def = f.default == null ? "" : typeof f.default === "object" ? JSON.stringify(f.default) : f.default;
    const props = { id: "ds-field-" + f.name, name: f.name, required: !!f.required, spellcheck: "false" };
    if (f.type === "textarea") return el("textarea", { ...props, rows: "10", text: def });
    if (f.type === "number") return el("input", { ...props, type: "number", step: "any", value: def });
    return el("input", { ...props, type: "text", value: def });
  }
  function inputs(st) {
    const out = {};
    for (const f of st.template.fields || []) {
      const raw = $("ds-field-" + f.name).value;
      if (raw.trim() === "" && !f.required) continue;
      out[f.name] = f.type === "number" ? Number(raw) : raw;
    }
    return out;
  }
  async function submit(st) {
    const form = $("ds-form");
    if (!form.checkValidity()) { form.reportValidity(); return; }
    const body = { template_id: st.template.id, inputs: inputs(st) };
    const model = $("ds-model-name") && $("ds-model-name").value.trim();
    if (model) body.model_name = model;
    const dir = $("ds-output-dir").value.trim();
    if (dir) body.output_dir = dir;
    $("ds-submit").disabled = true;
    try {
      const r = await api("/api/dataset/submit", { body, signal: st.ctx.signal });
      Lab.clearError();
      st.outputDir = r.output_dir || "";
      generate(st, r.job_id || (r.job && r.job.id), r.job);
    } catch (e) {
      report(e);
    } finally {
      $("ds-submit").disabled = false;
    }
  }

  // ---- 3. Generate ---------------------------------------------------------------------
  async function generate(st, jobId, job) {
    st.jobId = jobId;
    const panel = st.wiz.panels[2], area = Lab.jobArea("ds");
    panel.replaceChildren(panel.querySelector("h2"),
      el("p", {}, "Job ", el("code", { id: "ds-job-id", text: jobId }), " writing to ", el("code", { text: st.outputDir || "…" })),
      area.node,
      el("div", { class: "actions" },
        el("button", { id: "ds-cancel", class: "danger", type: "button", text: "Cancel job", onclick: () => cancel(st) }),
        el("button", { id: "ds-retry", type: "button", hidden: true, text: "Back to inputs", onclick: () => st.wiz.go(2) })));
    st.wiz.go(3);
    area.fromRow(job);
    let end;
    try {
      end = await Lab.follow(jobId, area, null, st.ctx.signal);
    } catch (e) {
      report(e);
      return;
    }
    $("ds-cancel").hidden = true;
    if (end.type === "done") done(st, end.output_dir || st.outputDir);
    else $("ds-retry").hidden = false;
  }
  async function cancel(st) {
    $("ds-cancel").disabled = true;
    try { await api(`/api/jobs/${encodeURIComponent(st.jobId)}/cancel`, { method: "POST", signal: st.ctx.signal }); }
    catch (e) { report(e); $("ds-cancel").disabled = false; }
  }

  // ---- 4. Done: preview, then fine-tune ------------------------------------------------
  async function done(st, dir) {
    const panel = st.wiz.panels[3];
    const preview = el("div", { id: "ds-preview", "data-state": "loading", "aria-live": "polite" }, el("p", { class: "muted", text: "Reading the rows…" }));
    panel.replaceChildren(panel.querySelector("h2"),
      el("dl", { class: "kv" }, el("dt", { text: "Written to" }), el("dd", {}, el("code", { id: "ds-output", text: dir }))),
      el("h3", { text: "First rows" }), preview,
      el("div", { class: "actions" },
        el("a", { id: "ds-finetune", class: "button", href: "#/finetune?data_dir=" + encodeURIComponent(dir), text: "Fine-tune on this dataset" }),
        el("button", { id: "ds-again", type: "button", text: "Make another", onclick: () => st.wiz.go(1) })));
    st.wiz.go(4);
    try {
      const info = await api("/api/finetune/inspect-dataset", { body: { path: dir, limit: 5 }, signal: st.ctx.signal });
      preview.replaceChildren(Lab.datasetSummary(info, "ds-preview"));
      preview.dataset.state = "ready";
    } catch (e) {
      preview.replaceChildren(el("p", { class: "muted", text: "Could not read the rows: " + e.message }));
      preview.dataset.state = "error";
      report(e);
    }
  }
})();
