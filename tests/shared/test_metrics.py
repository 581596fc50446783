"""The shared metrics plumbing: bounded labels, Celery queue depth read from a real Redis
behind a real Celery producer, and multiprocess mode across forked processes."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import redis
from celery import Celery
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from signalbox.redis_server import free_port
from signalbox.shared.celery_app import make_celery
from signalbox.shared.metrics import OTHER, CeleryQueues, LabelCap
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.settings import CommonSettings

ROOT = Path(__file__).resolve().parents[2]


def test_a_label_cap_passes_vouched_names_and_folds_the_rest_into_other() -> None:
    cap = LabelCap(3, ["read_file", "write_file"])
    assert cap("read_file") == "read_file"
    assert cap("made_up_by_the_model") == OTHER  # never vouched for: never a label
    cap.allow(["mcp__big__t1", "mcp__big__t2", "mcp__big__t3"])  # one fits under the cap
    labels = {cap(f"mcp__big__t{i}") for i in range(1, 4)}
    assert labels == {"mcp__big__t1", OTHER}
    assert cap.admit("claude-new") == OTHER  # full: a new name cannot take a place either
    assert cap("write_file") == "write_file"
    many = LabelCap(10)
    assert [many.admit(f"m{i}") for i in range(12)][-3:] == ["m9", OTHER, OTHER]


def _lengths(collector: CeleryQueues) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(collector)
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            found[s.labels.get("queue", s.name)] = s.value
    return found


def test_queue_lengths_count_every_priority_of_the_deployments_own_queues(
    redis_url: str, redis_prefix: str
) -> None:
    prefix = f"{redis_prefix}queues-{uuid.uuid4().hex[:6]}:"
    app: Celery = make_celery("probe", CommonSettings(redis_url=redis_url, redis_prefix=prefix))
    other: Celery = make_celery(
        "other", CommonSettings(redis_url=redis_url, redis_prefix=prefix + "x:")
    )
    client = redis.Redis.from_url(redis_url)
    try:
        # Nobody consumes these: they wait in Redis as a worker's backlog would.
        app.send_task("tools.run_tool", args=[{}], queue="tools")
        app.send_task("tools.run_tool", args=[{}], queue="tools", priority=6)
        app.send_task("orchestrator.run_turn", args=["t"], queue="orchestrator", priority=9)
        other.send_task("tools.run_tool", args=[{}], queue="tools")  # another deployment's
        lengths = _lengths(CeleryQueues(client, RedisKeys(prefix), ["tools", "orchestrator"]))
        assert lengths == {"tools": 2, "orchestrator": 1, "signalbox_celery_unacked": 0}
    finally:
        for key in client.scan_iter(match=f"{prefix}*"):
            client.delete(key)
        client.close()


def test_queue_lengths_leave_a_scrape_working_when_redis_is_down() -> None:
    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.5)
    assert _lengths(CeleryQueues(dead, RedisKeys("sb:"), ["tools"])) == {}


def test_multiprocess_mode_sums_forked_children_and_drops_a_killed_childs_live_gauge(
    tmp_path: Path,
) -> None:
    path = tmp_path / "prom"
    path.mkdir()
    (path / "counter_999999.db").write_bytes(b"a previous run's values")
    probe = subprocess.run(
        [sys.executable, "-m", "tests.shared.metrics_probe", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert probe.returncode == 0, probe.stderr
    report = json.loads(probe.stdout)
    values = report["values"]
    assert values["probe_runs_total"] == 3  # the dead children's counts stay counted
    assert values["probe_running"] == 1  # only the child still running
    assert "counter_999999.db" not in report["files"]  # emptied at start
    exited, killed, running = report["children"]
    live = [f for f in report["files"] if f.startswith("gauge_live")]
    # The main process's own (at 0) and the running child's; the dead children's dropped.
    assert live == sorted(f"gauge_livesum_{pid}.db" for pid in (report["main"], running))
    assert exited != killed
    assert f"counter_{killed}.db" in report["files"]
