"""The apply journal in-process: an apply that stopped half-way is undone before anything else.

A killed process is simulated by an apply whose journal is never finished (the real kill is
in ``test_proposals_crash.py``); what matters here is who settles it and how.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker
from starlette.testclient import TestClient

from signalbox.services.proposals import apply, journal, recovery
from signalbox.services.proposals.apply import Applied, FileChange, JournalSpec, apply_changes
from signalbox.services.proposals.context import ServiceContext
from signalbox.services.proposals.sweeper import Sweeper
from signalbox.shared.db import Proposal
from tests.proposals.conftest import Owner, Propose

OLD = {"a.txt": "a old\n", "b.txt": "b old\n"}
NEW = {"a.txt": "a new\n", "b.txt": None, "d/c.txt": "c new\n"}  # b.txt is deleted


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def contents(owner: Owner) -> dict[str, str | None]:
    paths = {name: owner.workspace / name for name in sorted({*OLD, *NEW})}
    return {name: p.read_text() if p.exists() else None for name, p in paths.items()}


def make_proposal(owner: Owner, propose: Propose) -> str:
    for name, text in OLD.items():
        (owner.workspace / name).write_text(text)
    response = propose(
        owner,
        [
            {"path": "a.txt", "operation": "update", "after": NEW["a.txt"]},
            {"path": "b.txt", "operation": "delete"},
            {"path": "d/c.txt", "operation": "create", "after": NEW["d/c.txt"]},
        ],
    )
    assert response.status_code == 201, response.text
    pid: str = response.json()["proposal_id"]
    return pid


def changes() -> list[FileChange]:
    return [
        FileChange("a.txt", "update", NEW["a.txt"], sha(OLD["a.txt"])),
        FileChange("b.txt", "delete", None, sha(OLD["b.txt"])),
        FileChange("d/c.txt", "create", NEW["d/c.txt"], None),
    ]


def killed_apply(ctx: ServiceContext, owner: Owner, pid: str) -> journal.Journal:
    """Every file written, journal left behind, nothing committed: as a kill before commit."""
    applied = apply_changes(owner.workspace, changes(), JournalSpec(ctx.journal_root, pid, pid))
    assert applied.journal is not None
    # A temp file of the same apply that was never renamed, and a user's look-alike file.
    (owner.workspace / f"{applied.journal.temp_prefix}x1").write_text("half")
    (owner.workspace / ".sb-apply-mine").write_text("not ours")
    assert contents(owner) == NEW
    return applied.journal


@pytest.fixture
def pid(client: TestClient, owner: Owner, propose: Propose) -> str:
    return make_proposal(owner, propose)


def test_the_journal_is_kept_outside_every_workspace(
    ctx: ServiceContext, owner: Owner, pid: str
) -> None:
    record = killed_apply(ctx, owner, pid)
    root = Path(ctx.settings.workspaces_root).resolve()
    assert record.directory.parent == root / journal.JOURNAL_DIR
    assert owner.workspace not in record.directory.parents
    assert (record.directory.stat().st_mode & 0o777) == 0o700
    reread = journal.read(record.directory)
    assert reread is not None and reread.proposal_id == pid
    assert [(f.path, f.backup is None) for f in reread.files] == [
        ("a.txt", False),
        ("b.txt", False),
        ("d/c.txt", True),  # was absent
    ]
    assert reread.created_dirs == ("d",)


@pytest.mark.parametrize("decision", ["reject", "approve"])
def test_a_decision_first_rolls_back_an_apply_that_never_committed(
    client: TestClient, ctx: ServiceContext, owner: Owner, pid: str, decision: str
) -> None:
    killed_apply(ctx, owner, pid)
    response = client.post(f"/api/proposals/{pid}/{decision}", headers=owner.auth)
    assert response.status_code == 200, response.text
    expected = NEW if decision == "approve" else {**OLD, "d/c.txt": None}
    assert contents(owner) == expected
    if decision == "reject":
        assert not (owner.workspace / "d").exists()  # the directory the apply made is gone
    leftovers = sorted(p.name for p in owner.workspace.iterdir() if p.name.startswith(".sb-"))
    assert leftovers == [".sb-apply-mine"]  # only our own temp files are removed
    assert journal.find(ctx.journal_root) == []


def test_a_file_edited_after_the_crash_is_left_as_the_human_made_it(
    client: TestClient, ctx: ServiceContext, owner: Owner, pid: str
) -> None:
    killed_apply(ctx, owner, pid)
    (owner.workspace / "a.txt").write_text("edited by hand\n")
    response = client.post(f"/api/proposals/{pid}/reject", headers=owner.auth)
    assert response.status_code == 200, response.text
    assert contents(owner) == {"a.txt": "edited by hand\n", "b.txt": OLD["b.txt"], "d/c.txt": None}


def test_the_sweep_rolls_back_and_the_proposal_stays_pending(
    ctx: ServiceContext, owner: Owner, pid: str, db_sessions: sessionmaker[Session]
) -> None:
    killed_apply(ctx, owner, pid)
    Sweeper(ctx, 3600).sweep_once()
    assert contents(owner) == {**OLD, "d/c.txt": None}
    assert journal.find(ctx.journal_root) == []
    with db_sessions() as session:
        proposal = session.get(Proposal, pid)
        assert proposal is not None and proposal.status == "pending"
    assert recovery.recover(ctx) == 0  # nothing left to settle


def test_an_incomplete_journal_is_dropped_without_touching_files(
    ctx: ServiceContext, owner: Owner, pid: str
) -> None:
    record = killed_apply(ctx, owner, pid)
    (record.directory / journal.RECORD).unlink()  # killed while writing it: nothing renamed yet
    assert recovery.recover(ctx) == 1
    assert contents(owner) == NEW
    assert journal.find(ctx.journal_root) == []


@pytest.fixture
def unfinished(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Applies whose process dies right after commit, before it drops its journal."""
    monkeypatch.setattr(Applied, "finish", lambda self: None)
    yield


def test_a_committed_partial_approval_is_never_rolled_back(
    client: TestClient, ctx: ServiceContext, owner: Owner, pid: str, unfinished: None
) -> None:
    part = client.post(
        f"/api/proposals/{pid}/approve", headers=owner.auth, json={"files": ["a.txt"]}
    )
    assert part.status_code == 200, part.text
    assert [journal.proposal_of(d) for d in journal.find(ctx.journal_root)] == [pid]
    # The parent is pending again; its next decision finds the child's journal and sees
    # that the child is applied: a.txt keeps its new content.
    rest = client.post(f"/api/proposals/{pid}/reject", headers=owner.auth)
    assert rest.status_code == 200, rest.text
    assert contents(owner) == {"a.txt": NEW["a.txt"], "b.txt": OLD["b.txt"], "d/c.txt": None}
    assert journal.find(ctx.journal_root) == []


def test_recovery_waits_for_an_apply_in_flight_instead_of_undoing_it(
    client: TestClient,
    ctx: ServiceContext,
    owner: Owner,
    pid: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_write = apply.write_atomic
    recovering: list[threading.Thread] = []

    def write_then_recover(target: apply.Target, data: bytes, **kwargs: str) -> None:
        real_write(target, data, **kwargs)
        if not recovering:  # mid-apply, with its journal on disk and its row locked
            thread = threading.Thread(target=recovery.recover, args=(ctx,))
            recovering.append(thread)
            thread.start()
            thread.join(timeout=0.5)
            assert thread.is_alive(), "recovery did not wait for the proposal's lock"

    monkeypatch.setattr(apply, "write_atomic", write_then_recover)
    response = client.post(f"/api/proposals/{pid}/approve", headers=owner.auth)
    assert response.status_code == 200, response.text
    recovering[0].join(timeout=30)
    assert not recovering[0].is_alive()
    assert contents(owner) == NEW  # the committed apply was not undone
    assert journal.find(ctx.journal_root) == []
