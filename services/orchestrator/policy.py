r"""The tool-approval policy: may a call run at once, must a human decide, or is it refused?

Per tool: a ``mode`` (``auto``, ``confirm``, ``deny``) overriding the catalogue's, plus
``deny`` and ``allow`` regular expressions searched (``re.search``) in the call's input as
canonical JSON (``json.dumps(input, sort_keys=True)``). Order: deny patterns, then allow
patterns, then the mode. Rules under ``"*"`` apply to every tool; a tool's own ``mode``
wins over ``"*"``'s, which wins over the catalogue's.

As JSON (``SIGNALBOX_TOOL_POLICY``, or a file whose name does not end in ``.toml``)::

    {"tools": {"run_python": {"mode": "confirm", "allow": ["\"code\": \"print\\("]},
               "*": {"deny": ["\\.env\\b"]}}}

As TOML::

    [tools.run_python]
    mode = "confirm"
    allow = ['"code": "print\(']
    [tools."*"]
    deny = ['\.env\b']

An agent's ``approval`` overrides (shared/agents.py) apply on top, and only tighten
(``with_agent``).

It never fails open: an unreadable file, bad JSON or TOML, an unknown key or mode, or a
pattern that does not compile raises ``PolicyError`` when the orchestrator starts.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from signalbox.shared.settings import OrchestratorSettings
from signalbox.shared.tool_contract import ApprovalMode

ALL_TOOLS = "*"

Verdict = Literal["auto", "confirm", "deny"]


class PolicyError(ValueError):
    """The policy cannot be used; the orchestrator must not start with it."""


class ToolRule(BaseModel):
    """What the policy says about one tool (or ``*``)."""

    model_config = ConfigDict(extra="forbid")

    mode: ApprovalMode | None = None
    allow: list[str] = []
    deny: list[str] = []

    @field_validator("allow", "deny")
    @classmethod
    def _compiles(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"bad regular expression {pattern!r}: {exc}") from None
        return patterns


class _PolicyDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tools: dict[str, ToolRule] = {}


@dataclass(frozen=True)
class Decision:
    """The policy's verdict on one call, and why (for the event and the model)."""

    verdict: Verdict
    reason: str


@dataclass
class ToolPolicy:
    """Rules by tool name; ``decide`` applies them to one call."""

    rules: dict[str, ToolRule] = field(default_factory=dict)

    def decide(self, tool: str, tool_input: dict[str, Any], default_mode: ApprovalMode) -> Decision:
        """deny patterns → allow patterns → the mode (the tool's rule, ``*``'s, the catalogue's)."""
        text = json.dumps(tool_input, sort_keys=True, ensure_ascii=False)
        scoped = [r for r in (self.rules.get(ALL_TOOLS), self.rules.get(tool)) if r is not None]
        for rule in scoped:
            for pattern in rule.deny:
                if re.search(pattern, text):
                    return Decision("deny", f"the input matches the deny pattern {pattern!r}")
        for rule in scoped:
            for pattern in rule.allow:
                if re.search(pattern, text):
                    return Decision("auto", f"the input matches the allow pattern {pattern!r}")
        own, every = self.rules.get(tool), self.rules.get(ALL_TOOLS)
        if own is not None and own.mode is not None:
            return Decision(own.mode, f"the policy's mode for {tool!r}")
        if every is not None and every.mode is not None:
            return Decision(every.mode, "the policy's mode for every tool")
        return Decision(default_mode, f"the tool's own mode {default_mode!r}")


_STRICTNESS: dict[Verdict, int] = {"auto": 0, "confirm": 1, "deny": 2}


def with_agent(decision: Decision, tool: str, approval: Mapping[str, ApprovalMode]) -> Decision:
    """The deployment's ``decision`` with an agent's approval overrides on top.

    An agent (shared/agents.py) may make a tool stricter, never looser: its users define
    it, and the deployment's policy is the operator's. The strictest mode among the
    overrides whose name or fnmatch pattern matches ``tool`` wins if it is stricter.
    """
    modes = [mode for pattern, mode in approval.items() if fnmatchcase(tool, pattern)]
    if not modes:
        return decision
    strictest = max(modes, key=lambda m: _STRICTNESS[m])
    if _STRICTNESS[strictest] <= _STRICTNESS[decision.verdict]:
        return decision
    return Decision(strictest, f"the agent's approval mode for {tool!r}")


def parse_policy(raw: Any, source: str) -> ToolPolicy:
    """A policy from its decoded document; ``source`` names it in errors."""
    try:
        doc = _PolicyDoc.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'policy'}: {e['msg']}" for e in exc.errors()
        )
        raise PolicyError(f"tool policy {source} is not usable: {problems}") from None
    return ToolPolicy(dict(doc.tools))


def read_policy_file(path: Path) -> ToolPolicy:
    """A policy from a ``.toml`` file, or JSON for any other name."""
    try:
        body = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(f"cannot read the tool policy file {str(path)!r}: {exc}") from None
    try:
        raw: Any = tomllib.loads(body) if path.suffix.lower() == ".toml" else json.loads(body)
    except (tomllib.TOMLDecodeError, ValueError) as exc:
        raise PolicyError(f"tool policy file {str(path)!r} does not parse: {exc}") from None
    return parse_policy(raw, repr(str(path)))


def merge(first: ToolPolicy, then: ToolPolicy) -> ToolPolicy:
    """``then`` applied after ``first``: its modes win, patterns of both apply."""
    rules = dict(first.rules)
    for tool, rule in then.rules.items():
        before = rules.get(tool)
        if before is None:
            rules[tool] = rule
        else:
            rules[tool] = ToolRule(
                mode=rule.mode if rule.mode is not None else before.mode,
                allow=[*before.allow, *rule.allow],
                deny=[*before.deny, *rule.deny],
            )
    return ToolPolicy(rules)


def load_policy(settings: OrchestratorSettings) -> ToolPolicy:
    """The deployment's policy: the file (if set), then ``SIGNALBOX_TOOL_POLICY`` (if set)."""
    policy = ToolPolicy()
    if settings.tool_policy_file is not None:
        policy = read_policy_file(settings.tool_policy_file)
    if settings.tool_policy is not None:
        policy = merge(policy, parse_policy(settings.tool_policy, "SIGNALBOX_TOOL_POLICY"))
    return policy
