"""Single-field bounds declared on a dataclass's fields, checked on construction.

A field says what it allows in its annotation, with ``annotated-types``' metadata
(``share: Annotated[float, Interval(ge=0, lt=1)]``, and ``doc("...")`` for what a
boundary value means) or a ``Literal``; a dataclass
that derives from :class:`Bounded` checks every such field when it is built, from
a scenario's table or in code alike, and refuses a value in one line naming the
key (kebab-case, as the scenario writes it) and the allowed range. Checks that
relate several fields stay in the class's own ``__post_init__``, which calls
``super().__post_init__()`` first.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any, Literal, get_args, get_origin

import annotated_types as at

from fedsim.core.errors import require

_LOWER = {at.Ge: ("[", ">="), at.Gt: ("(", ">")}
_UPPER = {at.Le: ("]", "<="), at.Lt: (")", "<")}


@functools.cache
def _bounds(cls: type) -> tuple[tuple[str, tuple[Any, ...], tuple[Any, ...]], ...]:
    """Per field of ``cls`` with a bound: its name, its metadata and its Literal choices.

    A subclass that redeclares a field (a new default) keeps the bounds a base declared."""
    own_hints = [
        (vars(klass).get("__annotations__", {}), typing.get_type_hints(klass, include_extras=True))
        for klass in cls.__mro__
        if dataclasses.is_dataclass(klass)
    ]
    found = []
    for field in dataclasses.fields(cls):
        declared = [hints[field.name] for own, hints in own_hints if field.name in own]
        annotated = [h for h in declared if get_origin(h) is typing.Annotated]
        hint = (annotated or declared)[0]
        metadata: tuple[Any, ...] = ()
        if get_origin(hint) is typing.Annotated:
            hint, *extra = get_args(hint)
            metadata = tuple(m for group in extra for m in _flatten(group))
        choices = get_args(hint) if get_origin(hint) is Literal else ()
        if metadata or choices:
            found.append((field.name, metadata, choices))
    return tuple(found)


def _flatten(metadata: Any) -> tuple[Any, ...]:
    # Interval(ge=0, lt=1) stands for Ge(0) and Lt(1).
    return tuple(metadata) if isinstance(metadata, at.GroupedMetadata) else (metadata,)


def allowed(metadata: tuple[Any, ...]) -> str:
    """What the bounds in ``metadata`` allow, as a refusal says it ("must be in [0, 1)")."""
    lower = next(((m, *_LOWER[type(m)]) for m in metadata if type(m) in _LOWER), None)
    upper = next(((m, *_UPPER[type(m)]) for m in metadata if type(m) in _UPPER), None)
    if lower and upper:
        low, high = (_limit(m) for m in (lower[0], upper[0]))
        return f"must be in {lower[1]}{low}, {high}{upper[1]}"
    bound, _, sign = lower or upper or (None, "", "")
    return f"must be {sign} {_limit(bound)}" if bound is not None else ""


def _limit(metadata: Any) -> Any:
    return next(getattr(metadata, a) for a in ("ge", "gt", "le", "lt") if hasattr(metadata, a))


def _holds(metadata: Any, value: Any) -> bool:
    limit = _limit(metadata)
    return bool(
        {at.Ge: value >= limit, at.Gt: value > limit, at.Le: value <= limit, at.Lt: value < limit}[
            type(metadata)
        ]
    )


@dataclasses.dataclass(frozen=True)
class Bounded:
    """A frozen dataclass whose fields' declared bounds and choices are checked when built."""

    def __post_init__(self) -> None:
        cls: type = type(self)  # as a plain type: the cache's key
        for name, metadata, choices in _bounds(cls):
            value, key = getattr(self, name), name.replace("_", "-")
            if choices:
                require(
                    value in choices, key, value, f"must be one of {', '.join(map(repr, choices))}"
                )
            limits = [m for m in metadata if type(m) in _LOWER or type(m) in _UPPER]
            if value is not None and limits:
                notes = [f" ({m.documentation})" for m in metadata if isinstance(m, at.DocInfo)]
                says = allowed(tuple(limits)) + "".join(notes)
                require(all(_holds(m, value) for m in limits), key, value, says)
