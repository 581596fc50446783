"""Usage, exactly: every model request recorded as the API billed it, and summed per turn.

A step's request is one ``model_requests`` row (``signalbox.shared.db.ModelRequest``),
committed with the step itself (``store.store_step``), so a step is never counted twice nor
lost: its tokens as the API reported them (``input_tokens``, ``output_tokens``,
``cache_creation_input_tokens``, ``cache_read_input_tokens``), its purpose (``step``,
``sub_agent`` for a spawn_agent child's steps, ``planner``, ``compaction``), its outcome
(``ok``; ``retried``: an attempt whose stream broke, billed as far as it went; ``cancelled``:
a step cut short, its tokens estimated since the API never reported them), its model and
its cost (``pricing.py``). A
turn's ``turn_finished.usage`` sums its own rows, and a root turn's also its sub-agents'
(the parent pays for its children). Per conversation and per user: ``shared/db/usage.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from signalbox.services.orchestrator.context_budget import estimate_tokens
from signalbox.services.orchestrator.model import ModelRequest as Request
from signalbox.services.orchestrator.model import StepEnd, StepRetry
from signalbox.services.orchestrator.pricing import Tokens
from signalbox.shared.db import usage as db_usage
from signalbox.shared.db.models import ModelRequest

if TYPE_CHECKING:
    from signalbox.services.orchestrator.store import FinishedTurn, Sessions
    from signalbox.services.orchestrator.turn_runner import TurnRunner

Purpose = Literal["step", "sub_agent", "planner", "compaction"]
Outcome = Literal["ok", "retried", "cancelled"]


def request_row(
    runner: TurnRunner,
    model: str,
    end: StepEnd,
    purpose: Purpose | None = None,
    outcome: Outcome = "ok",
) -> ModelRequest:
    """The row of one model request of ``runner``'s turn (not yet added to a session);
    ``purpose`` None: the turn's own step (``sub_agent`` for a child's)."""
    info = runner.info
    tokens = Tokens(
        end.input_tokens,
        end.output_tokens,
        end.cache_creation_input_tokens,
        end.cache_read_input_tokens,
    )
    if purpose is None:
        purpose = "sub_agent" if runner.child else "step"
    return ModelRequest(
        user_id=info.user_id,
        conversation_id=info.conversation_id,
        turn_id=info.turn_id,
        root_turn_id=runner.root_turn_id,
        purpose=purpose,
        outcome=outcome,
        model=model,
        input_tokens=end.input_tokens,
        output_tokens=end.output_tokens,
        cache_creation_input_tokens=end.cache_creation_input_tokens,
        cache_read_input_tokens=end.cache_read_input_tokens,
        cost_usd=runner.rt.prices.cost_usd(model, tokens, runner.rt.settings.prompt_cache_ttl),
    )


def retried_row(runner: TurnRunner, model: str, retry: StepRetry) -> ModelRequest:
    """The row of an attempt whose stream broke: what it reported before it broke."""
    end = StepEnd(
        None,
        retry.input_tokens,
        retry.output_tokens,
        retry.cache_creation_input_tokens,
        retry.cache_read_input_tokens,
    )
    return request_row(runner, retry.model or model or runner.rt.model.name, end, None, "retried")


def cancelled_row(runner: TurnRunner, sent: Request, text: str) -> ModelRequest:
    """The row of a step cut short: its prompt and what it streamed, estimated."""
    prompt = estimate_tokens(sent.system) + estimate_tokens(sent.messages)
    end = StepEnd(None, prompt, estimate_tokens(text) if text else 0)
    return request_row(runner, sent.model or runner.rt.model.name, end, None, "cancelled")


def record(runner: TurnRunner, row: ModelRequest) -> None:
    """Commit one request's row on its own (a step's row commits with the step instead)."""
    with runner.rt.sessions() as s, s.begin():
        s.add(row)


def turn_usage(sessions: Sessions, turn: FinishedTurn) -> dict[str, Any]:
    """``turn_finished.usage``: a root turn's requests with its sub-agents', a child's own.

    Every request the turn made is in it, as recorded: its steps, a retried attempt as far as
    it went, a cancelled step (estimated), the planner's and compaction's calls. ``cost_usd``
    is null when a request of the turn has a model without a price.
    """
    with sessions() as s:
        return usage_in(s, turn)


def usage_in(db: Session | Connection, turn: FinishedTurn) -> dict[str, Any]:
    """``turn_usage`` read in ``db`` (the transaction that finishes the turn)."""
    # A sub-agent's turn: its own requests; a user's turn: with its sub-agents'.
    used = db_usage.turn_total(db, turn.id, with_sub_agents=turn.parent_call_id is None)
    return {
        "input_tokens": used.input_tokens,
        "output_tokens": used.output_tokens,
        "cache_creation_input_tokens": used.cache_creation_input_tokens,
        "cache_read_input_tokens": used.cache_read_input_tokens,
        "cost_usd": used.cost_usd if used.unpriced_requests == 0 else None,
    }
