"""Request bodies of the internal proposals routes; the public ones: ``shared.proposals_api``."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from shared.events import FileOperation
from shared.ids import ID_MAX_CHARS, ID_PATTERN
from shared.proposals_api import MAX_FILES, FilePath
from shared.protocol import NO_NUL

MAX_TEXT_CHARS = 10 * 1024 * 1024  # a file's proposed content
MAX_SUMMARY_CHARS = 10_000

# An id of the project's form: checked before any lookup, so a NUL or an over-long id is a
# 422 here and never a database error.
Id = Annotated[str, Field(max_length=ID_MAX_CHARS, pattern=ID_PATTERN)]


class FileIn(BaseModel):
    """One file of a new proposal."""

    path: Annotated[FilePath, Field(min_length=1)]
    operation: FileOperation
    after: str | None = Field(default=None, max_length=MAX_TEXT_CHARS, pattern=NO_NUL)
    before_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")


class CreateProposal(BaseModel):
    """``POST /internal/proposals``: a tool worker proposes file changes for a conversation."""

    user_id: Id
    conversation_id: Id
    turn_id: Id | None = None
    call_id: Id | None = None
    workspace: str | None = Field(default=None, max_length=100)
    summary: str = Field(default="", max_length=MAX_SUMMARY_CHARS, pattern=NO_NUL)
    files: list[FileIn] = Field(min_length=1, max_length=MAX_FILES)
