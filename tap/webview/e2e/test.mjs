// Browser test of kproxy's web view. It starts the e2e server (an
// in-process kproxy with real franz-go consumers), opens the page in
// headless Debian chromium, drives real rebalances and checks that they
// appear in the timeline, then checks the fleet view against the server's
// fixed fleet and, under /local/, the view of a kproxy without a fleet.
// Screenshots are saved under artifacts/.
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
if (!serverBin || !existsSync(serverBin)) fatal(`E2E_SERVER (${serverBin}) is not a built e2e server binary; run tap/webview/e2e/run.sh`);

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

// The e2e server's fixed fleet (tap/internal/e2eserver, fakeFleet): 16
// partitions; this kproxy (web-1) leads, owns p%3==0 and serves all of
// them but 15; web-2 owns p%3==1, web-3 p%3==2 except 14, which has no
// owner.
const FLEET = {
  self: "web-1-40213-q8x1",
  serving: [0, 3, 6, 9, 12],
  claiming: [15],
  owners: { "web-1-40213-q8x1": 6, "web-2-40877-r2m0": 5, "web-3-41002-t5k7": 4 },
  peers: { "web-1-40213-q8x1": "10.0.0.11:9093", "web-2-40877-r2m0": "10.0.0.12:9093", "web-3-41002-t5k7": "10.0.0.13:9093" },
};

// checkFleet opens the Fleet tab and checks it shows the fixed fleet,
// then checks the view of a kproxy whose /api/fleet answers 404.
async function checkFleet(page, adminURL) {
  await page.click('#tabs a[data-view="fleet"]');
  await page.waitForSelector("#fleet-partitions tbody tr", { timeout: 10000 });
  check("fleet tab is selected and the groups view hidden",
    await page.locator('#tabs a[data-view="fleet"]').getAttribute("aria-selected") === "true" &&
    await page.locator("#groups-view").isHidden() && new URL(page.url()).searchParams.get("view") === "fleet");
  const fact = async k => (await page.locator(`#fleet-facts [data-fact="${k}"] dd`).textContent()).trim();
  const facts = await page.locator("#fleet-facts").textContent();
  check("fleet facts name this kproxy", facts.includes(FLEET.self), facts);
  check("fleet facts: it leads the fleet", await fact("leader") === "yes", await fact("leader"));
  check("fleet facts: generation, lease, moves, fences",
    await fact("generation") === "12" && await fact("lease") === "7.25s left" &&
    await fact("moves") === "9" && await fact("fenced") === "1",
    [await fact("generation"), await fact("lease"), await fact("moves"), await fact("fenced")].join(" | "));
  check("fleet facts: serving 5 of 16", await fact("serving") === "5 of 16 partitions", await fact("serving"));

  const parts = await page.$$eval("#fleet-partitions tbody tr", rs => rs.map(r => ({
    p: Number(r.dataset.partition), owner: r.dataset.owner, serving: r.dataset.serving === "true",
    cls: r.className, peer: r.cells[2].textContent, text: r.textContent,
  })));
  check("a row per groups-topic partition", parts.length === 16 && parts.every((r, i) => r.p === i), JSON.stringify(parts.map(r => r.p)));
  const highlighted = parts.filter(r => r.cls.split(" ").includes("here")).map(r => r.p);
  check("the partitions served here are highlighted, and only those",
    JSON.stringify(highlighted) === JSON.stringify(FLEET.serving) &&
    JSON.stringify(parts.filter(r => r.serving).map(r => r.p)) === JSON.stringify(FLEET.serving), JSON.stringify(highlighted));
  check("owners and their peers per partition",
    parts.every(r => r.p === 14 ? r.owner === "" : r.owner === Object.keys(FLEET.owners)[r.p % 3] && r.peer === FLEET.peers[r.owner]),
    JSON.stringify(parts.map(r => r.owner + "@" + r.peer)));
  check("a partition without owner says so", parts[14].text.includes("no owner"), parts[14].text);
  check("an assigned partition not served yet is marked, not highlighted",
    FLEET.claiming.every(p => parts[p].cls.includes("claiming") && parts[p].text.includes("not served yet")), parts[15].text);
  const cells = await page.$$eval("#fleet-map .pcell", cs => cs.map(c => c.className));
  check("the partition map has a cell per partition, served ones marked",
    cells.length === 16 && cells.map((c, p) => c.includes("here") ? p : -1).filter(p => p >= 0).join() === FLEET.serving.join(), cells.join(","));

  const members = await page.$$eval("#fleet-members tbody tr", rs => rs.map(r => ({
    id: r.cells[0].textContent, peer: r.cells[2].textContent, count: Number(r.cells[3].textContent),
  })));
  check("a row per fleet member with its peer and partition count",
    members.length === 3 && Object.entries(FLEET.owners).every(([id, count]) =>
      members.some(m => m.id.startsWith(id) && m.count === count && m.peer === FLEET.peers[id])), JSON.stringify(members));
  const self = members.find(m => m.id.startsWith(FLEET.self));
  check("this kproxy's row is marked as itself and the leader",
    self && self.id.includes("this kproxy") && self.id.includes("leader") &&
    members.filter(m => m.id.includes("leader")).length === 1, JSON.stringify(members));

  await page.mouse.move(5, 5);
  await page.screenshot({ path: join(artifacts, "fleet.png"), fullPage: true });
  await page.hover('#fleet-map .pcell[data-partition="15"]');
  const tip = await waitFor("partition tooltip", async () => {
    const t = page.locator("#tip");
    return (await t.isVisible()) ? await t.textContent() : null;
  }, 5000);
  check("hovering a partition names its owner", tip.includes("partition 15") && tip.includes(FLEET.self) && tip.includes("not served yet"), tip);
  await page.screenshot({ path: join(artifacts, "fleet-hover.png"), fullPage: false });

  // Back to the groups, then a reload keeps the tab.
  await page.click('#tabs a[data-view="groups"]');
  check("groups tab comes back", await page.locator("#groups-view").isVisible() && await page.locator("#fleet-view").isHidden() &&
    new URL(page.url()).searchParams.get("view") === null);
  await page.goto(adminURL + "/?view=fleet");
  await page.waitForSelector("#fleet-partitions tbody tr", { timeout: 10000 });
  check("?view=fleet opens the fleet tab", await page.locator("#groups-view").isHidden());

  // A kproxy without a fleet: /api/fleet answers 404.
  const r = await fetch(adminURL + "/local/api/fleet");
  check("/api/fleet answers 404 without a fleet", r.status === 404, String(r.status));
  await page.goto(adminURL + "/local/?view=fleet");
  const note = await waitFor("not-distributed notice", async () => {
    const n = page.locator('#fleet-note[data-state="not-distributed"]');
    return (await n.count()) === 1 ? await n.textContent() : null;
  }, 10000);
  check("without a fleet the section says groups are not distributed", note.includes("Groups are not distributed"), note);
  check("and shows no fleet table", await page.locator("#fleet-body").isHidden() &&
    (await page.locator("#fleet-facts").textContent()) === "");
  await page.screenshot({ path: join(artifacts, "fleet-not-distributed.png"), fullPage: false });
  await page.click('#tabs a[data-view="groups"]');
  await page.waitForSelector('#groups tbody tr[data-group="orders"]', { timeout: 15000 });
  check("the groups view still works under /local/", true);
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
  page.on("console", m => {
    if (m.type() !== "error") return;
    // The view of a kproxy without a fleet asks for /api/fleet, which
    // answers 404 by design; chromium logs that as a failed resource.
    if (m.location().url.endsWith("/local/api/fleet") && m.text().includes("404")) return;
    consoleErrors.push(m.text() + " (" + m.location().url + ")");
  });
  page.on("pageerror", e => consoleErrors.push(String(e)));

  await page.goto(adminURL + "/#orders");
  await page.waitForSelector('#groups tbody tr[data-group="orders"]', { timeout: 15000 });
  check("group list shows orders and billing", await page.locator('#groups tbody tr[data-group="billing"]').count() === 1);
  const ordersKind = await page.locator('#groups tbody tr[data-group="orders"] td[data-kind]').getAttribute("data-kind");
  check("the group list shows each group's kind", ordersKind === "classic" || ordersKind === "consumer", ordersKind);
  const reports = page.locator('#forwarded tbody tr[data-group="reports"]');
  check("the share group is listed as served by the cluster, with its kind",
    await reports.count() === 1 && (await reports.locator("td").nth(1).textContent()) === "share" &&
    await page.locator('#groups tbody tr[data-group="reports"]').count() === 0,
    await page.locator("#forwarded").textContent());

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

  mkdirSync(artifacts, { recursive: true });
  const shot = join(artifacts, "timeline.png");
  await page.mouse.move(5, 5);
  await page.screenshot({ path: shot, fullPage: true });
  // And one with the tooltip showing.
  await bar.hover();
  await page.screenshot({ path: join(artifacts, "timeline-hover.png"), fullPage: false });
  console.log("screenshot saved to " + shot);

  await checkFleet(page, adminURL);
  check("no console errors", consoleErrors.length === 0, consoleErrors.join("; "));
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
