"""One registry pattern for everything a scenario names by string.

Strategies, client routines, attacks, datasets, partitioners, models and init
schemes each live in a :class:`Registry`. A module registers its component with
``@REGISTRY.register("name")``; the registry imports its home package lazily on
the first lookup, so adding a component means writing one module.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

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
    """

    def __init__(self, kind: str, packages: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self._packages = packages
        self._entries: dict[str, T] = {}
        self._descriptions: dict[str, str] = {}
        self._aliases: dict[str, str] = {}
        self._discovered = False

    def register(
        self, name: str, description: str = "", aliases: tuple[str, ...] = ()
    ) -> Callable[[T], T]:
        """Decorator registering ``obj`` under ``name`` (and short ``aliases`` for it).

        ``description``: one line for ``fedsim list``; without one, the first
        line of ``obj``'s docstring (or its class's, for an instance) is used.
        """

        def decorator(obj: T) -> T:
            for key in (name, *aliases):
                if self._lookup(key) not in (None, obj):
                    raise ValueError(f"{self.kind} {key!r} is registered twice")
            self._entries[name] = obj
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

    def _lookup(self, name: str) -> T | None:
        return self._entries.get(self._aliases.get(name, name))

    def _discover(self) -> None:
        if self._discovered:
            return
        self._discovered = True
        for package_name in self._packages:
            package = importlib.import_module(package_name)
            for module in pkgutil.iter_modules(package.__path__):
                if not module.name.startswith("_"):
                    importlib.import_module(f"{package_name}.{module.name}")

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
