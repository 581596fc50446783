"""What must never happen: writes outside the workspace, stale writes, two decisions."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from starlette.testclient import TestClient

from signalbox.services.proposals import apply
from signalbox.services.proposals.context import ServiceContext
from signalbox.shared.db import Outbox
from tests.proposals.conftest import Owner, Propose


def files_under(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file())


def test_changed_file_is_a_conflict_and_nothing_is_written(
    client: TestClient, ctx: ServiceContext, owner: Owner, propose: Propose
) -> None:
    (owner.workspace / "a.txt").write_text("v1\n")
    pid = propose(
        owner,
        [
            {"path": "b.txt", "operation": "create", "after": "b\n"},
            {"path": "a.txt", "operation": "update", "after": "v2\n"},
        ],
    ).json()["proposal_id"]
    (owner.workspace / "a.txt").write_text("edited meanwhile\n")

    response = client.post(f"/api/proposals/{pid}/approve", headers=owner.auth)
    assert response.status_code == 409
    body = response.json()
    assert body["status"] == "conflict"
    assert "a.txt" in body["detail"]
    by_path = {f["path"]: f for f in body["files"]}
    assert by_path["a.txt"]["changed"] is True
    assert "-edited meanwhile\n+v2\n" in by_path["a.txt"]["diff"]
    assert (owner.workspace / "a.txt").read_text() == "edited meanwhile\n"
    assert not (owner.workspace / "b.txt").exists()  # all or nothing
    assert client.get(f"/api/proposals/{pid}", headers=owner.auth).json()["status"] == "conflict"
    again = client.post(f"/api/proposals/{pid}/approve", headers=owner.auth)
    assert again.status_code == 409 and again.json()["status"] == "conflict"
    resolved = [
        e.data for e in ctx.events.read_after(owner.conversation_id, None)
        if e.kind == "proposal_resolved"
    ]  # fmt: skip
    assert resolved == [{"proposal_id": pid, "status": "conflict"}]


@pytest.mark.parametrize(
    "path",
    ["../escape.txt", "../default-evil/x.txt", "/tmp/abs-escape.txt", "sub/../../escape.txt", "."],
)
def test_paths_outside_the_workspace_are_refused(
    client: TestClient, owner: Owner, propose: Propose, path: str
) -> None:
    root = owner.workspace.parent.parent
    before = files_under(root)
    response = propose(owner, [{"path": path, "operation": "create", "after": "pwned"}])
    assert response.status_code == 422, response.text
    assert "detail" in response.json()
    assert files_under(root) == before
    assert not Path("/tmp/abs-escape.txt").exists()


def test_directory_swapped_for_a_symlink_after_proposing_is_refused(
    client: TestClient, owner: Owner, propose: Propose, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (owner.workspace / "sub").mkdir()
    (owner.workspace / "sub" / "keep.txt").write_text("k")
    pid = propose(
        owner,
        [
            {"path": "first.txt", "operation": "create", "after": "1"},
            {"path": "sub/new.txt", "operation": "create", "after": "pwned"},
        ],
    ).json()["proposal_id"]
    # After proposing, the directory is replaced by a link out of the workspace.
    (owner.workspace / "sub" / "keep.txt").unlink()
    (owner.workspace / "sub").rmdir()
    os.symlink(outside, owner.workspace / "sub")

    response = client.post(f"/api/proposals/{pid}/approve", headers=owner.auth)
    assert response.status_code == 409
    assert response.json()["status"] == "conflict"
    assert "leaves the workspace" in response.json()["detail"]
    assert list(outside.iterdir()) == []
    assert not (owner.workspace / "first.txt").exists()

    # Proposing through the link is refused from the start.
    direct = propose(owner, [{"path": "sub/other.txt", "operation": "create", "after": "x"}])
    assert direct.status_code == 422
    assert list(outside.iterdir()) == []


def test_concurrent_decisions_have_exactly_one_effect(
    client: TestClient,
    owner: Owner,
    propose: Propose,
    db_sessions: sessionmaker[Session],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pid = propose(owner, [{"path": "race.txt", "operation": "create", "after": "won"}]).json()[
        "proposal_id"
    ]
    writes: list[apply.Target] = []
    real_write = apply.write_atomic

    def counting_write(target: apply.Target, data: bytes, **kwargs: str) -> None:
        writes.append(target)
        real_write(target, data, **kwargs)

    monkeypatch.setattr(apply, "write_atomic", counting_write)

    start = threading.Barrier(20)
    answers: list[tuple[str, int, str]] = []
    lock = threading.Lock()

    def decide(action: str) -> None:
        start.wait()
        response = client.post(f"/api/proposals/{pid}/{action}", headers=owner.auth)
        with lock:
            answers.append((action, response.status_code, response.json()["status"]))

    threads = [
        threading.Thread(target=decide, args=("approve" if i % 2 else "reject",)) for i in range(20)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(answers) == 20

    final = {status for _, _, status in answers}
    assert len(final) == 1, answers  # every caller is told the one outcome
    outcome = final.pop()
    assert outcome in {"applied", "rejected"}
    winner_action = "approve" if outcome == "applied" else "reject"
    for action, code, _ in answers:
        assert code == (200 if action == winner_action else 409), answers
    with db_sessions() as session:
        rows = session.scalars(select(Outbox).where(Outbox.topic == "proposal_resolved")).all()
    assert len([r for r in rows if r.payload["proposal_id"] == pid]) == 1
    assert len(writes) == (1 if outcome == "applied" else 0)
    assert (owner.workspace / "race.txt").exists() == (outcome == "applied")


def test_sha256_is_over_the_raw_bytes(owner: Owner) -> None:
    (owner.workspace / "raw.bin").write_bytes(b"caf\xc3\xa9\r\n")
    assert apply.sha256_bytes((owner.workspace / "raw.bin").read_bytes()) == (
        hashlib.sha256(b"caf\xc3\xa9\r\n").hexdigest()
    )
