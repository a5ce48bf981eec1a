// The owner console (docs/DESIGN.md, "Owner console").
//
// Rules this file keeps, each on purpose:
// - The owner token lives in one variable of this closure. It is never written to localStorage,
//   sessionStorage, a cookie, IndexedDB, the URL or the console, so a reload forgets it.
// - It leaves the page only in the Authorization header of fetch calls to this origin (CSP connect-src 'self').
// - Every text that comes from the server (notes, summaries, labels, names, receipts) is put into the page as
//   a text node (textContent), never as HTML, and bidi controls in it are shown as visible marks, so a note
//   can neither run script nor reorder what the owner reads.
"use strict";
(() => {
  let token = null;  // the owner token: page memory only
  let memories = [];  // the last GET /memories answer
  let pendingErase = null;  // what the last dry run would erase

  const $ = (id) => document.getElementById(id);
  const SECURE = window.isSecureContext &&
    (location.protocol === "https:" || ["127.0.0.1", "localhost", "[::1]", "::1"].includes(location.hostname));

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message || `The server answered ${status}.`);
      this.status = status;
      this.code = code || "";
    }
  }

  function idempotencyKey() {
    if (crypto.randomUUID) return crypto.randomUUID();
    const b = crypto.getRandomValues(new Uint8Array(16));
    return Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
  }

  async function api(method, path, body, key) {
    const headers = { "Accept": "application/json" };
    if (token) headers["Authorization"] = "Bearer " + token;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    if (key) headers["Idempotency-Key"] = key;
    const init = { method, headers, credentials: "omit", cache: "no-store", referrerPolicy: "no-referrer",
      redirect: "error" };
    if (body !== undefined) init.body = JSON.stringify(body);
    await slot();
    try {
      for (let attempt = 0; ; attempt++) {
        let answer;
        try {
          answer = await fetch(path, init);
        } catch (e) {
          throw new ApiError(0, "network", "The server could not be reached; check that it runs, then try again.");
        }
        let data = null;
        try { data = await answer.json(); } catch (e) { data = null; }
        if (answer.status === 429 && attempt < BUSY_RETRIES) {
          // Refused before it ran (the server is busy with this identity): safe to send again, as asked.
          const wait = Math.min(BUSY_WAIT_MAX_S, Math.max(0.1, Number(answer.headers.get("Retry-After")) || 1));
          await new Promise((done) => setTimeout(done, wait * 1000));
          continue;
        }
        if (!answer.ok) throw new ApiError(answer.status, data && data.error, data && data.message);
        return data;
      }
    } finally {
      release();
    }
  }

  // The server serves one identity a few requests at a time and answers 429 past that; the console keeps
  // at most IN_FLIGHT calls open (a page load asks for every memory's config at once) and sends a 429 again
  // after its Retry-After, up to BUSY_RETRIES times, before it shows it.
  const IN_FLIGHT = 2;
  const BUSY_RETRIES = 4;
  const BUSY_WAIT_MAX_S = 5;
  let running = 0;
  const waiting = [];

  function slot() {
    if (running < IN_FLIGHT) {
      running++;
      return Promise.resolve();
    }
    return new Promise((take) => waiting.push(take));
  }

  function release() {
    const next = waiting.shift();
    if (next) next(); else running--;  // a waiting call takes the slot over
  }

  const memoryPath = (name, route) => `/m/${encodeURIComponent(name)}${route}`;

  // ------------------------------------------------------------------ text, safely

  const BIDI = /[\u061C\u200E\u200F\u202A-\u202E\u2066-\u2069]/g;

  function visible(text) {
    return String(text).replace(BIDI, (c) => `[U+${c.codePointAt(0).toString(16).toUpperCase().padStart(4, "0")}]`);
  }

  function el(tag, text, cls) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = visible(text);
    if (cls) node.className = cls;
    return node;
  }

  function button(text, onClick, cls) {
    const b = el("button", text, cls);
    b.type = "button";
    b.addEventListener("click", onClick);
    return b;
  }

  function row(cells) {
    const tr = document.createElement("tr");
    for (const cell of cells) {
      const td = document.createElement("td");
      if (cell instanceof Node) td.append(cell); else td.textContent = visible(cell === null || cell === undefined ? "—" : cell);
      tr.append(td);
    }
    return tr;
  }

  function fill(tableId, rows) {
    const body = $(tableId).tBodies[0];
    body.replaceChildren(...rows);
  }

  function say(text, isError) {
    const s = $("status");
    s.textContent = visible(text);
    s.className = isError ? "status alert" : "status";
  }

  function failed(e) {
    say(e instanceof ApiError ? `${e.message}${e.code ? ` (${e.code})` : ""}` : String(e), true);
  }

  // A count of a log's lines: a memory is a named log, and each line of it a note (the reference's glossary).
  function notes(n) { return n === 1 ? "1 note" : `${n} notes`; }

  function bytes(n) {
    if (n === null || n === undefined) return "—";
    const units = ["B", "KB", "MB", "GB", "TB"];
    let i = 0;
    let v = n;
    while (v >= 1000 && i < units.length - 1) { v /= 1000; i += 1; }
    return `${i ? v.toFixed(1) : v} ${units[i]}`;
  }

  // ------------------------------------------------------------------ dialogs

  function confirmAction(text, yes) {
    return new Promise((resolve) => {
      const d = $("confirm");
      $("confirm-text").textContent = visible(text);
      $("confirm-yes").textContent = yes || "Confirm";
      d.addEventListener("close", () => resolve(d.returnValue === "ok"), { once: true });
      d.returnValue = "";
      d.showModal();
      $("confirm-no").focus();
    });
  }

  function showSecret(title, warning, secret, block) {
    return new Promise((resolve) => {
      const d = $("secret");
      $("secret-title").textContent = title;
      $("secret-warning").textContent = warning;
      $("secret-token").value = secret;
      $("secret-block").value = block || "";
      $("secret-block-wrap").hidden = !block;
      d.addEventListener("close", () => {
        // The dialog's fields forget the secret once it is closed.
        $("secret-token").value = "";
        $("secret-block").value = "";
        resolve();
      }, { once: true });
      d.showModal();
      $("secret-token").select();
    });
  }

  async function copy(fieldId, what) {
    const field = $(fieldId);
    try {
      await navigator.clipboard.writeText(field.value);
      say(`${what} copied.`);
    } catch (e) {
      field.select();
      say(`Select and copy the ${what.toLowerCase()} by hand (Ctrl+C): the browser refused the clipboard.`, true);
    }
  }

  // ------------------------------------------------------------------ views

  function memoryNames() { return memories.map((m) => m.name); }

  function fillSelect(id, names, withAll) {
    const s = $(id);
    const keep = s.value;
    const options = [];
    if (withAll) { const o = el("option", "every memory"); o.value = ""; options.push(o); }
    for (const n of names) { const o = el("option", n); o.value = n; options.push(o); }
    s.replaceChildren(...options);
    if ([...s.options].some((o) => o.value === keep)) s.value = keep;
  }

  async function drawShape(svg, T, lines) {
    const answer = await api("POST", "/shape", { T, lines });
    const blocks = answer.blocks;
    const ns = "http://www.w3.org/2000/svg";
    const width = 240;
    const height = 28;
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    svg.setAttribute("width", String(width));
    svg.setAttribute("height", String(height));
    svg.setAttribute("data-blocks", String(blocks.length));
    svg.replaceChildren();
    const w = blocks.length ? width / Math.max(blocks.length, 1) : width;
    blocks.forEach(([first, last], k) => {
      const size = last - first + 1;
      const h = size === 1 ? 8 : Math.min(height, 8 + 20 * Math.log2(size) / 20);
      const r = document.createElementNS(ns, "rect");
      r.setAttribute("x", String(k * w));
      r.setAttribute("y", String(height - h));
      r.setAttribute("width", String(Math.max(w - 1, 0.5)));
      r.setAttribute("height", String(h));
      r.setAttribute("class", size === 1 ? "bar memory" : "bar summary");
      const t = document.createElementNS(ns, "title");
      t.textContent = size === 1 ? `#${first}` : `#${first}-${last}`;
      r.append(t);
      svg.append(r);
    });
  }

  async function loadMemories() {
    const answer = await api("GET", "/memories");
    memories = answer.memories;
    const rows = memories.map((m) => {
      const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
      svg.setAttribute("role", "img");
      svg.setAttribute("aria-label", `wake shape of memory ${m.name}: ${notes(m.T)}`);
      svg.setAttribute("data-memory", m.name);
      const actions = document.createElement("div");
      actions.className = "actions";
      actions.append(
        button("Read", () => readMemory(m.name).catch(failed)),
        button("Delete…", () => deleteMemory(m.name).catch(failed), "danger"),
      );
      const tr = row([m.name, m.T, bytes(m.bytes), m.created, m.last_write, m.grants, svg, actions]);
      tr.dataset.memory = m.name;
      return tr;
    });
    // A memory the server could not open is shown as damaged, with what to do, and can be deleted.
    for (const u of answer.unopened || []) {
      const actions = document.createElement("div");
      actions.className = "actions";
      actions.append(button("Delete…", () => deleteMemory(u.name).catch(failed), "danger"));
      const tr = row([u.name, el("span", `damaged (${u.error})`, "alert"), null, null, null, null,
        el("span", u.message), actions]);
      tr.dataset.memory = u.name;
      tr.dataset.damaged = u.error;
      rows.push(tr);
    }
    fill("memories", rows);
    for (const id of ["mint-memory", "erase-ids-memory", "fork-source"]) fillSelect(id, memoryNames(), false);
    fillSelect("erase-words-memory", memoryNames(), true);
    await Promise.all(memories.map(async (m) => {
      const svg = document.querySelector(`svg[data-memory="${CSS.escape(m.name)}"]`);
      let lines = 96;
      try {
        const config = await api("GET", memoryPath(m.name, "/config"));
        lines = config.sizes.WAKE_LINES;
      } catch (e) { /* the default budget draws a shape all the same */ }
      await drawShape(svg, m.T, lines);
    }));
  }

  async function loadGrants() {
    const answer = await api("GET", "/grants");
    fill("grants", answer.grants.map((g) => {
      const actions = document.createElement("div");
      actions.className = "actions";
      if (g.live && g.scope !== "owner") {
        actions.append(button("Revoke…", () => revoke(g).catch(failed), "danger"));
      } else if (g.you) {
        actions.append(el("span", "this page", "tag"));
      }
      const tr = row([g.id, g.memory || (g.scope === "owner" ? "every memory" : "main"), g.scope, g.label,
        g.created, g.expires, g.last_used, g.revoked || (g.expired ? "expired" : null), actions]);
      tr.dataset.grant = String(g.id);
      return tr;
    }));
  }

  async function loadAudit() {
    const answer = await api("GET", "/audit");
    fill("audit", answer.events.map((e) => row([e.memory, e.id, e.at, e.grant, e.event, JSON.stringify(e.detail)])));
    const trail = answer.trail || {};
    $("audit-chain").textContent = trail.intact === undefined ? "" :
      (trail.intact ? "The trail is whole: no event was removed or added by hand." :
        "The trail was edited: an event was removed or added outside the server (" +
        (trail.problem || "no detail") + ").");
    $("audit-chain").dataset.intact = String(trail.intact);
  }

  async function loadErasures() {
    const rows = [];
    for (const name of memoryNames()) {
      const answer = await api("GET", memoryPath(name, "/erasures"));
      for (const r of answer.erasures) {
        rows.push(row([name, r.receipt, r.at, r.ids.join(", "), r.erased.length, r.dropped]));
      }
    }
    fill("erasures", rows);
  }

  async function refresh() {
    await loadMemories();
    await Promise.all([loadGrants(), loadAudit(), loadErasures()]);
    const shown = $("reader").hidden ? null : $("reader-name").textContent;
    if (shown && memoryNames().includes(shown)) await readMemory(shown);
  }

  async function readMemory(name) {
    $("reader").hidden = false;
    $("reader-name").textContent = name;
    // The lines replace the old ones at once, never through an empty moment.
    const shown = [];
    try {
      const answer = await api("POST", memoryPath(name, "/wake"), {});
      for (const line of answer.lines) shown.push(el("span", line, "line"), document.createTextNode("\n"));
      if (!answer.lines.length) shown.push(el("span", "(empty)", "line"));
    } catch (e) {
      shown.push(el("span", e.message, "line"));
    }
    $("reader-lines").replaceChildren(...shown);
  }

  // ------------------------------------------------------------------ actions

  async function signIn(candidate) {
    token = candidate;
    try {
      await refresh();
    } catch (e) {
      token = null;
      throw e;
    }
    $("signin").hidden = true;
    $("app").hidden = false;
    $("signout").hidden = false;
    $("who").hidden = false;
    $("who").textContent = `identity ${candidate.split("_")[1] || ""}`;
    say("Opened.");
  }

  function signOut() {
    token = null;
    memories = [];
    $("app").hidden = true;
    $("signin").hidden = false;
    $("signout").hidden = true;
    $("who").hidden = true;
    for (const id of ["memories", "grants", "audit", "erasures"]) fill(id, []);
    $("reader-lines").replaceChildren();
    $("token").focus();
  }

  async function createMemory(name) {
    await api("POST", "/memories", { name }, idempotencyKey());
    say(`Memory ${name} created.`);
    await refresh();
  }

  async function forkMemory(source, name, at) {
    const body = { name };
    if (at !== "") body.at = Number(at);
    const answer = await api("POST", `/memories/${encodeURIComponent(source)}/fork`, body, idempotencyKey());
    say(`Memory ${name} forked from memory ${source} with its first ${notes(answer.at)}.`);
    await refresh();
  }

  async function deleteMemory(name) {
    if (!await confirmAction(`Delete memory ${name} for good? Its keys are destroyed and its grants end; ` +
      "no token opens it again.", `Delete ${name}`)) return;
    const answer = await api("DELETE", `/memories/${encodeURIComponent(name)}`, undefined, idempotencyKey());
    const held = answer.memories;
    say(`Memory ${name} deleted (its log held ${notes(held)}).`);
    await refresh();
  }

  async function mint(memory, scope, label, expires) {
    const body = { scope, memory, url: location.origin + (memory === "main" ? "" : memoryPath(memory, "")) };
    if (label) body.label = label;
    if (expires) body.expires = new Date(expires + "Z").toISOString().replace(/\.\d+Z$/, "Z");
    const answer = await api("POST", "/grants", body, idempotencyKey());
    await refresh();
    await showSecret(`New ${answer.scope} capability #${answer.id} for ${memory}`,
      "Copy the token now: it is shown this once and never stored. Paste the block into the agent's AGENTS.md " +
      "and give it the token as STASH_TOKEN.", answer.token, answer.prompt);
  }

  async function revoke(g) {
    const what = `#${g.id} (${g.scope}${g.memory ? ` on ${g.memory}` : ""}${g.label ? `, “${g.label}”` : ""})`;
    if (!await confirmAction(`Revoke grant ${what}? Its token stops working at once.`, `Revoke #${g.id}`)) return;
    await api("DELETE", `/grants/${g.id}`, undefined, idempotencyKey());
    say(`Grant #${g.id} revoked.`);
    await refresh();
  }

  async function rotate() {
    if (!await confirmAction("Rotate the owner token? You get a new owner token, shown once. Save it before " +
      "anything else: the old one stops working once the new one is used.", "Rotate")) return;
    const answer = await api("POST", "/rotate", {}, idempotencyKey());
    await showSecret("Your new owner token", "Save this token first, where you keep the old one (update " +
      `${answer.update || "STASH_TOKEN"} everywhere it is set). The old owner token stops working once this ` +
      "one is used; this page now uses it.", answer.token, null);
    token = answer.token;
    await refresh();
    say("The owner token was rotated; this page now uses the new one.");
  }

  function parseIds(text) {
    const parts = text.split(/[\s,]+/).filter(Boolean);
    if (!parts.length || parts.some((p) => !/^\d{1,15}$/.test(p))) return null;
    return [...new Set(parts.map(Number))].sort((a, b) => a - b);
  }

  function showPlan(text, lines, plan) {
    pendingErase = plan;
    say("");
    $("erase-receipt").hidden = true;
    $("erase-plan").hidden = false;
    $("erase-plan-text").textContent = visible(text);
    const pre = $("erase-plan-lines");
    pre.replaceChildren(...lines.flatMap((l) => [el("span", l, "line"), document.createTextNode("\n")]));
    $("erase-go").disabled = !plan;
    $("erase-go").focus();
  }

  async function dryRunIds(memory, text) {
    const ids = parseIds(text);
    if (!ids) { say("Give the ids as whole numbers separated by commas or spaces, like 3, 5, 8.", true); return; }
    // The lines themselves, read back by a regex over their ids (the first 50 of them), as text.
    const answer = await api("POST", memoryPath(memory, "/recall"), { q: `^#(${ids.slice(0, 50).join("|")}) ` });
    const shown = answer.matches;
    showPlan(`Erase ${notes(ids.length)} of memory ${memory}: ` +
      `${ids.map((i) => "#" + i).join(", ")}?`, shown, { kind: "ids", memory, ids });
  }

  async function dryRunWords(words, memory) {
    const body = { words, dry_run: true };
    if (memory) body.memories = [memory];
    const answer = await api("POST", "/memories/erase", body);
    const total = answer.total;
    // The lines that would go, as the server lists them (as many as fit one page), under each memory's count.
    const lines = [];
    let shown = 0;
    for (const m of answer.memories) {
      lines.push(`memory ${m.name}: ${notes(m.erased)}`);
      for (const line of m.lines || []) lines.push("  " + line);
      shown += (m.lines || []).length;
    }
    if (shown < total) lines.push(`… and ${total - shown} more not shown here (the first ${shown} are above).`);
    showPlan(total ? `Erase ${total} matching ${total === 1 ? "note" : "notes"}?` : "No note matches.",
      lines, total ? { kind: "words", body: { words, memories: body.memories } } : null);
  }

  async function erase() {
    const plan = pendingErase;
    if (!plan) return;
    let receipt;
    if (plan.kind === "ids") {
      receipt = await api("POST", memoryPath(plan.memory, "/erase"), { ids: plan.ids }, idempotencyKey());
    } else {
      const body = { words: plan.body.words };
      if (plan.body.memories) body.memories = plan.body.memories;
      receipt = await api("POST", "/memories/erase", body, idempotencyKey());
    }
    pendingErase = null;
    $("erase-plan").hidden = true;
    $("erase-receipt").hidden = false;
    $("erase-receipt-text").textContent = visible(JSON.stringify(receipt, null, 2));
    say("Erased. The receipt is below and under Erasure receipts.");
    await refresh();
  }

  // ------------------------------------------------------------------ wiring

  function on(id, event, handler) {
    $(id).addEventListener(event, (e) => {
      if (event === "submit") e.preventDefault();
      Promise.resolve().then(() => handler(e)).catch(failed);
    });
  }

  function start() {
    if (!SECURE) {
      $("insecure").hidden = false;
      $("signin").hidden = true;
      return;
    }
    on("signin-form", "submit", async () => {
      const field = $("token");
      const candidate = field.value.trim();
      field.value = "";
      $("signin-error").hidden = true;
      try {
        await signIn(candidate);
      } catch (e) {
        $("signin-error").hidden = false;
        $("signin-error").textContent = e instanceof ApiError && e.status === 401
          ? "That token opens nothing here: paste the owner token (stash1_…) of this server."
          : e instanceof ApiError && e.status === 403
            ? "That is not an owner token: the console needs the owner token, not a read, append or full one."
            : visible(e.message);
      }
    });
    on("signout", "click", signOut);
    on("create-form", "submit", () => createMemory($("create-name").value));
    on("fork-form", "submit", () => forkMemory($("fork-source").value, $("fork-name").value, $("fork-at").value));
    on("mint-form", "submit", () => mint($("mint-memory").value, $("mint-scope").value, $("mint-label").value.trim(),
      $("mint-expires").value));
    on("erase-ids-form", "submit", () => dryRunIds($("erase-ids-memory").value, $("erase-ids").value));
    on("erase-words-form", "submit", () => dryRunWords($("erase-words").value, $("erase-words-memory").value));
    on("erase-go", "click", erase);
    on("erase-cancel", "click", () => { pendingErase = null; $("erase-plan").hidden = true; });
    on("rotate", "click", rotate);
    on("secret-copy", "click", () => copy("secret-token", "Token"));
    on("secret-block-copy", "click", () => copy("secret-block", "Block"));
    $("token").focus();
  }

  document.addEventListener("DOMContentLoaded", start);
})();
