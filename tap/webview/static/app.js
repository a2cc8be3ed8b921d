// kproxy web view: the group list, one group's members, assignment and
// offsets, and a rebalance timeline built from the live event stream; and
// the fleet (?view=fleet): who owns which groups-topic partition.
// Plain JavaScript, no build step. Every string that came from a client
// (group, member and client ids, hosts) is inserted as text, never HTML.
"use strict";

const MAX_EVENTS_PER_GROUP = 2000;
const MAX_REBALANCES_SHOWN = 40;

// state is the page's whole model.
const state = {
  groups: [],            // last /api/groups answer
  forwarded: [],         // last /api/forwarded answer: groups the cluster serves
  selected: null,        // selected group id
  events: new Map(),     // group -> [event] in arrival order
  recent: [],            // last events of every group, newest first
  lastSeq: 0,
  boot: "",              // event-stream boot id (changes when kproxy restarts)
  view: "groups",        // "groups" or "fleet" (?view=fleet)
};

// el creates an element with attributes and children (strings become text).
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null) continue;
    if (k === "class") e.className = v;
    else if (k === "style") Object.assign(e.style, v);
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) {
    if (c === undefined || c === null) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function fmtDur(ms) {
  if (ms < 1) return "<1ms";
  if (ms < 1000) return Math.round(ms) + "ms";
  if (ms < 60000) return (ms / 1000).toFixed(ms < 10000 ? 2 : 1) + "s";
  if (ms < 3600000) return Math.floor(ms / 60000) + "m" + Math.round((ms % 60000) / 1000) + "s";
  return (ms / 3600000).toFixed(1) + "h";
}

function fmtTime(t) {
  const d = new Date(t);
  return d.toLocaleTimeString([], { hour12: false }) + "." + String(d.getMilliseconds()).padStart(3, "0");
}

function fmtAssignment(a) {
  if (!a || a.length === 0) return "";
  return a.map(tp => tp.topic + "[" + tp.partitions.join(",") + "]").join(" ");
}

// ---- data -----------------------------------------------------------------

async function getJSON(path) {
  const r = await fetch(path, { cache: "no-store" });
  if (!r.ok) throw new Error(path + ": " + r.status);
  return r.json();
}

// Responses can arrive out of order; only the newest request's answer is
// applied.
let groupsReq = 0, detailReq = 0;

async function refreshGroups() {
  const mine = ++groupsReq;
  let groups, forwarded = null;
  try {
    groups = await getJSON("api/groups");
  } catch (e) {
    return;
  }
  try {
    forwarded = (await getJSON("api/forwarded")).groups;
  } catch (e) {
    // an older kproxy, or none: the section stays empty
  }
  if (mine !== groupsReq) return;
  state.groups = groups;
  state.forwarded = forwarded || [];
  if (!state.selected && state.groups.length > 0) {
    const fromHash = decodeURIComponent(location.hash.slice(1));
    const known = state.groups.find(g => g.group === fromHash);
    select(known ? known.group : state.groups[0].group, false);
  }
  renderGroups();
}

let detailTimer = null;
function scheduleDetail() {
  if (detailTimer) return;
  detailTimer = setTimeout(() => { detailTimer = null; refreshDetail(); }, 250);
}

async function refreshDetail() {
  const id = state.selected;
  if (!id) return;
  const mine = ++detailReq;
  let d;
  try {
    d = await getJSON("api/groups/" + encodeURIComponent(id));
  } catch (e) {
    d = null;
  }
  if (id !== state.selected || mine !== detailReq) return;
  renderDetail(d);
}

function select(id, push = true) {
  state.selected = id;
  if (push) history.replaceState(null, "", "#" + encodeURIComponent(id));
  renderGroups();
  renderTimeline();
  renderEvents();
  refreshDetail();
}

// ---- live events ----------------------------------------------------------

function onEvent(ev) {
  if (ev.seq <= state.lastSeq) return; // replayed after a reconnect
  state.lastSeq = ev.seq;
  let list = state.events.get(ev.group);
  if (!list) { list = []; state.events.set(ev.group, list); }
  list.push(ev);
  if (list.length > MAX_EVENTS_PER_GROUP) list.splice(0, list.length - MAX_EVENTS_PER_GROUP);
  state.recent.unshift(ev);
  if (state.recent.length > 200) state.recent.length = 200;
  if (ev.kind !== "offsets_committed") scheduleGroups();
  if (ev.group === state.selected) scheduleDetail();
  scheduleRender();
}

let groupsTimer = null;
function scheduleGroups() {
  if (groupsTimer) return;
  groupsTimer = setTimeout(() => { groupsTimer = null; refreshGroups(); }, 200);
}

let renderPending = false;
function scheduleRender() {
  if (renderPending) return;
  renderPending = true;
  requestAnimationFrame(() => { renderPending = false; renderTimeline(); renderEvents(); });
}

function connect() {
  const conn = document.getElementById("conn");
  const es = new EventSource("api/events");
  es.onopen = () => { conn.dataset.state = "live"; conn.textContent = "live"; };
  es.onerror = () => { conn.dataset.state = "down"; conn.textContent = "reconnecting…"; };
  es.onmessage = m => {
    try { onEvent(JSON.parse(m.data)); } catch (e) { console.error("bad event", e); }
  };
  es.addEventListener("hello", m => {
    const h = JSON.parse(m.data);
    if (state.boot && state.boot !== h.boot) {
      // kproxy restarted: its event sequence starts over.
      state.events.clear();
      state.recent = [];
      state.lastSeq = 0;
      scheduleRender();
    }
    state.boot = h.boot;
  });
  es.addEventListener("dropped", m => {
    const n = JSON.parse(m.data).dropped;
    conn.textContent = "live (" + n + " events lost)";
  });
}

// ---- rebalances from events -----------------------------------------------

// rebalancesOf folds one group's events into rebalances and member events.
function rebalancesOf(events) {
  const out = [];
  const marks = [];
  let open = null;
  const close = (t, outcome) => {
    if (!open) return;
    open.end = t;
    open.outcome = outcome;
    out.push(open);
    open = null;
  };
  for (const ev of events) {
    const t = Date.parse(ev.time);
    switch (ev.kind) {
      case "rebalance_started":
        close(t, "superseded");
        open = {
          start: t, joinEnd: null, end: null, outcome: "open", cause: ev.cause || "unknown",
          causeMember: ev.member || null, prevGeneration: ev.generation, generation: null,
          members: [], leader: "", protocol: "",
        };
        break;
      case "join_completed":
        if (!open) break;
        open.joinEnd = t;
        open.generation = ev.generation;
        open.members = (ev.members || []).map(m => m.member_id);
        open.memberInfo = ev.members || [];
        open.leader = ev.leader || "";
        open.protocol = ev.protocol || "";
        break;
      case "sync_completed":
        close(t, "completed");
        break;
      case "assignment_reconciled":
        // KIP-848 groups: no join/sync round; the rebalance ends when
        // every member holds its target at the new group epoch.
        if (!open) break;
        open.generation = ev.generation;
        open.members = (ev.members || []).map(m => m.member_id);
        open.memberInfo = ev.members || [];
        open.protocol = ev.protocol || "";
        close(t, "completed");
        break;
      case "rebalance_aborted":
        close(t, "aborted");
        break;
      case "group_empty":
        close(t, "group_empty");
        break;
      case "group_deleted":
        close(t, "group_deleted");
        break;
      case "member_joined": case "member_left": case "member_expired": case "member_fenced":
        if (ev.member) marks.push({ t, kind: ev.kind, member: ev.member, cause: ev.cause || "" });
        break;
    }
  }
  if (open) out.push(open);
  return { rebalances: out, marks };
}

function describeRebalance(rb, now) {
  const end = rb.end ?? now;
  const lines = [];
  lines.push((rb.generation != null ? "generation " + rb.generation : "rebalance from generation " + rb.prevGeneration) + " · " + rb.outcome);
  let cause = "cause: " + rb.cause;
  if (rb.causeMember) {
    cause += " (" + rb.causeMember.member_id + (rb.causeMember.client_id ? ", " + rb.causeMember.client_id : "") +
      (rb.causeMember.client_host ? " @ " + rb.causeMember.client_host : "") + ")";
  }
  lines.push(cause);
  lines.push("started " + fmtTime(rb.start) + " · total " + fmtDur(end - rb.start));
  if (rb.joinEnd != null) {
    lines.push("join " + fmtDur(rb.joinEnd - rb.start) + " · sync " + fmtDur(end - rb.joinEnd));
  } else {
    lines.push("join " + fmtDur(end - rb.start) + (rb.end == null ? " (waiting for members)" : ""));
  }
  if (rb.members.length) lines.push(rb.members.length + " member(s), leader " + rb.leader + (rb.protocol ? ", protocol " + rb.protocol : ""));
  return lines.join("\n");
}

// ---- rendering -------------------------------------------------------------

function renderGroups() {
  const tbody = document.querySelector("#groups tbody");
  tbody.replaceChildren(...state.groups.map(g => {
    const tr = el("tr", { "data-group": g.group, class: g.group === state.selected ? "selected" : "" },
      el("td", { class: "mono" }, g.group),
      el("td", { "data-kind": g.kind || "" }, g.kind || ""),
      el("td", {}, el("span", { class: "state " + g.state }, g.state)),
      el("td", { class: "num" }, g.generation),
      el("td", { class: "num" }, g.members),
      // A share group commits no offsets: its progress is in its
      // share-partitions (the detail), not in a lag.
      el("td", { class: "num", "data-lag": g.total_lag ?? "", title: g.lag_error || null },
        g.total_lag ?? (g.lag_error ? "?" : "—")));
    tr.onclick = () => select(g.group);
    return tr;
  }));
  document.getElementById("groups-empty").hidden = state.groups.length > 0;
  document.querySelector("#forwarded tbody").replaceChildren(...state.forwarded.map(g =>
    el("tr", { "data-group": g.group, title: "forwarded to the cluster's coordinator since " + fmtTime(g.decided_at) },
      el("td", { class: "mono" }, g.group),
      el("td", {}, g.kind || "unknown"))));
  document.getElementById("forwarded-empty").hidden = state.forwarded.length > 0;
}

function renderDetail(d) {
  const title = document.getElementById("group-title");
  const facts = document.getElementById("group-facts");
  const members = document.querySelector("#members tbody");
  const offsets = document.querySelector("#offsets tbody");
  const note = document.getElementById("offsets-note");
  const shares = document.querySelector("#share-partitions tbody");
  const shareSection = document.getElementById("share-section");
  if (!d) {
    shares.replaceChildren();
    shareSection.hidden = true;
    title.textContent = state.selected || "Select a group";
    facts.replaceChildren();
    members.replaceChildren();
    offsets.replaceChildren();
    note.textContent = "";
    return;
  }
  title.replaceChildren(el("span", { class: "mono" }, d.group), " ", el("span", { class: "state " + d.state }, d.state));
  const fact = (k, v) => el("div", {}, el("dt", {}, k), el("dd", {}, v === "" || v == null ? "—" : v));
  const epochs = d.kind === "consumer" || d.kind === "share";
  facts.replaceChildren(
    fact("kind", d.kind),
    fact(epochs ? "group epoch" : "generation", d.generation),
    fact("protocol type", d.protocol_type),
    fact("protocol", d.protocol),
    fact("leader", d.leader),
    fact("members", d.members.length),
    fact("since", d.state_since && !d.state_since.startsWith("0001") ? fmtTime(d.state_since) : ""));
  members.replaceChildren(...d.members.map(m => el("tr", { "data-member": m.member_id },
    el("td", { class: "mono" }, m.member_id, m.member_id === d.leader ? el("span", { class: "muted" }, " (leader)") : null,
      m.protocol ? el("span", { class: "muted", title: "the group protocol this member speaks" }, " · " + m.protocol) : null),
    el("td", {}, m.client_id || ""),
    el("td", { class: "mono" }, m.client_host || ""),
    el("td", { class: "mono" }, m.instance_id || ""),
    el("td", { class: "mono" }, m.assignment_error ? "undecodable: " + m.assignment_error : fmtAssignment(m.assignment)))));
  shareSection.hidden = d.kind !== "share";
  shares.replaceChildren(...(d.share_partitions || []).map(p => el("tr", { "data-topic": p.topic, "data-partition": p.partition },
    el("td", { class: "mono", title: "topic id " + p.topic_id }, p.topic || p.topic_id),
    el("td", { class: "num" }, p.partition),
    el("td", { class: "num" }, p.start_offset),
    el("td", { class: "num" }, p.in_flight),
    el("td", { class: "num" }, p.acquired),
    el("td", { class: "num" }, p.available))));
  // Rows are the partitions the group committed or is assigned; an
  // assigned partition without a commit shows "—" as its committed offset
  // and every record up to the end as its lag.
  offsets.replaceChildren(...d.offsets.map(o => el("tr", { title: o.error || null },
    el("td", { class: "mono" }, o.topic),
    el("td", { class: "num" }, o.partition),
    el("td", { class: "num" }, o.committed < 0 ? "—" : o.committed),
    el("td", { class: "num" }, o.end < 0 ? "?" : o.end),
    el("td", { class: "num" }, o.lag < 0 ? "?" : o.lag))));
  document.getElementById("total-lag").textContent = d.offsets.length ? "total lag " + d.total_lag : "";
  const committed = d.offsets.some(o => o.committed >= 0);
  if (d.offsets_error) note.textContent = "offsets unavailable: " + d.offsets_error;
  else if (d.offsets.length === 0) note.textContent = "no committed offsets";
  else if (!committed) note.textContent = "no committed offsets yet: lag counts every record up to the end offset";
  else note.textContent = "";
}

// layout places the breakpoints of rebalances at scale k (px per ms):
// phases keep proportional widths with a floor, idle gaps are squeezed.
function layout(rbs, now, k) {
  const points = []; // [t, x]
  let x = 24;
  let prevEnd = null;
  for (const rb of rbs) {
    const end = rb.end ?? now;
    if (prevEnd != null) {
      const gap = Math.max(rb.start - prevEnd, 0);
      x += Math.max(Math.min(gap * k, 70), 26);
    }
    points.push([rb.start, x]);
    const cuts = rb.joinEnd != null ? [rb.joinEnd, end] : [end];
    let t0 = rb.start;
    for (const c of cuts) {
      x += Math.max((c - t0) * k, 6);
      points.push([c, x]);
      t0 = c;
    }
    prevEnd = end;
  }
  return { points, width: x + 40 };
}

// scaleFor builds a piecewise-linear time->x map that fits width when it
// can: the largest scale (at most 2px/ms) whose layout fits is chosen.
function scaleFor(rbs, now, width) {
  let lo = 0, hi = 2;
  if (layout(rbs, now, hi).width > width) {
    for (let i = 0; i < 40; i++) {
      const mid = (lo + hi) / 2;
      if (layout(rbs, now, mid).width <= width) lo = mid; else hi = mid;
    }
    hi = lo;
  }
  const k = hi;
  const { points, width: w } = layout(rbs, now, k);
  const toX = t => {
    if (points.length === 0) return 0;
    if (t <= points[0][0]) return points[0][1] - Math.min((points[0][0] - t) * k, 18);
    for (let i = 1; i < points.length; i++) {
      const [t1, x1] = points[i];
      const [t0, x0] = points[i - 1];
      if (t <= t1) return t1 === t0 ? x1 : x0 + (x1 - x0) * (t - t0) / (t1 - t0);
    }
    const [tl, xl] = points[points.length - 1];
    return xl + Math.min((t - tl) * k, 18);
  };
  return { toX, width: w };
}

function bar(rb, now, toX, cls) {
  const end = rb.end ?? now;
  const x0 = toX(rb.start), x2 = toX(end);
  const x1 = rb.joinEnd != null ? toX(rb.joinEnd) : x2;
  const b = el("div", {
    class: "rb-bar " + cls, "data-outcome": rb.outcome, "data-cause": rb.cause,
    "data-generation": rb.generation ?? "", "data-group": state.selected,
    style: { left: x0 + "px", width: Math.max(x2 - x0, rb.joinEnd != null ? 6 : 3) + "px" },
  });
  b.append(el("div", { class: "seg seg-join", style: { width: Math.max(x1 - x0, 3) + "px" } }));
  if (rb.joinEnd != null) b.append(el("div", { class: "seg seg-sync", style: { flex: "1", minWidth: "3px" } }));
  b.dataset.tip = describeRebalance(rb, now);
  return b;
}

function renderTimeline() {
  const box = document.getElementById("timeline");
  const events = state.events.get(state.selected) || [];
  const { rebalances, marks } = rebalancesOf(events);
  const rbs = rebalances.slice(-MAX_REBALANCES_SHOWN);
  if (rbs.length === 0) {
    box.replaceChildren(el("p", { class: "muted", style: { padding: "8px" } }, "No rebalance seen yet for this group."));
    return;
  }
  const now = Date.now();
  const avail = Math.max(box.clientWidth - 200, 300);
  const { toX, width } = scaleFor(rbs, now, avail);
  const first = rbs[0].start;

  // Lanes: the group, then every member seen in these rebalances or marks.
  const lanes = [];
  const seen = new Map();
  const addLane = (id, info) => {
    if (!seen.has(id)) { seen.set(id, info || { member_id: id }); lanes.push(id); }
    else if (info && info.client_id && !seen.get(id).client_id) seen.set(id, info);
  };
  for (const rb of rbs) for (const m of rb.memberInfo || []) addLane(m.member_id, m);
  for (const mk of marks) if (mk.t >= first - 1000) addLane(mk.member.member_id, mk.member);

  const rows = [];
  const axis = el("div", { class: "tl-row" }, el("div", { class: "tl-label muted" }, "time"));
  const axisTrack = el("div", { class: "tl-track axis", style: { width: width + "px" } });
  let lastLabel = -Infinity;
  for (const rb of rbs) {
    const x = toX(rb.start);
    if (x - lastLabel < 64) continue; // keep labels from overlapping
    lastLabel = x;
    axisTrack.append(el("span", { style: { left: x + "px" } }, fmtTime(rb.start).slice(0, 8)));
  }
  axis.append(axisTrack);
  rows.push(axis);

  const groupTrack = el("div", { class: "tl-track", style: { width: width + "px" } });
  let prevEnd = null;
  for (const rb of rbs) {
    if (prevEnd != null && rb.start - prevEnd > 1000) {
      groupTrack.append(el("span", { class: "gap", style: { left: ((toX(prevEnd) + toX(rb.start)) / 2) + "px" } }, "⋯ " + fmtDur(rb.start - prevEnd)));
    }
    groupTrack.append(bar(rb, now, toX, "group"));
    prevEnd = rb.end ?? now;
  }
  rows.push(el("div", { class: "tl-row group-lane" }, el("div", { class: "tl-label" }, "group " + state.selected), groupTrack));

  for (const id of lanes) {
    const info = seen.get(id);
    const track = el("div", { class: "tl-track", style: { width: width + "px" } });
    for (const rb of rbs) if (rb.members.includes(id)) track.append(bar(rb, now, toX, "member"));
    for (const mk of marks) {
      if (mk.member.member_id !== id || mk.t < first - 1000) continue;
      const m = el("div", { class: "mark " + mk.kind, "data-kind": mk.kind, style: { left: toX(mk.t) + "px" } });
      m.dataset.tip = mk.kind.replace("_", " ") + " at " + fmtTime(mk.t) + (mk.cause ? " (" + mk.cause + ")" : "") +
        "\n" + id + (mk.member.client_id ? "\nclient " + mk.member.client_id : "") + (mk.member.client_host ? " @ " + mk.member.client_host : "");
      track.append(m);
    }
    const label = el("div", { class: "tl-label mono", title: id }, (info.client_id ? info.client_id + " · " : "") + id);
    rows.push(el("div", { class: "tl-row", "data-lane": id }, label, track));
  }
  const atEnd = box.scrollLeft + box.clientWidth >= box.scrollWidth - 4;
  box.replaceChildren(...rows);
  if (atEnd) box.scrollLeft = box.scrollWidth;
}

function renderEvents() {
  const ol = document.getElementById("events");
  const list = state.recent.filter(e => !state.selected || e.group === state.selected).slice(0, 100);
  ol.replaceChildren(...list.map(e => el("li", {},
    el("span", { class: "muted" }, fmtTime(e.time) + " "),
    el("span", { class: "k" }, e.kind),
    " gen " + e.generation,
    e.member ? " " + e.member.member_id + (e.member.client_id ? " (" + e.member.client_id + ")" : "") : "",
    e.cause ? " · " + e.cause : "")));
}

// ---- fleet -----------------------------------------------------------------

// Owner colours, by the member's place in the fleet's member list.
const OWNER_COLORS = ["#2563eb", "#059669", "#d97706", "#7c3aed", "#db2777", "#0891b2", "#65a30d", "#dc2626", "#4f46e5", "#0d9488"];

let fleetReq = 0;

// refreshFleet reads /api/fleet; 404 means this kproxy is not in a fleet.
async function refreshFleet() {
  const mine = ++fleetReq;
  let status = 0, f = null, err = "";
  try {
    const r = await fetch("api/fleet", { cache: "no-store" });
    status = r.status;
    if (r.ok) f = await r.json();
    else err = (await r.text()).trim();
  } catch (e) {
    err = String(e.message || e);
  }
  if (mine !== fleetReq) return;
  renderFleet(status, f, err);
}

function renderFleet(status, f, err) {
  const title = document.getElementById("fleet-title");
  const facts = document.getElementById("fleet-facts");
  const note = document.getElementById("fleet-note");
  const body = document.getElementById("fleet-body");
  if (!f) {
    title.textContent = "Fleet";
    facts.replaceChildren();
    body.hidden = true;
    note.className = "notice";
    note.dataset.state = status === 404 ? "not-distributed" : "error";
    note.textContent = status === 404
      ? "Groups are not distributed: this kproxy is not in a fleet (it runs with --groups local or --groups forward), so no other kproxy shares its groups. kproxy serve --groups distributed makes kproxies in front of one cluster share the groups topic's partitions."
      : "Fleet status unavailable" + (status ? " (" + status + ")" : "") + (err ? ": " + err : "");
    return;
  }
  const m = f.member || {};
  const table = m.table || [];
  const members = f.members || [];
  const serving = new Set(f.serving || []);
  const owned = new Set(m.owned || []);
  const color = new Map(members.map((x, i) => [x.member_id || x.id, OWNER_COLORS[i % OWNER_COLORS.length]]));
  const colorOf = o => color.get(o.member_id) || "#9ca3af";
  const n = Math.max(f.partitions || 0, table.length);

  title.replaceChildren(el("span", {}, "Fleet ", el("span", { class: "mono" }, m.group || ""), " ",
    m.joining ? el("span", { class: "state PreparingRebalance" }, "rejoining") : null));
  const fact = (k, v, attrs) => el("div", attrs || {}, el("dt", {}, k), el("dd", {}, v === "" || v == null ? "—" : v));
  const leaseMs = (m.lease_remaining_ns || 0) / 1e6;
  const leader = members.find(x => x.leader);
  facts.replaceChildren(
    fact("kproxy", el("span", { class: "mono" }, f.id)),
    fact("role", m.owner === false ? "relay (owns nothing)" : "owner"),
    fact("leads the fleet", m.leader ? "yes" : "no" + (leader ? " (" + (leader.id || leader.member_id) + ")" : ""), { "data-fact": "leader" }),
    fact("fleet generation", m.generation, { "data-fact": "generation" }),
    fact("lease", f.lease_valid ? fmtDur(leaseMs) + " left" : el("span", { class: "badge bad" }, "expired"), { "data-fact": "lease" }),
    fact("serving", serving.size + " of " + n + " partitions", { "data-fact": "serving" }),
    fact("ownership moves", f.ownership_moves, { "data-fact": "moves" }),
    fact("fenced", f.fenced, { "data-fact": "fenced" }),
    fact("gained / revoked / lost", [m.gained, m.revoked, m.lost].map(x => x ?? 0).join(" / ")),
    fact("peer", el("span", { class: "mono" }, f.peer)));
  note.className = "muted";
  note.dataset.state = "ok";
  note.textContent = "";
  body.hidden = false;

  // One row per partition: who owns it, and whether it is served here.
  const rows = [];
  const cells = [];
  for (let p = 0; p < n; p++) {
    const o = table[p] || {};
    const here = serving.has(p);
    const claiming = !here && owned.has(p);
    const cls = here ? "here" : claiming ? "claiming" : o.member_id ? "" : "none";
    const badge = here ? el("span", { class: "badge here" }, "served here")
      : claiming ? el("span", { class: "badge claiming", title: "assigned to this kproxy, which is still claiming it (fencing the previous owner, loading its groups)" }, "not served yet")
      : o.member_id ? null : el("span", { class: "badge" }, "no owner");
    rows.push(el("tr", { class: cls, "data-partition": p, "data-owner": o.id || "", "data-serving": here ? "true" : "false" },
      el("td", { class: "num" }, p),
      el("td", { class: "mono" }, o.member_id ? el("span", { class: "swatch", style: { background: colorOf(o) } }) : null, o.id || "—"),
      el("td", { class: "mono" }, o.peer || ""),
      el("td", { class: "num" }, o.member_id ? o.generation : ""),
      el("td", {}, badge)));
    const cell = el("div", { class: "pcell " + cls, "data-partition": p, style: o.member_id ? { background: colorOf(o) } : {} }, p);
    cell.dataset.tip = "partition " + p + (o.member_id ? "\nowner " + o.id + "\npeer " + (o.peer || "?") + "\nsince generation " + o.generation : "\nno owner (in transition)") +
      (here ? "\nserved here" : claiming ? "\nassigned here, not served yet (claiming)" : "");
    cells.push(cell);
  }
  document.querySelector("#fleet-partitions tbody").replaceChildren(...rows);
  document.getElementById("fleet-map").replaceChildren(...cells);

  document.querySelector("#fleet-members tbody").replaceChildren(...members.map(x => el("tr", { "data-member": x.member_id, class: x.self ? "self" : "" },
    el("td", { class: "mono" }, el("span", { class: "swatch", style: { background: color.get(x.member_id || x.id) } }), x.id || "?",
      x.self ? el("span", { class: "badge self" }, "this kproxy") : null,
      x.leader ? el("span", { class: "badge leader" }, "leader") : null),
    el("td", { class: "mono ellip", title: x.member_id }, x.member_id || ""),
    el("td", { class: "mono" }, x.peer || ""),
    el("td", { class: "num" }, (x.owned || []).length),
    el("td", { class: "mono" }, (x.owned || []).join(",")))));
}

// ---- views -------------------------------------------------------------------

function viewFromURL() {
  return new URLSearchParams(location.search).get("view") === "fleet" ? "fleet" : "groups";
}

function showView(view, push) {
  state.view = view;
  document.getElementById("groups-view").hidden = view !== "groups";
  document.getElementById("fleet-view").hidden = view !== "fleet";
  for (const a of document.querySelectorAll("#tabs a")) a.setAttribute("aria-selected", String(a.dataset.view === view));
  if (push) {
    const q = view === "fleet" ? "?view=fleet" : location.pathname;
    history.replaceState(null, "", q + location.hash);
  }
  if (view === "fleet") refreshFleet();
  else scheduleRender();
}

function setupTabs() {
  for (const a of document.querySelectorAll("#tabs a")) {
    a.onclick = e => {
      e.preventDefault();
      showView(a.dataset.view, true);
    };
  }
  showView(viewFromURL(), false);
}

// Hover tooltips for bars and marks.
function setupTips() {
  const tip = document.getElementById("tip");
  document.addEventListener("mousemove", e => {
    const t = e.target.closest("[data-tip]");
    if (!t) { tip.hidden = true; return; }
    tip.textContent = t.dataset.tip;
    tip.hidden = false;
    tip.style.left = Math.min(e.clientX + 12, window.innerWidth - 390) + "px";
    tip.style.top = (e.clientY + 14) + "px";
  });
}

setupTips();
setupTabs();
refreshGroups();
connect();
setInterval(refreshGroups, 5000);
setInterval(() => { if (state.selected) refreshDetail(); }, 5000);
setInterval(() => { if (state.view === "fleet") refreshFleet(); }, 2000);
// Keep open rebalances growing.
setInterval(() => {
  const evs = state.events.get(state.selected) || [];
  const last = evs[evs.length - 1];
  if (last && (last.kind === "rebalance_started" || last.kind === "join_completed" || last.kind.startsWith("member_"))) scheduleRender();
}, 1000);
window.addEventListener("resize", scheduleRender);
