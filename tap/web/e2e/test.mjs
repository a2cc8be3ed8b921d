// Browser test of kproxy's web view. It starts the e2e server (an
// in-process kproxy with real franz-go consumers), opens the page in
// headless Debian chromium, drives real rebalances and checks that they
// appear in the timeline, then saves a screenshot under artifacts/.
//
// Environment: E2E_SERVER is the built e2e server binary (run.sh builds
// it); CHROMIUM overrides /usr/bin/chromium.
import { chromium } from "playwright-core";
import { spawn } from "node:child_process";
import { mkdtempSync, mkdirSync, rmSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { createInterface } from "node:readline";

const here = dirname(fileURLToPath(import.meta.url));
const artifacts = join(here, "artifacts");
const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";
const serverBin = process.env.E2E_SERVER;

let passed = 0;
let failed = 0;
function check(name, ok, detail = "") {
  if (ok) {
    passed++;
    console.log("ok   " + name);
  } else {
    failed++;
    console.log("FAIL " + name + (detail ? ": " + detail : ""));
  }
}

function fatal(msg) {
  console.error("e2e: " + msg);
  console.log(`0 passed, 1 failed`);
  process.exit(1);
}

if (!existsSync(executablePath)) fatal(`chromium not found at ${executablePath}: install Debian's chromium (apt-get install -y chromium)`);
if (!serverBin || !existsSync(serverBin)) fatal(`E2E_SERVER (${serverBin}) is not a built e2e server binary; run tap/web/e2e/run.sh`);

// startServer runs the e2e server and resolves with its admin URL.
function startServer() {
  const proc = spawn(serverBin, [], { stdio: ["pipe", "pipe", "inherit"] });
  const url = new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("e2e server printed no ADMIN_URL within 90s")), 90000);
    const rl = createInterface({ input: proc.stdout });
    rl.on("line", line => {
      if (line.startsWith("ADMIN_URL=")) {
        clearTimeout(timer);
        resolve(line.slice("ADMIN_URL=".length));
      }
    });
    proc.on("exit", code => reject(new Error("e2e server exited with " + code)));
  });
  return { proc, url };
}

async function waitFor(what, fn, timeoutMs = 30000) {
  const deadline = Date.now() + timeoutMs;
  let last;
  while (Date.now() < deadline) {
    last = await fn();
    if (last) return last;
    await new Promise(r => setTimeout(r, 100));
  }
  throw new Error("timed out waiting for " + what + " (last: " + JSON.stringify(last) + ")");
}

const { proc, url: urlPromise } = startServer();
const profile = mkdtempSync(join(tmpdir(), "kproxy-e2e-profile-"));
let context;
try {
  const adminURL = await urlPromise;
  console.log("admin server at " + adminURL);
  context = await chromium.launchPersistentContext(profile, {
    executablePath,
    headless: true,
    viewport: { width: 1400, height: 900 },
    args: [
      "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync",
    ],
  });
  const page = context.pages()[0] || await context.newPage();
  const consoleErrors = [];
  page.on("console", m => { if (m.type() === "error") consoleErrors.push(m.text()); });
  page.on("pageerror", e => consoleErrors.push(String(e)));

  await page.goto(adminURL + "/#orders");
  await page.waitForSelector('#groups tbody tr[data-group="orders"]', { timeout: 15000 });
  check("group list shows orders and billing", await page.locator('#groups tbody tr[data-group="billing"]').count() === 1);

  // Every group's total lag is in the list. audit's member never commits,
  // so its lag is every record of invoices (50).
  const lagOf = g => page.locator(`#groups tbody tr[data-group="${g}"] td[data-lag]`).getAttribute("data-lag");
  check("group list shows each group's total lag",
    (await Promise.all(["orders", "billing", "audit"].map(lagOf))).every(l => /^[0-9]+$/.test(l ?? "")));
  check("audit's total lag counts every record", await lagOf("audit") === "50", await lagOf("audit"));

  // A group with members but no commits: no error, the assigned
  // partitions with their end offsets and lag.
  await page.click('#groups tbody tr[data-group="audit"]');
  const auditNote = await waitFor("audit's offsets", async () => {
    const t = await page.locator("#offsets-note").textContent();
    return (await page.locator("#offsets tbody tr").count()) === 3 ? t : null;
  });
  check("a group without commits says so, not an error",
    auditNote.includes("no committed offsets") && !auditNote.includes("unavailable"), auditNote);
  const auditRows = await page.$$eval("#offsets tbody tr", rs => rs.map(r => [...r.cells].map(c => c.textContent)));
  check("its assigned partitions show end offsets and lag, nothing committed",
    auditRows.every(([, , committed, end, lag]) => committed === "—" && end === lag && /^[0-9]+$/.test(end)) &&
    auditRows.reduce((n, r) => n + Number(r[4]), 0) === 50, JSON.stringify(auditRows));
  check("its total lag is shown", (await page.locator("#total-lag").textContent()) === "total lag 50");
  mkdirSync(artifacts, { recursive: true });
  await page.screenshot({ path: join(artifacts, "no-commits.png"), fullPage: true });
  await page.click('#groups tbody tr[data-group="orders"]');
  await page.waitForSelector('.conn[data-state="live"]', { timeout: 15000 });
  check("event stream connected", true);

  // The first rebalance happened before the page loaded: it is replayed.
  await page.waitForSelector('.rb-bar.group[data-outcome="completed"]', { timeout: 15000 });
  const before = await page.locator('.rb-bar.group[data-outcome="completed"]').count();
  check("replayed rebalance bar appears", before >= 1, `bars=${before}`);

  // Drive real rebalances while the page watches.
  const resp = await fetch(adminURL + "/test/drive", { method: "POST" });
  const body = await resp.text();
  if (!resp.ok) throw new Error("drive failed: " + resp.status + " " + body);
  const finalGen = JSON.parse(body).generation;
  console.log("scenario done, generation " + finalGen);

  let seen = [];
  const causes = await waitFor("live rebalances in the timeline", async () => {
    seen = await page.$$eval(".rb-bar.group", bars => bars.map(b => b.dataset.cause + "/" + b.dataset.outcome));
    const done = seen.filter(c => c.endsWith("/completed")).map(c => c.split("/")[0]);
    return done.includes("member_left") && done.includes("member_expired") ? done : null;
  }).catch(e => { throw new Error(e.message + "; bars: " + seen.join(",")); });
  check("live rebalances appear with their causes", causes.length >= before + 3, causes.join(","));

  const bar = page.locator('.rb-bar.group[data-cause="member_expired"]').last();
  check("rebalance bar is split into join and sync phases",
    await bar.locator(".seg-join").count() === 1 && await bar.locator(".seg-sync").count() === 1);
  await bar.hover();
  const tip = await waitFor("tooltip", async () => {
    const t = page.locator("#tip");
    return (await t.isVisible()) ? await t.textContent() : null;
  }, 5000);
  check("hover shows the cause", tip.includes("cause: member_expired") && tip.includes("orders-consumer-3"), tip);
  check("hover shows phase durations", /join [0-9<]/.test(tip) && /sync [0-9<]/.test(tip), tip);

  const lanes = await page.$$eval(".tl-row[data-lane] .tl-label", ls => ls.map(l => l.textContent));
  check("a lane per member", ["orders-consumer-1", "orders-consumer-2", "orders-consumer-3"].every(c => lanes.some(l => l.startsWith(c))), lanes.join(" | "));
  check("expiry marker on the vanished member's lane",
    await page.locator('.mark[data-kind="member_expired"]').count() >= 1);
  check("leave marker", await page.locator('.mark[data-kind="member_left"]').count() >= 1);

  await waitFor("group detail at the final generation", async () =>
    (await page.locator("#group-facts").textContent()).includes("generation" + finalGen));
  const memberRows = await page.$$eval("#members tbody tr", rs => rs.map(r => r.textContent));
  check("members table shows the survivor and its assignment",
    memberRows.length === 1 && memberRows[0].includes("orders-consumer-1") && memberRows[0].includes("payments[0,1,2,3,4,5]"),
    memberRows.join(" | "));
  const offsetRows = await waitFor("offsets", async () => {
    const n = await page.locator("#offsets tbody tr").count();
    return n === 6 ? n : null;
  });
  check("offsets table lists the 6 partitions", offsetRows === 6);
  check("no console errors", consoleErrors.length === 0, consoleErrors.join("; "));

  mkdirSync(artifacts, { recursive: true });
  const shot = join(artifacts, "timeline.png");
  await page.mouse.move(5, 5);
  await page.screenshot({ path: shot, fullPage: true });
  // And one with the tooltip showing.
  await bar.hover();
  await page.screenshot({ path: join(artifacts, "timeline-hover.png"), fullPage: false });
  console.log("screenshot saved to " + shot);
} catch (e) {
  failed++;
  console.log("FAIL " + (e && e.stack || e));
  if (context) {
    mkdirSync(artifacts, { recursive: true });
    await context.pages()[0]?.screenshot({ path: join(artifacts, "failure.png"), fullPage: true }).catch(() => {});
  }
} finally {
  if (context) await context.close().catch(() => {});
  proc.stdin.end();
  proc.kill("SIGTERM");
  rmSync(profile, { recursive: true, force: true });
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
