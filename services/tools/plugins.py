"""A deployment's own tools, found without changing Signalbox: module paths and entry points.

A deployment either names modules in ``SIGNALBOX_TOOL_MODULES`` (``'["acme.tools"]'``, or
``"acme.tools:extra"`` for an attribute other than ``registry``), or installs a package
that declares an entry point in the group ``signalbox.tools``::

    [project.entry-points."signalbox.tools"]
    acme = "acme.tools:registry"

Either way the target is a ``Registry`` (or a module holding one as ``registry``). A target
that does not load is a start-up error naming it: a worker that silently lacks a tool the
deployment configured would only fail later, in the middle of a turn.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from importlib.metadata import EntryPoint, entry_points
from types import ModuleType

from signalbox.services.tools.registry import Registry

ENTRY_POINT_GROUP = "signalbox.tools"


class ToolLoadError(RuntimeError):
    """A configured tool module or entry point cannot be loaded as a registry."""


def _as_registry(target: object, where: str) -> Registry:
    if isinstance(target, ModuleType):
        target = getattr(target, "registry", None)
        if target is None:
            raise ToolLoadError(f"module {where!r} has no attribute 'registry'")
    if not isinstance(target, Registry):
        raise ToolLoadError(
            f"expected a signalbox.services.tools Registry at {where!r}, got {target!r}"
        )
    return target


def from_module(path: str) -> Registry:
    """The registry at ``path`` (``pkg.mod`` or ``pkg.mod:attr``)."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ToolLoadError(f"cannot import tool module {path!r}: {exc}") from exc
    if not attr:
        return _as_registry(module, path)
    try:
        return _as_registry(getattr(module, attr), path)
    except AttributeError:
        raise ToolLoadError(f"module {module_name!r} has no attribute {attr!r}") from None


def from_entry_points(
    found: Callable[[], Iterable[EntryPoint]] = lambda: entry_points(group=ENTRY_POINT_GROUP),
) -> list[Registry]:
    """The registries of every installed ``signalbox.tools`` entry point, by name."""
    registries = []
    for point in sorted(found(), key=lambda p: p.name):
        where = f"{point.name} = {point.value}"
        try:
            target = point.load()
        except Exception as exc:  # any import-time failure of a third-party package
            raise ToolLoadError(f"cannot load entry point {where!r}: {exc!r}") from exc
        registries.append(_as_registry(target, where))
    return registries


def deployment_registries(modules: Iterable[str]) -> list[Registry]:
    """The tools a deployment adds: its entry points, then its configured modules."""
    return [*from_entry_points(), *(from_module(m) for m in modules)]
