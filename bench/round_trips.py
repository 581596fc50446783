"""``python -m bench.round_trips POSTGRES_URL [TURNS]``: what one turn sends to PostgreSQL.

The ``turn`` benchmark's in-process loop (as ``bench.profile_loop`` runs it) on a fresh
database of the server at ``POSTGRES_URL``, ``TURNS`` times (default 10) after a warm-up,
counted in the driver: statements, the transaction commands psycopg sends around them
(``BEGIN``, ``COMMIT``, ``ROLLBACK``, ``DEALLOCATE``), the pool's pings, and how psycopg
ran each execution (``prepared: YES``; an ``executemany`` counts one per row, a ping one).
An execution that prepares its statement (``prepared: SHOULD``) costs a round trip of its
own for the ``PREPARE`` before the one that runs it, and the total counts it.
Counts, unlike times, do not move with the machine; bench/analysis.md ("eleventh pass")
quotes them.

It wraps two of psycopg's internals (``BaseConnection._exec_command`` and
``PrepareManager.get``) for the count: a tool for reading, not a benchmark of record.
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

from psycopg._connection_base import BaseConnection
from psycopg._preparing import PrepareManager
from sqlalchemy import event
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.engine import Engine

from bench import turns
from bench.environment import BenchEnv
from signalbox.services.orchestrator.loop import run_turn

WARMUP_TURNS = 3


class _Counts:
    """What the wrapped calls saw while ``on``."""

    def __init__(self) -> None:
        self.on = False
        self.seen: Counter[str] = Counter()

    def add(self, what: str) -> None:
        if self.on:
            self.seen[what] += 1


def _instrument(counts: _Counts) -> None:
    exec_command = BaseConnection._exec_command
    prepare_get = PrepareManager.get
    do_ping: Any = PGDialect_psycopg.do_ping  # untyped in SQLAlchemy

    def counted_command(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(command, bytes | bytearray | memoryview):
            counts.add(bytes(command).split(maxsplit=1)[0].decode())
        return exec_command(self, command, *args, **kwargs)

    def counted_prepare(self: Any, query: Any, prepare: Any = None) -> Any:
        found = prepare_get(self, query, prepare)
        counts.add(f"prepared: {found[0].name}")
        return found

    def counted_ping(self: Any, dbapi_connection: Any) -> bool:
        counts.add("ping")
        return bool(do_ping(self, dbapi_connection))

    BaseConnection._exec_command = counted_command  # type: ignore[method-assign]
    PrepareManager.get = counted_prepare  # type: ignore[method-assign]
    PGDialect_psycopg.do_ping = counted_ping  # type: ignore[method-assign]

    @event.listens_for(Engine, "before_cursor_execute")
    def _statement(*_args: Any) -> None:
        counts.add("statement")


def main(argv: list[str]) -> int:
    """Count ``argv[1]`` (default 10) in-process turns on the server at ``argv[0]``."""
    if not argv or not argv[0].startswith("postgres"):
        print("usage: python -m bench.round_trips POSTGRES_URL [TURNS]", file=sys.stderr)
        return 2
    count = int(argv[1]) if len(argv) > 1 else 10
    counts = _Counts()
    _instrument(counts)
    env = BenchEnv.start(postgres=argv[0])
    try:
        env.tools(1, turns.TOOLS_PER_STEP)  # only for the catalogue the loop reads
        user_id, _token = env.user()
        runtime = turns.in_process_runtime(env)
        for _ in range(WARMUP_TURNS):
            run_turn(runtime, turns.queued_turn(env, user_id))
        queued = [turns.queued_turn(env, user_id) for _ in range(count)]
        counts.on = True
        for turn_id in queued:
            run_turn(runtime, turn_id)
        counts.on = False
        turns.stop_runtime(runtime)
    finally:
        env.stop()
    trips = sum(n for what, n in counts.seen.items() if not what.startswith("prepared"))
    trips += counts.seen["prepared: SHOULD"]  # its PREPARE went alone, before the run
    print(f"{count} turns of {turns.MODEL_STEPS} model steps; per turn:")
    for what, n in sorted(counts.seen.items()):
        print(f"  {what:<22} {n / count:6.1f}")
    print(f"  {'round trips':<22} {trips / count:6.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
