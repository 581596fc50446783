"""What a turn needs from the outside world (SQL, Redis, the model, the tool queues), built
once per worker process by ``tasks.py`` and handed to every run of the loop."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

import redis

from signalbox.services.orchestrator.approvals import ApprovalFeed
from signalbox.services.orchestrator.dispatch import Dispatcher
from signalbox.services.orchestrator.hooks import Hooks
from signalbox.services.orchestrator.metrics import TOOLS
from signalbox.services.orchestrator.model import Model
from signalbox.services.orchestrator.policy import ToolPolicy
from signalbox.services.orchestrator.pricing import PriceTable
from signalbox.services.orchestrator.store import Sessions, standalone_connection, utcnow
from signalbox.services.orchestrator.token_count import TokenCounter
from signalbox.services.orchestrator.tool_slots import ToolSlots
from signalbox.shared.admission import Limits, admit, anyone_waiting
from signalbox.shared.event_stream import EventStream
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.settings import OrchestratorSettings
from signalbox.shared.tool_contract import ToolSpec, read_catalogue

# Redis errors that mean "not reachable now" rather than a bug in a command.
REDIS_DOWN = (redis.ConnectionError, redis.TimeoutError)
POLL_S = 0.25  # longest single wait on the results stream: bounds how late a deadline is seen
CANCEL_CHECK_S = 1.0  # how often the committed cancel flag is read while waiting on tools


@dataclass
class Runtime:
    """Everything a turn needs from the outside world, built once per worker process."""

    settings: OrchestratorSettings
    sessions: Sessions
    redis: redis.Redis
    keys: RedisKeys
    model: Model
    dispatcher: Dispatcher
    enqueue_turn: Callable[[str], object]
    poll_s: float = POLL_S
    cancel_check_s: float = CANCEL_CHECK_S
    policy: ToolPolicy = field(default_factory=ToolPolicy)
    # The approvals subscriber of this process; None: every step reads proposals from SQL.
    approvals: ApprovalFeed | None = None
    prices: PriceTable = field(default_factory=PriceTable.load)  # model cost (pricing.py)
    tokens: TokenCounter | None = None  # exact counts for the context budget; None: estimate
    # What "now" is for token budgets' periods (budget.py); tests pass a clock they control.
    clock: Callable[[], datetime] = utcnow
    hooks: Hooks = field(default_factory=Hooks)  # the deployment's extension hooks (hooks.py)
    # Asks the scheduler to load an alarm the ``alarm`` tool stored (alarms.py); the
    # scheduler's start-up sync loads any whose message was lost.
    sync_alarm: Callable[[str], object] = lambda _alarm_id: None
    # The per-user limit on tool calls in flight (tool_slots.py); None: no limit.
    tool_slots: ToolSlots | None = None

    @property
    def events(self) -> EventStream:
        """The conversations' event streams."""
        return EventStream(self.redis, self.keys)

    def admit_waiting_turns(
        self, running_here: str | None = None, *, if_waiting: bool = False
    ) -> list[str]:
        """An admission pass (``shared/admission.py``); enqueues every turn it admitted but
        ``running_here`` (the caller's own delivery runs that one) and returns their ids.

        ``if_waiting``: none when no turn of the deployment waits (``anyone_waiting``; the
        caller freed its slot in a transaction committed before this call).
        """
        limits = Limits.of(self.settings)
        deployment = self.settings.redis_prefix
        if if_waiting:
            with standalone_connection(self.sessions) as conn:
                if not anyone_waiting(conn, deployment):
                    return []
        with self.sessions() as s, s.begin():
            admitted = admit(s, limits, deployment, running_here)
        for turn_id in admitted:
            if turn_id != running_here:
                self.enqueue_turn(turn_id)
        return admitted

    def catalogue(self) -> dict[str, ToolSpec]:
        """The tools live workers serve right now (their names become metric labels)."""
        found = read_catalogue(self.redis, self.keys)
        TOOLS.allow(found)
        return found
