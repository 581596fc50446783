"""MCP servers' tools: discovered from settings, named ``mcp__<server>__<tool>``, run by execute.

The server is ``tests/tools/mcp_server.py``, a real stdio MCP server started by the SDK.
"""

from __future__ import annotations

import json
import sys
import time

import pytest

from signalbox.services.tools.catalogue import worker_tools
from signalbox.services.tools.mcp_tools import tool_name
from signalbox.shared.settings import McpServerSettings, SettingsError, ToolsSettings, load
from tests.tools.conftest import ToolEnv

SERVER = [sys.executable, "-m", "tests.tools.mcp_server"]


def test_mcp_tools_are_discovered_and_called_through_the_registry(
    service_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tool_env: ToolEnv
) -> None:
    servers = {
        "calc": {"command": SERVER, "timeout_s": 12},
        "down": {"command": [sys.executable, "-c", "raise SystemExit(3)"]},
    }
    monkeypatch.setenv("SIGNALBOX_MCP_SERVERS", json.dumps(servers))
    registry = worker_tools(load(ToolsSettings), environ={})
    specs = {s.name: s for s in registry.specs()}
    assert {"mcp__calc__add", "mcp__calc__fail"} <= set(specs)
    assert not any(n.startswith("mcp__down__") for n in specs)  # left out, the rest served
    add = specs["mcp__calc__add"]
    assert add.input_schema["required"] == ["a", "b"]
    assert (add.timeout_s, add.mode, add.side_effect, add.queue) == (
        12.0,
        "confirm",
        "execute",
        "tools",
    )

    tool_env.registry = registry
    result = tool_env.run("mcp__calc__add", a=2, b=40)
    assert (result.status, result.output) == ("ok", "42"), result.error
    failed = tool_env.run("mcp__calc__fail", message="on purpose")
    assert failed.status == "error" and "MCP server 'calc'" in (failed.error or "")


def test_an_mcp_server_setting_needs_exactly_one_transport(
    service_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SIGNALBOX_MCP_SERVERS", json.dumps({"x": {}}))
    with pytest.raises(SettingsError, match="exactly one of command or url"):
        load(ToolsSettings)
    both = McpServerSettings.model_validate
    with pytest.raises(ValueError, match="exactly one"):
        both({"command": ["x"], "url": "http://127.0.0.1:1/mcp"})


def test_an_unreachable_http_server_is_left_out_quickly(service_env: dict[str, str]) -> None:
    settings = load(ToolsSettings).model_copy(
        update={"mcp_servers": {"web": McpServerSettings(url="http://127.0.0.1:9/mcp")}}
    )
    started = time.monotonic()
    registry = worker_tools(settings, environ={})
    assert not any(n.startswith("mcp__") for n in registry.names())
    assert time.monotonic() - started < 10


def test_tool_names_are_safe_for_the_model_api() -> None:
    assert tool_name("files", "read.file/v2") == "mcp__files__read_file_v2"
    assert len(tool_name("s" * 50, "t" * 50)) == 64
