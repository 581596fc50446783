"""Running calls: every outcome becomes one result; claims stop a redelivery running twice."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import pytest
import redis
from celery.exceptions import SoftTimeLimitExceeded
from pydantic import BaseModel

from signalbox.services.tools import test_tools
from signalbox.services.tools.batches import run_batch
from signalbox.services.tools.catalogue import CatalogueRefresher, load_tools
from signalbox.services.tools.execution import (
    OUTPUT_MAX_BYTES,
    Deps,
    cap_output,
    context_for,
    execute,
    run_call,
)
from signalbox.services.tools.registry import Registry, ToolContext, ToolError, ToolTimeout
from signalbox.shared.ids import new_id
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.tool_contract import (
    ToolResult,
    publish_catalogue,
    read_catalogue,
    withdraw_catalogue,
)
from signalbox.shared.workspace_paths import workspace_dir
from tests.tools.conftest import ToolEnv


class _Text(BaseModel):
    text: str = ""


def _registry() -> Registry:
    reg = Registry()

    @reg.tool(name="boom", description="raises a bug")
    def boom(args: _Text, ctx: ToolContext) -> str:
        raise KeyError(args.text)

    @reg.tool(name="refuse", description="raises a ToolError")
    def refuse(args: _Text, ctx: ToolContext) -> str:
        raise ToolError(f"cannot do {args.text!r}")

    @reg.tool(name="slow", description="hits its soft time limit")
    def slow(args: _Text, ctx: ToolContext) -> str:
        raise SoftTimeLimitExceeded()

    @reg.tool(name="stops_itself", description="stops its own work at its limit")
    def stops_itself(args: _Text, ctx: ToolContext) -> str:
        raise ToolTimeout(f"gave up at {ctx.timeout_s:g} s")

    @reg.tool(name="pause", description="takes a while")
    def pause(args: _Text, ctx: ToolContext) -> str:
        time.sleep(float(args.text))  # the running time under test, not a synchronisation
        return "done"

    @reg.tool(name="echo", description="returns its input")
    def echo(args: _Text, ctx: ToolContext) -> str:
        return args.text

    return reg


def _run(env: ToolEnv, tool: str, **tool_input: Any) -> ToolResult:
    request = env.request(tool, **tool_input)
    return execute(request, env.context(request.call_id), _registry())


def test_a_tool_bug_is_an_error_result_naming_the_value(tool_env: ToolEnv) -> None:
    result = _run(tool_env, "boom", text="the-key")
    assert result.status == "error" and "KeyError" in (result.error or "")
    assert "the-key" in (result.error or "")


def test_a_tool_error_reaches_the_model_as_is(tool_env: ToolEnv) -> None:
    result = _run(tool_env, "refuse", text="that")
    assert (result.status, result.error) == ("error", "cannot do 'that'")


def test_a_soft_time_limit_is_a_timeout_naming_the_limit(tool_env: ToolEnv) -> None:
    result = _run(tool_env, "slow")
    assert result.status == "timeout" and "time limit of 10 s" in (result.error or "")


def test_unknown_tools_and_bad_input_are_errors_naming_them(tool_env: ToolEnv) -> None:
    unknown = _run(tool_env, "nope")
    assert unknown.status == "error" and "'nope'" in (unknown.error or "")
    bad = _run(tool_env, "echo", text=["not", "a", "string"])
    assert bad.status == "error" and "text" in (bad.error or "") and "'not'" in (bad.error or "")


def test_output_is_capped_with_a_note(tool_env: ToolEnv) -> None:
    result = _run(tool_env, "echo", text="é" * OUTPUT_MAX_BYTES)
    assert len(result.output.encode()) < OUTPUT_MAX_BYTES + 100
    assert result.output.endswith(
        f"[output truncated: {2 * OUTPUT_MAX_BYTES} bytes, shown the first {OUTPUT_MAX_BYTES}]"
    )
    assert cap_output("short") == "short"
    assert result.duration_ms >= 0


def test_an_unreachable_proposals_service_is_an_error(tool_env: ToolEnv) -> None:
    result = tool_env.run("write_file", path="new.txt", content="x")
    assert result.status == "error" and "did not answer" in (result.error or "")


def test_specs_come_from_the_decorator_and_the_input_model() -> None:
    specs = {s.name: s for s in load_tools({}).specs()}
    assert set(specs) == {
        "list_dir", "read_file", "search_files", "write_file", "edit_file", "delete_file",
        "delete_directory", "run_python", "web_fetch", "current_time",
    }  # fmt: skip
    read = specs["read_file"]
    assert read.input_schema["required"] == ["path"]
    assert set(read.input_schema["properties"]) == {"path", "start_line", "end_line"}
    assert (read.mode, read.side_effect, read.idempotent) == ("auto", "read", True)
    write = specs["write_file"]
    assert (write.mode, write.side_effect, write.idempotent) == ("auto", "propose", False)
    fetch = specs["web_fetch"]
    assert (fetch.mode, fetch.side_effect) == ("confirm", "read")
    assert "sleep" in {s.name for s in load_tools({"SIGNALBOX_TEST_TOOLS": "1"}).specs()}


def test_a_tool_name_registered_twice_is_refused() -> None:
    reg = _registry()
    with pytest.raises(ValueError, match="'echo'"):

        @reg.tool(name="echo", description="again")
        def echo_again(args: _Text, ctx: ToolContext) -> str:
            return ""


def _deps(env: ToolEnv) -> Deps:
    return Deps(
        settings=env.settings,
        redis=env.redis,
        keys=env.keys,
        proposals=env.proposals,
        registry=load_tools({"SIGNALBOX_TEST_TOOLS": "1"}),
    )


def _results(client: redis.Redis, keys: RedisKeys, turn_id: str) -> list[ToolResult]:
    entries: Any = client.xrange(keys.tool_results(turn_id))
    return [ToolResult.model_validate_json(fields[b"r"]) for _id, fields in entries]


def test_a_claimed_call_of_a_non_idempotent_tool_is_not_run_again(tool_env: ToolEnv) -> None:
    counter = new_id("count")
    request = tool_env.request("count_calls", key=counter).model_dump(mode="json")
    first = run_call(request, _deps(tool_env))
    assert first is not None and (first.status, first.output) == ("ok", "1")
    assert run_call(request, _deps(tool_env)) is None
    assert tool_env.redis.get(test_tools.counter_key(tool_env.keys, counter)) == b"1"
    assert [r.output for r in _results(tool_env.redis, tool_env.keys, request["turn_id"])] == ["1"]


def test_an_idempotent_tool_runs_again_on_redelivery(tool_env: ToolEnv) -> None:
    request = tool_env.request("read_file", path="hello.txt").model_dump(mode="json")
    run_call(request, _deps(tool_env))
    run_call(request, _deps(tool_env))
    results = _results(tool_env.redis, tool_env.keys, request["turn_id"])
    assert [r.status for r in results] == ["ok", "ok"]


def test_run_call_publishes_errors_too(tool_env: ToolEnv) -> None:
    request = tool_env.request("read_file", path="../x").model_dump(mode="json")
    run_call(request, _deps(tool_env))
    bad_workspace = {
        **tool_env.request("list_dir").model_dump(mode="json"),
        "workspace": "../x",
        "turn_id": request["turn_id"],
    }
    run_call(bad_workspace, _deps(tool_env))
    malformed = {"call_id": new_id("call"), "turn_id": request["turn_id"], "tool": "read_file"}
    run_call(malformed, _deps(tool_env))
    results = _results(tool_env.redis, tool_env.keys, request["turn_id"])
    assert [r.status for r in results] == ["error", "error", "error"]
    assert "'..'" in (results[0].error or "")
    assert "'../x'" in (results[1].error or "")
    assert "user_id" in (results[2].error or "")


def test_the_catalogue_is_published_refreshed_and_withdrawn(
    redis_client: redis.Redis, keys: RedisKeys
) -> None:
    worker = new_id("worker")
    # Refreshed every 2 s, valid for 3 refreshes (6 s): long enough that a loaded machine
    # cannot let it lapse between publishing and the reads below.
    refresh_s = 2.0
    refresher = CatalogueRefresher(redis_client, keys, worker, load_tools({}).specs(), refresh_s)
    refresher.start()
    try:
        assert "read_file" in read_catalogue(redis_client, keys)
        ttl_ms: Any = redis_client.pttl(keys.tool_worker(worker))
        assert 0 < ttl_ms <= 3 * refresh_s * 1000  # it expires, after 3 refreshes at most
    finally:
        refresher.stop()
    assert redis_client.get(keys.tool_worker(worker)) is None
    assert redis_client.zscore(keys.tool_catalogue(), worker) is None


def test_the_catalogue_read_is_the_union_of_live_workers_and_drops_the_expired(
    redis_client: redis.Redis,
) -> None:
    """Read in one round trip (a Lua script): a worker past its expiry is dropped from the
    set and not offered, a worker whose catalogue key vanished is skipped, and a tool two
    live workers serve is offered once, as the worker first in the set describes it."""
    specs = {spec.name: spec for spec in load_tools({}).specs()}
    read, listed = specs["read_file"], specs["list_dir"]
    first, second, expired, vanished = (new_id("worker") for _ in range(4))
    keys = RedisKeys(f"sbtest-{new_id('catalogue')}:")  # no other test's workers in it
    publish_catalogue(redis_client, keys, first, [read.model_copy(update={"timeout_s": 7})], 60)
    publish_catalogue(redis_client, keys, second, [read, listed], 120)
    publish_catalogue(redis_client, keys, vanished, [listed], 90)
    redis_client.delete(keys.tool_worker(vanished))
    redis_client.zadd(keys.tool_catalogue(), {expired: time.time() - 1})
    redis_client.set(keys.tool_worker(expired), "[]")
    try:
        tools = read_catalogue(redis_client, keys)
        assert set(tools) >= {"read_file", "list_dir"}
        assert tools["read_file"].timeout_s == 7  # the first worker's
        assert redis_client.zscore(keys.tool_catalogue(), expired) is None
        assert read_catalogue(redis_client, keys) == tools  # by the script's digest, again
    finally:
        for worker in (first, second, vanished, expired):
            withdraw_catalogue(redis_client, keys, worker)


def test_a_tool_that_stops_itself_at_its_limit_ends_timeout(tool_env: ToolEnv) -> None:
    result = _run(tool_env, "stops_itself")
    assert (result.status, result.error) == ("timeout", "gave up at 30 s")


def test_the_running_time_is_measured_and_never_rounded_to_nothing(tool_env: ToolEnv) -> None:
    quick = _run(tool_env, "echo", text="x")
    assert quick.status == "ok" and quick.duration_ms >= 1
    slow = _run(tool_env, "pause", text="0.2")
    assert slow.status == "ok" and 200 <= slow.duration_ms < 20_000  # ms, not s or µs


def test_a_claim_still_holds_on_a_redis_that_forgot_its_scripts(tool_env: ToolEnv) -> None:
    # Claims go by the script's digest (EVALSHA); a restarted or flushed Redis has none.
    tool_env.redis.script_flush()
    counter = new_id("count")
    request = tool_env.request("count_calls", key=counter).model_dump(mode="json")
    first = run_call(request, _deps(tool_env))
    assert first is not None and first.status == "ok"
    assert run_call(request, _deps(tool_env)) is None  # the redelivery finds the claim
    assert tool_env.redis.get(test_tools.counter_key(tool_env.keys, counter)) == b"1"


def test_a_calls_workspace_is_under_the_resolved_root(tool_env: ToolEnv) -> None:
    deps = _deps(tool_env)
    request = tool_env.request("read_file", path="hello.txt")
    context = context_for(request, deps)
    assert context.workspace == workspace_dir(
        tool_env.settings.workspaces_root, request.user_id, request.workspace
    )
    with pytest.raises(ValueError, match="workspace name"):
        context_for(request.model_copy(update={"workspace": "../x"}), deps)


def test_a_call_its_worker_fails_to_run_is_reported_and_the_rest_of_its_batch_runs(
    tool_env: ToolEnv,
) -> None:
    first, second = (
        tool_env.request("count_quick", key="a"),
        tool_env.request("count_quick", key="b"),
    )
    second = second.model_copy(update={"turn_id": first.turn_id})
    deps = Deps(
        tool_env.settings, tool_env.redis, tool_env.keys, tool_env.proposals, tool_env.registry
    )
    ran: list[str] = []

    def run_one(raw: Mapping[str, Any], limit_s: float) -> str:
        ran.append(raw["call_id"])
        if raw["call_id"] == first.call_id:  # as a claim meeting Redis gone for good
            raise redis.ConnectionError("Connection refused")
        return "ok"

    statuses = run_batch(
        [first.model_dump(mode="json"), second.model_dump(mode="json")],
        deps,
        run_one,
        time.monotonic(),
    )

    assert statuses == ["failed", "ok"]
    assert ran == [first.call_id, second.call_id], "the call after the failure still ran"
    entries: Any = tool_env.redis.xrange(tool_env.keys.tool_results(first.turn_id))
    [reported] = [ToolResult.model_validate_json(fields[b"r"]) for _id, fields in entries]
    assert (reported.call_id, reported.status) == (first.call_id, "error")
    assert "ConnectionError: Connection refused" in (reported.error or "")
