"""One typed settings object per service, read from ``SIGNALBOX_*`` environment variables.

Every service calls ``load(SettingsClass)`` at start-up: a missing or placeholder value
fails there with a message that names the variable, not later in a request.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from signalbox.shared.secret_files import DEFAULT_SECRET_DENYLIST

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
    # A Celery worker's Prometheus /metrics (shared/metrics.py); None: not served. The HTTP
    # services serve /metrics on their own port instead.
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    metrics_host: str = "0.0.0.0"
    database_url: str = "sqlite:///var/signalbox.db"
    workspaces_root: Path = Path("var/workspaces")
    visibility_timeout_s: int = DEFAULT_VISIBILITY_TIMEOUT_S
    log_level: str = "INFO"
    # Fair scheduling (shared/admission.py): turns of one user running at once (an admin may
    # set a user's own), and of the whole deployment (best: the orchestrators' total threads,
    # so an admitted turn never waits in Celery's queue); 0: no limit.
    max_running_turns_per_user: int = Field(default=4, ge=0)
    max_running_turns: int = Field(default=0, ge=0)
    # Quotas the proposals service enforces and the gateway reports (shared/quotas.py):
    # proposals waiting for a decision, and bytes of all of a user's workspaces.
    quota_pending_proposals: int = Field(default=1000, ge=0)
    quota_workspace_bytes: int = Field(default=1024**3, ge=0)
    log_format: Literal["human", "json"] = "human"  # shared/log_config.py

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
    # Both limits are enforced while reading, before buffering (services/gateway/app.py,
    # shared/body_limit.py); the longest text a frame or body may carry is in shared/protocol.py.
    ws_max_frame_bytes: int = Field(default=1024 * 1024, gt=0)
    http_max_body_bytes: int = Field(default=1024 * 1024, gt=0)
    # The largest attachment POST /api/uploads takes (the body limit of that one route);
    # each kind has its own lower cap too (services/gateway/uploads.py: images 5 MB).
    upload_max_bytes: int = Field(default=32 * 1024 * 1024, gt=0)
    # Both more than 0 (the sockets' one clock ticks in slots of 1/50 of the shorter);
    # ``inf`` turns one off.
    heartbeat_s: float = Field(default=15.0, gt=0)
    ws_idle_timeout_s: float = Field(default=300.0, gt=0)  # close 1001: the client was silent
    # permessage-deflate offered by a client is declined unless this is on: events are small
    # JSON that it shrinks little, and each compressing socket holds ~40 KiB more
    # (bench `connections`, bench/analysis.md). A client that offers it works either way.
    ws_per_message_deflate: bool = False
    client_queue_size: int = 1000  # events buffered per socket before a slow reader is closed
    # Streams are read when their bell rings (services/gateway/stream_reader.py); every this
    # many seconds, one read of every followed stream relays what a writer did not ring for.
    relay_sweep_s: float = Field(default=1.0, gt=0)
    rate_limit_per_minute: int = 600  # WebSocket frames of any type, per user
    # Per-user limits per class of action, in the `limits` notation ("30/minute",
    # "1000/day"), counted in Redis over a moving window by every gateway together
    # (services/gateway/rate_limit.py); a request over one is 429 / `rate_limited`.
    rate_limit_turns: str = "60/minute"  # turns submitted (HTTP, WebSocket, AG-UI)
    rate_limit_decisions: str = "600/minute"  # tool/proposal decisions, answers, cancels
    rate_limit_tickets: str = "60/minute"  # WebSocket/SSE tickets
    rate_limit_uploads: str = "60/minute"
    rate_limit_writes: str = "120/minute"  # every other mutating route (creations, edits)
    # Per-user quotas on stored things (services/gateway/quotas.py); an admin may set a
    # user's own. Past one a creation is refused `quota_exceeded`, nothing written.
    quota_conversations: int = Field(default=10_000, ge=0)  # not archived
    quota_workspaces: int = Field(default=100, ge=0)
    quota_uploads: int = Field(default=10_000, ge=0)
    quota_upload_bytes: int = Field(default=1024**3, ge=0)
    busy_policy: Literal["enqueue", "reject", "interrupt"] = "enqueue"
    # Webhooks (docs/hooks.md): a URL resolving to a private, loopback or link-local address
    # is refused at registration and at each delivery unless this allows it; a delivery is
    # tried this many times, with a backoff doubling from webhook_backoff_s.
    webhook_allow_private: bool = False
    webhook_max_attempts: int = Field(default=8, ge=1)
    webhook_backoff_s: float = Field(default=2.0, gt=0)
    webhook_timeout_s: float = Field(default=10.0, gt=0)
    webhook_poll_s: float = Field(default=1.0, gt=0)  # how often due deliveries are looked for

    @field_validator(
        "rate_limit_turns",
        "rate_limit_decisions",
        "rate_limit_tickets",
        "rate_limit_uploads",
        "rate_limit_writes",
    )
    @classmethod
    def _rate_limit(cls, value: str) -> str:
        from limits import parse  # only the gateway's settings have these

        try:
            parse(value)
        except ValueError:
            raise ValueError(
                f"expected a rate limit such as '30/minute' or '1000 per day', got {value!r}"
            ) from None
        return value


class OrchestratorSettings(CommonSettings):
    """Settings of ``services/orchestrator``."""

    anthropic_api_key: str | None = Field(default=None, validation_alias="ANTHROPIC_API_KEY")
    anthropic_base_url: str | None = Field(default=None, validation_alias="ANTHROPIC_BASE_URL")
    model: str = "claude-sonnet-5-5"
    max_tokens: int = 4096
    planner_model: str = "claude-haiku-4-5"  # the cheap model an agent's tool planner asks
    max_steps: int = 10
    system_prompt: str = (
        "You are Signalbox, an agent working in the user's workspace. Read before you change; "
        "file changes you make are proposals that a human approves."
    )
    tool_grace_s: float = 5.0  # beyond a tool's own limit before the orchestrator calls it lost
    # Failure detection (docs/operations.md, "Failure detection"). A runner renews its turn's
    # lease every lease_renew_s; a dead runner's lease runs out after lease_s, and a sweep
    # every orphan_sweep_s enqueues its turn again (the rest of the reconciler's work, parked
    # and queued turns, every reconcile_s). A started tool call whose worker's heartbeat is
    # gone for tool_heartbeat_grace_s ends lost at once (0: only at its deadline).
    lease_s: float = Field(default=4.0, gt=0)
    lease_renew_s: float = Field(default=1.0, gt=0)
    orphan_sweep_s: float = Field(default=0.5, gt=0)
    reconcile_s: float = Field(default=30.0, gt=0)
    tool_heartbeat_grace_s: float = Field(default=1.0, ge=0)
    # A step's calls of quick tools to one queue go this many at most to one task (1: every
    # call a task of its own; services/tools/batches.py).
    tool_batch_max: int = Field(default=8, ge=1)
    # Tool calls of one user in flight at once, over all their turns (tool_slots.py); a
    # call past it waits, pending, until one of the user's calls ends. 0: no limit.
    max_tool_calls_per_user: int = Field(default=0, ge=0)
    # A turn whose runner died this many times in a row (a poison message: each delivery
    # kills its worker) is failed on the next delivery instead of run again.
    max_turn_deliveries: int = Field(default=3, ge=1)
    # Tool-approval policy (services/orchestrator/policy.py): a JSON or TOML file, and/or JSON
    # here; the environment's rules apply after the file's. A broken policy stops start-up.
    tool_policy_file: Path | None = None
    tool_policy: dict[str, Any] | None = None
    decision_ttl_s: float = 600.0  # a confirm call or ask_user question waits this long
    context_tokens: int = 150_000  # transcript budget (estimated as characters / 4)
    # The model's context window, overriding services/orchestrator/context_window.py's table:
    # a request that would not fit has its older turns compacted (docs/operations.md).
    context_window_tokens: int | None = Field(default=None, ge=1000)
    tool_output_max_chars: int = 50_000  # a tool output longer than this reaches the model cut
    subagent_max_steps: int = 5  # model steps of one spawn_agent child turn
    # Wall-clock limit of one turn (an agent may set its own): the turn then ends timed_out.
    turn_timeout_s: float = Field(default=1800.0, gt=0)
    # The share of a user's token budget that, once used, sends budget_warning (once per
    # period); the budgets themselves are per user, in SQL (shared/db/budgets.py).
    budget_warn_fraction: float = Field(default=0.8, gt=0, le=1)
    # Model cost (docs/operations.md, "Model cost"): the TTL of every prompt-cache breakpoint,
    # the price table (services/orchestrator/prices.toml when unset), and whether the context
    # budget asks the Messages API to count tokens ("api") or estimates them ("estimate").
    prompt_cache_ttl: Literal["5m", "1h"] = "5m"
    price_file: Path | None = None
    token_counting: Literal["api", "estimate"] = "api"
    # Extension hooks (services/orchestrator/hooks.py): ``pkg.mod:object`` targets besides
    # the ``signalbox.hooks`` entry points; a target that does not load stops start-up.
    hook_modules: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _renewed_in_time(self) -> OrchestratorSettings:
        # A renewal may come late once (a loaded machine) without the lease running out.
        if self.lease_renew_s * 2 > self.lease_s:
            raise ValueError(
                f"expected lease_renew_s at most half of lease_s, got lease_renew_s="
                f"{self.lease_renew_s:g} with lease_s={self.lease_s:g}"
            )
        return self


class McpServerSettings(BaseModel):
    """One MCP server whose tools the tool workers serve: a stdio ``command`` or an HTTP ``url``."""

    command: list[str] | None = None
    url: str | None = None
    env: dict[str, str] = Field(default_factory=dict)  # extra environment of a stdio server
    timeout_s: float = 30.0
    mode: Literal["auto", "confirm", "deny"] = "confirm"  # its tools may do anything
    queue: str = "tools"

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerSettings:
        if (self.command is None) == (self.url is None):
            raise ValueError(
                f"expected exactly one of command or url, got command={self.command!r}, "
                f"url={self.url!r}"
            )
        if self.command is not None and not self.command:
            raise ValueError("expected a non-empty command, got []")
        return self


class ToolsSettings(_NeedsInternalToken):
    """Settings of ``services/tools``."""

    proposals_url: str = "http://127.0.0.1:8001"
    catalogue_refresh_s: float = 10.0
    # While a call runs, the main process renews its heartbeat every call_heartbeat_s, valid
    # for call_heartbeat_ttl_s (services/tools/heartbeat.py); the orchestrator ends a call
    # whose heartbeat is gone lost. A result Redis cannot take is retried this long.
    call_heartbeat_s: float = Field(default=0.5, gt=0)
    call_heartbeat_ttl_s: float = Field(default=2.0, gt=0)
    result_publish_retry_s: float = Field(default=10.0, ge=0)
    read_max_bytes: int = 256 * 1024
    search_max_results: int = 200
    # A deployment's own tools: modules (``pkg.mod`` or ``pkg.mod:attr``) holding a Registry,
    # besides the ``signalbox.tools`` entry-point group.
    tool_modules: list[str] = Field(default_factory=list)
    tool_timeouts: dict[str, float] = Field(default_factory=dict)  # tool name -> limit (s)
    tool_queues: dict[str, str] = Field(default_factory=dict)  # tool name -> Celery queue
    mcp_servers: dict[str, McpServerSettings] = Field(default_factory=dict)
    # run_python: "off" removes it from the catalogue where the sandbox cannot hold; it never
    # runs unconfined (docs/tools.md). Limits are per run (memory, processes) or per process.
    sandbox: Literal["on", "off"] = "on"
    sandbox_bwrap: str = "bwrap"  # bubblewrap's executable, looked up in PATH
    sandbox_cpu_s: int = 10
    sandbox_memory_mb: int = 512
    sandbox_file_mb: int = 16
    sandbox_open_files: int = 64
    sandbox_processes: int = 32
    sandbox_output_bytes: int = 32 * 1024
    # run_python sees a read-only copy of the conversation's workspace at /workspace, at most
    # this much of it (docs/tools.md); the copy is made per run.
    sandbox_workspace_mb: int = Field(default=256, ge=0)
    # web_fetch (services/tools/web_fetch.py): at most this much of a page, this long in all.
    web_fetch_max_bytes: int = Field(default=2 * 1024 * 1024, gt=0)
    web_fetch_timeout_s: float = Field(default=20.0, gt=0)
    # Entries no tool shows the model (services/tools/denylist.py); '[]' leaves only .git/.
    secret_denylist: list[str] = Field(default_factory=lambda: list(DEFAULT_SECRET_DENYLIST))

    @model_validator(mode="after")
    def _beats_in_time(self) -> ToolsSettings:
        # A renewal may come late once without the heartbeat running out.
        if self.call_heartbeat_s * 2 > self.call_heartbeat_ttl_s:
            raise ValueError(
                f"expected call_heartbeat_s at most half of call_heartbeat_ttl_s, got "
                f"call_heartbeat_s={self.call_heartbeat_s:g} with "
                f"call_heartbeat_ttl_s={self.call_heartbeat_ttl_s:g}"
            )
        return self


class ProposalsSettings(_NeedsInternalToken):
    """Settings of ``services/proposals``."""

    proposal_ttl_s: int = 24 * 3600
    outbox_sweep_s: float = 2.0  # how soon a decision committed while Redis was down goes out
    git_commit_on_apply: bool = False  # commit each applied proposal if the workspace is a repo
    # Refused while reading (shared/body_limit.py): a tool worker's proposal carries whole
    # files (write tools cap one at 4 MiB), so this is larger than the gateway's limit.
    proposals_max_body_bytes: int = Field(default=32 * 1024 * 1024, gt=0)


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
