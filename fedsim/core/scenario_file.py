"""A scenario file read, overridden (``--set``) and converted into a :class:`Scenario`, and
written back; components' parameter tables looked up and converted the same way."""

from __future__ import annotations

import dataclasses
import stat
import tomllib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from fedsim.core.config import (
    AUTO,
    ComponentConfig,
    Scenario,
)
from fedsim.core.errors import ScenarioError, require
from fedsim.core.params.attacks import ATTACK_PARAMS
from fedsim.core.params.defences import DEFENCE_PARAMS
from fedsim.core.params.leaks import LEAK_PARAMS
from fedsim.core.plugins import is_path
from fedsim.core.registry import Registry, UnknownNameError
from fedsim.core.toml_tables import parse_table, to_table


def _component(table: Any, key: str, default: str) -> ComponentConfig:
    if table is None:
        return ComponentConfig(default)
    if isinstance(table, str):
        return ComponentConfig(table)
    require(isinstance(table, Mapping), key, table, "must be a name or a table with 'name'")
    params = dict(table)
    name = params.pop("name", default)
    require(isinstance(name, str), f"{key}.name", name, "must be a string")
    return ComponentConfig(name, params)


def _parse_value(text: str) -> Any:
    """Parse an override's value as TOML; bare words are strings."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Merge ``key.path=value`` overrides into the raw scenario tables."""
    for item in overrides:
        key, sep, text = item.partition("=")
        require(bool(sep) and bool(key.strip()), "--set", item, "must look like key.path=value")
        parts = key.strip().split(".")
        require(
            all(part.strip() for part in parts),
            "--set",
            item,
            f"key {key.strip()!r} has an empty part; must look like key.path=value "
            "(e.g. federation.rounds=5)",
        )
        parts = [part.strip() for part in parts]
        node = raw
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if isinstance(child, str) and part in ("strategy", "partitioner"):
                child = node[part] = {"name": child}
            require(
                isinstance(child, dict),
                ".".join(parts[: i + 1]),
                child,
                "is not a table, cannot set a key inside it",
            )
            node = child
        node[parts[-1]] = _parse_value(text.strip())
    return raw


def _table(value: Any, key: str) -> dict[str, Any]:
    require(isinstance(value, Mapping), key, value, "must be a table")
    return dict(value)


def scenario_from_dict(raw: Mapping[str, Any]) -> Scenario:
    """Raw tables (already merged with overrides) as a well-formed :class:`Scenario`.

    This checks form only: keys, types and ranges. Whether the named
    components exist and fit together, and whether this machine can run the
    scenario, is :mod:`fedsim.scenario.validate`'s job.
    """
    tables = dict(raw)
    strategy = _component(tables.pop("strategy", None), "strategy", "fedavg")
    data_table = _table(tables.pop("data", {}), "data")
    partitioner = _component(data_table.pop("partitioner", None), "data.partitioner", "iid")
    generator = _table(data_table.pop("generator", {}), "data.generator")
    audit_table = _table(tables.pop("audit", {}), "audit")
    listed = {key: audit_table.pop(key, None) for key in ("attacks", "leaks")}
    defence_tables = tables.pop("defences", [])
    require(
        isinstance(defence_tables, list),
        "defences",
        defence_tables,
        "must be a list of defence tables",
    )
    scenario = parse_table(Scenario, {**tables, "data": data_table, "audit": audit_table})
    scenario = dataclasses.replace(
        scenario,
        strategy=strategy,
        data=dataclasses.replace(
            scenario.data,
            partitioner=partitioner,
            generator=ComponentConfig(scenario.data.dataset, generator),
        ),
        defences=tuple(_component(t, f"defences[{i}]", "") for i, t in enumerate(defence_tables)),
    )
    audit = scenario.audit
    for key, tables in listed.items():
        if tables is not None:
            default = "dlg" if key == "attacks" else ""
            parsed = _components_or_auto(tables, f"audit.{key}", default)
            audit = dataclasses.replace(audit, **{key: parsed})  # type: ignore[arg-type]
    # The replace re-runs the checks.
    return dataclasses.replace(scenario, audit=audit) if audit != scenario.audit else scenario


def _components_or_auto(
    tables: Any, key: str, default: str
) -> tuple[ComponentConfig, ...] | Literal["auto"]:
    """``"auto"`` or a list of component tables (``audit.attacks``, ``audit.leaks``)."""
    require(
        isinstance(tables, list) or tables == AUTO,
        key,
        tables,
        f'must be "{AUTO}" or a list of tables {{name = "...", ...}}',
    )
    if tables == AUTO:
        return AUTO
    return tuple(_component(t, f"{key}[{i}]", default) for i, t in enumerate(tables))


def path_kind(path: Path) -> str:
    """What ``path`` is, for a refusal that says it: "a directory", "missing", ..."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:  # a dangling link too: nothing is there to read
        return "missing (no such file or directory)"
    except OSError as err:
        return f"unreadable ({err.strerror})"
    kinds = [
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISREG, "a file"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISSOCK, "a socket"),
    ]
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def read_toml(path: str | Path, key: str = "scenario") -> dict[str, Any]:
    """The tables of TOML file ``path``; a missing or malformed file is a :class:`ScenarioError`."""
    path = Path(path)
    if not path.is_file():
        raise ScenarioError(key, str(path), f"is {path_kind(path)}; expected a TOML file")
    try:
        return tomllib.loads(path.read_bytes().decode("utf-8"))
    except OSError as err:
        raise ScenarioError(key, str(path), f"cannot be read ({err.strerror})") from None
    except UnicodeDecodeError as err:
        raise ScenarioError(
            key, str(path), f"is not UTF-8 text (byte {err.start}); TOML files are UTF-8"
        ) from None
    except tomllib.TOMLDecodeError as err:
        raise ScenarioError(key, str(path), f"is not valid TOML: {err}") from None


def load_scenario(path: str | Path, overrides: list[str] | None = None) -> Scenario:
    """Read and override a scenario file; check its form (see :func:`scenario_from_dict`)."""
    path = Path(path)
    raw = read_toml(path)
    raw.setdefault("name", path.stem)
    scenario = scenario_from_dict(apply_overrides(raw, overrides or []))
    # A plugin's path means the same from any directory: relative to the scenario file.
    plugins = tuple(
        str((path.parent / entry).resolve()) if is_path(entry) else entry
        for entry in scenario.plugins
    )
    check_own_components(scenario)
    return dataclasses.replace(scenario, plugins=plugins)


def check_own_components(scenario: Scenario) -> None:
    """The defences, attacks and leak analyses ``scenario`` names exist with valid parameters,
    checked from :mod:`fedsim.core.params` before torch, Ray or Flower is imported (a
    name only a plugin can register is left to validation, after the plugins load)."""
    DEFENCE_PARAMS.check(scenario.defences, "defences", bool(scenario.plugins))
    for schemas, key in ((ATTACK_PARAMS, "attacks"), (LEAK_PARAMS, "leaks")):
        listed = getattr(scenario.audit, key)
        if listed != AUTO:
            schemas.check(listed, f"audit.{key}", bool(scenario.plugins))


def scenario_to_dict(scenario: Scenario) -> dict[str, Any]:
    """The resolved scenario as TOML-ready tables (component params inlined)."""
    table = to_table(scenario)
    for path in (("strategy",), ("data", "partitioner")):
        parent = table
        for part in path[:-1]:
            parent = parent[part]
        parent[path[-1]] = _inline_component(parent[path[-1]])
    generator = table["data"].pop("generator")
    if generator["params"]:  # a table of parameters only: data.dataset names the generator
        table["data"]["generator"] = generator["params"]
    for key in ("attacks", "leaks"):
        if getattr(scenario.audit, key) != AUTO:
            table["audit"][key] = [_inline_component(a) for a in table["audit"][key]]
    table["defences"] = [_inline_component(d) for d in table["defences"]]
    return typing.cast(dict[str, Any], table)


def _inline_component(component: dict[str, Any]) -> dict[str, Any]:
    return {"name": component["name"], **component.get("params", {})}


def lookup(registry: Registry[Any], name: str, key: str) -> Any:
    """Registry lookup that reports the scenario key on failure."""
    try:
        return registry.get(name)
    except UnknownNameError:
        raise ScenarioError(key, name, f"allowed: {', '.join(registry.names())}") from None


def component_params(component: Any, cfg: ComponentConfig, key: str) -> Any:
    """``cfg.params`` validated against ``component.Params`` (a frozen dataclass)."""
    return parse_table(component.Params, cfg.params, key)
