"""Client-side defences: measured noise, the clipping bound, DP-SGD accounting, validation."""

from __future__ import annotations

import math
from typing import Any, cast

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, RecordDict
from inprocess import InProcessRun, run_inprocess, tiny_table

from fedsim.clients.base import ClientEnv
from fedsim.clients.defences import global_norm, protect_upload
from fedsim.clients.defences.dp_sgd import DPSGD, DPSGDParams
from fedsim.clients.defences.noise import ClipParams, GaussianNoise, GaussianParams, NormClip
from fedsim.clients.replay import ClientReplay
from fedsim.core import protocol
from fedsim.core.config import Scenario, ScenarioError
from fedsim.core.scenario_file import scenario_from_dict, scenario_to_dict
from fedsim.core.training import client_config_record
from fedsim.scenario.components import client_spec
from fedsim.scenario.validate import validate


def _scenario(defences: list[dict[str, Any]], strategy: str = "fedavg", **tables: Any) -> Scenario:
    small = {
        "federation": {"num-clients": 2, "rounds": 1},
        "data": {"samples-per-client": 80},
        "client": {"local-steps": 3},
    }
    for name, values in tables.items():
        small[name] = {**small.get(name, {}), **values}
    table = tiny_table({"name": strategy}, **small)
    return validate(scenario_from_dict({**table, "defences": defences})).scenario


Tensors = dict[str, torch.Tensor]


def _exchanges(run: InProcessRun) -> dict[tuple[int, int], tuple[Tensors, Tensors]]:
    """(round, partition) -> (arrays sent, arrays received) of each training exchange."""
    out = {}
    for sent, reply in run.grid.exchanges:
        if sent.metadata.message_type == "train":
            server_round = sent.content.config_records["config"]["server-round"]
            partition = reply.content.metric_records["metrics"]["partition-id"]
            out[(cast(int, server_round), cast(int, partition))] = (
                dict(sent.content.array_records["arrays"].to_torch_state_dict()),
                dict(reply.content.array_records["arrays"].to_torch_state_dict()),
            )
    return out


def _update(run: InProcessRun, key: tuple[int, int] = (1, 0)) -> Tensors:
    sent, received = _exchanges(run)[key]
    return {k: v - sent[k] for k, v in received.items()}


@pytest.fixture(scope="module")
def plain_run() -> InProcessRun:
    return run_inprocess(_scenario([]))


def _difference(run: InProcessRun, plain: InProcessRun) -> Tensors:
    defended, clean = _exchanges(run)[(1, 0)][1], _exchanges(plain)[(1, 0)][1]
    return {k: defended[k] - clean[k] for k in clean}


def test_gaussian_noise_on_the_upload_has_the_configured_sigma(plain_run: InProcessRun) -> None:
    run = run_inprocess(_scenario([{"name": "gaussian", "sigma": 0.05}]))

    noise = torch.cat([d.flatten() for d in _difference(run, plain_run).values()])

    # The same seeded training underneath: the difference is the noise alone.
    assert len(noise) > 50_000
    assert abs(float(noise.std()) - 0.05) < 0.05 * 0.02
    assert abs(float(noise.mean())) < 0.05 * 0.02


def test_laplace_noise_has_the_configured_scale(plain_run: InProcessRun) -> None:
    run = run_inprocess(_scenario([{"name": "laplace", "scale": 0.02}]))

    noise = torch.cat([d.flatten() for d in _difference(run, plain_run).values()]).double()

    # Laplace(0, b): mean |x| = b, std = b * sqrt(2).
    assert abs(float(noise.abs().mean()) - 0.02) < 0.02 * 0.02
    assert abs(float(noise.std()) - 0.02 * math.sqrt(2)) < 0.02 * math.sqrt(2) * 0.03


def test_clipping_bounds_every_uploaded_update(plain_run: InProcessRun) -> None:
    run = run_inprocess(_scenario([{"name": "clip", "max-norm": 0.05}]))

    clipped = [global_norm(_update(run, key)) for key in _exchanges(run)]

    assert global_norm(_update(plain_run)) > 0.2  # the bound binds
    assert len(clipped) == 2
    assert all(0.05 * (1 - 1e-5) <= norm <= 0.05 * (1 + 1e-5) for norm in clipped)


def test_defences_chain_in_the_listed_order() -> None:
    update = {"w": torch.ones(10_000)}
    clip, noise = NormClip(ClipParams(max_norm=1.0)), GaussianNoise(GaussianParams(sigma=0.1))
    names, sent = {"w"}, ArrayRecord({"w": torch.zeros(10_000)})

    def chained(chain: list[Any]) -> float:
        rng = np.random.default_rng(0)
        out = protect_upload(chain, sent, ArrayRecord(update), names, rng)
        return global_norm(dict(out.to_torch_state_dict()))

    # Noise then clip: bounded. Clip then noise: the noise (norm ~ 0.1 * 100) dominates.
    assert chained([noise, clip]) <= 1.0 + 1e-5
    assert chained([clip, noise]) == pytest.approx(math.sqrt(1 + 100), rel=0.05)


def test_buffers_keep_their_values() -> None:
    sent = ArrayRecord({"w": torch.zeros(4), "bn.running_var": torch.ones(4)})
    reply = ArrayRecord({"w": torch.ones(4), "bn.running_var": torch.full((4,), 2.0)})
    noise = GaussianNoise(GaussianParams(sigma=1.0))

    out = protect_upload([noise], sent, reply, {"w"}, np.random.default_rng(0))

    assert np.array_equal(out["bn.running_var"].numpy(), reply["bn.running_var"].numpy())
    assert not np.array_equal(out["w"].numpy(), reply["w"].numpy())


def test_noise_is_deterministic_from_the_seed() -> None:
    scenario = _scenario([{"name": "gaussian", "sigma": 0.01}])

    first, second = run_inprocess(scenario), run_inprocess(scenario)

    name = "classifier.1.weight"
    assert all(
        torch.equal(_update(first, key)[name], _update(second, key)[name])
        for key in _exchanges(first)
    )
    assert not torch.equal(_update(first, (1, 0))[name], _update(first, (1, 1))[name])


def test_dp_sgd_reports_an_epsilon_that_grows_with_rounds() -> None:
    from opacus.accountants import RDPAccountant

    params = DPSGDParams(noise_multiplier=1.1, max_grad_norm=1.0, delta=1e-5)
    scenario = _scenario(
        [{"name": "dp-sgd", "noise-multiplier": 1.1, "max-grad-norm": 1.0}],
        federation={"rounds": 3},
    )

    run = run_inprocess(scenario)

    replies = [r.content.metric_records["metrics"] for r in run.grid.replies("train")]
    eps = [cast(float, m[protocol.DP_EPSILON]) for m in replies if m["partition-id"] == 0]
    assert len(eps) == 3 and eps[0] > 0 and eps[0] < eps[1] < eps[2]
    # Opacus's own accountant after 3 rounds of 3 steps at q = batch / examples.
    reference = RDPAccountant()
    train_size = len(run.env(0).split.train)
    for _ in range(9):
        reference.step(noise_multiplier=1.1, sample_rate=16 / train_size)
    assert eps[2] == pytest.approx(reference.get_epsilon(params.delta), rel=1e-9)
    assert [r.train[protocol.DP_EPSILON] for r in run.records] == pytest.approx(eps)


def test_dp_sgd_clips_per_example_gradients() -> None:
    # Noise negligible, plain SGD: each step moves at most lr * max-grad-norm.
    run = run_inprocess(
        _scenario(
            [{"name": "dp-sgd", "noise-multiplier": 1e-6, "max-grad-norm": 1e-3}],
            client={"optimizer": "sgd", "lr": 0.1, "local-steps": 3},
        )
    )
    plain = run_inprocess(_scenario([], client={"optimizer": "sgd", "lr": 0.1, "local-steps": 3}))

    assert global_norm(_update(plain)) > 10 * 3 * 0.1 * 1e-3
    assert global_norm(_update(run)) <= 3 * 0.1 * 1e-3 * (1 + 1e-3)


FEDCG_DP = {"name": "dp-sgd", "noise-multiplier": 1.1, "max-grad-norm": 1.0}


@pytest.fixture(scope="module")
def fedcg_dp_run() -> InProcessRun:
    """FedCG under DP-SGD: 3 stage-1 steps and 4 GAN steps per client (a few seconds)."""
    strategy = {"name": "fedcg", "distill-iterations": 2, "gan-steps": 4}
    table = tiny_table(
        strategy,
        federation={"num-clients": 2, "rounds": 1},
        data={"samples-per-client": 80},
        client={"local-steps": 3},
    )
    return run_inprocess(validate(scenario_from_dict({**table, "defences": [FEDCG_DP]})).scenario)


def test_dp_sgd_accounts_fedcg_gan_steps(fedcg_dp_run: InProcessRun) -> None:
    from opacus.accountants import RDPAccountant

    reply = fedcg_dp_run.grid.replies("train")[0].content.metric_records["metrics"]
    train_size = len(fedcg_dp_run.env(0).split.train)
    reference = RDPAccountant()
    for _ in range(3 + 4):  # stage 1's steps, then the discriminator's
        reference.step(noise_multiplier=1.1, sample_rate=16 / train_size)

    assert reply[protocol.DP_EPSILON] == pytest.approx(reference.get_epsilon(1e-5), rel=1e-9)


def test_dp_sgd_keeps_fedcg_discriminator_batchnorm_off_the_data(
    fedcg_dp_run: InProcessRun,
) -> None:
    # BatchNorm statistics of real features would reach the discriminator,
    # hence the generator, outside the per-example clipping.
    private = fedcg_dp_run.private_per_round[0][0]
    assert private is not None
    stats = {k: v for k, v in private.to_torch_state_dict().items() if "running_" in k}

    assert stats and all(
        torch.equal(v, torch.zeros_like(v) if "mean" in k else torch.ones_like(v))
        for k, v in stats.items()
    )


def test_private_gradients_average_clipped_example_gradients(
    fedcg_dp_run: InProcessRun,
) -> None:
    params = DPSGDParams(noise_multiplier=1e-9, max_grad_norm=0.5)
    private = DPSGD(params).training(fedcg_dp_run.env(0, state=RecordDict()), server_round=1)
    layer = torch.nn.Linear(3, 1, bias=False)
    torch.nn.init.ones_(layer.weight)
    inputs = torch.tensor([[0.1, 0.0, 0.0], [3.0, 4.0, 0.0]])  # gradient norms 0.1 and 5
    cfg = fedcg_dp_run.scenario.client

    loss = private.private_gradients(
        layer, lambda i: layer(inputs[i]).sum(), batch=2, cfg=cfg, examples=100
    )

    expected = (inputs[0] + inputs[1] * 0.5 / 5.0) / 2  # the second clipped to norm 0.5
    assert layer.weight.grad is not None
    assert torch.allclose(layer.weight.grad[0], expected, atol=1e-6)
    assert loss == pytest.approx((0.1 + 7.0) / 2)
    assert private.epsilon() > 0  # the step was accounted


def test_probe_gradient_carries_the_clients_defences() -> None:
    def probe(defences: list[dict[str, Any]]) -> Tensors:
        scenario = _scenario(defences)
        sent = ArrayRecord(
            ClientEnv.create(client_spec(scenario), 0, RecordDict()).model().state_dict()
        )
        oracle = ClientReplay(client_spec(scenario), "fedavg", None)
        return oracle.probe(0, 1, scenario.client, sent, 1)[0]

    clean = probe([])
    noisy = probe([{"name": "gaussian", "sigma": 0.1}])
    dp = probe([{"name": "dp-sgd", "noise-multiplier": 1e-9, "max-grad-norm": 1e-2}])

    noise = torch.cat([(noisy[k] - clean[k]).flatten() for k in clean])
    assert abs(float(noise.std()) - 0.1) < 0.1 * 0.02
    assert global_norm(clean) > 1e-2
    assert global_norm(dp) == pytest.approx(1e-2, rel=1e-4)


@pytest.mark.parametrize(
    ("defences", "strategy", "model", "key"),
    [
        ([{"name": "blur"}], "fedavg", "lenet5-split", "defences[0]"),
        ([{"name": "gaussian", "sigma": -1.0}], "fedavg", "lenet5-split", "defences[0].sigma"),
        ([{"name": "gaussian", "std": 1.0}], "fedavg", "lenet5-split", "defences[0].std"),
        ([{"name": "clip"}], "fedavg", "lenet5-split", "defences[0].max-norm"),
        ([{"name": "dp-sgd"}], "fedprox", "lenet5-split", "defences[0]"),
        ([{"name": "dp-sgd"}], "fedavg", "resnet18", "defences[0]"),
        ([{"name": "dp-sgd"}, {"name": "dp-sgd"}], "fedavg", "lenet5-split", "defences"),
    ],
)
def test_bad_defences_fail_before_anything_runs(
    defences: list[dict[str, Any]], strategy: str, model: str, key: str
) -> None:
    with pytest.raises(ScenarioError) as err:
        _scenario(defences, strategy=strategy, model={"name": model})

    assert err.value.key == key


def test_defences_round_trip_through_the_resolved_scenario() -> None:
    import tomllib

    import tomli_w

    chain = [{"name": "clip", "max-norm": 1.0}, {"name": "gaussian", "sigma": 0.01}]
    scenario = _scenario(chain)

    again = scenario_from_dict(tomllib.loads(tomli_w.dumps(scenario_to_dict(scenario))))

    assert again.defences == scenario.defences
    assert client_config_record(again.client) == client_config_record(scenario.client)
