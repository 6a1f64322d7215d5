"""Scenario validation: every bad input stops with one clear message, before Ray."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from fedsim.cli import main
from fedsim.core.config import ScenarioError
from fedsim.core.scenario_file import (
    apply_overrides,
    check_own_components,
    load_scenario,
    scenario_from_dict,
)
from fedsim.scenario.validate import check_components, validate

REPO = Path(__file__).resolve().parents[1]


def _with(table: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    raw = copy.deepcopy(table)
    return apply_overrides(raw, [f"{path}={value}"])


@pytest.mark.parametrize(
    ("path", "value", "key", "fragment"),
    [
        ("strategy.name", '"fedmagic"', "strategy", "allowed: "),
        ("data.dataset", '"imagenet"', "data.dataset", "mnist-embedded"),
        ("model.name", '"vgg"', "model.name", "lenet-zhu"),
        ("model.init", '"orthogonal"', "model.init", "xavier-normal"),
        ("data.partitioner.name", '"zipf"', "data.partitioner", "dirichlet"),
        ("data.partitioner", '{name = "dirichlet", alpha = 0.0}', "data.partitioner.alpha", "> 0"),
        ("data.partitioner", '{name = "dirichlet", alpha = -1.0}', "data.partitioner.alpha", "> 0"),
        ("federation.clients-per-round", "4", "federation.clients-per-round", "between 1"),
        (
            "federation.evaluate-clients-per-round",
            "4",
            "federation.evaluate-clients-per-round",
            "between 0",
        ),
        (
            "federation",
            "{num-clients = 3, evaluate-fraction = 0.5, evaluate-clients-per-round = 1}",
            "federation.evaluate-clients-per-round",
            "not both",
        ),
        ("federation.num-clients", '"three"', "federation.num-clients", "an integer"),
        ("federation.rounds", "1.5", "federation.rounds", "an integer"),
        ("client.lr", "-0.1", "client.lr", "> 0"),
        ("client.optimizer", '"rmsprop"', "client.optimizer", "'sgd'"),
        ("client.batch-size", "true", "client.batch-size", "an integer"),
        ("federation.colour", '"blue"', "federation.colour", "unknown key"),
        ("backend.num-gpus", "0.5", "backend.num-gpus", "without a CUDA GPU"),
        ("data.dataset", '"cifar10"', "data.root", "needs a local root"),
        ("data", '{dataset = "cifar10", root = "/etc/passwd"}', "data.root", "this is a file"),
        ("data.dataset", '"lfw-faces"', "data.dataset", "has no labels"),
    ],
)
def test_bad_input_names_key_value_and_allowed(
    quick_scenario_table: dict[str, Any], path: str, value: str, key: str, fragment: str
) -> None:
    raw = _with(quick_scenario_table, path, value)
    if path == "backend.num-gpus":
        pytest.importorskip("torch")
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU")

    with pytest.raises(ScenarioError) as info:
        validate(scenario_from_dict(raw))

    assert info.value.key == key
    assert fragment in str(info.value)


def test_unknown_top_level_table_is_an_error(quick_scenario_table: dict[str, Any]) -> None:
    raw = {**quick_scenario_table, "federaton": {"rounds": 2}}

    with pytest.raises(ScenarioError, match=r"federaton.*unknown key"):
        scenario_from_dict(raw)


def test_dataset_root_without_data(quick_scenario_table: dict[str, Any], tmp_path: Path) -> None:
    raw = _with(quick_scenario_table, "data.dataset", '"fashion-mnist"')
    raw = _with(raw, "data.root", f'"{tmp_path}"')

    with pytest.raises(ScenarioError) as info:
        validate(scenario_from_dict(raw))

    assert info.value.key == "data.root"
    assert "holds no fashion-mnist data" in str(info.value)


def test_overrides_parse_toml_values(quick_scenario_table: dict[str, Any]) -> None:
    raw = apply_overrides(
        copy.deepcopy(quick_scenario_table),
        ["federation.rounds=7", "client.lr=0.5", "data.partitioner.name=shards", "name=other"],
    )

    scenario = scenario_from_dict(raw)

    assert scenario.federation.rounds == 7
    assert scenario.client.lr == 0.5
    assert scenario.data.partitioner.name == "shards"
    assert scenario.name == "other"


def test_shipped_scenarios_validate_without_data_or_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    # Parsing and component checks need neither datasets nor hardware: every
    # loader and the CUDA probe fail if anything reaches them.
    import torch

    from fedsim.core import data
    from fedsim.sweeps.spec import configurations, load_spec

    def untouchable(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("validation reached the machine")

    monkeypatch.setattr(data, "_load_cached", untouchable)
    monkeypatch.setattr(torch.cuda, "is_available", untouchable)
    for path in sorted((REPO / "scenarios").glob("*.toml")):
        if path.name.startswith("compare-"):  # a fedsim compare spec: every run validates
            assert configurations(*load_spec(path))
            continue
        scenario = load_scenario(path)
        check_components(scenario)
        assert scenario.name


def test_cli_exits_nonzero_with_one_line_before_ray(
    tmp_path: Path, quick_scenario_table: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(
        tomli_w.dumps(
            _with(quick_scenario_table, "data.partitioner", "{name='dirichlet', alpha=0.0}")
        )
    )

    code = main(["run", str(path), "--out", str(tmp_path / "run")])

    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err == ["fedsim: error: data.partitioner.alpha = 0.0: must be > 0"]
    assert not (tmp_path / "run").exists()
    assert "ray" not in sys.modules or not __import__("ray").is_initialized()


def test_console_script_reports_bad_set_value(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedsim.cli",
            "run",
            str(REPO / "scenarios" / "quickstart.toml"),
            "--set",
            "federation.clients-per-round=9",
            "--out",
            str(tmp_path / "r"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )

    assert result.returncode == 2
    assert "federation.clients-per-round = 9" in result.stderr
    assert "between 1 and num-clients (4)" in result.stderr


@pytest.mark.parametrize("item", ["..=1", "a..b=1", "federation.=1", " .rounds=2"])
def test_a_set_key_with_an_empty_part_is_named(item: str) -> None:
    with pytest.raises(ScenarioError, match=r"--set = .*has an empty part; must look like key"):
        apply_overrides({}, [item])


# What a scenario's form check may not wait for: each takes seconds to import.
HEAVY_MODULES = ("torch", "torchvision", "ray", "flwr", "flwr_datasets", "pandas")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('name = "x"\n[federation\nrounds = 2\n', "is not valid TOML"),
        ('name = "x"\n[federation]\nround = 2\n', "federation.round = 2: unknown key"),
        ('name = "x"\n[federation]\nrounds = "two"\n', "federation.rounds"),
        # A component's value or name (fedsim.core.params): the house issue's two examples.
        ('name = "x"\n[[defences]]\nname = "prune"\nshare = 1.5\n', "share = 1.5: must be in"),
        ('name = "x"\n[[defences]]\nname = "quantize"\nbits = 0\n', "bits = 0: must be in"),
        ('name = "x"\n[[defences]]\nname = "prunes"\n', "defences[0] = 'prunes': allowed"),
        ('name = "x"\n[audit]\nleaks = ["nope"]\n', "audit.leaks[0] = 'nope': allowed"),
        ('name = "x"\n[audit]\nleaks = [{name = "llg", variant = "x"}]\n', "variant = 'x'"),
        ('name = "x"\n[audit]\nattacks = [{name = "dgl"}]\n', "attacks[0] = 'dgl': allowed"),
        ('name = "x"\n[audit]\nattacks = [{name = "ig", restarts = 0}]\n', "restarts = 0"),
    ],
)
def test_a_malformed_scenario_is_refused_before_the_heavy_imports(
    tmp_path: Path, text: str, says: str
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    # A fresh interpreter: this test process has imported everything already.
    probe = (
        "import sys\n"
        "from fedsim.cli import main\n"
        f"rc = main(['run', {str(bad)!r}, '--out', {str(tmp_path / 'r')!r}])\n"
        f"print(rc, [m for m in {HEAVY_MODULES!r} if m in sys.modules])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=False
    )

    assert result.stdout.split("\n")[0] == "2 []", result.stdout + result.stderr
    assert says in result.stderr
    assert not (tmp_path / "r").exists()


def test_own_components_keep_their_params_where_the_early_check_reads() -> None:
    from fedsim.attacks import ATTACKS
    from fedsim.attacks.leakage import LEAKS
    from fedsim.clients.defences import DEFENCES
    from fedsim.core.params.attacks import ATTACK_PARAMS
    from fedsim.core.params.defences import DEFENCE_PARAMS
    from fedsim.core.params.leaks import LEAK_PARAMS

    # Registration refuses a class whose Params differ; here: no name is there but not here.
    kinds = ((DEFENCES, DEFENCE_PARAMS), (ATTACKS, ATTACK_PARAMS), (LEAKS, LEAK_PARAMS))
    for registry, schemas in kinds:
        own = [n for n in registry.names() if registry.origin(n) == "fedsim"]
        assert schemas.names() == own
        assert all(registry.get(n).Params is schemas.get(n) for n in own)
        assert schemas.aliases() == registry.aliases()


def test_a_plugin_name_passes_the_early_check_and_is_refused_after_the_plugins_load(
    tmp_path: Path,
) -> None:
    plugin = tmp_path / "lab.py"
    plugin.write_text("")  # registers nothing: the name stays unknown after its import
    raw = {"name": "x", "plugins": [str(plugin)], "defences": [{"name": "lab-noise"}]}
    scenario = scenario_from_dict(raw)
    check_own_components(scenario)  # may be the plugin's: left to validation

    with pytest.raises(ScenarioError, match=r"defences\[0\] = 'lab-noise': allowed: clip"):
        check_components(scenario)
