"""A thousand clients: what a client costs is an index array, what a round costs is its sample.

``bench/scale.py`` measures time per round and peak memory at 10, 100 and
1,000 clients; these tests check the properties those numbers rest on.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from flwr.app import RecordDict
from rich.console import Console

from fedsim.clients.base import ClientEnv
from fedsim.core.partition import partition_dataset
from fedsim.core.scenario_file import load_scenario
from fedsim.outputs.run_folder import CLIENTS_FILE, METRICS_FILE
from fedsim.scenario.components import client_spec
from fedsim.simulation.runner import run_scenario

SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "scale-1000.toml"


def test_a_thousand_clients_share_one_copy_of_the_data() -> None:
    scenario = load_scenario(SCENARIO)
    splits = partition_dataset(scenario.data, 1000, scenario.federation.seed)

    first = ClientEnv.create(client_spec(scenario), 0, RecordDict())
    last = ClientEnv.create(client_spec(scenario), 999, RecordDict())

    assert first.bundle is last.bundle  # loaded once per process (Ray actor)
    indices = sum(len(s.train) + len(s.test) for s in splits)
    assert indices == len(first.bundle.train_labels)  # a partition, no copies
    assert sum(s.train.nbytes + s.test.nbytes for s in splits) < 100_000  # bytes for 1,000


@pytest.mark.slow
def test_a_thousand_clients_ten_per_round(tmp_path: Path) -> None:
    scenario = load_scenario(SCENARIO, ["federation.rounds=2"])

    run_scenario(scenario, tmp_path / "run", console=Console(quiet=True))

    metrics = pd.read_csv(tmp_path / "run" / METRICS_FILE)
    clients = pd.read_csv(tmp_path / "run" / CLIENTS_FILE)
    assert list(metrics["clients-trained"]) == [10, 10]
    # Only the sampled clients ever did anything: 10 trained, 10 evaluated per round.
    assert clients.groupby(["round", "phase"]).size().tolist() == [10, 10, 10, 10]
    assert clients["partition-id"].between(0, 999).all()
    # A round's time depends on its 10 clients; ~1 s on 2 idle cores.
    assert metrics["seconds"].iloc[-1] < 20
