"""A deployment's own tools, as a company would ship them: a module holding a ``registry``."""

from __future__ import annotations

from pydantic import BaseModel, Field

from signalbox.services.tools.registry import Registry, ToolContext

registry = Registry()
extra = Registry()  # a second registry, loaded as ``tests.tools.deploy_tools:extra``
not_a_registry = {"shout": "nope"}


class ShoutInput(BaseModel):
    """Input of ``shout``."""

    text: str = Field(description="what to shout")


@registry.tool(name="shout", description="Upper-case the text.", timeout_s=7, idempotent=True)
def shout(args: ShoutInput, ctx: ToolContext) -> str:
    """``args.text`` in capitals."""
    return args.text.upper()


@extra.tool(name="whisper", description="Lower-case the text.", idempotent=True)
def whisper(args: ShoutInput, ctx: ToolContext) -> str:
    """``args.text`` in small letters."""
    return args.text.lower()
