// tlm serve's page at / in headless Chromium (Debian's, driven by puppeteer-core): a chat turn
// streams an answer and reports usage, a second turn reuses the cached prefix, and the completion
// playground continues a prompt. Usage: node serve_page.mjs BASE_URL API_KEY
import puppeteer from "puppeteer-core";

const [base, apiKey] = process.argv.slice(2);
let failures = 0;
function check(cond, what) {
  if (!cond) {
    failures++;
    console.error("FAIL: " + what);
  }
}
const browser = await puppeteer.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
});
try {
  const page = await browser.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await page.goto(base + "/", { waitUntil: "load" });
  check((await page.title()) === "tlm serve", "title");
  await page.type("#key", apiKey);
  await page.$eval("#key", (e) => e.dispatchEvent(new Event("change")));
  for (const id of ["max_tokens", "temperature"]) await page.$eval("#" + id, (e) => (e.value = ""));
  await page.type("#max_tokens", "12");
  await page.type("#temperature", "0");

  async function turn(text) {
    await page.type("#input", text);
    await page.click("#send");
    await page.waitForFunction(() => document.getElementById("stats").textContent.includes("generated") &&
      !document.getElementById("send").disabled, { timeout: 20000 });
    return page.evaluate(() => ({
      messages: [...document.querySelectorAll("#log .msg")].map((m) => [m.className, m.textContent]),
      stats: document.getElementById("stats").textContent,
    }));
  }
  let r = await turn("Tell me a story.");
  check(r.messages.length === 2 && r.messages[0][1] === "Tell me a story." && r.messages[1][0] === "msg assistant" &&
    r.messages[1][1].length > 0, "first turn: " + JSON.stringify(r.messages));
  check(/12 generated/.test(r.stats), "first stats: " + r.stats);
  await page.$eval("#stats", (e) => (e.textContent = ""));
  r = await turn("And then?");
  const cached = Number((r.stats.match(/\((\d+) cached\)/) || [])[1]);
  check(r.messages.length === 4 && cached > 20, "second turn reuses the prefix: " + r.stats);

  await page.select("#mode", "completion");
  await page.$eval("#clear", (e) => e.click());
  r = await turn("Once upon a time");
  check(r.messages.length === 1 && r.messages[0][1].startsWith("Once upon a time") &&
    r.messages[0][1].length > "Once upon a time".length, "playground: " + JSON.stringify(r.messages));
  check(errors.length === 0, "page errors: " + errors.join("; "));
} finally {
  await browser.close();
}
if (failures) {
  console.error(`${failures} failures`);
  process.exit(1);
}
console.log("serve_page: all passed");
