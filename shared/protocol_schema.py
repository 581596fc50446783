"""A JSON Schema of the WebSocket protocol, generated from the models that speak it.

Client frames come from ``shared/protocol.py`` (``ClientFrame``), server frames from the
same module (``ack``, ``error``, ``pong``, ``heartbeat``) and from ``shared/events.py`` (one
``event`` envelope per kind, its ``data`` that kind's model). The document is committed as
``docs/protocol.schema.json`` so a client in any language can check or generate its types;
``tests/shared/test_protocol_schema.py`` fails when it is stale. Regenerate with::

    python -m signalbox.shared.protocol_schema
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, Literal, Union, cast

from pydantic import BaseModel, Field, TypeAdapter, create_model

from signalbox.shared.events import EVENT_DATA
from signalbox.shared.protocol import Ack, ClientFrame, ErrorFrame, Heartbeat, Pong
from signalbox.shared.timestamps import RFC3339_PATTERN

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "docs" / "protocol.schema.json"
SCHEMA_ID = "https://signalbox.dev/protocol.schema.json"


class _EventEnvelope(BaseModel):
    """The fields every ``event`` frame has, whatever its kind."""

    type: Literal["event"] = "event"
    conversation_id: str
    id: str = Field(pattern=r"^\d+-\d+$", description="the stream id; resume after it")
    turn_id: str | None
    ts: str = Field(pattern=RFC3339_PATTERN, description="RFC 3339, UTC, milliseconds, Z")


def _event_model(kind: str, data: type[BaseModel]) -> type[BaseModel]:
    """The ``event`` frame of one kind: the envelope with ``kind`` fixed and ``data`` typed."""
    name = "".join(part.title() for part in kind.split("_")) + "Event"
    model: type[BaseModel] = create_model(
        name,
        __base__=_EventEnvelope,
        __doc__=f"An ``event`` frame of kind ``{kind}``.",
        kind=(cast(Any, Literal[kind]), ...),
        data=(data, ...),
    )
    return model


def _server_frame() -> Any:
    """The union of every frame the server sends; events told apart by ``kind``."""
    events = tuple(_event_model(kind, data) for kind, data in EVENT_DATA.items())
    event = Annotated[Union[events], Field(discriminator="kind")]  # type: ignore[valid-type]  # noqa: UP007
    return Union[event, Ack, ErrorFrame, Pong, Heartbeat]  # noqa: UP007


def _defs_and_root(
    adapter: TypeAdapter[Any], mode: Literal["validation", "serialization"]
) -> tuple[dict[str, Any], dict[str, Any]]:
    schema = adapter.json_schema(mode=mode, ref_template="#/$defs/{model}")
    defs = schema.pop("$defs", {})
    return defs, schema


def protocol_schema() -> dict[str, Any]:
    """The JSON Schema document: ``#/$defs/ClientFrame`` and ``#/$defs/ServerFrame``."""
    client_defs, client = _defs_and_root(TypeAdapter(ClientFrame), "validation")
    server_defs, server = _defs_and_root(TypeAdapter(_server_frame()), "serialization")
    clash = {
        name for name in client_defs.keys() & server_defs.keys()
        if client_defs[name] != server_defs[name]
    }  # fmt: skip
    if clash:
        raise ValueError(f"a model name means two things in the schema: {sorted(clash)}")
    defs = {**client_defs, **server_defs}
    defs["ClientFrame"] = {"description": "A frame a client sends.", **client}
    defs["ServerFrame"] = {"description": "A frame the server sends.", **server}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "Signalbox WebSocket protocol",
        "description": (
            "Every frame of GET /ws, either way (docs/protocol.md). Generated from "
            "shared/protocol.py and shared/events.py by "
            "`python -m signalbox.shared.protocol_schema`."
        ),
        "anyOf": [{"$ref": "#/$defs/ClientFrame"}, {"$ref": "#/$defs/ServerFrame"}],
        "$defs": dict(sorted(defs.items())),
    }


def render() -> str:
    """The schema as it is committed: indented, keys in a stable order, a final newline."""
    return json.dumps(protocol_schema(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    """Write the schema to ``argv[0]`` (default ``docs/protocol.schema.json``)."""
    path = Path(argv[0]) if argv else SCHEMA_PATH
    path.write_text(render(), encoding="utf-8")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
