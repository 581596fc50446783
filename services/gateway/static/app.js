// Signalbox web UI: one WebSocket, one conversation at a time, no build step.
"use strict";

const $ = (id) => document.getElementById(id);
const state = {
  token: null,
  ws: null,
  conversationId: null,
  lastEventId: {},       // conversation id -> last event id seen (resubscribe after reconnect)
  currentTurn: null,     // turn id that can be cancelled
  streaming: null,       // element receiving text_delta of the current model step
  tools: {},             // call id -> {li, started}
  awaitingNew: false,    // a user_turn without a conversation is on its way
  retryMs: 500,
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

function setConn(label) { const c = $("conn"); c.textContent = label; c.className = `badge ${label}`; }

async function connect() {
  setConn("connecting");
  let ticket;
  try {
    ticket = (await api("POST", "/api/ws-tickets")).ticket;
  } catch (e) { return scheduleReconnect(); }
  const proto = location.protocol === "https:" ? "wss" : "ws";
  const ws = new WebSocket(`${proto}://${location.host}/ws?ticket=${encodeURIComponent(ticket)}`);
  state.ws = ws;
  ws.onopen = () => {
    setConn("online");
    state.retryMs = 500;
    if (state.conversationId) subscribe(state.conversationId);
  };
  ws.onmessage = (msg) => onFrame(JSON.parse(msg.data));
  ws.onclose = () => { setConn("offline"); if (state.ws === ws) scheduleReconnect(); };
}

function scheduleReconnect() {
  setTimeout(connect, state.retryMs);
  state.retryMs = Math.min(state.retryMs * 2, 10000);
}

function send(frame) {
  if (!state.ws || state.ws.readyState !== WebSocket.OPEN) { note("not connected; try again"); return null; }
  frame.req = String(++state.seq);
  state.ws.send(JSON.stringify(frame));
  return frame.req;
}

function subscribe(conversationId) {
  send({ type: "subscribe", conversation_id: conversationId, after: state.lastEventId[conversationId] || null });
}

// -- frames and events ---------------------------------------------------------------------

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
  const d = e.data;
  switch (e.kind) {
    case "turn_queued": bubble("user", d.text); state.currentTurn = e.turn_id; $("cancel").disabled = false; break;
    case "turn_started": case "turn_resumed": state.currentTurn = e.turn_id; $("cancel").disabled = false; state.streaming = null; break;
    case "text_delta":
      if (!state.streaming) state.streaming = bubble("assistant", "");
      state.streaming.textContent += d.text;
      break;
    case "assistant_message":
      (state.streaming || bubble("assistant", "")).textContent = d.text;
      state.streaming = null;
      break;
    case "tool_call_started": toolRow(d.call_id, d.tool, "running", d.input); break;
    case "tool_call_needs_decision": toolRow(d.call_id, d.tool, "needs_decision", d.input, true); break;
    case "tool_call_decided": toolRow(d.call_id, null, d.decision === "allow" ? "running" : "denied"); break;
    case "tool_call_finished": toolRow(d.call_id, d.tool, d.status, null, false, d.duration_ms); break;
    case "proposal_created": showProposal(d.proposal_id); break;
    case "proposal_resolved": proposalStatus(d.proposal_id, d.status); break;
    case "question": note(`the agent asks: ${d.text}`); break;
    case "turn_finished":
      note(`turn ${d.status}${d.error ? ": " + d.error : ""}`);
      state.streaming = null;
      if (state.currentTurn === e.turn_id) { state.currentTurn = null; $("cancel").disabled = true; }
      break;
  }
}

// -- rendering -----------------------------------------------------------------------------

function bubble(role, text) {
  const div = document.createElement("div");
  div.className = `msg ${role}`;
  div.textContent = text;
  $("transcript").appendChild(div);
  div.scrollIntoView({ block: "end" });
  return div;
}

function note(text) { bubble("note", text); }

function toolRow(callId, tool, status, input, needsDecision, durationMs) {
  let t = state.tools[callId];
  if (!t) {
    const li = document.createElement("li");
    $("tools").prepend(li);
    t = state.tools[callId] = { li, tool, input, started: Date.now() };
  }
  if (tool) t.tool = tool;
  if (input) t.input = input;
  const duration = durationMs != null ? ` ${durationMs} ms` : "";
  t.li.innerHTML = "";
  t.li.append(badge(status), ` ${t.tool || "?"}${duration} `);
  const code = document.createElement("code");
  code.textContent = JSON.stringify(t.input || {}).slice(0, 160);
  t.li.append(document.createElement("br"), code);
  if (needsDecision) {
    for (const decision of ["allow", "deny"]) {
      const b = document.createElement("button");
      b.textContent = decision;
      b.onclick = () => send({ type: "decide_tool", call_id: callId, decision });
      t.li.append(" ", b);
    }
  }
}

function badge(status) {
  const s = document.createElement("span");
  s.className = `badge ${status}`;
  s.textContent = status;
  return s;
}

async function showProposal(id) {
  let p;
  try { p = await api("GET", `/api/proposals/${encodeURIComponent(id)}`); } catch (e) { return note(`proposal ${id}: ${e.message}`); }
  let box = document.getElementById(`proposal-${id}`);
  if (!box) {
    box = document.createElement("div");
    box.className = "proposal";
    box.id = `proposal-${id}`;
    $("proposals").prepend(box);
  }
  box.innerHTML = "";
  const head = document.createElement("div");
  head.append(badge(p.status), ` ${p.summary || id}`);
  box.append(head);
  for (const f of p.files || []) {
    const title = document.createElement("div");
    title.textContent = `${f.operation} ${f.path}`;
    box.append(title, renderDiff(f.diff || ""));
  }
  if (p.status === "pending") {
    for (const [label, decision] of [["Approve", "approve"], ["Reject", "reject"]]) {
      const b = document.createElement("button");
      b.textContent = label;
      b.onclick = () => decideProposal(id, decision);
      box.append(b, " ");
    }
  }
}

function renderDiff(diff) {
  const pre = document.createElement("pre");
  pre.className = "diff";
  for (const line of diff.split("\n")) {
    const span = document.createElement("span");
    if (line.startsWith("+") && !line.startsWith("+++")) span.className = "add";
    if (line.startsWith("-") && !line.startsWith("---")) span.className = "del";
    span.textContent = line + "\n";
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

function proposalStatus(id, status) {
  if (document.getElementById(`proposal-${id}`)) showProposal(id);
  else note(`proposal ${id}: ${status}`);
}

function resetView() {
  $("transcript").innerHTML = "";
  $("tools").innerHTML = "";
  $("proposals").innerHTML = "";
  state.tools = {};
  state.streaming = null;
  state.currentTurn = null;
  $("cancel").disabled = true;
}

// -- conversations -------------------------------------------------------------------------

async function loadConversations() {
  const list = await api("GET", "/api/conversations");
  const ul = $("conversations");
  ul.innerHTML = "";
  for (const c of list) {
    const li = document.createElement("li");
    li.textContent = c.title || c.conversation_id;
    li.title = `${c.workspace} · ${c.created_at}`;
    if (c.conversation_id === state.conversationId) li.className = "active";
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

state.token = readToken();
if (!state.token) askToken();
else { loadConversations().catch(() => {}); connect(); }
