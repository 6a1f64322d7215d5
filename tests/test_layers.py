"""The house is one-way: kernel <- components <- scenario <- outputs <- audit <- simulation
<- sweeps <- face.

Read from the source (every import, function-level ones included), so a
shortcut anywhere fails here rather than in a reviewer's graph.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "fedsim"

LAYER = {
    "fedsim": 0,  # the package's __init__: its version only
    "fedsim.core": 0,
    "fedsim.text": 0.5,  # a second modality on the kernel, below the components
    "fedsim.clients": 1,
    "fedsim.strategies": 1,
    "fedsim.attacks": 1,
    "fedsim.scenario": 2,  # checks and resolves what a scenario names
    "fedsim.outputs": 3,  # what a run writes or shows: no Ray, no Flower
    "fedsim.audit": 4,  # the honest-but-curious server
    "fedsim.simulation": 5,  # the run on Flower and Ray
    "fedsim.sweeps": 6,  # fedsim compare
    "fedsim.face": 7,
    "fedsim.scenarios": 0,
}
FACE = ("fedsim.cli", "fedsim.commands", "fedsim.app")  # the command line and the Flower app


def _area(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "fedsim":
        return None
    area = ".".join(parts[:2])
    return "fedsim.face" if area in FACE else area


def _imports(path: Path) -> list[tuple[str, int]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.module, node.lineno))
    return found


def _modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        out.append((".".join(rel.parts).removesuffix(".__init__"), path))
    return out


@pytest.mark.parametrize(("module", "path"), _modules(), ids=lambda v: str(v))
def test_imports_point_down_or_sideways_within_a_package(module: str, path: Path) -> None:
    own = _area(module)
    assert own in LAYER, f"{module} is in no layer"
    for target, line in _imports(path):
        area = _area(target)
        if area is None or area == own:
            continue
        assert LAYER[area] < LAYER[own], f"{path.name}:{line} imports {target} ({module})"


def test_components_do_not_import_each_other() -> None:
    # A strategy and its client routine agree through fedsim.core.protocol, not each other.
    for module, path in _modules():
        own = _area(module)
        if own is None or LAYER.get(own) != 1:
            continue
        for target, line in _imports(path):
            area = _area(target)
            assert area is None or LAYER.get(area) != 1 or area == own, (
                f"{path.name}:{line} imports {target}"
            )


ROLES = ("fedsim.attacks.reconstruction", "fedsim.attacks.leaks")
"""The packages of concrete attacks and leak analyses, one module each."""


def _concrete(module: str) -> bool:
    return any(module.startswith(f"{role}.") for role in ROLES)


def test_attacks_and_analyses_import_toolkits_not_each_other() -> None:
    # An attack or leak analysis imports the contracts (fedsim.attacks.base, registry,
    # presets, leakage) and fedsim.attacks.toolkits; machinery two of them share is a
    # toolkit, and a variant extends a toolkit's base (subclassing an attack is importing
    # it). The toolkits and contracts import no attack either, nor the package's root,
    # which imports them all.
    for module, path in _modules():
        if not module.startswith("fedsim.attacks.") or module in ROLES:
            continue
        for target, line in _imports(path):
            whole = target == "fedsim.attacks" or target in ROLES
            assert not whole and (target == module or not _concrete(target)), (
                f"{path.name}:{line} imports {target} ({module})"
            )


def test_every_attack_and_analysis_lives_in_its_role_package() -> None:
    # What registers an attack or a leak analysis is concrete, and a role package holds
    # nothing else: its name tells a reader what lives there.
    registers = {
        module
        for module, path in _modules()
        if "@ATTACKS.register(" in (text := path.read_text()) or "@LEAKS.register(" in text
    }
    concrete = {module for module, _ in _modules() if _concrete(module)}
    assert concrete and registers == concrete, sorted(registers ^ concrete)


def test_outputs_need_no_ray() -> None:
    # A finished run folder is read (fedsim report, compare) without starting Ray;
    # Flower appears only as the ArrayRecord a round hands its callbacks.
    for module, path in _modules():
        if _area(module) != "fedsim.outputs":
            continue
        for target, line in _imports(path):
            assert target.split(".")[0] != "ray", f"{path.name}:{line} imports {target}"
            assert not target.startswith("flwr") or target == "flwr.app", (
                f"{path.name}:{line} imports {target}"
            )


def test_no_module_is_crowded_and_few_functions_take_the_whole_scenario() -> None:
    # The house issue's bounds: a module has one job (at most 500 lines), and a function
    # is handed the parts of a scenario it uses (at most 15 take all of it).
    crowded = [f"{m}: {n}" for m, p in _modules() if (n := len(p.read_text().splitlines())) > 500]
    whole = [
        f"{module}.{node.name}"
        for module, path in _modules()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and any(
            a.annotation is not None and ast.unparse(a.annotation) == "Scenario"
            for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs
        )
    ]
    assert not crowded, crowded
    assert len(whole) <= 15, whole
