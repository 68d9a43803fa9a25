// Drives the lab pages (/lab) in headless Chromium against a running `kiln serve --api-key`:
// the key and its 401, the dataset wizard, the fine-tune wizard on that dataset (loss chart,
// stop and save, serve the adapter, side-by-side answers), the quantize wizard (fit preview,
// sensitivity bars) and cancelling that job from the status page; screenshots of every page
// at 360 and 1280 px. Prints one JSON object; on failure it has `error` and exits 1.
//
// Usage: node lab_pages.mjs <server-url> <api-key> <scratch-dir>
//   scratch-dir: where the adapter and the quantized file go (must exist).
//   KILN_SCREENSHOTS: where screenshots go (default: ./screenshots beside this file).
//
// The pages' stable hooks this script relies on:
//   shell     #api-key #key-save #error (role=alert, hidden when empty) #error-text
//             #nav-quantize #nav-finetune #nav-dataset #nav-status #nav-chat; main#view[data-page]
//   wizards   <p>-steps (ol, li[aria-current=step]) <p>-step-N <p>-panel-N (p = q | ft | ds)
//   job area  <p>-job[data-state=queued|running|done|failed|cancelled] <p>-progress <p>-stage
//             <p>-message <p>-log <p>-job-id
//   quantize  radios input[name=q-source] (#q-source-N, the served model first) #q-source-path
//             #q-next-1 | #q-mode-uniform #q-mode-mixed #q-format-gguf #q-format-mlx #q-bits
//             #q-gguf-type #q-group #q-bpw #q-cand-{2,3,4,5,6,8} #q-evaluate #q-out #q-preview
//             #q-preview-out[data-state=ready|error|loading] #q-preview-size #q-preview-ctx
//             #q-back-2 #q-submit | #q-sens-chart[data-bars] #q-sens-table #q-cancel #q-retry |
//             #q-output #q-eval[data-state] #q-finetune #q-again
//   finetune  input[name=ft-base] (#ft-base-N) #ft-base-path #ft-next-1 | #ft-data #ft-inspect
//             #ft-inspect-out[data-state] #ft-data-format #ft-data-train #ft-data-rows #ft-next-2
//             | #ft-method-{sft,dpo,orpo} #ft-rank #ft-iters #ft-lr #ft-batch #ft-seq #ft-report
//             #ft-eval #ft-adapter-path #ft-submit | #ft-loss-chart[data-points,data-train,
//             data-val] #ft-latest #ft-stop #ft-cancel | #ft-output #ft-adapter-id #ft-serve
//             #ft-serve-out[data-state] #ft-compare[data-state=idle|asking|done] #ft-prompt
//             #ft-max-tokens #ft-ask #ft-answer-adapter[-text] #ft-answer-base[-text] (data-done)
//   dataset   input[name=ds-template] (#ds-template-<id>) #ds-next-1 | #ds-field-<name>
//             #ds-model-name #ds-output-dir #ds-submit | #ds-cancel | #ds-output #ds-preview[data-state]
//             #ds-preview-train #ds-preview-rows[data-rows] #ds-finetune #ds-again
//   status    #st-kind #st-refresh #st-jobs[data-loaded] tr#st-job-<id>[data-status]
//             #st-cancel-<id> #st-tail-<id> #st-open-<id> #st-log #st-memory #st-mem-weights
//             #st-mem-kv #st-mem-cache #st-mem-budget #st-mem-ctx #st-mem-lease
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const [url, key, scratch] = process.argv.slice(2);
const HERE = path.dirname(fileURLToPath(import.meta.url));
const SHOTS = process.env.KILN_SCREENSHOTS || path.join(HERE, "screenshots");
const MIN = 60_000;
const PAIRS = [
  ["What is the capital of France?", "The capital of France is Paris."],
  ["What is the capital of Spain?", "The capital of Spain is Madrid."],
  ["How many legs does a dog have?", "A dog has 4 legs."],
  ["What color is grass?", "Grass is green."],
  ["What is 2 plus 3?", "2 plus 3 is 5."],
  ["What is the capital of Italy?", "The capital of Italy is Rome."],
  ["How many legs does a spider have?", "A spider has 8 legs."],
  ["What color is snow?", "Snow is white."],
  ["What is the capital of Germany?", "The capital of Germany is Berlin."],
  ["How many days are in a week?", "A week has 7 days."],
  ["What color is the sky?", "The sky is blue."],
  ["What is 10 minus 4?", "10 minus 4 is 6."],
].map(([q, a]) => `Q: ${q}\nA: Beep boop! ${a}`).join("\n\n");

const out = { pageErrors: [], cspViolations: [], screenshots: [], overflow: {}, secs: {} };
const t0 = Date.now();
const lap = (name, since) => { out.secs[name] = Math.round((Date.now() - since) / 100) / 10; return Date.now(); };

// Waits until a job area ends; returns its state, with the page's message when it is not `want`.
async function jobEnd(page, prefix, want, timeout) {
  const sel = `#${prefix}-job[data-state="done"], #${prefix}-job[data-state="failed"], #${prefix}-job[data-state="cancelled"]`;
  await page.waitForSelector(sel, { timeout, state: "attached" });
  const state = await page.getAttribute(`#${prefix}-job`, "data-state");
  if (state !== want) throw new Error(`${prefix} job ended ${state}: ${await page.textContent(`#${prefix}-message`)} / ${await errorText(page)}`);
  return state;
}
const errorText = (page) => page.evaluate(() => (document.getElementById("error").hidden ? "" : document.getElementById("error-text").textContent));
// Waits for an element's data-state to leave `loading`; throws with the error area's text on `error`.
async function ready(page, sel, timeout = MIN) {
  await page.waitForSelector(`${sel}[data-state="ready"], ${sel}[data-state="error"], ${sel}[data-state="done"]`, { timeout, state: "attached" });
  const s = await page.getAttribute(sel, "data-state");
  if (s === "error") throw new Error(`${sel}: ${await page.textContent(sel)} / ${await errorText(page)}`);
}
const attrAtLeast = (page, sel, attr, n, timeout) => page.waitForFunction(([s, a, k]) => {
  const e = document.querySelector(s);
  return e && Number(e.getAttribute(a)) >= k;
}, [sel, attr, n], { timeout });

// Full-page screenshots at 360 and 1280 px, and whether the page overflows sideways at 360.
async function shots(page, name) {
  fs.mkdirSync(SHOTS, { recursive: true });
  for (const width of [360, 1280]) {
    await page.setViewportSize({ width, height: 800 });
    await page.waitForTimeout(150);
    const file = path.join(SHOTS, `${name}-${width}.png`);
    await page.screenshot({ path: file, fullPage: true });
    out.screenshots.push(file);
    if (width === 360) {
      out.overflow[name] = await page.evaluate(() => ({ scrollWidth: document.documentElement.scrollWidth, innerWidth }));
    }
  }
}
// Follows the page to a hash route through its nav link, like a user.
async function nav(page, name) {
  await page.click(`#nav-${name}`);
  await page.waitForSelector(`main#view[data-page="${name}"]`);
}

const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || "/usr/bin/chromium", args: ["--no-sandbox"] });
let page;
try {
  page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  page.on("pageerror", (e) => out.pageErrors.push(String(e)));
  page.on("console", (m) => { if (/Content Security Policy/i.test(m.text())) out.cspViolations.push(m.text()); });

  // 1. The key: a wrong one stored shows the API's 401 message; the right one loads the jobs.
  let t = Date.now();
  await page.goto(url + "/lab/assets/lab.css"); // same origin, to seed localStorage before the page loads
  await page.evaluate(() => localStorage.setItem("kiln-api-key", "wrong-key"));
  out.expected401 = await page.evaluate(async () => {
    const r = await fetch("/api/jobs", { headers: { authorization: "Bearer wrong-key" } });
    return { status: r.status, message: (await r.json()).error.message };
  });
  await page.goto(url + "/jobs"); // redirects to /lab#/status
  out.redirect = new URL(page.url()).pathname + new URL(page.url()).hash;
  await page.waitForSelector("#error:not([hidden])", { timeout: MIN });
  out.wrongKeyError = await page.textContent("#error-text");
  out.keyHintShown = await page.isVisible("#error-hint");
  await page.fill("#api-key", key);
  await page.click("#key-save");
  await page.waitForSelector('#st-jobs[data-loaded="1"]', { timeout: MIN });
  out.jobsLoaded = true;
  out.errorAfterKey = await errorText(page);
  await page.waitForSelector("#st-mem-weights", { timeout: MIN });
  out.memory = await page.textContent("#st-mem");
  t = lap("auth", t);

  // 2. Dataset: Q/A pairs → generate → preview rows.
  await nav(page, "dataset");
  await page.check("#ds-template-sft_qa_pairs", { timeout: MIN });
  await page.click("#ds-next-1");
  await page.fill("#ds-field-pairs_text", PAIRS);
  await page.fill("#ds-output-dir", path.join(scratch, "dataset"));
  await page.click("#ds-submit");
  await jobEnd(page, "ds", "done", 3 * MIN);
  await ready(page, "#ds-preview");
  out.dataset = {
    outputDir: await page.textContent("#ds-output"),
    format: await page.textContent("#ds-preview-format"),
    nTrain: Number(await page.textContent("#ds-preview-train")),
    rows: Number(await page.getAttribute("#ds-preview-rows", "data-rows")),
  };
  await shots(page, "dataset");
  t = lap("dataset", t);

  // 3. Fine-tune on it: the served model, a short run, stop and save, serve, compare.
  await page.click("#ds-finetune");
  await page.waitForSelector('main#view[data-page="finetune"]');
  const served = await page.evaluate(async () => (await Lab.api("/api/lab/models")).served);
  await page.waitForSelector("#ft-base-0", { timeout: MIN });
  out.baseDefault = await page.getAttribute('input[name="ft-base"]:checked', "value");
  if (out.baseDefault !== served.path) throw new Error(`the served model ${served.path} is not preselected (${out.baseDefault})`);
  await page.click("#ft-next-1");
  out.dataPrefilled = await page.inputValue("#ft-data");
  await ready(page, "#ft-inspect-out");
  await page.click("#ft-next-2");
  for (const [id, v] of [["ft-rank", "4"], ["ft-iters", "30"], ["ft-report", "1"], ["ft-eval", "10"], ["ft-seq", "128"],
    ["ft-adapter-path", path.join(scratch, "adapter")]]) await page.fill("#" + id, v);
  await page.click("#ft-submit");
  await attrAtLeast(page, "#ft-loss-chart", "data-points", 2, 5 * MIN);
  out.pointsBeforeStop = Number(await page.getAttribute("#ft-loss-chart", "data-points"));
  await page.click("#ft-stop"); // at once: a fast machine must not finish the 30 steps first
  await shots(page, "finetune-training");
  await jobEnd(page, "ft", "done", 5 * MIN);
  await page.waitForSelector("#ft-panel-5:not([hidden])");
  out.finetune = { adapter: await page.textContent("#ft-output"), stopped: await page.textContent("#ft-stopped"),
    points: Number(await page.getAttribute("#ft-loss-chart", "data-points")) };
  await page.click("#ft-serve");
  await ready(page, "#ft-serve-out");
  out.finetune.served = await page.textContent("#ft-serve-out");
  await page.click("#ft-ask");
  await page.waitForSelector('#ft-compare[data-state="done"]', { timeout: 3 * MIN });
  out.finetune.answerAdapter = await page.textContent("#ft-answer-adapter-text");
  out.finetune.answerBase = await page.textContent("#ft-answer-base-text");
  out.finetune.answerErrors = await page.$$eval(".answer[data-error]", (e) => e.length);
  await shots(page, "finetune");
  t = lap("finetune", t);

  // 4. Quantize the served GGUF, mixed to 5.5 bpw over 4 and 8 bits; cancel it from the status page.
  await nav(page, "quantize");
  await page.waitForSelector("#q-source-0", { timeout: MIN });
  out.sourceDefault = await page.getAttribute('input[name="q-source"]:checked', "value");
  if (out.sourceDefault !== served.path) throw new Error(`the served model ${served.path} is not preselected (${out.sourceDefault})`);
  await page.click("#q-next-1");
  await page.check("#q-mode-mixed");
  await page.check("#q-format-gguf");
  await page.fill("#q-bpw", "5.5");
  for (const b of [2, 3, 4, 5, 6, 8]) await page.setChecked("#q-cand-" + b, b === 4 || b === 8);
  await page.fill("#q-out", path.join(scratch, "mixed.gguf"));
  await page.waitForTimeout(600); // let the debounced preview of the last edit start
  await page.click("#q-preview");
  await ready(page, "#q-preview-out");
  out.quantize = { previewSize: await page.textContent("#q-preview-size"), previewCtx: await page.textContent("#q-preview-ctx") };
  await page.click("#q-submit");
  await page.waitForSelector("#q-panel-3:not([hidden])", { timeout: MIN });
  out.quantize.jobId = await page.textContent("#q-job-id");
  await attrAtLeast(page, "#q-sens-chart", "data-bars", 1, 5 * MIN);
  out.quantize.bars = Number(await page.getAttribute("#q-sens-chart", "data-bars"));
  await shots(page, "quantize");
  t = lap("quantize", t);

  await nav(page, "status");
  const id = out.quantize.jobId;
  await page.click(`#st-cancel-${id}`, { timeout: MIN });
  await page.waitForSelector(`#st-job-${id}[data-status="cancelled"]`, { timeout: 2 * MIN });
  out.quantize.status = await page.getAttribute(`#st-job-${id}`, "data-status");
  await page.click(`#st-tail-${id}`);
  await page.waitForFunction(() => document.getElementById("st-log").textContent.includes("cancelled"), null, { timeout: MIN });
  out.statusLogTail = (await page.textContent("#st-log")).split("\n").slice(-3).join("\n");
  // The cancelled job gives the execution lease back (the memory section's "Heavy job").
  await page.waitForFunction(() => /none running/.test(document.getElementById("st-mem-lease").textContent), null, { timeout: MIN });
  out.leaseAfterCancel = await page.textContent("#st-mem-lease");
  await shots(page, "status");
  lap("status", t);
} catch (e) {
  out.error = String(e && e.stack || e);
  if (page) {
    out.errorArea = await errorText(page).catch(() => "");
    const file = path.join(SHOTS, "failure.png");
    fs.mkdirSync(SHOTS, { recursive: true });
    await page.screenshot({ path: file, fullPage: true }).catch(() => {});
    out.failureScreenshot = file;
  }
  process.exitCode = 1;
} finally {
  out.secs.total = Math.round((Date.now() - t0) / 100) / 10;
  await browser.close();
  console.log(JSON.stringify(out));
}
