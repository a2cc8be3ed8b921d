// Screenshots of kproxy's rebalance traces in Jaeger's UI; run by
// screenshot.sh once kproxy's traces are in Jaeger. It reads the traces
// through Jaeger's query API, prints one line per rebalance, picks the
// classic rebalance caused by a member's expiry and the KIP-848 rebalance
// with the most member spans, and saves three PNGs: the search page, and
// each of those traces with a span's attributes open.
//
// Environment: JAEGER_URL (Jaeger's query HTTP address), OUT_DIR,
// CHROMIUM (default /usr/bin/chromium).
import { chromium } from "playwright-core";
import { join } from "node:path";

const base = process.env.JAEGER_URL;
const out = process.env.OUT_DIR;
const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";
if (!base || !out) {
  console.error("shoot: JAEGER_URL and OUT_DIR are required (run screenshot.sh)");
  process.exit(1);
}
const sleep = ms => new Promise(r => setTimeout(r, ms));

async function traces() {
  const r = await fetch(`${base}/api/traces?service=kproxy&limit=500&lookback=1h`);
  if (!r.ok) throw new Error(`GET /api/traces: ${r.status}`);
  return (await r.json()).data || [];
}

// Jaeger stores asynchronously: wait until two answers in a row hold as
// many spans.
let data = [];
for (let prev = -1, deadline = Date.now() + 30000; ; ) {
  data = await traces();
  const n = data.reduce((s, t) => s + t.spans.length, 0);
  if ((n > 0 && n === prev) || Date.now() > deadline) break;
  prev = n;
  await sleep(500);
}
if (data.length === 0) {
  console.error("shoot: Jaeger holds no trace of service kproxy");
  process.exit(1);
}

const tags = span => Object.fromEntries(span.tags.map(t => [t.key, t.value]));
const rebalances = data.map(t => {
  const root = t.spans.find(s => !s.references.some(r => r.refType === "CHILD_OF"));
  const tg = tags(root);
  return {
    id: t.traceID,
    start: root.startTime,
    group: tg["messaging.consumer.group.name"],
    kind: tg["kproxy.group.kind"],
    cause: String(tg["kproxy.rebalance.cause"] ?? ""),
    outcome: tg["kproxy.rebalance.outcome"],
    members: tg["kproxy.group.member_count"],
    spans: t.spans.length,
    memberSpans: t.spans.filter(s => s.operationName === "reconcile_member").length,
    durationMs: root.duration / 1000,
  };
}).sort((a, b) => a.start - b.start);
for (const r of rebalances) {
  console.log(`rebalance ${r.id} group=${r.group} kind=${r.kind} cause=${r.cause} outcome=${r.outcome} members=${r.members} spans=${r.spans} duration=${r.durationMs.toFixed(1)}ms`);
}

const expiry = rebalances.find(r => r.kind === "classic" && /expir/.test(r.cause));
const reconcile = rebalances.filter(r => r.kind === "consumer").sort((a, b) => b.memberSpans - a.memberSpans)[0];
if (!expiry || !reconcile) {
  console.error("shoot: missing a classic rebalance caused by an expiry or a KIP-848 rebalance");
  process.exit(1);
}

const browser = await chromium.launch({ executablePath, args: ["--no-sandbox"] });
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  const shot = async name => {
    await page.mouse.move(1390, 990); // no hover highlight
    await sleep(500);
    const path = join(out, name);
    await page.screenshot({ path });
    console.log("saved " + path);
  };
  const spanRows = name =>
    page.locator(".span-row .span-name", { has: page.locator(".endpoint-name", { hasText: new RegExp(`^${name}$`) }) });
  const openTags = async () => {
    await page.locator(".detail-row .AccordianKeyValues--header", { hasText: "Tags" }).first().click();
  };
  const openTrace = async id => {
    await page.goto(`${base}/trace/${id}`);
    await page.locator(".span-row").first().waitFor({ timeout: 30000 });
  };

  // The search page, narrowed to one group by its attribute as an
  // operator would.
  await page.goto(`${base}/search?service=kproxy&limit=50&lookback=1h`);
  await page.locator(`input[placeholder^="http.status_code"]`).fill(`messaging.consumer.group.name=${expiry.group}`);
  await page.getByRole("button", { name: "Find Traces" }).click();
  await page.getByText(/^\d+ Traces?$/).first().waitFor({ timeout: 30000 });
  await page.locator(".ResultItem").first().waitFor({ timeout: 30000 });
  await shot("jaeger-kproxy-search.png");

  // The classic rebalance after a member's expiry: the root span's
  // attributes (cause, the expired member) above its join and sync spans.
  await openTrace(expiry.id);
  await spanRows("rebalance").first().click();
  await openTags();
  await shot("jaeger-kproxy-classic-expiry.png");

  // The KIP-848 rebalance: a member span whose partitions were revoked,
  // with its events open.
  await openTrace(reconcile.id);
  const members = spanRows("reconcile_member");
  let found = false;
  for (let i = 0; i < (await members.count()) && !found; i++) {
    await members.nth(i).click();
    const detail = page.locator(".detail-row").first();
    if (await detail.getByText("revoke_requested").count()) {
      await openTags();
      await detail.locator(".AccordianLogs--content .AccordianKeyValues--header").first().click();
      found = true;
    } else {
      await members.nth(i).click();
    }
  }
  if (!found) throw new Error("no reconcile_member span with a revoke_requested event");
  await shot("jaeger-kproxy-kip848-reconcile.png");
} finally {
  await browser.close();
}
