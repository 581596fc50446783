"""Usage, exactly: every model request recorded as the API billed it, and summed per turn.

A step's request is one ``model_requests`` row (``shared.db.ModelRequest``), committed with
the step itself (``store.store_step``), so a step is never counted twice nor lost: its
tokens as the API reported them (``input_tokens``, ``output_tokens``,
``cache_creation_input_tokens``, ``cache_read_input_tokens``), its purpose (``step``, or
``sub_agent`` for a spawn_agent child's steps), its model and its cost (``pricing.py``). A
turn's ``turn_finished.usage`` sums its own rows, and a root turn's also its sub-agents'
(the parent pays for its children). Per conversation and per user: ``shared/db/usage.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import func, select

from services.orchestrator.model import StepEnd
from services.orchestrator.pricing import Tokens
from shared.db.models import ModelRequest, Turn

if TYPE_CHECKING:
    from services.orchestrator.store import Sessions
    from services.orchestrator.turn_runner import TurnRunner

Purpose = Literal["step", "sub_agent"]


def request_row(runner: TurnRunner, model: str, end: StepEnd) -> ModelRequest:
    """The row of one model request of ``runner``'s turn (not yet added to a session)."""
    info = runner.info
    tokens = Tokens(
        end.input_tokens,
        end.output_tokens,
        end.cache_creation_input_tokens,
        end.cache_read_input_tokens,
    )
    purpose: Purpose = "sub_agent" if runner.child else "step"
    return ModelRequest(
        user_id=info.user_id,
        conversation_id=info.conversation_id,
        turn_id=info.turn_id,
        root_turn_id=runner.root_turn_id,
        purpose=purpose,
        model=model,
        input_tokens=end.input_tokens,
        output_tokens=end.output_tokens,
        cache_creation_input_tokens=end.cache_creation_input_tokens,
        cache_read_input_tokens=end.cache_read_input_tokens,
        cost_usd=runner.rt.prices.cost_usd(model, tokens, runner.rt.settings.prompt_cache_ttl),
    )


def turn_usage(sessions: Sessions, turn: Turn) -> dict[str, Any]:
    """``turn_finished.usage``: a root turn's requests with its sub-agents', a child's own.

    ``cost_usd`` is null when a request of the turn has a model without a price.
    """
    scope = (
        ModelRequest.turn_id == turn.id
        if turn.parent_call_id is not None
        else ModelRequest.root_turn_id == turn.id
    )
    with sessions() as s:
        written, read, cost, priced, requests = s.execute(
            select(
                func.coalesce(func.sum(ModelRequest.cache_creation_input_tokens), 0),
                func.coalesce(func.sum(ModelRequest.cache_read_input_tokens), 0),
                func.coalesce(func.sum(ModelRequest.cost_usd), 0.0),
                func.count(ModelRequest.cost_usd),
                func.count(ModelRequest.id),
            ).where(scope)
        ).one()
    return {
        "input_tokens": turn.input_tokens,
        "output_tokens": turn.output_tokens,
        "cache_creation_input_tokens": int(written),
        "cache_read_input_tokens": int(read),
        "cost_usd": round(float(cost or 0.0), 6) if priced == requests else None,
    }
