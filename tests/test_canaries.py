"""The one-run audit: canaries in one client's data, scored as membership candidates.

Real data (embedded MNIST), seeded, through the real ClientApp, server loop and
audit (``serve`` on an in-process grid: leak analyses run on the driver thread,
no Ray). Measured on this machine (2 shared cores, load 1.7-2.1, 4 December 2026).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from flwr.app import RecordDict
from inprocess import InProcessGrid
from rich.console import Console

from fedsim.attacks.leakage import LeakInput
from fedsim.audit.canaries import CanaryAudit
from fedsim.audit.candidates import AuditPool
from fedsim.clients.app import build_client_app
from fedsim.clients.base import ClientEnv
from fedsim.core import protocol
from fedsim.core.canaries import design_canaries
from fedsim.core.config import ScenarioError
from fedsim.core.data import load_dataset
from fedsim.core.scenario_file import scenario_from_dict
from fedsim.core.seeds import SeedStream, stream_rng
from fedsim.outputs.results import RunRecorder, write_summary
from fedsim.outputs.run_folder import LEAKS_FILE, new_run_dir
from fedsim.scenario.components import client_spec
from fedsim.scenario.validate import check_components, check_machine
from fedsim.simulation.flower import message_context
from fedsim.simulation.runner import serve
from fedsim.strategies import STRATEGIES

SEEDS = (0, 1, 2)


def canary_table(
    seed: int = 0, canaries: int = 100, clients: int = 2, **tables: dict[str, Any]
) -> dict[str, Any]:
    """Two clients of 20 digits, 60 epochs each (an overfitting client), one round audited
    by loss-drop alone, ``canaries`` canaries for client 0."""
    table: dict[str, Any] = {
        "name": "canaries",
        "federation": {"num-clients": clients, "rounds": 1, "seed": seed},
        "data": {"dataset": "mnist-embedded", "samples-per-client": 20, "normalize": True},
        "model": {"name": "lenet5-split"},
        "strategy": {"name": "fedavg"},
        "client": {"local-epochs": 60, "batch-size": 16, "optimizer": "adam", "lr": 0.003},
        "audit": {
            "enabled": True,
            "attacks": [],
            "leaks": [{"name": "loss-drop"}],
            "canaries": canaries,
            "canary-client": 0,
            "seed": seed,
        },
    }
    for name, values in tables.items():
        table[name] = {**table.get(name, {}), **values} if isinstance(values, dict) else values
    return table


def audited_run(table: dict[str, Any], tmp_path: Path) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """``metrics.csv``'s rows, ``leaks.csv`` and ``summary.md`` of a served run."""
    scenario = scenario_from_dict(table)
    components = check_components(scenario)
    run_dir = new_run_dir(scenario.output, scenario.name, tmp_path / "run")
    routine = STRATEGIES.get(scenario.strategy.name).client_routine
    clients = scenario.federation.num_clients
    grid = InProcessGrid(build_client_app(client_spec(scenario), routine, None), clients)
    recorder = RunRecorder(run_dir, scenario.federation.rounds, Console(quiet=True))
    with message_context():
        serve(grid, components, recorder, Console(quiet=True))  # type: ignore[arg-type]
    summary = write_summary(scenario, recorder.rows, run_dir, 1.0)
    return pd.DataFrame(recorder.rows), pd.read_csv(run_dir / LEAKS_FILE), summary


def test_canaries_change_the_canary_clients_data_and_no_other() -> None:
    plain = scenario_from_dict(canary_table(canaries=0, clients=3))
    with_canaries = scenario_from_dict(canary_table(canaries=60, clients=3))
    bundle = load_dataset(plain.data)
    plan = client_spec(with_canaries).canaries

    canaries = design_canaries(bundle, plan)
    envs = {
        name: [ClientEnv.create(client_spec(s), p, RecordDict()) for p in range(3)]
        for name, s in (("plain", plain), ("canaries", with_canaries))
    }

    for p in (1, 2):  # the other clients: bit for bit
        for before, after in zip(
            envs["plain"][p].train_data, envs["canaries"][p].train_data, strict=True
        ):
            assert torch.equal(before, after)
        assert envs["canaries"][p].canaries is None
    own_images, own_labels = envs["plain"][0].train_data
    images, labels = envs["canaries"][0].train_data
    heads = int(canaries.coins.sum())
    assert 0 < heads < 60 and len(labels) == len(own_labels) + heads
    assert envs["canaries"][0].train_size == len(labels)
    assert torch.equal(images[: len(own_labels)], own_images)
    chosen = torch.from_numpy(canaries.indices)[canaries.coins]
    assert torch.equal(images[len(own_labels) :], bundle.test_images[chosen])
    # Mislabelled, every one; one pure function of the bundle and the plan.
    assert (canaries.labels != bundle.test_labels[torch.from_numpy(canaries.indices)]).all()
    again = design_canaries(bundle, plan)
    assert np.array_equal(again.indices, canaries.indices)
    assert torch.equal(again.coins, canaries.coins) and torch.equal(again.labels, canaries.labels)
    assert not design_canaries(bundle, dataclasses.replace(plan, seed=1)).coins.equal(
        canaries.coins
    )
    # Neither the server's public half nor the non-members hold a canary; without
    # canaries the pool is cut as before.
    pool = AuditPool.split(bundle.test_images, bundle.test_labels, 0, canaries.indices)
    kept = len(bundle.test_labels) - 60
    assert len(pool.public.labels) + len(pool.non_members.labels) == kept
    canary_images = bundle.test_images[torch.from_numpy(canaries.indices)].flatten(1)
    for half in (pool.public, pool.non_members):
        assert not (torch.cdist(canary_images, half.images.flatten(1)) == 0).any()
    old = AuditPool.split(bundle.test_images, bundle.test_labels, 0)
    order = stream_rng(SeedStream.AUDIT_POOL, 0).permutation(len(bundle.test_labels))
    public = torch.from_numpy(np.sort(order[: len(order) // 2]))
    assert torch.equal(old.public.images, bundle.test_images[public])


def test_the_analysis_gets_every_canary_and_no_coin() -> None:
    scenario = scenario_from_dict(canary_table(canaries=40))
    components = check_components(scenario)
    bundle = load_dataset(scenario.data)

    audit = CanaryAudit.design(
        bundle, components.client.canaries, components.audit.leaks, components.client.defences
    )

    assert audit is not None and audit.client == 0
    inputs, truth = audit.inputs(None, None, None)  # type: ignore[arg-type]
    assert isinstance(inputs, LeakInput)
    assert {f.name for f in dataclasses.fields(LeakInput)} == {
        "observation",
        "public",
        "candidates",
    }
    assert inputs.candidates is not None and len(inputs.candidates) == 40  # heads and tails
    canaries = design_canaries(bundle, components.client.canaries)
    assert torch.equal(inputs.candidates.labels, canaries.labels.long())
    assert truth.members is not None and torch.equal(truth.members, canaries.coins)
    assert truth.claim is not None
    assert (truth.claim.confidence, truth.claim.delta) == (0.95, 0.0)  # one analysis, no dp
    none = dataclasses.replace(components.client.canaries, count=0)
    assert CanaryAudit.design(bundle, none, components.audit.leaks, ()) is None


@pytest.mark.parametrize("seed", SEEDS)
def test_an_overfitting_client_without_defence_gives_an_epsilon_above_zero(
    seed: int, tmp_path: Path
) -> None:
    """100 canaries, 60 epochs on 20 digits and the canaries it drew: measured epsilon
    1.68 / 2.34 / 1.94 on seeds 0 / 1 / 2 (loss-drop AUC on the canaries 0.963 / 0.967 /
    0.961; at 30 epochs 0.77 / 0.00 / 0.37, so 60); the f-DP bound 2.99 / 4.31 / 3.50 at
    delta 1e-5 (mu 0.717 / 0.986 / 0.823; 4.31 is 100 canaries' most: every guess right)."""
    metrics, leaks, summary = audited_run(canary_table(seed), tmp_path)

    epsilon = float(metrics[protocol.AUDIT_EPSILON_EMPIRICAL].iloc[0])
    fdp = float(metrics[protocol.AUDIT_EPSILON_EMPIRICAL_FDP].iloc[0])
    assert epsilon > 1.0 and fdp > 1.0
    canary_row = leaks[leaks["client"] == 0].iloc[0]
    assert canary_row["epsilon-empirical"] == epsilon and canary_row["candidates"] == 100
    assert canary_row["epsilon-empirical-fdp"] == fdp and canary_row["mu-empirical-fdp"] > 0
    assert canary_row["membership-auc"] > 0.9
    assert leaks[leaks["client"] == 1]["epsilon-empirical"].isna().all()
    assert leaks[leaks["client"] == 1]["epsilon-empirical-fdp"].isna().all()
    assert (
        f"empirical epsilon (canaries, one-run audit, 95 % per round): highest {epsilon:.3g}"
        in (summary)
    )
    assert f"f-DP (mu-GDP) on the same scores: highest {fdp:.3g}" in summary


@pytest.mark.parametrize("seed", SEEDS)
def test_dp_sgd_at_large_noise_keeps_the_empirical_epsilon_under_the_accountants(
    seed: int, tmp_path: Path
) -> None:
    """dp-sgd, noise multiplier 2, clip 1, delta 1e-5, else as above: measured empirical
    epsilon 0.0 on seeds 0 / 1 / 2 (AUC 0.62 / 0.60 / 0.59) against the accountant's
    14.4 / 16.0 / 14.4 (metrics.csv's dp-epsilon, the round's clients' weighted mean;
    at noise 0.5 the empirical is still 0.0 against 149-164); the f-DP bound 0.0 on every
    seed too (mu 0)."""
    defence = [{"name": "dp-sgd", "noise-multiplier": 2.0, "max-grad-norm": 1.0}]
    metrics, _, summary = audited_run(canary_table(seed, defences=defence), tmp_path)  # type: ignore[arg-type]

    empirical = float(metrics[protocol.AUDIT_EPSILON_EMPIRICAL].iloc[0])
    fdp = float(metrics[protocol.AUDIT_EPSILON_EMPIRICAL_FDP].iloc[0])
    accountant = float(metrics[protocol.DP_EPSILON].iloc[0])
    assert 0.0 <= empirical <= accountant
    assert 0.0 <= fdp <= accountant  # the f-DP bound at the same delta
    assert f"the accountant's dp-epsilon then {accountant:.3g}" in summary


def test_canary_settings_are_refused_in_one_line() -> None:
    cases = [
        ({"canaries": -1}, r"audit\.canaries = -1"),
        ({"canary-client": 2}, r"audit\.canary-client = 2: partition ids are 0 to 1"),
        ({"leaks": [{"name": "llg"}]}, r"audit\.canaries = 100: are scored by a membership"),
    ]
    for audit, message in cases:
        with pytest.raises(ScenarioError, match=message):
            check_components(scenario_from_dict(canary_table(audit=audit)))
    with pytest.raises(ScenarioError, match=r"audit\.canaries = 600: at most 500"):
        check_machine(scenario_from_dict(canary_table(canaries=600)))
    check_machine(scenario_from_dict(canary_table(canaries=500)))
