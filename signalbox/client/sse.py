"""Server-Sent Events read line by line: ``id:`` and ``data:`` fields, a blank line ends one."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from signalbox.shared.events import Event


def parse_event(obj: dict[str, Any]) -> Event:
    """An event frame as ``Event``; a kind newer than this SDK is kept, not refused."""
    try:
        return Event.model_validate(obj)
    except ValidationError:
        return Event.model_construct(**obj)


@dataclass
class SseParser:
    """Feed it lines; it returns each complete event (comments and ``retry:`` are skipped)."""

    _data: list[str] = field(default_factory=list)

    def feed(self, line: str) -> Event | None:
        """The event a blank ``line`` completes, else None."""
        if line == "":
            if not self._data:
                return None
            text, self._data = "\n".join(self._data), []
            return parse_event(json.loads(text))
        if line.startswith("data:"):
            self._data.append(line[5:].removeprefix(" "))
        return None  # id: is also in the event's JSON; ':' comments and retry: are ignored
