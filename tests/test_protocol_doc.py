"""docs/protocol.md and the pydantic models of shared/ say the same thing, in both directions."""

from __future__ import annotations

import json
import re
import types
import typing
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
from pydantic import BaseModel

from signalbox.shared.events import EVENT_DATA
from signalbox.shared.ids import ID_MAX_CHARS
from signalbox.shared.proposals_api import (
    MAX_FILES,
    MAX_PATH_CHARS,
    MAX_REASON_CHARS,
    ProposalPublic,
)
from signalbox.shared.protocol import (
    CLIENT_FRAME_TYPES,
    ClientFrame,
    ErrorCode,
    FrameError,
    parse_client_frame,
)

DOC = Path(__file__).resolve().parent.parent / "docs" / "protocol.md"
_TICKED = re.compile(r"`([^`]+)`")
_OPEN, _CLOSE = "([{", ")]}"


def section(doc: str, heading: str) -> str:
    """The text under ``## heading`` up to the next ``## ``."""
    start = doc.index(f"## {heading}\n")
    end = doc.find("\n## ", start + 1)
    return doc[start : end if end != -1 else None]


def table_rows(text: str) -> list[list[str]]:
    """The body rows of the first markdown table in ``text`` (header and rule dropped)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("|")]
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    return rows[2:]


def split_top(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside brackets."""
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += (ch in _OPEN) - (ch in _CLOSE)
        if ch == sep and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    return [*parts, current]


def strip_groups(text: str) -> str:
    """``text`` without any bracketed part."""
    out, depth = "", 0
    for ch in text:
        depth += ch in _OPEN
        if depth == 0:
            out += ch
        depth -= ch in _CLOSE
    return out


def first_group(text: str, opener: str) -> str | None:
    """The inside of the first group opened by ``opener`` at depth 0, if any."""
    depth, start = 0, -1
    for i, ch in enumerate(text):
        if ch in _OPEN:
            if depth == 0 and ch == opener and start == -1:
                start = i + 1
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
            if depth == 0 and start != -1:
                return text[start:i]
    return None


class DocField(typing.NamedTuple):
    """A field the doc lists: its name, values it names, and nested fields of a sub-object."""

    name: str
    values: set[str]
    nested: list[DocField]


def doc_fields(text: str) -> list[DocField]:
    """Parse a data cell like ``a``, ``b`` (``x``/``y``), ``c``: [{``d``, ``e``}]."""
    text = text.split(" — ")[0]  # prose after a dash explains, it lists no field
    fields = []
    for item in split_top(text):
        names = _TICKED.findall(strip_groups(item).split(":")[0])
        if not names:
            continue
        _head, rest = item.split("`" + names[0] + "`", 1)
        values: set[str] = set()
        nested: list[DocField] = []
        inner = first_group(rest, "[") or first_group(rest, "{")
        if inner is not None:
            nested = doc_fields(first_group(inner, "{") or inner)
        else:
            group = first_group(rest, "(")
            listed = group if group is not None else rest.split(":", 1)[-1]
            if "/" in listed or " or " in listed:
                values = set(_TICKED.findall(listed))
        fields.append(DocField(names[0], values, nested))
    return fields


def literal_values(annotation: Any) -> set[str]:
    """Every string a Literal inside ``annotation`` (through Optional/Union) allows."""
    if get_origin(annotation) is typing.Literal:
        return {str(a) for a in get_args(annotation)}
    found: set[str] = set()
    for arg in get_args(annotation):
        found |= literal_values(arg)
    return found


def sub_model(annotation: Any) -> type[BaseModel] | None:
    """The model of an object or a list of objects field, if it is one."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (list, types.UnionType, typing.Union):
        for arg in get_args(annotation):
            model = sub_model(arg)
            if model is not None:
                return model
    return None


def check_fields(model: type[BaseModel], fields: list[DocField], where: str) -> None:
    """Each documented field exists on ``model`` and allows every value the doc names."""
    for f in fields:
        assert f.name in model.model_fields, f"{where}: {model.__name__} has no field {f.name!r}"
        annotation = model.model_fields[f.name].annotation
        missing = f.values - literal_values(annotation)
        assert not missing, f"{where}.{f.name}: values {sorted(missing)} not in the model"
        if f.nested:
            nested_model = sub_model(annotation)
            assert nested_model is not None, f"{where}.{f.name}: the model has no sub-object"
            check_fields(nested_model, f.nested, f"{where}.{f.name}")


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC.read_text()


def _first_cell_names(rows: list[list[str]]) -> list[str]:
    return [_TICKED.findall(row[0])[0] for row in rows]


def test_client_frames_match(doc: str) -> None:
    rows = table_rows(section(doc, "WebSocket frames, client → server"))
    documented = _first_cell_names(rows)
    union_types = {
        get_args(m.model_fields["type"].annotation)[0] for m in get_args(get_args(ClientFrame)[0])
    }
    assert set(documented) == set(CLIENT_FRAME_TYPES) == union_types


def test_event_kinds_and_their_data_match(doc: str) -> None:
    rows = table_rows(section(doc, "Event kinds"))
    documented = {_TICKED.findall(row[0])[0]: row[1] for row in rows}
    assert set(documented) == set(EVENT_DATA)
    for kind, cell in documented.items():
        fields = doc_fields(cell)
        assert fields, f"{kind}: no data fields parsed from {cell!r}"
        check_fields(EVENT_DATA[kind], fields, kind)


def test_error_codes_match(doc: str) -> None:
    match = re.search(r"Codes: (.*?)\.\n", section(doc, "WebSocket frames, server → client"), re.S)
    assert match, "the doc lists no error codes"
    assert set(_TICKED.findall(match.group(1))) == set(get_args(ErrorCode))


def test_the_parser_catches_drift() -> None:
    """A doc naming a field or value the model lacks fails, so the checks above can fail."""
    model = EVENT_DATA["tool_call_finished"]
    check_fields(model, doc_fields("`call_id`, `status` (`ok`/`lost`)"), "ok")
    with pytest.raises(AssertionError):
        check_fields(model, doc_fields("`call_id`, `no_such_field`"), "bad")
    with pytest.raises(AssertionError):
        check_fields(model, doc_fields("`status` (`ok`/`exploded`)"), "bad")
    with pytest.raises(AssertionError):
        nested = doc_fields("`files`: [{`path`, `colour`}]")
        check_fields(EVENT_DATA["proposal_created"], nested, "bad")


def test_the_proposal_json_matches_the_model_both_services_answer_with(doc: str) -> None:
    text = section(doc, "HTTP, proposals service")
    match = re.search(r"A proposal: (.*?)\.\n", text, re.S)
    assert match, "the doc does not say what a proposal is"
    check_fields(ProposalPublic, doc_fields(match.group(1)), "proposal")


def test_the_documented_limits_are_the_code_s(doc: str) -> None:
    """Each maximum the doc states for ids and the proposals routes is the constant enforcing it."""
    gateway = " ".join(section(doc, "HTTP, gateway (one base URL for clients)").split())
    proposals = " ".join(section(doc, "HTTP, proposals service").split())
    assert f"`_` and `-`, at most {ID_MAX_CHARS} characters" in gateway
    assert f"`_` and `-`, at most {ID_MAX_CHARS} characters" in proposals
    assert f"`reason` at most {MAX_REASON_CHARS} characters" in proposals
    assert f"at most {MAX_FILES} paths, each at most {MAX_PATH_CHARS} characters" in proposals


# -- the longest values ("## Longest values"), proved on the parser both ways -------------

_MINIMAL_FRAMES: dict[str, dict[str, Any]] = {
    "subscribe": {"conversation_id": "c"},
    "unsubscribe": {"conversation_id": "c"},
    "user_turn": {"text": "t"},
    "cancel": {"turn_id": "t"},
    "decide_tool": {"call_id": "c", "decision": "allow"},
    "decide_proposal": {"proposal_id": "p", "decision": "approve"},
    "answer": {"question_id": "q", "text": "a"},
    "tool_result": {"call_id": "c", "token": "t", "output": "o"},
    "ping": {},
}


def documented_maxima(doc: str) -> dict[str, int]:
    """``frame.field`` (``req``: every frame) -> the maximum the doc gives it."""
    found: dict[str, int] = {}
    for cell, limit in table_rows(section(doc, "Longest values")):
        for path in _TICKED.findall(strip_groups(cell)):
            found[path] = int(limit)
    return found


def _frame_with(path: str, size: int) -> dict[str, Any]:
    """A valid frame of ``path``'s type whose field ``path`` holds ``size`` characters/items."""
    kind, _, field = path.partition(".")
    frame: dict[str, Any] = {"type": kind, **_MINIMAL_FRAMES[kind]}
    if field == "client_tools":
        frame[field] = [{"name": f"t{i}"} for i in range(size)]
    elif field.startswith("client_tools."):
        frame["client_tools"] = [{"name": "t", field.split(".", 1)[1]: "x" * size}]
    else:
        frame[field] = "x" * size
    return frame


def _is_text(annotation: Any) -> bool:
    """``str``, also inside Optional or Annotated (not a dict or list keyed by str)."""
    if get_origin(annotation) in (types.UnionType, typing.Union):
        return any(_is_text(a) for a in get_args(annotation) if a is not type(None))
    if get_origin(annotation) is typing.Annotated:
        return _is_text(get_args(annotation)[0])
    return annotation is str


def _text_fields(model: type[BaseModel], prefix: str) -> set[str]:
    """``prefix.field`` of every free-text (str) field of ``model`` and of its sub-models."""
    found = set()
    for name, info in model.model_fields.items():
        if _is_text(info.annotation):
            found.add(f"{prefix}.{name}")
        nested = sub_model(info.annotation)
        if nested is not None:
            found.add(f"{prefix}.{name}")
            found |= _text_fields(nested, f"{prefix}.{name}")
    return found


def test_every_documented_maximum_is_the_parsers(doc: str) -> None:
    maxima = documented_maxima(doc)
    assert maxima, "the doc lists no longest values"
    for path, limit in maxima.items():
        paths = [f"{kind}.req" for kind in _MINIMAL_FRAMES] if path == "req" else [path]
        for one in paths:
            field = one.split(".", 1)[1]
            at_limit = _frame_with(one, limit)
            over = _frame_with(one, limit + 1)
            if field == "req":
                at_limit["req"], over["req"] = "r" * limit, "r" * (limit + 1)
            parse_client_frame(json.dumps(at_limit))
            with pytest.raises(FrameError) as refused:
                parse_client_frame(json.dumps(over))
            assert refused.value.code == "bad_frame", one


def test_every_free_text_of_a_client_frame_has_a_documented_maximum(doc: str) -> None:
    maxima = documented_maxima(doc)
    for model in get_args(get_args(ClientFrame)[0]):
        kind = get_args(model.model_fields["type"].annotation)[0]
        for path in _text_fields(model, kind) - {f"{kind}.type"}:
            field = path.split(".", 1)[1]
            assert path in maxima or (field == "req" and "req" in maxima), f"{path}: no maximum"
