"""Reach of the reconstruction attacks on real multi-step FedAvg updates.

Per cell (images per client, local epochs, batch size, client optimiser,
dataset) ``--clients`` simulated clients each train the same fresh victim
model on their own real images with fedsim's own client code
(:func:`fedsim.core.training.train_local`, a private shuffling seed); the
server sees the update and the public config only. Each attack in
``--attacks`` reconstructs every client's images; a client's image counts as
recovered when its matched reconstruction (Hungarian on per-image MSE) has
PSNR >= 20 dB (peak 1 on [0, 1]) and SSIM >= 0.8. Printed per cell and
attack: the share of images recovered over all the cell's clients, the median
per-image PSNR, and seconds per client (one CPU thread, or ``--device cuda``). Rows go to
``--out`` (CSV, one per client and attack)::

    .venv/bin/python bench/fedavg_leakage.py --images 5 10 --epochs 1 2 \
        --batch 5 --optimizers sgd adam --clients 2 --steps 60 --out reach.csv

The client's lr is ``--sgd-lr`` for SGD and ``--adam-lr`` for Adam.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import statistics
import time

import pandas as pd
import torch

from fedsim.attacks import ATTACKS
from fedsim.attacks.base import Observation, PublicData
from fedsim.audit.candidates import AuditPool
from fedsim.audit.observe import ServerView, observe_upload
from fedsim.core.config import ClientConfig, DataConfig, ModelConfig
from fedsim.core.data import DatasetBundle, load_dataset
from fedsim.core.metrics import score_reconstruction
from fedsim.core.models import InputSpec, build_model
from fedsim.core.seeds import SeedStream, derive_seed
from fedsim.core.toml_tables import parse_table
from fedsim.core.training import train_local


def client_update(
    data: str,
    model: ModelConfig,
    images: int,
    cfg: ClientConfig,
    client: int,
    seed: int,
    normalize: bool = False,
) -> tuple[Observation, torch.Tensor, torch.Tensor]:
    """One client's real update on ``images`` of its own digits, and its truth.

    The observation carries the server's public data as the audit grants it (the
    public half of the held-out split); where a dataset's held-out split is its
    training set (foolbox's 20 samples) the client's own images are left out of it.
    """
    bundle = load_dataset(DataConfig(dataset=data, image_size=32, normalize=normalize))
    spec = InputSpec(bundle.train_images.shape[1], 32, bundle.num_classes)
    pick = torch.Generator().manual_seed(derive_seed(SeedStream.LOCAL_SPLIT, seed, client))
    index = torch.randperm(len(bundle.train_labels), generator=pick)[:images]
    x, y = bundle.train_images[index], bundle.train_labels[index]
    net = build_model(model, spec, seed=derive_seed(SeedStream.MODEL_INIT, seed))
    sent = {k: v.detach().clone() for k, v in net.named_parameters()}
    train_local(net, x, y, cfg, seed=derive_seed(SeedStream.CLIENT_TRAIN, seed, 1, client))
    view = ServerView(model, spec, bundle.normalization, "fedavg")
    uploaded = {k: v.detach().clone() for k, v in net.named_parameters()}
    observation = dataclasses.replace(
        observe_upload(view, sent, uploaded, cfg, images),
        client_id=client,
        public=public_data(bundle, index, seed),
    )
    return observation, bundle.normalization.to_pixels(x), y


def public_data(bundle: DatasetBundle, trained: torch.Tensor, seed: int) -> PublicData:
    """The audit's public half of the held-out split, without the client's own images
    where the held-out split is the training set."""
    images, labels = bundle.test_images, bundle.test_labels
    if images.shape == bundle.train_images.shape and torch.equal(images, bundle.train_images):
        kept = torch.ones(len(labels), dtype=torch.bool)
        kept[trained] = False
        images, labels = images[kept], labels[kept]
    return AuditPool.split(images, labels, seed).public


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=["mnist-embedded"])
    parser.add_argument("--model", default="lenet-zhu")
    parser.add_argument("--init", default="uniform")
    parser.add_argument("--images", nargs="+", type=int, default=[5, 10])
    parser.add_argument("--epochs", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--batch", nargs="+", type=int, default=[5])
    parser.add_argument("--optimizers", nargs="+", default=["sgd", "adam"])
    parser.add_argument("--attacks", nargs="+", default=["fedavg-leakage", "unrolled-dlg"])
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--restarts", type=int, default=2)
    parser.add_argument("--sgd-lr", type=float, default=0.01)
    parser.add_argument("--adam-lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="fedavg_leakage.csv")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--normalize", action="store_true", help="standardise the pixels")
    args = parser.parse_args()
    torch.set_num_threads(1)
    # TF32 convolutions move second-order matching by many dB (DESIGN.md, section 9).
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    model = ModelConfig(args.model, args.init)
    rows = []
    grid = itertools.product(args.datasets, args.optimizers, args.images, args.epochs, args.batch)
    for data, optimizer, images, epochs, batch in grid:
        if batch > images:
            continue  # the same cell as batch = images
        lr = args.sgd_lr if optimizer == "sgd" else args.adam_lr
        cfg = ClientConfig(local_epochs=epochs, batch_size=batch, optimizer=optimizer, lr=lr)
        for client in range(args.clients):
            observation, truth, labels = client_update(
                data, model, images, cfg, client, args.seed, args.normalize
            )
            for name in args.attacks:
                attack_cls = ATTACKS.get(name)
                budget = {"steps": args.steps, "restarts": args.restarts}
                fields = {f.name for f in dataclasses.fields(attack_cls.Params)}
                params = parse_table(  # a closed-form attack (adam-signs) has no budget
                    attack_cls.Params, {k: v for k, v in budget.items() if k in fields}
                )
                start = time.perf_counter()
                try:
                    rec = attack_cls(params, args.device).reconstruct(observation, seed=args.seed)
                except ValueError as refused:
                    print(f"{name}: refused ({refused})")
                    continue
                seconds = time.perf_counter() - start
                score = score_reconstruction(rec.images, truth, rec.labels, labels)
                hits = score.recovered
                rows.append(
                    {
                        "dataset": data,
                        "optimizer": optimizer,
                        "images": images,
                        "epochs": epochs,
                        "batch": batch,
                        "steps": rec.steps_taken,
                        "attack": name,
                        "client": client,
                        "recovered": hits,
                        "found": rec.details.get("found", ""),
                        "median_psnr": statistics.median(score.per_image_psnr),
                        "label_accuracy": score.label_accuracy,
                        "seconds": seconds,
                        "stop_reason": rec.details.get("stop_reason", ""),
                    }
                )
                print(
                    f"{data} {optimizer} n={images} E={epochs} B={batch} {name} client {client}: "
                    f"{hits}/{images} recovered, median {rows[-1]['median_psnr']:.1f} dB, "
                    f"{seconds:.1f} s",
                    flush=True,
                )
                pd.DataFrame(rows).to_csv(args.out, index=False)
    table = pd.DataFrame(rows)
    keys = ["dataset", "optimizer", "images", "epochs", "batch", "attack"]
    summary = table.groupby(keys).agg(
        clients=("client", "count"),
        recovered=("recovered", "sum"),
        median_psnr=("median_psnr", "median"),
        seconds=("seconds", "median"),
    )
    summary["share"] = summary["recovered"] / (
        summary["clients"] * summary.index.get_level_values("images")
    )
    print(summary.to_markdown(floatfmt=".2f"))


if __name__ == "__main__":
    main()
