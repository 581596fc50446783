// Signalbox web UI: one WebSocket, one open conversation (its URL is #/c/<id>), no build step.
// Every event is rendered once as it arrives; after a drop the socket resubscribes with the
// last event id it saw, so the server replays exactly what was missed.
import { renderMarkdown, copyButton } from "./markdown.js";
import { renderDiff } from "./diff.js";
import { initFiles } from "./files.js";
import { initSchedules } from "./schedules.js";
import { initAttachments, chipsOf } from "./attachments.js";

const $ = (id) => document.getElementById(id);
const el = (tag, cls, text) => {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = text;
  return e;
};
const button = (cls, text, onClick, label) => {
  const b = el("button", cls, text);
  b.type = "button";
  if (label) b.setAttribute("aria-label", label);
  b.addEventListener("click", onClick);
  return b;
};

const DEMO_LABEL = /^\[offline demo model[^\]]*\]\s*/;
const CONTEXT_WINDOW_TOKENS = 200_000;  // Claude models' window; the gauge is a guide
const FAILED = new Set(["error", "timeout", "lost"]);
const ACTIVE = new Set(["running", "needs_decision", "allowed", "waiting"]);
const STICK_PX = 48;  // this close to the bottom counts as "at the bottom"
const DECIDED_SHOWN = 50;  // decided proposals loaded at start (GET /api/proposals/decided)

const state = {
  token: null,
  me: null,
  rejected: false,
  ws: null,
  conversationId: null,
  lastEventId: {},       // conversation id -> last event id seen (resubscribe after reconnect)
  rootTurn: null,        // the running root turn: what Cancel targets
  turns: {},             // turn id -> rendered turn (see turnView)
  tools: {},             // call id -> rendered tool call (see toolView)
  proposals: new Map(),  // proposal id -> proposal JSON (the Changes inbox, all conversations)
  conversations: [],
  activity: {},          // conversation id -> GET /api/activity row
  workspace: null,       // the open conversation's workspace (null: the picker's, for a new one)
  awaitingNew: false,    // a user_turn without a conversation is on its way
  everOnline: false,     // distinguishes "connecting" from "reconnecting"
  stick: true,           // the transcript follows new output
  retryMs: 500,
  retryTimer: null,
  seq: 0,
};

// -- token, identity and HTTP --------------------------------------------------------------

function readToken() {
  const m = location.hash.match(/token=([^&]+)/);
  if (m) {
    localStorage.setItem("signalbox-token", decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname);  // keep the token out of the address bar
  }
  return localStorage.getItem("signalbox-token");
}

async function api(method, path, body) {
  const res = await fetch(path, {
    method,
    headers: { "Authorization": `Bearer ${state.token}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (res.status === 401) { tokenRejected(); throw new Error("token rejected"); }
  const data = await res.json().catch(() => ({}));
  if (!res.ok) throw Object.assign(new Error(data.detail || res.statusText), { status: res.status, data });
  return data;
}

function askToken(message) {
  $("auth").hidden = false;
  $("token-form").hidden = false;
  $("auth-message").textContent = message;
  $("token-input").focus();
}

function tokenRejected() {
  if (state.rejected) return;
  state.rejected = true;
  localStorage.removeItem("signalbox-token");
  clearTimeout(state.retryTimer);
  if (state.ws) { const ws = state.ws; state.ws = null; ws.close(); }
  setConn("rejected", "token rejected");
  askToken("The gateway rejected this token (wrong or revoked). Paste a valid API token.");
}

async function loadMe() {
  state.me = await api("GET", "/api/me");
  $("who").textContent = state.me.name;
  $("who").title = `signed in as ${state.me.name} (${state.me.user_id})`;
  $("account").hidden = false;
}

function logout() {
  localStorage.removeItem("signalbox-token");
  state.rejected = true;  // no reconnects
  if (state.ws) { const ws = state.ws; state.ws = null; ws.close(); }
  location.replace(location.pathname);
}

// -- WebSocket -----------------------------------------------------------------------------

function setConn(kind, label = kind) {
  const c = $("conn");
  c.textContent = label;
  c.className = `badge ${kind}`;
  document.body.dataset.conn = kind;
}

async function connect() {
  clearTimeout(state.retryTimer);
  state.retryTimer = null;
  if (state.rejected) return;
  setConn(state.everOnline ? "reconnecting" : "connecting");
  let ticket;
  try {
    ticket = (await api("POST", "/api/ws-tickets")).ticket;
  } catch (e) { return scheduleReconnect(); }
  const proto = location.protocol === "https:" ? "wss" : "ws";
  const ws = new WebSocket(`${proto}://${location.host}/ws?ticket=${encodeURIComponent(ticket)}`);
  state.ws = ws;
  ws.addEventListener("open", () => {
    setConn("online");
    state.everOnline = true;
    state.retryMs = 500;
    if (state.conversationId) subscribe(state.conversationId);
  });
  ws.addEventListener("message", (msg) => onFrame(JSON.parse(msg.data)));
  ws.addEventListener("close", () => {
    if (state.ws !== ws) return;
    state.ws = null;
    setConn("reconnecting");
    scheduleReconnect();
  });
}

function scheduleReconnect() {
  if (state.retryTimer || state.rejected) return;
  setConn(state.everOnline ? "reconnecting" : "offline");
  state.retryTimer = setTimeout(() => { state.retryTimer = null; connect(); }, state.retryMs);
  state.retryMs = Math.min(state.retryMs * 2, 5000);
}

// Back online: try now rather than at the end of the back-off.
window.addEventListener("online", () => { if (!state.ws) { state.retryMs = 500; connect(); } });

function send(frame) {
  if (!state.ws || state.ws.readyState !== WebSocket.OPEN) { note("not connected; try again"); return null; }
  frame.req = String(++state.seq);
  state.ws.send(JSON.stringify(frame));
  return frame.req;
}

function subscribe(conversationId) {
  send({ type: "subscribe", conversation_id: conversationId, after: state.lastEventId[conversationId] || null });
}

// -- frames --------------------------------------------------------------------------------

function onFrame(f) {
  if (f.type === "event") return onEvent(f);
  if (f.type === "error") {
    if (f.code === "replay_gap") { resetView(); delete state.lastEventId[state.conversationId]; subscribe(state.conversationId); return; }
    note(`error ${f.code}: ${f.message}`);
  }
  if (f.type === "ack" && f.conversation_id && f.conversation_id !== state.conversationId) adoptNew(f.conversation_id);
}

function adoptNew(conversationId) {
  // A new conversation got its id: give it its URL without reloading the view.
  state.conversationId = conversationId;
  $("conv-actions").hidden = false;
  state.awaitingNew = false;
  history.pushState(null, "", `#/c/${conversationId}`);
  loadConversations();
}

function onEvent(e) {
  if (!state.conversationId && state.awaitingNew) adoptNew(e.conversation_id);  // events may overtake the ack
  if (e.conversation_id !== state.conversationId) return;
  state.lastEventId[e.conversation_id] = e.id;
  logEvent(e);
  const d = e.data;
  const turn = e.turn_id ? turnView(e.turn_id, d.parent_call_id) : null;
  switch (e.kind) {
    case "conversation_created":
      state.workspace = d.workspace;
      // The agent it is bound to (absent: the deployment's default agent).
      $("conv-workspace").textContent = `workspace ${d.workspace}` +
        (d.agent ? ` · agent ${d.agent} v${d.agent_version}` : "");
      if (d.title) $("conv-title").textContent = d.title;
      break;
    case "turn_queued":
      turn.text = d.text;
      turn.user.textContent = d.text;
      turn.user.hidden = false;
      if (d.attachments && d.attachments.length) turn.user.append(chipsOf(d.attachments));
      turn.queuedTs = e.ts;
      setTurnStatus(turn, "queued");
      if (!turn.parent) setRunning(e.turn_id);
      break;
    case "turn_started":
      turn.startedTs = turn.startedTs || e.ts;
      turn.model = d.model;
      showModel(d.model);
      setTurnStatus(turn, "running");
      if (!turn.parent) setRunning(e.turn_id);
      turn.streaming = null;
      break;
    case "turn_resumed":
      // Deltas of the interrupted step are void; the step is streamed again.
      if (turn.streaming) turn.streaming.node.remove();
      turn.streaming = null;
      turnNote(turn, `resumed at step ${d.step} after its runner stopped`);
      setTurnStatus(turn, "running");
      break;
    case "text_delta":
      if (!turn.streaming) turn.streaming = { node: null, text: "" };
      turn.streaming.text += d.text;
      streamText(turn);
      break;
    case "thinking_delta":
      thinkingText(turn, d.text);
      break;
    case "context_compacted":
      turnNote(turn, `compacted ${d.turns_folded} earlier turn(s) to fit the context window (${d.tokens_before} → ${d.tokens_after} tokens)`);
      break;
    case "plan_started": planView(turn, d); break;
    case "plan_step": planStep(d); break;
    case "plan_finished": planFinished(d); break;
    case "assistant_message":
      turn.thinking = null;  // the next step thinks in a block of its own
      finishText(turn, d.text);
      break;
    case "tool_call_started":
      toolUpdate(turn, d.call_id, { tool: d.tool, input: d.input, status: "running", startedTs: e.ts, timeoutS: d.timeout_s, executor: d.executor });
      break;
    case "tool_call_needs_decision":
      toolUpdate(turn, d.call_id, { tool: d.tool, input: d.input, status: "needs_decision", askedTs: e.ts, expiresAt: d.expires_at });
      break;
    case "tool_call_decided":
      toolUpdate(turn, d.call_id, { status: d.decision === "allow" ? "allowed" : "denied", decidedTs: e.ts, startedTs: e.ts });
      break;
    case "tool_call_finished":
      toolUpdate(turn, d.call_id, { tool: d.tool, status: d.status, output: d.output, error: d.error, durationMs: d.duration_ms, finishedTs: e.ts });
      break;
    case "proposal_created":
      turnNote(turn, `${d.reverts ? "revert " : ""}proposed ${d.files.map((f) => `${f.operation} ${f.path}`).join(", ")} — see Changes`);
      showProposal(d.proposal_id);
      break;
    case "proposal_resolved":
      showProposal(d.proposal_id);
      if (d.status === "applied" && !$("panel-files").hidden) files.refresh();
      if (turn) turnNote(turn, `proposal ${d.status}`);
      break;
    case "question": questionView(turn, d); break;
    case "question_answered": answered(d.question_id); break;
    case "turn_finished":
      if (turn.streaming && !turn.streaming.text.trim()) turn.streaming = null;
      turn.finished = { status: d.status, usage: d.usage || {}, steps: d.steps || 0, error: d.error, ts: e.ts };
      setTurnStatus(turn, d.status);
      if (!turn.parent) {
        if (state.rootTurn === e.turn_id) setRunning(null);
        showContext(turn.finished);
        scheduleListRefresh();
      }
      break;
  }
  followOutput();
}

function setRunning(turnId) {
  // The list's "running" badge follows the events at once (SQL may lag the event a moment).
  const a = state.conversationId && state.activity[state.conversationId];
  if (a && a.active_turn_id !== turnId) { a.active_turn_id = turnId; renderConversationList(); }
  state.rootTurn = turnId;
  $("cancel").disabled = !turnId;
  document.body.dataset.running = turnId ? "1" : "";
  for (const t of Object.values(state.turns)) if (t.retry) t.retry.disabled = Boolean(turnId);
}

function cancelTurn() {
  // Always the root turn: a sub-agent's own id would be acknowledged and ignored.
  if (state.rootTurn) send({ type: "cancel", turn_id: state.rootTurn });
}

function showModel(model) {
  if (!model || !/offline-demo/.test(model)) return;
  const label = $("model-label");
  label.textContent = "demo model";
  label.title = "No ANTHROPIC_API_KEY: answers come from the offline demo model";
  label.hidden = false;
}

// -- the turn timeline ---------------------------------------------------------------------

function turnView(turnId, parentCallId) {
  let t = state.turns[turnId];
  if (t) return t;
  const parentCall = parentCallId ? state.tools[parentCallId] : null;
  const section = el("section", parentCall ? "turn sub-agent" : "turn");
  section.dataset.turnId = turnId;
  const user = el("div", "msg user");
  user.hidden = true;
  const body = el("div", "turn-body");
  const summary = el("button", "turn-summary");
  summary.type = "button";
  summary.setAttribute("aria-expanded", "true");
  summary.addEventListener("click", () => {
    const collapsed = section.classList.toggle("collapsed");
    summary.setAttribute("aria-expanded", String(!collapsed));
  });
  if (parentCall) {
    section.append(el("div", "sub-agent-label", "sub-agent"), body, summary);
    parentCall.children.append(section);
    parentCall.details.open = true;
  } else {
    section.append(user, body, summary);
    $("transcript").append(section);
  }
  t = state.turns[turnId] = {
    id: turnId, section, user, body, summary, streaming: null, tools: [], status: null,
    parent: parentCall ? parentCall.turn : null,
  };
  if (!parentCall) {
    t.retry = button("retry", "Retry", () => retryTurn(t), "Retry this message as a new turn");
    t.retry.disabled = true;
    user.after(t.retry);
    t.revert = button("revert-turn", "Revert changes", () => revertTurn(t), "Propose undoing the changes this turn applied");
    t.revert.hidden = true;
    summary.after(t.revert);
    refreshRevert(t);
  }
  return t;
}

function rootOf(turn) { return turn.parent ? rootOf(turn.parent) : turn; }

function retryTurn(turn) {
  if (!turn.text || !state.conversationId) return;
  send({ type: "user_turn", conversation_id: state.conversationId, text: turn.text, client_turn_id: crypto.randomUUID() });
}

// -- reverting applied changes: always a new proposal for the human to approve --------------

function isReverted(id) {
  // A revert of it waits or was applied: offering another would only conflict.
  for (const q of state.proposals.values()) {
    if ((q.reverts || []).includes(id) && (q.status === "pending" || q.status === "applied")) return true;
  }
  return false;
}

function revertable(turnId) {
  return [...state.proposals.values()].filter((p) => p.turn_id === turnId && p.status === "applied" && !isReverted(p.proposal_id));
}

function refreshRevert(turn) {
  if (turn.revert) turn.revert.hidden = revertable(turn.id).length === 0;
}

async function revertTurn(turn) {
  const first = revertable(turn.id)[0];
  if (!first) return;
  turn.revert.disabled = true;
  try {
    // One proposal for the whole turn: two changes of one file revert together.
    const back = await api("POST", `/api/proposals/${encodeURIComponent(first.proposal_id)}/revert`, { scope: "turn" });
    renderProposal(back);
    updateCounts();
    openSide("changes");
  } catch (e) {
    turnNote(turn, `revert: ${e.message}`);
  } finally {
    turn.revert.disabled = false;
  }
}

async function revertProposal(id) {
  try { renderProposal(await api("POST", `/api/proposals/${encodeURIComponent(id)}/revert`, { scope: "proposal" })); } catch (e) { note(`revert ${id}: ${e.message}`); }
  updateCounts();
}

function turnItem(turn, node) {
  turn.body.append(node);
  return node;
}

function turnNote(turn, text) {
  if (!turn) return note(text);
  turnItem(turn, el("div", "msg note", text));
}

// run_plan: the plan as a live checklist, one line per step (planned → running → its end).
const PLAN_MARKS = { planned: "☐", running: "◌", ok: "✓", error: "✗", timeout: "⏱", skipped: "↷", cancelled: "⊘" };
const plans = {};

function planView(turn, d) {
  const box = el("div", "msg plan");
  box.dataset.callId = d.call_id;
  const head = el("div", "plan-head", `Plan: ${d.steps.length} step(s)`);
  const list = el("ol", "plan-steps");
  const rows = {};
  for (const step of d.steps) {
    const li = el("li", "plan-step");
    li.dataset.saveAs = step.save_as;
    li.dataset.status = "planned";
    const after = step.depends_on.length ? ` (after ${step.depends_on.join(", ")})` : "";
    li.append(el("span", "plan-mark", PLAN_MARKS.planned), el("span", "", ` ${step.save_as} — ${step.tool}${after}`), el("span", "plan-error"));
    rows[step.save_as] = li;
    list.append(li);
  }
  box.append(head, list);
  plans[d.call_id] = { head, rows };
  turnItem(turn, box);
}

function planStep(d) {
  const li = plans[d.call_id] && plans[d.call_id].rows[d.save_as];
  if (!li) return;
  li.dataset.status = d.status;
  li.querySelector(".plan-mark").textContent = PLAN_MARKS[d.status] || "?";
  li.querySelector(".plan-error").textContent = d.error ? ` — ${d.error}` : "";
}

function planFinished(d) {
  const plan = plans[d.call_id];
  if (!plan) return;
  plan.head.textContent = "Plan finished: " + Object.entries(d.steps).map(([s, n]) => `${n} ${s}`).join(", ");
  plan.head.parentElement.dataset.finished = "1";
}

function bubble(turn) {
  const node = el("div", "msg assistant");
  const md = el("div", "md");
  const actions = el("div", "msg-actions");
  node.append(md, actions);
  turnItem(turn, node);
  return node;
}

// Extended thinking: a collapsed, dimmed "Thinking" block above the step's text.
function thinkingText(turn, text) {
  if (!turn.thinking) {
    const node = el("details", "msg thinking");
    node.append(el("summary", "", "Thinking"), el("div", "thinking-text"));
    turn.thinking = { node: turnItem(turn, node), text: "" };
  }
  turn.thinking.text += text;
  turn.thinking.node.querySelector(".thinking-text").textContent = turn.thinking.text;
}

function streamText(turn) {
  const s = turn.streaming;
  const text = s.text.replace(DEMO_LABEL, "");
  if (!text.trim()) return;  // nothing to show yet: no empty bubble
  if (!s.node) { s.node = bubble(turn); s.node.classList.add("streaming"); }
  if (s.pending) return;
  s.pending = requestAnimationFrame(() => {
    s.pending = 0;
    renderMarkdown(s.node.querySelector(".md"), s.text.replace(DEMO_LABEL, ""));
    followOutput();
  });
}

function finishText(turn, raw) {
  const s = turn.streaming;
  turn.streaming = null;
  if (s && s.pending) cancelAnimationFrame(s.pending);
  const text = (raw || "").replace(DEMO_LABEL, "");
  if (!text.trim()) { if (s && s.node) s.node.remove(); return; }  // a tool-only step
  const node = (s && s.node) || bubble(turn);
  node.classList.remove("streaming");
  renderMarkdown(node.querySelector(".md"), text);
  node.querySelector(".msg-actions").replaceChildren(copyButton(() => text, "Copy answer"));
}

function seconds(ms) { return `${(ms / 1000).toFixed(1)} s`; }
function between(fromTs, toTs) {
  const ms = Date.parse(toTs) - Date.parse(fromTs);
  return Number.isFinite(ms) ? Math.max(ms, 0) : null;
}
function localTime(ts) { return ts ? new Date(ts).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" }) : ""; }

function setTurnStatus(turn, status) {
  turn.status = status;
  turn.section.dataset.status = status;
  const calls = turn.tools.map((id) => state.tools[id]);
  const counts = new Map();
  for (const c of calls) counts.set(c.tool, (counts.get(c.tool) || 0) + 1);
  const parts = [];
  parts.push(calls.length
    ? `${calls.length} tool${calls.length > 1 ? "s" : ""}: ${[...counts].map(([n, k]) => (k > 1 ? `${n} ×${k}` : n)).join(", ")}`
    : "no tools");
  const toolMs = calls.reduce((sum, c) => sum + (c.durationMs || 0), 0);
  if (calls.length) parts.push(`tool time ${toolMs} ms`);
  if (turn.finished) {
    const ms = between(turn.startedTs || turn.queuedTs, turn.finished.ts);
    if (ms !== null) parts.push(seconds(ms));
    const u = turn.finished.usage;
    const input = promptTokens(u);
    const cached = u.cache_read_input_tokens || 0;
    const read = cached ? `, ${cached} of them from the cache` : "";
    const cost = typeof u.cost_usd === "number" ? ` · $${u.cost_usd.toFixed(4)}` : "";
    parts.push(`${input + (u.output_tokens || 0)} tokens (${input} in${read}, ${u.output_tokens || 0} out)${cost}`);
    if (turn.finished.error) parts.push(turn.finished.error);
  }
  const when = localTime(turn.startedTs || turn.queuedTs);
  if (when) parts.push(when);
  turn.summary.replaceChildren(badge(status), " " + parts.join(" · "));
  if (turn.retry) turn.retry.disabled = !turn.finished || Boolean(state.rootTurn);
}

function toolView(turn, callId) {
  let t = state.tools[callId];
  if (t) return t;
  const details = el("details", "tool");
  details.dataset.callId = callId;
  details.dataset.statuses = "";
  const head = el("summary");
  const io = el("div", "tool-io");
  const children = el("div", "sub-agents");
  const body = el("div", "tool-body");
  body.append(io, children);
  details.append(head, body);
  // Calls of one step run in parallel: they share a row group.
  const last = turn.body.lastElementChild;
  const group = last && last.classList.contains("tool-group") && last.dataset.open === "1" ? last : turnItem(turn, el("div", "tool-group"));
  group.dataset.open = "1";
  group.append(details);
  t = state.tools[callId] = { callId, turn, details, head, io, children, tool: "?", input: {}, status: null };
  turn.tools.push(callId);
  return t;
}

function toolUpdate(turn, callId, change) {
  const t = toolView(turn, callId);
  Object.assign(t, Object.fromEntries(Object.entries(change).filter(([, v]) => v !== undefined)));
  if (change.status && change.status !== t.lastStatus) {
    // The history of badges (e.g. "running ok"), so a fast call's transitions stay visible.
    t.details.dataset.statuses = `${t.details.dataset.statuses} ${change.status}`.trim();
    t.lastStatus = change.status;
  }
  t.details.dataset.status = t.status;
  t.details.dataset.tool = t.tool;
  if (!ACTIVE.has(t.status)) closeGroup(t);
  renderToolHead(t);
  renderToolIo(t);
  if (FAILED.has(t.status)) t.details.open = true;  // a failure explains itself
  setTurnStatus(turn, turn.status || "running");
}

function closeGroup(t) {
  // A finished call ends its step's group: the next step's calls start a new row.
  const group = t.details.parentElement;
  if (group && [...group.children].every((d) => !ACTIVE.has(d.dataset.status))) group.dataset.open = "";
}

function inputPreview(input) {
  const first = Object.values(input || {})[0];
  if (first === undefined) return "";
  const s = typeof first === "string" ? first : JSON.stringify(first);
  return s.length > 48 ? `${s.slice(0, 47)}…` : s;
}

function renderToolHead(t) {
  const waited = t.askedTs ? between(t.askedTs, t.decidedTs || t.finishedTs || new Date().toISOString()) : null;
  const waitedText = waited !== null ? `waited ${seconds(waited)}` : "";
  t.head.replaceChildren(
    badge(t.status), " ", el("b", null, t.tool), " ", el("span", "args", inputPreview(t.input)), " ",
    el("span", "waited", waitedText), " ", el("span", "duration", durationText(t)),
  );
  if (t.status === "needs_decision") {
    for (const decision of ["allow", "deny"]) {
      const b = button(`decide ${decision}`, decision === "allow" ? "Allow" : "Deny", (ev) => {
        ev.preventDefault();
        send({ type: "decide_tool", call_id: t.callId, decision });
      });
      t.head.append(" ", b);
    }
  }
}

function durationText(t) {
  if (t.durationMs != null) return `${t.durationMs} ms`;
  if ((t.status === "running" || t.status === "allowed") && t.startedTs) {
    const ms = between(t.startedTs, new Date().toISOString());
    return ms === null ? "" : `${seconds(ms)}…`;
  }
  return "";
}

function renderToolIo(t) {
  const parts = [el("div", "label", "input"), el("pre", "io input", JSON.stringify(t.input || {}, null, 2))];
  if (t.timeoutS) parts.push(el("div", "label", `time limit ${t.timeoutS} s`));
  if (t.output != null || t.error) {
    parts.push(el("div", "label", "output"), el("pre", "io output", t.output || ""));
    if (t.error) parts.push(el("div", "label", "error"), el("pre", "io error", t.error));
  }
  t.io.replaceChildren(...parts);
}

// Running calls tick; decisions waiting show how long they have waited.
setInterval(() => {
  for (const t of Object.values(state.tools)) {
    if (ACTIVE.has(t.status)) {
      t.head.querySelector(".duration").textContent = durationText(t);
      if (t.askedTs && !t.decidedTs) t.head.querySelector(".waited").textContent = `waited ${seconds(between(t.askedTs, new Date().toISOString()) || 0)}`;
    }
  }
}, 250);

function questionView(turn, d) {
  const box = el("div", "question");
  box.id = `question-${d.question_id}`;
  box.append(el("div", "q-text", `The agent asks: ${d.text}`));
  const answer = (text) => send({ type: "answer", question_id: d.question_id, text });
  if (d.options && d.options.length) {
    for (const option of d.options) box.append(button("option", option, () => answer(option)), " ");
  } else {
    const form = el("form");
    const input = el("input");
    input.placeholder = "your answer";
    input.setAttribute("aria-label", "Your answer");
    form.append(input, el("button", null, "Answer"));
    form.addEventListener("submit", (ev) => { ev.preventDefault(); if (input.value.trim()) answer(input.value.trim()); });
    box.append(form);
  }
  turnItem(turn, box);
}

function answered(questionId) {
  const box = document.getElementById(`question-${questionId}`);
  if (!box) return;
  box.classList.add("answered");
  for (const control of box.querySelectorAll("button, input")) control.disabled = true;
}

// The whole prompt: input_tokens counts only what was neither read from nor written to the
// prompt cache (the Messages API's meaning).
function promptTokens(usage) {
  return (usage.input_tokens || 0) + (usage.cache_creation_input_tokens || 0)
    + (usage.cache_read_input_tokens || 0);
}

function showContext(finished) {
  // The last step's input is the conversation so far: estimate it as the turn's input per step.
  const steps = Math.max(finished.steps || 1, 1);
  const tokens = Math.round(promptTokens(finished.usage) / steps);
  const share = Math.min(tokens / CONTEXT_WINDOW_TOKENS, 1);
  $("context").hidden = false;
  $("context-fill").style.width = `${(share * 100).toFixed(1)}%`;
  $("context-text").textContent = `≈${(tokens / 1000).toFixed(1)}k / ${CONTEXT_WINDOW_TOKENS / 1000}k tokens`;
}

// -- scrolling: follow the output unless the reader scrolled up ----------------------------

function followOutput() {
  const tr = $("transcript");
  if (state.stick) tr.scrollTop = tr.scrollHeight;
  else $("jump").hidden = false;
}

$("transcript").addEventListener("scroll", () => {
  const tr = $("transcript");
  state.stick = tr.scrollHeight - tr.scrollTop - tr.clientHeight < STICK_PX;
  if (state.stick) $("jump").hidden = true;
});
$("jump").addEventListener("click", () => { state.stick = true; $("jump").hidden = true; followOutput(); });

// -- rendering helpers ---------------------------------------------------------------------

function note(text) {
  $("transcript").append(el("div", "msg note", text));
  followOutput();
}

function badge(status) { return el("span", `badge ${status}`, status); }

function logEvent(e) {
  const li = el("li", null, `${e.id} ${e.kind}`);
  li.dataset.eventId = e.id;
  li.dataset.kind = e.kind;
  $("events").append(li);
  $("event-count").textContent = String($("events").children.length);
}

// -- the Changes inbox (every conversation) ------------------------------------------------

async function loadInbox() {
  const [pending, decided] = await Promise.all([
    api("GET", "/api/proposals/pending"),
    api("GET", `/api/proposals/decided?limit=${DECIDED_SHOWN}`),
  ]);
  // Newest first: each is put on top, so the oldest goes first. One a live event already
  // rendered is fresher than this listing and stays as it is.
  for (const p of decided.proposals.reverse()) if (!state.proposals.has(p.proposal_id)) renderProposal(p);
  for (const p of pending.proposals) renderProposal(p);
  updateCounts();
}

async function showProposal(id) {
  try { renderProposal(await api("GET", `/api/proposals/${encodeURIComponent(id)}`)); } catch (e) { note(`proposal ${id}: ${e.message}`); }
  updateCounts();
}

function renderProposal(p) {
  const id = p.proposal_id;
  state.proposals.set(id, p);
  let box = document.getElementById(`proposal-${id}`);
  if (!box) { box = el("article", "proposal"); box.id = `proposal-${id}`; }
  const pending = p.status === "pending";
  const home = pending ? $("proposals") : $("decided");
  if (box.parentElement !== home) home.prepend(box);
  box.dataset.status = p.status;
  box.dataset.conversationId = p.conversation_id || "";
  const head = el("div", "proposal-head");
  head.append(badge(p.status), " ", el("b", null, p.summary || id));
  const meta = el("div", "proposal-meta muted");
  if (p.conversation_id) {
    const link = el("a", null, conversationTitle(p.conversation_id));
    link.href = `#/c/${p.conversation_id}`;
    meta.append(link, " · ");
  }
  meta.append(`${p.workspace ? `workspace ${p.workspace} · ` : ""}${localTime(p.created_at)}`);
  if (p.reason) meta.append(` · ${p.reason}`);
  if (p.reverts) meta.append(` · reverts ${p.reverts.join(", ")}`);
  const parts = [head, meta];
  for (const f of p.files || []) {
    const file = el("details", "file");
    file.dataset.path = f.path;
    file.open = pending;
    const summary = el("summary");
    summary.append(el("span", `op ${f.operation}`, f.operation), " ", el("code", "path", f.path));
    if (pending && (p.files || []).length > 1) {
      summary.append(" ", button("approve-file", "Approve file", (ev) => { ev.preventDefault(); decideProposal(id, "approve", [f.path]); }, `Approve only ${f.path}`));
    }
    file.append(summary, renderDiff(f.diff || "", $("split-diffs").checked));
    parts.push(file);
  }
  if (pending) {
    const row = el("div", "row");
    const all = (p.files || []).length > 1 ? "Approve all" : "Approve";
    row.append(
      button("approve", all, () => decideProposal(id, "approve")),
      button("reject", "Reject", () => decideProposal(id, "reject")),
    );
    parts.push(row);
  } else if (p.status === "applied" && !isReverted(id)) {
    const row = el("div", "row");
    row.append(button("revert", p.reverts ? "Undo revert" : "Revert", () => revertProposal(id), `Propose undoing ${p.summary || id}`));
    parts.push(row);
  }
  const conflict = box.querySelector(".conflict");
  box.replaceChildren(...parts);
  if (conflict && (pending || p.status === "conflict")) box.append(conflict);
  // A revert hides the Revert button of what it reverts.
  for (const r of p.reverts || []) { const o = state.proposals.get(r); if (o && o.status === "applied") renderProposal(o); }
}

async function decideProposal(id, decision, files) {
  const box = document.getElementById(`proposal-${id}`);
  for (const b of box.querySelectorAll("button")) b.disabled = true;
  try {
    const body = decision === "reject" ? { reason: null } : (files ? { files } : {});
    const result = await api("POST", `/api/proposals/${encodeURIComponent(id)}/${decision}`, body);
    if (result && result.proposal_id && result.proposal_id !== id) renderProposal(result);  // a partial approval's split
  } catch (e) {
    showConflict(box, e);
  }
  await showProposal(id);
}

function showConflict(box, e) {
  const div = el("div", "conflict");
  div.append(el("b", null, `${e.status === 409 ? "Conflict" : "Failed"}: ${e.message}`));
  for (const f of (e.data && e.data.files) || []) {
    div.append(el("div", "label", `${f.path}: ${f.refused || (f.changed ? "changed on disk since the proposal" : "unchanged")}`));
    if (f.diff) div.append(renderDiff(f.diff));
  }
  box.append(div);
}

$("split-diffs").checked = localStorage.getItem("signalbox-split-diffs") === "1";
$("split-diffs").addEventListener("change", () => {
  localStorage.setItem("signalbox-split-diffs", $("split-diffs").checked ? "1" : "0");
  for (const p of state.proposals.values()) renderProposal(p);
});

function updateCounts() {
  const pending = [...state.proposals.values()].filter((p) => p.status === "pending");
  $("pending-count").textContent = String(pending.length);
  for (const t of Object.values(state.turns)) refreshRevert(t);
  renderConversationList();
}

// -- conversations -------------------------------------------------------------------------

function conversationTitle(id) {
  const c = state.conversations.find((c) => c.conversation_id === id);
  return (c && c.title) || id;
}

async function loadConversations() {
  const [list, activity] = await Promise.all([
    api("GET", "/api/conversations"),
    api("GET", "/api/activity").catch(() => ({ conversations: [] })),  // badges are extras
  ]);
  state.conversations = list;
  state.activity = Object.fromEntries(activity.conversations.map((a) => [a.conversation_id, a]));
  renderConversationList();
  for (const a of document.querySelectorAll('.proposal-meta a[href^="#/c/"]')) a.textContent = conversationTitle(a.getAttribute("href").slice(4));
}

let refreshTimer = null;
function scheduleListRefresh() {
  clearTimeout(refreshTimer);
  refreshTimer = setTimeout(() => loadConversations().catch(() => {}), 1000);
}

function ago(ts) {
  const s = (Date.now() - Date.parse(ts)) / 1000;
  if (!Number.isFinite(s)) return "";
  if (s < 60) return "just now";
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return new Date(ts).toLocaleDateString();
}

function renderConversationList() {
  const ul = $("conversations");
  const pendingBy = {};
  for (const p of state.proposals.values()) if (p.status === "pending") pendingBy[p.conversation_id] = (pendingBy[p.conversation_id] || 0) + 1;
  const rows = [...state.conversations].sort((a, b) => {
    const la = (state.activity[a.conversation_id] || {}).last_activity_at || a.created_at;
    const lb = (state.activity[b.conversation_id] || {}).last_activity_at || b.created_at;
    return lb.localeCompare(la);
  });
  ul.replaceChildren(...rows.map((c) => {
    const a = state.activity[c.conversation_id] || {};
    const li = el("li", c.conversation_id === state.conversationId ? "active" : "");
    li.dataset.conversationId = c.conversation_id;
    const link = el("a", "conv-link");
    link.href = `#/c/${c.conversation_id}`;
    if (c.conversation_id === state.conversationId) link.setAttribute("aria-current", "page");
    link.append(el("span", "conv-title", c.title || c.conversation_id));
    const meta = el("span", "conv-meta", `${c.workspace} · ${ago(a.last_activity_at || c.created_at)}`);
    link.append(meta);
    const waits = (a.waiting_decisions || 0) + (a.waiting_questions || 0);
    const badges = el("span", "conv-badges");
    if (a.active_turn_id) badges.append(el("span", "dot running", "running"));
    if (waits) badges.append(el("span", "wait", `${waits} waiting`));
    if (pendingBy[c.conversation_id]) badges.append(el("span", "changes", `${pendingBy[c.conversation_id]} change${pendingBy[c.conversation_id] > 1 ? "s" : ""}`));
    link.append(badges);
    li.append(link);
    return li;
  }));
}

function resetView() {
  for (const id of ["transcript", "events"]) $(id).replaceChildren();
  $("event-count").textContent = "0";
  $("context").hidden = true;
  state.turns = {};
  state.tools = {};
  state.workspace = null;
  state.stick = true;
  $("jump").hidden = true;
  setRunning(null);
}

function openConversation(id) {
  if (state.conversationId && state.conversationId !== id) send({ type: "unsubscribe", conversation_id: state.conversationId });
  state.conversationId = id;
  delete state.lastEventId[id];  // a fresh view replays the conversation from its start
  resetView();
  $("conv-title").textContent = conversationTitle(id);
  $("conv-workspace").textContent = "";
  endRename();
  if (state.ws && state.ws.readyState === WebSocket.OPEN) subscribe(id);
  renderConversationList();
  closeDrawers();
}

function newConversation() {
  if (state.conversationId) send({ type: "unsubscribe", conversation_id: state.conversationId });
  state.conversationId = null;
  state.awaitingNew = false;
  resetView();
  $("conv-title").textContent = "New conversation";
  showNewConversationTarget();
  endRename();
  renderConversationList();
  closeDrawers();
  $("text").focus();
}

function showNewConversationTarget() {
  const agent = $("agent").value;
  $("conv-workspace").textContent = `workspace ${$("workspace").value || "default"}` + (agent ? ` · agent ${agent}` : "");
}
$("agent").addEventListener("change", () => { if (!state.conversationId) showNewConversationTarget(); });
$("workspace").addEventListener("change", () => { if (!state.conversationId) showNewConversationTarget(); });

// The URL names the open conversation: #/c/<id>; anything else is a new one.
function routeId() {
  const m = location.hash.match(/^#\/c\/([\w-]+)$/);
  return m ? m[1] : null;
}

function applyRoute() {
  const id = routeId();
  if (id === state.conversationId && (id || !state.awaitingNew)) return;
  if (id) openConversation(id); else newConversation();
}

window.addEventListener("popstate", applyRoute);
window.addEventListener("hashchange", () => {
  // A login link (#token=...) opened in this tab: take the token and start afresh.
  if (/token=/.test(location.hash)) { readToken(); location.reload(); }
});

// -- rename and archive --------------------------------------------------------------------

function startRename() {
  $("rename-input").value = $("conv-title").textContent;
  $("conv-title").hidden = true;
  $("conv-actions").hidden = true;
  $("rename-form").hidden = false;
  $("rename-input").focus();
  $("rename-input").select();
}

function endRename() {
  $("rename-form").hidden = true;
  $("conv-title").hidden = false;
  $("conv-actions").hidden = !state.conversationId;
}

$("rename").addEventListener("click", startRename);
$("rename-input").addEventListener("keydown", (ev) => { if (ev.key === "Escape") { ev.stopPropagation(); endRename(); } });
$("rename-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const title = $("rename-input").value.trim();
  if (!title || !state.conversationId) return endRename();
  try {
    const c = await api("PATCH", `/api/conversations/${encodeURIComponent(state.conversationId)}`, { title });
    $("conv-title").textContent = c.title;
    await loadConversations();
  } catch (e) { note(`rename: ${e.message}`); }
  endRename();
});

let archiveArmed = null;
$("archive").addEventListener("click", async () => {
  // Two clicks: the first arms the button for a few seconds, the second archives.
  if (!archiveArmed) {
    $("archive").textContent = "Archive? Click again";
    $("archive").classList.add("armed");
    archiveArmed = setTimeout(() => { archiveArmed = null; $("archive").textContent = "Archive"; $("archive").classList.remove("armed"); }, 4000);
    return;
  }
  clearTimeout(archiveArmed);
  archiveArmed = null;
  $("archive").textContent = "Archive";
  $("archive").classList.remove("armed");
  const id = state.conversationId;
  try {
    await api("DELETE", `/api/conversations/${encodeURIComponent(id)}`);
  } catch (e) { return note(`archive: ${e.message}`); }
  history.pushState(null, "", location.pathname);
  newConversation();
  await loadConversations();
});

// -- agents: which one a new conversation runs as ----------------------------------------------

async function loadAgents() {
  const agents = await api("GET", "/api/agents");
  const pick = $("agent");
  const keep = pick.value;
  pick.replaceChildren(el("option", null, "default"), ...agents.map((a) => {
    const mode = a.config && a.config.mode === "chat" ? " (chat)" : "";
    const o = el("option", null, `${a.name}${mode}${a.scope === "deployment" ? "" : " · mine"}`);
    o.value = a.name;
    return o;
  }));
  pick.firstChild.value = "";
  pick.value = agents.some((a) => a.name === keep) ? keep : "";
}

// -- workspaces ----------------------------------------------------------------------------

async function loadWorkspaces(select) {
  const data = await api("GET", "/api/workspaces");
  const pick = $("workspace");
  pick.replaceChildren(...data.workspaces.map((w) => {
    const o = el("option", null, w.git ? `${w.name} (${w.git.branch || "detached"}${w.git.dirty ? ", dirty" : ""})` : w.name);
    o.value = w.name;
    return o;
  }));
  pick.value = select || data.selected;
}

$("workspace-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const name = $("workspace-name").value.trim();
  if (!name) return;
  try {
    await api("POST", "/api/workspaces", { name });
    $("workspace-name").value = "";
    await loadWorkspaces(name);
  } catch (e) { note(`workspace ${name}: ${e.message}`); }
});

// -- drawers (narrow screens) --------------------------------------------------------------

const attachments = initAttachments({ token: () => state.token, note });
const files = initFiles({ api, workspace: () => state.workspace || $("workspace").value || "default" });
const schedules = initSchedules({
  api,
  conversationId: () => state.conversationId,
  workspace: () => $("workspace").value,
  agent: () => $("agent").value,
});

function showTab(name) {
  for (const tab of ["changes", "files", "schedules"]) {
    $(`tab-${tab}`).setAttribute("aria-selected", String(tab === name));
    $(`panel-${tab}`).hidden = tab !== name;
  }
  if (name === "files") files.refresh();
  if (name === "schedules") schedules.show();
}

function openSide(tab) {
  // Wide screens show the panel as a column: the header buttons switch its tab.
  showTab(tab);
  if (getComputedStyle($("side")).position === "fixed") openDrawer("side");
}

function openDrawer(which) {
  document.body.dataset.drawer = which;
  $("scrim").hidden = false;
  $("toggle-nav").setAttribute("aria-expanded", String(which === "nav"));
  $("toggle-side").setAttribute("aria-expanded", String(which === "side"));
}

function closeDrawers() {
  if (!document.body.dataset.drawer) return false;
  document.body.dataset.drawer = "";
  $("scrim").hidden = true;
  $("toggle-nav").setAttribute("aria-expanded", "false");
  $("toggle-side").setAttribute("aria-expanded", "false");
  return true;
}

const toggle = (which) => (document.body.dataset.drawer === which ? closeDrawers() : openDrawer(which));
$("toggle-nav").addEventListener("click", () => toggle("nav"));
$("toggle-side").addEventListener("click", () => openSide("changes"));
$("toggle-files").addEventListener("click", () => openSide("files"));
$("toggle-schedules").addEventListener("click", () => openSide("schedules"));
$("tab-changes").addEventListener("click", () => showTab("changes"));
$("tab-files").addEventListener("click", () => showTab("files"));
$("tab-schedules").addEventListener("click", () => showTab("schedules"));
$("close-side").addEventListener("click", closeDrawers);
$("scrim").addEventListener("click", closeDrawers);

// -- wiring --------------------------------------------------------------------------------

$("composer").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const text = $("text").value.trim();
  if (!text || attachments.busy()) return;
  const frame = { type: "user_turn", conversation_id: state.conversationId, text, client_turn_id: crypto.randomUUID() };
  if (!state.conversationId) {
    frame.workspace = $("workspace").value || undefined;
    frame.agent = $("agent").value || undefined;  // binds the new conversation for good
  }
  if (attachments.ids().length) frame.attachments = attachments.ids();
  const sent = send(frame);
  if (sent) { $("text").value = ""; attachments.clear(); if (!state.conversationId) state.awaitingNew = true; state.stick = true; }
});
$("text").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); $("composer").requestSubmit(); }
});
document.addEventListener("keydown", (ev) => {
  if (ev.key !== "Escape") return;
  if (closeDrawers()) return;
  cancelTurn();
});
$("cancel").addEventListener("click", cancelTurn);
$("new-conv").addEventListener("click", () => { if (routeId()) history.pushState(null, "", location.pathname); newConversation(); });
$("logout").addEventListener("click", logout);
$("token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  localStorage.setItem("signalbox-token", $("token-input").value.trim());
  location.reload();
});
$("conversations").addEventListener("click", (ev) => {
  // Plain clicks navigate in-page (the hash is the URL), so back and forward work.
  const li = ev.target.closest("li[data-conversation-id]");
  if (!li || ev.ctrlKey || ev.metaKey) return;
  ev.preventDefault();
  const id = li.dataset.conversationId;
  if (id !== state.conversationId) { history.pushState(null, "", `#/c/${id}`); openConversation(id); } else closeDrawers();
});
document.addEventListener("click", (ev) => {
  // Links to a conversation elsewhere (the Changes inbox) navigate the same way.
  const a = ev.target.closest('a[href^="#/c/"]');
  if (!a || a.closest("#conversations")) return;
  ev.preventDefault();
  const id = a.getAttribute("href").slice(4);
  if (id !== state.conversationId) { history.pushState(null, "", `#/c/${id}`); openConversation(id); }
});

// For tests and the curious: drop the socket as a network failure would.
window.signalbox = {
  state,
  drop() { if (state.ws) state.ws.close(4000, "dropped by the page"); },
};

async function start() {
  state.token = readToken();
  if (!state.token) { askToken("Paste your API token to connect (./scripts/up prints one)."); setConn("offline"); return; }
  try {
    await loadMe();
  } catch (e) {
    if (state.rejected) return;
    setConn("offline");  // the gateway is unreachable: not the token's fault
  }
  applyRoute();
  connect();
  await Promise.all([loadConversations(), loadWorkspaces(), loadAgents(), loadInbox()]).catch(() => {});
  if (state.conversationId) $("conv-title").textContent = conversationTitle(state.conversationId);
  setInterval(() => { if (!state.rejected) loadConversations().catch(() => {}); }, 15_000);
}

start();
