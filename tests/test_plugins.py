"""Plugins: components from outside fedsim, by entry point or the scenario's ``plugins`` key.

Fast: no Ray, no simulation. A broken plugin (it fails to import, its name clashes
with fedsim's or another plugin's, it registers the wrong kind) is refused in one
line by validation. The example plugin (``examples/plugin``, package ``tinylab``)
runs end to end in ``tests/test_resources.py`` (a separately started Ray head) and
``tests/test_flower_app.py`` (``fedsim run``'s local Ray and the Deployment Engine).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path

import pytest

from fedsim.attacks import ATTACKS
from fedsim.cli import main
from fedsim.core import plugins
from fedsim.core.config import ScenarioError
from fedsim.core.models import MODELS
from fedsim.core.registry import Registry
from fedsim.core.scenario_file import load_scenario, scenario_from_dict
from fedsim.scenario.validate import check_components

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "plugin"
TINYLAB = EXAMPLE / "tinylab"

pytestmark = pytest.mark.usefixtures("plugin_env")  # paths and variables undone after


def _module(tmp_path: Path, body: str) -> Path:
    """A plugin file of a name of its own (every test registers into the shared registries)."""
    path = tmp_path / f"plugin_{uuid.uuid4().hex[:8]}.py"
    path.write_text(body)
    return path


def _with_plugins(*entries: str) -> dict[str, object]:
    return {"plugins": list(entries), "model": {"name": "lenet-zhu"}}


def _refusal(raw: dict[str, object]) -> str:
    with pytest.raises(ScenarioError) as err:
        check_components(scenario_from_dict(raw))
    message = str(err.value)
    assert "\n" not in message
    return message


def test_the_example_plugin_by_path_registers_all_four_with_its_origin() -> None:
    scenario = load_scenario(EXAMPLE / "tinylab.toml")  # plugins = ["./tinylab"]
    components = check_components(scenario)

    # A path is relative to the scenario file, and stored absolute (a run folder's copy works).
    assert scenario.plugins == (str(TINYLAB),)
    assert components.strategy.cls.__module__ == "tinylab.strategies"
    assert [a.name for a in components.attacks] == ["tinylab-row-ratio", "dlg"]
    assert MODELS.origin("tinylab-mlp") == ATTACKS.origin("tinylab-row-ratio") == "tinylab"
    assert ATTACKS.origin("dlg") == "fedsim"
    # Named for the processes this one starts (Ray workers read it in every registry).
    assert os.environ[plugins.PLUGINS_ENV] == str(TINYLAB)
    assert str(EXAMPLE) in os.environ["PYTHONPATH"].split(os.pathsep)


def test_a_plugin_attack_sees_an_observation_only() -> None:
    from fedsim.attacks.base import Observation

    plugins.use_plugins([str(TINYLAB)])
    hints = ATTACKS.get("tinylab-row-ratio").reconstruct.__annotations__

    assert hints["observation"] in ("Observation", Observation)
    assert set(hints) == {"observation", "seed", "return"}


PRESET_ATTACK = """
from fedsim.attacks import ATTACKS
from fedsim.attacks.reconstruction.dlg import DLG
from fedsim.attacks.presets import StepCaps


@ATTACKS.register({name!r})
class LabDLG(DLG):
    in_auto = True
    step_caps = StepCaps(7, resnet=3, measured={{"lenet-zhu": 11}}, restarts=1)
"""


def test_a_plugin_attack_with_presets_joins_auto_after_the_portfolio(tmp_path: Path) -> None:
    from fedsim.scenario.portfolio import auto_attacks

    name = f"lab-dlg-{uuid.uuid4().hex[:6]}"
    plugin = _module(tmp_path, PRESET_ATTACK.format(name=name))
    raw = _with_plugins(str(plugin)) | {"audit": {"enabled": True, "threat-model": "probe"}}

    attacks = check_components(scenario_from_dict(raw)).attacks

    assert [a.name for a in attacks][-1] == name  # after fedsim's own, in the portfolio's order
    fedsims = {a.name for a in attacks[:-1]}
    assert [a.name for a in attacks[:-1]] == [n for n in auto_attacks() if n in fedsims]
    ours = attacks[-1].params
    assert (ours.steps, ours.restarts) == (11, 1)  # its own caps for lenet-zhu, no other change
    dlg = next(a for a in attacks if a.name == "dlg").params
    assert (dlg.steps, dlg.restarts) == (100, 2)  # the class it extends keeps its own


def test_a_plugin_that_fails_to_import_is_one_line(tmp_path: Path) -> None:
    broken = _module(tmp_path, "import no_such_module_of_a_lab\n")

    message = _refusal(_with_plugins(str(broken)))

    assert message.startswith("plugins[0] = ")
    assert "fails to import (ModuleNotFoundError: No module named 'no_such_module_of_a_lab')" in (
        message
    )


@pytest.mark.parametrize(
    ("entry", "allowed"),
    [
        ("no_such_lab_module", "fails to import (ModuleNotFoundError"),
        ("./missing.py", "is not a .py file or a package folder"),
        ("my-lab", "must be a module name"),
    ],
)
def test_a_plugin_that_is_not_there_is_one_line(entry: str, allowed: str) -> None:
    assert allowed in _refusal(_with_plugins(entry))


@pytest.mark.parametrize(
    ("body", "kind", "name"),
    [
        (
            "from fedsim.core.models import MODELS, lenet_zhu\n"
            "MODELS.register('lenet-zhu')(lambda spec: lenet_zhu(spec))\n",
            "model",
            "lenet-zhu",
        ),
        (
            "from fedsim.strategies.registry import STRATEGIES\n"
            "from fedsim.strategies.fedavg import FedAvg\n"
            "STRATEGIES.register('fedprox')(type('LabProx', (FedAvg,), {}))\n",
            "strategy",
            "fedprox",
        ),
    ],
)
def test_a_name_clash_with_fedsim_is_one_line(
    tmp_path: Path, body: str, kind: str, name: str
) -> None:
    clash = _module(tmp_path, body)

    message = _refusal(_with_plugins(str(clash)))

    assert f"{kind} {name!r} of {clash.stem} clashes with the {kind} {name!r} of fedsim" in (
        message
    )


def test_a_clash_between_two_plugins_names_both(tmp_path: Path) -> None:
    name = f"lab-mlp-{uuid.uuid4().hex[:6]}"
    body = (
        f"from fedsim.core.models import MODELS, lenet_zhu\nMODELS.register({name!r})(lenet_zhu)\n"
    )
    first, second = _module(tmp_path, body), _module(tmp_path, body.replace("lenet_zhu)", "print)"))

    message = _refusal(_with_plugins(str(first), str(second)))

    assert message.startswith("plugins[1] = ")
    assert f"model {name!r} of {second.stem} clashes with the model {name!r} of {first.stem}" in (
        message
    )


@pytest.mark.parametrize(
    ("body", "allowed"),
    [
        (
            "from fedsim.attacks import ATTACKS\nATTACKS.register('lab-fn')(lambda obs: obs)\n",
            "attack 'lab-fn' of {m} is a function; expected a subclass of "
            "fedsim.attacks.base.Attack with Params",
        ),
        (
            "from fedsim.core.models import MODELS\nMODELS.register('lab-three')(3)\n",
            "model 'lab-three' of {m} is an int; expected a callable",
        ),
        (
            "from fedsim.core.partition import PARTITIONERS\n"
            "PARTITIONERS.register('lab-split')(lambda labels, n, rng, params: [])\n",
            "partitioner 'lab-split' of {m} has no 'Params'; expected a callable with Params",
        ),
    ],
)
def test_a_plugin_of_the_wrong_kind_is_one_line(tmp_path: Path, body: str, allowed: str) -> None:
    module = _module(tmp_path, body)

    assert allowed.format(m=module.stem) in _refusal(_with_plugins(str(module)))


def test_a_plugin_model_that_is_no_split_net_is_refused(tmp_path: Path) -> None:
    name = f"lab-linear-{uuid.uuid4().hex[:6]}"
    module = _module(
        tmp_path,
        "from torch import nn\nfrom fedsim.core.models import MODELS\n"
        f"MODELS.register({name!r})(lambda spec: nn.Flatten())\n",
    )

    message = _refusal({"plugins": [str(module)], "model": {"name": name}})

    assert message.startswith(f"model.name = {name!r}: it builds a Flatten, not a ")


def _distribution(site: Path, name: str, entry_points: str) -> None:
    """An installed distribution as importlib.metadata finds one on ``sys.path``."""
    info = site / f"{name}-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(entry_points)


def test_entry_points_register_modules_and_objects_with_their_distribution(
    tmp_path: Path,
) -> None:
    model = f"ep-mlp-{uuid.uuid4().hex[:6]}"
    (tmp_path / "ep_lab.py").write_text(
        "from fedsim.core.models import MODELS, lenet_zhu\n"
        f"MODELS.register({model!r})(lenet_zhu)\n"
        "def builder(spec):\n    return lenet_zhu(spec)\n"
    )
    _distribution(
        tmp_path,
        "ep-lab",
        "[fedsim.models]\nep_lab = ep_lab\nep-object = ep_lab:builder\n[other]\nx = nothing\n",
    )
    sys.path.insert(0, str(tmp_path))
    plugins.refresh_entry_points()
    registry: Registry[object] = Registry("model", group="fedsim.models")

    names = registry.names()  # the first lookup loads the group

    assert "ep-object" in names and registry.origin("ep-object") == "ep-lab"
    assert MODELS.origin(model) == "ep-lab"  # the module's own decorator, its distribution's


def test_an_entry_point_that_fails_to_import_is_one_line(tmp_path: Path) -> None:
    _distribution(tmp_path, "broken-lab", "[fedsim.attacks]\nlab = no_such_lab.attacks\n")
    sys.path.insert(0, str(tmp_path))
    plugins.refresh_entry_points()
    registry: Registry[object] = Registry("attack", group="fedsim.attacks")

    with pytest.raises(ScenarioError) as err:
        registry.names()

    assert str(err.value) == (
        "entry point fedsim.attacks:lab of broken-lab = 'no_such_lab.attacks': fails to import "
        "(ModuleNotFoundError: No module named 'no_such_lab')"
    )


def test_fedsim_list_shows_an_installed_plugin_and_its_distribution(tmp_path: Path) -> None:
    # The example's own entry points, installed the way pip would (metadata on sys.path).
    groups = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]["entry-points"]
    text = "".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in points.items())
        for group, points in groups.items()
    )
    _distribution(tmp_path, "tinylab", text)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(EXAMPLE), str(REPO)]),
        "COLUMNS": "200",
    }

    listed = subprocess.run(
        [sys.executable, "-m", "fedsim.cli", "list"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout

    cells = [[c.strip() for c in line.split("│")] for line in listed.splitlines()]
    rows = {(c[1], c[2], c[4]) for c in cells if len(c) > 5}  # kind, name, from
    for kind, name in [
        ("strategies", "tinylab-smooth"),
        ("attacks", "tinylab-row-ratio"),
        ("datasets", "tinylab-bars"),
        ("models", "tinylab-mlp"),
    ]:
        assert (kind, name, "tinylab") in rows, listed
    assert ("models", "lenet-zhu", "fedsim") in rows


def test_fedsim_list_shows_a_plugin_the_environment_names(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    plugins.use_plugins([str(TINYLAB)])
    monkeypatch.setenv("COLUMNS", "200")

    assert main(["list", "models"]) == 0

    lines = capsys.readouterr().out.splitlines()
    assert any("tinylab-mlp" in line and "│ tinylab " in line for line in lines)
