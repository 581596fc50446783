"""The HTTP shapes of the proposals service that the gateway serves or reads.

The public routes (docs/protocol.md, "HTTP, proposals service") are served by both: the
proposals service answers with these models, and the gateway, which serves the same routes
to clients, checks requests and answers against them. One definition for both, so the two
OpenAPI documents cannot drift and every limit is enforced at the first door.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from signalbox.shared.events import FileOperation, ProposalStatus
from signalbox.shared.ids import ID_MAX_CHARS, ID_PATTERN
from signalbox.shared.protocol import (
    MAX_REASON_CHARS as MAX_REASON_CHARS,
)  # one limit for WS and HTTP
from signalbox.shared.protocol import NO_NUL

MAX_FILES = 200  # one proposal is one reviewable change; more is a mistake, not a use case
MAX_PATH_CHARS = 4096  # PATH_MAX on Linux

FilePath = Annotated[str, Field(max_length=MAX_PATH_CHARS, pattern=NO_NUL)]
Reason = Annotated[str, Field(max_length=MAX_REASON_CHARS, pattern=NO_NUL)]


class ApproveBody(BaseModel):
    """``POST /api/proposals/{id}/approve``: ``files`` (paths) applies only those, else all."""

    files: list[FilePath] | None = Field(default=None, max_length=MAX_FILES)


class RejectBody(BaseModel):
    """``POST /api/proposals/{id}/reject`` and ``DELETE /api/proposals/all``."""

    reason: Reason | None = None


class ProposalFilePublic(BaseModel):
    """One file of a proposal, with the unified diff from ``before`` to ``after``."""

    path: str
    operation: FileOperation
    before: str | None
    after: str | None
    before_sha256: str | None
    diff: str


class ProposalPublic(BaseModel):
    """A proposal as clients see it."""

    proposal_id: str
    conversation_id: str
    turn_id: str | None
    call_id: str | None
    workspace: str
    summary: str
    created_at: str | None
    status: ProposalStatus
    version: int
    decided_at: str | None
    decided_by: str | None
    reason: str | None
    parent_id: str | None
    reverts: list[str] | None = None  # added: set on a revert proposal, the proposals it undoes
    files: list[ProposalFilePublic]


class PendingProposals(BaseModel):
    """``GET /api/proposals/pending``: my pending proposals, oldest first."""

    proposals: list[ProposalPublic]


DECIDED_DEFAULT_LIMIT = 50
DECIDED_MAX_LIMIT = 200  # each carries its files' contents: a page, never the whole history

DecidedLimit = Annotated[int, Field(ge=1, le=DECIDED_MAX_LIMIT)]


class DecidedProposals(BaseModel):
    """``GET /api/proposals/decided``: my decided proposals, most recently decided first."""

    proposals: list[ProposalPublic]


RevertScope = Literal["proposal", "turn"]


class RevertBody(BaseModel):
    """``POST /api/proposals/{id}/revert``: ``scope`` ``turn`` reverts every applied proposal
    of that proposal's turn together, in one revert proposal; ``proposal`` (default) only it."""

    scope: RevertScope = "proposal"


class RejectedAll(BaseModel):
    """``DELETE /api/proposals/all``: the ids this call rejected."""

    rejected: list[str]
    status: Literal["rejected"] = "rejected"


class ErrorDetail(BaseModel):
    """A refusal: why, in words."""

    detail: str


class CurrentFile(BaseModel):
    """A file of a refused approval as it is on disk now (``changed``, or ``refused``: why)."""

    path: str
    operation: FileOperation
    current_sha256: str | None
    changed: bool | None = None
    refused: str | None = None
    diff: str


class ProposalRefusal(BaseModel):
    """The 409 of a decision: the proposal's status, and for ``conflict`` its files now."""

    model_config = ConfigDict(extra="allow")  # a refusal may say more than these

    detail: str
    proposal_id: str | None = None
    status: str | None = None
    files: list[CurrentFile] | None = None


class GitState(BaseModel):
    """A workspace's git branch (null when detached) and whether its tree is dirty."""

    branch: str | None
    dirty: bool


# -- the internal route a tool worker calls: ``POST /internal/proposals`` -------------------

MAX_TEXT_CHARS = 10 * 1024 * 1024  # a file's proposed content
MAX_SUMMARY_CHARS = 10_000

# An id of the project's form: checked before any lookup, so a NUL or an over-long id is a
# 422 here and never a database error.
InternalId = Annotated[str, Field(max_length=ID_MAX_CHARS, pattern=ID_PATTERN)]


class FileChange(BaseModel):
    """One file of a new proposal, as a write tool makes it and the proposals service takes it."""

    path: Annotated[FilePath, Field(min_length=1)]
    operation: FileOperation
    after: str | None = Field(default=None, max_length=MAX_TEXT_CHARS, pattern=NO_NUL)
    before_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")


class CreateProposal(BaseModel):
    """``POST /internal/proposals``: a tool worker proposes file changes for a conversation."""

    user_id: InternalId
    conversation_id: InternalId
    turn_id: InternalId | None = None
    call_id: InternalId | None = None
    workspace: str | None = Field(default=None, max_length=100)
    summary: str = Field(default="", max_length=MAX_SUMMARY_CHARS, pattern=NO_NUL)
    files: list[FileChange] = Field(min_length=1, max_length=MAX_FILES)


class WorkspaceStatus(BaseModel):
    """``GET /internal/workspaces/{user_id}/{name}``, which the gateway reads for its listing."""

    name: str
    path_exists: bool
    git: GitState | None
