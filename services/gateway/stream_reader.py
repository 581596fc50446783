"""One Redis connection blocked in one ``XREAD`` over many conversations' streams.

A gateway process follows every conversation its clients subscribed to. A connection per
conversation would cap a process at its pool size (redis-py's default is 100) and cost a
socket per stream; instead a ``StreamReader`` issues
``XREAD COUNT n BLOCK ms STREAMS k1 … kn wake id1 … idn wake_id`` on a connection of its
own, always from concrete ids (never ``$``), so nothing appended between two reads is
missed, and re-issues it after every reply with the set of streams as it is then.

A stream added while the read is blocked would wait for the block to end. To pick it up
at once the reader also reads its own wake-up stream (``RedisKeys.relay_wake``) and
``wake()`` appends one entry to it: the blocked read returns, and the next one includes
the new stream. If the wake-up is ever lost (Redis restarted, a failed ``XADD``), the
stream is still picked up when the block times out, so ``block_ms`` bounds the delay.

The command is packed here rather than by redis-py: its generic packer costs ~5 µs per
argument, which for 500 streams is 2.5 ms of CPU for every read, i.e. for nearly every
event; the per-stream bytes are encoded once when the stream is added.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.connection import ConnectionPool

from signalbox.shared.event_stream import id_after

log = logging.getLogger(__name__)

Entry = tuple[str, list[str]]  # (event id, [field, value, field, value, ...]) as Redis sends it
OnEntries = Callable[[str, list[Entry]], None]  # (stream key, new entries); must not block

READ_COUNT = 500  # entries per stream per read: bounds one reply when a stream has a backlog
RETRY_S = 0.5  # back-off after a Redis error, so an outage is not a busy loop
WAKE_TTL_S = 3_600  # a crashed gateway's wake-up stream does not outlive it for long


def _bulk(value: str) -> bytes:
    raw = value.encode()
    return b"$%d\r\n%b\r\n" % (len(raw), raw)


class StreamReader:
    """An ``XREAD BLOCK`` loop over a changing set of streams, on one dedicated connection."""

    def __init__(
        self,
        pool: ConnectionPool,
        waker: aioredis.Redis,
        wake_key: str,
        on_entries: OnEntries,
        block_ms: int,
    ) -> None:
        self.wake_key = wake_key
        self._pool = pool
        self._waker = waker
        self._on_entries = on_entries
        self._positions: dict[str, str] = {}  # stream key -> id of the last entry handed on
        self._key_bulks: dict[str, bytes] = {}  # the command's bytes of each key...
        self._id_bulks: dict[str, bytes] = {}  # ...and of its position, kept with it
        self._wake_position = "0-0"
        self._wake_bulk = _bulk(wake_key)
        self._options = b"".join(
            [_bulk("XREAD"), _bulk("COUNT"), _bulk(str(READ_COUNT)), _bulk("BLOCK"),
             _bulk(str(block_ms)), _bulk("STREAMS")]
        )  # fmt: skip
        self._wake_pending = False
        self._changed = asyncio.Event()
        self.reads = 0  # XREADs issued (for tests and benchmarks)
        self.task: asyncio.Task[None] = asyncio.create_task(self._run(), name=f"relay:{wake_key}")

    def __len__(self) -> int:
        return len(self._positions)

    def add(self, key: str, position: str) -> None:
        """Follow ``key`` from after ``position``; call ``wake()`` to start at once."""
        self._positions[key] = position
        self._key_bulks[key] = _bulk(key)
        self._id_bulks[key] = _bulk(position)
        self._changed.set()

    def remove(self, key: str) -> None:
        """Stop following ``key`` (a read in flight may still return it; it is then ignored)."""
        self._positions.pop(key, None)
        self._key_bulks.pop(key, None)
        self._id_bulks.pop(key, None)

    async def wake(self) -> None:
        """End the blocked read, so the next one includes what was added since it began."""
        if self._wake_pending:
            return  # a wake-up is on its way and the read after it sees every stream added
        self._wake_pending = True
        try:
            async with self._waker.pipeline(transaction=False) as pipe:
                pipe.xadd(self.wake_key, {"w": "1"}, maxlen=1)
                pipe.expire(self.wake_key, WAKE_TTL_S)
                await pipe.execute()
        except (redis.exceptions.RedisError, OSError) as exc:
            # The block's timeout picks the stream up instead; only its first events wait.
            log.warning("relay wake-up of %s failed: %s", self.wake_key, exc)

    async def aclose(self) -> None:
        """Stop the loop and delete the wake-up stream."""
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        try:
            await self._waker.delete(self.wake_key)
        except (redis.exceptions.RedisError, OSError) as exc:
            log.warning("could not delete %s: %s", self.wake_key, exc)

    def _command(self) -> bytes:
        keys = self._key_bulks  # same insertion order as self._id_bulks
        return b"".join(
            [
                b"*%d\r\n" % (6 + 2 * (len(keys) + 1)),
                self._options,
                *keys.values(),
                self._wake_bulk,
                *self._id_bulks.values(),
                _bulk(self._wake_position),
            ]
        )

    async def _run(self) -> None:
        connection = self._pool.make_connection()  # type: ignore[no-untyped-call]
        try:
            while True:
                if not self._positions:
                    self._changed.clear()
                    await self._changed.wait()
                    continue
                # Cleared before the read is built: a wake() from now on ends this read.
                self._wake_pending = False
                command = self._command()
                self.reads += 1
                try:
                    await connection.send_packed_command(command, check_health=False)
                    reply: Any = await connection.read_response()
                except Exception as exc:
                    # Positions are kept, so the next read resumes where this one stood; and
                    # whatever went wrong, the loop lives on: every conversation depends on it.
                    unexpected = not isinstance(exc, redis.exceptions.RedisError | OSError)
                    log.warning(
                        "relay read failed (%d streams): %r; retrying", len(self), exc,
                        exc_info=unexpected,
                    )  # fmt: skip
                    await connection.disconnect()
                    await asyncio.sleep(RETRY_S)
                    continue
                self._hand_on(reply)
        finally:
            await connection.disconnect()

    def _hand_on(self, reply: Any) -> None:
        for key, entries in reply or []:
            if key == self.wake_key:
                if entries:
                    self._wake_position = entries[-1][0]
                continue
            position = self._positions.get(key)
            if position is None:
                continue  # removed while the read was in flight
            # A stream removed and added again mid-read has a newer position than this read.
            fresh = [e for e in entries if id_after(e[0], position)]
            if fresh:
                self._positions[key] = fresh[-1][0]
                self._id_bulks[key] = _bulk(fresh[-1][0])
                try:
                    self._on_entries(key, fresh)
                except Exception:
                    # One bad entry must not stop the relay of every other conversation.
                    log.exception("relay of %s failed; skipping %d entries", key, len(fresh))
