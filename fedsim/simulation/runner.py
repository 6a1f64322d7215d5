"""Build the Flower apps for a scenario and run them on the Ray simulation engine."""

from __future__ import annotations

import logging
import queue
import threading
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp
from rich.console import Console

from fedsim.audit.auditor import Auditor
from fedsim.audit.canaries import CanaryAudit
from fedsim.audit.canary_clients import CanaryClients, WithCanaryClients
from fedsim.audit.candidates import AuditPool
from fedsim.audit.observe import ServerView
from fedsim.audit.tasks import reserved_workers
from fedsim.audit.wrapper import AuditedStrategy
from fedsim.clients.app import build_client_app
from fedsim.clients.replay import ClientReplay
from fedsim.core import protocol
from fedsim.core.config import (
    BackendConfig,
    CentralDPConfig,
    FederationConfig,
    Scenario,
    first_line,
)
from fedsim.core.data import load_dataset
from fedsim.core.devices import gpu_if
from fedsim.core.modality import input_spec
from fedsim.core.scenario_file import scenario_to_dict
from fedsim.core.training import client_config_record
from fedsim.outputs.progress import Phases
from fedsim.outputs.report import write_run_report
from fedsim.outputs.results import RunRecorder, write_summary
from fedsim.outputs.run_folder import (
    CLIENT_STATE_DIR,
    TRACEBACK_FILE,
    check_out_folder,
    new_run_dir,
    save_model,
    write_scenario,
)
from fedsim.outputs.tensorboard import TensorBoardLog
from fedsim.scenario.components import Components
from fedsim.scenario.machine import actor_count, ray_cpus
from fedsim.scenario.validate import validate
from fedsim.simulation.checkpoint import Checkpoint, Checkpointable, Checkpointer, restore_rng
from fedsim.simulation.discovery import discover_partitions
from fedsim.simulation.failures import FailurePlan, HideInjectedFailures, check_failures
from fedsim.simulation.flower import actor_pool_size, quiet_flower, waiting_nodes_polling
from fedsim.simulation.lifecycle import RaySession, RunInterrupted, StopGuard, reap_orphans
from fedsim.simulation.loop import RoundCallback, run_rounds
from fedsim.simulation.resources import reserve_audit, start_ray
from fedsim.strategies.base import FedsimStrategy, ServerResources, TooFewReplies
from fedsim.strategies.central_dp import with_central_dp
from fedsim.strategies.sampling import TAKE_EVERY_NODE, PartitionSampler, SampledGrid
from fedsim.strategies.stragglers import StragglerPlan
from fedsim.text.canaries import PlantedCanaries

SHUTDOWN_TIMEOUT_S = 30.0


class RunFailed(RuntimeError):
    """A run that failed after it started: one line saying what broke, what it kept and
    where the full traceback is (:func:`keep_failed_run`)."""


@dataclass
class RunResult:
    """Where a run wrote its outputs, and its per-round metrics."""

    run_dir: Path
    rounds: list[dict[str, Any]]
    final_arrays: ArrayRecord


def backend_config(backend: BackendConfig) -> dict[str, Any]:
    """Flower's backend config: the client actors' resources.

    In a fedsim run Ray is already running (:func:`fedsim.simulation.resources.start_ray`)
    and Flower ignores ``init_args``; they matter only to benches that run a bare
    Flower app on the same CPUs.
    """
    return {
        "client_resources": {"num_cpus": backend.num_cpus, "num_gpus": backend.num_gpus},
        "init_args": {
            "logging_level": logging.ERROR,
            "log_to_driver": False,
            "num_cpus": ray_cpus(backend),
        },
    }


def stop_ray(timeout: float = SHUTDOWN_TIMEOUT_S) -> None:
    """Disconnect from Ray (stopping it when fedsim started it), waiting at most ``timeout``."""
    import ray

    if not ray.is_initialized():
        return
    stopper = threading.Thread(target=ray.shutdown, daemon=True)
    stopper.start()
    stopper.join(timeout)
    if stopper.is_alive():
        logging.getLogger(__name__).warning(
            "Ray did not shut down within %.0f s; leaving it to exit with this process", timeout
        )


def plain_strategy(components: Components, server: ServerResources) -> FedsimStrategy:
    """The scenario's strategy, built from its parameters as a Flower user would: it
    asks every node the grid offers (fedsim samples through the grid), and gets what
    the server gives its constructor (the seeded network; FedCG's seed)."""
    cls = components.strategy.cls
    options = {**TAKE_EVERY_NODE, **cls.server_arguments(server)}
    strategy: FedsimStrategy = cls.from_params(components.strategy.params, **options)
    return strategy


def build_strategy(components: Components, server: ServerResources) -> FedsimStrategy:
    """:func:`plain_strategy`, wrapped in Flower's central DP when the scenario has
    ``[central-dp]`` (with the audit's canary clients when it asks for them)."""
    strategy = plain_strategy(components, server)
    scenario = components.scenario
    if not scenario.central_dp.enabled:
        return strategy
    audit = scenario.audit
    return with_central_dp_and_canaries(
        strategy,
        scenario.central_dp,
        scenario.federation,
        audit.canary_clients if audit.enabled else 0,
        audit.seed,
    )


def with_central_dp_and_canaries(
    strategy: FedsimStrategy,
    central: CentralDPConfig,
    fed: FederationConfig,
    canaries: int,
    canary_seed: int,
) -> FedsimStrategy:
    """``strategy`` in Flower's central-DP wrapper, which noises the mean of the sampled
    clients and ``canaries`` canary clients (Andrew et al.'s; none when 0, drawn from
    ``canary_seed``) every round."""
    noised = with_central_dp(
        strategy,
        central,
        fed.sampled_per_round + canaries,
        fed.num_clients + canaries,
        fed.seed,
    )
    if not canaries:
        return noised
    planted = CanaryClients(canaries, noised.initial_arrays(), canary_seed)
    return WithCanaryClients(noised, planted, central.clipping_norm, central.delta)


def sampled_grid(grid: Grid, components: Components, sampler: PartitionSampler) -> SampledGrid:
    """``grid`` with the scenario's seeded sampling, stragglers and failure threshold
    (``failures.min-replies``, else the strategy's own)."""
    scenario = components.scenario
    min_replies = scenario.failures.min_replies or components.strategy.cls.min_replies
    return SampledGrid(
        grid,
        sampler,
        min_replies,
        StragglerPlan.of(scenario.federation, scenario.client.local_epochs),
    )


def _auditor(
    components: Components, server: ServerResources, run_dir: Path, console: Console
) -> Auditor:
    """The honest-but-curious server's auditor, with the harness's truth source."""
    scenario, bundle = components.scenario, server.bundle
    view = ServerView(
        scenario.model,
        input_spec(bundle),
        bundle.normalization,
        scenario.strategy.name,
    )
    # The harness knows the clients: it gives the scorer its truth source.
    routine = components.strategy.cls.client_routine
    truth = ClientReplay(components.client, routine, run_dir / CLIENT_STATE_DIR)
    plan = components.audit
    client = components.client
    canaries = CanaryAudit.design(bundle, client.canaries, plan.leaks, client.defences)
    exclude = canaries.indices if canaries else None
    pool = AuditPool.split(bundle.test_images, bundle.test_labels, scenario.audit.seed, exclude)
    return Auditor(
        scenario.audit,
        plan.attacks,
        view,
        truth,
        run_dir,
        console,
        leaks=plan.leaks,
        probe_attacks=plan.probe_attacks,
        pool=pool,
        canaries=canaries,
    )


def _starting_arrays(
    strategy: FedsimStrategy, stateful: list[Checkpointable], resume: Checkpoint | None
) -> ArrayRecord:
    """The round-0 model, or a checkpoint's with everything restored to its round."""
    if resume is None:
        return strategy.initial_arrays()
    strategy.restore_checkpoint_state(resume.strategy)
    for component in stateful:
        component.load_state_dict(resume.components[component.checkpoint_key])
    restore_rng(resume.rng)  # last: nothing may draw from them before the round
    return resume.arrays


def serve(
    grid: Grid,
    components: Components,
    recorder: RunRecorder,
    console: Console,
    callbacks: tuple[RoundCallback, ...] = (),
    resume: Checkpoint | None = None,
    guard: StopGuard | None = None,
    phases: Phases | None = None,
) -> ArrayRecord:
    """The server's side of a run on ``grid``: strategy, audit, resume, the rounds.

    Returns the final global model; the run directory is ``recorder.run_dir``.
    ``guard`` stops the rounds on a signal once a round's outputs are written;
    ``phases`` prints the start-up phases.
    """
    scenario = components.scenario
    fed = scenario.federation
    bundle = load_dataset(scenario.data)
    memorisation = scenario.memorisation
    server = ServerResources(
        scenario.model,
        fed.seed,
        bundle,
        gpu_if(scenario.backend.num_gpus > 0),
        PlantedCanaries.of(memorisation, bundle.vocabulary) if memorisation.enabled else None,
    )
    audit = scenario.audit
    auditor = None
    if audit.enabled and not (components.audit.empty and audit.canary_clients == 0):
        auditor = _auditor(components, server, recorder.run_dir, console)
        # Its task processes start importing while the clients' actors do.
        auditor.remote.warm(reserved_workers(audit, components.audit.every_attack))
    if phases:
        phases(f"waiting for Ray and the {fed.num_clients} clients; warming up the actors")
    nodes = discover_partitions(
        grid, expected=fed.num_clients, probes=2 * actor_count(scenario.backend)
    )
    if phases:
        phases(f"{len(nodes)} clients ready; training")
    sampler = PartitionSampler(nodes, fed.seed, fed.sampled_per_round, fed.evaluated_per_round)
    strategy = build_strategy(components, server)
    evaluate_fn = server.evaluate if components.strategy.cls.global_model else None
    observers: tuple[Auditor, ...] = ()
    if auditor is not None:
        strategy, observers = AuditedStrategy(strategy, auditor), (auditor,)
    logs = (TensorBoardLog(recorder),) if scenario.log.tensorboard else ()
    # The audit's findings are checkpointed with the recorder's rows (its AuditLog).
    findings = (*(o.log for o in observers), recorder)
    stateful = [c for c in findings if isinstance(c, Checkpointable)]
    checkpointer = Checkpointer(recorder.run_dir, strategy, scenario_to_dict(scenario), stateful)
    arrays = _starting_arrays(strategy, stateful, resume)
    first_round = resume.round + 1 if resume is not None else 1
    begin, end = ((guard.begin_outputs,), (guard.end_outputs,)) if guard else ((), ())
    try:
        return run_rounds(
            strategy,
            sampled_grid(grid, components, sampler),
            arrays,
            range(first_round, fed.rounds + 1),
            train_config=client_config_record(scenario.client),
            evaluate_config={},
            # The auditor adds its round means before the recorder writes the row;
            # the checkpoint comes last, when the round's outputs are complete.
            callbacks=(*observers, *begin, recorder, *logs, *callbacks, checkpointer, *end),
            timeout=scenario.failures.timeout,
            failures=FailurePlan.from_config(scenario.failures, fed.seed),
            evaluate_fn=evaluate_fn,
        )
    finally:
        for observer in observers:
            observer.finish()
        for log in logs:
            log.close()


def run_scenario(
    scenario: Scenario,
    out: str | Path | None = None,
    console: Console | None = None,
    callbacks: tuple[RoundCallback, ...] = (),
    resume: Checkpoint | None = None,
    force: bool = False,
) -> RunResult:
    """Validate ``scenario`` and run it as a Flower simulation on Ray.

    With ``resume`` (from :func:`fedsim.simulation.resume.open_resume`) the run
    continues in the checkpoint's run directory after its last round. An
    ``out`` folder holding files is refused unless ``force`` (which clears the
    run files in it). SIGINT or SIGTERM at any point raises
    :class:`~fedsim.simulation.lifecycle.RunInterrupted` (see :class:`StopGuard`).
    """
    session = RaySession()
    guard = StopGuard(resume.run_dir if resume is not None else None)
    guard.on_force = session.kill_remaining
    guard.last_round = resume.round if resume is not None else 0
    with guard.installed():
        try:
            components = validate(scenario)
            return _run(components, out, console, callbacks, resume, force, session, guard)
        except RunInterrupted:
            raise
        except BaseException as err:
            if guard.stop.is_set():  # whatever broke after a stop signal is the stop
                raise guard.interrupted() from err
            raise


def _server_app(
    outcome: queue.Queue[ArrayRecord | BaseException],
    components: Components,
    recorder: RunRecorder,
    console: Console,
    callbacks: tuple[RoundCallback, ...],
    resume: Checkpoint | None,
    guard: StopGuard,
    phases: Phases,
) -> ServerApp:
    """The run's ServerApp: :func:`serve`, its final model or error put on ``outcome``."""
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        try:
            outcome.put(
                serve(grid, components, recorder, console, callbacks, resume, guard, phases)
            )
        except RunInterrupted as stop:  # not an error: the ServerApp ends, Flower stops
            outcome.put(stop)
        except Exception as err:  # the ServerApp ends, Flower stops; _finish raises it
            outcome.put(err)
        except BaseException as err:  # Ctrl-C, exit: Flower's to stop as well
            outcome.put(err)
            raise

    return server_app


def _run_dir(
    components: Components, out: str | Path | None, force: bool, resume: Checkpoint | None
) -> Path:
    """A new run folder holding the scenario, or the resumed run's."""
    if resume is not None:
        return resume.run_dir
    scenario = components.scenario
    run_dir = new_run_dir(scenario.output, scenario.name, out, force)
    write_scenario(scenario, run_dir)
    return run_dir


def _run(
    components: Components,
    out: str | Path | None,
    console: Console | None,
    callbacks: tuple[RoundCallback, ...],
    resume: Checkpoint | None,
    force: bool,
    session: RaySession,
    guard: StopGuard,
) -> RunResult:
    """:func:`run_scenario` of the validated ``components`` under its ``guard``."""
    from flwr.simulation import run_simulation

    scenario = components.scenario
    reap_orphans()  # Ray processes of earlier runs whose driver was killed
    console = console or Console(soft_wrap=True)
    fed = scenario.federation
    check_failures(scenario.failures, fed.sampled_per_round, components.strategy.cls.min_replies)
    quiet_flower(HideInjectedFailures())
    if resume is None:
        check_out_folder(out, force)  # a finished or running run's folder, before Ray's start-up
    phases = Phases(console)
    phases("starting Ray")
    with session.watching():
        # Before any work: a split that cannot fit is refused here (for a cluster,
        # right after connecting to it), before the run folder exists.
        audit = components.audit
        workers = reserved_workers(scenario.audit, audit.every_attack)
        plan = start_ray(scenario.backend, scenario.audit, workers)
        guard.reclaim()
        try:
            run_dir = _run_dir(components, out, force, resume)
            session.run_dir = guard.run_dir = run_dir
            recorder = RunRecorder(run_dir, fed.rounds, console)
            outcome: queue.Queue[ArrayRecord | BaseException] = queue.Queue()
            server_app = _server_app(
                outcome, components, recorder, console, callbacks, resume, guard, phases
            )
            client_app = build_client_app(
                components.client,
                components.strategy.cls.client_routine,
                run_dir / CLIENT_STATE_DIR,
            )
            console.print(
                f"[bold]fedsim[/bold] {scenario.name}: {scenario.strategy.name} on "
                f"{scenario.data.dataset}, {fed.num_clients} clients "
                f"({fed.sampled_per_round}/round), {fed.rounds} rounds -> {run_dir}"
                + (f" (resuming after round {resume.round})" if resume is not None else "")
            )
            console.print(plan.describe(), markup=False)
            plan.write(run_dir)
            reserve_audit(plan, scenario.backend.wait_timeout)
            phases(f"starting {min(plan.actors, fed.num_clients)} client actor(s)")
            with guard.rounds(), waiting_nodes_polling(), actor_pool_size(plan.actors):
                run_simulation(
                    server_app=server_app,
                    client_app=client_app,
                    num_supernodes=fed.num_clients,
                    backend_config=backend_config(scenario.backend),
                )
        finally:
            stop_ray()
    return _finish(outcome, guard, components, recorder, console)


def _finish(
    outcome: queue.Queue[ArrayRecord | BaseException],
    guard: StopGuard,
    components: Components,
    recorder: RunRecorder,
    console: Console,
) -> RunResult:
    """The final model, summary and report of a simulation that ended; its error else."""
    if outcome.empty():
        raise RuntimeError("the simulation ended without a result; see the log above")
    result = outcome.get()
    if isinstance(result, BaseException):
        if guard.stop.is_set():
            raise guard.interrupted() from result
        if isinstance(result, TooFewReplies):  # the command says how to resume
            raise result
        raise keep_failed_run(result, components, recorder) from result
    save_model(result, recorder.run_dir)
    console.print(write_run_outputs(components, recorder))
    console.print(f"report: {write_run_report(recorder.run_dir)}")
    return RunResult(recorder.run_dir, recorder.rows, result)


def write_run_outputs(components: Components, recorder: RunRecorder) -> str:
    """The run's ``summary.md`` (its text returned) of the rounds ``recorder`` holds."""
    departures = components.strategy.cls.departures(components.strategy.params)
    return write_summary(
        components.scenario,
        recorder.rows,
        recorder.run_dir,
        recorder.wall_seconds,
        departures,
        components.audit.notes,
    )


def keep_failed_run(err: BaseException, components: Components, recorder: RunRecorder) -> RunFailed:
    """After ``err`` ended a started run: its full traceback in the run folder, the summary
    and report of the rounds completed before it (their metrics and audit records are
    written as each round ends), and the one line saying so."""
    run_dir = recorder.run_dir
    (run_dir / TRACEBACK_FILE).write_text("".join(traceback.format_exception(err)))
    rounds = len(recorder.rows)
    kept = "nothing to report"
    if rounds:
        write_run_outputs(components, recorder)
        write_run_report(run_dir)
        last = recorder.rows[-1][protocol.ROUND]
        kept = f"the summary and report of round{f's 1-{last}' if last > 1 else ' 1'} are"
    return RunFailed(
        f"the run failed after {rounds} complete round{'s' if rounds != 1 else ''} "
        f"({type(err).__name__}: "
        f"{first_line(err)}); {kept} in {run_dir}; the full traceback is in "
        f"{run_dir / TRACEBACK_FILE}"
    )
