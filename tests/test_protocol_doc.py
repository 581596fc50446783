"""docs/protocol.md and the pydantic models of shared/ say the same thing, in both directions."""

from __future__ import annotations

import re
import types
import typing
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
from pydantic import BaseModel

from shared.events import EVENT_DATA
from shared.protocol import CLIENT_FRAME_TYPES, ClientFrame, ErrorCode

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
