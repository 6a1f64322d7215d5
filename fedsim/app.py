"""fedsim as a Flower app: ``flwr run .`` (simulation) or ``flwr run . <superlink>`` (deployment).

``pyproject.toml`` names :data:`server_app` and :data:`client_app` in
``[tool.flwr.app.components]``. Both read the scenario from
``context.run_config`` (``[tool.flwr.app.config]``, overridden with
``flwr run . --run-config 'key=value ...'``):

- ``scenario``: a shipped scenario's name (``quickstart``, ``audit-fedavg``,
  ... as in ``fedsim list``) or the path of a scenario file;
- ``set``: ``;``-separated ``key.path=value`` overrides, as ``fedsim run --set``;
- ``out``: the run directory (default ``<output.dir>/<name>-run<RUN_ID>``),
  which the ServerApp writes (``metrics.csv``, ``audit.csv``, ...) and the
  clients keep their private state in, so on the Deployment Engine it must be
  a path that means the same on every machine (one machine in the tests).

The server does what ``fedsim run`` does: validates the scenario before
anything starts, discovers which node is which partition, runs the rounds
with the strategy (and the audit when ``[audit]`` is enabled), and writes the
run directory. On the Deployment Engine each SuperNode is started with
``--node-config "partition-id=I num-partitions=N"``; in a simulation Flower
sets both.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from functools import cache
from pathlib import Path

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from rich.console import Console

from fedsim.clients.app import build_client_app
from fedsim.core import protocol
from fedsim.core.config import AuditConfig, OutputConfig, Scenario, ScenarioError, require
from fedsim.core.plugins import use_plugins
from fedsim.core.scenario_file import load_scenario
from fedsim.outputs.run_folder import CLIENT_STATE_DIR
from fedsim.scenario.components import client_spec
from fedsim.scenarios import scenario_path, shipped_scenarios
from fedsim.strategies import STRATEGIES


def scenario_from_run_config(run_config: Mapping[str, object]) -> Scenario:
    """The scenario a run config names (``scenario``), with its ``set`` overrides applied."""
    name = str(run_config.get("scenario", "") or "")
    shipped = ", ".join(shipped_scenarios())
    require(bool(name), "scenario", name, f"a scenario file or one of {shipped}")
    overrides = [s.strip() for s in str(run_config.get("set", "") or "").split(";") if s.strip()]
    return load_scenario(scenario_path(name), overrides)


def run_dir_of(
    output: OutputConfig, name: str, run_config: Mapping[str, object], run_id: int
) -> Path:
    """The run directory server and clients agree on: ``out``, or one named by the run id."""
    out = str(run_config.get("out", "") or "")
    return Path(out) if out else Path(output.dir) / f"{name}-run{run_id}"


def _start_audit_ray(audit: AuditConfig, grid: Grid) -> None:
    """On the Deployment Engine the ServerApp has no Ray: start one for the audit's tasks.

    No client actor shares this Ray, so the attacks need no reservation. In
    a ``flwr run`` simulation, Flower's backend starts Ray in this very process
    (a second ``ray.init`` racing it makes both time out) without fedsim's
    resource plan: the attacks then ask for CPUs the client actors leave free
    (docs/flower-app.md).
    """
    import ray

    from fedsim.simulation.flower import simulated
    from fedsim.simulation.resources import KEEP_IDLE_WORKERS

    if audit.enabled and not simulated(grid) and not ray.is_initialized():
        ray.init(
            address="local",
            num_cpus=os.cpu_count() or 1,
            num_gpus=None if audit.num_gpus > 0 else 0,
            logging_level=logging.ERROR,
            log_to_driver=False,
            include_dashboard=False,
            _system_config=KEEP_IDLE_WORKERS,
        )


server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the scenario of ``context.run_config`` on ``grid`` and write its run directory."""
    # The server's modules are imported here, not with this module: every ClientApp
    # process on the Deployment Engine imports it too, and the audit, the runner and the
    # report cost it about 3 s a message.
    from fedsim.outputs.report import write_run_report
    from fedsim.outputs.results import RunRecorder
    from fedsim.outputs.run_folder import new_run_dir, save_model, write_scenario
    from fedsim.scenario.validate import validate
    from fedsim.simulation.flower import quiet_flower
    from fedsim.simulation.runner import keep_failed_run, serve, write_run_outputs
    from fedsim.strategies.base import TooFewReplies

    console = Console(soft_wrap=True)
    quiet_flower()
    components = validate(scenario_from_run_config(context.run_config))
    scenario = components.scenario
    named = run_dir_of(scenario.output, scenario.name, context.run_config, context.run_id)
    run_dir = new_run_dir(scenario.output, scenario.name, named)
    write_scenario(scenario, run_dir)
    fed = scenario.federation
    console.print(
        f"[bold]fedsim[/bold] {scenario.name}: {scenario.strategy.name}, {fed.num_clients} "
        f"clients ({fed.sampled_per_round}/round), {fed.rounds} rounds -> {run_dir}"
    )
    _start_audit_ray(scenario.audit, grid)
    recorder = RunRecorder(run_dir, fed.rounds, console)
    try:
        arrays = serve(grid, components, recorder, console)
    except TooFewReplies:
        raise
    except Exception as err:  # what the rounds before it computed is kept, as fedsim run does
        raise keep_failed_run(err, components, recorder) from err
    save_model(arrays, run_dir)
    console.print(write_run_outputs(components, recorder))
    console.print(f"report: {write_run_report(run_dir)}")


@cache
def _run_scenario(items: tuple[tuple[str, object], ...]) -> Scenario:
    scenario = scenario_from_run_config(dict(items))
    use_plugins(scenario.plugins)  # the ServerApp's validation imports them on its side
    return scenario


@cache
def _scenario_client(items: tuple[tuple[str, object], ...], run_id: int) -> ClientApp:
    scenario = _run_scenario(items)
    routine = STRATEGIES.get(scenario.strategy.name).client_routine
    run_dir = run_dir_of(scenario.output, scenario.name, dict(items), run_id)
    state_dir = run_dir / CLIENT_STATE_DIR
    return build_client_app(client_spec(scenario), routine, state_dir)


def _client_for(context: Context) -> ClientApp:
    """The run's scenario client, once the node's partition settings fit the scenario."""
    items = tuple(sorted(context.run_config.items()))
    expected = _run_scenario(items).federation.num_clients
    if protocol.PARTITION_ID not in context.node_config:
        raise ScenarioError(
            f"node-config {protocol.PARTITION_ID}",
            None,
            'start each SuperNode with --node-config "partition-id=I num-partitions=N"',
        )
    partitions = context.node_config.get(protocol.NUM_PARTITIONS, expected)
    if int(partitions) != expected:
        raise ScenarioError(
            f"node-config {protocol.NUM_PARTITIONS}",
            partitions,
            f"must equal the scenario's federation.num-clients ({expected})",
        )
    return _scenario_client(items, context.run_id)


client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    return _client_for(context)(msg, context)


@client_app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return _client_for(context)(msg, context)


@client_app.query()
def query(msg: Message, context: Context) -> Message:
    return _client_for(context)(msg, context)
