"""What a real update leaks beyond reconstruction: each leak analysis per setting, and its cost.

A setting is one federation's clients and their local training; from a base
(Dirichlet 0.3 label skew, 200 images a client, 2 local epochs of Adam lr 3e-3,
batch 16, a model pre-trained ``--pretrain`` steps on the server's public data,
no defence) one factor changes at a time: the label skew (IID, Dirichlet 0.1),
the client's size (50, 800 images), the epochs (1, 5), the optimiser (SGD lr
0.05), the model (untrained), a defence (``gaussian`` sigma 0.01 on the upload,
``dp-sgd`` noise 1.0 clip 1.0).

Each client trains as in a run: fedsim's client routine with the scenario's
defences (:func:`fedsim.clients.defences.train_defended`), from the sent model;
the server's observation is built as the audit builds it
(:mod:`fedsim.audit.observe`), each registered leak analysis
(:data:`fedsim.attacks.leakage.LEAKS`, or ``--analyses``) reads it with the
public half of the held-out split and, for membership, candidates drawn as the
audit draws them; the scorer is the audit's. Per setting and analysis: the
median over ``--clients`` clients of its score (labels: TV distance, with the
uniform guess's; membership: AUC and TPR at 1 % FPR; representatives: SSIM to
the class mean) and its seconds per client on one thread::

    .venv/bin/python bench/update_leakage.py [--clients 6] [--pretrain 300] [--out FILE]

``--overhead PAIRS``: what labels and membership on every client every round cost a
run. The quickstart (4 clients x 800 images, 2 epochs of Adam, 5 rounds) unaudited
and with its audit cut to the labels and membership analyses of ``"auto"`` (no
reconstruction, no probe), run alternately ``PAIRS`` times; the wall time of each
and the median ratio audited / unaudited::

    .venv/bin/python bench/update_leakage.py --overhead 5

``--with NAME ...`` adds a third way: that audit with the named analyses added, and its
median ratio to the audit without them (what adding them to ``"auto"`` would cost)::

    .venv/bin/python bench/update_leakage.py --overhead 3 --with fedmia
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fedsim.attacks.base import AttackSetting, Observation
from fedsim.attacks.leakage import LEAKS, LeakInput
from fedsim.audit.candidates import AuditPool, draw_candidates
from fedsim.audit.leak_scoring import LeakTruth, score_leak
from fedsim.audit.observe import InterceptedRound, ServerView, intercept
from fedsim.clients import CLIENT_ROUTINES
from fedsim.clients.base import ClientEnv
from fedsim.clients.defences import train_defended
from fedsim.clients.replay import ClientReplay
from fedsim.core.components import resolve
from fedsim.core.config import ComponentConfig, Scenario, ScenarioError
from fedsim.core.data import DatasetBundle, load_dataset
from fedsim.core.models import InputSpec
from fedsim.core.scenario_file import scenario_from_dict
from fedsim.core.training import client_config_record, train_local
from fedsim.scenario.components import client_spec
from fedsim.simulation.flower import message_context

BASE: dict[str, Any] = {
    "name": "update-leakage",
    "federation": {"num-clients": 16, "clients-per-round": 16, "rounds": 1, "seed": 0},
    "data": {
        "dataset": "mnist-embedded",
        "normalize": True,
        "samples-per-client": 200,
        "partitioner": {"name": "dirichlet", "alpha": 0.3},
    },
    "model": {"name": "lenet5-split"},
    "strategy": {"name": "fedavg"},
    "client": {"local-epochs": 2, "batch-size": 16, "optimizer": "adam", "lr": 0.003},
}
CHANGES: dict[str, dict[str, Any]] = {
    "base (Dir 0.3, 200 img, 2 ep, Adam, trained)": {},
    "IID": {"data.partitioner": {"name": "iid"}},
    "Dirichlet 0.1": {"data.partitioner": {"name": "dirichlet", "alpha": 0.1}},
    "50 images": {"data.samples-per-client": 50},
    "800 images": {
        "data.samples-per-client": 800,
        "federation.num-clients": 4,
        "federation.clients-per-round": 4,
    },
    "1 epoch": {"client.local-epochs": 1},
    "5 epochs": {"client.local-epochs": 5},
    "SGD lr 0.05": {"client.optimizer": "sgd", "client.lr": 0.05},
    "untrained model": {"pretrain": 0},
    "gaussian 0.01": {"defences": [{"name": "gaussian", "sigma": 0.01}]},
    "dp-sgd 1.0": {"defences": [{"name": "dp-sgd", "noise-multiplier": 1.0, "max-grad-norm": 1.0}]},
}


def scenario_for(change: dict[str, Any]) -> Scenario:
    table: dict[str, Any] = {k: dict(v) if isinstance(v, dict) else v for k, v in BASE.items()}
    for key, value in change.items():
        if key == "pretrain":
            continue
        if "." not in key:
            table[key] = value
            continue
        section, name = key.split(".")
        table[section] = {**table[section], name: value}
    return scenario_from_dict(table)


def sent_model(scenario: Scenario, steps: int) -> dict[str, torch.Tensor]:
    """The global model: the zoo's init, trained ``steps`` Adam steps on the public half."""
    env = ClientEnv.create(client_spec(scenario), 0, RecordDict())
    model = env.model()
    if steps:
        bundle = load_dataset(scenario.data)
        pool = AuditPool.split(bundle.test_images, bundle.test_labels, seed=0)
        cfg = dataclasses.replace(scenario.client, optimizer="adam", lr=1e-3, local_steps=steps)
        train_local(model, pool.public.images, pool.public.labels, cfg, seed=12345)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def client_round(
    scenario: Scenario, partition: int, sent: ArrayRecord, config: ConfigRecord, view: ServerView
) -> tuple[InterceptedRound, Observation, float] | None:
    """Client ``partition``'s round-1 training from ``sent`` as a run does it (fedsim's
    FedAvg routine, the scenario's defences), intercepted and observed as the audit does;
    with its training's seconds. ``None`` for a client of fewer than 2 examples."""
    env = ClientEnv.create(client_spec(scenario), partition, RecordDict())
    if len(env.split.train) < 2:
        return None
    started = time.perf_counter()
    arrays, metrics = train_defended(CLIENT_ROUTINES.get("fedavg")(), env, sent, config)
    seconds = time.perf_counter() - started
    with message_context():
        reply = Message(
            RecordDict(
                {
                    "arrays": arrays,
                    "metrics": MetricRecord({**metrics, "partition-id": partition}),
                }
            ),
            dst_node_id=0,
            message_type="train",
        )
    intercepted = intercept(1, sent, config, [reply])
    return intercepted, view.observe(intercepted, intercepted.replies[0], "update"), seconds


@dataclasses.dataclass(frozen=True)
class Round:
    """One setting's round 1: its scenario, data, the audit's pool and view, what is sent."""

    scenario: Scenario
    bundle: DatasetBundle
    pool: AuditPool
    view: ServerView
    sent: ArrayRecord
    config: ConfigRecord
    replay: ClientReplay


def round_of(change: dict[str, Any], pretrain: int) -> Round:
    """The setting ``change`` makes of the base, at a model pre-trained ``pretrain`` steps."""
    scenario = scenario_for(change)
    bundle = load_dataset(scenario.data)
    pool = AuditPool.split(bundle.test_images, bundle.test_labels, seed=0)
    view = ServerView(
        scenario.model,
        InputSpec(bundle.channels, bundle.image_size, bundle.num_classes),
        bundle.normalization,
        "fedavg",
    )
    sent = ArrayRecord(sent_model(scenario, pretrain))
    config = ConfigRecord({**client_config_record(scenario.client), "server-round": 1})
    replay = ClientReplay(client_spec(scenario), "fedavg", None)
    return Round(scenario, bundle, pool, view, sent, config, replay)


def measure(label: str, change: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    setup = round_of(change, int(change.get("pretrain", args.pretrain)))
    scenario, bundle, pool, view = setup.scenario, setup.bundle, setup.pool, setup.view
    sent, config, replay = setup.sent, setup.config, setup.replay
    names = args.analyses or [n for n in LEAKS.names() if LEAKS.get(n).in_auto]
    setting = dataclasses.replace(AttackSetting.of(scenario, None), audited=True)
    analyses = []
    for name in names:
        analysis = resolve(LEAKS, ComponentConfig(name, {}), name)
        try:
            analysis.cls.check_setting(setting, name)
        except ScenarioError:
            continue  # does not apply to this setting (as "auto" leaves it out)
        analyses.append(analysis)
    scores: dict[str, list[tuple[float, float, float]]] = {n: [] for n in names}
    for partition in range(min(args.clients, scenario.federation.num_clients)):
        seen = client_round(scenario, partition, sent, config, view)
        if seen is None:
            continue
        intercepted, observation, _ = seen
        trained = replay.update_batch(partition, 1, intercepted.replies[0].config)
        for analysis in analyses:
            candidates, members, count = None, None, 0
            if analysis.cls.needs_candidates:
                candidates, members = draw_candidates(
                    trained, pool, 100, bundle.normalization, 0, 1, partition
                )
                count = len(candidates)
            inputs = LeakInput(observation, pool.public, candidates)
            started = time.perf_counter()
            leak = analysis.create(device="cpu").analyse(inputs, seed=partition)
            seconds = time.perf_counter() - started
            record = score_leak(
                analysis, analysis.name, observation, leak, LeakTruth(trained, members), 0, count
            )
            value, second = {
                "labels": (record.label_tv, record.label_tv_uniform),
                "membership": (record.membership_auc, record.membership_tpr_1pct),
                "representatives": (record.representatives_ssim, record.representatives_cosine),
            }[analysis.cls.kind]
            scores[analysis.name].append((value, second, seconds))
    rows = []
    for analysis in analyses:
        got = scores[analysis.name]
        if not got:
            continue
        rows.append(
            {
                "setting": label,
                "analysis": analysis.name,
                "kind": analysis.cls.kind,
                "clients": len(got),
                "score": statistics.median(g[0] for g in got),
                "second": statistics.median(g[1] for g in got),
                "seconds": statistics.median(g[2] for g in got),
            }
        )
    return rows


COLUMNS = {
    "labels": ("TV (median)", "uniform guess's TV"),
    "membership": ("AUC (median)", "TPR at 1 % FPR"),
    "representatives": ("SSIM to class mean", "feature cosine"),
}


def overhead(pairs: int, extra: list[str] | None = None) -> None:
    """Alternate the unaudited and the labels-and-membership-audited quickstart (and, with
    ``extra`` analyses, the same audit with them added: a third way)."""
    import tempfile
    from pathlib import Path

    from rich.console import Console

    from fedsim.core.scenario_file import load_scenario
    from fedsim.scenario.validate import check_components
    from fedsim.simulation.runner import run_scenario

    quickstart = Path(__file__).resolve().parents[1] / "scenarios" / "quickstart.toml"
    # The labels and membership analyses "auto" runs on the quickstart (those that apply).
    plan = check_components(load_scenario(quickstart)).audit
    names = [a.name for a in plan.leaks if a.cls.kind in ("labels", "membership")]
    leaks = "[" + ", ".join(f"{{name='{n}'}}" for n in names) + "]"
    ways = {
        "unaudited": ["audit.enabled=false"],
        "labels+membership": ["audit.attacks=[]", f"audit.leaks={leaks}", "audit.probe-rounds=[]"],
    }
    if extra:
        more = "[" + ", ".join(f"{{name='{n}'}}" for n in [*names, *extra]) + "]"
        ways["+" + "+".join(extra)] = [
            "audit.attacks=[]",
            f"audit.leaks={more}",
            "audit.probe-rounds=[]",
        ]
    walls: dict[str, list[float]] = {way: [] for way in ways}
    quiet = Console(quiet=True)
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(pairs):
            for way, overrides in ways.items():
                started = time.perf_counter()
                run_scenario(
                    load_scenario(quickstart, overrides), Path(tmp) / f"{way}-{pair}", quiet
                )
                walls[way].append(time.perf_counter() - started)
                print(
                    f"pair {pair + 1} {way}: {walls[way][-1]:.1f} s (load {os.getloadavg()[0]:.2f})"
                )
    if extra:
        added = walls["+" + "+".join(extra)]
        plus = [a / b for a, b in zip(added, walls["labels+membership"], strict=True)]
        print(
            f"with {', '.join(extra)}: median {statistics.median(added):.1f} s; ratio to the "
            f"audit without {statistics.median(plus):.3f} ({', '.join(f'{r:.3f}' for r in plus)})"
        )
    ratios = [a / b for a, b in zip(walls["labels+membership"], walls["unaudited"], strict=True)]
    print(f"analyses: {', '.join(names)}")
    print(
        f"wall: unaudited median {statistics.median(walls['unaudited']):.1f} s, audited "
        f"{statistics.median(walls['labels+membership']):.1f} s; ratio median "
        f"{statistics.median(ratios):.3f} (each pair: {', '.join(f'{r:.3f}' for r in ratios)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=6, help="clients per setting")
    parser.add_argument("--pretrain", type=int, default=300, help="public Adam steps before")
    parser.add_argument("--analyses", nargs="*", default=None, help="LEAKS names (default: auto)")
    parser.add_argument("--settings", nargs="*", default=None, help="setting labels to run")
    parser.add_argument("--out", default="", help="also write the table to this markdown file")
    parser.add_argument("--overhead", type=int, default=0, help="PAIRS: the cost in a run")
    parser.add_argument("--with", dest="extra", nargs="*", default=None, help="--overhead: add")
    args = parser.parse_args()
    if args.overhead:
        overhead(args.overhead, args.extra)
        return
    torch.set_num_threads(1)
    print(f"load: {os.getloadavg()[0]:.2f}; one thread; {args.clients} clients a setting")
    lines = [
        "| setting | analysis | kind | clients | score | beside | s/client |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, change in CHANGES.items():
        if args.settings and label not in args.settings:
            continue
        for row in measure(label, change, args):
            first, second = COLUMNS[row["kind"]]
            lines.append(
                f"| {row['setting']} | {row['analysis']} | {row['kind']} | {row['clients']} | "
                f"{first} {row['score']:.3f} | {second} {row['second']:.3f} | "
                f"{row['seconds']:.3f} |"
            )
            print(lines[-1], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
