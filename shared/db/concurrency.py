"""The two ways a read-then-write stays right when requests race, on SQLite and PostgreSQL.

``insert_or_get``: a row that must exist once per key (a user's ``user_limits``) is
inserted with ``ON CONFLICT DO NOTHING`` and then read. A "select, and insert if missing"
loses the race to a concurrent insert of the same key and fails its whole transaction with
an ``IntegrityError``; the conflict clause makes the second insert wait for the first
and then insert nothing, so both callers get the one row. ``insert_if_missing`` is the same
insert without the read, for a row that must only exist (a user's ``default`` workspace).

``lock_row``: when the decision to write depends on rows a unique key cannot guard (a
resent first message must find the turn its first send stored), the writers serialise on
a row they all share. A no-op update takes it: PostgreSQL's row lock (the value does not
change, so it is the weaker "no key update" lock that does not block foreign-key inserts),
SQLite's database write lock. ``SELECT ... FOR UPDATE`` would do on PostgreSQL only:
SQLite ignores it. A row is locked once per transaction: the checks of one submission (its
first-message check, then each quota) ask for the user's row in turn, and only the first
asks the server.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from sqlalchemy import Row, Update, bindparam, event, inspect, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, SessionTransaction

from signalbox.shared.db.models import Base
from signalbox.shared.db.session import core

M = TypeVar("M", bound=Base)


def insert_or_get(
    session: Session, model: type[M], values: Mapping[str, Any], key: Sequence[str]
) -> M:
    """The row of ``model`` whose ``key`` columns hold ``values``, inserted if missing.

    ``key`` must be the columns of a unique constraint of the table. ``values`` are used only
    when this call inserts; a row that exists (or that a concurrent transaction inserts and
    commits first) is returned as it is.
    """
    session.execute(_insert_statement(session, model, values, key))
    columns = inspect(model).columns
    found = session.scalars(select(model).where(*(columns[k] == values[k] for k in key))).one()
    return found


def insert_if_missing(
    session: Session, model: type[Base], values: Mapping[str, Any], key: Sequence[str]
) -> None:
    """``insert_or_get`` without reading the row back, for a caller that needs it to exist
    and nothing more (a workspace's row), as Core on the session's connection (``core``).
    Core: no ORM execution event sees it, so not for a table a Session listener watches
    (``user_limits``: ``tenancy.own_limits``)."""
    core(session).execute(_insert_statement(session, model, values, key))


def _insert_statement(
    session: Session, model: type[Base], values: Mapping[str, Any], key: Sequence[str]
) -> Any:
    """``INSERT ... ON CONFLICT (key) DO NOTHING`` of ``values`` into ``model``."""
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        statement: Any = postgresql.insert(model)
    elif dialect == "sqlite":
        statement = sqlite.insert(model)
    else:
        raise NotImplementedError(f"expected sqlite or postgresql, got {dialect!r}")
    return statement.values(**values).on_conflict_do_nothing(index_elements=list(key))


def lock_row(session: Session, model: type[Base], row_id: str) -> bool:
    """Hold ``model``'s row ``row_id`` (SQLite: the database) for writing until the transaction
    ends; False if there is no such row.

    Asked again in the same transaction, it answers from what the first call found, with no
    statement. A lock taken inside a savepoint is not remembered: rolling the savepoint back
    releases it, so the next call takes it again.
    """
    nested = session.in_nested_transaction()
    held = None if nested else _held_locks(session)
    if held is not None and (model, row_id) in held:
        return held[(model, row_id)]
    result: Any = core(session).execute(_lock_statement(model), {"row_id": row_id})
    found = bool(result.rowcount)
    if held is not None:
        held[(model, row_id)] = found
    return found


def lock_row_returning(
    session: Session,
    model: type[Base],
    row_id: str,
    columns: Sequence[str],
    match: Mapping[str, Any] | None = None,
) -> Row[Any] | None:
    """``lock_row`` that reads ``columns`` of the row in the same statement (``UPDATE ...
    RETURNING``: a read and its lock, one statement where they were two), and takes the row
    only if its columns also equal ``match`` (its owner, say); None, nothing locked, if there
    is no such row. Remembered for the transaction as ``lock_row``'s lock is."""
    match = match or {}
    statement = _lock_returning_statement(model, tuple(columns), tuple(sorted(match)))
    params = {"row_id": row_id, **{f"match_{key}": value for key, value in match.items()}}
    row = core(session).execute(statement, params).first()
    if row is not None and not session.in_nested_transaction():
        _held_locks(session)[(model, row_id)] = True
    return row


@functools.cache
def _lock_returning_statement(
    model: type[Base], columns: tuple[str, ...], match: tuple[str, ...]
) -> Update:
    """``_lock_statement`` of the rows whose ``match`` columns equal their parameters, and
    returning ``columns``: built once per shape."""
    found = inspect(model).columns
    (pk,) = inspect(model).primary_key
    matching = [found[key] == bindparam(f"match_{key}") for key in match]
    return (
        update(model)
        .where(pk == bindparam("row_id"), *matching)
        .values({pk.key: pk})
        .returning(*(found[name] for name in columns))
    )


@functools.cache
def _lock_statement(model: type[Base]) -> Update:
    """``model``'s row lock, built once: an ``UPDATE`` that writes the key onto itself, so
    no loaded object changes (run as Core: nothing for the ORM to synchronise)."""
    (pk,) = inspect(model).primary_key
    return update(model).where(pk == bindparam("row_id")).values({pk.key: pk})


def _held_locks(session: Session) -> dict[tuple[type[Base], str], bool]:
    """The rows ``lock_row`` took in ``session``'s current transaction (its outermost)."""
    return per_transaction(session, "signalbox_locked_rows")


def per_transaction(session: Session, name: str) -> dict[Any, Any]:
    """A dict kept in ``session.info`` under ``name`` for the life of the session's current
    (outermost) transaction, and dropped when it ends (``_forget_at_end``). Begins the
    transaction if none has begun yet (as the statement about to run would), so what is
    kept is its own."""
    transaction = session.get_transaction() or session.begin()
    kept = session.info.get(_PER_TRANSACTION)
    if kept is None or kept[0] is not transaction:
        kept = (transaction, {})
        session.info[_PER_TRANSACTION] = kept
    memos: dict[str, dict[Any, Any]] = kept[1]
    found = memos.get(name)
    if found is None:
        found = memos[name] = {}
    return found


_PER_TRANSACTION = "signalbox_per_transaction"


@event.listens_for(Session, "after_transaction_end")
def _forget_at_end(session: Session, transaction: SessionTransaction) -> None:
    """What ``per_transaction`` kept goes with its transaction (and holds no object, nor the
    transaction, past it)."""
    if transaction.parent is None:
        session.info.pop(_PER_TRANSACTION, None)
