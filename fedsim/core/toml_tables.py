"""TOML tables to typed, frozen dataclasses and back: the one converter every table goes through.

:func:`parse_table` rejects unknown keys and wrong types with one line each and runs the
dataclass's own range checks; :func:`to_table` writes a dataclass back as kebab-case tables.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from enum import EnumMeta
from typing import Any, Literal, TypeVar, get_args, get_origin

from fedsim.core.errors import ScenarioError, require
from fedsim.core.errors import first_line as first_line  # re-exported

T = TypeVar("T")


def _describe(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal or isinstance(tp, EnumMeta):
        return "one of " + ", ".join(repr(a) for a in (get_args(tp) or tp))
    if origin in (types.UnionType, typing.Union):
        return " or ".join(_describe(a) for a in get_args(tp))
    if origin is tuple:
        return f"a list of {_describe(get_args(tp)[0])}"
    if tp is type(None):
        return "absent"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _convert(tp: Any, value: Any, key: str) -> Any:
    """Check ``value`` against the type hint ``tp``; return it normalised."""
    origin = get_origin(tp)
    if origin is Literal:
        require(value in get_args(tp), key, value, f"must be {_describe(tp)}")
        return value
    if isinstance(tp, EnumMeta):  # a str enum (the threat model): its values are the names
        require(value in tuple(tp), key, value, f"must be {_describe(tp)}")
        return tp(value)
    if origin in (types.UnionType, typing.Union):
        for option in get_args(tp):
            try:
                return _convert(option, value, key)
            except ScenarioError:
                continue
        raise ScenarioError(key, value, f"must be {_describe(tp)}")
    if origin is tuple:
        require(isinstance(value, list | tuple), key, value, f"must be {_describe(tp)}")
        item_type = get_args(tp)[0]
        return tuple(_convert(item_type, v, f"{key}[{i}]") for i, v in enumerate(value))
    if tp is type(None):
        require(value is None, key, value, "must be absent")
        return None
    if tp is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        require(ok, key, value, "must be a number")
        # inf and nan pass every range check and then train garbage or hang.
        require(math.isfinite(value), key, value, "must be a finite number")
        return float(value)
    if tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        require(ok, key, value, "must be an integer")
        return value
    if tp in (str, bool):
        require(isinstance(value, tp), key, value, f"must be {_describe(tp)}")
        return value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        require(isinstance(value, Mapping), key, value, "must be a table")
        return parse_table(tp, value, key)
    if tp is dict or get_origin(tp) is dict:
        require(isinstance(value, Mapping), key, value, "must be a table")
        return dict(value)
    raise TypeError(f"unsupported config type {tp!r} for {key}")


def parse_table(cls: type[T], table: Mapping[str, Any], prefix: str = "") -> T:
    """Build dataclass ``cls`` from a TOML table, strictly.

    Unknown keys, wrong types and values the class's ``__post_init__`` rejects
    raise :class:`ScenarioError` naming the full dotted key.
    """
    hints = typing.get_type_hints(cls)
    fields = {f.name.replace("_", "-"): f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    dotted = f"{prefix}." if prefix else ""
    unknown = sorted(set(table) - set(fields))
    if unknown:
        raise ScenarioError(
            f"{dotted}{unknown[0]}",
            table[unknown[0]],
            f"unknown key; allowed keys: {', '.join(fields) or '(none)'}",
        )
    kwargs = {
        f.name: _convert(hints[f.name], table[key], f"{dotted}{key}")
        for key, f in fields.items()
        if key in table
    }
    missing = [
        key
        for key, f in fields.items()
        if key not in table
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ScenarioError(f"{dotted}{missing[0]}", None, "required key is missing")
    try:
        return cls(**kwargs)
    except ScenarioError as err:
        if err.key.startswith(dotted):
            raise
        raise ScenarioError(f"{dotted}{err.key}", err.value, err.allowed) from None


def to_table(obj: Any, keep_none: bool = False) -> Any:
    """Inverse of :func:`parse_table`: a TOML-ready dict with kebab-case keys (``None``
    fields left out, as TOML has no null, unless ``keep_none``)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {
            f.name.replace("_", "-"): to_table(getattr(obj, f.name), keep_none)
            for f in dataclasses.fields(obj)
            if keep_none or getattr(obj, f.name) is not None
        }
    if isinstance(obj, tuple | list):
        return [to_table(v, keep_none) for v in obj]
    if isinstance(obj, Mapping):
        return {k: to_table(v, keep_none) for k, v in obj.items()}
    return obj
