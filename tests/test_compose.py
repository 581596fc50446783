"""docker-compose.yml runs what this repo really has: entry points, settings, scaling.

No Docker engine is needed: the file is parsed and checked against the code.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic_settings import BaseSettings

from signalbox.cli import build_parser
from signalbox.processes import ServiceCommands
from signalbox.shared.settings import (
    CommonSettings,
    GatewaySettings,
    OrchestratorSettings,
    ProposalsSettings,
    ToolsSettings,
    load,
)

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"

# Which settings class each service of ours loads at start-up.
SETTINGS_OF: dict[str, type[BaseSettings]] = {
    "migrate": CommonSettings,
    "gateway": GatewaySettings,
    "proposals": ProposalsSettings,
    "orchestrator": OrchestratorSettings,
    "tools": ToolsSettings,
    "tools-sandbox": ToolsSettings,
    "scheduler": CommonSettings,
}
ENTRY_POINT = re.compile(r"\b((?:services|shared|signalbox)(?:\.\w+)+):(\w+)\b")
# `python -m signalbox.services.gateway.app`: a module of ours run as a program, through its main().
RUN_MODULE = re.compile(r"(?:^|\s)-m\s+((?:services|shared|signalbox)(?:\.\w+)+)(?=\s|$)")
INTERPOLATION = re.compile(r"\$\{(\w+)(?::?[-?]([^}]*))?\}")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = compose["services"]
    return result


def _ours(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Services built from this repo (not redis/postgres images)."""
    return {name: svc for name, svc in services.items() if "build" in svc}


def _words(value: Any) -> list[str]:
    return value.split() if isinstance(value, str) else [str(v) for v in value]


def _top_level_names(node: ast.stmt) -> set[str]:
    """Names a module-level statement binds."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    if isinstance(node, ast.ImportFrom):
        return {alias.asname or alias.name for alias in node.names}
    return set()


def _defined_at_top_level(path: Path, name: str) -> bool:
    tree = ast.parse(path.read_text(), filename=str(path))
    return any(name in _top_level_names(node) for node in tree.body)


def check_entry_point(module: str, attribute: str) -> None:
    """``module:attribute`` names a module file of this repo defining ``attribute``."""
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:  # a missing parent package
        spec = None
    assert spec is not None and spec.origin, f"no module {module!r} for {module}:{attribute}"
    origin = Path(spec.origin)
    assert ROOT in origin.parents, f"{module!r} resolves outside the repo: {origin}"
    # Parsed, not imported: importing a worker module would connect to Redis.
    assert _defined_at_top_level(origin, attribute), f"{origin} defines no {attribute!r}"


def test_entry_point_check_tells_real_from_missing() -> None:
    check_entry_point("signalbox.cli", "main")
    with pytest.raises(AssertionError):
        check_entry_point("signalbox.cli", "no_such_attribute")
    with pytest.raises(AssertionError):
        check_entry_point("signalbox.services.no_such_service.app", "create_app")


def _every_command(svc: dict[str, Any]) -> list[list[str]]:
    commands = [_words(svc["command"])] if "command" in svc else []
    test = svc.get("healthcheck", {}).get("test")
    if test:
        commands.append(_words(test))
    return commands


def test_every_entry_point_exists(services: dict[str, dict[str, Any]]) -> None:
    found = []
    for name, svc in _ours(services).items():
        for words in _every_command(svc):
            for module, attribute in ENTRY_POINT.findall(" ".join(words)):
                check_entry_point(module, attribute)
                found.append((name, module))
            for module in RUN_MODULE.findall(" ".join(words)):
                check_entry_point(module, "main")
                found.append((name, module))
    named = {name for name, _ in found}
    assert {"gateway", "proposals", "orchestrator", "tools", "scheduler"} <= named


def test_signalbox_subcommands_are_known_to_the_cli(services: dict[str, dict[str, Any]]) -> None:
    parser = build_parser()
    used = 0
    for svc in _ours(services).values():
        words = _words(svc.get("command", []))
        if words and words[0] == "signalbox":
            parser.parse_args(words[1:])  # SystemExit (a test failure) if unknown
            used += 1
    assert used, "expected the migrate service to run `signalbox migrate`"


def _shape(words: list[str]) -> dict[str, str]:
    """What must agree between compose and ServiceCommands: program, app, queues, pool."""
    if len(words) > 2 and words[1] == "-m":  # `python -m uvicorn` runs the same program
        words = words[2:]
    shape = {"program": words[0]}
    for flag, key in (("-A", "app"), ("-Q", "queues"), ("--pool", "pool")):
        if flag in words:
            shape[key] = words[words.index(flag) + 1]
    shape["entry"] = " ".join(m + ":" + a for m, a in ENTRY_POINT.findall(" ".join(words)))
    shape["factory"] = str("--factory" in words)
    shape["events"] = str("-E" in words)  # task events on, for Flower
    return shape


def test_commands_match_signalbox_up(services: dict[str, dict[str, Any]]) -> None:
    commands = ServiceCommands()
    expected = {
        "gateway": commands.gateway(8000),
        "proposals": commands.proposals(8001),
        "orchestrator": commands.orchestrator("orchestrator@%h"),
        # compose splits the two tool queues: run_python's workers get their own privileges
        "tools": commands.tools("tools@%h", "tools"),
        "tools-sandbox": commands.tools("sandbox@%h", "tools.sandbox"),
        "scheduler": commands.scheduler("scheduler@%h"),
    }
    for name, command in expected.items():
        assert _shape(_words(services[name]["command"])) == _shape(command), name


def _known_settings() -> set[str]:
    names: set[str] = set()
    for cls in SETTINGS_OF.values():
        for field_name, info in cls.model_fields.items():
            alias = info.validation_alias
            names.add(alias if isinstance(alias, str) else f"SIGNALBOX_{field_name.upper()}")
    return names


def test_every_variable_set_is_a_known_setting(services: dict[str, dict[str, Any]]) -> None:
    known = _known_settings()
    for name, svc in _ours(services).items():
        env = svc.get("environment", {})
        assert isinstance(env, dict), f"{name}: use the mapping form of environment"
        for variable in env:
            if variable.startswith(("SIGNALBOX_", "ANTHROPIC_")):
                assert variable in known, f"{name}: {variable} is no field of shared/settings.py"


def test_no_secret_is_written_in_the_file(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        env = svc.get("environment", {})
        for variable in ("SIGNALBOX_INTERNAL_TOKEN", "POSTGRES_PASSWORD", "ANTHROPIC_API_KEY"):
            if variable in env and env[variable] is not None:
                assert re.fullmatch(r"\$\{\w+:\?[^}]+\}", env[variable]), (
                    f"{name}: {variable} must come from `${{{variable}:?...}}`, "
                    f"got {env[variable]!r}"
                )
        url = env.get("SIGNALBOX_DATABASE_URL", "")
        assert "@" not in url or "${POSTGRES_PASSWORD:?" in url, f"{name}: password in {url!r}"


def _interpolate(value: str, given: dict[str, str]) -> str:
    def one(m: re.Match[str]) -> str:
        return given.get(m.group(1), m.group(2) or "")

    return INTERPOLATION.sub(one, value)


def test_each_service_environment_loads_its_settings(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    given = {"SIGNALBOX_INTERNAL_TOKEN": "x" * 32, "POSTGRES_PASSWORD": "pw"}
    for name, cls in SETTINGS_OF.items():
        with monkeypatch.context() as m:
            for variable in [v for v in os.environ if v.startswith("SIGNALBOX_")]:
                m.delenv(variable)
            for variable, value in services[name].get("environment", {}).items():
                if value is not None:
                    m.setenv(variable, _interpolate(str(value), given))
            settings = load(cls)
        assert isinstance(settings, CommonSettings)
        assert settings.database_url.startswith("postgresql://"), name
        assert settings.redis_url == "redis://redis:6379/0", name
        if hasattr(settings, "proposals_url"):
            assert settings.proposals_url == "http://proposals:8001", name


def test_tools_scale(services: dict[str, dict[str, Any]]) -> None:
    tools = services["tools"]
    assert "container_name" not in tools
    assert "ports" not in tools
    assert "%h" in " ".join(_words(tools["command"])), "worker names must differ per container"


def test_every_long_running_service_has_a_healthcheck(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        if svc.get("restart") == "no":
            continue  # one-shot (migrate)
        assert "healthcheck" in svc, f"{name} has no healthcheck"


def test_redis_never_evicts(services: dict[str, dict[str, Any]]) -> None:
    command = " ".join(_words(services["redis"]["command"]))
    assert "--maxmemory-policy noeviction" in command
    assert "--appendonly yes" in command


def test_shared_workspaces_volume(services: dict[str, dict[str, Any]]) -> None:
    for name in ("proposals", "tools"):
        root = services[name]["environment"]["SIGNALBOX_WORKSPACES_ROOT"]
        assert any(v.endswith(":" + root) for v in services[name]["volumes"]), name
    # run_python copies the conversation's workspace into its sandbox: it must see the
    # volume (or /workspace is always empty), and never write it.
    root = services["tools-sandbox"]["environment"]["SIGNALBOX_WORKSPACES_ROOT"]
    assert f"workspaces:{root}:ro" in services["tools-sandbox"]["volumes"]


def _table_rows(doc: str) -> set[str]:
    row = re.compile(r"^\| `((?:SIGNALBOX|ANTHROPIC)_\w+)` \|", re.M)
    return set(row.findall((ROOT / doc).read_text()))


def test_the_operations_guide_lists_every_setting() -> None:
    assert _table_rows("docs/operations.md") == _known_settings(), "its table is out of date"


def test_the_readme_lists_only_real_settings() -> None:
    rows = _table_rows("README.md")
    assert rows and rows <= _known_settings(), rows - _known_settings()


def test_internal_services_are_unreachable_from_outside(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    """Only the gateway publishes a port; Redis, PostgreSQL and the proposals service (whose
    /internal routes trust the internal token) are on the internal network alone."""
    internal = {name for name, net in compose["networks"].items() if (net or {}).get("internal")}
    assert internal, "no internal network"
    published = [name for name, svc in services.items() if svc.get("ports")]
    assert [name for name in published if "profiles" not in services[name]] == ["gateway"]
    # The optional UIs (Flower, Jaeger, Prometheus, Grafana) on this machine's loopback only.
    for name in published:
        if name != "gateway":
            for port in services[name]["ports"]:
                assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port!r} widely"
    for name in ("redis", "postgres", "proposals", "tools-sandbox"):
        assert set(services[name]["networks"]) <= internal, name
    for name, svc in services.items():
        assert svc.get("networks"), f"{name} is on the default network, which is not internal"
