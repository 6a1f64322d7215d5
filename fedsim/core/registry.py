"""One registry pattern for everything a scenario names by string.

Strategies, client routines, attacks, datasets, partitioners, models and init
schemes each live in a :class:`Registry`. A module registers its component with
``@REGISTRY.register("name")``; the registry imports its home package lazily on
the first lookup, so adding a component means writing one module. On the same
first lookup it loads the plugins (:mod:`fedsim.core.plugins`): its entry-point
group and the plugins a scenario named; each entry records where it came from.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from fedsim.core import plugins
from fedsim.core.params import Schemas
from fedsim.core.plugins import FEDSIM, RegistrationError

T = TypeVar("T")


class UnknownNameError(KeyError):
    """A scenario or CLI named a component that is not registered."""

    def __str__(self) -> str:
        return str(self.args[0])


class Registry(Generic[T]):
    """Maps names to components of one kind.

    Parameters
    ----------
    kind:
        What the registry holds, used in error messages ("strategy").
    packages:
        Packages whose submodules are imported before the first lookup so
        that their ``@register`` decorators have run.
    group:
        The entry-point group plugins add to (``fedsim.models``); empty: no
        plugins. Such a registry checks what is registered: a subclass of
        ``subclass_of`` if given, else a callable, with every attribute in ``needs``.
    params:
        Where fedsim's own components of this kind keep their ``Params``, importable
        without torch (:mod:`fedsim.core.params`); each one registered must use it.
    """

    def __init__(
        self,
        kind: str,
        packages: tuple[str, ...] = (),
        *,
        group: str = "",
        subclass_of: type | None = None,
        needs: tuple[str, ...] = (),
        params: Schemas | None = None,
    ) -> None:
        self.kind = kind
        self.group = group
        self._packages = packages
        self._subclass_of = subclass_of
        self._needs = needs
        self._params = params
        self._entries: dict[str, T] = {}
        self._descriptions: dict[str, str] = {}
        self._origins: dict[str, str] = {}
        self._aliases: dict[str, str] = {}
        self._own_discovered = False
        self._discovered = False

    def register(
        self,
        name: str,
        description: str = "",
        aliases: tuple[str, ...] = (),
        *,
        origin: str | None = None,
    ) -> Callable[[T], T]:
        """Decorator registering ``obj`` under ``name`` (and short ``aliases`` for it).

        ``description``: one line for ``fedsim list``; without one, the first
        line of ``obj``'s docstring (or its class's, for an instance) is used.
        ``origin`` (for ``fedsim list`` and clashes): by default ``fedsim`` when
        fedsim's code calls this (also while a plugin's import imports fedsim),
        else the plugin being loaded, else the calling module's top-level package.
        """
        if origin is None:
            caller = str(sys._getframe(1).f_globals.get("__name__", "")).split(".")[0]
            origin = FEDSIM if caller == FEDSIM else plugins.current_origin() or caller

        def decorator(obj: T) -> T:
            if origin != FEDSIM:
                self._discover_own()  # a clash with fedsim's own shows at the plugin's line
            self._check_kind(name, obj, origin)
            if self._params is not None and origin == FEDSIM:
                self._check_params((name, *aliases), obj)
            for key in (name, *aliases):
                if self._lookup(key) not in (None, obj):
                    taken = self._origins[self._aliases.get(key, key)]
                    raise RegistrationError(
                        f"{self.kind} {key!r} of {origin} clashes with the {self.kind} "
                        f"{key!r} of {taken}; rename one"
                    )
            self._entries[name] = obj
            self._origins[name] = origin
            doc = (getattr(obj, "__doc__", None) or "").strip()
            # A docstring's first line, without its reStructuredText code quotes.
            first_line = (doc.splitlines() or [""])[0].replace("``", "")
            self._descriptions[name] = description or first_line
            self._aliases.update(dict.fromkeys(aliases, name))
            return obj

        return decorator

    def describe(self, name: str) -> str:
        """The one-line description of ``name`` ("" if it has none)."""
        self.get(name)
        return self._descriptions[self._aliases.get(name, name)]

    def origin(self, name: str) -> str:
        """Where ``name`` came from: ``fedsim``, a plugin's distribution or its module."""
        self.get(name)
        return self._origins[self._aliases.get(name, name)]

    def _check_kind(self, name: str, obj: Any, origin: str) -> None:
        if not self.group:
            return
        if self._subclass_of is not None:
            base = self._subclass_of
            ok, expected = (
                isinstance(obj, type) and issubclass(obj, base),
                f"a subclass of {base.__module__}.{base.__qualname__}",
            )
        else:
            ok, expected = callable(obj), "a callable"
        # Looked up statically: hasattr would run a lazy attribute (a Flower Datasets
        # partitioner's Params imports flwr_datasets, seconds, on first use).
        missing = [attr for attr in self._needs if not _has_static(obj, attr)]
        if not ok or missing:
            what = f"has no {missing[0]!r}" if ok else f"is {_kind_of(obj)}"
            raise RegistrationError(
                f"{self.kind} {name!r} of {origin} {what}; expected {expected}"
                + (f" with {', '.join(self._needs)}" if self._needs else "")
            )

    def _check_params(self, keys: tuple[str, ...], obj: Any) -> None:
        schemas = self._params
        expected = schemas.get(keys[0]) if schemas is not None else None
        found = {schemas.get(key) for key in keys} if schemas is not None else set()
        if expected is None or found != {getattr(obj, "Params", None)}:
            raise RegistrationError(
                f"{self.kind} {keys[0]!r} must take its Params (and aliases) from "
                f"fedsim.core.params ({expected.__qualname__ if expected else 'none there'})"
            )

    def _lookup(self, name: str) -> T | None:
        return self._entries.get(self._aliases.get(name, name))

    def _discover_own(self) -> None:
        if self._own_discovered:
            return
        self._own_discovered = True
        for package_name in self._packages:
            package = importlib.import_module(package_name)
            for module in pkgutil.iter_modules(package.__path__):
                if not module.name.startswith("_"):
                    importlib.import_module(f"{package_name}.{module.name}")

    def _discover(self) -> None:
        if self._discovered:
            return
        self._discovered = True
        self._discover_own()
        if self.group:
            plugins.load_entry_points(
                self.group,
                lambda name, obj: self.register(name, origin=plugins.current_origin())(obj),
            )
            plugins.import_named_plugins()

    def get(self, name: str) -> T:
        """Return the component called ``name`` or raise a clear error."""
        self._discover()
        found = self._lookup(name)
        if found is None:
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}; allowed: {', '.join(self.names())}"
                + (f" (aliases: {', '.join(sorted(self._aliases))})" if self._aliases else "")
            )
        return found

    def canonical(self, name: str) -> str:
        """The name ``name`` is registered under (itself unless it is an alias)."""
        self.get(name)
        return self._aliases.get(name, name)

    def name_of(self, obj: object) -> str:
        """The name ``obj`` is registered under (its class's, for an instance); a
        :class:`KeyError` for a component it does not hold."""
        found = [name for name, entry in self._entries.items() if entry is obj]
        if not found and not isinstance(obj, type):
            found = [name for name, entry in self._entries.items() if entry is type(obj)]
        if not found:
            raise KeyError(f"no {self.kind} is registered as {obj!r}")
        return found[0]

    def names(self) -> list[str]:
        """Registered names, sorted (without aliases)."""
        self._discover()
        return sorted(self._entries)

    def aliases(self) -> dict[str, str]:
        """Alias -> the name it stands for."""
        self._discover()
        return dict(self._aliases)

    def __contains__(self, name: object) -> bool:
        self._discover()
        return isinstance(name, str) and self._lookup(name) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


def _kind_of(obj: Any) -> str:
    if isinstance(obj, type):
        return f"the class {obj.__qualname__}"
    name = type(obj).__qualname__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


_ABSENT = object()


def _has_static(obj: Any, attr: str) -> bool:
    """Whether ``obj`` has ``attr``, without running a property or cached property."""
    return inspect.getattr_static(obj, attr, _ABSENT) is not _ABSENT
