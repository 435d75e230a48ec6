// One chat turn on tlm serve's page at / in headless Chromium (as tests/node/serve_page.mjs drives
// it): types the question, waits for the streamed answer, prints it as JSON and saves a
// screenshot (bench/sft/sft.sh). Usage: node chat_page.mjs URL QUESTION PNG
import puppeteer from "puppeteer-core";

const [base, question, png] = process.argv.slice(2);
const browser = await puppeteer.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
});
try {
  const page = await browser.newPage();
  await page.setViewport({ width: 900, height: 500 });
  await page.goto(base + "/", { waitUntil: "load" });
  for (const id of ["max_tokens", "temperature"]) await page.$eval("#" + id, (e) => (e.value = ""));
  await page.type("#max_tokens", "40");
  await page.type("#temperature", "0");
  await page.type("#input", question);
  await page.click("#send");
  await page.waitForFunction(() => document.getElementById("stats").textContent.includes("generated") &&
    !document.getElementById("send").disabled, { timeout: 60000 });
  const messages = await page.evaluate(() =>
    [...document.querySelectorAll("#log .msg")].map((m) => m.textContent));
  await page.screenshot({ path: png });
  console.log(JSON.stringify({ answer: messages[messages.length - 1].trim() }));
} finally {
  await browser.close();
}
