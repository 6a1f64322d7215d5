"""The Cocktail Party Attack on FedSGD uploads of 16 digits and of 16 CIFAR-10 images.

Per seed: a fresh ``mlp-2nn`` (seeded), 16 images drawn (seeded) from the embedded
MNIST test digits (28x28) or from the 20 shipped CIFAR-10 test images
(``cifar10-samples``, 32x32 RGB: the first layer reads 3,072 pixels, the paper's
FC-2 setting), their one-step SGD upload (lr 0.05; two clients of 8 under secure
aggregation sum to the same gradient), attacked by ``cocktail-party`` with its
defaults. Scored by fedsim's scorer (best match per image): recovered = PSNR >= 20 dB
and SSIM >= 0.8. Beside it, two references: the authors' evaluation of the same
sources (min-max to [0, 1], sign picked against the ground truth: an upper bound no
attacker reaches) and a null (the bias-scaled sources of a random un-mixing, no
optimisation). One thread::

    PYTHONPATH=. .venv/bin/python bench/cocktail_party.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from fedsim.attacks.base import Observation, Reconstruction
from fedsim.attacks.reconstruction.cocktail import (
    CocktailParty,
    bias_scaled,
    random_rotations,
    unmixed,
    whiten,
)
from fedsim.attacks.reconstruction.vertices import BoxVertices
from fedsim.audit.experiment import gradient_probe
from fedsim.core.config import ClientConfig, DataConfig, ModelConfig
from fedsim.core.data import load_dataset
from fedsim.core.metrics import ReconstructionScore, score_reconstruction
from fedsim.core.models import InputSpec, build_model
from fedsim.core.params.analytic import BoxVerticesParams, CocktailPartyParams
from fedsim.core.truth import GroundTruth

FEDSGD = ClientConfig(local_steps=1, batch_size=16, optimizer="sgd", lr=0.05)
DATA = {
    "digits": (DataConfig(image_size=28, normalize=True), InputSpec(1, 28, 10)),
    "cifar": (DataConfig(dataset="cifar10-samples", image_size=32), InputSpec(3, 32, 10)),
}


def upload(domain: str, seed: int, batch: int = 16) -> tuple[Observation, GroundTruth]:
    """A fresh mlp-2nn's FedSGD upload on ``batch`` images of ``domain`` (both seeded)."""
    config, spec = DATA[domain]
    data = load_dataset(config)
    cfg = ModelConfig("mlp-2nn")
    gen = torch.Generator().manual_seed(100 + seed)
    idx = torch.randperm(len(data.test_images), generator=gen)[:batch]
    probe = gradient_probe(
        build_model(cfg, spec, seed=seed),
        cfg,
        spec,
        data.test_images[idx],
        data.test_labels[idx],
        data.normalization,
        shared_kind="update",
        train_config=dataclasses.replace(FEDSGD, batch_size=batch),
    )
    return probe.observation, probe.truth


def authors_evaluation(sources: torch.Tensor, truth: GroundTruth) -> ReconstructionScore:
    """The sources min-max scaled to [0, 1], each sign picked against the truth after
    matching (the authors' ``fix_sign_method = "best"``): not an attack, a bound."""
    flat = sources.flatten(1)
    low, high = flat.min(dim=1, keepdim=True).values, flat.max(dim=1, keepdim=True).values
    scaled = ((flat - low) / (high - low).clamp_min(1e-20)).reshape(sources.shape)
    labels = truth.labels
    first = score_reconstruction(scaled, truth.images, labels, labels)
    order = torch.tensor(first.assignment)
    matched = scaled[order]
    error = (matched - truth.images).square().flatten(1).mean(1)
    flipped = (1 - matched - truth.images).square().flatten(1).mean(1)
    best = torch.where((flipped < error)[:, None, None, None], 1 - matched, matched)
    return score_reconstruction(best, truth.images, labels, labels)


def references(
    attack: CocktailParty,
    observation: Observation,
    truth: GroundTruth,
    rec: Reconstruction,
    seed: int,
) -> tuple[ReconstructionScore, ReconstructionScore]:
    """The authors' evaluation of the attack's sources, and the null's score."""
    _, _, _, weight, bias = attack.first_layer_gradient(observation, seed)
    batch, spec = observation.num_examples, observation.input_spec
    shape = (batch, spec.channels, spec.image_size, spec.image_size)
    projection, _, _ = whiten(weight, batch)
    augmented = torch.cat([weight, bias[:, None]], dim=1)
    sources = unmixed(rec.details["unmixing"], projection, augmented)[:, :-1]
    authors = authors_evaluation(sources.float().reshape(shape), truth)
    rotation = random_rotations(2, batch, seed + 1000)[1]
    null, _ = bias_scaled(unmixed(rotation, projection, augmented))
    images = observation.normalization.to_pixels(null.float().reshape(shape)).clamp(0, 1)
    return authors, score_reconstruction(images, truth.images, truth.labels, truth.labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--domains", nargs="+", default=["digits", "cifar"])
    parser.add_argument("--steps", type=int, default=CocktailPartyParams.steps)
    parser.add_argument("--lr", type=float, default=CocktailPartyParams.lr)
    parser.add_argument("--lambda-ne", type=float, default=CocktailPartyParams.lambda_ne)
    parser.add_argument("--restarts", type=int, default=1)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--box-vertices", action="store_true", help="score box-vertices too")
    args = parser.parse_args()
    torch.set_num_threads(1)
    params = CocktailPartyParams(
        steps=args.steps, lr=args.lr, lambda_ne=args.lambda_ne, restarts=args.restarts
    )
    attack = CocktailParty(params)
    print("domain seed recovered psnr ssim authors-recovered null-recovered steps stalled s")
    for domain in args.domains:
        for seed in args.seeds:
            observation, truth = upload(domain, seed, args.batch)
            start = time.perf_counter()
            rec = attack.reconstruct(observation, seed)
            seconds = time.perf_counter() - start
            score = score_reconstruction(rec.images, truth.images, rec.labels, truth.labels)
            authors, null_score = references(attack, observation, truth, rec, seed)
            n = args.batch
            if args.box_vertices:
                box = BoxVertices(BoxVerticesParams()).reconstruct(observation, seed)
                box_score = score_reconstruction(box.images, truth.images, box.labels, truth.labels)
                print(f"  box-vertices: {box_score.recovered}/{n}, found {box.details['found']}")
            print(
                f"{domain} {seed} {score.recovered}/{n} {score.psnr:.1f} {score.ssim:.2f} "
                f"{authors.recovered}/{n} ({authors.psnr:.1f} dB) {null_score.recovered}/{n} "
                f"({null_score.psnr:.1f} dB) {rec.steps_taken} {rec.converged} {seconds:.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
