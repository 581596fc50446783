// The Schedules tab: my scheduled agents (GET/POST /api/schedules, PATCH to pause or resume,
// DELETE), each one's last runs, and the alarms my agents set (GET/DELETE /api/alarms).
// Errors (a bad cron is a 422) are shown as a note in the panel, never thrown.

const $ = (id) => document.getElementById(id);
const el = (tag, cls, text) => {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = text;
  return e;
};
const button = (cls, text, onClick) => {
  const b = el("button", cls, text);
  b.type = "button";
  b.addEventListener("click", onClick);
  return b;
};

const POLL_MS = 5000;  // while the tab is shown: last ticks and open run lists stay current
const ARM_MS = 4000;   // a first click on Delete arms it this long

/** What went wrong, readably: FastAPI's 422 carries a list of field errors. */
export function describe(e) {
  const detail = e && e.data ? e.data.detail : null;
  if (Array.isArray(detail)) {
    return detail.map((d) => {
      const loc = (d.loc || []).filter((p) => p !== "body").join(".");
      return loc ? `${loc}: ${d.msg}` : d.msg;
    }).join("; ");
  }
  return (e && e.message) || String(e);
}

/** A datetime-local value ("2030-01-31T09:00" or with seconds) as RFC 3339 with the
 *  browser's offset for that moment ("2030-01-31T09:00:00+01:00"). */
export function localToRfc3339(value) {
  const local = value.length === 16 ? `${value}:00` : value.slice(0, 19);
  const when = new Date(local);
  if (Number.isNaN(when.getTime())) return null;
  const off = -when.getTimezoneOffset();
  const sign = off >= 0 ? "+" : "-";
  const pad = (n) => String(Math.floor(Math.abs(n))).padStart(2, "0");
  return `${local}${sign}${pad(off / 60)}:${pad(off % 60)}`;
}

function when(ts) {
  if (!ts) return "";
  const d = new Date(ts);
  return Number.isNaN(d.getTime()) ? ts : d.toLocaleString();
}

function clock(s) {
  if (s.kind === "interval") {
    const n = s.interval_s;
    const every = n % 86400 === 0 ? `${n / 86400} d` : n % 3600 === 0 ? `${n / 3600} h` : n % 60 === 0 ? `${n / 60} min` : `${n} s`;
    return `every ${every}`;
  }
  if (s.kind === "at") return `once at ${when(s.at)}`;
  return `cron ${s.cron} · ${s.timezone}`;
}

/** Wire the Schedules tab. `api` is the page's authenticated fetch; `conversationId()` is the
 *  open conversation (null for a new one); `workspace()` and `agent()` are the pickers', used
 *  by a schedule that starts a new conversation each run. */
export function initSchedules({ api, conversationId, workspace, agent }) {
  const rows = new Map();  // schedule id -> its <li>
  const open = new Set();  // schedule ids whose runs are shown
  let timer = null;

  function note(text) {
    const n = $("sched-note");
    n.textContent = text || "";
    n.hidden = !text;
  }

  async function refresh() {
    let list;
    let alarms;
    try {
      [list, alarms] = await Promise.all([api("GET", "/api/schedules"), api("GET", "/api/alarms")]);
    } catch (e) {
      note(`schedules: ${describe(e)}`);
      return;
    }
    renderSchedules(list);
    renderAlarms(alarms.filter((a) => a.status === "pending"));
    await Promise.all([...open].map((id) => loadRuns(id)));
  }

  function renderSchedules(list) {
    const ul = $("schedules");
    const keep = new Set(list.map((s) => s.id));
    for (const [id, li] of rows) if (!keep.has(id)) { li.remove(); rows.delete(id); open.delete(id); }
    const ordered = list.map((s) => {
      let li = rows.get(s.id);
      if (!li) { li = scheduleRow(s.id); rows.set(s.id, li); }
      fill(li, s);
      return li;
    });
    // The same nodes are kept (armed buttons and open runs stay); moved only on a new order.
    const same = ordered.length === ul.children.length && ordered.every((li, i) => ul.children[i] === li);
    if (!same) ul.replaceChildren(...ordered);
    $("schedules-empty").hidden = list.length > 0;
  }

  function scheduleRow(id) {
    const li = el("li", "schedule");
    li.dataset.id = id;
    const head = el("div", "sched-head");
    head.append(el("b", "sched-name"), el("span", "badge sched-state"));
    const actions = el("div", "sched-actions");
    const pause = button("small sched-pause", "Pause", () => setPaused(li, pause.dataset.paused !== "1"));
    const runs = button("small sched-runs", "Runs", () => toggleRuns(li));
    runs.setAttribute("aria-expanded", "false");
    const del = button("small sched-delete", "Delete", () => remove(li, del));
    actions.append(pause, runs, del);
    const runList = el("ol", "sched-run-list");
    runList.hidden = true;
    li.append(head, el("div", "sched-clock muted"), el("div", "sched-prompt"), el("div", "sched-meta muted"), actions, runList);
    return li;
  }

  function fill(li, s) {
    li.dataset.paused = s.paused ? "1" : "";
    li.querySelector(".sched-name").textContent = s.name || s.prompt.slice(0, 60);
    const state = li.querySelector(".sched-state");
    state.textContent = s.paused ? "paused" : "active";
    state.className = `badge sched-state ${s.paused ? "paused" : "active"}`;
    li.querySelector(".sched-clock").textContent = clock(s);
    li.querySelector(".sched-prompt").textContent = s.prompt;
    const meta = li.querySelector(".sched-meta");
    const target = s.conversation_id ? conversationLink(s.conversation_id, "its conversation") : document.createTextNode(
      `a new conversation each run (${s.workspace || "default"}${s.agent ? ` · ${s.agent}` : ""})`);
    meta.replaceChildren(
      document.createTextNode(`${s.last_tick_at ? `last tick ${when(s.last_tick_at)}` : "not ticked yet"} · runs in `),
      target,
    );
    const pause = li.querySelector(".sched-pause");
    pause.dataset.paused = s.paused ? "1" : "";
    pause.textContent = s.paused ? "Resume" : "Pause";
    pause.disabled = false;
  }

  function conversationLink(id, text) {
    const a = el("a", null, text || id);
    a.href = `#/c/${id}`;
    return a;
  }

  async function setPaused(li, paused) {
    const b = li.querySelector(".sched-pause");
    b.disabled = true;
    try {
      const s = await api("PATCH", `/api/schedules/${encodeURIComponent(li.dataset.id)}`, { paused });
      fill(li, s);
      note("");
    } catch (e) {
      b.disabled = false;
      note(`${paused ? "pause" : "resume"}: ${describe(e)}`);
    }
  }

  async function remove(li, del) {
    // Two clicks, like Archive: the first arms the button for a few seconds.
    if (!del.dataset.armed) {
      del.dataset.armed = "1";
      del.textContent = "Delete? Click again";
      del.classList.add("armed");
      del._disarm = setTimeout(() => disarm(del), ARM_MS);
      return;
    }
    clearTimeout(del._disarm);
    disarm(del);
    del.disabled = true;
    try {
      await api("DELETE", `/api/schedules/${encodeURIComponent(li.dataset.id)}`);
    } catch (e) {
      del.disabled = false;
      note(`delete: ${describe(e)}`);
      return;
    }
    rows.delete(li.dataset.id);
    open.delete(li.dataset.id);
    li.remove();
    $("schedules-empty").hidden = rows.size > 0;
    note("");
  }

  function disarm(del) {
    delete del.dataset.armed;
    del.textContent = "Delete";
    del.classList.remove("armed");
  }

  async function toggleRuns(li) {
    const id = li.dataset.id;
    const list = li.querySelector(".sched-run-list");
    const b = li.querySelector(".sched-runs");
    const show = !open.has(id);
    if (show) open.add(id); else open.delete(id);
    b.setAttribute("aria-expanded", String(show));
    list.hidden = !show;
    if (show) await loadRuns(id);
  }

  async function loadRuns(id) {
    const li = rows.get(id);
    if (!li) return;
    const list = li.querySelector(".sched-run-list");
    let runs;
    try {
      runs = await api("GET", `/api/schedules/${encodeURIComponent(id)}/runs`);
    } catch (e) {
      list.replaceChildren(el("li", "muted", describe(e)));
      return;
    }
    if (!runs.length) { list.replaceChildren(el("li", "muted", "no runs yet")); return; }
    list.replaceChildren(...runs.map((r) => {
      const item = el("li", "sched-run");
      item.dataset.status = r.status;
      item.append(el("span", `badge ${r.status}`, r.status), document.createTextNode(` ${when(r.tick_at)} `));
      if (r.conversation_id) item.append(conversationLink(r.conversation_id, "conversation"));
      if (r.error) item.append(el("div", "muted sched-run-error", r.error));
      return item;
    }));
  }

  function renderAlarms(alarms) {
    $("alarms-head").hidden = alarms.length === 0;
    $("alarms").replaceChildren(...alarms.map((a) => {
      const li = el("li", "alarm");
      li.dataset.id = a.id;
      li.append(el("div", "alarm-note", a.note || "(no note)"));
      const meta = el("div", "muted");
      meta.append(document.createTextNode(`wakes ${when(a.wake_at)} in `), conversationLink(a.conversation_id, "its conversation"));
      const cancel = button("small alarm-cancel", "Cancel", async () => {
        cancel.disabled = true;
        try {
          await api("DELETE", `/api/alarms/${encodeURIComponent(a.id)}`);
          li.remove();
          $("alarms-head").hidden = $("alarms").children.length === 0;
          note("");
        } catch (e) {
          cancel.disabled = false;
          note(`cancel alarm: ${describe(e)}`);
        }
      });
      li.append(meta, cancel);
      return li;
    }));
  }

  // -- the create form -------------------------------------------------------------------

  function showKind() {
    const kind = $("sched-kind").value;
    for (const k of ["interval", "at", "cron"]) $(`sched-${k}-fields`).hidden = k !== kind;
  }

  function showTarget() {
    const here = conversationId();
    const opt = $("sched-target").querySelector('option[value="conversation"]');
    opt.disabled = !here;
    if (!here && $("sched-target").value === "conversation") $("sched-target").value = "new";
  }

  function spec() {
    const kind = $("sched-kind").value;
    const body = { kind, prompt: $("sched-prompt").value.trim() };
    const name = $("sched-name").value.trim();
    if (name) body.name = name;
    if (kind === "interval") {
      body.interval_s = Number($("sched-interval").value);
    } else if (kind === "at") {
      const at = localToRfc3339($("sched-at").value);
      if (!at) throw new Error("pick a date and time");
      body.at = at;
    } else {
      body.cron = $("sched-cron").value.trim();
      body.timezone = $("sched-timezone").value.trim() || "UTC";
    }
    if ($("sched-target").value === "conversation" && conversationId()) {
      body.conversation_id = conversationId();
    } else {
      body.workspace = workspace() || undefined;
      if (agent()) body.agent = agent();
    }
    return body;
  }

  $("sched-kind").addEventListener("change", showKind);
  $("sched-target").addEventListener("focus", showTarget);
  $("sched-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    let body;
    try {
      body = spec();
    } catch (e) {
      note(describe(e));
      return;
    }
    const submit = $("sched-create");
    submit.disabled = true;
    try {
      await api("POST", "/api/schedules", body);
      $("sched-prompt").value = "";
      $("sched-name").value = "";
      note("");
      await refresh();
    } catch (e) {
      note(`could not create the schedule: ${describe(e)}`);
    } finally {
      submit.disabled = false;
    }
  });
  $("sched-refresh").addEventListener("click", () => refresh());
  try {
    $("sched-timezone").value = Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";
  } catch {
    $("sched-timezone").value = "UTC";
  }
  showKind();

  return {
    /** The tab was shown: list again, and keep it current while it stays shown. */
    show() {
      showTarget();
      clearInterval(timer);
      timer = setInterval(() => {
        if ($("panel-schedules").hidden) { clearInterval(timer); timer = null; return; }
        if (!document.hidden) refresh();
      }, POLL_MS);
      return refresh();
    },
  };
}
