"""Many conversations' event streams followed on two Redis connections: one hears each
stream's bell, the other reads only the streams that rang.

Every writer of a conversation's events publishes on the stream's bell channel
(``RedisKeys.events_bell``) in the same round trip as its ``XADD``, after it
(``shared/event_stream.py``, ``ring``). A ``StreamReader`` is subscribed to the bells of the
streams it follows, on a connection of its own, and on a second one issues
``XREAD COUNT n STREAMS k1 … kj id1 … idj`` over the streams that rang since its last read,
each from the id of the last entry it handed on (never ``$``), so nothing appended between
two reads is missed. Bells that arrive while a read is in flight are gathered for the next.

Until this, the reader blocked in one ``XREAD`` naming every stream it followed and issued
it again after every reply: Redis's work for a read grows with the streams it names
(~0.85 µs each: 171 µs of Redis's CPU for a read of 200, against 10 for one), and a read
followed nearly every event, so the cost of an event grew with the conversations the
gateway followed. Now a read names the streams with news.

Nothing is lost when a bell is:

- a subscription's confirmation rings its stream, so the first read after it takes what was
  appended between the stream's starting position and the subscription;
- a bell connection that fails is opened again and every channel subscribed again, each
  confirmation ringing, so what was appended meanwhile is read;
- a writer that does not ring (an older release during an upgrade, a script) is read by the
  sweep: every ``sweep_s`` one read names every followed stream, and a ``PING`` on the
  bell connection keeps its silence from passing for a dead connection.

Commands are packed here rather than by redis-py: its generic packer costs ~5 µs per
argument, and each stream's bytes are encoded once, when it is added.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import Any

import redis.exceptions
from redis.asyncio.connection import AbstractConnection, ConnectionPool

from signalbox.shared.event_stream import id_after

log = logging.getLogger(__name__)

Entry = tuple[str, list[str]]  # (event id, [field, value, field, value, ...]) as Redis sends it
OnEntries = Callable[[str, list[Entry]], None]  # (stream key, new entries); must not block

READ_COUNT = 500  # entries per stream per read: bounds one reply when a stream has a backlog
RETRY_S = 0.5  # back-off after a Redis error, so an outage is not a busy loop
# A bell connection silent this long past a sweep's PING is taken for dead and opened again.
BELL_SILENCE_S = 10.0
SUBSCRIBE_BATCH = 500  # channels per SUBSCRIBE / UNSUBSCRIBE command


def _bulk(value: str) -> bytes:
    raw = value.encode()
    return b"$%d\r\n%b\r\n" % (len(raw), raw)


def _command(*parts: bytes) -> bytes:
    return b"*%d\r\n%b" % (len(parts), b"".join(parts))


_PING = _command(_bulk("PING"))
_XREAD = b"".join([_bulk("XREAD"), _bulk("COUNT"), _bulk(str(READ_COUNT)), _bulk("STREAMS")])


def _channel_commands(verb: str, channels: Iterable[str]) -> list[bytes]:
    """``SUBSCRIBE``/``UNSUBSCRIBE`` commands for ``channels``, a batch each."""
    bulks = [_bulk(c) for c in channels]
    return [
        _command(_bulk(verb), *bulks[i : i + SUBSCRIBE_BATCH])
        for i in range(0, len(bulks), SUBSCRIBE_BATCH)
    ]


class StreamReader:
    """Reads the streams whose bells rang, on two dedicated connections of ``pool``."""

    def __init__(self, pool: ConnectionPool, on_entries: OnEntries, sweep_s: float) -> None:
        self._pool = pool
        self._on_entries = on_entries
        self._sweep_s = sweep_s
        self._positions: dict[str, str] = {}  # stream key -> id of the last entry handed on
        self._key_bulks: dict[str, bytes] = {}  # the command's bytes of each key...
        self._id_bulks: dict[str, bytes] = {}  # ...and of its position, kept with it
        self._streams: dict[str, str] = {}  # bell channel -> stream key
        self._channels: dict[str, str] = {}  # stream key -> bell channel
        self._rung: set[str] = set()  # stream keys to read next
        self._sweep_due = False
        self._waiter: asyncio.Future[None] | None = None  # the reading loop, idle
        self._bells: AbstractConnection | None = None  # while subscribed
        self._unsent: set[str] = set()  # channels whose (un)subscription is not sent yet
        self._unconfirmed = 0  # subscriptions sent, not yet confirmed
        self._reading = False
        self._flushing: asyncio.Task[None] | None = None
        self.reads = 0  # XREADs issued (for tests and benchmarks)
        self.streams_read = 0  # streams they named, summed
        self.sweeps = 0  # reads of every stream, on the sweep's clock
        self.bell_connections = 0  # bell connections opened
        loop = asyncio.get_running_loop()
        self._sweeps = loop.call_later(sweep_s, self._sweep)
        self._listener = asyncio.create_task(self._listen(), name="relay-bells")
        self.task: asyncio.Task[None] = asyncio.create_task(self._run(), name="relay-reads")

    def __len__(self) -> int:
        return len(self._positions)

    @property
    def pending(self) -> bool:
        """Whether a bell may still ring for what is already appended (a subscription not yet
        confirmed, a bell not yet read, the bell connection down) or a read is in flight."""
        return bool(
            self._rung or self._reading or self._unsent or self._unconfirmed
            or (self._bells is None and self._positions)
        )  # fmt: skip

    def add(self, key: str, channel: str, position: str) -> None:
        """Follow ``key``, whose bell is ``channel``, from after ``position``: read once the
        subscription to its bell is confirmed (``flush`` sends it), then each time it rings."""
        self._positions[key] = position
        self._channels[key] = channel
        self._key_bulks[key] = _bulk(key)
        self._id_bulks[key] = _bulk(position)
        self._streams[channel] = key
        self._unsent.add(channel)

    def remove(self, key: str) -> None:
        """Stop following ``key`` (a read in flight may still return it; it is then ignored)."""
        if self._positions.pop(key, None) is None:
            return
        self._key_bulks.pop(key, None)
        self._id_bulks.pop(key, None)
        channel = self._channels.pop(key)
        self._streams.pop(channel, None)
        self._unsent.add(channel)
        if self._flushing is None or self._flushing.done():
            self._flushing = asyncio.create_task(self.flush(), name="relay-unsubscribe")

    async def flush(self) -> None:
        """Send the subscriptions and unsubscriptions of the streams added and removed since
        the last flush (a bell connection opened later subscribes to every stream anyway)."""
        while self._unsent:  # again if more came while one was sent
            connection = self._bells
            if connection is None or not connection.is_connected:
                return  # the listener's next connection subscribes to every stream
            unsent, self._unsent = self._unsent, set()
            wanted = [c for c in unsent if c in self._streams]
            dropped = [c for c in unsent if c not in self._streams]
            commands = _channel_commands("SUBSCRIBE", wanted)
            commands += _channel_commands("UNSUBSCRIBE", dropped)
            self._unconfirmed += len(wanted)
            try:
                # Beside the listener's read (a write and a read), and sent whole.
                await connection.send_packed_command(b"".join(commands), check_health=False)
            except Exception as exc:
                # The listener sees the connection fail too, and subscribes to every stream
                # again on the next one.
                log.warning("relay subscription failed: %r", exc)
                return

    async def aclose(self) -> None:
        """Stop both loops and close their connections."""
        self._sweeps.cancel()
        tasks = [t for t in (self.task, self._listener, self._flushing) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- the bell connection --------------------------------------------------------------

    def _ring(self, key: str) -> None:
        self._rung.add(key)
        self._wake_reads()

    def _wake_reads(self) -> None:
        """End the reading loop's idle wait, if it waits."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _sweep(self) -> None:
        """Every ``sweep_s``: the reading loop reads every stream and pings the bells."""
        self._sweeps = asyncio.get_running_loop().call_later(self._sweep_s, self._sweep)
        self._sweep_due = True
        self._wake_reads()

    async def _ping_bells(self) -> None:
        """A word from the bell connection before its silence times out, or its failure."""
        connection = self._bells
        # Never on a connection that failed: sending would open it again, unread.
        if connection is not None and connection.is_connected:
            with contextlib.suppress(Exception):  # a dead connection is the listener's to find
                await connection.send_packed_command(_PING, check_health=False)

    async def _listen(self) -> None:
        while True:
            connection = self._pool.make_connection()  # type: ignore[no-untyped-call]
            try:
                await self._listen_on(connection)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # Every channel is subscribed again on the next connection, and each
                # confirmation rings: what was appended meanwhile is read then.
                log.warning(
                    "relay bells failed (%d streams): %r; retrying", len(self), exc,
                    exc_info=not _is_redis_error(exc),
                )  # fmt: skip
            finally:
                self._bells = None
                await connection.disconnect()
            await asyncio.sleep(RETRY_S)

    async def _listen_on(self, connection: AbstractConnection) -> None:
        """Subscribe to every followed stream's bell and hear them, until the connection fails."""
        await connection.connect()  # type: ignore[no-untyped-call]
        self.bell_connections += 1
        # Set before the channels are listed, with no await between: a stream added from now
        # on is sent by ``flush`` on this connection, one added before is in the list.
        self._bells = connection
        self._unsent.clear()
        self._unconfirmed = len(self._streams)
        commands = _channel_commands("SUBSCRIBE", self._streams)
        if commands:
            await connection.send_packed_command(b"".join(commands), check_health=False)
        silence_s = self._sweep_s + BELL_SILENCE_S
        refused = False
        while True:
            try:
                message = await connection.read_response(timeout=silence_s)
            except redis.exceptions.ResponseError as exc:
                # A refused subscription (an ACL without the bells' channels): the connection
                # is sound, those streams are read at the sweep, and opening it again would
                # only be refused again.
                self._unconfirmed = 0
                if not refused:
                    log.error("relay bells refused: %s; read every %g s", exc, self._sweep_s)
                refused = True
                continue
            if message is None:  # not a word, not even the sweep's PONG: the connection is dead
                raise TimeoutError(f"no word on the bell connection for {silence_s:g} s")
            self._heard(message)

    def _heard(self, message: Any) -> None:
        # ["message", channel, data] for a bell, ["subscribe", channel, count] for a
        # confirmation: both mean "read this stream". Pongs and unsubscriptions: nothing.
        if isinstance(message, list) and len(message) == 3:
            kind, channel = message[0], message[1]
            if kind == "subscribe":
                self._unconfirmed = max(0, self._unconfirmed - 1)
            if kind in ("message", "subscribe"):
                key = self._streams.get(channel)
                if key is not None:
                    self._ring(key)

    # -- the read connection --------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        connection = self._pool.make_connection()  # type: ignore[no-untyped-call]
        try:
            while True:
                if not self._rung and not self._sweep_due:
                    self._waiter = loop.create_future()
                    try:
                        await self._waiter
                    finally:
                        self._waiter = None
                if self._sweep_due:
                    self._sweep_due = False
                    self.sweeps += 1
                    await self._ping_bells()
                    keys = list(self._positions)
                else:
                    keys = [k for k in self._rung if k in self._positions]
                self._rung.clear()
                if keys:
                    await self._read(connection, keys)
        finally:
            await connection.disconnect()

    async def _read(self, connection: AbstractConnection, keys: list[str]) -> None:
        command = b"".join(
            [
                b"*%d\r\n" % (4 + 2 * len(keys)),
                _XREAD,
                *(self._key_bulks[k] for k in keys),
                *(self._id_bulks[k] for k in keys),
            ]
        )
        self.reads += 1
        self.streams_read += len(keys)
        self._reading = True
        try:
            await connection.send_packed_command(command, check_health=False)
            reply: Any = await connection.read_response()
        except Exception as exc:
            # Positions are kept, and the streams ring again, so the next read resumes
            # where this one stood; whatever went wrong, the loop lives on: every
            # conversation depends on it.
            log.warning(
                "relay read failed (%d streams): %r; retrying", len(keys), exc,
                exc_info=not _is_redis_error(exc),
            )  # fmt: skip
            self._rung.update(keys)
            await connection.disconnect()
            await asyncio.sleep(RETRY_S)
            return
        finally:
            self._reading = False
        self._hand_on(reply)

    def _hand_on(self, reply: Any) -> None:
        for key, entries in reply or []:
            position = self._positions.get(key)
            if position is None:
                continue  # removed while the read was in flight
            if len(entries) >= READ_COUNT:
                self._rung.add(key)  # a backlog: the next read takes more of it
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


def _is_redis_error(exc: BaseException) -> bool:
    """An error Redis or the network gives (logged without a traceback)."""
    return isinstance(exc, redis.exceptions.RedisError | OSError | TimeoutError)
