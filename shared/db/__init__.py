"""SQL: the source of truth. Models, engine/session factory and migrations."""

from signalbox.shared.db.models import (
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
from signalbox.shared.db.plans import PlanStep
from signalbox.shared.db.schedules import Alarm, Schedule, ScheduleRun
from signalbox.shared.db.session import make_engine, make_session_factory, standalone
from signalbox.shared.db.tenancy import AdmissionLock, BudgetWarning, UserLimits
from signalbox.shared.db.webhooks import Webhook, WebhookDelivery

__all__ = [
    "AdmissionLock",
    "Agent",
    "AgentVersion",
    "Alarm",
    "ApiToken",
    "Base",
    "BudgetWarning",
    "Conversation",
    "Message",
    "ModelRequest",
    "Outbox",
    "PlanStep",
    "Proposal",
    "ProposalFile",
    "Schedule",
    "ScheduleRun",
    "ToolCall",
    "Turn",
    "Upload",
    "User",
    "UserLimits",
    "Webhook",
    "WebhookDelivery",
    "Workspace",
    "make_engine",
    "make_session_factory",
    "standalone",
]
