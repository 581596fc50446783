"""SQL: the source of truth. Models, engine/session factory and migrations."""

from shared.db.models import (
    Agent,
    AgentVersion,
    ApiToken,
    Base,
    Conversation,
    Message,
    ModelRequest,
    Outbox,
    Proposal,
    ProposalFile,
    ToolCall,
    Turn,
    Upload,
    User,
    Workspace,
)
from shared.db.session import make_engine, make_session_factory

__all__ = [
    "Agent",
    "AgentVersion",
    "ApiToken",
    "Base",
    "Conversation",
    "Message",
    "ModelRequest",
    "Outbox",
    "Proposal",
    "ProposalFile",
    "ToolCall",
    "Turn",
    "Upload",
    "User",
    "Workspace",
    "make_engine",
    "make_session_factory",
]
