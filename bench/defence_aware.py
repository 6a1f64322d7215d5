"""Plain against defence-aware gradient matching under ``soteria``, ``prune`` and ``quantize``.

The setting of docs/defences.md's Soteria numbers: LeNet-Zhu with weights U(-0.5, 0.5)
(model seed ``s``) probed on one real 28x28 digit of embedded MNIST (test digit ``s``),
batch 1. Each defence acts on the probed gradient as a client's would (``soteria`` at
share 0.6, ``prune`` at 0.9 per tensor, ``quantize`` at 4 bits by default); the plain
attack (``dlg``, or ``inverting-gradients`` with ``--ig``) and its defence-aware variant
(:mod:`fedsim.attacks.reconstruction.defence_aware`, given the defence's parameters as
``"auto"`` gives them) attack the same defended gradient with the same dummies. Prints PSNR
per seed, seconds, the machine's load and the commit. One thread::

    PYTHONPATH=. .venv/bin/python bench/defence_aware.py --seeds 0 1 2 --steps 100
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import time
from typing import Any

import numpy as np
import torch

from fedsim.attacks import create_attack
from fedsim.attacks.reconstruction.defence_aware import defence_model
from fedsim.audit.experiment import Probe, gradient_probe
from fedsim.clients.defences import DEFENCES, ProbeContext
from fedsim.core.config import ComponentConfig, DataConfig, ModelConfig
from fedsim.core.data import load_dataset
from fedsim.core.metrics import score_reconstruction
from fedsim.core.models import InputSpec, build_model

SIZE = 28
SPEC = InputSpec(1, SIZE, 10)
MODEL = ModelConfig("lenet-zhu", "uniform")
DEFENCES_MEASURED = {
    "soteria": ComponentConfig("soteria", {"share": 0.6}),
    "prune": ComponentConfig("prune", {"share": 0.9}),
    "quantize": ComponentConfig("quantize", {"bits": 4}),
}


def probe(seed: int) -> tuple[Probe, Any, torch.Tensor]:
    """The clean probe of test digit ``seed`` at LeNet-Zhu seeded ``seed``."""
    data = load_dataset(DataConfig(dataset="mnist-embedded", image_size=SIZE))
    model = build_model(MODEL, SPEC, seed=seed)
    x, y = data.test_images[seed : seed + 1], data.test_labels[seed : seed + 1]
    return gradient_probe(model, MODEL, SPEC, x, y, data.normalization), model, x


def defended(found: Probe, model: Any, x: torch.Tensor, defence: ComponentConfig) -> Probe:
    """``found`` with its gradient passed through ``defence``, as the client would."""
    cls = DEFENCES.get(defence.name)
    params = cls.Params(**{k.replace("-", "_"): v for k, v in defence.params.items()})
    rng = np.random.default_rng(0)
    shared = cls(params).protect_gradient(found.observation.shared, 1, rng, ProbeContext(model, x))
    return dataclasses.replace(
        found, observation=dataclasses.replace(found.observation, shared=shared)
    )


def psnr(attack_name: str, params: dict[str, Any], found: Probe) -> tuple[float, float]:
    attack = create_attack(attack_name, params)
    start = time.perf_counter()
    rec = attack.reconstruct_many([found.observation], seed=0)[0]
    seconds = time.perf_counter() - start
    truth = found.truth
    return score_reconstruction(rec.images, truth.images, rec.labels, truth.labels).psnr, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--restarts", type=int, default=2)
    parser.add_argument("--ig", action="store_true", help="Inverting Gradients, not DLG")
    parser.add_argument(
        "--defences", nargs="+", default=list(DEFENCES_MEASURED), choices=list(DEFENCES_MEASURED)
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    plain = "inverting-gradients" if args.ig else "dlg"
    aware = "ig-defence-aware" if args.ig else "dlg-defence-aware"
    base: dict[str, Any] = {"steps": args.steps, "restarts": args.restarts}
    if not args.ig:
        base |= {"labels": "infer", "dummy-init": "uniform"}
    print(f"commit {commit}, load {os.getloadavg()}, {plain} {args.steps} x {args.restarts}")
    probes = {seed: probe(seed) for seed in args.seeds}
    clean = [psnr(plain, base, probes[s][0]) for s in args.seeds]
    print(f"none      {plain:20s} " + " / ".join(f"{p:.1f}" for p, _ in clean))
    for name in args.defences:
        defence = DEFENCES_MEASURED[name]
        model = defence_model([defence])
        assert model is not None
        known = {k: v for k, v in dataclasses.asdict(model).items()}
        rows: dict[str, list[tuple[float, float]]] = {plain: [], aware: []}
        for seed in args.seeds:
            found, net, x = probes[seed]
            attacked = defended(found, net, x, defence)
            rows[plain].append(psnr(plain, base, attacked))
            rows[aware].append(psnr(aware, base | known, attacked))
        for attack, found_rows in rows.items():
            values = " / ".join(f"{p:.1f}" for p, _ in found_rows)
            seconds = sum(s for _, s in found_rows) / len(found_rows)
            print(f"{name:9s} {attack:20s} {values} dB  ({seconds:.1f} s per image)")
    print(f"load after {os.getloadavg()}")


if __name__ == "__main__":
    main()
