// Signalbox web UI: one WebSocket, one conversation at a time, no build step.
// Every event is rendered once as it arrives; after a drop the socket resubscribes with the
// last event id it saw, so the server replays exactly what was missed.
"use strict";

const $ = (id) => document.getElementById(id);
const el = (tag, cls, text) => {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = text;
  return e;
};

const state = {
  token: null,
  ws: null,
  conversationId: null,
  lastEventId: {},       // conversation id -> last event id seen (resubscribe after reconnect)
  currentTurn: null,     // turn id that can be cancelled
  turns: {},             // turn id -> rendered turn (see turnView)
  tools: {},             // call id -> rendered tool call (see toolView)
  awaitingNew: false,    // a user_turn without a conversation is on its way
  everOnline: false,     // distinguishes "connecting" from "reconnecting"
  retryMs: 500,
  retryTimer: null,
  seq: 0,
};

// -- token and HTTP ------------------------------------------------------------------------

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
  if (res.status === 401) { askToken(); throw new Error("unauthorised"); }
  const data = await res.json().catch(() => ({}));
  if (!res.ok) throw Object.assign(new Error(data.detail || res.statusText), { status: res.status, data });
  return data;
}

function askToken() {
  localStorage.removeItem("signalbox-token");
  $("token-form").hidden = false;
}

// -- WebSocket -----------------------------------------------------------------------------

function setConn(label) {
  const c = $("conn");
  c.textContent = label;
  c.className = `badge ${label}`;
  document.body.dataset.conn = label;
}

async function connect() {
  clearTimeout(state.retryTimer);
  state.retryTimer = null;
  setConn(state.everOnline ? "reconnecting" : "connecting");
  let ticket;
  try {
    ticket = (await api("POST", "/api/ws-tickets")).ticket;
  } catch (e) { return scheduleReconnect(); }
  const proto = location.protocol === "https:" ? "wss" : "ws";
  const ws = new WebSocket(`${proto}://${location.host}/ws?ticket=${encodeURIComponent(ticket)}`);
  state.ws = ws;
  ws.onopen = () => {
    setConn("online");
    state.everOnline = true;
    state.retryMs = 500;
    if (state.conversationId) subscribe(state.conversationId);
  };
  ws.onmessage = (msg) => onFrame(JSON.parse(msg.data));
  ws.onclose = () => {
    if (state.ws !== ws) return;
    state.ws = null;
    setConn("reconnecting");
    scheduleReconnect();
  };
}

function scheduleReconnect() {
  if (state.retryTimer) return;
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
  if (f.type === "ack" && f.conversation_id && f.conversation_id !== state.conversationId) {
    state.conversationId = f.conversation_id;
    state.awaitingNew = false;
    loadConversations();
  }
}

function onEvent(e) {
  if (!state.conversationId && state.awaitingNew) {
    // A new conversation's first events may overtake the ack that names it.
    state.conversationId = e.conversation_id;
    state.awaitingNew = false;
    loadConversations();
  }
  if (e.conversation_id !== state.conversationId) return;
  state.lastEventId[e.conversation_id] = e.id;
  logEvent(e);
  const d = e.data;
  const turn = e.turn_id ? turnView(e.turn_id) : null;
  switch (e.kind) {
    case "turn_queued":
      turn.user.textContent = d.text;
      setTurnStatus(turn, "queued");
      setCurrent(e.turn_id);
      break;
    case "turn_started":
      turn.startedTs = turn.startedTs || e.ts;
      turn.model = d.model;
      setTurnStatus(turn, "running");
      setCurrent(e.turn_id);
      turn.streaming = null;
      break;
    case "turn_resumed":
      // Deltas of the interrupted step are void; the step is streamed again.
      if (turn.streaming) turn.streaming.remove();
      turn.streaming = null;
      turnNote(turn, `resumed at step ${d.step} after its runner stopped`);
      setTurnStatus(turn, "running");
      break;
    case "text_delta":
      if (!turn.streaming) turn.streaming = turnItem(turn, el("div", "msg assistant streaming"));
      turn.streaming.textContent += d.text;
      break;
    case "assistant_message":
      (turn.streaming || turnItem(turn, el("div", "msg assistant"))).textContent = d.text;
      if (turn.streaming) turn.streaming.classList.remove("streaming");
      turn.streaming = null;
      break;
    case "tool_call_started":
      toolUpdate(turn, d.call_id, { tool: d.tool, input: d.input, status: "running", startedTs: e.ts, executor: d.executor });
      break;
    case "tool_call_needs_decision":
      toolUpdate(turn, d.call_id, { tool: d.tool, input: d.input, status: "needs_decision", expiresAt: d.expires_at });
      break;
    case "tool_call_decided":
      toolUpdate(turn, d.call_id, { status: d.decision === "allow" ? "allowed" : "denied" });
      break;
    case "tool_call_finished":
      toolUpdate(turn, d.call_id, { tool: d.tool, status: d.status, output: d.output, error: d.error, durationMs: d.duration_ms });
      break;
    case "proposal_created":
      turnNote(turn, `proposed ${d.files.map((f) => `${f.operation} ${f.path}`).join(", ")}: see Pending changes`);
      showProposal(d.proposal_id);
      break;
    case "proposal_resolved":
      showProposal(d.proposal_id);
      if (turn) turnNote(turn, `proposal ${d.status}`);
      break;
    case "question": questionView(turn, d); break;
    case "question_answered": answered(d.question_id); break;
    case "turn_finished":
      turn.streaming = null;
      turn.finished = { status: d.status, usage: d.usage || {}, error: d.error, ts: e.ts };
      setTurnStatus(turn, d.status);
      if (state.currentTurn === e.turn_id) setCurrent(null);
      break;
  }
}

function setCurrent(turnId) {
  state.currentTurn = turnId;
  $("cancel").disabled = !turnId;
}

// -- the turn timeline ---------------------------------------------------------------------

function turnView(turnId) {
  let t = state.turns[turnId];
  if (t) return t;
  const section = el("section", "turn");
  section.dataset.turnId = turnId;
  const user = el("div", "msg user");
  const body = el("div", "turn-body");
  const summary = el("div", "turn-summary");
  section.append(user, body, summary);
  $("transcript").append(section);
  t = state.turns[turnId] = { id: turnId, section, user, body, summary, streaming: null, tools: [], status: null };
  return t;
}

function turnItem(turn, node) {
  turn.body.append(node);
  node.scrollIntoView({ block: "end" });
  return node;
}

function turnNote(turn, text) {
  if (!turn) return note(text);
  turnItem(turn, el("div", "msg note", text));
}

function seconds(fromTs, toTs) {
  const ms = Date.parse(toTs) - Date.parse(fromTs);
  return Number.isFinite(ms) ? `${(ms / 1000).toFixed(1)} s` : "";
}

function setTurnStatus(turn, status) {
  turn.status = status;
  turn.section.dataset.status = status;
  const parts = [];
  const tools = turn.tools.map((id) => state.tools[id].tool);
  parts.push(tools.length ? `${tools.length} tool${tools.length > 1 ? "s" : ""} (${[...new Set(tools)].join(", ")})` : "no tools");
  if (turn.finished) {
    if (turn.startedTs) parts.push(seconds(turn.startedTs, turn.finished.ts));
    const u = turn.finished.usage;
    parts.push(`${(u.input_tokens || 0) + (u.output_tokens || 0)} tokens (${u.input_tokens || 0} in, ${u.output_tokens || 0} out)`);
    if (turn.finished.error) parts.push(turn.finished.error);
  }
  turn.summary.innerHTML = "";
  turn.summary.append(badge(status), " " + parts.join(" · "));
}

function toolView(turn, callId) {
  let t = state.tools[callId];
  if (t) return t;
  const details = el("details", "tool");
  details.dataset.callId = callId;
  details.dataset.statuses = "";
  const head = el("summary");
  const body = el("div", "tool-body");
  details.append(head, body);
  turnItem(turn, details);
  t = state.tools[callId] = { callId, turn, details, head, body, tool: "?", input: {}, status: null };
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
  t.head.innerHTML = "";
  const duration = t.durationMs != null ? `${t.durationMs} ms` : "";
  t.head.append(badge(t.status), " ", el("b", null, t.tool), " ", el("span", "duration", duration));
  if (t.status === "needs_decision") {
    for (const decision of ["allow", "deny"]) {
      const b = el("button", `decide ${decision}`, decision === "allow" ? "Allow" : "Deny");
      b.onclick = (ev) => { ev.preventDefault(); send({ type: "decide_tool", call_id: callId, decision }); };
      t.head.append(" ", b);
    }
  }
  t.body.innerHTML = "";
  t.body.append(el("div", "label", "input"), el("pre", "io input", JSON.stringify(t.input || {}, null, 2)));
  if (t.output != null || t.error) {
    t.body.append(el("div", "label", "output"), el("pre", "io output", t.output || ""));
    if (t.error) t.body.append(el("div", "label", "error"), el("pre", "io error", t.error));
  }
  setTurnStatus(turn, turn.status || "running");
}

function questionView(turn, d) {
  const box = el("div", "question");
  box.id = `question-${d.question_id}`;
  box.append(el("div", "q-text", `The agent asks: ${d.text}`));
  const answer = (text) => send({ type: "answer", question_id: d.question_id, text });
  if (d.options && d.options.length) {
    for (const option of d.options) {
      const b = el("button", "option", option);
      b.onclick = () => answer(option);
      box.append(b, " ");
    }
  } else {
    const form = el("form");
    const input = el("input");
    input.placeholder = "your answer";
    form.append(input, el("button", null, "Answer"));
    form.onsubmit = (ev) => { ev.preventDefault(); if (input.value.trim()) answer(input.value.trim()); };
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

// -- rendering helpers ---------------------------------------------------------------------

function note(text) {
  const div = el("div", "msg note", text);
  $("transcript").append(div);
  div.scrollIntoView({ block: "end" });
}

function badge(status) { return el("span", `badge ${status}`, status); }

function logEvent(e) {
  const li = el("li", null, `${e.id} ${e.kind}`);
  li.dataset.eventId = e.id;
  li.dataset.kind = e.kind;
  $("events").append(li);
  $("event-count").textContent = String($("events").children.length);
}

// -- pending changes -----------------------------------------------------------------------

async function showProposal(id) {
  let p;
  try { p = await api("GET", `/api/proposals/${encodeURIComponent(id)}`); } catch (e) { return note(`proposal ${id}: ${e.message}`); }
  let box = document.getElementById(`proposal-${id}`);
  if (!box) {
    box = el("div", "proposal");
    box.id = `proposal-${id}`;
    $("proposals").prepend(box);
  }
  box.dataset.status = p.status;
  box.innerHTML = "";
  const head = el("div", "proposal-head");
  head.append(badge(p.status), " ", el("b", null, p.summary || id));
  box.append(head);
  for (const f of p.files || []) {
    const file = el("details", "file");
    file.open = p.status === "pending";
    file.append(el("summary", null, `${f.operation} ${f.path}`), renderDiff(f.diff || ""));
    box.append(file);
  }
  if (p.status === "pending") {
    const row = el("div", "row");
    for (const [label, decision] of [["Approve", "approve"], ["Reject", "reject"]]) {
      const b = el("button", decision, label);
      b.onclick = () => decideProposal(id, decision);
      row.append(b);
    }
    box.append(row);
  }
  $("pending-count").textContent = String($("proposals").querySelectorAll('.proposal[data-status="pending"]').length);
}

function renderDiff(diff) {
  const pre = el("pre", "diff");
  for (const line of diff.split("\n")) {
    const span = el("span", null, line + "\n");
    if (line.startsWith("+") && !line.startsWith("+++")) span.className = "add";
    if (line.startsWith("-") && !line.startsWith("---")) span.className = "del";
    pre.append(span);
  }
  return pre;
}

async function decideProposal(id, decision) {
  try {
    await api("POST", `/api/proposals/${encodeURIComponent(id)}/${decision}`, decision === "reject" ? { reason: null } : {});
  } catch (e) { note(`${decision} ${id}: ${e.message}`); }
  showProposal(id);
}

function resetView() {
  for (const id of ["transcript", "proposals", "events"]) $(id).innerHTML = "";
  $("event-count").textContent = "0";
  $("pending-count").textContent = "0";
  state.turns = {};
  state.tools = {};
  setCurrent(null);
}

// -- conversations -------------------------------------------------------------------------

async function loadConversations() {
  const list = await api("GET", "/api/conversations");
  const ul = $("conversations");
  ul.innerHTML = "";
  for (const c of list) {
    const li = el("li", c.conversation_id === state.conversationId ? "active" : "", c.title || c.conversation_id);
    li.title = `${c.workspace} · ${c.created_at}`;
    li.dataset.conversationId = c.conversation_id;
    li.onclick = () => openConversation(c.conversation_id);
    ul.append(li);
  }
}

function openConversation(id) {
  if (state.conversationId && state.conversationId !== id) {
    send({ type: "unsubscribe", conversation_id: state.conversationId });
  }
  state.conversationId = id;
  delete state.lastEventId[id];  // a fresh view replays the conversation from its start
  resetView();
  subscribe(id);
  loadConversations();
}

// -- wiring --------------------------------------------------------------------------------

$("composer").onsubmit = (ev) => {
  ev.preventDefault();
  const text = $("text").value.trim();
  if (!text) return;
  const sent = send({ type: "user_turn", conversation_id: state.conversationId, text, client_turn_id: crypto.randomUUID() });
  if (sent) { $("text").value = ""; if (!state.conversationId) state.awaitingNew = true; }
};
$("text").onkeydown = (ev) => { if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) $("composer").requestSubmit(); };
$("cancel").onclick = () => { if (state.currentTurn) send({ type: "cancel", turn_id: state.currentTurn }); };
$("new-conv").onclick = () => {
  if (state.conversationId) send({ type: "unsubscribe", conversation_id: state.conversationId });
  state.conversationId = null;
  resetView();
  loadConversations();
};
$("token-form").onsubmit = (ev) => {
  ev.preventDefault();
  localStorage.setItem("signalbox-token", $("token-input").value.trim());
  location.reload();
};

// For tests and the curious: drop the socket as a network failure would.
window.signalbox = {
  state,
  drop() { if (state.ws) state.ws.close(4000, "dropped by the page"); },
};

state.token = readToken();
if (!state.token) askToken();
else { loadConversations().catch(() => {}); connect(); }
