"""The apply path attacked: a directory on the target path swapped for a symlink out of it.

A hostile agent owns its workspace, so it can rename entries in it as fast as the kernel
lets it. A second process exchanges a real directory with a symlink to a directory outside
the workspace (``renameat2(RENAME_EXCHANGE)``: the name always exists, as a directory or as
the link), while proposals writing under that directory are approved over real HTTP
against a real proposals process. Which approvals win the race varies per run; what must
hold does not: nothing ever lands outside, every answer is 200 or 409, no temp file is left,
and SQL agrees with the disk.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from signalbox.services.proposals.journal import JOURNAL_DIR, TEMP_PREFIX
from signalbox.shared.db import Proposal
from tests import http_calls
from tests.proposals.conftest import Owner, ServiceProcess, StartService

RENAME_EXCHANGE = 2  # linux/fs.h: swap two names atomically
SWAPPED_DIR = "sub"
PARKED_LINK = "parked-link"  # the symlink's name while the directory holds SWAPPED_DIR
PROPOSALS = 60
APPROVERS = 4
SWAPS_PER_CHECK = 64  # even, so the loop always stops with the directory back in place
MIN_SWAPS = 200  # the race must really have run all along the approvals
DEADLINE_S = 60.0  # a hang fails the test instead of stalling the suite

Answer = httpx.Response | str  # str: the connection failed, no HTTP answer at all


def exchange_supported(directory: Path) -> bool:
    """True if this kernel and filesystem swap a directory and a symlink atomically."""
    probe = directory / "exchange-probe"
    probe.mkdir()
    (probe / "dir").mkdir()
    os.symlink("dir", probe / "link")
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(probe, os.O_RDONLY | os.O_DIRECTORY)
    try:
        ok = libc.renameat2(fd, b"dir", fd, b"link", RENAME_EXCHANGE) == 0
    finally:
        os.close(fd)
    ok = ok and (probe / "dir").is_symlink()
    shutil.rmtree(probe)
    return ok


def swap_until_stopped(
    workspace: str, stop: Event, running: Event, swaps: Synchronized[int]
) -> None:
    """The attacker: exchange the directory and the link as fast as possible until ``stop``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY)
    done = 0
    try:
        while not stop.is_set():
            for _ in range(SWAPS_PER_CHECK):
                if libc.renameat2(
                    fd, SWAPPED_DIR.encode(), fd, PARKED_LINK.encode(), RENAME_EXCHANGE
                ):
                    err = ctypes.get_errno()
                    raise OSError(err, os.strerror(err))
            done += SWAPS_PER_CHECK
            running.set()
    finally:
        os.close(fd)
        swaps.value = done


def files_in(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


def create_proposal(service: ServiceProcess, owner: Owner, token: str, n: int) -> str:
    files = [
        {"path": f"top-{n}.txt", "operation": "create", "after": f"top {n}\n"},
        {"path": f"{SWAPPED_DIR}/f-{n}.txt", "operation": "create", "after": f"sub {n}\n"},
    ]
    response = http_calls.post(
        service.url("/internal/proposals"),
        headers={"X-Signalbox-Internal-Token": token},
        json={"user_id": owner.user_id, "conversation_id": owner.conversation_id, "files": files},
    )
    assert response.status_code == 201, response.text
    pid: str = response.json()["proposal_id"]
    return pid


def approve_all(service: ServiceProcess, owner: Owner, pids: list[str]) -> dict[str, Answer]:
    """Approve every proposal, ``APPROVERS`` at a time; the answer to each."""
    todo: queue.Queue[str] = queue.Queue()
    for pid in pids:
        todo.put(pid)
    answers: dict[str, Answer] = {}
    lock = threading.Lock()

    def approver() -> None:
        with http_calls.Client() as client:
            while True:
                try:
                    pid = todo.get_nowait()
                except queue.Empty:
                    return
                url = service.url(f"/api/proposals/{pid}/approve")
                try:
                    answer: Answer = client.post(url, headers=owner.auth)
                except httpx.TransportError as exc:  # a dropped connection is an answer too
                    answer = repr(exc)
                with lock:
                    answers[pid] = answer

    threads = [threading.Thread(target=approver) for _ in range(APPROVERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=DEADLINE_S)
    assert not any(t.is_alive() for t in threads), "approvals hung"
    return answers


def test_approvals_racing_a_directory_swapped_for_an_outside_symlink_never_escape(
    start_service: StartService,
    make_owner: Callable[[], Owner],
    internal_token: str,
    db_sessions: sessionmaker[Session],
    tmp_path: Path,
) -> None:
    if not exchange_supported(tmp_path):
        pytest.skip("renameat2(RENAME_EXCHANGE) is not supported here")
    owner = make_owner()
    outside = tmp_path / "outside"
    outside.mkdir()
    (owner.workspace / SWAPPED_DIR).mkdir()
    os.symlink(outside, owner.workspace / PARKED_LINK)
    service = start_service(SIGNALBOX_OUTBOX_SWEEP_S="3600")
    pids = {create_proposal(service, owner, internal_token, n): n for n in range(PROPOSALS)}

    spawn = multiprocessing.get_context("spawn")
    stop, running = spawn.Event(), spawn.Event()
    swaps = spawn.Value("q", 0)
    attacker = spawn.Process(
        target=swap_until_stopped, args=(str(owner.workspace), stop, running, swaps)
    )
    attacker.start()
    try:
        assert running.wait(timeout=DEADLINE_S), "the swapping process never started"
        started = time.monotonic()
        answers = approve_all(service, owner, list(pids))
        elapsed_s = time.monotonic() - started
    finally:
        stop.set()
        attacker.join(timeout=DEADLINE_S)
    assert attacker.exitcode == 0, "the swapping process failed"
    assert (owner.workspace / SWAPPED_DIR).is_dir() and (owner.workspace / PARKED_LINK).is_symlink()

    codes = {
        pid: a.status_code if isinstance(a, httpx.Response) else 0 for pid, a in answers.items()
    }
    counts = {code: list(codes.values()).count(code) for code in sorted(set(codes.values()))}
    print(f"swaps={swaps.value} approvals={len(answers)} answers={counts} in {elapsed_s:.2f} s")
    assert swaps.value >= MIN_SWAPS
    assert len(answers) == PROPOSALS
    assert files_in(outside) == []  # nothing ever written through the link
    assert set(codes.values()) <= {200, 409}, [
        a if isinstance(a, str) else (a.status_code, a.text[:200])
        for pid, a in answers.items()
        if codes[pid] not in (200, 409)
    ]
    root = owner.workspace.parent.parent
    assert [p for p in files_in(root) if Path(p).name.startswith(TEMP_PREFIX)] == []
    journal_dir = root / JOURNAL_DIR
    assert not journal_dir.exists() or files_in(journal_dir) == []

    with db_sessions() as session:
        rows = session.scalars(select(Proposal).where(Proposal.id.in_(list(pids))))
        status = {row.id: row.status for row in rows}
    for pid, n in pids.items():
        answer = answers[pid]
        assert isinstance(answer, httpx.Response)
        top, sub = owner.workspace / f"top-{n}.txt", owner.workspace / SWAPPED_DIR / f"f-{n}.txt"
        if codes[pid] == 200:
            assert status[pid] == "applied"
            assert answer.json()["status"] == "applied"
            assert top.read_text() == f"top {n}\n" and sub.read_text() == f"sub {n}\n"
        else:  # refused as a whole: the proposal is a conflict and nothing of it was written
            body = answer.json()
            assert status[pid] == body["status"] == "conflict", body
            assert f"{SWAPPED_DIR}/f-{n}.txt" in body["detail"], body
            assert not top.exists() and not sub.exists()
