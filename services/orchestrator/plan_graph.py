"""A ``run_plan`` plan as a dependency graph: checked whole before anything runs, and the
references of a step's input resolved once the steps it names have ended.

A step's input may name an earlier step's result anywhere in a string:

    $steps.<save_as>.output                  the output, as the tool returned it (text)
    $steps.<save_as>.output.items[0].path    a path into that output read as JSON

The path is deliberately minimal and strict (no JSONPath library: filters, wildcards and
slices would make a reference mean many values): ``.key`` picks an object member (letters,
digits, ``_`` and ``-``), ``[n]`` a list element. A string that is exactly one reference is
replaced by the value itself (a number stays a number); a reference inside a longer string
is replaced by its text (a JSON value as compact JSON). Every ``$steps.`` must be such a
reference, so a typo is refused rather than sent to a tool as literal text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field, ValidationError

MAX_PLAN_STEPS = 32  # a plan is one tool result for the model: keep it readable
SAVE_AS_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,39}$"

_MARK = "$steps."
_REFERENCE = re.compile(
    r"\$steps\.(?P<name>[A-Za-z_][A-Za-z0-9_]*)\.output"
    r"(?P<path>(?:\.[A-Za-z0-9_-]+|\[\d+\])*)"
)
_SEGMENT = re.compile(r"\.([A-Za-z0-9_-]+)|\[(\d+)\]")


class PlanStepInput(BaseModel):
    """One step of ``run_plan``'s input: a tool call whose result is saved under a name."""

    save_as: str = Field(pattern=SAVE_AS_PATTERN)
    tool: str = Field(min_length=1)
    input: dict[str, Any] = Field(default_factory=dict)


class RunPlanInput(BaseModel):
    """Input of ``run_plan``."""

    steps: list[PlanStepInput] = Field(min_length=1)


@dataclass(frozen=True)
class GraphStep:
    """A checked step: its tool, raw input, the steps it waits for, and its level (0: none)."""

    save_as: str
    tool: str
    input: dict[str, Any]
    depends_on: tuple[str, ...]
    level: int


class BadPlan(ValueError):
    """A plan refused before anything ran; the message is what the model is told."""


class BadReference(ValueError):
    """A reference whose value is not there (the output is not JSON, the path misses)."""


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def references(value: Any) -> list[str]:
    """The step names a step's input refers to, in order of first use; ``BadPlan`` for a
    ``$steps.`` that is not a well-formed reference."""
    names: list[str] = []
    for text in _strings(value):
        start = text.find(_MARK)
        while start != -1:
            found = _REFERENCE.match(text, start)
            if found is None:
                snippet = text[start : start + 40]
                raise BadPlan(
                    f"bad reference {snippet!r}: write $steps.<save_as>.output, optionally "
                    "followed by .key or [n] into a JSON output"
                )
            if found["name"] not in names:
                names.append(found["name"])
            start = text.find(_MARK, found.end())
    return names


def check(raw: Mapping[str, Any], tools: Collection[str] | None) -> list[GraphStep]:
    """The plan as a graph in a runnable order, or ``BadPlan`` saying what is wrong with it:
    malformed, too many steps, a duplicate name, a tool not in ``tools`` (None: any), a
    reference to no step, or a cycle."""
    try:
        plan = RunPlanInput.model_validate(dict(raw))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "input"
        raise BadPlan(f"bad plan: {where}: {first['msg']}") from None
    if len(plan.steps) > MAX_PLAN_STEPS:
        raise BadPlan(f"bad plan: {len(plan.steps)} steps, at most {MAX_PLAN_STEPS}")
    names = [s.save_as for s in plan.steps]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise BadPlan(f"bad plan: save_as used twice: {', '.join(duplicates)}")
    depends: dict[str, list[str]] = {}
    for step in plan.steps:
        if tools is not None and step.tool not in tools:
            raise BadPlan(
                f"bad plan: step {step.save_as!r} calls {step.tool!r}, which a plan cannot "
                f"run (a plan step runs one of: {', '.join(sorted(tools or ())) or 'no tool'})"
            )
        try:
            refs = references(step.input)
        except BadPlan as exc:
            raise BadPlan(f"bad plan: step {step.save_as!r}: {exc}") from None
        for ref in refs:
            if ref not in names:
                raise BadPlan(f"bad plan: step {step.save_as!r} refers to no step {ref!r}")
        depends[step.save_as] = refs
    levels = _levels(depends)
    by_name = {s.save_as: s for s in plan.steps}
    return [
        GraphStep(name, by_name[name].tool, by_name[name].input, tuple(depends[name]), level)
        for name, level in sorted(levels.items(), key=lambda kv: (kv[1], names.index(kv[0])))
    ]


def _levels(depends: Mapping[str, list[str]]) -> dict[str, int]:
    """Each step's depth (Kahn's algorithm); ``BadPlan`` naming the steps of a cycle."""
    level: dict[str, int] = {}
    remaining = dict(depends)
    while remaining:
        ready = [n for n, deps in remaining.items() if all(d in level for d in deps)]
        if not ready:
            raise BadPlan(
                "bad plan: the steps refer to each other in a cycle: "
                + ", ".join(sorted(remaining))
            )
        for name in ready:
            level[name] = 1 + max((level[d] for d in remaining[name]), default=-1)
            del remaining[name]
    return level


def _follow(output: str, name: str, path: str) -> Any:
    if not path:
        return output
    try:
        value: Any = json.loads(output)
    except ValueError:
        raise BadReference(f"$steps.{name}.output is not JSON, so it has no {path}") from None
    for key, index in _SEGMENT.findall(path):
        if key and isinstance(value, dict) and key in value:
            value = value[key]
        elif index and isinstance(value, list) and int(index) < len(value):
            value = value[int(index)]
        else:
            raise BadReference(f"$steps.{name}.output{path}: no {key or f'[{index}]'} there")
    return value


def resolve(value: Any, outputs: Mapping[str, str]) -> Any:
    """``value`` with every reference replaced from ``outputs`` (each step's output by its
    ``save_as``); ``BadReference`` when a path does not lead anywhere."""
    if isinstance(value, Mapping):
        return {k: resolve(v, outputs) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, outputs) for v in value]
    if not isinstance(value, str) or _MARK not in value:
        return value
    whole = _REFERENCE.fullmatch(value)
    if whole is not None:
        return _follow(outputs[whole["name"]], whole["name"], whole["path"])

    def text_of(found: re.Match[str]) -> str:
        got = _follow(outputs[found["name"]], found["name"], found["path"])
        return got if isinstance(got, str) else json.dumps(got, separators=(",", ":"))

    return _REFERENCE.sub(text_of, value)
