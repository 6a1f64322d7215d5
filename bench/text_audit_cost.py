"""What the text audit costs the shipped ``shakespeare`` scenario: alternated pairs.

Each pair runs ``fedsim run shakespeare`` twice in fresh processes, audited (its audit
and ``[memorisation]`` as shipped) and unaudited (``audit.enabled = false``,
``memorisation.enabled = false``), the order swapped every pair so that a drift of the
machine's load falls on both; it prints each run's wall time, the load before it and the
median of the pairs' ratios. Check ``uptime`` first: a ratio measured beside other heavy
jobs is not a result.

Usage: ``.venv/bin/python bench/text_audit_cost.py [--pairs 5] [--out /tmp/text-cost]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

AUDITED: list[str] = []
UNAUDITED = ["--set", "audit.enabled=false", "--set", "memorisation.enabled=false"]


def one_run(out: Path, extra: list[str]) -> tuple[float, str]:
    """Wall seconds of one ``fedsim run shakespeare`` (a fresh process) and the load before."""
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    command = [sys.executable, "-m", "fedsim.cli", "run", "shakespeare", "--out", str(out)]
    started = time.perf_counter()
    subprocess.run([*command, "--force", *extra], check=True, capture_output=True)
    return time.perf_counter() - started, load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("/tmp/text-audit-cost"))
    args = parser.parse_args()
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    print("| pair | audited s | unaudited s | ratio | load before (audited / unaudited) |")
    print("|---|---|---|---|---|")
    ratios = []
    for pair in range(1, args.pairs + 1):
        modes = [("audited", AUDITED), ("unaudited", UNAUDITED)]
        if pair % 2 == 0:
            modes.reverse()
        walls = {m: one_run(args.out / f"pair-{pair}-{m}", extra) for m, extra in modes}
        ratio = walls["audited"][0] / walls["unaudited"][0]
        ratios.append(ratio)
        print(
            f"| {pair} | {walls['audited'][0]:.1f} | {walls['unaudited'][0]:.1f} | "
            f"{ratio:.3f} | {walls['audited'][1]} / {walls['unaudited'][1]} |",
            flush=True,
        )
    print(f"\nmedian ratio over {len(ratios)} pairs: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
