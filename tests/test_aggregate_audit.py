"""The ``aggregate`` threat model (secure aggregation's view): the server's one observation a
round is the strategy's own aggregate; attacks and leak analyses read it, scored against every
summed client's examples."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from inprocess import serve_inprocess

from fedsim.attacks.base import AGGREGATE_CLIENT
from fedsim.audit.observe import ServerView, intercept
from fedsim.core import protocol
from fedsim.core.config import ClientConfig, ModelConfig, ScenarioError
from fedsim.core.data import Normalization
from fedsim.core.models import InputSpec, build_model
from fedsim.core.scenario_file import scenario_from_dict
from fedsim.core.training import client_config_record
from fedsim.outputs.run_folder import AUDIT_FILE, LEAKS_FILE
from fedsim.scenario.validate import check_components
from fedsim.simulation.flower import message_context
from fedsim.strategies.fedavg import FedAvg

SIZES = {0: 3, 1: 7, 2: 12}  # reported examples per partition: unequal weights


def _replies(sent: dict[str, torch.Tensor]) -> list[Message]:
    """Three clients' replies: the sent model moved by seeded noise, their sizes reported."""
    gen = torch.Generator().manual_seed(0)
    replies = []
    for partition, examples in SIZES.items():
        arrays = {k: v + 0.01 * torch.randn(v.shape, generator=gen) for k, v in sent.items()}
        metrics = {protocol.NUM_EXAMPLES: examples, protocol.PARTITION_ID: partition}
        content = RecordDict(
            {protocol.ARRAYS: ArrayRecord(arrays), protocol.METRICS: MetricRecord(metrics)}
        )
        replies.append(Message(content, dst_node_id=partition, message_type="train"))
    return replies


def test_the_aggregate_observation_is_the_strategys_own_aggregate() -> None:
    spec, model_cfg = InputSpec(1, 28, 10), ModelConfig("mlp-2nn")
    model = build_model(model_cfg, spec, seed=0)
    sent = {k: v.detach().clone() for k, v in model.state_dict().items()}
    client = ClientConfig(local_epochs=1, batch_size=4, optimizer="sgd", lr=0.05)
    config = ConfigRecord({**client_config_record(client), protocol.SERVER_ROUND: 1})
    with message_context():
        replies = _replies(sent)
        aggregated, _ = FedAvg(network=lambda: model).aggregate_train(1, replies)
    assert aggregated is not None
    view = ServerView(model_cfg, spec, Normalization.identity(1), "fedavg")

    observation = view.observe_aggregate(intercept(1, ArrayRecord(sent), config, replies))

    expected = aggregated.to_torch_state_dict()
    assert set(observation.shared) == set(expected)  # every mlp-2nn tensor is a parameter
    for name, value in observation.shared.items():
        assert torch.allclose(value, expected[name], rtol=0, atol=1e-6), name
    first = replies[0].content[protocol.ARRAYS].to_torch_state_dict()  # type: ignore[union-attr]
    assert not any(torch.allclose(observation.shared[k], first[k]) for k in first)
    assert observation.client_id == AGGREGATE_CLIENT
    assert observation.threat_model == "aggregate"
    assert observation.summed_examples == (3, 7, 12)
    assert observation.num_examples == 22
    assert observation.source == "aggregate of 3 clients"


def _federation(**audit: Any) -> dict[str, Any]:
    """FedSGD on mlp-2nn: 3 clients, 2 a round, each one SGD step on its 8 training digits
    (11 less data.test-fraction's 3)."""
    return {
        "name": "aggregate",
        "federation": {"num-clients": 3, "clients-per-round": 2, "rounds": 2, "seed": 0},
        "data": {"dataset": "mnist-embedded", "image-size": 28, "samples-per-client": 11},
        "model": {"name": "mlp-2nn"},
        "strategy": {"name": "fedavg"},
        "client": {"local-steps": 1, "batch-size": 8, "optimizer": "sgd", "lr": 0.05},
        "audit": {"enabled": True, "threat-model": "aggregate", "max-images": 16, **audit},
    }


def test_box_vertices_reads_most_of_a_two_client_aggregate_and_the_leaks_read_it_too(
    tmp_path: Path,
) -> None:
    """Secure aggregation of two FedSGD clients of 8 digits each is one 16-image gradient to
    box-vertices; the leak analyses run on the same one observation a round."""
    scenario = scenario_from_dict(_federation(attacks=[{"name": "box-vertices"}]))
    _, recorder = serve_inprocess(scenario, tmp_path / "run", check_components(scenario))
    run_dir = recorder.run_dir

    audit = pd.read_csv(run_dir / AUDIT_FILE)
    assert list(audit["round"]) == [1, 2]
    assert set(audit["client"]) == {AGGREGATE_CLIENT}
    assert set(audit["threat-model"]) == {"aggregate"}
    assert (audit["batch-size"] == 16).all()
    # Seen: 15 and 13 of 16 at >= 20 dB and SSIM >= 0.8 (mean 108 and 87 dB); most, each round.
    assert (audit["images-recovered"] >= 9).all(), list(audit["images-recovered"])
    leaks = pd.read_csv(run_dir / LEAKS_FILE)
    assert set(leaks["client"]) == {AGGREGATE_CLIENT}
    assert {"labels", "membership"} <= set(leaks["kind"])
    assert leaks.groupby("round").size().min() >= 2


@pytest.mark.parametrize(
    ("changes", "refusal"),
    [
        ({"strategy": {"name": "fedmedian"}}, "reads replies one by one"),
        ({"strategy": {"name": "fedcg"}, "model": {"name": "lenet5-split"}}, "one by one"),
        ({"federation": {"stragglers": 0.5}, "client": {"local-epochs": 2}}, "stragglers"),
        ({"audit": {"canaries": 10}}, "no client's own update"),
        (
            {"audit": {"attacks": [{"name": "fedavg-leakage"}]}},
            "'aggregate' gives the example-weighted mean",
        ),
    ],
)
def test_an_aggregate_audit_the_strategy_cannot_give_is_refused_in_one_line(
    changes: dict[str, Any], refusal: str
) -> None:
    table = _federation(attacks=[{"name": "box-vertices"}])
    for section, values in changes.items():
        table[section] = {**table[section], **values}
    if "local-epochs" in changes.get("client", {}):
        table["client"] = {**table["client"], "local-steps": 0}
    with pytest.raises(ScenarioError, match=refusal) as refused:
        check_components(scenario_from_dict(table))
    assert "\n" not in str(refused.value)
