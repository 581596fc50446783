"""Everything one gateway process holds: settings, clients and the event relay hub.

Built once by the app's lifespan and reached from routes through ``deps.GatewayDep``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import anyio.to_thread
import httpx
import redis.asyncio as aioredis
import redis.exceptions
from celery import Celery
from redis import Redis as SyncRedis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.retry import Retry as SyncRetry
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from signalbox.services.gateway.metrics import GatewayMetrics
from signalbox.services.gateway.quotas import Quotas
from signalbox.services.gateway.rate_limit import RateLimits
from signalbox.services.gateway.relay import RELAY_SOCKET_TIMEOUT_S, RelayHub
from signalbox.services.gateway.socket_clock import SocketClock, slot_for
from signalbox.shared.admission import Limits, admit, admit_in_writer
from signalbox.shared.celery_app import make_celery, send_run_turn
from signalbox.shared.db import make_engine, make_session_factory
from signalbox.shared.db.session import reading
from signalbox.shared.event_stream import AsyncEventStream
from signalbox.shared.redis_clients import async_client, async_pool, is_sentinel, sync_client
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.settings import GatewaySettings

T = TypeVar("T")

# An asyncio client made by ``from_url`` does not retry: after a Redis restart, the first
# command on each pooled (now dead) connection would fail. Reconnect and retry instead.
RECONNECTING: dict[str, Any] = {
    "retry": Retry(ExponentialBackoff(cap=1.0, base=0.05), 3),
    "retry_on_error": [redis.exceptions.ConnectionError, redis.exceptions.TimeoutError],
}

# Both pools wait for a free connection rather than fail: redis-py's default pool raises
# MaxConnectionsError on the 101st command in flight, which a burst of frames reaches.
POOL_SIZE = 100  # connections of each pool (requests; replays), per gateway process
POOL_WAIT_S = 10.0  # a command waits this long for one before answering `unavailable`


def _thread_client(url: str) -> SyncRedis:
    """The client of the turn submission's worker thread (turns.py), retrying as the pools."""
    retries = {
        "retry": SyncRetry(ExponentialBackoff(cap=1.0, base=0.05), 3),
        "retry_on_error": [redis.exceptions.ConnectionError, redis.exceptions.TimeoutError],
    }
    return sync_client(url, decode_responses=True, **({} if is_sentinel(url) else retries))


def _pooled_client(url: str) -> aioredis.Redis:
    return async_client(
        url,
        blocking=True,
        decode_responses=True,
        max_connections=POOL_SIZE,
        timeout=POOL_WAIT_S,
        **({} if is_sentinel(url) else RECONNECTING),  # Sentinel's retries last a failover
    )


@dataclass
class Gateway:
    """The resources of one gateway process."""

    settings: GatewaySettings
    keys: RedisKeys
    redis: aioredis.Redis
    engine: Engine
    sessions: sessionmaker[Session]
    celery: Celery
    http: httpx.AsyncClient
    events: AsyncEventStream
    hub: RelayHub
    limits: RateLimits
    quotas: Quotas
    metrics: GatewayMetrics
    # A blocking client for work already in a worker thread: a turn's submission stores it,
    # appends its events and sends run_turn in one thread hop (turns.py), not four.
    thread_redis: SyncRedis
    # Every WebSocket's heartbeat and idle timeout, from one task (socket_clock.py).
    ws_clock: SocketClock
    # "Now" for token budgets' periods (budgets.py); tests replace it with a clock they move.
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))

    @classmethod
    def build(cls, settings: GatewaySettings) -> Gateway:
        """Create every client (nothing connects until first use)."""
        keys = RedisKeys(settings.redis_prefix)
        client = _pooled_client(settings.redis_url)
        # Replays have a pool of their own, so a burst of them never starves the requests.
        replay_client = _pooled_client(settings.redis_url)
        # The readers' connections (bells and reads) are their own; never back in a pool.
        read_pool = async_pool(
            settings.redis_url,
            decode_responses=True,
            protocol=2,  # the readers parse RESP2 replies and pub/sub messages themselves
            client_name=f"{keys.prefix}relay",  # in CLIENT LIST, for operators (and tests)
            socket_timeout=RELAY_SOCKET_TIMEOUT_S,
        )
        engine = make_engine(settings.database_url)
        metrics = GatewayMetrics()
        return cls(
            settings=settings,
            keys=keys,
            redis=client,
            engine=engine,
            sessions=make_session_factory(engine),
            celery=make_celery("signalbox-gateway", settings, results=False),
            http=httpx.AsyncClient(base_url=settings.proposals_url, timeout=30.0),
            events=AsyncEventStream(client, keys),
            hub=RelayHub(
                AsyncEventStream(replay_client, keys),
                read_pool,
                settings.client_queue_size,
                sweep_s=settings.relay_sweep_s,
            ),
            limits=RateLimits.build(client, keys, settings, metrics),
            quotas=Quotas(settings, metrics),
            metrics=metrics,
            thread_redis=_thread_client(settings.redis_url),
            ws_clock=SocketClock(slot_for(settings.heartbeat_s, settings.ws_idle_timeout_s)),
        )

    async def aclose(self) -> None:
        """Stop the relay and the sockets' clock, and close every client."""
        await self.ws_clock.aclose()
        await self.hub.aclose()
        await self.hub.stream.client.aclose()
        await self.http.aclose()
        await self.redis.aclose()
        self.thread_redis.close()
        self.engine.dispose()

    async def db(self, fn: Callable[[Session], T]) -> T:
        """Run ``fn`` in a worker thread inside one session, committing if it returns."""

        def run() -> T:
            with self.sessions() as session:
                result = fn(session)
                session.commit()
                return result

        return await anyio.to_thread.run_sync(run)

    async def read(self, fn: Callable[[Session], T]) -> T:
        """Run ``fn``, which only reads, in a worker thread inside one ``reading`` session:
        on PostgreSQL in autocommit, without a transaction's two round trips."""

        def run() -> T:
            with reading(self.sessions) as session:
                return fn(session)

        return await anyio.to_thread.run_sync(run)

    async def enqueue_turn(self, turn_id: str) -> None:
        """Send ``orchestrator.run_turn(turn_id)`` (kombu publishes blocking: in a thread)."""
        await anyio.to_thread.run_sync(self.send_run_turn, turn_id)

    def send_run_turn(self, turn_id: str) -> None:
        """Send ``orchestrator.run_turn(turn_id)``; blocking, for a worker thread."""
        send_run_turn(self.celery, turn_id)

    def admit_in_writer(self, session: Session) -> list[str] | None:
        """An admission pass in ``session``'s writing transaction where the database allows
        it without waiting, else None (``shared/admission.py``); the caller commits, then
        sends ``run_turn`` for each turn admitted (``send_admitted``)."""
        return admit_in_writer(session, Limits.of(self.settings), self.settings.redis_prefix)

    def send_admitted(self, admitted: list[str]) -> None:
        """``run_turn`` for each turn an admission pass admitted, after its commit (a turn
        admitted and never sent is sent again by a reconciler's sweep once it has been
        queued ``stale_queued_s``)."""
        for turn_id in admitted:
            self.send_run_turn(turn_id)

    def admit_and_send(self) -> list[str]:
        """``admit_waiting_turns``, blocking, for a worker thread."""
        limits, prefix = Limits.of(self.settings), self.settings.redis_prefix
        with self.sessions() as session:
            admitted = admit(session, limits, prefix)
            session.commit()
        self.send_admitted(admitted)
        return admitted

    async def admit_waiting_turns(self) -> list[str]:
        """An admission pass (``shared/admission.py``), then ``run_turn`` for each turn it
        admitted (any user's: a slot may have been waiting for a turn of someone else); both
        in one worker thread."""
        return await anyio.to_thread.run_sync(self.admit_and_send)

    def internal_headers(self, user_id: str) -> dict[str, str]:
        """Headers of an internal call to another service on behalf of ``user_id``."""
        return {
            "X-Signalbox-Internal-Token": self.settings.internal_token,
            "X-Signalbox-User": user_id,
        }
