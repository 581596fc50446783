"""How ``signalbox chat`` shows things: events, frames and proposals turned into text.

Pure: nothing here reads a socket or writes a terminal, so every line the chat prints can
be tested from a list of events. ``Renderer`` keeps the little state rendering needs (is
the cursor in the middle of streamed text, which tools a turn used, when it started).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

INPUT_PREVIEW_CHARS = 80  # one call per line: long inputs (file contents) are cut
OUTPUT_PREVIEW_CHARS = 100
OPERATION_MARK = {"create": "+", "update": "~", "delete": "-"}
STATUS_MARK = {"ok": "ok", "error": "!!", "timeout": "!!", "lost": "!!", "denied": "--"}


def short(text: str, limit: int) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def short_input(tool_input: Mapping[str, Any], limit: int = INPUT_PREVIEW_CHARS) -> str:
    """A tool call's input as ``key=value, ...`` on one line."""
    parts = [f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in tool_input.items()]
    return short(", ".join(parts), limit)


def format_duration(ms: float) -> str:
    """``850 ms``, ``2.3 s`` or ``4 min 5 s``."""
    if ms < 1000:
        return f"{ms:.0f} ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes} min {rest} s"


def _elapsed_ms(start: str, end: str) -> float | None:
    try:
        a = datetime.fromisoformat(start.replace("Z", "+00:00"))
        b = datetime.fromisoformat(end.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (b - a).total_seconds() * 1000


def render_proposal(proposal: Mapping[str, Any]) -> list[str]:
    """A proposal as GET /api/proposals/{id} returns it: header, then each file's diff."""
    lines = [
        f"proposal {proposal.get('proposal_id')} [{proposal.get('status')}]: "
        f"{proposal.get('summary', '')}"
    ]
    for f in proposal.get("files") or []:
        mark = OPERATION_MARK.get(str(f.get("operation")), "?")
        lines.append(f"  {mark} {f.get('path')} ({f.get('operation')})")
        diff = f.get("diff") or ""
        lines.extend(f"    {line}" for line in diff.splitlines())
    return lines


def proposal_list_line(proposal: Mapping[str, Any]) -> str:
    """One line of ``signalbox proposals list``."""
    files = proposal.get("files") or []
    paths = ", ".join(
        f"{OPERATION_MARK.get(str(f.get('operation')), '?')}{f.get('path')}" for f in files
    )
    return (
        f"{proposal.get('proposal_id')}  {proposal.get('created_at', '')}  "
        f"{short(str(proposal.get('summary', '')), 50)}  [{paths}]"
    )


@dataclass
class _Turn:
    started_ts: str | None = None
    tools: list[str] = field(default_factory=list)


@dataclass
class Renderer:
    """Turns server frames into terminal text, one frame at a time, in arrival order."""

    in_text: bool = False  # the last output was streamed text without its newline
    turns: dict[str, _Turn] = field(default_factory=dict)
    call_tools: dict[str, str] = field(default_factory=dict)

    def lines(self, lines: Iterable[str]) -> str:
        """``lines`` as a block of text, starting on a fresh line."""
        body = "".join(f"{line}\n" for line in lines)
        if not body:
            return ""
        prefix = "\n" if self.in_text else ""
        self.in_text = False
        return prefix + body

    def render(self, event: Mapping[str, Any]) -> str:
        """The text to print for one ``event`` frame ("" for events shown otherwise)."""
        kind = str(event.get("kind"))
        data: Mapping[str, Any] = event.get("data") or {}
        turn_id = event.get("turn_id")
        turn = self.turns.setdefault(str(turn_id), _Turn()) if turn_id else _Turn()
        if kind == "text_delta":
            text = str(data.get("text", ""))
            if text:
                self.in_text = not text.endswith("\n")
            return text
        if kind == "assistant_message":
            # The text came as deltas already; only the line needs ending.
            ended = "\n" if self.in_text else ""
            self.in_text = False
            return ended
        if kind == "turn_started":
            turn.started_ts = str(event.get("ts"))
        if kind == "tool_call_started":
            self.call_tools[str(data.get("call_id"))] = str(data.get("tool"))
        if kind == "tool_call_finished":
            turn.tools.append(str(data.get("tool")))
        return self.lines(self._event_lines(kind, data, event, turn))

    def _event_lines(
        self, kind: str, data: Mapping[str, Any], event: Mapping[str, Any], turn: _Turn
    ) -> list[str]:
        match kind:
            case "conversation_created":
                return [
                    f"== conversation {event.get('conversation_id')} "
                    f"(workspace {data.get('workspace')!r})"
                ]
            case "turn_queued":
                return [f"you: {data.get('text', '')}"]
            case "turn_started":
                return [f"-- turn started (model {data.get('model')})"]
            case "turn_resumed":
                return [
                    f"-- turn resumed at step {data.get('step')} after its runner stopped; "
                    "text since the last complete step may repeat"
                ]
            case "tool_call_started":
                where = " [on this client]" if data.get("executor") == "client" else ""
                return [f"-> {data.get('tool')}({short_input(data.get('input') or {})}){where}"]
            case "tool_call_needs_decision":
                return [
                    f"?? {data.get('tool')}({short_input(data.get('input') or {})}) needs "
                    f"your decision (call {data.get('call_id')}, until {data.get('expires_at')})"
                ]
            case "tool_call_decided":
                tool = self.call_tools.get(str(data.get("call_id")), "tool call")
                return [f"-- {tool} {data.get('call_id')}: {data.get('decision')}"]
            case "tool_call_finished":
                return [_finished_line(data)]
            case "proposal_created":
                files = ", ".join(
                    f"{OPERATION_MARK.get(str(f.get('operation')), '?')}{f.get('path')}"
                    for f in data.get("files") or []
                )
                return [f"** proposal {data.get('proposal_id')}: {data.get('summary')} [{files}]"]
            case "proposal_resolved":
                return [f"** proposal {data.get('proposal_id')}: {data.get('status')}"]
            case "question":
                options = data.get("options")
                extra = f" (options: {', '.join(map(str, options))})" if options else ""
                return [f"?? question {data.get('question_id')}: {data.get('text')}{extra}"]
            case "question_answered":
                return [f"-- question {data.get('question_id')} answered"]
            case "turn_finished":
                return [_summary_line(data, event, turn)]
            case _:  # a kind added to the protocol after this client was written
                return [f"-- {kind}: {short(json.dumps(dict(data)), OUTPUT_PREVIEW_CHARS)}"]

    def render_frame(self, frame: Mapping[str, Any]) -> str:
        """Text for a non-event frame worth showing (errors); "" for the rest."""
        if frame.get("type") == "error":
            return self.lines([f"error ({frame.get('code')}): {frame.get('message')}"])
        return ""


def _finished_line(data: Mapping[str, Any]) -> str:
    status = str(data.get("status"))
    mark = STATUS_MARK.get(status, "--")
    line = (
        f"{mark} {data.get('tool')} {status} in "
        f"{format_duration(float(data.get('duration_ms') or 0))}"
    )
    detail = data.get("error") if status != "ok" and data.get("error") else data.get("output")
    if detail:
        line += f": {short(str(detail), OUTPUT_PREVIEW_CHARS)}"
    return line


def _summary_line(data: Mapping[str, Any], event: Mapping[str, Any], turn: _Turn) -> str:
    usage: Mapping[str, Any] = data.get("usage") or {}
    parts = [f"{data.get('steps')} step(s)"]
    if turn.tools:
        counts: dict[str, int] = {}
        for tool in turn.tools:
            counts[tool] = counts.get(tool, 0) + 1
        named = ", ".join(f"{t} x{n}" if n > 1 else t for t, n in counts.items())
        parts.append(f"{len(turn.tools)} tool call(s): {named}")
    if turn.started_ts:
        elapsed = _elapsed_ms(turn.started_ts, str(event.get("ts")))
        if elapsed is not None:
            parts.append(format_duration(elapsed))
    # input_tokens is only what the prompt cache neither read nor wrote: the prompt is all three.
    prompt = sum(
        int(usage.get(k) or 0)
        for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    )
    cached = int(usage.get("cache_read_input_tokens") or 0)
    parts.append(
        f"tokens {prompt} in"
        + (f" ({cached} cached)" if cached else "")
        + f" / {usage.get('output_tokens', 0)} out"
    )
    line = f"== turn {data.get('status')}: " + "; ".join(parts)
    if data.get("error"):
        line += f"; error: {data.get('error')}"
    return line
