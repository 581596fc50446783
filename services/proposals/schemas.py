"""Request bodies of the proposals routes."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from shared.events import FileOperation

MAX_FILES = 200  # one proposal is one reviewable change; more is a mistake, not a use case
MAX_TEXT_CHARS = 10 * 1024 * 1024  # a file's proposed content


class FileIn(BaseModel):
    """One file of a new proposal."""

    path: str = Field(min_length=1, max_length=4096)
    operation: FileOperation
    after: str | None = Field(default=None, max_length=MAX_TEXT_CHARS)
    before_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")


class CreateProposal(BaseModel):
    """``POST /internal/proposals``: a tool worker proposes file changes for a conversation."""

    # Lengths of the SQL columns, so an over-long id is a 422 here and not a database error.
    user_id: str = Field(max_length=40)
    conversation_id: str = Field(max_length=40)
    turn_id: str | None = Field(default=None, max_length=40)
    call_id: str | None = Field(default=None, max_length=40)
    workspace: str | None = Field(default=None, max_length=100)
    summary: str = Field(default="", max_length=10_000)
    files: list[FileIn] = Field(min_length=1, max_length=MAX_FILES)


class ApproveBody(BaseModel):
    """``POST /api/proposals/{id}/approve``: ``files`` (paths) applies only those, else all."""

    files: list[Annotated[str, Field(max_length=4096)]] | None = Field(
        default=None, max_length=MAX_FILES
    )


class RejectBody(BaseModel):
    """``POST /api/proposals/{id}/reject`` and ``DELETE /api/proposals/all``."""

    reason: str | None = Field(default=None, max_length=10_000)
