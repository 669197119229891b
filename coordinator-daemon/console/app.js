// The cotx coordinator's web console. It reads the daemon's JSON API with the credential
// pasted into the page and shows what that credential may read; nothing else holds data.
// Every value from the API goes into the page as text (textContent), never as markup.
"use strict";

(function () {
  const KEY = "cotx-console-token";
  const POLL_MS = 2000;
  let operator = false;      // the credential may force (found by an operator read)
  let shownGtid = null;      // the transaction whose timeline is open
  let lastRate = null;       // the previous /metrics sample: {t, counts}
  let timer = null;

  const $ = (sel) => document.querySelector(sel);

  // An element with text children (strings become text nodes, never HTML).
  function el(tag, props, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (k === "data") Object.assign(e.dataset, v);
      else e[k] = v;
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      e.append(c instanceof Node ? c : String(c));
    }
    return e;
  }

  function token() { return sessionStorage.getItem(KEY) || ""; }

  // One API call: {status, body} (body parsed when JSON). Network errors become status 0.
  async function api(method, path, body) {
    const headers = {};
    if (token()) headers["Authorization"] = "Bearer " + token();
    if (body !== undefined) headers["Content-Type"] = "application/json";
    try {
      const r = await fetch(path, {method, headers, body: body === undefined ? undefined : JSON.stringify(body),
                                   cache: "no-store", credentials: "omit"});
      const text = await r.text();
      let parsed = text;
      if ((r.headers.get("content-type") || "").startsWith("application/json")) {
        try { parsed = JSON.parse(text); } catch (e) { parsed = text; }
      }
      return {status: r.status, body: parsed};
    } catch (e) {
      return {status: 0, body: {error: {code: "unreachable", message: String(e)}}};
    }
  }

  // Why a call failed, in words for the section's status line.
  function refusal(r, needs) {
    if (r.status === 401) return "The daemon does not know this credential (401).";
    if (r.status === 403) return "Needs " + needs + " (this credential: 403 forbidden).";
    const err = r.body && r.body.error;
    return "Error " + r.status + (err ? ": " + err.code + ": " + err.message : "");
  }

  function status(section, text) {
    const p = $("#" + section + " .status");
    p.textContent = text || "";
    p.hidden = !text;
  }

  function fill(tbody, rows) {
    tbody.replaceChildren(...rows);
  }

  function ms(n) {
    if (n === null || n === undefined) return "–";
    const s = n / 1000;
    return s < 120 ? s.toFixed(1) + " s" : (s / 60).toFixed(1) + " min";
  }

  function at(unixMs) {
    return unixMs ? new Date(unixMs).toISOString().replace("T", " ").replace("Z", " UTC") : "–";
  }

  // --- the sections ----------------------------------------------------------------------

  async function loadNodes() {
    const r = await api("GET", "/v1/nodes");
    const tbody = $("#nodes tbody");
    if (r.status !== 200) { status("nodes", refusal(r, "the operator credential")); fill(tbody, []); return; }
    status("nodes", r.body.lease_valid ? "" : "This daemon's lease is not confirmed: it acts on nothing until it is renewed.");
    $("#node-id").textContent = "· node " + r.body.node_id;
    fill(tbody, r.body.nodes.map((n) => el("tr", {className: n.expires_in_ms < 0 ? "bad" : ""},
      el("td", {}, n.node), el("td", {}, n.holder || "(released)"), el("td", {}, n.url),
      el("td", {}, n.expires_in_ms < 0 ? "expired " + ms(-n.expires_in_ms) + " ago" : ms(n.expires_in_ms)),
      el("td", {}, n.mine ? (n.node === r.body.node_id ? "own node" : "taken over") : ""))));
  }

  async function loadResources() {
    const tbody = $("#resources tbody");
    const health = (up) => up === true ? "up" : up === false ? "down" : "not contacted yet";
    const r = await api("GET", "/v1/resources");
    if (r.status === 200) {
      status("resources", "");
      fill(tbody, r.body.resources.map((x) => el("tr", {className: x.up === false ? "bad" : ""},
        el("td", {}, x.name), el("td", {}, x.kind + (x.decisions ? " (decisions)" : "")),
        el("td", {className: "health"}, health(x.up)), el("td", {}, x.prepared_branches))));
      return;
    }
    // Without the operator role: the health every caller may read (/healthz).
    const h = await api("GET", "/healthz");
    if (h.status !== 200) { status("resources", refusal(h, "nothing")); fill(tbody, []); return; }
    $("#node-id").textContent = "· node " + h.body.node_id;
    status("resources", r.status === 403 ? "Health only: kinds and prepared branches need the operator credential."
                                         : "Health only. " + refusal(r, "the operator credential"));
    fill(tbody, Object.entries(h.body.resources).map(([name, up]) => el("tr", {className: up ? "" : "bad"},
      el("td", {}, name), el("td", {}, "–"), el("td", {className: "health"}, health(up)), el("td", {}, "–"))));
  }

  // The decision rate: the change of cotx_transactions_total between two polls.
  async function loadRate() {
    const r = await api("GET", "/metrics");
    if (r.status !== 200) { status("rate", refusal(r, "the metrics or operator credential")); return; }
    status("rate", "");
    const counts = {};
    for (const line of String(r.body).split("\n")) {
      const m = /^cotx_transactions_total\{outcome="([a-z_]+)"\} ([0-9.e+]+)$/.exec(line);
      if (m) counts[m[1]] = Number(m[2]);
    }
    const now = performance.now();
    const total = Object.values(counts).reduce((a, b) => a + b, 0);
    $("#rate-totals").textContent = Object.entries(counts).map(([k, v]) => k + " " + v).join(", ");
    if (lastRate) {
      const dt = (now - lastRate.t) / 1000;
      const per = (k) => ((counts[k] || 0) - (lastRate.counts[k] || 0)) / dt;
      const all = (total - lastRate.total) / dt;
      $("#rate-value").textContent = all.toFixed(2);
      $("#rate-detail").textContent = "(commit " + per("commit").toFixed(2) + ", abort " + per("abort").toFixed(2) +
        ", one-phase " + per("one_phase").toFixed(2) + ", over the last " + dt.toFixed(1) + " s)";
    } else {
      $("#rate-detail").textContent = "(measuring: needs two polls)";
    }
    lastRate = {t: now, counts, total};
  }

  function branchText(b) {
    let s = b.resource + "/" + b.branch_id + " " + (b.state || "?");
    // What the branch blocks, as the resource reports it (PostgreSQL: locks_held,
    // sessions_waiting_on_prepared; MariaDB: lock_waits_on_resource; or an error).
    const k = b.blocking;
    if (k && typeof k === "object") s += " (" + Object.entries(k).map(([n, v]) => n.replace(/_/g, " ") + " " + v).join(", ") + ")";
    return s;
  }

  async function loadInDoubt() {
    const r = await api("GET", "/v1/in-doubt");
    const tbody = $("#in-doubt tbody");
    const qbody = $("#quarantined tbody");
    if (r.status !== 200) { status("in-doubt", refusal(r, "the operator credential")); fill(tbody, []); fill(qbody, []); return r.status; }
    status("in-doubt", r.body.transactions.length ? "" : "None in doubt.");
    fill(tbody, r.body.transactions.map((t) => el("tr", {className: "in-doubt-row", data: {gtid: t.gtid}},
      el("td", {className: "gtid"}, t.gtid), el("td", {className: "age"}, ms(t.age_ms)), el("td", {}, t.state),
      el("td", {}, el("ul", {}, ...t.branches.map((b) => el("li", {}, branchText(b))))),
      el("td", {}, el("button", {type: "button", className: "open-timeline", onclick: () => showTx(t.gtid)}, "Timeline")))));
    fill(qbody, (r.body.quarantined || []).map((q) => el("tr", {}, el("td", {}, q.gtid), el("td", {}, q.problem))));
    return 200;
  }

  async function loadIncidents() {
    const r = await api("GET", "/v1/incidents");
    const tbody = $("#incidents tbody");
    if (r.status !== 200) { status("incidents", refusal(r, "the operator credential")); fill(tbody, []); return; }
    status("incidents", r.body.incidents.length ? "" : "No incidents.");
    fill(tbody, r.body.incidents.map((i) => el("tr", {},
      el("td", {}, at(i.at_unix_ms)), el("td", {}, i.gtid), el("td", {}, i.branch_id), el("td", {}, i.resource), el("td", {}, i.message))));
  }

  async function loadWaits() {
    const r = await api("GET", "/v1/waits");
    const tbody = $("#waits tbody");
    const bbody = $("#broken tbody");
    if (r.status !== 200) { status("waits", refusal(r, "the operator credential")); fill(tbody, []); fill(bbody, []); return; }
    $("#waits-at").textContent = at(r.body.checked_at_unix_ms);
    status("waits", r.body.waits.length ? "" : "No global transaction waits for a lock.");
    fill(tbody, r.body.waits.map((w) => el("tr", {className: "wait-row"},
      el("td", {}, w.waiter), el("td", {}, w.blocker), el("td", {}, w.resource), el("td", {}, w.on))));
    fill(bbody, r.body.broken.map((b) => el("tr", {},
      el("td", {}, at(b.at_unix_ms)), el("td", {}, b.victim), el("td", {}, el("ul", {}, ...b.waits.map((w) => el("li", {}, w)))))));
  }

  async function loadAudit() {
    const r = await api("GET", "/v1/audit");
    const tbody = $("#audit tbody");
    if (r.status !== 200) { status("audit", refusal(r, "the operator credential")); fill(tbody, []); return []; }
    status("audit", r.body.audit.length ? "" : "No forced outcomes.");
    const rows = r.body.audit.slice().sort((a, b) => b.at_unix_ms - a.at_unix_ms);
    fill(tbody, rows.slice(0, 50).map((a) => el("tr", {},
      el("td", {}, at(a.at_unix_ms)), el("td", {}, a.gtid), el("td", {}, a.outcome), el("td", {}, a.operator),
      el("td", {}, a.reason), el("td", {}, a.result))));
    return r.body.audit;
  }

  // --- one transaction: its state, branches and what happened to it, oldest first --------

  async function showTx(gtid) {
    shownGtid = gtid;
    $("#gtid").value = gtid;
    $("#force-result").textContent = "";
    await loadTx();
  }

  async function loadTx() {
    if (!shownGtid) return;
    const gtid = shownGtid;
    const r = await api("GET", "/v1/transactions/" + encodeURIComponent(gtid));
    if (gtid !== shownGtid) return;  // another one was opened meanwhile
    if (r.status !== 200) {
      const err = r.body && r.body.error;
      status("timeline", r.status === 404 || r.status === 421 || r.status === 410
        ? gtid + ": " + (err ? err.message : r.status) + (err && err.owner_url ? " (owner: " + err.owner_url + ")" : "")
        : refusal(r, "a client or operator credential"));
      $("#tx").hidden = true;
      return;
    }
    status("timeline", "");
    const t = r.body;
    $("#tx-state").textContent = t.state;
    $("#tx-decision").textContent = t.decision || "none yet";
    $("#tx-reason").textContent = t.abort_reason ? "(" + t.abort_reason + ")" : "";
    const events = [];
    if (t.created_unix_ms) events.push([t.created_unix_ms, "begun" + (t.recovered ? " (recovered from the decision store)" : "")]);
    if (t.decided_unix_ms) events.push([t.decided_unix_ms, "decided " + t.decision]);
    if (t.from_store) events.push([0, "answered from the decision store (recorded by node " + t.node + ")"]);
    if (operator) {
      // What operators and the daemon did to it: forced outcomes and incidents.
      const [audit, inc] = await Promise.all([api("GET", "/v1/audit"), api("GET", "/v1/incidents")]);
      for (const a of (audit.status === 200 ? audit.body.audit : []).filter((a) => a.gtid === gtid)) {
        events.push([a.at_unix_ms, "operator " + a.operator + " forced " + a.outcome + " (" + a.reason + "): " + a.result]);
      }
      for (const i of (inc.status === 200 ? inc.body.incidents : []).filter((i) => i.gtid === gtid)) {
        events.push([i.at_unix_ms, "incident on " + i.resource + "/" + i.branch_id + ": " + i.message]);
      }
    }
    if (t.age_ms !== undefined && t.age_ms !== null) events.push([Date.now(), "now: " + ms(t.age_ms) + " old, " + t.state]);
    events.sort((a, b) => a[0] - b[0]);
    fill($("#tx-events"), events.map(([when, what]) => el("li", {className: "event"}, el("time", {}, when ? at(when) : ""), " ", what)));
    fill($("#tx-branches tbody"), (t.branches || []).map((b) => el("tr", {className: "branch"},
      el("td", {}, b.branch_id), el("td", {}, b.resource), el("td", {}, b.kind || "–"), el("td", {className: "branch-state"}, b.state || "–"),
      el("td", {}, b.outcome || "–"), el("td", {}, b.finished_by || "–"), el("td", {}, b.attempts === undefined ? "–" : b.attempts),
      el("td", {}, b.note || ""))));
    // Only a credential that passed an operator read sees the buttons; the daemon checks
    // the role again on the force call itself.
    $("#force").hidden = !operator;
    $("#tx").hidden = false;
  }

  async function force(outcome) {
    const reason = $("#force-reason").value.trim();
    const who = $("#force-operator").value.trim();
    const out = $("#force-result");
    if (!reason || !who) { out.textContent = "Name the operator and give a reason first."; return; }
    const r = await api("POST", "/v1/admin/force", {gtid: shownGtid, outcome, operator: who, reason, confirm: true});
    if (r.status === 200) {
      out.textContent = "Forced " + outcome + ": " + r.body.decision + (r.body.note ? " (" + r.body.note + ")" : "");
      out.className = "ok";
    } else {
      out.textContent = "Refused: " + refusal(r, "the operator credential");
      out.className = "bad";
    }
    await refresh();
  }

  // --- the credential and the refresh loop -----------------------------------------------

  async function refresh() {
    if (!token()) return;
    const doubt = await loadInDoubt();
    const wasOperator = operator;
    operator = doubt === 200;
    if (doubt === 401) {
      $("#whoami").textContent = "The daemon does not know this credential.";
    } else {
      $("#whoami").textContent = operator
        ? "Operator credential: everything is shown, and outcomes may be forced."
        : "Read-only credential: what it may read is shown; forcing needs the operator credential.";
    }
    document.body.classList.toggle("operator", operator);
    if (operator !== wasOperator) $("#force").hidden = !operator;
    await Promise.all([loadNodes(), loadResources(), loadRate(), loadWaits(), loadIncidents(), loadAudit(), loadTx()]);
    document.body.dataset.refreshed = String(Number(document.body.dataset.refreshed || 0) + 1);
  }

  function start() {
    if (timer) clearInterval(timer);
    lastRate = null;
    refresh();
    timer = setInterval(refresh, POLL_MS);
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("#credential").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const v = $("#token").value.trim();
      $("#token").value = "";
      if (!v) return;
      sessionStorage.setItem(KEY, v);
      operator = false;
      start();
    });
    $("#forget").addEventListener("click", () => {
      sessionStorage.removeItem(KEY);
      location.reload();
    });
    $("#lookup").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const g = $("#gtid").value.trim();
      if (g) showTx(g);
    });
    for (const b of document.querySelectorAll("#force button")) {
      b.addEventListener("click", () => force(b.dataset.outcome));
    }
    for (const s of document.querySelectorAll(".status")) s.hidden = true;
    if (token()) start();
  });
})();
