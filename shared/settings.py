"""One typed settings object per service, read from ``SIGNALBOX_*`` environment variables.

Every service calls ``load(SettingsClass)`` at start-up: a missing or placeholder value
fails there with a message that names the variable, not later in a request.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, TypeVar

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

PLACEHOLDERS = frozenset({"", "changeme", "change-me", "changethis", "secret", "xxx", "todo"})

# Celery's own default; a turn longer than this is protected by its lease, not re-run.
DEFAULT_VISIBILITY_TIMEOUT_S = 3600


class SettingsError(RuntimeError):
    """A setting is missing or still holds a placeholder."""


class CommonSettings(BaseSettings):
    """What every service needs: where Redis and SQL are, and the key prefix of this deployment."""

    model_config = SettingsConfigDict(env_prefix="SIGNALBOX_", extra="ignore")

    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_prefix: str = Field(
        default="sb:", description="prefix of every Redis key and Celery queue of this deployment"
    )
    database_url: str = "sqlite:///var/signalbox.db"
    workspaces_root: Path = Path("var/workspaces")
    visibility_timeout_s: int = DEFAULT_VISIBILITY_TIMEOUT_S
    log_level: str = "INFO"

    @field_validator("redis_url", "database_url")
    @classmethod
    def _not_placeholder(cls, value: str) -> str:
        if value.strip().lower() in PLACEHOLDERS:
            raise ValueError(f"expected a real URL, got {value!r}")
        return value


class _NeedsInternalToken(CommonSettings):
    internal_token: str = Field(
        description="shared secret between services for internal HTTP routes",
    )

    @field_validator("internal_token")
    @classmethod
    def _real_secret(cls, value: str) -> str:
        if value.strip().lower() in PLACEHOLDERS or len(value) < 16:
            raise ValueError("expected a random secret of at least 16 characters")
        return value


class GatewaySettings(_NeedsInternalToken):
    """Settings of ``services/gateway``."""

    proposals_url: str = "http://127.0.0.1:8001"
    allowed_origins: list[str] = Field(default_factory=list)
    ws_max_frame_bytes: int = 1024 * 1024
    heartbeat_s: float = 15.0
    client_queue_size: int = 1000  # events buffered per socket before a slow reader is closed
    rate_limit_per_minute: int = 600
    busy_policy: Literal["enqueue", "reject", "interrupt"] = "enqueue"


class OrchestratorSettings(CommonSettings):
    """Settings of ``services/orchestrator``."""

    anthropic_api_key: str | None = Field(default=None, validation_alias="ANTHROPIC_API_KEY")
    anthropic_base_url: str | None = Field(default=None, validation_alias="ANTHROPIC_BASE_URL")
    model: str = "claude-sonnet-4-5"
    max_tokens: int = 4096
    max_steps: int = 10
    system_prompt: str = (
        "You are Signalbox, an agent working in the user's workspace. Read before you change; "
        "file changes you make are proposals that a human approves."
    )
    tool_grace_s: float = 5.0  # beyond a tool's own limit before the orchestrator calls it lost
    lease_s: float = 30.0


class ToolsSettings(_NeedsInternalToken):
    """Settings of ``services/tools``."""

    proposals_url: str = "http://127.0.0.1:8001"
    catalogue_refresh_s: float = 10.0
    read_max_bytes: int = 256 * 1024
    search_max_results: int = 200


class ProposalsSettings(_NeedsInternalToken):
    """Settings of ``services/proposals``."""

    proposal_ttl_s: int = 24 * 3600


S = TypeVar("S", bound=BaseSettings)


def load(cls: type[S]) -> S:
    """Build ``cls`` from the environment, or fail with a message naming each bad variable."""
    try:
        return cls()
    except ValidationError as exc:
        prefix = str(cls.model_config.get("env_prefix", ""))
        problems = []
        for err in exc.errors():
            name = (prefix + ".".join(str(p) for p in err["loc"])).upper()
            problems.append(f"{name}: {err['msg']}")
        raise SettingsError(f"{cls.__name__} is not usable: " + "; ".join(problems)) from None
