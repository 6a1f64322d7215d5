"""The audit inside real Flower simulations, and its isolation from ground truth."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from fedsim.attacks.base import Observation
from fedsim.core.config import Scenario
from fedsim.core.scenario_file import load_scenario
from fedsim.outputs.run_folder import AUDIT_FILE, MODEL_FILE
from fedsim.scenario.components import client_spec
from fedsim.simulation.runner import run_scenario

REPO = Path(__file__).resolve().parents[1]
# Small DLG budget for the suite: 2 rounds, 2 sampled clients, 1 victim a round. No leak
# analyses: the reconstruction audit is under test (they cost 4-5 s a client and round).
OVERRIDES = [
    "federation.rounds=2",
    "audit.attacks=[{name='dlg', steps=60, restarts=4}]",
    "audit.leaks=[]",
]


def _run(tmp_path: Path, name: str, *extra: str) -> Path:
    scenario = load_scenario(REPO / "scenarios" / "audit-fedavg.toml", [*OVERRIDES, *extra])
    run_scenario(scenario, tmp_path / name)
    return tmp_path / name


@pytest.fixture(scope="module")
def audited_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("audit")
    return {
        "fedavg": _run(tmp, "fedavg"),
        "plain": _run(tmp, "plain", "audit.enabled=false"),
        "fedsplit": _run(tmp, "fedsplit", "strategy.name=fedsplit"),
    }


@pytest.mark.slow
def test_dlg_recovers_the_victims_image_under_fedavg(audited_runs: dict[str, Path]) -> None:
    audit = pd.read_csv(audited_runs["fedavg"] / AUDIT_FILE)

    assert list(audit["round"]) == [1, 2]
    assert set(audit["threat-model"]) == {"update"}
    assert (audit["batch-size"] == 1).all()
    assert audit["psnr"].min() >= 25.0
    assert (audit["label-acc"] == 1.0).all()
    assert (
        audited_runs["fedavg"] / "audit" / "round-001-client-{}-dlg.png".format(audit["client"][0])
    ).is_file()
    metrics = pd.read_csv(audited_runs["fedavg"] / "metrics.csv")
    assert np.allclose(metrics["audit-psnr"], audit.groupby("round")["psnr"].mean())


@pytest.mark.slow
def test_aggregate_is_bit_identical_with_and_without_audit(audited_runs: dict[str, Path]) -> None:
    audited = torch.load(audited_runs["fedavg"] / MODEL_FILE, weights_only=True)
    plain = torch.load(audited_runs["plain"] / MODEL_FILE, weights_only=True)

    assert audited.keys() == plain.keys()
    assert all(torch.equal(audited[k], plain[k]) for k in audited)
    assert not (audited_runs["plain"] / AUDIT_FILE).exists()


@pytest.mark.slow
def test_fedsplit_leaks_at_least_10_db_less(audited_runs: dict[str, Path]) -> None:
    fedavg = pd.read_csv(audited_runs["fedavg"] / AUDIT_FILE)
    fedsplit = pd.read_csv(audited_runs["fedsplit"] / AUDIT_FILE)

    assert set(fedsplit["strategy"]) == {"fedsplit"}
    # The server sees only the classifier: far fewer parameters observed.
    assert fedsplit["parameters-observed"].max() < fedavg["parameters-observed"].min()
    assert fedsplit["psnr"].mean() <= fedavg["psnr"].mean() - 10.0


def test_observation_carries_no_ground_truth() -> None:
    fields = {f.name for f in dataclasses.fields(Observation)}

    assert not fields & {"images", "labels", "data", "truth", "ground_truth", "targets"}


def test_attack_payload_holds_no_tensor_equal_to_the_truth(tmp_path: Path) -> None:
    """What is shipped to the attack task (pickled Observation) never contains the batch."""
    from fedsim.clients.replay import ClientReplay
    from fedsim.core.training import client_config_from_record, client_config_record

    scenario = load_scenario(REPO / "scenarios" / "audit-fedavg.toml")
    cfg = client_config_from_record(client_config_record(scenario.client))
    truth = ClientReplay(client_spec(scenario), "fedavg", None).update_batch(0, 1, cfg)

    payload = pickle.dumps(_observation_for(scenario))
    tensors = pickle.loads(payload)
    flat = [t for t in _walk(tensors) if isinstance(t, torch.Tensor)]

    assert flat, "the observation carries the update tensors"
    for t in flat:
        assert t.numel() != truth.images.numel() or not torch.allclose(
            t.flatten().float(), truth.images.flatten()
        )


def _walk(obj: object) -> list[object]:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [x for f in dataclasses.fields(obj) for x in _walk(getattr(obj, f.name))]
    if isinstance(obj, dict):
        return [x for v in obj.values() for x in _walk(v)]
    if isinstance(obj, list | tuple):
        return [x for v in obj for x in _walk(v)]
    return [obj]


def _observation_for(scenario: object) -> Observation:
    """An update observation built exactly as the auditor does, from a real client step."""
    return _intercepted_observation(scenario)[0]


def _intercepted_observation(scenario: Scenario) -> tuple[Observation, object]:
    """A real client's update, intercepted and observed as the auditor does; and the round."""
    from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

    from fedsim.audit.observe import ServerView, intercept
    from fedsim.clients.base import ClientEnv
    from fedsim.clients.fedavg import FedAvgClient
    from fedsim.core.training import client_config_record
    from fedsim.simulation.flower import message_context

    env = ClientEnv.create(client_spec(scenario), 0, RecordDict())
    sent = ArrayRecord(env.model().state_dict())
    config = ConfigRecord({**client_config_record(scenario.client), "server-round": 1})
    arrays, metrics = FedAvgClient().train(env, sent, config)
    with message_context():
        reply = Message(
            RecordDict({"arrays": arrays, "metrics": MetricRecord({**metrics, "partition-id": 0})}),
            dst_node_id=0,
            message_type="train",
        )
    view = ServerView(
        scenario.model, env.input_spec, env.bundle.normalization, scenario.strategy.name
    )
    intercepted = intercept(1, sent, config, [reply])
    return view.observe(intercepted, intercepted.replies[0], "update"), intercepted
