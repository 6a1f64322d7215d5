"""Membership on the same candidates: loss-drop, gradient-alignment, fedmia, lira-offline.

One round per setting: every client trains from the same sent model (the zoo's
LeNet-5 pre-trained ``--pretrain`` Adam steps on the server's public half, as
``bench/update_leakage.py``) with fedsim's client routine, the server observes each
upload as the audit does, and each client's candidates are drawn as the audit draws
them (:func:`fedsim.audit.candidates.draw_candidates`: up to ``--candidates``
members, each with a held-out non-member of its class). Every analysis reads the
whole round in one ``analyse_many`` call (``fedmia`` reads a client against the
others; ``lira-offline`` trains its shadow pool once), on the same candidates.

Scores are pooled over the round's clients (and ``--repeats`` federation seeds) and
scored by the audit's scorer (:func:`fedsim.core.leak_metrics.score_membership`:
scikit-learn's ROC AUC and ROC curve, 95 % bootstrap intervals): AUC, TPR at 1 % and
0.1 % FPR. The null: the same analysis on candidates whose members are replaced by
other held-out digits of the same class (non-members on both sides): its AUC should
sit near 0.5. Seconds per client on one thread (an analysis's own timing; the shadow
pool shared out over the round's clients)::

    .venv/bin/python bench/membership.py [--settings ...] [--repeats 1] [--out FILE]

``--timing CALLS``: only the cost, each analysis on the demo's round alternated ``CALLS``
times in one process (``--analyses loss-drop fedmia``: what ``fedmia`` adds to ``"auto"``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from update_leakage import client_round, round_of

from fedsim.attacks.base import AttackSetting
from fedsim.attacks.leakage import LEAKS, Candidates, LeakInput, MembershipLeak
from fedsim.audit.candidates import AuditPool, draw_candidates
from fedsim.core.components import resolve
from fedsim.core.config import ComponentConfig
from fedsim.core.leak_metrics import MembershipScore, score_membership

ANALYSES = ("loss-drop", "gradient-alignment", "fedmia", "lira-offline")


def federation(clients: int, size: int) -> dict[str, Any]:
    return {
        "federation.num-clients": clients,
        "federation.clients-per-round": clients,
        "data.samples-per-client": size,
        "data.partitioner": {"name": "iid"},
    }


SETTINGS: dict[str, dict[str, Any]] = {
    "demo: 4 x 800, 2 ep, batch 16": federation(4, 800),
    "8 x 200, 5 ep, batch 16": {**federation(8, 200), "client.local-epochs": 5},
    "8 x 50, 10 ep, batch 8": {
        **federation(8, 50),
        "client.local-epochs": 10,
        "client.batch-size": 8,
    },
    "16 x 25, 30 ep, batch 8": {
        **federation(16, 25),
        "client.local-epochs": 30,
        "client.batch-size": 8,
    },
}


def component(spec: str) -> ComponentConfig:
    """``name`` or ``name:key=value,...`` (a variant's parameters, TOML's spelling)."""
    name, _, rest = spec.partition(":")
    params: dict[str, Any] = {}
    for pair in filter(None, rest.split(",")):
        key, _, value = pair.partition("=")
        params[key] = int(value) if value.isdigit() else value
    return ComponentConfig(name, params)


def null_candidates(
    candidates: Candidates, members: torch.Tensor, pool: AuditPool, seed: int
) -> Candidates:
    """``candidates`` with each member replaced by a held-out non-member of its class that
    is not among the candidates already (non-members on both sides)."""
    rng = np.random.default_rng(seed)
    outside = pool.non_members
    used = {bytes(x.numpy().tobytes()) for x in candidates.images[~members]}
    free = {
        c: [
            i
            for i in rng.permutation(np.flatnonzero(outside.labels.numpy() == c))
            if bytes(outside.images[i].numpy().tobytes()) not in used
        ]
        for c in range(int(outside.labels.max()) + 1)
    }
    images = candidates.images.clone()
    for at in np.flatnonzero(members.numpy()):
        images[at] = outside.images[free[int(candidates.labels[at])].pop()]
    return Candidates(images, candidates.labels)


def one_round(label: str, change: dict[str, Any], args: argparse.Namespace, seed: int) -> dict:
    """Each analysis's scores on the real and the null candidates, pooled over the round."""
    setup = round_of({**change, "federation.seed": seed}, args.pretrain)
    scenario, bundle, pool, view = setup.scenario, setup.bundle, setup.pool, setup.view
    sent, config, replay = setup.sent, setup.config, setup.replay
    setting = dataclasses.replace(AttackSetting.of(scenario, None), audited=True)
    real, null, truths, trainings = [], [], [], []
    for partition in range(scenario.federation.num_clients):
        seen = client_round(scenario, partition, sent, config, view)
        assert seen is not None
        intercepted, observation, seconds = seen
        trainings.append(seconds)
        trained = replay.update_batch(partition, 1, intercepted.replies[0].config)
        candidates, members = draw_candidates(
            trained, pool, args.candidates, bundle.normalization, seed, 1, partition
        )
        real.append(LeakInput(observation, pool.public, candidates))
        fake = null_candidates(candidates, members, pool, 1000 * seed + partition)
        null.append(LeakInput(observation, pool.public, fake))
        truths.append(members)
    out: dict[str, Any] = {"train": statistics.median(trainings), "truth": torch.cat(truths)}
    for name in args.analyses:
        analysis = resolve(LEAKS, component(name), name)
        analysis.cls.check_setting(setting, name)
        runner = analysis.create(device="cpu")
        leaks = runner.analyse_many(real, seed=seed)
        nulls = analysis.create(device="cpu").analyse_many(null, seed=seed)
        assert all(isinstance(leak, MembershipLeak) for leak in leaks + nulls)
        out[name] = (
            torch.cat([leak.scores for leak in leaks]),  # type: ignore[union-attr]
            torch.cat([leak.scores for leak in nulls]),  # type: ignore[union-attr]
            statistics.median(leak.seconds for leak in leaks),
        )
    print(f"  {label} seed {seed}: done (load {os.getloadavg()[0]:.2f})", flush=True)
    return out


def timing(calls: int, args: argparse.Namespace) -> None:
    """``--timing``: each analysis on the demo's round, alternated ``calls`` times in one
    process (the same load for all), seconds a client: what it would add to a run."""
    setup = round_of(SETTINGS["demo: 4 x 800, 2 ep, batch 16"], args.pretrain)
    inputs = []
    for partition in range(setup.scenario.federation.num_clients):
        seen = client_round(setup.scenario, partition, setup.sent, setup.config, setup.view)
        assert seen is not None
        trained = setup.replay.update_batch(partition, 1, seen[0].replies[0].config)
        candidates, _ = draw_candidates(
            trained, setup.pool, args.candidates, setup.bundle.normalization, 0, 1, partition
        )
        inputs.append(LeakInput(seen[1], setup.pool.public, candidates))
    times: dict[str, list[float]] = {name: [] for name in args.analyses}
    for _ in range(calls):
        for name in times:
            runner = resolve(LEAKS, component(name), name).create(device="cpu")
            started = time.perf_counter()
            runner.analyse_many(inputs, seed=0)
            times[name].append((time.perf_counter() - started) / len(inputs))
    for name, got in times.items():
        print(
            f"{name}: {statistics.median(got):.4f} s a client (median of {calls}; "
            f"{', '.join(f'{t:.4f}' for t in got)}), load {os.getloadavg()[0]:.2f}"
        )


def cell(score: MembershipScore) -> tuple[str, str, str]:
    auc, one, tenth = score.auc, score.tpr_at[0.01], score.tpr_at[0.001]
    return (
        f"{auc.value:.3f} [{auc.low:.2f}, {auc.high:.2f}]",
        f"{one.value:.3f} [{one.low:.2f}, {one.high:.2f}]",
        f"{tenth.value:.3f} [{tenth.low:.2f}, {tenth.high:.2f}]",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pretrain", type=int, default=300, help="public Adam steps before")
    parser.add_argument("--candidates", type=int, default=100, help="members per client")
    parser.add_argument("--repeats", type=int, default=1, help="federation seeds pooled")
    parser.add_argument(
        "--analyses", nargs="*", default=list(ANALYSES), help="names, or name:key=value,..."
    )
    parser.add_argument("--settings", nargs="*", default=None, help="setting labels to run")
    parser.add_argument("--out", default="", help="also write the table to this markdown file")
    parser.add_argument("--timing", type=int, default=0, help="CALLS: cost on the demo only")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.timing:
        timing(args.timing, args)
        return
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    print(f"commit {commit}; load {os.getloadavg()[0]:.2f} at start; one thread", flush=True)
    lines = [
        "| setting | analysis | candidates | AUC | TPR at 1 % FPR | TPR at 0.1 % FPR "
        "| null AUC | s/client |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, change in SETTINGS.items():
        if args.settings and label not in args.settings:
            continue
        rounds = [one_round(label, change, args, seed) for seed in range(args.repeats)]
        truth = torch.cat([r["truth"] for r in rounds])
        train = statistics.median(r["train"] for r in rounds)
        for name in args.analyses:
            scores = torch.cat([r[name][0] for r in rounds])
            nulls = torch.cat([r[name][1] for r in rounds])
            seconds = statistics.median(r[name][2] for r in rounds)
            auc, one, tenth = cell(score_membership(scores, truth, 0))
            null = score_membership(nulls, truth, 0).auc
            lines.append(
                f"| {label} | {name} | {len(truth)} | {auc} | {one} | {tenth} | "
                f"{null.value:.3f} [{null.low:.2f}, {null.high:.2f}] | {seconds:.3f} |"
            )
            print(lines[-1], flush=True)
        print(f"  {label}: client training {train:.2f} s (median)", flush=True)
    print(f"load {os.getloadavg()[0]:.2f} at end", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
