"""A deployment's own tools (module paths, entry points) and its time-limit and queue overrides."""

from __future__ import annotations

import json
from importlib.metadata import EntryPoint

import pytest

from signalbox.services.tools import plugins
from signalbox.services.tools.catalogue import load_tools, served, worker_tools
from signalbox.services.tools.plugins import ENTRY_POINT_GROUP, ToolLoadError
from signalbox.shared.settings import SettingsError, ToolsSettings, load
from tests.tools.conftest import ToolEnv


def _settings(**update: object) -> ToolsSettings:
    return load(ToolsSettings).model_copy(update=update)


def test_tool_modules_from_the_environment_are_served(
    service_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tool_env: ToolEnv
) -> None:
    monkeypatch.setenv(
        "SIGNALBOX_TOOL_MODULES",
        json.dumps(["tests.tools.deploy_tools", "tests.tools.deploy_tools:extra"]),
    )
    monkeypatch.setenv("SIGNALBOX_TOOL_TIMEOUTS", json.dumps({"read_file": 5, "shout": 2.5}))
    monkeypatch.setenv("SIGNALBOX_TOOL_QUEUES", json.dumps({"whisper": "tools.extra"}))
    registry = worker_tools(load(ToolsSettings), environ={})
    specs = {s.name: s for s in registry.specs()}
    assert {"shout", "whisper", "read_file", "run_python"} <= set(specs)
    assert (specs["read_file"].timeout_s, specs["shout"].timeout_s) == (5.0, 2.5)
    assert specs["list_dir"].timeout_s == 10.0  # untouched
    assert (specs["whisper"].queue, specs["shout"].queue) == ("tools.extra", "tools")
    assert [s.name for s in served(registry.specs(), ["tools.extra"])] == ["whisper"]

    tool_env.registry = registry
    result = tool_env.run("shout", text="hello")
    assert (result.status, result.output) == ("ok", "HELLO")


def test_entry_points_are_loaded_in_name_order() -> None:
    points = [
        EntryPoint("zeta", "tests.tools.deploy_tools:extra", ENTRY_POINT_GROUP),
        EntryPoint("acme", "tests.tools.deploy_tools", ENTRY_POINT_GROUP),
    ]
    registries = plugins.from_entry_points(lambda: points)
    assert [r.names() for r in registries] == [["shout"], ["whisper"]]


def test_an_entry_point_that_does_not_load_names_itself() -> None:
    broken = [EntryPoint("broken", "tests.tools.no_such_module:registry", ENTRY_POINT_GROUP)]
    with pytest.raises(ToolLoadError, match=r"broken = tests\.tools\.no_such_module:registry"):
        plugins.from_entry_points(lambda: broken)


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("tests.tools.no_such_module", "cannot import tool module 'tests.tools.no_such_module'"),
        ("tests.tools.deploy_tools:missing", "has no attribute 'missing'"),
        ("tests.tools.deploy_tools:not_a_registry", "expected a signalbox.services.tools Registry"),
        ("tests.tools.conftest", "module 'tests.tools.conftest' has no attribute 'registry'"),
    ],
)
def test_a_tool_module_that_is_no_registry_fails_start_up_naming_it(
    service_env: dict[str, str], path: str, message: str
) -> None:
    with pytest.raises(ToolLoadError, match=message):
        worker_tools(_settings(tool_modules=[path]), environ={})


def test_overrides_of_unknown_tools_or_bad_limits_are_refused(
    service_env: dict[str, str],
) -> None:
    with pytest.raises(ValueError, match=r"unknown tools \['raed_file'\]"):
        worker_tools(_settings(tool_timeouts={"raed_file": 5}), environ={})
    with pytest.raises(ValueError, match="unknown tools"):
        worker_tools(_settings(tool_queues={"nope": "tools"}), environ={})
    with pytest.raises(ValueError, match="positive time limit for 'read_file', got 0"):
        worker_tools(_settings(tool_timeouts={"read_file": 0}), environ={})


def test_a_malformed_override_fails_settings_naming_the_variable(
    service_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SIGNALBOX_TOOL_TIMEOUTS", json.dumps({"read_file": "soon"}))
    with pytest.raises(SettingsError, match="SIGNALBOX_TOOL_TIMEOUTS"):
        load(ToolsSettings)


def test_built_in_tools_do_not_depend_on_settings() -> None:
    assert "shout" not in load_tools({}).names()
