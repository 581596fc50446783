"""Extension hooks: a deployment's own code at six points of a turn, each within a time limit.

A hook is a ``Hook`` subclass overriding the points it cares about:

- ``turn_started(ctx)`` and ``turn_finished(ctx, status)``: to observe;
- ``before_model(ctx, request)``: may return an edited ``ModelRequest`` (system prompt,
  messages, tools); ``after_model(ctx, text, tool_uses)``: to observe the answer;
- ``before_tool(ctx, tool, input)``: may return ``ToolVerdict.deny(reason)`` or
  ``ToolVerdict.allow(new_input)`` (the rewritten input then goes through the tool policy,
  so a hook never lets a call past it);
- ``after_tool(ctx, tool, status, output)``: may return the output redacted or annotated.

Installed as entry points in the group ``signalbox.hooks`` (like tool plugins), or named in
``SIGNALBOX_HOOK_MODULES`` (``'["acme.hooks:audit"]'``); a target is a ``Hook``, a ``Hook``
subclass (built without arguments), or a list of them; a module stands for its ``hooks``
attribute. A target that does not load stops the orchestrator at start-up.

Each call runs in its own daemon thread, joined with the hook's ``timeout_s``. A hook that
raises, overruns, or returns something of the wrong type is logged, then by its
``on_error``: ``skip`` (the turn goes on as if the hook were not installed) or
``fail_closed`` (``HookFailed``: a tool call is denied, a model step fails the turn, an
output is withheld). Never open. A hook that overran keeps its thread until it returns; its
late answer is dropped. Hooks are stateless: what they need travels in ``TurnContext``,
rebuilt from the turn at every call, so a turn resumed on another worker sees the same.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from importlib.metadata import EntryPoint, entry_points
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from signalbox.services.orchestrator.model import ModelRequest, ToolUse

if TYPE_CHECKING:
    from signalbox.services.orchestrator.turn_runner import TurnRunner

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "signalbox.hooks"
# A hook is a check, not a job: the turn (and its user) wait on it at every point.
DEFAULT_HOOK_TIMEOUT_S = 2.0

HookPoint = Literal[
    "turn_started", "before_model", "after_model", "before_tool", "after_tool", "turn_finished"
]
HOOK_POINTS: tuple[HookPoint, ...] = (
    "turn_started",
    "before_model",
    "after_model",
    "before_tool",
    "after_tool",
    "turn_finished",
)
OnError = Literal["skip", "fail_closed"]


@dataclass(frozen=True)
class TurnContext:
    """What a hook knows of the turn it runs in (its state: hooks keep none of their own)."""

    turn_id: str
    conversation_id: str
    user_id: str
    workspace: str
    agent: str  # the agent's name
    text: str  # the user's message that started the turn
    parent_call_id: str | None = None  # set in a spawn_agent child turn


@dataclass(frozen=True)
class ToolVerdict:
    """What ``before_tool`` says of a call: allowed (maybe with a rewritten input) or denied."""

    action: Literal["allow", "deny"] = "allow"
    reason: str = ""
    input: dict[str, Any] | None = None  # None: the input as the model wrote it

    @classmethod
    def allow(cls, input: dict[str, Any] | None = None) -> ToolVerdict:
        """Let the call go on to the tool policy, with ``input`` instead if given."""
        return cls("allow", "", input)

    @classmethod
    def deny(cls, reason: str) -> ToolVerdict:
        """Refuse the call; the model reads ``reason``."""
        return cls("deny", reason)


class Hook:
    """Base of a deployment's hook: override the points wanted; the rest cost nothing."""

    name: ClassVar[str] = ""  # in logs and errors; the class name when empty
    timeout_s: ClassVar[float] = DEFAULT_HOOK_TIMEOUT_S
    on_error: ClassVar[OnError] = "skip"

    def turn_started(self, ctx: TurnContext) -> None:
        """A turn started (once, when it leaves the queue)."""

    def before_model(self, ctx: TurnContext, request: ModelRequest) -> ModelRequest | None:
        """The request of a model step, before it is sent; return an edited one, or None."""
        return None

    def after_model(self, ctx: TurnContext, text: str, tool_uses: list[ToolUse]) -> None:
        """The model's answer of a step, before it is stored."""

    def before_tool(self, ctx: TurnContext, tool: str, input: dict[str, Any]) -> ToolVerdict | None:
        """A call the model asked for, before the tool policy; None allows it unchanged."""
        return None

    def after_tool(self, ctx: TurnContext, tool: str, status: str, output: str) -> str | None:
        """A call's result, before it is stored; return the output to store, or None."""
        return None

    def turn_finished(self, ctx: TurnContext, status: str) -> None:
        """A turn ended with ``status``."""


class HookFailed(Exception):
    """A ``fail_closed`` hook raised, overran or answered nonsense: the guarded act is refused."""


class HookLoadError(RuntimeError):
    """A configured hook module or entry point cannot be loaded as hooks."""


_NOTHING = object()


def _hook_name(hook: Hook) -> str:
    return hook.name or type(hook).__name__


def _implements(hook: Hook, point: HookPoint) -> bool:
    return getattr(type(hook), point) is not getattr(Hook, point)


class Hooks:
    """The deployment's hooks, called in order at each point with their time limits."""

    def __init__(self, hooks: Sequence[Hook] = ()) -> None:
        self.hooks = list(hooks)
        self._at = {p: [h for h in self.hooks if _implements(h, p)] for p in HOOK_POINTS}

    def has(self, point: HookPoint) -> bool:
        """Whether any hook is installed at ``point``."""
        return bool(self._at[point])

    def _call(self, hook: Hook, point: HookPoint, *args: Any) -> Any:
        """The hook's answer, or ``_NOTHING`` when it failed and its policy skips it."""
        answer: list[Any] = []
        error: list[BaseException] = []

        def run() -> None:
            try:
                answer.append(getattr(hook, point)(*args))
            except BaseException as exc:  # a hook's failure is reported, never propagated raw
                error.append(exc)

        thread = threading.Thread(target=run, name=f"hook-{_hook_name(hook)}", daemon=True)
        thread.start()
        thread.join(hook.timeout_s)
        if thread.is_alive():
            why = f"did not return within {hook.timeout_s:g} s"
        elif error:
            why = f"raised {error[0]!r}"
        else:
            return answer[0]
        return self._failed(hook, point, why)

    def _failed(self, hook: Hook, point: HookPoint, why: str) -> Any:
        message = f"hook {_hook_name(hook)!r} at {point} {why}"
        if hook.on_error == "fail_closed":
            log.error("%s; failing closed", message)
            raise HookFailed(message)
        log.warning("%s; skipped", message)
        return _NOTHING

    def turn_started(self, ctx: TurnContext) -> None:
        """Run the ``turn_started`` hooks; ``HookFailed`` fails the turn."""
        for hook in self._at["turn_started"]:
            self._call(hook, "turn_started", ctx)

    def before_model(self, ctx: TurnContext, request: ModelRequest) -> ModelRequest:
        """The request after every ``before_model`` hook edited it in turn."""
        for hook in self._at["before_model"]:
            # A copy: a hook that overran and is skipped must not edit what is sent.
            edited = self._call(hook, "before_model", ctx, copy.deepcopy(request))
            if edited is None or edited is _NOTHING:
                continue
            if not isinstance(edited, ModelRequest):
                self._failed(hook, "before_model", f"returned {type(edited).__name__}")
                continue
            request = edited
        return request

    def after_model(self, ctx: TurnContext, text: str, tool_uses: Sequence[ToolUse]) -> None:
        """Run the ``after_model`` hooks; ``HookFailed`` fails the turn."""
        for hook in self._at["after_model"]:
            self._call(hook, "after_model", ctx, text, list(tool_uses))

    def before_tool(self, ctx: TurnContext, use: ToolUse) -> tuple[ToolUse, str | None]:
        """The call as the hooks let it through, and the first denial's reason (or None)."""
        for hook in self._at["before_tool"]:
            verdict = self._call(hook, "before_tool", ctx, use.name, copy.deepcopy(use.input))
            if verdict is None or verdict is _NOTHING:
                continue
            if not isinstance(verdict, ToolVerdict) or (
                verdict.input is not None and not isinstance(verdict.input, dict)
            ):
                self._failed(hook, "before_tool", f"returned {verdict!r}, not a ToolVerdict")
                continue
            if verdict.action == "deny":
                return use, f"{_hook_name(hook)}: {verdict.reason or 'no reason given'}"
            if verdict.input is not None:
                use = replace(use, input=verdict.input)
        return use, None

    def after_tool(self, ctx: TurnContext, tool: str, status: str, output: str) -> str:
        """The output after every ``after_tool`` hook redacted or annotated it in turn."""
        for hook in self._at["after_tool"]:
            edited = self._call(hook, "after_tool", ctx, tool, status, output)
            if edited is None or edited is _NOTHING:
                continue
            if not isinstance(edited, str):
                self._failed(hook, "after_tool", f"returned {type(edited).__name__}, not str")
                continue
            output = edited
        return output

    def turn_finished(self, ctx: TurnContext, status: str) -> None:
        """Run the ``turn_finished`` hooks; the turn has ended, so a failure is only logged."""
        for hook in self._at["turn_finished"]:
            with contextlib.suppress(HookFailed):  # logged by _failed; nothing left to refuse
                self._call(hook, "turn_finished", ctx, status)


def context(runner: TurnRunner) -> TurnContext:
    """The hook context of ``runner``'s turn."""
    info = runner.info
    return TurnContext(
        turn_id=info.turn_id,
        conversation_id=info.conversation_id,
        user_id=info.user_id,
        workspace=info.workspace,
        agent=runner.agent.name,
        text=info.text,
        parent_call_id=info.parent_call_id,
    )


# -- loading ---------------------------------------------------------------------------


def _as_hooks(target: object, where: str) -> list[Hook]:
    if isinstance(target, ModuleType):
        target = getattr(target, "hooks", None)
        if target is None:
            raise HookLoadError(f"module {where!r} has no attribute 'hooks'")
    items = list(target) if isinstance(target, list | tuple) else [target]
    found: list[Hook] = []
    for item in items:
        if isinstance(item, type) and issubclass(item, Hook):
            cls = item
            try:
                item = cls()
            except Exception as exc:
                raise HookLoadError(
                    f"cannot build hook {cls.__name__} of {where!r}: {exc!r}"
                ) from exc
        if not isinstance(item, Hook):
            raise HookLoadError(f"expected a signalbox Hook at {where!r}, got {item!r}")
        if item.on_error not in ("skip", "fail_closed"):
            raise HookLoadError(
                f"hook {_hook_name(item)!r}: on_error must be 'skip' or 'fail_closed', "
                f"got {item.on_error!r}"
            )
        if not item.timeout_s > 0:
            raise HookLoadError(f"hook {_hook_name(item)!r}: timeout_s must be > 0")
        found.append(item)
    return found


def from_module(path: str) -> list[Hook]:
    """The hooks at ``path`` (``pkg.mod`` or ``pkg.mod:attr``)."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise HookLoadError(f"cannot import hook module {path!r}: {exc}") from exc
    if not attr:
        return _as_hooks(module, path)
    try:
        return _as_hooks(getattr(module, attr), path)
    except AttributeError:
        raise HookLoadError(f"module {module_name!r} has no attribute {attr!r}") from None


def from_entry_points(
    found: Callable[[], Iterable[EntryPoint]] = lambda: entry_points(group=ENTRY_POINT_GROUP),
) -> list[Hook]:
    """The hooks of every installed ``signalbox.hooks`` entry point, by name."""
    hooks: list[Hook] = []
    for point in sorted(found(), key=lambda p: p.name):
        where = f"{point.name} = {point.value}"
        try:
            target = point.load()
        except Exception as exc:  # any import-time failure of a third-party package
            raise HookLoadError(f"cannot load entry point {where!r}: {exc!r}") from exc
        hooks.extend(_as_hooks(target, where))
    return hooks


def load_hooks(modules: Iterable[str]) -> Hooks:
    """The deployment's hooks: its entry points, then its configured modules."""
    return Hooks([*from_entry_points(), *(h for m in modules for h in from_module(m))])
