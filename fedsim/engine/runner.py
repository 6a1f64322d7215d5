"""Build the Flower apps for a scenario and run them on the Ray simulation engine."""

from __future__ import annotations

import logging
import os
import queue
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp
from rich.console import Console

from fedsim.clients.app import build_client_app
from fedsim.clients.replay import ClientReplay
from fedsim.core.config import Scenario, component_params
from fedsim.core.data import load_dataset
from fedsim.core.models import InputSpec
from fedsim.core.training import client_config_record, pick_device
from fedsim.engine.audit.auditor import AUDIT_RESOURCE, Auditor
from fedsim.engine.audit.observe import ServerView
from fedsim.engine.audit.wrapper import AuditedStrategy
from fedsim.engine.checkpoint import Checkpoint, Checkpointable, Checkpointer, restore_rng
from fedsim.engine.discovery import discover_partitions
from fedsim.engine.failures import FailurePlan, HideInjectedFailures, check_failures
from fedsim.engine.flower import quiet_flower, waiting_nodes_polling
from fedsim.engine.loop import RoundCallback, run_rounds
from fedsim.engine.results import (
    CLIENT_STATE_DIR,
    RunRecorder,
    new_run_dir,
    save_model,
    write_scenario,
    write_summary,
)
from fedsim.engine.validate import validate
from fedsim.strategies import STRATEGIES
from fedsim.strategies.base import EngineServices, FedsimStrategy, ServerResources
from fedsim.strategies.sampling import PartitionSampler


@dataclass
class RunResult:
    """Where a run wrote its outputs, and its per-round metrics."""

    run_dir: Path
    rounds: list[dict[str, Any]]
    final_arrays: ArrayRecord


def _ray_cpus(scenario: Scenario) -> int:
    return scenario.backend.ray_cpus or os.cpu_count() or 1


def actor_count(scenario: Scenario) -> int:
    """Client actors Flower starts on this machine: one per ``num-cpus`` CPUs."""
    return max(1, int(_ray_cpus(scenario) / scenario.backend.num_cpus))


def backend_config(scenario: Scenario) -> dict[str, Any]:
    """Flower's backend config: client resources and ``ray.init`` arguments."""
    backend = scenario.backend
    init_args: dict[str, Any] = {"logging_level": logging.ERROR, "log_to_driver": False}
    if backend.address:
        init_args["address"] = backend.address
    else:
        if scenario.audit.enabled:
            init_args["resources"] = {AUDIT_RESOURCE: scenario.audit.workers}
        init_args["num_cpus"] = _ray_cpus(scenario)
        wants_gpu = backend.num_gpus > 0 or (scenario.audit.enabled and scenario.audit.num_gpus > 0)
        init_args["num_gpus"] = None if wants_gpu else 0
        init_args = {k: v for k, v in init_args.items() if v is not None}
    return {
        "client_resources": {"num_cpus": backend.num_cpus, "num_gpus": backend.num_gpus},
        "init_args": init_args,
    }


def build_strategy(
    scenario: Scenario, sampler: PartitionSampler, server: ServerResources
) -> FedsimStrategy:
    """The scenario's strategy, built from its parameters as a Flower user would, with the
    engine's services (seeded sampling, held-out evaluation, failure threshold) attached."""
    strategy_cls = STRATEGIES.get(scenario.strategy.name)
    params = component_params(strategy_cls, scenario.strategy, "strategy")
    engine = EngineServices(sampler, server, scenario.failures.min_replies)
    return strategy_cls.from_params(params).attach_engine(engine)


def serve(
    grid: Grid,
    scenario: Scenario,
    recorder: RunRecorder,
    console: Console,
    callbacks: tuple[RoundCallback, ...] = (),
    resume: Checkpoint | None = None,
) -> ArrayRecord:
    """The server's side of a run on ``grid``: strategy, audit, resume, the rounds.

    Returns the final global model; the run directory is ``recorder.run_dir``.
    """
    fed = scenario.federation
    strategy_cls = STRATEGIES.get(scenario.strategy.name)
    server = ServerResources(
        scenario, load_dataset(scenario.data), pick_device(scenario.backend.num_gpus > 0)
    )
    nodes = discover_partitions(grid, expected=fed.num_clients, probes=2 * actor_count(scenario))
    sampler = PartitionSampler(nodes, fed.seed, fed.sampled_per_round, fed.evaluate_fraction)
    strategy = build_strategy(scenario, sampler, server)
    observers: tuple[Auditor, ...] = ()
    if scenario.audit.enabled:
        bundle = server.bundle
        view = ServerView(
            scenario.model,
            InputSpec(bundle.channels, bundle.image_size, bundle.num_classes),
            bundle.normalization,
            scenario.strategy.name,
        )
        # The harness knows the clients: it gives the scorer its truth source.
        truth = ClientReplay(
            scenario, strategy_cls.client_routine, recorder.run_dir / CLIENT_STATE_DIR
        )
        auditor = Auditor(scenario.audit, view, truth, recorder.run_dir, console)
        strategy, observers = AuditedStrategy(strategy, auditor), (auditor,)
    components = [c for c in (*observers, recorder) if isinstance(c, Checkpointable)]
    checkpointer = Checkpointer(recorder.run_dir, strategy, scenario, components)
    if resume is None:
        arrays = strategy.initial_arrays()
    else:
        arrays = resume.arrays
        strategy.restore_checkpoint_state(resume.strategy)
        for component in components:
            component.load_state_dict(resume.components[component.checkpoint_key])
        restore_rng(resume.rng)  # last: nothing may draw from them before the round
    first_round = resume.round + 1 if resume is not None else 1
    try:
        return run_rounds(
            strategy,
            grid,
            arrays,
            range(first_round, fed.rounds + 1),
            train_config=client_config_record(scenario.client),
            evaluate_config={},
            # The auditor adds its round means before the recorder writes the row;
            # the checkpoint comes last, when the round's outputs are complete.
            callbacks=(*observers, recorder, *callbacks, checkpointer),
            timeout=scenario.failures.timeout,
            partition_of=sampler.partition_of,
            failures=FailurePlan.from_config(scenario.failures, fed.seed),
        )
    finally:
        for observer in observers:
            observer.finish()


def run_scenario(
    scenario: Scenario,
    out: str | Path | None = None,
    console: Console | None = None,
    callbacks: tuple[RoundCallback, ...] = (),
    resume: Checkpoint | None = None,
) -> RunResult:
    """Validate ``scenario`` and run it as a Flower simulation on Ray.

    With ``resume`` (from :func:`fedsim.engine.checkpoint.open_resume`) the run
    continues in the checkpoint's run directory after its last round.
    """
    from flwr.simulation import run_simulation

    validate(scenario)
    console = console or Console(soft_wrap=True)
    strategy_cls = STRATEGIES.get(scenario.strategy.name)
    check_failures(scenario, strategy_cls.min_replies)
    fed = scenario.federation
    if resume is None:
        run_dir = new_run_dir(scenario, out)
        write_scenario(scenario, run_dir)
    else:
        run_dir = resume.run_dir
    recorder = RunRecorder(run_dir, fed.rounds, console)
    outcome: queue.Queue[ArrayRecord | BaseException] = queue.Queue()

    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        try:
            outcome.put(serve(grid, scenario, recorder, console, callbacks, resume))
        except BaseException as err:  # re-raised in the caller's thread below
            outcome.put(err)
            raise

    client_app = build_client_app(scenario, strategy_cls.client_routine, run_dir / CLIENT_STATE_DIR)
    quiet_flower(HideInjectedFailures())
    console.print(
        f"[bold]fedsim[/bold] {scenario.name}: {scenario.strategy.name} on "
        f"{scenario.data.dataset}, {fed.num_clients} clients "
        f"({fed.sampled_per_round}/round), {fed.rounds} rounds -> {run_dir}"
        + (f" (resuming after round {resume.round})" if resume is not None else "")
    )
    with waiting_nodes_polling():
        run_simulation(
            server_app=server_app,
            client_app=client_app,
            num_supernodes=fed.num_clients,
            backend_config=backend_config(scenario),
        )
    if outcome.empty():
        raise RuntimeError("the simulation ended without a result; see the log above")
    result = outcome.get()
    if isinstance(result, BaseException):
        raise result
    save_model(result, run_dir)
    console.print(write_summary(scenario, recorder.rows, run_dir))
    return RunResult(run_dir, recorder.rows, result)
