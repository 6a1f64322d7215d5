"""``fedsim attack``: invert the gradient of real images; print a table, write a CSV and a grid.

The experiment itself is :mod:`fedsim.audit.experiment`; this is its face.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedsim.commands import COMMANDS
from fedsim.core.scenario_file import apply_overrides
from fedsim.core.threat import SharedKind

if TYPE_CHECKING:
    from fedsim.audit.experiment import AttackExperiment


class AttackCommand:
    help = "invert the gradient of real images with a named attack; write a table and a grid"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add = parser.add_argument
        add("--attack", default="dlg", help="attack name (fedsim list), default dlg")
        add("--dataset", default="cifar100-samples", help="dataset name, default cifar100-samples")
        add("--model", default="lenet-zhu", help="victim architecture, default lenet-zhu")
        add("--init", default="uniform", help="victim weight init, default uniform")
        add(
            "--weights",
            help="a run's model.pt: every victim at these trained weights (instead of --init)",
        )
        add("--batch-size", type=int, default=1, help="images per observed gradient, default 1")
        add("--num-images", type=int, default=8, help="images attacked in all, default 8")
        add("--seed", type=int, default=0, help="images, models and dummies, default 0")
        add("--restarts", type=int, help="override the attack's restarts")
        add("--steps", type=int, help="override the attack's optimiser steps")
        add(
            "--set",
            dest="params",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="attack parameter, kebab-case, e.g. --set labels=infer (repeatable)",
        )
        add(
            "--shared",
            choices=[str(kind) for kind in SharedKind],
            default=str(SharedKind.GRADIENT),
            help="the server sees the gradient, or the parameters after one SGD step",
        )
        add("--channels", choices=["native", "gray", "rgb"], default="native")
        add("--image-size", type=int, default=32)
        add("--num-classes", type=int, help="victim outputs (default: the dataset's classes)")
        add("--parallel", type=int, default=8, help="batches optimised together, default 8")
        add("--device", default="auto", help="auto, cpu, cuda or cuda:N")
        add(
            "--threads",
            type=int,
            default=1,
            help="CPU threads for PyTorch, default 1 (0 = PyTorch's default); the attacks' "
            "small batched operations gain little from more, and lose badly on a busy machine",
        )
        add(
            "--precision",
            choices=["float32", "float64"],
            default="float32",
            help="the attack's arithmetic, default float32 (TF32 is off either way)",
        )
        add("--out", help="output folder (default runs/attack-<attack>-<dataset>-<time>)")

    def run(self, args: argparse.Namespace) -> int:
        from fedsim.audit.experiment import run_attack_experiment, write_attack_outputs

        params: dict[str, Any] = apply_overrides({}, args.params)
        for key in ("restarts", "steps"):
            if getattr(args, key) is not None:
                params[key] = getattr(args, key)
        from fedsim.audit.experiment import AttackExperiment

        experiment = check_flags(
            AttackExperiment(
                attack=args.attack,
                params=params,
                dataset=args.dataset,
                model=args.model,
                init=args.init,
                weights=args.weights,
                batch_size=args.batch_size,
                num_images=args.num_images,
                seed=args.seed,
                shared=args.shared,
                channels=args.channels,
                image_size=args.image_size,
                num_classes=args.num_classes,
                parallel=args.parallel,
                device=args.device,
                threads=args.threads,
                precision=args.precision,
            )
        )
        out = Path(
            args.out or f"runs/attack-{args.attack}-{args.dataset}-{time.strftime('%Y%m%d-%H%M%S')}"
        )
        from rich.console import Console

        outcome = run_attack_experiment(experiment, Console(soft_wrap=True, highlight=False))
        write_attack_outputs(outcome, out)
        _print(outcome, out)
        return 0


def check_flags(experiment: AttackExperiment) -> AttackExperiment:
    """``experiment``'s settings, each checked as the flag that gave it; a one-line
    :class:`~fedsim.core.config.ScenarioError` naming the flag else."""
    # Imported here: the command line starts without torch (fedsim --help stays fast).
    from fedsim.attacks.base import AttackSetting
    from fedsim.audit.experiment import MAX_CLASSES
    from fedsim.core.config import (
        ClientConfig,
        DataConfig,
        ModelConfig,
        require,
        require_image_size,
    )
    from fedsim.core.data import DATASETS, generated_dataset
    from fedsim.core.devices import pick_device
    from fedsim.core.modality import IMAGE
    from fedsim.core.models import INITS, MODELS, InputSpec
    from fedsim.core.scenario_file import lookup
    from fedsim.core.threat import ThreatModel
    from fedsim.scenario.applicability import check_applies
    from fedsim.scenario.modality import check_pairing, data_modality
    from fedsim.scenario.validate import check_model_fits

    require(experiment.batch_size >= 1, "--batch-size", experiment.batch_size, "must be >= 1")
    require(
        experiment.num_images >= 1 and experiment.num_images % experiment.batch_size == 0,
        "--num-images",
        experiment.num_images,
        f"must be a positive multiple of --batch-size ({experiment.batch_size})",
    )
    require(experiment.seed >= 0, "--seed", experiment.seed, "must be >= 0")
    require(experiment.parallel >= 1, "--parallel", experiment.parallel, "must be >= 1")
    cores = os.cpu_count() or 1
    require(
        0 <= experiment.threads <= cores,
        "--threads",
        experiment.threads,
        f"must be between 0 (PyTorch's default) and this machine's {cores} cores",
    )
    require(
        experiment.num_classes is None or 1 <= experiment.num_classes <= MAX_CLASSES,
        "--num-classes",
        experiment.num_classes,
        f"must be between 1 and {MAX_CLASSES} (absent: the dataset's classes)",
    )
    require_image_size(experiment.image_size, "--image-size")
    lookup(DATASETS, experiment.dataset, "--dataset")
    require(
        not generated_dataset(DataConfig(dataset=experiment.dataset)),
        "--dataset",
        experiment.dataset,
        "is generated feature vectors, not images: the attacks reconstruct images",
    )
    data = DataConfig(dataset=experiment.dataset)
    require(
        data_modality(data) == IMAGE,
        "--dataset",
        experiment.dataset,
        f"is {data_modality(data)}, not images: the attacks reconstruct images",
    )
    lookup(MODELS, experiment.model, "--model")
    check_pairing(MODELS, "--model", experiment.model, data)
    lookup(INITS, experiment.init, "--init")
    require(
        experiment.weights is None or Path(experiment.weights).is_file(),
        "--weights",
        experiment.weights,
        "no such file (a run's model.pt)",
    )
    channels = 3 if experiment.channels == "rgb" else 1
    spec = InputSpec(channels, experiment.image_size, 10)  # classes do not change the shapes
    check_model_fits(experiment.model, spec, "--image-size")
    pick_device(experiment.device, "--device")
    # The probe is a whole model's gradient (or its one-step update) on one batch, as
    # FedAvg's server sees it (uploads: all): an attack that cannot read it refuses here.
    probed = AttackSetting(
        ModelConfig(experiment.model, experiment.init),
        ClientConfig(local_steps=1, batch_size=experiment.batch_size),
        DataConfig(dataset=experiment.dataset, image_size=experiment.image_size),
        "fedavg",
        uploads=None,
        threat_model=ThreatModel.PROBE
        if experiment.shared == SharedKind.GRADIENT
        else ThreatModel.UPDATE,
        probe_batch_size=experiment.batch_size,
    )
    attack = experiment.resolved_attack()
    check_applies(attack.cls, attack.name, probed, "--attack")
    return experiment


def _print(outcome: Any, out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    from fedsim.audit.experiment import GRID_FILE, RESULTS_FILE, SETTINGS_FILE

    exp = outcome.experiment
    table = Table(
        "batch",
        "images",
        "labels",
        "predicted",
        "PSNR dB",
        "SSIM",
        "label acc",
        "objective",
        "seconds",
        # The victim's weights are a run's model.pt or the --init scheme, never both.
        title=f"{exp.attack} on {exp.dataset}, {exp.model} "
        f"({f'weights {exp.weights}' if exp.weights else exp.init}), batch {exp.batch_size}",
    )
    for column in table.columns:
        column.overflow = "fold"  # wrap in a narrow terminal or a log instead of cutting
    for r in outcome.rows():
        table.add_row(
            str(r["batch"]),
            r["images"],
            r["labels"],
            r["predicted"],
            f"{r['psnr']:.2f}",
            f"{r['ssim']:.3f}",
            f"{r['label-acc']:.0%}",
            f"{r['final-objective']:.3g}",
            f"{r['seconds']:.1f}",
        )
    median = outcome.medians()
    table.add_row(
        "median",
        "",
        "",
        "",
        f"{median['psnr']:.2f}",
        f"{median['ssim']:.3f}",
        f"{median['label-acc']:.0%}",
        "",
        f"{median['seconds']:.1f}",
    )
    recs = outcome.reconstructions
    converged = sum(r.converged for r in recs)
    console = Console()
    console.print(table)
    console.print(
        f"restarts {recs[0].restarts}, steps {recs[0].iterations} "
        f"(taken: at most {max(r.steps_taken for r in recs)}; converged {converged} of "
        f"{len(recs)}); PSNR peak 1 on [0, 1] pixels. "
        f"Wrote {out / RESULTS_FILE}, {out / GRID_FILE}, {out / SETTINGS_FILE}"
    )


COMMANDS.register("attack")(AttackCommand())
