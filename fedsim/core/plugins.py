"""Plugins: components registered from outside fedsim, in every process that looks them up.

Two ways in, both ending in the registries' own ``@REGISTRY.register`` (see
docs/bring-your-own.md):

- **Entry points** of an installed distribution, in the group of a registry
  (:data:`GROUPS`: ``fedsim.models``, ``fedsim.attacks``, ...). An entry point's
  value is a module (importing it registers what it decorates) or an object
  ``module:attr`` (registered under the entry point's name). A registry loads its
  group on its first lookup, in whichever process that is.
- **The scenario key** ``plugins``: module names, or paths of a ``.py`` file or a
  package folder (relative to the scenario file; :func:`plugin_module` puts the
  folder holding one on ``sys.path``). :func:`use_plugins` imports them and names
  them in :data:`PLUGINS_ENV` (and a path's folder in ``PYTHONPATH``), which
  this process's children inherit and Ray's runtime environment carries to every worker
  (:func:`fedsim.simulation.resources.ray_runtime_env`); each registry imports
  the plugins named there on its first lookup.

Whatever a plugin registers is recorded with its origin (the distribution, or
the module the scenario named); a plugin that fails to import, a clash of names
and an object of the wrong kind are each a one-line
:class:`~fedsim.core.errors.ScenarioError`.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from types import ModuleType
from typing import Any

from fedsim.core.errors import ScenarioError, first_line

FEDSIM = "fedsim"
"""The origin of fedsim's own components."""

PLUGINS_ENV = "FEDSIM_PLUGINS"
"""The plugins a scenario named, ``os.pathsep``-separated, for processes this one starts."""

GROUPS = (
    "fedsim.models",
    "fedsim.inits",
    "fedsim.datasets",
    "fedsim.partitioners",
    "fedsim.strategies",
    "fedsim.clients",
    "fedsim.defences",
    "fedsim.attacks",
)
"""Entry-point groups, one per registry a plugin can add to (the registry's ``group``)."""


class RegistrationError(ValueError):
    """A component cannot be registered: its name is taken, or it is not of the registry's kind."""


_origins: list[str] = []


def current_origin() -> str | None:
    """The plugin being loaded now (its distribution or module), or ``None``."""
    return _origins[-1] if _origins else None


@contextmanager
def _loading(origin: str) -> Iterator[None]:
    _origins.append(origin)
    try:
        yield
    finally:
        _origins.pop()


def is_path(entry: str) -> bool:
    """Whether a ``plugins`` entry names a file or folder (else it is a module name)."""
    return entry.endswith(".py") or "/" in entry or os.sep in entry or entry.startswith(".")


def plugin_module(entry: str, key: str = "plugins") -> str:
    """The module name ``entry`` imports as; a path's folder is put on ``sys.path``."""
    if not is_path(entry):
        require_module_name(entry, key)
        return entry
    path = Path(entry)
    if path.suffix == ".py" and path.is_file():
        name = path.stem
    elif path.is_dir() and (path / "__init__.py").is_file():
        name = path.name
    else:
        raise ScenarioError(
            key, entry, "is not a .py file or a package folder (a folder with __init__.py)"
        )
    require_module_name(name, key, entry)
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.append(folder)
    return name


def require_module_name(name: str, key: str, entry: str | None = None) -> None:
    """``name`` is a dotted Python module name; else a :class:`ScenarioError` on ``key``."""
    if not all(part.isidentifier() for part in name.split(".")):
        raise ScenarioError(
            key,
            entry or name,
            "must be a module name (my_lab.models), a .py file or a package folder",
        )


def _load(origin: str, key: str, value: str, load: Callable[[], Any]) -> Any:
    """``load()`` with ``origin`` recorded; any failure as one line on ``key`` = ``value``."""
    with _loading(origin):
        try:
            return load()
        except ScenarioError:
            raise
        except RegistrationError as err:
            raise ScenarioError(key, value, str(err)) from None
        except Exception as err:
            raise ScenarioError(
                key, value, f"fails to import ({type(err).__name__}: {first_line(err)})"
            ) from None


def import_plugin(entry: str, key: str = "plugins") -> ModuleType:
    """Import the plugin ``entry`` (a module name or a path) once, its origin its module."""
    name = plugin_module(entry, key)
    module: ModuleType = _load(name, key, entry, lambda: importlib.import_module(name))
    return module


def named_plugins() -> list[str]:
    """The plugins :data:`PLUGINS_ENV` names (inherited from the process that started this)."""
    return [e for e in os.environ.get(PLUGINS_ENV, "").split(os.pathsep) if e]


def use_plugins(entries: Sequence[str], key: str = "plugins") -> None:
    """Import a scenario's ``plugins`` here, and name them in :data:`PLUGINS_ENV` for the
    processes this one starts (Ray workers, child runs)."""
    for i, entry in enumerate(entries):
        import_plugin(entry, f"{key}[{i}]")
    if not entries:
        return
    os.environ[PLUGINS_ENV] = os.pathsep.join(dict.fromkeys([*named_plugins(), *entries]))
    # A worker may unpickle a plugin's class before its registries look anything up.
    folders = [str(Path(e).resolve().parent) for e in entries if is_path(e)]
    known = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if folders:
        os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*known, *folders]))


def import_named_plugins() -> None:
    """Import every plugin :data:`PLUGINS_ENV` names (a registry's first lookup does)."""
    for entry in named_plugins():
        import_plugin(entry, PLUGINS_ENV)


@functools.cache
def _entry_points() -> dict[str, tuple[EntryPoint, ...]]:
    # One scan of the installed distributions per process, for every group.
    found = entry_points()
    return {group: tuple(found.select(group=group)) for group in GROUPS}


def refresh_entry_points() -> None:
    """Forget the scanned entry points (after ``sys.path`` changed; tests)."""
    _entry_points.cache_clear()


def load_entry_points(group: str, register: Callable[[str, Any], object]) -> None:
    """Load group ``group``'s entry points: a module is imported (its decorators
    register), any other object is passed to ``register`` with the entry point's name."""
    for point in _entry_points().get(group, ()):
        origin = point.dist.name if point.dist is not None else point.module
        key = f"entry point {group}:{point.name} of {origin}"
        obj = _load(origin, key, point.value, point.load)
        if not isinstance(obj, ModuleType):
            _load(origin, key, point.value, functools.partial(register, point.name, obj))
