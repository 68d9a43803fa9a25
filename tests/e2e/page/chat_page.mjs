// Opens the chat page in headless Chromium, types a question, and reports what streamed.
// Usage: node chat_page.mjs <server-url>; prints one JSON object.
import { chromium } from "playwright-core";

const url = process.argv[2];
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox"],
});
try {
  const page = await browser.newPage();
  const consoleErrors = [];
  page.on("pageerror", (e) => consoleErrors.push(String(e)));
  await page.goto(url);
  await page.waitForFunction(() => document.getElementById("kv").textContent !== "…");
  const model = await page.$eval("#model", (s) => s.value || s.textContent);
  const options = await page.$$eval("#model option", (os) => os.map((o) => o.value));
  const kv = await page.textContent("#kv");

  // Count how many times the answer grows while it streams.
  await page.evaluate(() => {
    window.__updates = 0;
    new MutationObserver(() => window.__updates++).observe(document.getElementById("log"), {
      subtree: true, childList: true, characterData: true,
    });
  });
  await page.fill("#input", "What is the capital of France?");
  await page.press("#input", "Enter");
  await page.waitForSelector(".assistant[data-done='1']", { timeout: 60000 });
  const answer = await page.textContent(".assistant[data-done='1']");
  const updates = await page.evaluate(() => window.__updates);
  const speed = await page.textContent("#speed");

  // The stop button ends a long answer early.
  await page.fill("#input", "Write a very long story about a dragon.");
  await page.press("#input", "Enter");
  await page.waitForFunction(() => document.querySelectorAll(".assistant").length === 2 &&
    document.querySelectorAll(".assistant")[1].textContent.length > 0, null, { timeout: 30000 });
  const stopAt = Date.now();
  await page.click("#stop");
  await page.waitForSelector(".assistant:nth-of-type(4)[data-done='1']", { timeout: 10000 });
  const stopSecs = (Date.now() - stopAt) / 1000;
  const sendEnabled = await page.isEnabled("#send");

  const answeredBy = await page.getAttribute(".assistant[data-done='1']", "data-model");

  // A model picked from the list answers the next message (argv[3], when given).
  let picked = null;
  if (process.argv[3]) {
    await page.selectOption("#model", process.argv[3]);
    await page.fill("#input", "Name a colour.");
    await page.press("#input", "Enter");
    await page.waitForFunction(() => document.querySelectorAll(".assistant[data-done='1']").length === 3,
      null, { timeout: 60000 });
    picked = await page.$$eval(".assistant[data-done='1']", (ds) => ds[2].dataset.model);
  }

  console.log(JSON.stringify({ model, options, kv, answer, answeredBy, picked, updates, speed, stopSecs,
    sendEnabled, consoleErrors }));
} finally {
  await browser.close();
}
