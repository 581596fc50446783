"""What the tool registry and path confinement cost per call, in process, with no broker.

Measured: ``execute()`` of ``read_file`` on a small file (input validation by the tool's
pydantic model, workspace confinement, the O_NOFOLLOW open, output capping, the result
model). Baseline: the same file read with a bare ``open().read()``. Issue 4 asks for this
figure; it has no target, so the verdict is left empty.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import httpx
import redis

from bench.stats import Result, Series
from signalbox.services.tools.execution import execute
from signalbox.services.tools.registry import ToolContext
from signalbox.services.tools.workspace_tools import registry as workspace_registry
from signalbox.shared.ids import new_id
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.settings import ToolsSettings
from signalbox.shared.tool_contract import ToolCallRequest

FILE_TEXT = "".join(f"line {i}: the quick brown fox\n" for i in range(40))  # ~1.2 KB


def _time_us(fn: object, rounds: int) -> list[float]:
    assert callable(fn)
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1e6)
    return samples


def tool_overhead(rounds: int, warmup: int) -> list[Result]:
    """``read_file`` through the registry vs a bare read of the same file, in microseconds."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        workspace = root / "user_bench" / "default"
        workspace.mkdir(parents=True)
        (workspace / "notes.txt").write_text(FILE_TEXT)
        settings = ToolsSettings(internal_token="bench-internal-token-0000", workspaces_root=root)
        # Never used by read_file: present only because a context carries them.
        client = redis.Redis(host="127.0.0.1", port=1)
        with httpx.Client() as http:
            context = ToolContext(
                workspace=workspace.resolve(),
                user_id="user_bench",
                conversation_id="conv_bench",
                turn_id="turn_bench",
                call_id="call_bench",
                workspace_name="default",
                settings=settings,
                proposals=http,
                redis=client,
                keys=RedisKeys("bench:"),
                timeout_s=10.0,
            )
            request = ToolCallRequest(
                call_id=new_id("call"),
                turn_id="turn_bench",
                conversation_id="conv_bench",
                user_id="user_bench",
                workspace="default",
                tool="read_file",
                input={"path": "notes.txt"},
                timeout_s=10.0,
            )
            path = workspace / "notes.txt"

            def through_registry() -> None:
                result = execute(request, context, workspace_registry)
                assert result.status == "ok", result.error

            def bare() -> None:
                with open(path) as f:
                    f.read()

            _time_us(through_registry, warmup)
            _time_us(bare, warmup)
            measured: list[float] = []
            baseline: list[float] = []
            for _ in range(rounds):  # interleaved, so drift hits both alike
                measured.extend(_time_us(through_registry, 1))
                baseline.extend(_time_us(bare, 1))
        client.close()
    return [
        Result(
            id="tool_overhead",
            what="read_file through the registry and confinement, in process (µs per call)",
            measured=Series("registry + confinement", measured, unit="µs"),
            baseline=Series("bare open().read()", baseline, unit="µs"),
            target="reported only (issue 4)",
            met=None,
        )
    ]
