"""Time per round and peak memory at 1,000, 10,000 and 100,000 simulated clients.

Runs ``scenarios/scale-100k.toml`` (generated data, 100 clients sampled and 100
evaluated per round) with ``federation.num-clients`` set to each size, one child
process per size, and samples the resident memory of the child's whole process
tree (the server, Ray's GCS and raylet, the client actors) every 0.1 s from
``/proc``. The server's CPU seconds per round (all its threads: the round loop
and Flower's simulation engine) show what the clients that exist cost when they
are not sampled; "register" is Flower's registration of the simulated nodes
(one per client, before any round), "discover" fedsim's wait for them plus the
actors' warm-up. Prints a table with the ratios to the smallest size and
writes ``bench/results/<scenario>.json``::

    .venv/bin/python bench/scale.py [--clients 1000 10000 100000] [--rounds 6]

Round 1 is reported apart: it includes the first training in each actor.
``--scenario scenarios/scale-1000.toml --clients 10 100 1000`` measures the
stored-data scenario as before.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "scale-100k.toml"
PAGE = os.sysconf("SC_PAGE_SIZE")


def tree_rss(root: int) -> int:
    """Resident bytes of ``root`` and all its descendants (Linux ``/proc``)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            statm = Path(entry.path, "statm").read_text()
        except OSError:  # the process ended meanwhile
            continue
        pid = int(entry.name)
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(pid)
        rss[pid] = int(statm.split()[1]) * PAGE
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total


def measure(scenario: Path, num_clients: int, rounds: int) -> dict[str, float]:
    """Run one size in a child process; its timings plus the tree's peak memory."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        args = [sys.executable, __file__, "--scenario", str(scenario)]
        args += ["--child", str(num_clients), str(rounds), str(report)]
        child = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL)
        peak = 0
        stop = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not stop.is_set():
                peak = max(peak, tree_rss(child.pid))
                stop.wait(0.1)

        sampler = threading.Thread(target=sample)
        sampler.start()
        child.wait()
        stop.set()
        sampler.join()
        if child.returncode != 0:
            raise RuntimeError(f"{num_clients} clients: the run failed ({child.returncode})")
        result = json.loads(report.read_text())
    result["peak_tree_mib"] = peak / 2**20
    return result


class _CpuPerRound:
    """Round callback: the server process's CPU time at the end of every round."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_round_end(self, record: object, arrays: object) -> None:
        self.ends.append(time.process_time())


def _timed(module: Any, name: str, timings: dict[str, float], key: str) -> None:
    """Replace ``module.name`` by itself adding its wall seconds to ``timings[key]``."""
    original = getattr(module, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            timings[key] = timings.get(key, 0.0) + time.perf_counter() - started

    setattr(module, name, timed)


def child(scenario_path: Path, num_clients: int, rounds: int, report: Path) -> None:
    """One run, timing Flower's node registration and the discovery; writes ``report``."""
    import pandas as pd
    from flwr.server.superlink.fleet.vce import vce_api
    from rich.console import Console

    import fedsim.simulation.runner as runner
    from fedsim.core.scenario_file import load_scenario
    from fedsim.simulation.runner import run_scenario

    timings: dict[str, float] = {}
    _timed(runner, "discover_partitions", timings, "discovery_s")
    # Flower's simulation: a node in its link state, and a context, per client.
    _timed(vce_api, "_register_nodes", timings, "register_s")
    _timed(vce_api, "_register_node_info_stores", timings, "register_s")
    overrides = [f"federation.num-clients={num_clients}", f"federation.rounds={rounds}"]
    scenario = load_scenario(scenario_path, overrides)
    cpu = _CpuPerRound()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        result = run_scenario(scenario, Path(out) / "run", Console(quiet=True), (cpu,))
        seconds = pd.DataFrame(result.rounds)["seconds"].tolist()
    timings["wall_s"] = time.perf_counter() - started
    timings["round1_s"] = seconds[0]
    timings["round_s"] = statistics.median(seconds[1:])
    timings["server_cpu_s"] = statistics.median(b - a for a, b in pairwise(cpu.ends))
    timings["server_peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    report.write_text(json.dumps(timings))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--scenario", type=Path, default=SCENARIO)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.scenario, int(args.child[0]), int(args.child[1]), Path(args.child[2]))
        return
    print(f"{args.scenario.name}, {args.rounds} rounds; load average {os.getloadavg()}")
    rows = {n: measure(args.scenario, n, args.rounds) for n in args.clients}
    print(
        f"{'clients':>8} {'s/round':>8} {'cpu s/round':>12} {'round 1':>8} {'register':>9} "
        f"{'discover':>9} {'wall s':>7} {'peak MiB (all)':>15} {'server MiB':>11}"
    )
    for n, r in rows.items():
        print(
            f"{n:>8} {r['round_s']:>8.2f} {r['server_cpu_s']:>12.2f} {r['round1_s']:>8.2f} "
            f"{r['register_s']:>9.2f} {r['discovery_s']:>9.2f} "
            f"{r['wall_s']:>7.1f} {r['peak_tree_mib']:>15.0f} {r['server_peak_mib']:>11.0f}"
        )
    smallest = rows[min(rows)]
    for n, r in rows.items():
        if n != min(rows):
            print(
                f"{n} / {min(rows)} clients: s/round x{r['round_s'] / smallest['round_s']:.2f}, "
                f"peak memory x{r['peak_tree_mib'] / smallest['peak_tree_mib']:.2f}"
            )
    print(f"load average after: {os.getloadavg()}")
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / f"{args.scenario.stem}.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
