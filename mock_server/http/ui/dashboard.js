// whitney mock dashboard: polls GET /_mock/ui/state?since=N once a second with the API key
// kept in this tab's sessionStorage, merges what changed, and redraws. No libraries, no build.
"use strict";

(() => {
  const KEY_STORE = "whitney-mock-dashboard-key";
  const STATE_URL = "/_mock/ui/state";
  const POLL_MS = 1000;
  const KEEP_OPS = 2000; // operations kept per run in the page (the newest)
  const DRAW_ROWS = 150; // timeline rows drawn (the newest): the page must stay light to run
  const MAX_CHART_POINTS = 400; // a curve draws at most this many points (evenly spaced)

  const $ = (id) => document.getElementById(id);
  let key = sessionStorage.getItem(KEY_STORE);
  let model = emptyModel();
  let selected = null; // run_id picked by the user; null: follow the newest run
  let timer = null;
  let generation = 0; // bumps when the key changes, so a late answer for the old key is dropped

  function emptyModel() {
    return { cursor: 0, sessions: [], runs: new Map(), order: [], faults: [], now: 0,
             receivedAt: 0, lastOk: 0, polls: 0, signature: "" };
  }

  // -- key handling ---------------------------------------------------------------------------
  function showLogin(message) {
    $("app").hidden = true;
    $("forget").hidden = true;
    $("login").hidden = false;
    $("whoami").textContent = "";
    $("key-error").textContent = message || "";
    setStatus("not connected", false);
    $("key-input").focus();
  }

  function start(newKey) {
    key = newKey;
    sessionStorage.setItem(KEY_STORE, key);
    model = emptyModel();
    selected = null;
    generation += 1;
    $("login").hidden = true;
    $("app").hidden = false;
    $("forget").hidden = false;
    $("whoami").textContent = "key " + mask(key);
    $("detail").removeAttribute("data-run-id");
    setHTML($("sessions"), '<p class="empty">loading…</p>');
    setHTML($("detail"), '<p class="empty">No run yet: start training against this mock.</p>');
    setHTML($("faults"), "");
    schedule(0);
  }

  function forget(message) {
    sessionStorage.removeItem(KEY_STORE);
    key = null;
    generation += 1;
    clearTimeout(timer);
    model = emptyModel();
    $("key-input").value = "";
    showLogin(message);
  }

  function mask(k) {
    return k.length > 8 ? k.slice(0, 4) + "…" : k.slice(0, 1) + "…";
  }

  // -- polling ----------------------------------------------------------------------------------
  function schedule(delay) {
    clearTimeout(timer);
    timer = setTimeout(poll, delay);
  }

  async function poll() {
    if (!key) return;
    const mine = generation;
    try {
      const response = await fetch(`${STATE_URL}?since=${model.cursor}`, {
        headers: { Authorization: `Bearer ${key}` }, cache: "no-store",
      });
      if (mine !== generation) return;
      if (response.status === 401) {
        forget("The mock does not accept this key.");
        return;
      }
      if (!response.ok) {
        setStatus(`the mock answered ${response.status}; retrying`, true);
      } else {
        const data = await response.json();
        if (mine !== generation) return;
        if (merge(data)) render(); else tick(); // redraw only when something changed
        setStatus("live", false);
      }
    } catch (error) {
      if (mine !== generation) return;
      setStatus("mock unreachable; retrying", true);
    }
    if (mine === generation) schedule(POLL_MS);
  }

  function setStatus(text, bad) {
    const el = $("status");
    setText(el, text);
    el.classList.toggle("bad", !!bad);
    el.classList.toggle("live", !bad && text === "live");
  }

  // Merges an answer; true when the page must be redrawn.
  function merge(data) {
    const signature = JSON.stringify([data.sessions, data.faults, data.runs.map((r) => [
      r.run_id, r.state, r.step, r.next_seq, r.operations, r.versions.length,
      r.held.map((h) => h.seq)])]);
    let changed = signature !== model.signature || model.polls === 0;
    model.signature = signature;
    for (const r of data.runs) {
      changed ||= r.ops.length + r.ended_holds.length + r.points.length + r.uses.length > 0;
    }
    model.cursor = data.cursor;
    model.now = data.now;
    model.receivedAt = performance.now();
    model.polls += 1;
    model.sessions = data.sessions;
    model.faults = data.faults || [];
    const present = new Set();
    for (const info of data.runs) {
      present.add(info.run_id);
      let run = model.runs.get(info.run_id);
      if (!run || run.info.created_at !== info.created_at) { // new, or re-created after a reset
        run = { ops: new Map(), ended: new Map(), points: new Map(), uses: new Map(),
                versions: new Map(), omitted: 0 };
        model.runs.set(info.run_id, run);
      }
      run.info = info;
      run.omitted += info.ops_omitted;
      for (const op of info.ops) run.ops.set(op.seq, op);
      for (const hold of info.ended_holds) run.ended.set(hold.rev, hold);
      for (const point of info.points) run.points.set(point.seq, point);
      for (const use of info.uses) run.uses.set(use.seq, use);
      // versions: as listed now, plus those seen before (a closed session frees its weights,
      // the page remembers the step each was taken at) and those only known from their save
      const live = new Set(info.versions.map((v) => v.version));
      for (const v of info.versions) run.versions.set(v.version, { ...v, freed: false });
      for (const op of info.ops) {
        if (op.primitive === "save_weights_for_sampler" && op.status === "completed" &&
            !run.versions.has(op.version)) {
          run.versions.set(op.version, { version: op.version, step: op.step, created_at: null });
        }
      }
      for (const [n, v] of run.versions) v.freed = !live.has(n);
      if (run.ops.size > KEEP_OPS) {
        const seqs = [...run.ops.keys()].sort((a, b) => a - b);
        for (const seq of seqs.slice(0, seqs.length - KEEP_OPS)) run.ops.delete(seq);
        run.omitted += seqs.length - KEEP_OPS;
      }
    }
    for (const id of [...model.runs.keys()]) if (!present.has(id)) model.runs.delete(id);
    model.order = data.runs.map((r) => r.run_id);
    return changed;
  }

  // -- rendering --------------------------------------------------------------------------------
  const esc = (value) => String(value ?? "").replace(/[&<>"']/g, (c) => (
    { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));

  function fmtMs(ms) {
    if (ms === null || ms === undefined) return "";
    if (ms < 1) return ms.toFixed(2) + " ms";
    if (ms < 1000) return ms.toFixed(ms < 10 ? 1 : 0) + " ms";
    return (ms / 1000).toFixed(ms < 10000 ? 2 : 1) + " s";
  }

  function fmtNum(x) {
    if (x === null || x === undefined || Number.isNaN(x)) return "–";
    const a = Math.abs(x);
    if (a !== 0 && (a < 1e-3 || a >= 1e5)) return x.toExponential(2);
    return x.toPrecision(4).replace(/\.?0+$/, "");
  }

  function serverNow() {
    return model.now + (performance.now() - model.receivedAt) / 1000;
  }

  function ttlText(session) {
    if (session.expires_at === null) return "no TTL";
    if (session.state !== "open") return session.state;
    const left = session.expires_at - serverNow();
    if (left <= 0) return "expiring";
    const s = Math.floor(left);
    return `${Math.floor(s / 60)}:${String(s % 60).padStart(2, "0")} left`;
  }

  function shortId(id) {
    return id.length > 14 ? id.slice(0, 14) + "…" : id;
  }

  function badge(state) {
    return `<span class="badge st-${esc(state)}">${esc(state)}</span>`;
  }

  function currentRunId() {
    if (selected && model.runs.has(selected)) return selected;
    const runs = model.order.map((id) => model.runs.get(id));
    const active = runs.filter((r) => r.info.state === "active");
    const pick = (active.length ? active : runs).at(-1);
    return pick ? pick.info.run_id : null;
  }

  function render() {
    renderSessions();
    renderFaults();
    renderDetail();
    tick();
  }

  function renderSessions() {
    const current = currentRunId();
    if (!model.sessions.length) {
      setHTML($("sessions"), '<p class="empty">This key has no sessions yet.</p>');
      return;
    }
    const html = [...model.sessions].reverse().map((s) => {
      const meta = Object.entries(s.metadata || {}).map(([k, v]) =>
        `<span class="chip">${esc(k)}: ${esc(v)}</span>`).join("");
      const runs = s.run_ids.filter((id) => model.runs.has(id)).map((id) => {
        const r = model.runs.get(id).info;
        const held = r.held.length ? `<span class="badge st-held">${r.held.length} held</span>` : "";
        return `<li><a href="#" class="run-link${id === current ? " current" : ""}"
                   data-run-id="${esc(id)}">${esc(shortId(id))}</a> ${badge(r.state)}
                   <span class="kv">step <b>${r.step}</b></span>
                   <span class="kv">next seq <b>${r.next_seq}</b></span> ${held}</li>`;
      }).join("");
      return `<div class="session" data-session-id="${esc(s.session_id)}">
        <div class="session-head"><span class="mono" title="${esc(s.session_id)}">${esc(shortId(s.session_id))}</span>
          ${badge(s.state)} <span class="ttl" data-session-id="${esc(s.session_id)}"></span></div>
        ${meta ? `<div class="meta">${meta}</div>` : ""}
        <ul class="runs">${runs || '<li class="empty">no runs</li>'}</ul></div>`;
    }).join("");
    setHTML($("sessions"), html);
  }

  function renderFaults() {
    if (!model.faults.length) {
      setHTML($("faults"), '<p class="empty">none</p>');
      return;
    }
    const skip = new Set(["fault_id", "kind", "primitive", "run_id", "seed", "remaining", "seen",
                          "fired", "active", "count", "skip", "probability", "scope"]);
    const rows = model.faults.map((f) => {
      const opts = Object.entries(f).filter(([k]) => !skip.has(k))
        .map(([k, v]) => `${esc(k)}=${esc(typeof v === "object" ? JSON.stringify(v) : v)}`)
        .join(" ");
      const target = (f.primitive || "any call") + (f.run_id ? ` on ${shortId(f.run_id)}` : "");
      const scope = f.scope === "every tenant" ?
        '<br><span class="hint" title="armed for every key: its counters count every key\'s calls">all keys</span>' : "";
      return `<tr class="fault${f.active ? "" : " spent"}" data-fault-id="${esc(f.fault_id)}">
        <td><b>${esc(f.kind)}</b> ${esc(opts)}</td><td>${esc(target)}${scope}</td>
        <td class="num" title="fired / matching calls seen">${f.fired} / ${f.seen}</td>
        <td>${f.active ? (f.remaining === null ? "∞ left" : f.remaining + " left") : "spent"}</td></tr>`;
    }).join("");
    setHTML($("faults"), `<table class="faults"><thead><tr><th>fault</th><th>target</th>
      <th>fired</th><th></th></tr></thead><tbody>${rows}</tbody></table>`);
  }

  function produced(op) {
    if (op.status === "failed") return `<span class="err">${esc(op.error)}</span> ${esc(op.message || "")}`;
    const parts = [];
    if (op.primitive === "optim_step") parts.push(`step ${op.step}`,
      `grad ${fmtNum(op.grad_norm)}`, `update ${fmtNum(op.update_norm)}`);
    else if (op.primitive === "save_weights_for_sampler") parts.push(`version ${op.version} @ step ${op.step}`);
    else if (op.primitive === "sample") parts.push(`used version ${op.version} (step ${op.step})`,
      `${op.num_samples} samples`);
    else if (op.primitive === "logprobs") parts.push(`used version ${op.version} (step ${op.step})`);
    else if (op.loss !== undefined) parts.push(`loss ${fmtNum(op.loss)}`);
    else {
      if (op.checkpoint_id) parts.push(`checkpoint ${shortId(op.checkpoint_id)}`);
      if (op.export_id) parts.push(`export ${shortId(op.export_id)}`);
      if (op.step !== undefined) parts.push(`step ${op.step}`);
    }
    return esc(parts.join(" · "));
  }

  const HOLD_OUTCOMES = { seq_gap: ["gap", "gave up: seq_gap"],
                          run_cancelled: ["cancelled", "cancelled with the run"],
                          run_not_active: ["cancelled", "cancelled: run finished"] };

  // The newest DRAW_ROWS rows of a run's timeline, in seq order: [{key, html}].
  function timelineRows(run) {
    const rows = [];
    for (const op of run.ops.values()) rows.push({ seq: op.seq, order: 1, op });
    for (const hold of run.ended.values()) rows.push({ seq: hold.seq, order: 0, hold });
    for (const held of run.info.held) rows.push({ seq: held.seq, order: 2, held });
    rows.sort((a, b) => a.seq - b.seq || a.order - b.order);
    return rows.slice(-DRAW_ROWS).map((row) => {
      if (row.op) {
        const op = row.op;
        const status = op.status;
        const replay = op.replays ? `<span class="badge st-replayed">replayed ×${op.replays}</span>` : "";
        const heldText = op.held_ms !== null ? `<span class="was-held">held ${fmtMs(op.held_ms)}</span>` : "";
        return { key: `op:${op.seq}`, html: `<tr class="op st-${status}" data-key="op:${op.seq}"
                    data-seq="${op.seq}" data-status="${status}"
                    data-primitive="${esc(op.primitive)}" data-replays="${op.replays}"
                    data-held-ms="${op.held_ms ?? ""}">
          <td class="num">${op.seq}</td><td>${esc(op.primitive)}</td>
          <td>${badge(status)} ${replay}</td><td class="num">${fmtMs(op.duration_ms)}</td>
          <td>${heldText}</td><td class="produced">${produced(op)}</td></tr>` };
      }
      if (row.hold) {
        const hold = row.hold;
        const [status, text] = HOLD_OUTCOMES[hold.outcome] || ["failed", hold.outcome];
        return { key: `end:${hold.rev}`, html: `<tr class="op st-${status}" data-key="end:${hold.rev}"
                    data-seq="${hold.seq}" data-status="${status}"
                    data-primitive="${esc(hold.primitive)}" data-held-ms="${hold.held_ms}">
          <td class="num">${hold.seq}</td><td>${esc(hold.primitive)}</td>
          <td>${badge(status)}</td><td></td>
          <td><span class="was-held">held ${fmtMs(hold.held_ms)}</span></td>
          <td class="produced">${esc(text)} (409 ${esc(hold.outcome)}; no seq consumed)</td></tr>` };
      }
      const held = row.held;
      return { key: `held:${held.seq}`, html: `<tr class="op st-held" data-key="held:${held.seq}"
                  data-seq="${held.seq}" data-status="held" data-primitive="${esc(held.primitive)}">
        <td class="num">${held.seq}</td><td>${esc(held.primitive)}</td>
        <td>${badge("held")}</td><td></td>
        <td><span class="holding" data-held-base="${held.held_ms}">held ${fmtMs(held.held_ms)}</span></td>
        <td class="produced">waiting for seq ${run.info.next_seq} (a gap before it)</td></tr>` };
    });
  }

  // Brings tbody's rows to `rows` ([{key, html}]) touching only what changed: a redraw once
  // a second then costs the new rows, not the whole table.
  const drawn = new WeakMap(); // row element -> the html it was made from
  const template = document.createElement("template");
  function patchRows(tbody, rows) {
    const existing = new Map([...tbody.children].map((tr) => [tr.dataset.key, tr]));
    const wanted = new Set(rows.map((row) => row.key));
    for (const [k, tr] of existing) if (!wanted.has(k)) tr.remove();
    let cursor = tbody.firstElementChild;
    for (const row of rows) {
      let tr = existing.get(row.key);
      if (!tr || drawn.get(tr) !== row.html) {
        template.innerHTML = row.html;
        const fresh = template.content.firstElementChild;
        drawn.set(fresh, row.html);
        if (tr) {
          if (cursor === tr) cursor = fresh;
          tr.replaceWith(fresh);
        }
        tr = fresh;
      }
      if (tr === cursor) cursor = cursor.nextElementSibling;
      else tbody.insertBefore(tr, cursor);
    }
  }

  // innerHTML, only when it changed
  function setHTML(el, html) {
    if (drawn.get(el) !== html) {
      el.innerHTML = html;
      drawn.set(el, html);
    }
  }

  function chart(metric, title, points) {
    const W = 320, H = 150, L = 46, R = 10, T = 22, B = 24;
    const all = points.filter((p) => typeof p.y === "number" && Number.isFinite(p.y));
    const stride = Math.ceil(all.length / MAX_CHART_POINTS); // a long run: every stride-th point
    const pts = stride > 1 ? all.filter((p, i) => i % stride === 0 || i === all.length - 1) : all;
    const last = all.length ? fmtNum(all.at(-1).y) : "–";
    let body = "";
    if (pts.length) {
      let [x0, x1] = [Math.min(...pts.map((p) => p.x)), Math.max(...pts.map((p) => p.x))];
      let [y0, y1] = [Math.min(...pts.map((p) => p.y)), Math.max(...pts.map((p) => p.y))];
      if (x0 === x1) { x0 -= 1; x1 += 1; }
      if (y0 === y1) { const d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
      const sx = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
      const sy = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
      const path = pts.map((p, i) => `${i ? "L" : "M"}${sx(p.x).toFixed(1)},${sy(p.y).toFixed(1)}`).join("");
      const dots = pts.length <= 120 ? pts.map((p) =>
        `<circle class="pt" cx="${sx(p.x).toFixed(1)}" cy="${sy(p.y).toFixed(1)}" r="2.6"><title>step ${p.x}: ${fmtNum(p.y)}</title></circle>`).join("") : "";
      body = `<line class="axis" x1="${L}" y1="${H - B}" x2="${W - R}" y2="${H - B}"/>
        <line class="axis" x1="${L}" y1="${T}" x2="${L}" y2="${H - B}"/>
        <text class="tick" x="${L - 4}" y="${T + 4}" text-anchor="end">${fmtNum(y1)}</text>
        <text class="tick" x="${L - 4}" y="${H - B}" text-anchor="end">${fmtNum(y0)}</text>
        <text class="tick" x="${L}" y="${H - 8}" text-anchor="start">step ${x0 < 0 ? 0 : Math.round(x0)}</text>
        <text class="tick" x="${W - R}" y="${H - 8}" text-anchor="end">${Math.round(x1)}</text>
        <path class="line" d="${path}"/>${dots}`;
    } else {
      body = `<text class="tick" x="${W / 2}" y="${H / 2}" text-anchor="middle">no optimizer step yet</text>`;
    }
    return `<figure class="chart"><svg class="curve" data-metric="${metric}" data-points="${all.length}"
        viewBox="0 0 ${W} ${H}" role="img" aria-label="${esc(title)} per optimizer step">
        <text class="title" x="${L}" y="14">${esc(title)}</text>
        <text class="last" x="${W - R}" y="14" text-anchor="end">${last}</text>${body}</svg></figure>`;
  }

  function renderDetail() {
    const id = currentRunId();
    const detail = $("detail");
    if (!id) {
      detail.removeAttribute("data-run-id");
      setHTML(detail, '<p class="empty">No run yet: start training against this mock.</p>');
      return;
    }
    const run = model.runs.get(id);
    const info = run.info;
    if (detail.dataset.runId !== id) { // another run: a fresh skeleton, sections filled below
      detail.dataset.runId = id;
      setHTML(detail, `
        <div class="run-head"></div>
        <div class="charts"></div>
        <div class="cols">
          <div class="col-main">
            <h3>Timeline <span class="hint">operations in seq order</span></h3>
            <div class="omitted"></div>
            <div class="timeline-box"><table id="timeline"><colgroup><col class="c-seq"><col class="c-prim">
              <col class="c-out"><col class="c-took"><col class="c-held"><col></colgroup>
              <thead><tr><th>seq</th><th>primitive</th>
              <th>outcome</th><th>took</th><th>held</th><th>produced</th></tr></thead>
              <tbody></tbody></table></div>
          </div>
          <div class="col-side">
            <h3>Versions <span class="hint">saved for the sampler, and who used them</span></h3>
            <div class="versions-box"><table id="versions"><thead><tr><th>version</th><th>step</th>
              <th>saved (UTC)</th><th>used by</th></tr></thead><tbody></tbody></table></div>
            <h3>Samples <span class="hint samples-hint"></span></h3>
            <div id="samples"></div>
          </div>
        </div>`);
    }
    const box = detail.querySelector(".timeline-box");
    const vbox = detail.querySelector(".versions-box");
    const atBottom = box.scrollTop + box.clientHeight >= box.scrollHeight - 8;
    const versionsAtBottom = vbox.scrollTop + vbox.clientHeight >= vbox.scrollHeight - 8;

    setHTML(detail.querySelector(".run-head"), `
      <h2><span class="mono">${esc(id)}</span> ${badge(info.state)}</h2>
      <div class="stats">
        <span class="kv">model <b>${esc(info.base_model)}</b></span>
        <span class="kv">step <b id="run-step">${info.step}</b></span>
        <span class="kv">next seq <b id="run-next-seq">${info.next_seq}</b></span>
        <span class="kv">operations <b>${info.operations}</b></span>
        <span class="kv">held now <b>${info.held.length}</b></span>
        <span class="kv">session <b class="mono">${esc(shortId(info.session_id))}</b></span>
      </div>`);

    const points = [...run.points.values()].sort((a, b) => a.seq - b.seq);
    const curve = (name) => points.map((p) => ({ x: p.step, y: p[name] }));
    setHTML(detail.querySelector(".charts"), chart("loss", "loss", curve("loss")) +
      chart("grad_norm", "grad norm", curve("grad_norm")) +
      chart("update_norm", "update norm", curve("update_norm")));

    const rows = timelineRows(run);
    const hidden = run.omitted + Math.max(0, run.ops.size + run.ended.size + info.held.length - rows.length);
    setHTML(detail.querySelector(".omitted"), hidden ?
      `<p class="note">${hidden} earlier entries not shown (all operations: /_mock/trace).</p>` : "");
    patchRows(detail.querySelector("#timeline tbody"), rows.length ? rows : [{ key: "empty",
      html: '<tr data-key="empty"><td colspan="6" class="empty">no operation yet</td></tr>' }]);

    const usesByVersion = new Map();
    for (const use of run.uses.values()) {
      if (!usesByVersion.has(use.version)) usesByVersion.set(use.version, []);
      usesByVersion.get(use.version).push(use);
    }
    const versionNumbers = new Set([...run.versions.keys(), ...usesByVersion.keys()]);
    const versionRows = [...versionNumbers].sort((a, b) => a - b).map((n) => {
      const v = run.versions.get(n);
      const saved = v && v.created_at ? `<span title="${esc(v.created_at)}">${esc(v.created_at.slice(11, 19))}</span>` : "";
      const freed = !v || v.freed ? ' <span class="hint">freed</span>' : "";
      const uses = (usesByVersion.get(n) || []).sort((a, b) => a.seq - b.seq)
        .map((u) => `<span class="chip" title="${esc(u.primitive)}">${u.primitive === "sample" ? "sample" : "logprobs"} #${u.seq}</span>`).join(" ");
      return { key: `v:${n}`, html: `<tr class="version" data-key="v:${n}" data-version="${n}"><td class="num">${n}</td>
        <td class="num">${v ? v.step : "–"}</td><td>${saved}${freed}</td>
        <td>${uses || '<span class="empty">none yet</span>'}</td></tr>` };
    });
    patchRows(detail.querySelector("#versions tbody"), versionRows.length ? versionRows : [{
      key: "empty", html: '<tr data-key="empty"><td colspan="4" class="empty">none saved</td></tr>' }]);

    setHTML(detail.querySelector(".samples-hint"), info.byte_model ? "decoded bytes" : "token ids");
    const samples = [...run.ops.values()].filter((op) => op.primitive === "sample" && op.previews)
      .sort((a, b) => b.seq - a.seq).slice(0, 3).map((op) => {
        const items = op.previews.map((p) => {
          const content = p.text !== undefined ? esc(p.text) : esc(p.ids.join(" "));
          const more = p.truncated ? ` <span class="more">… ${p.tokens} tokens</span>` : "";
          return `<li><span class="sample-text${p.text !== undefined ? "" : " ids"}">${content}</span>${more}
            <span class="stop">${esc(p.stop_reason || "")}</span></li>`;
        }).join("");
        return `<div class="sample" data-seq="${op.seq}"><div class="sample-head">seq ${op.seq} ·
          version ${op.version} (step ${op.step}) · ${op.num_samples} samples</div><ol>${items}</ol></div>`;
      }).join("");
    setHTML(detail.querySelector("#samples"), samples || '<p class="empty">no sample yet</p>');

    if (atBottom) box.scrollTop = box.scrollHeight; // follow the newest unless scrolled up
    if (versionsAtBottom) vbox.scrollTop = vbox.scrollHeight;
  }

  // TTL countdowns and live hold times between polls; text is written only when it changes
  // (an unchanged page costs the browser no layout at all)
  function setText(el, text) {
    if (el.textContent !== text) el.textContent = text;
  }

  function tick() {
    if (!key || !model.receivedAt) return;
    const bySession = new Map(model.sessions.map((s) => [s.session_id, s]));
    for (const el of document.querySelectorAll(".ttl[data-session-id]")) {
      const session = bySession.get(el.dataset.sessionId);
      if (session) setText(el, ttlText(session));
    }
    const elapsed = performance.now() - model.receivedAt;
    for (const el of document.querySelectorAll(".holding[data-held-base]")) {
      setText(el, "held " + fmtMs(Number(el.dataset.heldBase) + elapsed));
    }
    const stale = elapsed > 3 * POLL_MS ? ` · last answer ${Math.round(elapsed / 1000)} s ago` : "";
    setText($("whoami"), `key ${mask(key)}${stale}`);
  }

  // -- wiring -----------------------------------------------------------------------------------
  document.addEventListener("DOMContentLoaded", () => {
    $("key-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const value = $("key-input").value.trim();
      if (value) start(value);
    });
    $("forget").addEventListener("click", () => forget(""));
    $("sessions").addEventListener("click", (event) => {
      const link = event.target.closest(".run-link");
      if (!link) return;
      event.preventDefault();
      selected = link.dataset.runId;
      render();
    });
    setInterval(tick, 1000);
    if (key) start(key); else showLogin("");
  });
})();
