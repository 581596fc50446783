"""Running one tool call: claim it, run the tool, turn every outcome into one ``ToolResult``.

Everything here is plain Python, testable without a broker; ``tasks.run_tool`` only calls
``run_call``. A call always ends in a published result (ok, error or timeout), except a
redelivered call of a non-idempotent tool, which is skipped because it already ran. A
publish that meets a Redis blip is retried (``publishing.py``); while the call runs, the
worker's main process keeps its heartbeat alive (``heartbeat.py``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import httpx
import redis
from celery.exceptions import SoftTimeLimitExceeded
from opentelemetry.trace import Status, StatusCode
from pydantic import ValidationError

from signalbox.services.tools.proposals_client import make_client
from signalbox.services.tools.publishing import publish_retrying
from signalbox.services.tools.registry import (
    Registry,
    ToolContext,
    ToolError,
    ToolOutput,
    ToolTimeout,
)
from signalbox.shared.redis_clients import sync_client
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.settings import ToolsSettings
from signalbox.shared.tool_contract import (
    Claim,
    ResultStatus,
    ToolCallRequest,
    ToolResult,
    claim_call,
)
from signalbox.shared.tracing import Attributes, tracer
from signalbox.shared.workspace_paths import PathOutsideWorkspace, check_workspace_name

log = logging.getLogger(__name__)

OUTPUT_MAX_BYTES = 64 * 1024  # more than a model can use in one tool_result
INPUT_PREVIEW_CHARS = 200  # how much of a bad input value an error message repeats


@dataclass(frozen=True)
class Deps:
    """What running calls needs from the worker process: settings, Redis, HTTP, the tools."""

    settings: ToolsSettings
    redis: redis.Redis
    keys: RedisKeys
    proposals: httpx.Client
    registry: Registry

    @cached_property
    def workspaces_root(self) -> Path:
        """The workspaces root, resolved once per process (not per call: a ``realpath``
        walk of every component, a syscall each)."""
        return self.settings.workspaces_root.resolve()

    @classmethod
    def create(cls, settings: ToolsSettings, registry: Registry) -> Deps:
        """Connections built from ``settings`` (call after fork: clients are per process)."""
        return cls(
            settings=settings,
            redis=sync_client(settings.redis_url),
            keys=RedisKeys(settings.redis_prefix),
            proposals=make_client(settings.proposals_url, settings.internal_token),
            registry=registry,
        )


def cap_output(text: str, limit: int = OUTPUT_MAX_BYTES) -> str:
    """``text`` cut to ``limit`` UTF-8 bytes, with a note saying how much was dropped."""
    data = text.encode()
    if len(data) <= limit:
        return text
    kept = data[:limit].decode(errors="ignore")  # ignore: the cut may split a character
    return kept + f"\n[output truncated: {len(data)} bytes, shown the first {limit}]"


def _problems(exc: ValidationError) -> str:
    problems = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "input"
        if err["type"] == "missing":
            problems.append(f"{where}: {err['msg']}")
        else:
            given = repr(err.get("input"))[:INPUT_PREVIEW_CHARS]
            problems.append(f"{where}: {err['msg']} (got {given})")
    return "; ".join(problems)


def context_for(request: ToolCallRequest, deps: Deps) -> ToolContext:
    """The context of one call; ``ValueError`` for a bad workspace name."""
    return ToolContext(
        # workspace_dir's path, without resolving the root again on every call.
        workspace=deps.workspaces_root / request.user_id / check_workspace_name(request.workspace),
        user_id=request.user_id,
        conversation_id=request.conversation_id,
        turn_id=request.turn_id,
        call_id=request.call_id,
        workspace_name=request.workspace,
        settings=deps.settings,
        proposals=deps.proposals,
        redis=deps.redis,
        keys=deps.keys,
        timeout_s=request.timeout_s,
    )


def execute(request: ToolCallRequest, context: ToolContext, registry: Registry) -> ToolResult:
    """Run the requested tool; every outcome, including a time-out, becomes a result."""
    started = time.monotonic()
    status: Any = "ok"
    output = ""
    error: str | None = None
    extra: dict[str, Any] = {}
    try:
        tool = registry.get(request.tool)
        if tool is None:
            raise ToolError(
                f"unknown tool {request.tool!r}; this worker serves {', '.join(registry.names())}"
            )
        try:
            args = tool.input_model.model_validate(request.input)
        except ValidationError as exc:
            raise ToolError(f"invalid input for {request.tool}: {_problems(exc)}") from None
        returned = tool.function(args, context)
        if isinstance(returned, ToolOutput):
            output, extra = returned.text, dict(returned.extra)
        else:
            output = returned
    except SoftTimeLimitExceeded:
        status, error = "timeout", _over_limit(request)
    except ToolTimeout as exc:  # a tool that stops itself at its limit (run_python's sandbox)
        status, error = "timeout", str(exc)
    except (ToolError, PathOutsideWorkspace) as exc:
        status, error = "error", str(exc)
    except Exception as exc:  # a tool bug must not crash the task: the model gets the error
        log.exception("tool %s failed on call %s", request.tool, request.call_id)
        status, error = "error", f"{request.tool} failed: {type(exc).__name__}: {exc}"
    return ToolResult(
        call_id=request.call_id,
        status=status,
        output=cap_output(output),
        error=error,
        # Rounded up: a call that ran took time, even under a millisecond.
        duration_ms=math.ceil((time.monotonic() - started) * 1000),
        extra=extra,
    )


def claim(deps: Deps, call_id: str, idempotent: bool) -> Claim:
    """``won`` for the first claim of ``call_id``; ``taken`` when some delivery already took
    it (an idempotent call runs again all the same, and takes the claim over); ``cancelled``
    when its turn's cancel came first (it must not start).

    The value names who runs it (``host:pid`` of the pool process): the main process renews
    the call's heartbeat while that process runs it, and operators and chaos tests read it.
    """
    ttl_s = deps.settings.call_heartbeat_ttl_s
    return claim_call(deps.redis, deps.keys, call_id, ttl_s, rerun=idempotent)


def publish(deps: Deps, turn_id: str, result: ToolResult, retry_s: float | None = None) -> None:
    """Put ``result`` on its turn's result stream, riding out a Redis blip of up to
    ``retry_s`` (the setting's ``result_publish_retry_s`` unless given)."""
    if retry_s is None:
        retry_s = deps.settings.result_publish_retry_s
    publish_retrying(deps.redis, deps.keys, turn_id, result, retry_s)


def _bad_request(raw: Mapping[str, Any], exc: ValidationError, deps: Deps) -> ToolResult | None:
    call_id, turn_id = raw.get("call_id"), raw.get("turn_id")
    message = f"bad tool call request: {_problems(exc)}"
    log.error("%s", message)
    if not (isinstance(call_id, str) and isinstance(turn_id, str)):
        return None  # nowhere to report it; the orchestrator's deadline calls it lost
    result = ToolResult(call_id=call_id, status="error", error=message)
    publish(deps, turn_id, result)
    return result


def parse_request(raw: Mapping[str, Any]) -> ToolCallRequest | None:
    """``raw`` as a request, or None if it is not one (``run_call`` reports why)."""
    try:
        return ToolCallRequest.model_validate(raw)
    except ValidationError:
        return None


def report(
    request: ToolCallRequest,
    deps: Deps,
    status: ResultStatus,
    error: str,
    duration_ms: int = 0,
    retry_s: float | None = None,
) -> ToolResult:
    """Publish a result the call did not produce itself (killed, stopped, never started);
    ``retry_s``: how long a Redis blip may hold it up (default: the setting)."""
    result = ToolResult(
        call_id=request.call_id, status=status, error=error, duration_ms=duration_ms
    )
    publish(deps, request.turn_id, result, retry_s)
    return result


def report_killed(raw: Mapping[str, Any], deps: Deps, limit_s: float) -> ToolResult | None:
    """Publish ``timeout`` for a call whose process was killed at its hard time limit.

    Runs in the worker's main process (the child is gone), so the orchestrator hears at once
    instead of waiting out its own deadline and calling the call lost.
    """
    request = parse_request(raw)
    if request is None:
        return None
    error = f"{request.tool} was stopped at its hard time limit of {limit_s:g} s"
    return report(request, deps, "timeout", error, int(limit_s * 1000))


def report_stopped(raw: Mapping[str, Any], deps: Deps) -> ToolResult | None:
    """Publish ``error`` for a call stopped by SIGTERM (``termination``): its turn was
    cancelled (the orchestrator already ended it ``cancelled`` and ignores this), or its
    worker is shutting down (the orchestrator hears now instead of at its deadline)."""
    request = parse_request(raw)
    if request is None:
        return None
    error = (
        f"{request.tool} was stopped before it finished (its turn was cancelled or its "
        "worker is stopping); it may or may not have taken effect"
    )
    return report(request, deps, "error", error)


@contextlib.contextmanager
def soft_time_limit(seconds: float) -> Iterator[None]:
    """Raise ``SoftTimeLimitExceeded`` in this (main) thread after ``seconds``, as Celery's
    soft time limit does for a task of its own: a call of a batch has a limit of its own.

    ``SIGALRM``'s timer: Celery's pool uses ``SIGUSR1`` and ``SIGKILL``, the cancel
    ``SIGUSR2``. The alarm can still land just after the block's last line, in this
    function's ``finally``: the caller treats that as the time-out it is.
    """

    def expire(signum: int, frame: object) -> None:
        raise SoftTimeLimitExceeded()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_call(raw: Mapping[str, Any], deps: Deps, limit_s: float | None = None) -> ToolResult | None:
    """Claim, run and publish one call; None when a redelivery of it is skipped, or when
    its turn's cancel came before it started.

    ``limit_s``: the call's soft time limit is kept here, not by Celery (a call of a batch,
    ``batches.py``): it times out after ``limit_s``, what is left of its own time limit.

    Traced as ``tool.call`` (under Celery's span of the task, so under the orchestrator's
    step that sent it), with the tool, its time limit, and the call's status and duration.
    """
    try:
        request = ToolCallRequest.model_validate(raw)
    except ValidationError as exc:
        return _bad_request(raw, exc, deps)
    attributes: Attributes = {
        "signalbox.tool.name": request.tool,
        "gen_ai.tool.name": request.tool,
        "gen_ai.tool.call.id": request.call_id,
        "signalbox.tool.time_limit_s": request.timeout_s,
        "signalbox.turn.id": request.turn_id,
        "signalbox.conversation.id": request.conversation_id,
    }
    with tracer.start_as_current_span("tool.call", attributes=attributes) as span:
        result = _claimed_run(request, deps, limit_s)
        if result is None:
            span.set_attribute("signalbox.tool.status", "skipped")
            return None
        span.set_attribute("signalbox.tool.status", result.status)
        span.set_attribute("signalbox.tool.duration_ms", result.duration_ms)
        if result.status != "ok":
            span.set_status(Status(StatusCode.ERROR, result.error or result.status))
        return result


def _claimed_run(request: ToolCallRequest, deps: Deps, limit_s: float | None) -> ToolResult | None:
    tool = deps.registry.get(request.tool)
    idempotent = tool is not None and tool.spec.idempotent
    claimed = claim(deps, request.call_id, idempotent)
    if claimed == "cancelled":
        log.info("call %s (%s) was cancelled before it started", request.call_id, request.tool)
        return None
    if claimed == "taken" and not idempotent:
        log.warning(
            "call %s (%s) was already claimed; not run again", request.call_id, request.tool
        )
        return None
    try:
        context = context_for(request, deps)
    except ValueError as exc:
        result = ToolResult(call_id=request.call_id, status="error", error=str(exc))
    else:
        if limit_s is None:
            result = execute(request, context, deps.registry)
        else:
            result = _execute_within(request, replace(context, timeout_s=limit_s), deps, limit_s)
    publish(deps, request.turn_id, result)
    return result


def _execute_within(
    request: ToolCallRequest, context: ToolContext, deps: Deps, limit_s: float
) -> ToolResult:
    started = time.monotonic()
    try:
        with soft_time_limit(limit_s):
            return execute(request, context, deps.registry)
    except SoftTimeLimitExceeded:  # the alarm came as the call ended, outside its ``try``
        return ToolResult(
            call_id=request.call_id,
            status="timeout",
            error=_over_limit(request),
            duration_ms=math.ceil((time.monotonic() - started) * 1000),
        )


def _over_limit(request: ToolCallRequest) -> str:
    return f"{request.tool} exceeded its time limit of {request.timeout_s:g} s"
