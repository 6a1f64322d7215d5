"""``fedsim compare``: spec validation, resume, table, plot and report, with a fake runner."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import tomli_w
from rich.console import Console

from fedsim.cli import main
from fedsim.core.config import Scenario, ScenarioError
from fedsim.outputs.run_folder import AUDIT_FILE, METRICS_FILE, VERDICT_FILE
from fedsim.outputs.run_folder import REPORT_FILE as RUN_REPORT_FILE
from fedsim.sweeps.report import PLOT_FILE, REPORT_FILE, RESULTS_FILE, TABLE_CSV, TABLE_MD
from fedsim.sweeps.runs import MARKER, RUNS_DIR, run_sweep
from fedsim.sweeps.spec import Configuration, configurations, load_spec
from fedsim.sweeps.table import run_results, summarise, table_markdown

BASE: dict[str, Any] = {
    "federation": {"num-clients": 2, "rounds": 2},
    "data": {"dataset": "mnist-embedded", "samples-per-client": 50},
    "model": {"name": "lenet5-split"},
}
SPEC: dict[str, Any] = {
    "name": "sweep",
    "base": BASE,
    "seeds": [0, 1],
    "strategies": [
        {"label": "FedAvg", "strategy": "fedavg"},
        {"label": "FedSplit", "strategy": "fedsplit", "overrides": {"client": {"lr": 0.01}}},
    ],
    "defences": [
        {"label": "none"},
        {
            "label": "DP 0.1",
            "chain": [{"name": "gaussian", "sigma": 0.1}],
            "strategies": ["FedAvg"],
        },
    ],
}
# What the fake runs report: accuracy and PSNR per (strategy, sigma), plus the seed.
FAKE = {("fedavg", 0.0): (0.9, 30.0), ("fedavg", 0.1): (0.7, 10.0), ("fedsplit", 0.0): (0.8, 8.0)}


def _write_spec(tmp_path: Path, spec: dict[str, Any]) -> Path:
    path = tmp_path / "spec.toml"
    path.write_text(tomli_w.dumps(spec))
    return path


def _configs(tmp_path: Path, spec: dict[str, Any] = SPEC) -> tuple[Any, list[Configuration]]:
    parsed, base = load_spec(_write_spec(tmp_path, spec))
    return parsed, configurations(parsed, base)


class FakeRuns:
    """Stands in for the simulation: writes metrics.csv / audit.csv, records its calls."""

    def __init__(self, fail: frozenset[str] = frozenset(), stop_after: int | None = None) -> None:
        self.calls: list[str] = []
        self.fail = fail
        self.stop_after = stop_after

    def __call__(
        self, scenario: Scenario, run_dir: Path, console: Console, resume: bool = False
    ) -> None:
        if self.stop_after is not None and len(self.calls) == self.stop_after:
            (run_dir / "half-written").parent.mkdir(parents=True, exist_ok=True)
            (run_dir / "half-written").write_text("")
            raise KeyboardInterrupt
        self.calls.append(scenario.name)
        if scenario.name in self.fail:
            raise RuntimeError("boom")
        sigma = scenario.defences[0].params["sigma"] if scenario.defences else 0.0
        acc, psnr = FAKE[(scenario.strategy.name, sigma)]
        seed = scenario.federation.seed
        run_dir.mkdir(parents=True, exist_ok=True)
        global_model = scenario.strategy.name == "fedavg"
        pd.DataFrame(
            {
                "round": [1, 2],
                "test-acc": [0.1, acc + 0.01 * seed] if global_model else [math.nan] * 2,
                "client-eval-acc": [0.1, acc - 0.05 + 0.01 * seed],
                "seconds": [1.0, 1.0],
            }
        ).to_csv(run_dir / METRICS_FILE, index=False)
        pd.DataFrame(
            {
                "round": [1, 2],
                "client": [0, 1],
                "attack": ["dlg", "dlg"],
                "threat-model": ["update", "update"],
                "psnr": [psnr + seed, psnr + seed + 2.0],
                "ssim": [0.5, 0.7],
                "label-acc": [1.0, 0.0],
            }
        ).to_csv(run_dir / AUDIT_FILE, index=False)


def test_spec_expands_to_every_configuration_with_its_overrides(tmp_path: Path) -> None:
    _, configs = _configs(tmp_path)

    labels = [(c.label, c.seed) for c in configs]
    assert labels == [
        ("FedAvg", 0),
        ("FedAvg", 1),
        ("FedAvg + DP 0.1", 0),
        ("FedAvg + DP 0.1", 1),
        ("FedSplit", 0),
        ("FedSplit", 1),
    ]
    dp = configs[2].scenario
    assert dp.strategy.name == "fedavg" and dp.defences[0].params == {"sigma": 0.1}
    assert configs[4].scenario.strategy.name == "fedsplit"
    assert configs[4].scenario.client.lr == 0.01 and configs[0].scenario.client.lr != 0.01
    assert [c.scenario.federation.seed for c in configs[:2]] == [0, 1]
    assert str(configs[2].path) == "fedavg-dp-0-1/seed-0"


def test_base_may_be_a_scenario_file_next_to_the_spec(tmp_path: Path) -> None:
    (tmp_path / "base.toml").write_text(tomli_w.dumps(BASE))
    _, configs = _configs(tmp_path, {**SPEC, "base": "base.toml"})

    assert len(configs) == 6 and configs[0].scenario.federation.num_clients == 2


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"strategies": [{"strategy": "fedmagic"}]}, "[fedmagic, seed 0] strategy"),
        (
            {"defences": [{"label": "x", "chain": [{"name": "gaussian", "std": 1.0}]}]},
            "[fedavg + x, seed 0] defences[0].std",
        ),
        ({"defences": [{"label": "x", "strategies": ["FedProx"]}]}, "defences[0].strategies"),
        ({"strategies": [{"label": "A"}, {"label": "A"}]}, "strategies"),
        ({"seeds": []}, "seeds"),
        ({"parallel": 0}, "parallel"),
        ({"colour": "blue"}, "colour"),
        ({"base": "missing.toml"}, "base"),
    ],
)
def test_bad_spec_fails_before_anything_runs(
    tmp_path: Path, change: dict[str, Any], key: str
) -> None:
    spec = {**SPEC, "strategies": [{"strategy": "fedavg"}], "defences": [{}], **change}

    with pytest.raises(ScenarioError) as err:
        _configs(tmp_path, spec)

    assert err.value.key == key


def test_cli_rejects_a_bad_spec_with_status_2_and_runs_nothing(tmp_path: Path) -> None:
    spec = _write_spec(tmp_path, {**SPEC, "strategies": [{"strategy": "fedmagic"}]})

    assert main(["compare", str(spec), "--out", str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists()


def test_table_plot_and_report(tmp_path: Path) -> None:
    spec, configs = _configs(tmp_path)

    outcome = run_sweep(spec, configs, tmp_path / "out", Console(quiet=True), FakeRuns())

    table = pd.read_csv(tmp_path / "out" / TABLE_CSV).set_index("configuration")
    assert list(table.index) == ["FedAvg", "FedAvg + DP 0.1", "FedSplit"]
    fedavg = table.loc["FedAvg"]
    assert fedavg["accuracy-mean"] == pytest.approx(0.905)  # test-acc 0.90, 0.91
    assert fedavg["accuracy-std"] == pytest.approx(0.01 / math.sqrt(2))
    assert fedavg["psnr-mean"] == pytest.approx(31.5)  # seeds: mean(30, 32), mean(31, 33)
    assert fedavg["psnr-std"] == pytest.approx(1 / math.sqrt(2))
    assert fedavg["label-acc-mean"] == pytest.approx(0.5)
    assert fedavg["accuracy-from"] == "test-acc"
    # No global model: the personalised client evaluation.
    assert table.loc["FedSplit", "accuracy-from"] == "client-eval-acc"
    assert table.loc["FedSplit", "accuracy-mean"] == pytest.approx(0.755)
    assert len(pd.read_csv(tmp_path / "out" / RESULTS_FILE)) == 6
    report = (tmp_path / "out" / REPORT_FILE).read_text()
    assert f"]({PLOT_FILE})" in report and _cells(report, "FedSplit")[1] == "75.50 ± 0.71"
    assert (tmp_path / "out" / TABLE_MD).read_text() in report
    assert (tmp_path / "out" / PLOT_FILE).read_bytes()[:4] == b"\x89PNG"
    assert len(outcome.ran) == 6 and not outcome.failed


def _cells(markdown: str, configuration: str) -> list[str]:
    """The cells of the first markdown table row of ``configuration``."""
    row = next(line for line in markdown.splitlines() if line.startswith(f"| {configuration} "))
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def test_table_gives_median_max_and_success_share_over_every_attack(tmp_path: Path) -> None:
    spec, configs = _configs(tmp_path, {**SPEC, "success-psnr": 31.5})

    run_sweep(spec, configs, tmp_path / "out", Console(quiet=True), FakeRuns())

    table = pd.read_csv(tmp_path / "out" / TABLE_CSV).set_index("configuration")
    # FedAvg's four attacks (two seeds x two rounds): 30, 32, 31, 33 dB.
    assert table.loc["FedAvg", "attacks"] == 4
    assert table.loc["FedAvg", "psnr-median"] == pytest.approx(31.5)
    assert table.loc["FedAvg", "psnr-max"] == pytest.approx(33.0)
    assert table.loc["FedAvg", "success-rate"] == pytest.approx(0.5)  # 32 and 33
    assert table.loc["FedSplit", "success-rate"] == 0.0  # 8, 10, 9, 11 dB
    results = pd.read_csv(tmp_path / "out" / RESULTS_FILE)
    seed0 = results.query("configuration == 'FedAvg' and seed == 0").iloc[0]
    assert (seed0["psnr-median"], seed0["psnr-max"], seed0["success-rate"]) == (31.0, 32.0, 0.5)
    markdown = (tmp_path / "out" / TABLE_MD).read_text()
    assert "success (≥ 31.5 dB)" in markdown
    assert _cells(markdown, "FedAvg")[4:7] == ["31.50", "33.00", "50%"]  # median, max, success


def test_interrupted_sweep_resumes_without_redoing_finished_runs(tmp_path: Path) -> None:
    spec, configs = _configs(tmp_path)
    out = tmp_path / "out"

    with pytest.raises(KeyboardInterrupt):
        run_sweep(spec, configs, out, Console(quiet=True), FakeRuns(stop_after=2))
    again = FakeRuns()
    outcome = run_sweep(spec, configs, out, Console(quiet=True), again)

    assert [c.path for c in outcome.skipped] == [c.path for c in configs[:2]]
    assert again.calls == [c.scenario.name for c in configs[2:]]
    assert not (out / RUNS_DIR / configs[2].path / "half-written").exists()
    assert all((out / RUNS_DIR / c.path / MARKER).is_file() for c in configs)


def test_a_changed_configuration_is_run_again(tmp_path: Path) -> None:
    spec, configs = _configs(tmp_path)
    run_sweep(spec, configs, tmp_path / "out", Console(quiet=True), FakeRuns())
    changed = {**SPEC, "base": {**BASE, "federation": {"num-clients": 2, "rounds": 3}}}
    spec2, configs2 = _configs(tmp_path, changed)

    again = FakeRuns()
    run_sweep(spec2, configs2, tmp_path / "out", Console(quiet=True), again)

    assert len(again.calls) == len(configs2)


def test_a_failed_run_is_reported_and_the_others_go_on(tmp_path: Path) -> None:
    spec, configs = _configs(tmp_path)
    failing = configs[2].scenario.name

    outcome = run_sweep(
        spec, configs, tmp_path / "out", Console(quiet=True), FakeRuns(fail=frozenset({failing}))
    )

    assert list(outcome.failed) == [str(configs[2].path)]
    assert len(outcome.ran) == 5
    assert outcome.table.set_index("configuration").loc["FedAvg + DP 0.1", "seeds"] == 1
    assert "Failed runs" in (tmp_path / "out" / REPORT_FILE).read_text()


def test_a_sweep_whose_every_run_failed_still_writes_its_report(tmp_path: Path) -> None:
    spec, configs = _configs(tmp_path)
    every = frozenset(c.scenario.name for c in configs)

    outcome = run_sweep(spec, configs, tmp_path / "out", Console(quiet=True), FakeRuns(every))

    assert len(outcome.failed) == len(configs) and outcome.table.empty
    assert "(no finished runs)" in (tmp_path / "out" / REPORT_FILE).read_text()
    page = (tmp_path / "out" / RUN_REPORT_FILE).read_text()
    assert "No finished runs" in page and str(configs[0].path) in page


def test_a_finished_run_missing_its_metrics_is_run_again(tmp_path: Path) -> None:
    spec, configs = _configs(tmp_path)
    out = tmp_path / "out"
    run_sweep(spec, configs, out, Console(quiet=True), FakeRuns())
    (out / RUNS_DIR / configs[1].path / METRICS_FILE).unlink()

    again = FakeRuns()
    outcome = run_sweep(spec, configs, out, Console(quiet=True), again)

    assert again.calls == [configs[1].scenario.name]
    assert len(outcome.results) == 6 and not outcome.failed


def test_a_dry_run_refuses_what_the_run_refuses(tmp_path: Path) -> None:
    # No CUDA here: a GPU share would leave Ray waiting forever.
    gpu_base = {**BASE, "backend": {"num-gpus": 0.5}}
    spec = _write_spec(tmp_path, {**SPEC, "base": gpu_base, "defences": [{"label": "none"}]})

    for dry in (["--dry-run"], []):
        assert main(["compare", str(spec), "--out", str(tmp_path / "out"), *dry]) == 2
    assert not (tmp_path / "out").exists()


def test_parallel_runs_cover_every_configuration(tmp_path: Path) -> None:
    spec, configs = _configs(tmp_path, {**SPEC, "parallel": 3})
    runs = FakeRuns()

    outcome = run_sweep(spec, configs, tmp_path / "out", Console(quiet=True), runs)

    assert sorted(runs.calls) == sorted(c.scenario.name for c in configs)
    assert len(outcome.table) == 3


REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_fedavg_leaks_more_than_dp_fedsplit_and_fedcg(tmp_path: Path) -> None:
    # FedSGD on LeNet-Zhu (the audit's DLG setting), one round, one victim, a small DLG budget;
    # reconstruction is compared, so no leak analyses.
    spec = {
        "name": "leakage",
        "base": str(REPO / "scenarios" / "audit-fedavg.toml"),
        "overrides": {
            "federation": {"rounds": 1},
            "audit": {"attacks": [{"name": "dlg", "steps": 40, "restarts": 2}], "leaks": []},
        },
        "strategies": [
            {"label": "FedAvg", "strategy": "fedavg"},
            {"label": "FedSplit", "strategy": "fedsplit"},
            {"label": "FedCG", "strategy": {"name": "fedcg", "distill-iterations": 5}},
        ],
        "defences": [
            {"label": "none"},
            {
                "label": "DP-SGD",
                "chain": [{"name": "dp-sgd", "noise-multiplier": 1.0, "max-grad-norm": 1.0}],
                "strategies": ["FedAvg"],
            },
        ],
    }
    parsed, configs = _configs(tmp_path, spec)

    outcome = run_sweep(parsed, configs, tmp_path / "out", Console(quiet=True))

    assert not outcome.failed
    table = outcome.table.set_index("configuration")
    psnr, ssim = table["psnr-mean"].to_dict(), table["ssim-mean"].to_dict()
    assert psnr["FedAvg"] >= 25.0
    for defended in ("FedAvg + DP-SGD", "FedSplit", "FedCG"):
        assert psnr["FedAvg"] >= psnr[defended] + 10.0, table[["psnr-mean", "ssim-mean"]]
        assert ssim["FedAvg"] >= ssim[defended] + 0.3
    assert table["epsilon-mean"].to_dict()["FedAvg + DP-SGD"] > 0
    assert (tmp_path / "out" / PLOT_FILE).is_file()


def test_a_run_with_a_portfolio_gets_a_verdict_row_first(tmp_path: Path) -> None:
    run_dir = tmp_path / "sweep" / "runs" / "fedavg" / "seed-0"
    run_dir.mkdir(parents=True)
    pd.DataFrame({"round": [1], "test-acc": [0.9], "seconds": [1.0]}).to_csv(
        run_dir / METRICS_FILE, index=False
    )
    pd.DataFrame(
        {
            "round": [1, 1, 1, 1],
            "client": [0, 0, 1, 1],
            "attack": ["dlg", "ig", "dlg", "ig"],
            "threat-model": ["probe"] * 4,
            "psnr": [6.0, 22.0, 30.0, 12.0],
            "ssim": [0.1, 0.9, 0.95, 0.4],
            "label-acc": [1.0, 1.0, 1.0, 1.0],
            "converged": [True] * 4,
            "batch-size": [1] * 4,
            "attacker-residual": [0.5, 0.1, 0.1, 0.5],
        }
    ).to_csv(run_dir / AUDIT_FILE, index=False)
    config = Configuration("FedAvg", "fedavg", "none", 0, Scenario())

    rows = run_results(config, run_dir, "auto")

    assert [r["attack"] for r in rows] == ["verdict", "dlg", "ig"]
    # Per victim the best attack (22 and 30 dB), then the mean as for every attack row.
    assert rows[0]["psnr"] == pytest.approx(26.0) and rows[0]["audited"] == 2
    assert rows[1]["psnr"] == pytest.approx(18.0)


def test_a_sweep_of_unaudited_runs_reads_back_without_a_pandas_warning(tmp_path: Path) -> None:
    from fedsim.sweeps.report import _read_frame

    # Every run unaudited: the attack column is empty, which pandas reads as float nan.
    (tmp_path / TABLE_CSV).write_text("configuration,attack,accuracy-mean\nFedAvg,,0.9\nB,,0.8\n")

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # pandas' Pandas4Warning: an error in a coming pandas
        frame = _read_frame(tmp_path / TABLE_CSV)

    assert frame["attack"].tolist() == ["", ""]
    assert frame["accuracy-mean"].tolist() == [0.9, 0.8]


def test_the_table_sets_both_epsilons_and_the_other_kinds_side_by_side(tmp_path: Path) -> None:
    """The accountant's epsilon (DP-SGD's, else central DP's), the canaries' lower bound
    (its highest round), else the canary clients' last estimate, and the other kinds'
    verdicts reach the compare table."""
    rows = []
    for label, metrics in (
        (
            "DP-SGD",
            {
                "dp-epsilon": [3.0, 5.0],
                "audit-epsilon-empirical": [0.4, 0.2],
                "audit-epsilon-empirical-fdp": [0.5, 0.7],
            },
        ),
        ("central DP", {"central-dp-epsilon": [2.0, 2.5]}),
        (
            "canary clients",
            {"central-dp-epsilon": [2.0, 2.5], "central-dp-epsilon-empirical": [2.2, 1.9]},
        ),
    ):
        run_dir = tmp_path / label / "seed-0"
        run_dir.mkdir(parents=True)
        pd.DataFrame({"round": [1, 2], "test-acc": [0.5, 0.6], **metrics}).to_csv(
            run_dir / METRICS_FILE, index=False
        )
        if label == "DP-SGD":  # an audited run's other kinds, per victim
            pd.DataFrame(
                {"round": [2, 2], "label-tv": [0.1, 0.3], "membership-auc": [0.6, math.nan]}
            ).to_csv(run_dir / VERDICT_FILE, index=False)
        config = Configuration(label, "fedavg", label, 0, Scenario())
        rows += run_results(config, run_dir, "auto")

    table = summarise(pd.DataFrame(rows)).set_index("configuration")

    assert table["epsilon-mean"].to_dict() == {
        "DP-SGD": 5.0,
        "central DP": 2.5,
        "canary clients": 2.5,
    }
    assert table.loc["DP-SGD", "epsilon-empirical-mean"] == 0.4
    assert table.loc["DP-SGD", "epsilon-empirical-fdp-mean"] == 0.7  # its own highest round
    assert math.isnan(table.loc["canary clients", "epsilon-empirical-fdp-mean"])
    assert table.loc["canary clients", "epsilon-empirical-mean"] == 1.9
    assert math.isnan(table.loc["central DP", "epsilon-empirical-mean"])
    assert table.loc["DP-SGD", "label-tv-mean"] == pytest.approx(0.2)
    assert table.loc["DP-SGD", "membership-auc-mean"] == pytest.approx(0.6)
    assert math.isnan(table.loc["central DP", "label-tv-mean"])  # not audited
    markdown = table_markdown(table.reset_index())
    assert "epsilon (canaries)" in markdown and "0.40" in markdown
    assert "epsilon (canaries, f-DP)" in markdown and "0.70" in markdown
    assert "labels TV" in markdown and "membership AUC" in markdown
    assert "representatives SSIM" not in markdown  # no run analysed them
