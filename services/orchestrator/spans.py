"""The orchestrator's spans (``shared/tracing.py``): what no instrumentation can name.

- ``turn.run``: one delivery of ``orchestrator.run_turn`` (under Celery's ``run`` span,
  so under the gateway's ``user_turn``), with the turn, its conversation and the outcome;
- ``turn.step``: one model step and the settling of its calls; the tool calls it sends
  (Celery's publish spans, and the tool worker's ``tool.call`` under them) are its children;
- ``chat <model>``: the step's model request, with the GenAI semantic conventions
  (the anthropic SDK's own ``anthropic.messages.create`` span is under it).

A turn that parked and is resumed by a later delivery settles its calls under that
delivery's ``turn.run``: the step span of the first delivery ended with it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from signalbox.services.orchestrator.model import StepEnd
from signalbox.shared.tracing import Attributes, tracer

# GenAI semantic conventions (https://opentelemetry.io/docs/specs/semconv/gen-ai/).
OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
RESPONSE_MODEL = "gen_ai.response.model"
FINISH_REASONS = "gen_ai.response.finish_reasons"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
CACHE_READ_TOKENS = "gen_ai.usage.cache_read.input_tokens"
CACHE_CREATION_TOKENS = "gen_ai.usage.cache_creation.input_tokens"
CONVERSATION = "gen_ai.conversation.id"

TURN_ID = "signalbox.turn.id"
CONVERSATION_ID = "signalbox.conversation.id"
OUTCOME = "signalbox.turn.outcome"
STEP = "signalbox.turn.step"


@contextlib.contextmanager
def turn_run(turn_id: str) -> Iterator[Span]:
    """The span of one delivery of a turn; the caller sets ``outcome``."""
    with tracer.start_as_current_span("turn.run", attributes={TURN_ID: turn_id}) as span:
        yield span


class StepSpan:
    """The ``turn.step`` span of a runner: begun with each model step, current again while
    that step's calls are settled, ended at the next step or when the run stops."""

    def __init__(self) -> None:
        self.span: Span | None = None

    def begin(self, step: int, turn_id: str) -> None:
        """End the previous step's span, start this one's (under the current span)."""
        self.end()
        self.span = tracer.start_span("turn.step", attributes={STEP: step, TURN_ID: turn_id})

    def current(self) -> contextlib.AbstractContextManager[object]:
        """Make the step's span current (nothing to do before the first step of a run)."""
        if self.span is None:
            return contextlib.nullcontext()
        return trace.use_span(self.span, end_on_exit=False)

    def end(self) -> None:
        """End the span, if one is open."""
        if self.span is not None:
            self.span.end()
            self.span = None


def provider(model: object) -> str:
    """``gen_ai.provider.name`` of a model: its own ``provider``, else the Messages API's."""
    return str(getattr(model, "provider", "anthropic"))


@contextlib.contextmanager
def chat(model: str, provider: str, max_tokens: int, conversation_id: str) -> Iterator[Span]:
    """The span of one model request, named ``chat <model>`` as the conventions say."""
    attributes: Attributes = {
        OPERATION: "chat",
        PROVIDER: provider,
        REQUEST_MODEL: model,
        REQUEST_MAX_TOKENS: max_tokens,
        CONVERSATION: conversation_id,
    }
    with tracer.start_as_current_span(
        f"chat {model}", kind=SpanKind.CLIENT, attributes=attributes
    ) as span:
        yield span


def chat_ended(
    span: Span, end: StepEnd | None, cancelled: bool, failure: BaseException | None
) -> None:
    """Record how the request ended: its usage and stop reason, or why it did not finish."""
    if end is not None:
        span.set_attributes(
            {
                # The conventions count every input token, those read from or written to the
                # prompt cache included (the API's input_tokens excludes them).
                INPUT_TOKENS: end.input_tokens
                + end.cache_read_input_tokens
                + end.cache_creation_input_tokens,
                OUTPUT_TOKENS: end.output_tokens,
                CACHE_READ_TOKENS: end.cache_read_input_tokens,
                CACHE_CREATION_TOKENS: end.cache_creation_input_tokens,
                FINISH_REASONS: [end.stop_reason or "unknown"],
            }
        )
        if end.model:
            span.set_attribute(RESPONSE_MODEL, end.model)
    if cancelled:
        span.set_attribute(FINISH_REASONS, ["cancelled"])
    if failure is not None:
        span.record_exception(failure)
        span.set_status(Status(StatusCode.ERROR, str(failure)))
        span.set_attribute("error.type", type(failure).__name__)
