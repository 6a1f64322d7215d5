"""FedSplit: only classifiers travel; extractors stay private, persist and differ."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
from flwr.app import ArrayRecord, RecordDict
from inprocess import InProcessRun, run_inprocess, tiny_table

from fedsim.clients.fedsplit import FedSplitClient
from fedsim.clients.private_state import STATE_KEY, load_private, state_file
from fedsim.core.scenario_file import scenario_from_dict
from fedsim.core.training import evaluate
from fedsim.outputs.run_folder import CLIENT_STATE_DIR, CLIENTS_FILE, METRICS_FILE
from fedsim.simulation.runner import run_scenario

CLASSIFIER_KEYS = {
    f"classifier.{layer}.{kind}" for layer in (1, 3, 5) for kind in ("weight", "bias")
}


@pytest.fixture(scope="module")
def fedsplit_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[InProcessRun, Path]:
    """Three clients, two rounds, in process; private files in a run's client_state/."""
    state_dir = tmp_path_factory.mktemp("fedsplit") / CLIENT_STATE_DIR
    scenario = scenario_from_dict(tiny_table({"name": "fedsplit"}))
    return run_inprocess(scenario, state_dir), state_dir


def _extractor(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in tensors.items() if k.startswith("extractor.")}


def _same(a: ArrayRecord, b: ArrayRecord) -> bool:
    x, y = a.to_torch_state_dict(), b.to_torch_state_dict()
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def test_replies_carry_only_classifier_parameters(fedsplit_run: tuple[InProcessRun, Path]) -> None:
    run, _ = fedsplit_run

    train_replies = run.grid.replies("train")

    assert len(train_replies) == 3 * 2
    assert all(set(reply.content["arrays"].keys()) == CLASSIFIER_KEYS for reply in train_replies)
    assert run.grid.array_names() == CLASSIFIER_KEYS  # no extractor.* either way
    assert set(run.final_arrays.keys()) == CLASSIFIER_KEYS


def test_extractors_persist_across_rounds_and_differ_between_clients(
    fedsplit_run: tuple[InProcessRun, Path],
) -> None:
    run, state_dir = fedsplit_run
    after = [
        {
            p: _extractor(dict(record.to_torch_state_dict()))
            for p, record in states.items()
            if record
        }
        for states in run.private_per_round
    ]
    fresh = {p: _extractor(FedSplitClient().network(run.env(p)).state_dict()) for p in range(3)}

    for p in range(3):
        # Training moves the extractor on from its own initialisation ...
        for key in fresh[p]:
            assert not torch.equal(after[0][p][key], fresh[p][key])
            assert not torch.equal(after[1][p][key], after[0][p][key])
        # ... and round 2 started from round 1's: replaying p's round-2 message on
        # its round-1 state gives the same extractor and reply, a fresh state does not.
        message, round_two = run.grid.exchange(p, "train", server_round=2)
        content = message.content
        replayed = RecordDict({STATE_KEY: run.private_per_round[0][p]})
        reply, _ = FedSplitClient().train(
            run.env(p, state=replayed), content["arrays"], content["config"]
        )
        kept = load_private(run.env(p, state=replayed))
        assert kept is not None
        for key, value in after[1][p].items():
            assert torch.equal(kept[key], value)
        assert _same(reply, round_two.content["arrays"])
        restarted, _ = FedSplitClient().train(
            run.env(p, state=RecordDict()), content["arrays"], content["config"]
        )
        assert not _same(restarted, reply)
        # The run directory holds the same tensors, for a resumed run (empty node state).
        saved = torch.load(state_file(state_dir, p), weights_only=True)
        resumed = load_private(run.env(p, state=RecordDict(), state_dir=state_dir))
        assert saved["round"] == 2 and resumed is not None
        for key, value in after[1][p].items():
            assert torch.equal(saved["arrays"][key], value)
            assert torch.equal(resumed[key], value)
    for a, b in ((0, 1), (0, 2), (1, 2)):
        assert not torch.equal(fresh[a]["extractor.0.weight"], fresh[b]["extractor.0.weight"])
        assert not torch.equal(after[1][a]["extractor.0.weight"], after[1][b]["extractor.0.weight"])


def test_personalised_evaluation_uses_each_clients_own_extractor(
    fedsplit_run: tuple[InProcessRun, Path],
) -> None:
    run, _ = fedsplit_run
    final = run.records[-1]
    reported = {int(r["partition-id"]): r for r in final.clients if r["phase"] == "evaluate"}
    classifier = run.final_arrays.to_torch_state_dict()

    def accuracy_with(extractor_of: int, tested_on: int) -> tuple[float, float]:
        net = FedSplitClient().network(run.env(extractor_of))
        net.load_state_dict(_extractor(load_private(run.env(extractor_of)) or {}), strict=False)
        net.load_state_dict(classifier, strict=False)
        return evaluate(net, *run.env(tested_on).test_data)

    for p in range(3):
        own = accuracy_with(p, p)
        other = accuracy_with((p + 1) % 3, p)
        assert own == (reported[p]["eval-loss"], reported[p]["eval-acc"])
        assert other[0] != own[0]
    mean = sum(r["eval-acc"] * r["num-examples"] for r in reported.values()) / sum(
        r["num-examples"] for r in reported.values()
    )
    assert final.evaluate["eval-acc"] == pytest.approx(mean)
    assert final.server == {}


@pytest.mark.slow
def test_fedsplit_simulation_keeps_extractors_on_clients(tmp_path: Path) -> None:
    # Three clients on two single-CPU actors: node state must outlive the ClientApps.
    table = tiny_table({"name": "fedsplit"}, backend={"ray-cpus": 2})
    scenario = scenario_from_dict(table)

    result = run_scenario(scenario, tmp_path / "run")

    assert set(result.final_arrays.keys()) == CLASSIFIER_KEYS
    metrics = pd.read_csv(tmp_path / "run" / METRICS_FILE)
    assert metrics["test-acc"].isna().all()
    assert metrics["client-eval-acc"].notna().all()
    clients = pd.read_csv(tmp_path / "run" / CLIENTS_FILE)
    assert sorted(clients.query("phase == 'evaluate' and round == 2")["partition-id"]) == [
        0,
        1,
        2,
    ]
    for p in range(3):
        saved = torch.load(state_file(tmp_path / "run" / CLIENT_STATE_DIR, p), weights_only=True)
        assert saved["round"] == 2
        assert set(saved["arrays"]) == {
            "extractor.0.weight",
            "extractor.0.bias",
            "extractor.3.weight",
            "extractor.3.bias",
        }
