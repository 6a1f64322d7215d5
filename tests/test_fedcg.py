"""FedCG: what travels, the gamma schedule, distillation, and generator alignment."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pandas as pd
import pytest
import torch
from inprocess import InProcessRun, run_inprocess, tiny_table

from fedsim.clients.fedcg import FedCGClient
from fedsim.clients.private_state import state_file
from fedsim.core import protocol
from fedsim.core.config import ModelConfig, ScenarioError
from fedsim.core.gan import GanSplitNet, build_gan_split_net, build_generator
from fedsim.core.models import InputSpec
from fedsim.core.scenario_file import scenario_from_dict
from fedsim.outputs.run_folder import CLIENT_STATE_DIR, METRICS_FILE
from fedsim.scenario.validate import check_components
from fedsim.simulation.runner import run_scenario
from fedsim.strategies.distillation import (
    Teacher,
    distill_if_better,
    sample_codes,
    teacher_student_kl,
)
from fedsim.strategies.fedcg import gamma_schedule
from fedsim.strategies.fedsplit import FedSplit

RAMP = 2
MODEL = ModelConfig("lenet5-split")
SPEC = InputSpec(1, 32, 10)  # embedded MNIST at 32x32
SHARED = ("classifier.", "generator.")


@pytest.fixture(scope="module")
def fedcg_run() -> InProcessRun:
    """Two clients, three rounds, in process (about 12 s of CPU)."""
    strategy = {
        "name": "fedcg",
        "distill-iterations": 20,
        "gamma-ramp-rounds": RAMP,
        "gan-steps": 12,
    }
    table = tiny_table(strategy, federation={"num-clients": 2, "rounds": 3})
    return run_inprocess(scenario_from_dict(table))


def test_replies_carry_exactly_generator_and_classifier(fedcg_run: InProcessRun) -> None:
    state = build_gan_split_net(MODEL, SPEC, seed=0).state_dict()
    shared = {k for k in state if k.startswith(SHARED)}

    replies = fedcg_run.grid.replies("train")

    assert len(replies) == 2 * 3
    assert all(set(reply.content["arrays"].keys()) == shared for reply in replies)
    assert fedcg_run.grid.array_names() == shared  # no extractor.*, no discriminator.*
    # The audit rebuilds a client's generator from exactly these tensors.
    uploaded = replies[0].content["arrays"].to_torch_state_dict()
    generator = build_generator(MODEL, SPEC)
    prefix = "generator."
    generator.load_state_dict(
        {k[len(prefix) :]: v for k, v in uploaded.items() if k.startswith(prefix)}
    )


def test_gamma_follows_its_schedule(fedcg_run: InProcessRun) -> None:
    ramp = 50
    values = [gamma_schedule(r, ramp) for r in range(1, 2 * ramp)]

    assert values[0] == 0.0
    assert all(a < b for a, b in itertools.pairwise(values[: ramp + 1]))
    assert gamma_schedule(26, ramp) == pytest.approx(2 / (1 + math.exp(-5)) - 1)
    assert gamma_schedule(ramp + 1, ramp) == pytest.approx(1.0, abs=1e-4)
    assert values[ramp:] == [values[ramp]] * (ramp - 1)
    sent = {
        int(m.content["config"]["server-round"]): m.content["config"][protocol.FEDCG_GAMMA]
        for m in fedcg_run.grid.sent
        if m.metadata.message_type == "train"
    }
    assert sent == {r: gamma_schedule(r, RAMP) for r in (1, 2, 3)}


def _teachers(count: int) -> list[Teacher]:
    teachers = []
    for i in range(count):
        net = build_gan_split_net(MODEL, SPEC, seed=10 + i)
        with torch.no_grad():  # confident, disagreeing classifiers: a real KD target
            net.classifier[-1].weight.mul_(20)
        teachers.append(Teacher((i + 1) / sum(range(1, count + 1)), net))
    return teachers


def _averaged_student(teachers: list[Teacher]) -> GanSplitNet:
    student = build_gan_split_net(MODEL, SPEC, seed=0)
    with torch.no_grad():  # the weighted average the server starts from
        for name, param in student.named_parameters():
            if name.startswith(SHARED):
                param.copy_(sum(t.weight * dict(t.net.named_parameters())[name] for t in teachers))
    return student


def test_distillation_that_raises_held_out_kl_is_undone() -> None:
    # Two nearly equal teachers: their average is already close to the
    # ensemble, and a fresh Adam at a large lr moves every weight by ~lr.
    base = build_gan_split_net(MODEL, SPEC, seed=3)
    nets = [build_gan_split_net(MODEL, SPEC, seed=3) for _ in range(2)]
    torch.manual_seed(0)
    with torch.no_grad():
        for net in nets:
            for param in net.parameters():
                param.add_(1e-3 * torch.randn_like(param))
    teachers = [Teacher(0.5, net) for net in nets]
    student = _averaged_student(teachers)
    start = {k: v.clone() for k, v in student.state_dict().items()}
    codes = sample_codes(256, base, torch.Generator().manual_seed(999))

    outcome = distill_if_better(
        student, teachers, codes, iterations=5, batch_size=16, lr=1e-2, seed=1
    )

    assert outcome.kl_distilled > outcome.kl_before > 0
    assert not outcome.accepted
    assert outcome.kl_after == outcome.kl_before
    assert all(torch.equal(v, start[k]) for k, v in student.state_dict().items())


def test_distillation_that_lowers_held_out_kl_is_kept() -> None:
    # Confident, disagreeing teachers: far from their average, a real target.
    teachers = _teachers(3)
    student = _averaged_student(teachers)
    codes = sample_codes(256, student, torch.Generator().manual_seed(999))

    outcome = distill_if_better(
        student, teachers, codes, iterations=30, batch_size=16, lr=1e-3, seed=1
    )

    assert outcome.accepted
    assert outcome.kl_after == outcome.kl_distilled < 0.2 * outcome.kl_before
    assert teacher_student_kl(student, teachers, *codes) == pytest.approx(outcome.kl_after)


def test_each_round_keeps_the_pair_with_the_lower_held_out_kl(fedcg_run: InProcessRun) -> None:
    for server_round, record in enumerate(fedcg_run.records, start=1):
        metrics = record.train
        before = metrics[protocol.DISTILL_KL_BEFORE]
        distilled = metrics[protocol.DISTILL_KL_DISTILLED]
        accepted = bool(metrics[protocol.DISTILL_ACCEPTED])
        replies = [
            reply
            for sent, reply in fedcg_run.grid.exchanges
            if sent.metadata.message_type == "train"
            and sent.content["config"][protocol.SERVER_ROUND] == server_round
        ]
        average, _ = FedSplit.aggregate_train(fedcg_run.strategy, server_round, replies)
        kept = fedcg_run.arrays_per_round[server_round - 1].to_torch_state_dict()

        assert metrics[protocol.DISTILL_KL_AFTER] <= before
        assert accepted == (distilled < before)
        assert metrics[protocol.DISTILL_KL_AFTER] == (distilled if accepted else before)
        unchanged = all(torch.equal(v, kept[k]) for k, v in average.to_torch_state_dict().items())
        assert unchanged == (not accepted), server_round


def _feature_gap(run: InProcessRun, generator_round: int, extractor_round: int) -> float:
    """Mean squared gap between class-mean features: global G vs the clients' E_i."""
    arrays = (
        run.arrays_per_round[generator_round - 1]
        if generator_round
        else run.strategy.initial_arrays()
    )
    generator = run.strategy.network(arrays).generator.eval()
    noise = torch.Generator().manual_seed(5)
    gaps = []
    for partition, record in run.private_per_round[extractor_round - 1].items():
        env = run.env(partition)
        net = FedCGClient().network(env)
        assert record is not None
        net.load_state_dict(record.to_torch_state_dict(), strict=False)
        images, labels = env.train_data
        with torch.no_grad():
            features = net.extractor(images)
            for c in labels.unique():
                mask = labels == c
                z = torch.randn(int(mask.sum()), generator.noise_dim, generator=noise)
                fake = generator(z, labels[mask])
                gaps.append(float(((features[mask].mean(0) - fake.mean(0)) ** 2).mean()))
    return sum(gaps) / len(gaps)


def test_global_generator_features_move_towards_client_features(fedcg_run: InProcessRun) -> None:
    # The untrained global generator against the round-1 extractors, then the
    # round-3 global generator against the round-3 extractors.
    start = _feature_gap(fedcg_run, 0, 1)
    final = _feature_gap(fedcg_run, 3, 3)

    assert final < 0.6 * start, (start, final)


def test_fedcg_rejects_models_without_square_feature_maps() -> None:
    table = tiny_table({"name": "fedcg"}, model={"name": "resnet18"})

    with pytest.raises(ScenarioError) as err:
        check_components(scenario_from_dict(table))

    assert err.value.key == "model.name"


@pytest.mark.slow
def test_fedcg_simulation_keeps_extractor_and_discriminator_private(tmp_path: Path) -> None:
    strategy = {"name": "fedcg", "distill-iterations": 10, "gan-steps": 5}
    table = tiny_table(strategy, federation={"rounds": 2}, backend={"ray-cpus": 2})

    result = run_scenario(scenario_from_dict(table), tmp_path / "run")

    assert {k.split(".")[0] for k in result.final_arrays} == {"classifier", "generator"}
    metrics = pd.read_csv(tmp_path / "run" / METRICS_FILE)
    distill_columns = {
        protocol.DISTILL_KL_BEFORE,
        protocol.DISTILL_KL_DISTILLED,
        protocol.DISTILL_KL_AFTER,
        protocol.DISTILL_ACCEPTED,
        protocol.DISTILL_SECONDS,
    }
    assert {*distill_columns, protocol.GAN_D_LOSS} <= set(metrics)
    assert (metrics[protocol.DISTILL_KL_AFTER] <= metrics[protocol.DISTILL_KL_BEFORE]).all()
    assert metrics["client-eval-acc"].notna().all()
    for partition in range(3):
        saved = torch.load(
            state_file(tmp_path / "run" / CLIENT_STATE_DIR, partition), weights_only=True
        )
        assert {k.split(".")[0] for k in saved["arrays"]} == {"extractor", "discriminator"}
