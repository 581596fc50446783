"""The extension-hook API a deployment writes its hooks against (docs/hooks.md).

A stable import for a deployment's own package (``from signalbox.hooks import Hook``), so
its hooks do not depend on where the orchestrator keeps them: the implementation lives in
``services/orchestrator/hooks.py`` and may move; this module's names stay.

Example (``acme/hooks.py``, installed through the ``signalbox.hooks`` entry-point group or
``SIGNALBOX_HOOK_MODULES='["acme.hooks"]'``)::

    from signalbox.hooks import Hook, ToolVerdict

    class NoDeletes(Hook):
        on_error = "fail_closed"

        def before_tool(self, ctx, tool, input):
            return ToolVerdict.deny("no deletes") if tool == "delete_file" else None

    hooks = [NoDeletes]
"""

from __future__ import annotations

from signalbox.services.orchestrator.hooks import (
    DEFAULT_HOOK_TIMEOUT_S,
    ENTRY_POINT_GROUP,
    HOOK_POINTS,
    Hook,
    HookPoint,
    OnError,
    ToolVerdict,
    TurnContext,
)
from signalbox.services.orchestrator.model import ModelRequest, ToolUse

__all__ = [
    "DEFAULT_HOOK_TIMEOUT_S",
    "ENTRY_POINT_GROUP",
    "HOOK_POINTS",
    "Hook",
    "HookPoint",
    "ModelRequest",
    "OnError",
    "ToolUse",
    "ToolVerdict",
    "TurnContext",
]
