"""Exposure rises with repetitions: Carlini et al.'s canaries in a Shakespeare-words federation.

The ``shakespeare`` scenario's federation in process (``shakespeare-words``, 8 speaking roles
of ``--windows`` windows as clients, the small causal transformer, FedAvg of the real FedAvg
client routine, 2 local epochs of Adam at 3e-3, batch 16) with ``[memorisation]`` planting one
canary ("my pin is" and 4 digits, |R| = 10,000) in each of five clients, ``--repetitions`` times
(1, 2, 5, 10, 20 by default), and ``--references`` canaries never planted (repetition 0: their
median stands for it). Which client plants which count turns with the seed, so a count is not
one role's. After ``--rounds`` rounds the global model's exposure of each canary (the skew-normal
estimate over 1,000 random secrets, as the scenario measures it) is printed per seed, with the
median over seeds, as a markdown table; ``--out`` writes it too. One process, one thread::

    .venv/bin/python bench/text_exposure.py [--seeds 0 1 2] [--rounds 6] [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from fedsim.clients import CLIENT_ROUTINES
from fedsim.clients.base import ClientEnv, ClientSpec
from fedsim.core import protocol
from fedsim.core.config import ClientConfig, ComponentConfig, DataConfig, ModelConfig
from fedsim.core.data import load_dataset
from fedsim.core.memorisation import MemorisationConfig
from fedsim.core.modality import input_spec
from fedsim.core.models import build_model
from fedsim.core.training import client_config_record
from fedsim.text.canaries import PlantedCanaries

CLIENTS = 8
TRANSFORMER = ModelConfig(name="word-transformer")
CFG = ClientConfig(local_epochs=2, batch_size=16, optimizer="adam", lr=0.003)


def one_seed(
    seed: int, repetitions: tuple[int, ...], references: int, rounds: int, windows: int
) -> dict[int, float]:
    """Exposure after ``rounds`` rounds per repetition count (0: the references' median)."""
    data = DataConfig(
        dataset="shakespeare-words",
        partitioner=ComponentConfig("groups", {"order": "largest"}),
        samples_per_client=windows,
        test_fraction=0.1,
    )
    turned = repetitions[seed % len(repetitions) :] + repetitions[: seed % len(repetitions)]
    memorisation = MemorisationConfig(
        enabled=True,
        digits=4,
        clients=tuple(range(len(turned))),
        repetitions=turned,
        references=references,
        seed=seed,
    )
    spec = ClientSpec(TRANSFORMER, data, num_clients=CLIENTS, seed=seed, memorisation=memorisation)
    envs = [ClientEnv.create(spec, c, RecordDict()) for c in range(CLIENTS)]
    bundle = load_dataset(data)
    canaries = PlantedCanaries.of(memorisation, bundle.vocabulary)
    model = build_model(TRANSFORMER, input_spec(bundle), seed=seed)
    routine = CLIENT_ROUTINES.get("fedavg")()
    for server_round in range(1, rounds + 1):
        sent = ArrayRecord({k: v.detach().clone() for k, v in model.state_dict().items()})
        config = ConfigRecord({**client_config_record(CFG), protocol.SERVER_ROUND: server_round})
        replies = []
        for env in envs:
            reply, metrics = routine.train(env, sent, config)
            replies.append((reply.to_torch_state_dict(), int(metrics[protocol.NUM_EXAMPLES])))
        total = sum(n for _, n in replies)
        model.load_state_dict(
            {k: sum(r[k] * (n / total) for r, n in replies) for k in replies[0][0]}
        )
    found = canaries.measure(model)
    by_count = {
        count: found[f"exposure-client{client}-x{count}"]
        for client, count in zip(memorisation.clients, turned, strict=True)
    }
    never = [found[f"exposure-reference{i}"] for i in range(references)]
    return {0: statistics.median(never), **by_count}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--repetitions", type=int, nargs="+", default=[1, 2, 5, 10, 20])
    parser.add_argument("--references", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--windows", type=int, default=128)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if len(args.repetitions) > CLIENTS:
        parser.error(f"at most {CLIENTS} repetition counts (one planting client each)")
    torch.set_num_threads(1)
    rows: dict[int, dict[int, float]] = {}
    for seed in args.seeds:
        started = time.perf_counter()
        rows[seed] = one_seed(
            seed, tuple(args.repetitions), args.references, args.rounds, args.windows
        )
        print(f"seed {seed}: {time.perf_counter() - started:.0f} s", flush=True)
    counts = [0, *args.repetitions]
    lines = [
        "| repetitions | " + " | ".join(f"seed {s}" for s in args.seeds) + " | median |",
        "|---" * (len(args.seeds) + 2) + "|",
    ]
    for count in counts:
        values = [rows[s][count] for s in args.seeds]
        name = f"0 (never; median of {args.references})" if count == 0 else str(count)
        cells = " | ".join(f"{v:.1f}" for v in values)
        lines.append(f"| {name} | {cells} | {statistics.median(values):.1f} |")
    table = "\n".join(lines)
    print(table)
    if args.out is not None:
        args.out.write_text(table + "\n")


if __name__ == "__main__":
    main()
