"""Soak: a long run's memory and disk stay flat, round after round.

Runs ``scenarios/scale-1000.toml`` at 100 clients, 10 per round, for 500 rounds
with an audit every 10th round (DLG, 5 steps x 1 restart: the audit's records
and Ray tasks, not its strength, are what is measured) and a checkpoint after
every round, in this process. Every ``--sample-every`` rounds, at the round's
end, it samples:

- RSS: the resident memory of this process and all its descendants (Ray's GCS,
  raylet, agents, client actors, audit workers), summed from ``/proc`` (pages
  shared between processes count once per process, so it is an upper bound);
- the Ray object store's bytes in use and objects held (the raylet's store stats);
- the run folder's bytes, and of those the records (``metrics.csv``,
  ``clients.csv``, ``audit.csv``, ``verdict.csv``, ``leaks.csv``,
  ``membership.csv`` and the audit's images) and the checkpoint.

It prints the samples, then growth per 100 rounds from ``--from-round`` to the
end, and writes ``bench/results/soak.json``::

    .venv/bin/python bench/soak.py [--rounds 500] [--clients 100] [--per-round 10]
        [--audit-every 10] [--sample-every 10] [--from-round 50]

Target (issue 29): RSS and object store within 10 % of their round-50 values at
the end; the folder grows by what the records add (each row is written to its
CSV and kept in the checkpoint's state, so twice).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fedsim.outputs.run_folder import (
    AUDIT_FILE,
    AUDIT_IMAGES,
    CHECKPOINT_DIR,
    CLIENTS_FILE,
    LEAKS_FILE,
    MEMBERSHIP_FILE,
    METRICS_FILE,
    VERDICT_FILE,
)

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "scale-1000.toml"
PAGE = os.sysconf("SC_PAGE_SIZE")
RECORDS = (
    METRICS_FILE,
    CLIENTS_FILE,
    AUDIT_FILE,
    VERDICT_FILE,
    LEAKS_FILE,
    MEMBERSHIP_FILE,
    AUDIT_IMAGES,
)
COLUMNS = ("rss", "store", "folder", "records", "checkpoint")


@dataclass
class Sample:
    """What a run holds at the end of one round (bytes, except ``objects`` and times)."""

    round: int
    seconds: float
    rss: int
    store: int
    objects: int
    folder: int
    records: int
    checkpoint: int


def tree_rss(root: int) -> int:
    """Resident bytes of ``root`` and its descendants (see the module docstring)."""
    from fedsim.simulation.procfs import descendants

    total = 0
    for pid in (root, *descendants(root)):
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
        except OSError:  # it ended meanwhile
            continue
    return total


def folder_bytes(path: Path) -> int:
    """Bytes of the file ``path``, or of every file under the folder ``path`` (0 if absent)."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


class StoreStats:
    """The local raylet's object-store use (Ray's internal API: a bench may lean on it)."""

    def __init__(self) -> None:
        import ray
        from ray._private.internal_api import get_state_from_address

        self.state = get_state_from_address(ray.get_runtime_context().gcs_address)

    def __call__(self) -> tuple[int, int]:
        from ray._private.internal_api import get_memory_info_reply

        stats = get_memory_info_reply(self.state).store_stats
        return int(stats.object_store_bytes_used), int(stats.num_local_objects)


class Sampler:
    """Round callback: a :class:`Sample` at round 1 and every ``every``-th round."""

    def __init__(self, run_dir: Path, every: int) -> None:
        self.run_dir = run_dir
        self.every = every
        self.samples: list[Sample] = []
        self.started = time.monotonic()
        self._store: StoreStats | None = None

    def on_round_end(self, record: Any, arrays: Any) -> None:
        if record.round != 1 and record.round % self.every:
            return
        self._store = self._store or StoreStats()
        store, objects = self._store()
        self.samples.append(
            Sample(
                round=record.round,
                seconds=time.monotonic() - self.started,
                rss=tree_rss(os.getpid()),
                store=store,
                objects=objects,
                folder=folder_bytes(self.run_dir),
                records=sum(folder_bytes(self.run_dir / name) for name in RECORDS),
                checkpoint=folder_bytes(self.run_dir / CHECKPOINT_DIR),
            )
        )


def soak(
    run_dir: Path,
    rounds: int = 500,
    clients: int = 100,
    per_round: int = 10,
    audit_every: int = 10,
    sample_every: int = 10,
) -> list[Sample]:
    """Run the soak federation into ``run_dir``; its samples."""
    from rich.console import Console

    from fedsim.core.scenario_file import load_scenario
    from fedsim.simulation.runner import run_scenario

    overrides = [
        f"federation.num-clients={clients}",
        f"federation.clients-per-round={per_round}",
        f"federation.rounds={rounds}",
        "audit.enabled=true",
        f"audit.every={audit_every}",
        "audit.attacks=[{name='dlg', steps=5, restarts=1}]",
    ]
    sampler = Sampler(run_dir, sample_every)
    run_scenario(load_scenario(SCENARIO, overrides), run_dir, Console(quiet=True), (sampler,))
    return sampler.samples


def growth(samples: list[Sample], column: str, from_round: int) -> tuple[float, float]:
    """``column``'s growth per 100 rounds and in % from the first sample at or after
    ``from_round`` to the last."""
    start = next(s for s in samples if s.round >= from_round)
    end = samples[-1]
    first, last = getattr(start, column), getattr(end, column)
    per_100 = (last - first) / max(1, end.round - start.round) * 100
    return per_100, (100 * (last - first) / first if first else float("nan"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--audit-every", type=int, default=10)
    parser.add_argument("--sample-every", type=int, default=10)
    parser.add_argument("--from-round", type=int, default=50)
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        samples = soak(
            Path(tmp) / "run",
            args.rounds,
            args.clients,
            args.per_round,
            args.audit_every,
            args.sample_every,
        )
    mib = 2**20
    print(
        f"{'round':>6} {'s':>7} {'RSS MiB':>8} {'store MiB':>10} {'objects':>8} "
        f"{'folder KiB':>11} {'records KiB':>12} {'checkpoint KiB':>15}"
    )
    for s in samples:
        print(
            f"{s.round:>6} {s.seconds:>7.0f} {s.rss / mib:>8.0f} {s.store / mib:>10.2f} "
            f"{s.objects:>8} {s.folder / 1024:>11.0f} {s.records / 1024:>12.0f} "
            f"{s.checkpoint / 1024:>15.0f}"
        )
    rates = {c: growth(samples, c, args.from_round) for c in COLUMNS}
    print(f"\ngrowth from round {args.from_round} to {samples[-1].round}, per 100 rounds:")
    for column, (per_100, percent) in rates.items():
        print(f"  {column:>10}: {per_100 / 1024:>10.1f} KiB ({percent:+.1f} % over the span)")
    load_after = os.getloadavg()
    print(f"load average (1, 5, 15 min): before {load_before}, after {load_after}")
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    result = {
        "args": vars(args),
        "samples": [asdict(s) for s in samples],
        "growth": rates,
        "load": [load_before, load_after],
    }
    (out / "soak.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
