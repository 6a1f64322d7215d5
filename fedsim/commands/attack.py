"""``fedsim attack``: invert the gradient of real images under a fresh model.

Picks ``--num-images`` images of a dataset (seeded), splits them into batches
of ``--batch-size``, and for each batch builds a fresh victim model (its
``--init``, seeded by ``--seed`` plus the batch index) and the gradient probe
the server would see (:func:`fedsim.probe.gradient_probe`). The attack gets
only that observation; :mod:`fedsim.core.metrics` scores what it returns. Writes
``results.csv`` (one row a batch), ``grid.png`` (ground truth above each
reconstruction) and ``attack.toml`` (every setting, for a rerun) into the
output folder, and prints the table with its medians.
"""

from __future__ import annotations

import argparse
import csv
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedsim.commands import COMMANDS
from fedsim.core.config import DataConfig, ModelConfig, apply_overrides, require, to_table

RESULTS_FILE = "results.csv"
GRID_FILE = "grid.png"
SETTINGS_FILE = "attack.toml"
CLASSLESS_DEFAULT = 10
"""Output size for a dataset without classes (lfw-faces): every image is class 0 of 10."""


def pick_device(name: str) -> torch.device:
    """``auto`` is CUDA when available, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class AttackCommand:
    help = "invert the gradient of real images with a named attack; write a table and a grid"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add = parser.add_argument
        add("--attack", default="dlg", help="attack name (fedsim list), default dlg")
        add("--dataset", default="cifar100-samples", help="dataset name, default cifar100-samples")
        add("--model", default="lenet-zhu", help="victim architecture, default lenet-zhu")
        add("--init", default="uniform", help="victim weight init, default uniform")
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
            choices=["gradient", "update"],
            default="gradient",
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
        add("--out", help="output folder (default runs/attack-<attack>-<dataset>-<time>)")

    def run(self, args: argparse.Namespace) -> int:
        from fedsim.attacks import ATTACKS
        from fedsim.core.config import lookup, parse_table
        from fedsim.core.data import DATASETS, load_dataset
        from fedsim.core.models import INITS, MODELS

        require(args.batch_size >= 1, "--batch-size", args.batch_size, "must be >= 1")
        require(
            args.num_images >= 1 and args.num_images % args.batch_size == 0,
            "--num-images",
            args.num_images,
            f"must be a positive multiple of --batch-size ({args.batch_size})",
        )
        require(args.parallel >= 1, "--parallel", args.parallel, "must be >= 1")
        require(args.threads >= 0, "--threads", args.threads, "must be >= 0")
        lookup(DATASETS, args.dataset, "--dataset")
        lookup(MODELS, args.model, "--model")
        lookup(INITS, args.init, "--init")
        attack_cls = lookup(ATTACKS, args.attack, "--attack")
        table: dict[str, Any] = apply_overrides({}, args.params)
        for key in ("restarts", "steps"):
            if getattr(args, key) is not None:
                table[key] = getattr(args, key)
        params = parse_table(attack_cls.Params, table, "attack")
        data = load_dataset(
            DataConfig(dataset=args.dataset, channels=args.channels, image_size=args.image_size)
        )
        classes = args.num_classes or (
            data.num_classes if data.num_classes > 1 else CLASSLESS_DEFAULT
        )
        require(
            classes >= data.num_classes,
            "--num-classes",
            classes,
            f"must be >= the dataset's {data.num_classes} classes",
        )
        require(
            args.num_images <= len(data.test_images),
            "--num-images",
            args.num_images,
            f"must be <= the {len(data.test_images)} images of {args.dataset}",
        )
        out = Path(
            args.out or f"runs/attack-{args.attack}-{args.dataset}-{time.strftime('%Y%m%d-%H%M%S')}"
        )
        out.mkdir(parents=True, exist_ok=True)
        attack = attack_cls(params, device=pick_device(args.device))
        threads = torch.get_num_threads()
        torch.set_num_threads(args.threads or threads)
        try:
            probes, picked = _probes(args, data, classes)
            rows, recs = _attack(attack, probes, picked, args)
        finally:
            torch.set_num_threads(threads)
        _write(out, args, to_table(params), rows, probes, recs)
        _print(rows, args, params, out)
        return 0


def _probes(args: argparse.Namespace, data: Any, classes: int) -> tuple[list[Any], torch.Tensor]:
    """One gradient probe per batch, each under its own fresh victim model."""
    from fedsim.core.models import InputSpec, build_model
    from fedsim.probe import gradient_probe

    gen = torch.Generator().manual_seed(args.seed)
    picked = torch.randperm(len(data.test_images), generator=gen)[: args.num_images]
    spec = InputSpec(data.channels, data.image_size, classes)
    model_cfg = ModelConfig(args.model, args.init)
    probes = []
    for b, idx in enumerate(picked.split(args.batch_size)):
        model = build_model(model_cfg, spec, seed=args.seed + b)
        probes.append(
            gradient_probe(
                model,
                model_cfg,
                spec,
                data.test_images[idx],
                data.test_labels[idx],
                data.normalization,
                shared_kind=args.shared,
                client_id=b,
            )
        )
    return probes, picked


def _attack(
    attack: Any, probes: list[Any], picked: torch.Tensor, args: argparse.Namespace
) -> tuple[list[dict[str, Any]], list[Any]]:
    """Run the attack on every probe (``--parallel`` at a time) and score it."""
    from fedsim.core.metrics import score_reconstruction

    recs = []
    for first in range(0, len(probes), args.parallel):
        chunk = [p.observation for p in probes[first : first + args.parallel]]
        recs += attack.reconstruct_many(chunk, seed=args.seed)
    rows = []
    for b, (probe, rec, idx) in enumerate(
        zip(probes, recs, picked.split(args.batch_size), strict=True)
    ):
        score = score_reconstruction(rec.images, probe.truth.images, rec.labels, probe.truth.labels)
        rows.append(
            {
                "batch": b,
                "images": " ".join(str(int(i)) for i in idx),
                "labels": " ".join(str(int(v)) for v in probe.truth.labels),
                "predicted": " ".join(str(int(v)) for v in rec.labels),
                "psnr": score.psnr,
                "ssim": score.ssim,
                "mse": score.mse,
                "label-acc": score.label_accuracy,
                "final-objective": rec.final_objective,
                "seconds": rec.seconds,
                "restarts": rec.restarts,
                "steps": rec.iterations,
                "assignment": score.assignment,
                "per-image-psnr": score.per_image_psnr,
            }
        )
    return rows, recs


def _write(
    out: Path,
    args: argparse.Namespace,
    params: dict[str, Any],
    rows: list[dict[str, Any]],
    probes: list[Any],
    recs: list[Any],
) -> None:
    import tomli_w

    columns = [c for c in rows[0] if c not in ("assignment", "per-image-psnr")]
    with open(out / RESULTS_FILE, "w", newline="") as f:
        writer = csv.DictWriter(f, columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    run = {k.replace("_", "-"): v for k, v in vars(args).items() if v is not None}
    run.pop("params", None)
    (out / SETTINGS_FILE).write_text(tomli_w.dumps({"run": run, "params": params}))
    _grid(out / GRID_FILE, rows, probes, recs)


def _grid(path: Path, rows: list[dict[str, Any]], probes: list[Any], recs: list[Any]) -> None:
    """Ground truth above its matched reconstruction, eight images a row pair."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = []
    for row, probe, rec in zip(rows, probes, recs, strict=True):
        matched = rec.images[list(row["assignment"])]
        for truth, image, psnr in zip(
            probe.truth.images, matched, row["per-image-psnr"], strict=True
        ):
            pairs.append((truth, image, psnr))
    cols = min(8, len(pairs))
    bands = math.ceil(len(pairs) / cols)
    fig, axes = plt.subplots(2 * bands, cols, figsize=(1.4 * cols, 3.0 * bands), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for i, (truth, image, psnr) in enumerate(pairs):
        band, col = divmod(i, cols)
        for r, (img, title) in enumerate(((truth, "truth"), (image, f"{psnr:.1f} dB"))):
            ax = axes[2 * band + r, col]
            pixels = img.permute(1, 2, 0).numpy()
            ax.imshow(
                pixels.squeeze(-1) if pixels.shape[-1] == 1 else pixels, cmap="gray", vmin=0, vmax=1
            )
            ax.set_title(title, fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _print(rows: list[dict[str, Any]], args: argparse.Namespace, params: Any, out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

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
        title=f"{args.attack} on {args.dataset}, {args.model} ({args.init}), "
        f"batch {args.batch_size}",
    )
    for r in rows:
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
    median = {k: float(np.median([r[k] for r in rows])) for k in ("psnr", "ssim", "label-acc")}
    table.add_row(
        "median",
        "",
        "",
        "",
        f"{median['psnr']:.2f}",
        f"{median['ssim']:.3f}",
        f"{median['label-acc']:.0%}",
        "",
        f"{np.median([r['seconds'] for r in rows]):.1f}",
    )
    console = Console()
    console.print(table)
    console.print(
        f"restarts {params.restarts}, steps {params.step_count}; PSNR peak 1 on [0, 1] pixels. "
        f"Wrote {out / RESULTS_FILE}, {out / GRID_FILE}, {out / SETTINGS_FILE}"
    )


COMMANDS.register("attack")(AttackCommand())
