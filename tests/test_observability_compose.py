"""docker-compose's probes and its optional observability profile hold together.

No Docker engine is needed: the files are parsed and checked against the code and each
other (the probe itself is run against real processes in tests/test_probe.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "signalbox.json"

# The Celery workers' metrics ports (SIGNALBOX_METRICS_PORT), as deploy/prometheus.yml
# scrapes them.
WORKER_METRICS_PORTS = {
    "orchestrator": 9101,
    "tools": 9102,
    "tools-sandbox": 9102,
    "scheduler": 9103,
}
HTTP_PORTS = {"gateway": 8000, "proposals": 8001}
WORKER_QUEUES = {
    "orchestrator": "orchestrator",
    "tools": "tools",
    "tools-sandbox": "tools.sandbox",
    "scheduler": "scheduler",
}
METRIC = re.compile(r"\bsignalbox_[a-z0-9_]+")
SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    result: dict[str, dict[str, Any]] = data["services"]
    return result


def _words(value: Any) -> list[str]:
    return value.split() if isinstance(value, str) else [str(v) for v in value]


def _base(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def test_each_worker_is_probed_by_its_own_name_and_queue(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, queue in WORKER_QUEUES.items():
        command = _words(services[name]["command"])
        worker_name = command[command.index("-n") + 1]
        test = _words(services[name]["healthcheck"]["test"])
        assert test[:5] == ["CMD", "python", "-m", "signalbox.probe", "worker"], name
        assert test[5] == worker_name, f"{name} probes {test[5]!r}, runs as {worker_name!r}"
        assert test[test.index("--queue") + 1] == queue, name


def test_http_services_are_probed_for_readiness(services: dict[str, dict[str, Any]]) -> None:
    for name, port in HTTP_PORTS.items():
        test = _words(services[name]["healthcheck"]["test"])
        assert test[-1] == f"http://127.0.0.1:{port}/readyz", name


def test_workers_send_task_events(services: dict[str, dict[str, Any]]) -> None:
    for name in WORKER_QUEUES:
        assert "-E" in _words(services[name]["command"]), name


def test_the_optional_services_run_only_in_a_profile(services: dict[str, dict[str, Any]]) -> None:
    for name in ("jaeger", "prometheus", "grafana"):
        assert services[name]["profiles"] == ["observability"], name
    assert set(services["flower"]["profiles"]) == {"flower", "observability"}


def test_flower_and_grafana_refuse_to_start_without_a_password(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, variable in (
        ("flower", "FLOWER_BASIC_AUTH"),
        ("grafana", "GF_SECURITY_ADMIN_PASSWORD"),
    ):
        script = " ".join(_words(services[name]["entrypoint"]))
        assert f'if [ -z "$${variable}" ]' in script and "exit 1" in script, name
        assert variable in services[name]["environment"], name


def test_prometheus_scrapes_every_service(services: dict[str, dict[str, Any]]) -> None:
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    targets: dict[str, int] = {}
    for job in config["scrape_configs"]:
        for sd in job["dns_sd_configs"]:
            for name in sd["names"]:
                targets[name] = sd["port"]
    assert targets == {**HTTP_PORTS, **WORKER_METRICS_PORTS}
    assert set(targets) <= set(services)
    # Prometheus must reach them: it sits on the network they are on.
    assert "backend" in services["prometheus"]["networks"]


def test_grafana_provisioning_points_at_the_mounted_files(
    services: dict[str, dict[str, Any]],
) -> None:
    provisioning = DEPLOY / "grafana" / "provisioning"
    source = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    (datasource,) = source["datasources"]
    assert datasource["url"] == "http://prometheus:9090"
    provider = yaml.safe_load((provisioning / "dashboards" / "signalbox.yml").read_text())
    path = provider["providers"][0]["options"]["path"]
    assert f"./deploy/grafana/dashboards:{path}:ro" in services["grafana"]["volumes"]
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == datasource["uid"], panel["title"]


def _metrics_in_code() -> set[str]:
    names: set[str] = set()
    for folder in ("shared", "services"):
        for path in (ROOT / folder).rglob("*.py"):
            for literal in re.findall(r"[\"'](signalbox_[a-z0-9_]+)[\"']", path.read_text()):
                names.add(_base(literal))
    return names


def test_every_dashboard_panel_queries_series_that_exist() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["panels"], "an empty dashboard"
    known = _metrics_in_code()
    assert "signalbox_turns" in known  # the scan finds the gateway's metrics
    for panel in dashboard["panels"]:
        exprs = [target["expr"] for target in panel["targets"]]
        assert exprs, panel["title"]
        for expr in exprs:
            used = {_base(name) for name in METRIC.findall(expr)}
            assert used, f"{panel['title']}: {expr!r} queries no signalbox series"
            assert used <= known, f"{panel['title']}: no such series {sorted(used - known)}"
