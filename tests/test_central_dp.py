"""Flower's central DP wrappers from a scenario's ``[central-dp]``: the release Flower's own
wrapper computes, its accountant's epsilon every round, the clients' clipping mod, the audit
beside it, and one-line refusals where its noise calibration does not hold."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import GaussianPrivacyEvent, PrivacyConfig, RdpAccountant
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg
from flwr.supercore.privacy_accounting import NeighboringRelation, SamplingMethod
from inprocess import serve_inprocess
from rich.console import Console

from fedsim.attacks.base import AGGREGATE_CLIENT
from fedsim.core import protocol
from fedsim.core.config import CentralDPConfig, ModelConfig, ScenarioError
from fedsim.core.models import InputSpec, build_model
from fedsim.core.scenario_file import scenario_from_dict
from fedsim.outputs.results import write_summary
from fedsim.outputs.run_folder import (
    AUDIT_FILE,
    METRICS_FILE,
    REPORT_FILE,
    SUMMARY_FILE,
)
from fedsim.scenario.validate import check_components, validate
from fedsim.simulation.flower import message_context
from fedsim.simulation.runner import run_scenario
from fedsim.strategies.central_dp import ServerSideClipping
from fedsim.strategies.fedavg import FedAvg
from fedsim.strategies.sampling import TAKE_EVERY_NODE

CLIENTS, POPULATION, CLIP, NOISE = 3, 5, 0.05, 1.0


class _Nodes:
    """The least of a grid Flower's FedAvg samples from."""

    def get_node_ids(self) -> list[int]:
        return list(range(CLIENTS))


def _model() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    model = build_model(ModelConfig("mlp-2nn"), InputSpec(1, 28, 10), seed=0)
    return model, {k: v.detach().clone() for k, v in model.state_dict().items()}


def _replies(sent: dict[str, torch.Tensor]) -> list[Message]:
    """Three equally weighted replies whose updates are far longer than the clipping norm."""
    gen = torch.Generator().manual_seed(1)
    replies = []
    for node in range(CLIENTS):
        arrays = {k: v + 0.01 * torch.randn(v.shape, generator=gen) for k, v in sent.items()}
        metrics = {protocol.NUM_EXAMPLES: 8, protocol.PARTITION_ID: node}
        content = RecordDict(
            {protocol.ARRAYS: ArrayRecord(arrays), protocol.METRICS: MetricRecord(metrics)}
        )
        replies.append(Message(content, dst_node_id=node, message_type="train"))
    return replies


def _privacy() -> PrivacyConfig:
    return PrivacyConfig(
        1e-5, POPULATION, NeighboringRelation.ADD_OR_REMOVE_ONE, SamplingMethod.NO_AMPLIFICATION
    )


def _round(strategy: Any, server_round: int, sent: dict[str, torch.Tensor]) -> Any:
    config = ConfigRecord({protocol.SERVER_ROUND: server_round})
    with message_context():
        list(strategy.configure_train(server_round, ArrayRecord(sent), config, _Nodes()))
        return strategy.aggregate_train(server_round, _replies(sent))


def test_the_release_is_flowers_clipped_mean_plus_seeded_noise_and_the_epsilon_flowers() -> None:
    model, sent = _model()
    config = CentralDPConfig("server", NOISE, CLIP)
    ours = ServerSideClipping(
        FedAvg(network=lambda: model, **TAKE_EVERY_NODE), config, CLIENTS, POPULATION, seed=0
    )
    clean = DifferentialPrivacyServerSideFixedClipping(
        FlowerFedAvg(weighted_by_key=protocol.NUM_EXAMPLES, **TAKE_EVERY_NODE), 0.0, CLIP, CLIENTS
    )
    accounted = DifferentialPrivacyServerSideFixedClipping(
        FlowerFedAvg(weighted_by_key=protocol.NUM_EXAMPLES, **TAKE_EVERY_NODE),
        NOISE,
        CLIP,
        CLIENTS,
        accountant=RdpAccountant(_privacy()),
    )

    for server_round in (1, 2):
        released, metrics = _round(ours, server_round, sent)
        mean, _ = _round(clean, server_round, sent)  # Flower's wrapper without noise
        _round(accounted, server_round, sent)
        spent = accounted.privacy_spent()
        assert spent is not None
        assert metrics[protocol.CENTRAL_DP_EPSILON] == pytest.approx(spent.epsilon, rel=1e-12)

        noise = np.concatenate(
            [(released[k].numpy() - mean[k].numpy()).ravel().astype(np.float64) for k in mean]
        )
        stdv = NOISE * CLIP / CLIENTS
        assert noise.size > 100_000
        assert abs(noise.std() / stdv - 1) < 0.01, noise.std()  # Flower's stdv, z * C / n
        assert abs(noise.mean()) < 5 * stdv / math.sqrt(noise.size)

    again = ServerSideClipping(
        FedAvg(network=lambda: model, **TAKE_EVERY_NODE), config, CLIENTS, POPULATION, seed=0
    )
    again.restore_checkpoint_state(ours.state_for_checkpoint())  # a resumed run's accountant
    assert again.epsilon() == pytest.approx(ours.epsilon(), rel=1e-12)
    first_again, _ = _round(again, 1, sent)
    first, _ = _round(
        ServerSideClipping(
            FedAvg(network=lambda: model, **TAKE_EVERY_NODE), config, CLIENTS, POPULATION, 0
        ),
        1,
        sent,
    )
    for name in first:  # the noise is the round's named stream: reproducible
        assert np.array_equal(first[name].numpy(), first_again[name].numpy()), name


def _federation(**changes: Any) -> dict[str, Any]:
    """FedSGD on mlp-2nn: 3 clients of 8 training digits each, 2 a round, client-side
    clipping under Flower's central DP, audited behind secure aggregation."""
    table: dict[str, Any] = {
        "name": "central-dp",
        "federation": {"num-clients": 3, "clients-per-round": 2, "rounds": 2, "seed": 0},
        "data": {"dataset": "mnist-embedded", "image-size": 28, "samples-per-client": 11},
        "model": {"name": "mlp-2nn"},
        "strategy": {"name": "fedavg"},
        "client": {"local-steps": 1, "batch-size": 8, "optimizer": "sgd", "lr": 0.05},
        "central-dp": {"clipping": "client", "noise-multiplier": NOISE, "clipping-norm": CLIP},
        "audit": {
            "enabled": True,
            "threat-model": "aggregate",
            "max-images": 16,
            "attacks": [{"name": "box-vertices"}],
        },
    }
    for section, values in changes.items():
        table[section] = {**table.get(section, {}), **values}
    return table


def test_client_side_clipping_runs_with_the_aggregate_audit_and_records_epsilon(
    tmp_path: Path,
) -> None:
    """The clients' Flower mod clips every reply; the server's view (their sum) is
    audited; every round records the accountant's epsilon and the summary says it."""
    scenario = scenario_from_dict(_federation())
    grid, recorder = serve_inprocess(scenario, tmp_path / "run", validate(scenario))
    run_dir = recorder.run_dir

    for sent, reply in zip(grid.sent, grid.received, strict=True):
        if sent.metadata.message_type != "train":
            continue
        before = sent.content[protocol.ARRAYS].to_torch_state_dict()  # type: ignore[union-attr]
        after = reply.content[protocol.ARRAYS].to_torch_state_dict()  # type: ignore[union-attr]
        norm = math.sqrt(sum(float(((after[k] - before[k]) ** 2).sum()) for k in before))
        assert 0 < norm <= CLIP * (1 + 1e-5), norm

    rounds = pd.read_csv(run_dir / METRICS_FILE)
    accountant = RdpAccountant(_privacy_of(3))
    for epsilon in rounds[protocol.CENTRAL_DP_EPSILON]:
        accountant.compose(GaussianPrivacyEvent(NOISE, 2, 3))
        assert epsilon == pytest.approx(accountant.get_privacy_spent().epsilon, rel=1e-9)
    assert rounds[protocol.CENTRAL_DP_EPSILON].is_monotonic_increasing

    audit = pd.read_csv(run_dir / AUDIT_FILE)
    assert set(audit["client"]) == {AGGREGATE_CLIENT}
    # The noise comes after the sum the server reads; clipping scales each client's update
    # as a whole, which a first layer's closed-form attack does not notice. Seen: 15 and 15
    # of 16; seeds 1-3 gave 16/16, 15/16, 16/15.
    assert (audit["images-recovered"] >= 9).all(), list(audit["images-recovered"])

    summary = write_summary(scenario, recorder.rows, run_dir, 1.0)
    line = next(line for line in summary.splitlines() if "central DP" in line)
    assert f"epsilon {rounds[protocol.CENTRAL_DP_EPSILON].iloc[-1]:.3g} after 2" in line


def _privacy_of(population: int) -> PrivacyConfig:
    return PrivacyConfig(
        1e-5, population, NeighboringRelation.ADD_OR_REMOVE_ONE, SamplingMethod.NO_AMPLIFICATION
    )


@pytest.mark.parametrize(
    ("changes", "refusal"),
    [
        ({"strategy": {"name": "fedadam"}}, "plain mean of the uploads"),
        ({"strategy": {"name": "krum"}, "audit": {"enabled": False}}, "do: fedavg, fedprox"),
        ({"federation": {"stragglers": 0.5}}, "federation.stragglers = 0"),
        ({"failures": {"fraction": 0.5}}, "failures.fraction = 0"),
        ({"central-dp": {"clipping": "server"}}, "secure aggregation"),
        ({"model": {"name": "resnet18"}, "data": {"image-size": 32}}, "BatchNorm"),
        ({"central-dp": {"noise-multiplier": 0.0}}, "must be > 0"),
        ({"central-dp": {"clipping": "both"}}, "clipping"),
    ],
)
def test_central_dp_where_its_calibration_fails_is_refused_in_one_line(
    changes: dict[str, Any], refusal: str
) -> None:
    table = _federation(**changes)
    if "stragglers" in changes.get("federation", {}):
        table["client"] = {**table["client"], "local-steps": 0, "local-epochs": 2}
    with pytest.raises(ScenarioError, match=refusal) as refused:
        check_components(scenario_from_dict(table))
    assert "\n" not in str(refused.value)


def test_unequal_clients_are_refused_before_the_run() -> None:
    """Flower's noise is calibrated to n equally weighted clients; fedsim weighs by examples."""
    table = _federation(data={"samples-per-client": 0}, federation={"num-clients": 7})
    with pytest.raises(ScenarioError, match=r"to .* training examples") as refused:
        validate(scenario_from_dict(table))
    assert "\n" not in str(refused.value)


@pytest.mark.slow
def test_a_ray_simulation_runs_flowers_wrapper_with_the_audit(tmp_path: Path) -> None:
    """The same federation as a real Flower simulation on Ray (the clipping mod inside the
    actors' ClientApp), with 20 canary clients: the run's files carry the accountant's
    epsilon, the canaries' estimate and the audit."""
    scenario = scenario_from_dict(_federation(audit={"canary-clients": 20}))

    run_scenario(scenario, tmp_path / "run", console=Console(quiet=True))

    run = tmp_path / "run"
    rounds = pd.read_csv(run / METRICS_FILE)
    assert list(rounds[protocol.CENTRAL_DP_EPSILON].round(3)) == [4.729, 7.077]
    audit = pd.read_csv(run / AUDIT_FILE)
    assert set(audit["client"]) == {AGGREGATE_CLIENT} and len(audit) == 2
    estimates = rounds[protocol.CENTRAL_DP_EPSILON_EMPIRICAL]
    assert (rounds[protocol.CENTRAL_DP_EPSILON_EMPIRICAL_LOW] <= estimates).all()
    assert (estimates <= rounds[protocol.CENTRAL_DP_EPSILON_EMPIRICAL_HIGH]).all()
    summary = (run / SUMMARY_FILE).read_text()
    assert "user-level epsilon 7.08 after 2 noised rounds" in summary
    assert f"canary clients, 20 in every round): {estimates.iloc[-1]:.3g} [" in summary
    report = (run / REPORT_FILE).read_text()
    assert "central-dp-epsilon after the last round: 7.08" in report
    assert f"central-dp-epsilon-empirical after the last round: {estimates.iloc[-1]:.3g}" in report
