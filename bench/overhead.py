"""fedsim's overhead over a bare Flower app and over a plain PyTorch loop, and where it goes.

The same federation three ways, 10 clients, all sampled, 5 rounds, the
quickstart's data, model and local training (``fedsim.core.training.train_local``):

- ``torch``: one process, one thread, a Python loop over clients, FedAvg by hand;
- ``flower``: a bare ``ClientApp`` + Flower's own ``FedAvg.start`` on
  ``run_simulation`` with the same backend (one CPU per client actor);
- ``fedsim``: ``fedsim.simulation.runner.run_scenario`` with the audit off,
  as the other two have none;
- ``fedsim-audited``: the same with the quickstart's audit on (its own row:
  what the audit adds, not overhead).

Each round does the same work: every client trains and evaluates, the server
averages and evaluates the global model on the test set. A round's time is the
wall time between the ends of consecutive rounds; the table gives the median of
rounds 2-5 (round 1 includes the actors' first training) and the whole run's
wall time, each the median over ``--repeats`` runs in fresh processes, the
ways taking turns (one run of each per repeat) so that a change in the
machine's load falls on all of them. A second table splits each way's process
into where its seconds go: the interpreter and imports, the start-up until
round 1 begins (for fedsim also its phases: validation and the reap of earlier
runs, Ray's start, the clients' discovery and the actors' warm-up), the rounds,
and what follows the last round (Ray's stop, summary, report). Then a cProfile
of fedsim's server thread (audit off) and of its client handler, in process::

    .venv/bin/python bench/overhead.py [--repeats 3] [--skip-profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import itertools
import json
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PROCESS_STARTED = time.perf_counter()  # the child's clock starts before its imports
ROOT = Path(__file__).resolve().parent.parent
CLIENTS, ROUNDS = 10, 5
OVERRIDES = [
    f"federation.num-clients={CLIENTS}",
    f"federation.clients-per-round={CLIENTS}",
    f"federation.rounds={ROUNDS}",
]


def _scenario(audited: bool = False) -> Any:
    from fedsim.core.scenario_file import load_scenario

    audit = [f"audit.enabled={str(audited).lower()}"]
    return load_scenario(ROOT / "scenarios" / "quickstart.toml", [*OVERRIDES, *audit])


def _round_times(ends: list[float], started: float) -> dict[str, Any]:
    durations = [b - a for a, b in zip([started, *ends], ends, strict=False)]
    return {"rounds": durations, "round_s": statistics.median(durations[1:])}


def _split(imported: float, started: float, first_round: float, ends: list[float]) -> dict:
    """Where one way's seconds go, from the child's first line (see the module)."""
    finished = time.perf_counter()
    return {
        "imports_s": imported - PROCESS_STARTED,
        "to_round_1_s": first_round - started,
        "rounds_s": ends[-1] - first_round,
        "after_rounds_s": finished - ends[-1],
    }


def run_torch() -> dict[str, Any]:
    """The federation as a plain loop: no Flower, no Ray, no messages."""
    import torch

    from fedsim.core.data import load_dataset
    from fedsim.core.models import InputSpec, build_model
    from fedsim.core.partition import partition_dataset
    from fedsim.core.seeds import SeedStream, derive_seed
    from fedsim.core.training import evaluate, train_local

    imported = time.perf_counter()
    torch.set_num_threads(1)  # as each client actor (Ray gives it one CPU)
    scenario = _scenario()
    started = time.perf_counter()
    bundle = load_dataset(scenario.data)
    splits = partition_dataset(scenario.data, CLIENTS, scenario.federation.seed)
    spec = InputSpec(bundle.channels, bundle.image_size, bundle.num_classes)
    global_state = build_model(scenario.model, spec, seed=0).state_dict()
    ends = []
    for server_round in range(1, ROUNDS + 1):
        states, weights = [], []
        for partition, split in enumerate(splits):
            model = build_model(scenario.model, spec, seed=0)
            model.load_state_dict(global_state)
            idx = torch.from_numpy(split.train)
            seed = derive_seed(SeedStream.CLIENT_TRAIN, 0, server_round, partition)
            stats = train_local(
                model, bundle.train_images[idx], bundle.train_labels[idx], scenario.client, seed
            )
            states.append(model.state_dict())
            weights.append(stats.examples)
        total = sum(weights)
        global_state = {
            k: sum(w * s[k].float() for w, s in zip(weights, states, strict=True)) / total
            for k in global_state
        }
        model = build_model(scenario.model, spec, seed=0)
        model.load_state_dict(global_state)
        for split in splits:
            idx = torch.from_numpy(split.test)
            evaluate(model, bundle.train_images[idx], bundle.train_labels[idx])
        evaluate(model, bundle.test_images, bundle.test_labels)
        ends.append(time.perf_counter())
    times = _split(imported, started, started, ends)
    return {**_round_times(ends, started), "wall_s": time.perf_counter() - started, **times}


def run_flower() -> dict[str, Any]:
    """A bare Flower app with the same training code, on the same simulation backend."""
    import torch
    from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg
    from flwr.simulation import run_simulation

    from fedsim.core.data import load_dataset
    from fedsim.core.models import InputSpec, build_model
    from fedsim.core.partition import partition_dataset
    from fedsim.core.seeds import SeedStream, derive_seed
    from fedsim.core.training import evaluate, train_local
    from fedsim.simulation.failures import HideInjectedFailures
    from fedsim.simulation.flower import quiet_flower
    from fedsim.simulation.runner import backend_config

    imported = time.perf_counter()
    scenario = _scenario()

    def world(context: Context) -> tuple[Any, Any, Any]:
        bundle = load_dataset(scenario.data)
        split = partition_dataset(scenario.data, CLIENTS, 0)[
            int(context.node_config["partition-id"])
        ]
        spec = InputSpec(bundle.channels, bundle.image_size, bundle.num_classes)
        return bundle, split, build_model(scenario.model, spec, seed=0)

    client = ClientApp()

    @client.train()
    def train(msg: Message, context: Context) -> Message:
        bundle, split, model = world(context)
        model.load_state_dict(msg.content.array_records["arrays"].to_torch_state_dict())
        idx = torch.from_numpy(split.train)
        partition = int(context.node_config["partition-id"])
        server_round = msg.content.config_records["config"]["server-round"]
        seed = derive_seed(SeedStream.CLIENT_TRAIN, 0, int(server_round), partition)  # type: ignore[arg-type]
        stats = train_local(
            model, bundle.train_images[idx], bundle.train_labels[idx], scenario.client, seed
        )
        metrics = MetricRecord({"train-loss": stats.mean_loss, "num-examples": stats.examples})
        content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics})
        return Message(content=content, reply_to=msg)

    @client.evaluate()
    def evaluate_client(msg: Message, context: Context) -> Message:
        bundle, split, model = world(context)
        model.load_state_dict(msg.content.array_records["arrays"].to_torch_state_dict())
        idx = torch.from_numpy(split.test)
        loss, acc = evaluate(model, bundle.train_images[idx], bundle.train_labels[idx])
        metrics = MetricRecord({"eval-loss": loss, "eval-acc": acc, "num-examples": len(idx)})
        return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)

    ends: list[float] = []
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        bundle = load_dataset(scenario.data)
        spec = InputSpec(bundle.channels, bundle.image_size, bundle.num_classes)

        def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
            model = build_model(scenario.model, spec, seed=0)
            model.load_state_dict(arrays.to_torch_state_dict())
            loss, acc = evaluate(model, bundle.test_images, bundle.test_labels)
            if server_round:
                ends.append(time.perf_counter())
            return MetricRecord({"test-loss": loss, "test-acc": acc})

        strategy = FedAvg(min_train_nodes=CLIENTS, min_evaluate_nodes=CLIENTS)
        initial = ArrayRecord(build_model(scenario.model, spec, seed=0).state_dict())
        ends.append(time.perf_counter())  # round 1 starts after the round-0 evaluation
        strategy.start(grid, initial, num_rounds=ROUNDS, evaluate_fn=evaluate_fn)

    quiet_flower(HideInjectedFailures())
    started = time.perf_counter()
    run_simulation(
        server, client, num_supernodes=CLIENTS, backend_config=backend_config(scenario.backend)
    )
    wall = time.perf_counter() - started
    split = _split(imported, started, ends[0], ends)
    return {**_round_times(ends[1:], ends[0]), "wall_s": wall, **split}


class _RoundEnds:
    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_round_end(self, record: Any, arrays: Any) -> None:
        self.ends.append(time.perf_counter())


def run_fedsim(profile_to: Path | None = None, audited: bool = False) -> dict[str, Any]:
    """fedsim itself (``audited``: with the quickstart's audit); with ``profile_to``,
    its server thread under cProfile."""
    from rich.console import Console

    import fedsim.simulation.runner as runner
    from fedsim.outputs.progress import Phases

    imported = time.perf_counter()
    serve = runner.serve
    starts: list[float] = []
    phases: dict[str, float] = {}

    class TimedPhases(Phases):
        def __call__(self, text: str) -> None:
            phases[text] = time.perf_counter()

    setattr(runner, "Phases", TimedPhases)  # noqa: B010 (a class, not an attribute, is replaced)

    def timed_serve(*args: Any, **kwargs: Any) -> Any:
        profiler = cProfile.Profile() if profile_to else None
        original_run_rounds = runner.run_rounds

        def marked_run_rounds(*a: Any, **k: Any) -> Any:
            starts.append(time.perf_counter())
            return original_run_rounds(*a, **k)

        runner.run_rounds = marked_run_rounds
        try:
            if profiler is None:
                return serve(*args, **kwargs)
            result = profiler.runcall(serve, *args, **kwargs)
            profiler.dump_stats(str(profile_to))
            return result
        finally:
            runner.run_rounds = original_run_rounds

    runner.serve = timed_serve
    ends = _RoundEnds()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        runner.run_scenario(_scenario(audited), Path(out) / "run", Console(quiet=True), (ends,))
    wall = time.perf_counter() - started
    split = _split(imported, started, starts[0], ends.ends)
    marks = [("validation, reap", started), *phases.items(), ("", starts[0])]
    split["phases_s"] = {a: t1 - t0 for (a, t0), (_, t1) in itertools.pairwise(marks)}
    return {**_round_times(ends.ends, starts[0]), "wall_s": wall, **split}


KINDS = ("torch", "flower", "fedsim", "fedsim-audited")
SPLIT = (
    "round_s",
    "wall_s",
    "process_s",
    "imports_s",
    "to_round_1_s",
    "rounds_s",
    "after_rounds_s",
)


def _child(kind: str) -> dict[str, Any]:
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, __file__, "--child", kind],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    result["process_s"] = time.perf_counter() - started
    return result


def measure(repeats: int) -> dict[str, dict[str, Any]]:
    """Median round time and wall time of every way over ``repeats`` fresh processes,
    the ways taking turns."""
    runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
    for _ in range(repeats):
        for kind in KINDS:
            runs[kind].append(_child(kind))
    return {
        kind: {
            **{key: statistics.median(r[key] for r in done) for key in SPLIT},
            "phases_s": {
                phase: statistics.median(r["phases_s"][phase] for r in done)
                for phase in done[0].get("phases_s", {})
            },
            "runs": done,
        }
        for kind, done in runs.items()
    }


def start_up_table(results: dict[str, dict[str, Any]]) -> str:
    """Each way's process split into where its seconds go (medians), fedsim's phases below."""
    columns = ("process_s", "imports_s", "to_round_1_s", "rounds_s", "after_rounds_s")
    heads = ("process", "imports", "to round 1", "rounds", "after rounds")
    lines = [
        "seconds of each way's process (median):",
        f"{'':15} " + " ".join(f"{h:>12}" for h in heads),
    ]
    for kind, r in results.items():
        lines.append(f"{kind:15} " + " ".join(f"{r[c]:>12.2f}" for c in columns))
        # The interpreter's start and exit: what the child's own clock does not see.
        rest = r["process_s"] - r["imports_s"] - r["wall_s"]
        lines.append(f"{'':15} interpreter start/exit and set-up outside the run: {rest:.2f}")
        for phase, seconds in r["phases_s"].items():
            lines.append(f"{'':15}   {seconds:6.2f}  {phase}")
    return "\n".join(lines)


def _top(stats: pstats.Stats, title: str, pattern: str, lines: int) -> str:
    buffer = io.StringIO()
    stats.stream = buffer  # type: ignore[attr-defined]
    stats.sort_stats("cumulative").print_stats(pattern, lines)
    body = buffer.getvalue()
    return f"--- {title}\n" + body[body.find("   ncalls") :]


def profile() -> str:
    """fedsim's server thread (one run) and its client handler (in process), by cumulative time."""
    with tempfile.TemporaryDirectory() as tmp:
        server_file = Path(tmp) / "server.prof"
        subprocess.run(
            [sys.executable, __file__, "--child", "fedsim", "--profile-to", str(server_file)],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        server = pstats.Stats(str(server_file))
    report = _top(server, "server thread, fedsim and flwr frames", "fedsim|flwr", 25)
    return report + profile_client()


def profile_client() -> str:
    """One client's train and evaluate handlers called in process, after a warm-up call."""
    import torch
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict

    from fedsim.clients.app import build_client_app
    from fedsim.core.data import load_dataset
    from fedsim.core.training import client_config_record
    from fedsim.scenario.components import client_spec
    from fedsim.simulation.flower import message_context
    from fedsim.strategies.base import ServerResources

    scenario = _scenario()
    app = build_client_app(client_spec(scenario), "fedavg")
    context = Context(
        run_id=1,
        node_id=7,
        node_config={"partition-id": 0, "num-partitions": CLIENTS},
        state=RecordDict(),
        run_config={},
    )
    server = ServerResources(
        scenario.model, scenario.federation.seed, load_dataset(scenario.data), torch.device("cpu")
    )
    arrays = ArrayRecord(server.model().state_dict())
    config = ConfigRecord({**client_config_record(scenario.client), "server-round": 1})

    def call(kind: str) -> None:
        content = RecordDict({"arrays": arrays, "config": config})
        with message_context():
            message = Message(content=content, dst_node_id=7, message_type=kind)
        app(message, context)

    call(MessageType.TRAIN)
    profiler = cProfile.Profile()
    for _ in range(3):
        profiler.runcall(call, MessageType.TRAIN)
        profiler.runcall(call, MessageType.EVALUATE)
    stats = pstats.Stats(profiler)
    return _top(stats, "client handler x3 (train + evaluate)", "fedsim|flwr|torch/optim", 25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-profile", action="store_true")
    parser.add_argument("--child", choices=KINDS, help=argparse.SUPPRESS)
    parser.add_argument("--profile-to", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        ways = {
            "torch": run_torch,
            "flower": run_flower,
            "fedsim": lambda: run_fedsim(args.profile_to),
            "fedsim-audited": lambda: run_fedsim(audited=True),
        }
        print(json.dumps(ways[args.child]()))
        return
    results = measure(args.repeats)
    flower, torch_ = results["flower"], results["torch"]
    print(f"{CLIENTS} clients, {ROUNDS} rounds, median of {args.repeats} runs, ways in turn")
    print(f"{'':15} {'s/round':>8} {'wall s':>8}")
    for kind, r in results.items():
        print(f"{kind:15} {r['round_s']:>8.2f} {r['wall_s']:>8.1f}")
    for kind in ("fedsim", "fedsim-audited"):
        ours = results[kind]
        print(
            f"{kind} / flower: {ours['round_s'] / flower['round_s']:.3f} per round, "
            f"{ours['wall_s'] / flower['wall_s']:.3f} wall; "
            f"{kind} / torch: {ours['round_s'] / torch_['round_s']:.2f} per round, "
            f"{ours['wall_s'] / torch_['wall_s']:.2f} wall"
        )
    print(start_up_table(results))
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "overhead.json").write_text(json.dumps(results, indent=2))
    if not args.skip_profile:
        report = profile()
        (out / "overhead-profile.txt").write_text(report)
        print(report)


if __name__ == "__main__":
    main()
