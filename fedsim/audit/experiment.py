"""The attack experiment: invert the gradients of real images under fresh victim models.

``fedsim attack`` is a thin face over this module; benches and notebooks use
it directly::

    experiment = AttackExperiment(attack="dlg", dataset="cifar100-samples", num_images=8)
    outcome = run_attack_experiment(experiment)
    write_attack_outputs(outcome, Path("runs/my-attack"))

It picks ``num_images`` images of a dataset (seeded), splits them into
batches of ``batch_size``, and for each batch builds a fresh victim model
(``init``, its own seed per batch) and the gradient probe the server would
see (:func:`gradient_probe`). The attack gets only the probe's
:class:`~fedsim.attacks.base.Observation`; the probe's
:class:`~fedsim.core.truth.GroundTruth` meets the reconstruction only in
:func:`fedsim.core.metrics.score_reconstruction`.
"""

from __future__ import annotations

import csv
import dataclasses
import pickle
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import tomli_w
import torch
from rich.console import Console
from torch import nn

from fedsim.attacks import ATTACKS
from fedsim.attacks.base import Attack, Observation, Reconstruction
from fedsim.attacks.registry import resolve_attack
from fedsim.attacks.toolkits.precision import Precision, attack_precision
from fedsim.audit.observe import InterceptedReply, InterceptedRound, ProbeGradient, ServerView
from fedsim.audit.scoring import TaskRun, score_attack
from fedsim.audit.tasks import DeviceUse
from fedsim.core.components import Resolved
from fedsim.core.config import (
    ClientConfig,
    DataConfig,
    ModelConfig,
    ScenarioError,
    first_line,
    require,
)
from fedsim.core.data import (
    DatasetBundle,
    Normalization,
    load_dataset,
)
from fedsim.core.devices import pick_device
from fedsim.core.metrics import ReconstructionScore
from fedsim.core.models import InputSpec, build_model
from fedsim.core.protocol import AuditRecord, kebab
from fedsim.core.scenario_file import lookup
from fedsim.core.seeds import SeedStream, derive_seed
from fedsim.core.threat import SharedKind, ThreatModel
from fedsim.core.truth import GroundTruth, probe_gradient
from fedsim.outputs.figures import draw_pairs, scored_pairs
from fedsim.outputs.progress import AttackProgressLines

RESULTS_FILE = "results.csv"
GRID_FILE = "grid.png"
SETTINGS_FILE = "attack.toml"
CLASSLESS_DEFAULT = 10
"""Output size for a dataset without classes (lfw-faces): every image is class 0 of 10."""
MAX_CLASSES = 10_000
"""The victim's output layer is allocated at this width: more is a typo (CIFAR-100 has 100)."""


@dataclass(frozen=True)
class Probe:
    """An observation for the attack and, kept apart, the truth for the scorer."""

    observation: Observation
    truth: GroundTruth


def gradient_probe(
    model: nn.Module,
    model_config: ModelConfig,
    input_spec: InputSpec,
    inputs: torch.Tensor,
    labels: torch.Tensor,
    normalization: Normalization,
    *,
    shared_names: Sequence[str] | None = None,
    shared_kind: SharedKind = SharedKind.GRADIENT,
    train_config: ClientConfig | None = None,
    round: int = 0,
    client_id: int = 0,
    strategy: str = "fedavg",
) -> Probe:
    """Observe the gradient of ``(inputs, labels)`` at ``model``'s current weights.

    Parameters
    ----------
    model:
        The global model the server sent (left unchanged; evaluated in eval
        mode, as the attacker's copy is).
    inputs:
        One batch in model-input space (as a :class:`~fedsim.core.data.DatasetBundle` holds it).
    shared_names:
        Parameters the server receives (default: all of them).
    shared_kind:
        ``gradient`` shares ``dL/dtheta``; ``update`` shares the parameters
        after one SGD step of ``train_config.lr`` on this batch (FedSGD), so
        the observation's config says one local step on a batch of this size.
    """
    params = dict(model.named_parameters())
    names = list(shared_names) if shared_names is not None else list(params)
    gradient = {n: g.cpu() for n, g in probe_gradient(model, inputs, labels, names).items()}
    global_params = {n: p.detach().cpu().clone() for n, p in params.items()}
    config = dataclasses.replace(
        train_config or ClientConfig(), local_steps=1, batch_size=len(inputs)
    )
    shared = gradient
    if shared_kind == SharedKind.UPDATE:
        shared = {n: global_params[n] - config.lr * g for n, g in gradient.items()}
    view = ServerView(model_config, input_spec, normalization, strategy)
    sent = InterceptedRound(round, global_params, config, 0.0, ())
    # The probe's client uploads nothing beside it: its gradient is all the server sees.
    reply = InterceptedReply(client_id, len(inputs), len(inputs), config, {})
    observation = view.observe(
        sent, reply, ThreatModel.PROBE, ProbeGradient(shared, len(inputs)), shared_kind=shared_kind
    )
    seen = inputs.detach().cpu()  # token ids as they are; images back in pixel space
    pixels = normalization.to_pixels(seen).clamp(0, 1) if seen.is_floating_point() else seen
    truth = GroundTruth(pixels, labels.cpu())
    return Probe(observation, truth)


@dataclass(frozen=True)
class AttackExperiment:
    """One ``fedsim attack`` run. Errors name the fields as the command's flags.

    ``params`` is the attack's parameter table (kebab-case keys, validated
    against the attack's ``Params``); ``parallel`` batches are optimised
    together; ``threads`` sets PyTorch's CPU threads (0 = its default).
    """

    attack: str = "dlg"
    params: dict[str, Any] = field(default_factory=dict)
    dataset: str = "cifar100-samples"
    model: str = "lenet-zhu"
    init: str = "uniform"
    weights: str | None = None  # a run's model.pt: every victim at these weights
    batch_size: int = 1
    num_images: int = 8
    seed: int = 0
    shared: SharedKind = SharedKind.GRADIENT
    channels: Literal["native", "gray", "rgb"] = "native"
    image_size: int = 32
    num_classes: int | None = None
    parallel: int = 8
    device: str = "auto"
    threads: int = 1
    precision: Precision = "float32"

    def resolved_attack(self) -> Resolved:
        """The attack and its frozen ``Params`` from :attr:`params`."""
        lookup(ATTACKS, self.attack, "--attack")  # an unknown name is --attack's error
        return resolve_attack(self.attack, self.params, "attack")

    def settings(self) -> dict[str, Any]:
        """Every setting, the attack's defaults filled in (what ``attack.toml`` holds)."""
        run = {kebab(k): v for k, v in dataclasses.asdict(self).items() if v is not None}
        run.pop("params")
        return {"run": run, "params": self.resolved_attack().table()}


@dataclass
class AttackOutcome:
    """What an experiment produced: per batch its probe, reconstruction, score and record."""

    experiment: AttackExperiment
    images: list[list[int]]  # dataset indices of each batch
    probes: list[Probe]
    reconstructions: list[Reconstruction]
    scores: list[ReconstructionScore]
    records: list[AuditRecord]  # the audit's schema: client = batch

    def rows(self) -> list[dict[str, Any]]:
        """One row a batch: ``results.csv``'s columns, ``audit.csv``'s after the batch's."""
        return [
            {
                "batch": b,
                "images": " ".join(map(str, idx)),
                "labels": " ".join(str(int(v)) for v in probe.truth.labels),
                "predicted": " ".join(str(int(v)) for v in rec.labels),
                **record.to_row(),
            }
            for b, (idx, probe, rec, record) in enumerate(
                zip(self.images, self.probes, self.reconstructions, self.records, strict=True)
            )
        ]

    def medians(self) -> dict[str, float]:
        """Median PSNR, SSIM, label accuracy and seconds over the batches."""
        return {
            "psnr": float(np.median([s.psnr for s in self.scores])),
            "ssim": float(np.median([s.ssim for s in self.scores])),
            "label-acc": float(np.median([s.label_accuracy for s in self.scores])),
            "seconds": float(np.median([r.seconds for r in self.reconstructions])),
        }


def _victim_data(experiment: AttackExperiment) -> tuple[DatasetBundle, int]:
    data = load_dataset(
        DataConfig(
            dataset=experiment.dataset,
            channels=experiment.channels,
            image_size=experiment.image_size,
        )
    )
    classes = experiment.num_classes or (
        data.num_classes if data.num_classes > 1 else CLASSLESS_DEFAULT
    )
    require(
        classes >= data.num_classes,
        "--num-classes",
        classes,
        f"must be >= the dataset's {data.num_classes} classes",
    )
    require(
        experiment.num_images <= len(data.test_images),
        "--num-images",
        experiment.num_images,
        f"must be <= the {len(data.test_images)} images of {experiment.dataset}",
    )
    return data, classes


def load_weights(path: str | None, model: nn.Module) -> dict[str, torch.Tensor] | None:
    """A run's ``model.pt`` as a state dict for ``model``; a file that does not fit is a
    :class:`ScenarioError` on ``--weights``."""
    if path is None:
        return None
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
        model.load_state_dict(state)
    except (OSError, RuntimeError, pickle.UnpicklingError) as err:
        raise ScenarioError(
            "--weights", path, f"does not fit the model ({first_line(err)})"
        ) from None
    return dict(state)


def experiment_probes(experiment: AttackExperiment) -> tuple[list[Probe], list[list[int]]]:
    """One gradient probe per batch, each under its own fresh victim model."""
    data, classes = _victim_data(experiment)
    gen = torch.Generator().manual_seed(derive_seed(SeedStream.EXPERIMENT_IMAGES, experiment.seed))
    picked = torch.randperm(len(data.test_images), generator=gen)[: experiment.num_images]
    spec = InputSpec(data.channels, data.image_size, classes)
    model_cfg = ModelConfig(experiment.model, experiment.init)
    trained = load_weights(experiment.weights, build_model(model_cfg, spec, seed=0))
    probes, batches = [], []
    for b, idx in enumerate(picked.split(experiment.batch_size)):
        seed = derive_seed(SeedStream.EXPERIMENT_VICTIM, experiment.seed, b)
        model = build_model(model_cfg, spec, seed=seed)
        if trained is not None:
            model.load_state_dict(trained)
        probes.append(
            gradient_probe(
                model,
                model_cfg,
                spec,
                data.test_images[idx],
                data.test_labels[idx],
                data.normalization,
                shared_kind=experiment.shared,
                client_id=b,
            )
        )
        batches.append([int(i) for i in idx])
    return probes, batches


def run_attack_experiment(
    experiment: AttackExperiment, console: Console | None = None
) -> AttackOutcome:
    """Probe, attack (``parallel`` batches at a time) and score every batch;
    with ``console``, print the attack's progress."""
    resolved = experiment.resolved_attack()
    device = pick_device(experiment.device, "--device")
    attack: Attack = resolved.create(device=device)
    probes, batches = experiment_probes(experiment)
    seed = derive_seed(SeedStream.ATTACK, experiment.seed, 0, 0)
    threads = torch.get_num_threads()
    torch.set_num_threads(experiment.threads or threads)
    try:
        recs: list[Reconstruction] = []
        with attack_precision(experiment.precision):
            for first in range(0, len(probes), experiment.parallel):
                chunk = [p.observation for p in probes[first : first + experiment.parallel]]
                if console is not None:
                    batches_now = f"{first + 1}-{first + len(chunk)} of {len(probes)}"
                    label = f"{experiment.attack}, batches {batches_now}"
                    attack.progress = AttackProgressLines(console, label)
                recs += attack.reconstruct_many(chunk, seed=seed)
    finally:
        torch.set_num_threads(threads)
    use = DeviceUse(torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", 0, 0)
    label = experiment.attack
    scored = [
        score_attack(
            resolved,
            experiment.attack,
            p.observation,
            p.truth,
            rec,
            TaskRun(seed, use, rec.seconds),
        )
        for p, rec in zip(probes, recs, strict=True)
    ]
    scores = [s.score for s in scored if s.score is not None]
    records = [s.record for s in scored]
    return AttackOutcome(experiment, batches, probes, recs, scores, records)


def write_attack_outputs(outcome: AttackOutcome, out: Path) -> None:
    """``results.csv``, ``attack.toml`` (every setting) and ``grid.png`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    rows = outcome.rows()
    with open(out / RESULTS_FILE, "w", newline="") as f:
        writer = csv.DictWriter(f, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (out / SETTINGS_FILE).write_text(tomli_w.dumps(outcome.experiment.settings()))
    pairs = [
        pair
        for probe, rec, score in zip(
            outcome.probes, outcome.reconstructions, outcome.scores, strict=True
        )
        for pair in scored_pairs(
            probe.truth.images, probe.truth.labels, rec.images, rec.labels, score
        )
    ]
    exp = outcome.experiment
    draw_pairs(out / GRID_FILE, pairs, f"{exp.attack} on {exp.dataset}, {exp.model} ({exp.init})")
