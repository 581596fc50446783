"""The offline demo model: used when no ANTHROPIC_API_KEY is set, so the whole flow can be
tried without an account. It is no language model: it reads the last user text for a few
requests ("look around", "create X", "change X replacing A with B"), asks for the matching
tools one step at a time, and summarises the results. Every step's text starts with
``DEMO_LABEL`` so nobody mistakes it for a real model.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from signalbox.services.orchestrator import prompt_cache
from signalbox.services.orchestrator.demo_cache import DemoPromptCache
from signalbox.services.orchestrator.model import (
    ModelEvent,
    ModelRequest,
    StepEnd,
    TextDelta,
    ThinkingBlock,
    ThinkingDelta,
    ToolUse,
)

DEMO_LABEL = "[offline demo model — set ANTHROPIC_API_KEY for a real one] "
DEMO_MODEL_NAME = "signalbox-offline-demo"
DEFAULT_NOTE_PATH = "NOTES.md"
CHARS_PER_TOKEN = 4  # rough, only to report plausible usage figures

_EXPLORE = re.compile(
    r"look around|explore|what'?s here|what is here|\blist\b|\bls\b", re.IGNORECASE
)
_EDIT = re.compile(
    r"\b(?:change|edit)\s+(?P<path>[\w./-]+)\s+replacing\s+(?P<old>.+?)\s+with\s+(?P<new>.+?)\s*$",
    re.IGNORECASE | re.DOTALL,
)
_WRITE = re.compile(r"\b(?:create|write|add)\b", re.IGNORECASE)
_FILENAME = re.compile(r"(?<![\w/.-])([\w-][\w./-]*\.[A-Za-z0-9]{1,8})\b")
_CONTENT = re.compile(r"\b(?:with|containing|saying)\s+(?P<content>.+)$", re.IGNORECASE | re.DOTALL)
_PROPOSAL_ID = re.compile(r"proposal_id\s+([\w-]+)")
_PLAN = re.compile(r"\bplan\b", re.IGNORECASE)
PLAN_NOTE_PATH = "PLAN-NOTES.md"
# "wake me in 30 seconds to check the build": one ``alarm`` call, the rest its note.
_ALARM = re.compile(
    r"\bwake me in (?P<seconds>\d+) seconds?\b\W*(?:to\s+)?(?P<note>.*)$", re.IGNORECASE | re.DOTALL
)
# The demo's plan (run_plan): two independent steps, then one that uses both outputs.
DEMO_PLAN_STEPS: tuple[dict[str, Any], ...] = (
    {"save_as": "ls", "tool": "list_dir", "input": {"path": "."}},
    {"save_as": "todos", "tool": "search_files", "input": {"pattern": "TODO|FIXME"}},
    {
        "save_as": "notes",
        "tool": "write_file",
        "input": {
            "path": PLAN_NOTE_PATH,
            "content": "# Workspace\n\n$steps.ls.output\n\n# TODO/FIXME\n\n$steps.todos.output\n",
        },
    },
)


@dataclass(frozen=True)
class _Action:
    """One step of the plan: what to say and which tools to call, in parallel."""

    say: str
    calls: tuple[tuple[str, dict[str, Any]], ...]


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"`":
        return value[1:-1]
    return value


def plan(text: str) -> list[_Action]:
    """The steps the demo model takes for ``text``: look around, then write, then edit; or,
    when the text asks for a plan, one ``run_plan`` doing the looking and the writing."""
    actions: list[_Action] = []
    alarm = _ALARM.search(text)
    if alarm:
        seconds = int(alarm.group("seconds"))
        note = alarm.group("note").strip() or "you asked to be woken now"
        call = ("alarm", {"in_minutes": max(seconds, 1) / 60, "note": note})
        return [_Action(f"I will set an alarm to wake me in {seconds} s.", (call,))]
    if _PLAN.search(text):
        return [
            _Action(
                "I will run it as one plan: list the workspace and search it for TODO/FIXME "
                f"at once, then propose {PLAN_NOTE_PATH} made of both results.",
                (("run_plan", {"steps": [dict(step) for step in DEMO_PLAN_STEPS]}),),
            )
        ]
    if _EXPLORE.search(text):
        actions.append(
            _Action(
                "Let me look around: I will list the workspace and search it for TODO/FIXME "
                "notes, both at once.",
                (("list_dir", {"path": "."}), ("search_files", {"pattern": "TODO|FIXME"})),
            )
        )
    edit = _EDIT.search(text)
    rest = text[: edit.start()] + text[edit.end() :] if edit else text
    verb = _WRITE.search(rest)
    if verb:
        after_verb = rest[verb.end() :]
        name = _FILENAME.search(after_verb)
        path = name.group(1) if name else DEFAULT_NOTE_PATH
        content_match = _CONTENT.search(after_verb)
        content = (
            _unquote(content_match.group("content")) + "\n"
            if content_match
            else "Written by the Signalbox offline demo model.\n"
        )
        actions.append(
            _Action(
                f"I will propose writing {path}; a human approves it before it is written.",
                (("write_file", {"path": path, "content": content}),),
            )
        )
    if edit:
        path = edit.group("path")
        old, new = _unquote(edit.group("old")), _unquote(edit.group("new"))
        actions.append(
            _Action(
                f"I will propose changing {path}, replacing {old!r} with {new!r}.",
                (("edit_file", {"path": path, "old_str": old, "new_str": new}),),
            )
        )
    return actions


def _last_user_text(messages: list[dict[str, Any]]) -> tuple[int, str]:
    for i in range(len(messages) - 1, -1, -1):
        msg = messages[i]
        if msg.get("role") != "user":
            continue
        content = msg.get("content")
        if isinstance(content, str):
            return i, content
        texts = [b.get("text", "") for b in content or [] if b.get("type") == "text"]
        if texts:
            return i, "\n".join(texts)
    return -1, ""


def _result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, list):
        return "\n".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
    return str(content or "")


def chat_reply(text: str) -> str:
    """The answer of a chat-mode agent (no tools offered): text alone, streamed as usual."""
    quoted = " ".join(text.split())[:200]
    return (
        f"Chat mode: no tools are offered, so I only answer in text. You said: {quoted!r}. "
        "Pick an agent in `agent` mode to let me look around or change files."
    )


def _thinking(text: str, calls: int) -> Iterator[ModelEvent]:
    """A short, honest thinking block: what the demo's plan makes of the request."""
    thought = f"(demo thinking) The user wrote {text[:60]!r}. " + (
        f"I will call {calls} tool(s) next." if calls else "Time to summarise."
    )
    for chunk in re.findall(r"\S+\s*", thought):
        yield ThinkingDelta(chunk)
    signature = "demo-" + hashlib.sha256(thought.encode()).hexdigest()[:32]
    yield ThinkingBlock({"type": "thinking", "thinking": thought, "signature": signature})


class DemoModel:
    """``Model`` that needs no network: deterministic, clearly labelled, tool-driven. Its
    usage is reported as the API would, prompt cache included (``demo_cache.py``)."""

    def __init__(self, cache_ttl: prompt_cache.CacheTtl | None = "5m") -> None:
        self._cache_ttl = cache_ttl
        self._cache = DemoPromptCache()

    provider = "signalbox.demo"  # gen_ai.provider.name of its spans (spans.py)

    @property
    def name(self) -> str:
        """The name reported in ``turn_started``."""
        return DEMO_MODEL_NAME

    def stream(self, request: ModelRequest) -> Iterator[ModelEvent]:
        """One step: the next planned tool calls, or the closing summary."""
        start, text = _last_user_text(request.messages)
        since = request.messages[start + 1 :] if start >= 0 else []
        offered = {t.name for t in request.tools}
        actions = plan(text) if request.tools else []  # chat mode offers no tools
        runnable = [a for a in actions if all(name in offered for name, _ in a.calls)]
        missing = [a for a in actions if a not in runnable]
        tool_steps = sum(
            1
            for m in since
            if m.get("role") == "assistant"
            and any(b.get("type") == "tool_use" for b in m.get("content") or [])
        )
        if tool_steps < len(runnable):
            action = runnable[tool_steps]
            say = DEMO_LABEL + action.say
            calls = [
                ToolUse(f"toolu_demo_{len(request.messages)}_{i}", name, dict(args))
                for i, (name, args) in enumerate(action.calls)
            ]
        elif not request.tools:
            say = DEMO_LABEL + chat_reply(text)
            calls = []
        else:
            say = DEMO_LABEL + self._summary(request.messages, since, actions, missing)
            calls = []
        if request.thinking_budget_tokens is not None:  # the agent thinks: show it
            yield from _thinking(text, len(calls))
        for chunk in re.findall(r"\S+\s*", say) or [say]:
            yield TextDelta(chunk)
        yield from calls
        tools = [
            {"name": t.name, "description": t.description, "input_schema": t.input_schema}
            for t in request.tools
        ]
        prompt = prompt_cache.mark(request.system, tools, request.messages, self._cache_ttl)
        fresh, written, read = self._cache.usage(prompt)
        output_chars = len(say) + sum(len(json.dumps(c.input)) for c in calls)
        yield StepEnd(
            "tool_use" if calls else "end_turn",
            fresh,
            max(1, output_chars // CHARS_PER_TOKEN),
            written,
            read,
            DEMO_MODEL_NAME,
        )

    def _summary(
        self,
        messages: list[dict[str, Any]],
        since: list[dict[str, Any]],
        actions: list[_Action],
        missing: list[_Action],
    ) -> str:
        if not actions:
            return (
                "I am not a language model, only a stand-in that can show the flow. Try "
                "'look around', 'create hello.txt with Hello!', or "
                "'change hello.txt replacing Hello with Goodbye'."
            )
        names: dict[str, str] = {}
        for m in messages:
            if m.get("role") == "assistant":
                for b in m.get("content") or []:
                    if b.get("type") == "tool_use":
                        names[b["id"]] = b["name"]
        lines: list[str] = []
        for m in since:
            if m.get("role") != "user" or not isinstance(m.get("content"), list):
                continue
            for b in m["content"]:
                if b.get("type") != "tool_result":
                    continue
                tool = names.get(b.get("tool_use_id", ""), "a tool")
                output = _result_text(b)
                status = "failed" if b.get("is_error") else "ok"
                line = f"- {tool}: {status}"
                proposal = _PROPOSAL_ID.search(output)
                if proposal:
                    line += f", proposal {proposal.group(1)} awaits your approval"
                elif output:
                    first = output.strip().splitlines()[0] if output.strip() else ""
                    line += f" ({first[:80]})" if first else ""
                lines.append(line)
        body = "Done. Here is what the tools reported:\n" + "\n".join(lines or ["- (no results)"])
        if missing:
            unavailable = sorted({n for a in missing for n, _ in a.calls})
            body += "\nNo live tool worker offers: " + ", ".join(unavailable) + "."
        return body
