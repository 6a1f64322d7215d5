"""The resource plan: how many client actors Flower runs and what the audit reserves.

Flower's simulation starts ``min(CPUs / num-cpus, GPUs / num-gpus)`` client
actors per Ray node and keeps them for the whole run, so on its own it takes
every CPU or GPU the cluster has, and an audit task asking for a share of
them waits forever (the hang seen on an H200 with clients at 0.25 GPU and the
audit at 0.5 GPU, and on any external cluster for CPUs).

fedsim therefore plans before any client starts:

1. The audit's reservation, ``audit.workers`` bundles of
   ``(audit.threads-per-attack CPUs, audit.num-gpus GPUs)``, is placed first,
   node by node (:func:`plan_resources`), and held for the whole run as a Ray
   placement group (:func:`reserve_audit`): attack tasks run inside it, so no
   client actor can take their share, and nothing else of the run can either.
2. The client actors get what is left: per node ``floor(CPUs left /
   num-cpus)``, bounded by ``floor(GPUs left / num-gpus)`` when clients ask
   for GPUs. Flower's actor pool is sized to exactly this count
   (:func:`fedsim.simulation.flower.actor_pool_size`), since Flower's own count
   reads the nodes' totals and would start actors that can never be placed.
3. A split where the reservation cannot be placed, or no client actor fits
   beside it, is refused with one line naming the keys, what the machine or
   cluster has, and a split that fits.

When fedsim starts Ray itself, the audit's CPUs are declared on top of
``backend.ray-cpus`` (attacks share cores with the clients, as one thread each
by default, rather than taking a client's core); on an existing cluster
(``backend.address``) they come out of the cluster's CPUs.

Tests on machines without CUDA use Ray's logical GPUs through
:data:`TEST_LOGICAL_GPUS_ENV`, a test-only switch (users never set it): Ray
then schedules GPU shares, and every component runs on CPU because CUDA is
absent.
"""

from __future__ import annotations

import json
import math
import os
import socket
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fedsim.audit.tasks import AUDIT_RESERVATION_NAME
from fedsim.core.config import AuditConfig, BackendConfig, ScenarioError
from fedsim.core.devices import test_logical_gpus
from fedsim.core.plugins import PLUGINS_ENV

RESOURCES_FILE = "resources.json"
CONNECT_TIMEOUT_S = 5.0  # a Ray head answers a TCP connect at once when it exists
EPS = 1e-9  # Ray rounds resource quantities to 1e-4; keep float sums from flipping a floor


class ResourceError(ScenarioError):
    """A resource split that cannot run here: printed as one line, exit status 2."""


class ResourceWaitError(RuntimeError):
    """Something waited past its limit for resources (what waits, what it asks, what exists)."""


@dataclass(frozen=True)
class NodeResources:
    """What one Ray node offers: its CPUs and GPUs, and the resource that pins a bundle to it."""

    name: str
    cpus: float
    gpus: float
    pin: str = ""  # Ray's "node:<ip>" resource; empty before Ray runs


@dataclass(frozen=True)
class ResourcePlan:
    """The split fedsim runs: client actors beside a reserved audit."""

    where: str
    nodes: tuple[NodeResources, ...]
    actors: int
    actor_cpus: float
    actor_gpus: float
    audit_workers: int
    audit_cpus: float  # per worker
    audit_gpus: float  # per worker
    audit_nodes: tuple[str, ...]  # the node of each reserved bundle

    def bundles(self) -> list[dict[str, float]]:
        """The audit's placement-group bundles, each pinned to its planned node."""
        pins = {n.name: n.pin for n in self.nodes}
        bundles = []
        for node in self.audit_nodes:
            bundle = {"CPU": self.audit_cpus}
            if self.audit_gpus > 0:
                bundle["GPU"] = self.audit_gpus
            if pins.get(node):
                bundle[pins[node]] = 0.001
            bundles.append(bundle)
        return bundles

    def describe(self) -> str:
        """One line for the terminal."""
        cpus = sum(n.cpus for n in self.nodes)
        gpus = sum(n.gpus for n in self.nodes)
        line = (
            f"resources: {self.where} with {_num(cpus)} CPUs, {_num(gpus)} GPUs; "
            f"{self.actors} client actors x ({_num(self.actor_cpus)} CPU, "
            f"{_num(self.actor_gpus)} GPU)"
        )
        if self.audit_workers:
            line += (
                f"; audit reserves {self.audit_workers} worker(s) x "
                f"({_num(self.audit_cpus)} CPU, {_num(self.audit_gpus)} GPU)"
            )
        return line

    def write(self, run_dir: Path) -> Path:
        """Save the plan as ``resources.json`` in the run directory."""
        path = run_dir / RESOURCES_FILE
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")
        return path


def _num(x: float) -> str:
    return f"{x:g}"


def plan_resources(
    backend: BackendConfig,
    audit: AuditConfig,
    nodes: list[NodeResources],
    where: str,
    audit_workers: int,
) -> ResourcePlan:
    """Place the audit's reservation (``audit_workers`` bundles:
    :func:`~fedsim.audit.tasks.reserved_workers`), then as many client actors as fit
    beside it.

    Raises :class:`ResourceError` naming the keys, what exists and a split that fits.
    """
    total_gpus = sum(n.gpus for n in nodes)
    has = f"{where} has {_num(sum(n.cpus for n in nodes))} CPUs and {_num(total_gpus)} GPUs"
    if backend.num_gpus > 0 and total_gpus == 0:
        raise ResourceError(
            "backend.num-gpus", backend.num_gpus, f"{has}; a split that fits: backend.num-gpus = 0"
        )
    audit_cpus, audit_gpus = float(audit.threads_per_attack), audit.num_gpus
    left, placed = _place_audit(nodes, audit_workers, audit_cpus, audit_gpus, has)
    actors = 0
    for c, g in left.values():
        per_node = math.floor(c / backend.num_cpus + EPS)
        if backend.num_gpus > 0:
            per_node = min(per_node, math.floor(g / backend.num_gpus + EPS))
        actors += max(0, per_node)
    if actors == 0:
        raise _no_client_fits(backend, left, audit_workers, audit_cpus, audit_gpus, has)
    return ResourcePlan(
        where=where,
        nodes=tuple(nodes),
        actors=actors,
        actor_cpus=backend.num_cpus,
        actor_gpus=backend.num_gpus,
        audit_workers=audit_workers,
        audit_cpus=audit_cpus if audit_workers else 0.0,
        audit_gpus=audit_gpus if audit_workers else 0.0,
        audit_nodes=tuple(placed),
    )


def _place_audit(
    nodes: list[NodeResources], workers: int, audit_cpus: float, audit_gpus: float, has: str
) -> tuple[dict[str, list[float]], list[str]]:
    """What each node has left once the audit's bundles are placed, and each bundle's node."""
    left = {n.name: [n.cpus, n.gpus] for n in nodes}
    placed: list[str] = []
    for _ in range(workers):
        # First fit, roomiest node first (GPUs, then CPUs): bundles spread
        # over nodes only when one node cannot hold them.
        fits = [
            name for name, (c, g) in left.items() if c + EPS >= audit_cpus and g + EPS >= audit_gpus
        ]
        if not fits:
            raise ResourceError(
                "audit.workers x (audit.threads-per-attack, audit.num-gpus)",
                f"{workers} x ({_num(audit_cpus)}, {_num(audit_gpus)})",
                f"the audit's reservation does not fit: {has}; "
                f"a split that fits: {_audit_fix(nodes, audit_cpus, audit_gpus)}",
            )
        name = max(fits, key=lambda n: (left[n][1], left[n][0]))
        left[name][0] -= audit_cpus
        left[name][1] -= audit_gpus
        placed.append(name)
    return left, placed


def _no_client_fits(
    backend: BackendConfig,
    left: dict[str, list[float]],
    workers: int,
    audit_cpus: float,
    audit_gpus: float,
    has: str,
) -> ResourceError:
    """The refusal when no client actor fits beside the audit: the key short of room, and a fix."""
    gpus_left = max(g for _, g in left.values())
    cpus_left = max(c for c, _ in left.values())
    if backend.num_gpus > 0 and gpus_left + EPS < backend.num_gpus:
        key, value = "backend.num-gpus", backend.num_gpus
        fix = (
            f"backend.num-gpus = {_num(round(gpus_left, 4))}"
            if gpus_left > EPS
            else f"audit.num-gpus = {_num(round(audit_gpus / 2, 4))}"
        )
        short = f"{_num(gpus_left)} GPU"
    else:
        key, value = "backend.num-cpus", backend.num_cpus
        fix = (
            f"backend.num-cpus = {_num(round(cpus_left, 4))}"
            if cpus_left > EPS
            else "backend.ray-cpus larger or audit.workers smaller"
        )
        short = f"{_num(cpus_left)} CPUs"
    return ResourceError(
        key,
        value,
        f"no client fits beside the audit's reservation ({workers} x "
        f"({_num(audit_cpus)} CPU, {_num(audit_gpus)} GPU)): {has}, {short} left on "
        f"the roomiest node; a split that fits: {fix}",
    )


def _audit_fix(nodes: list[NodeResources], cpus: float, gpus: float) -> str:
    """A smaller audit that fits: fewer workers, or a smaller GPU share."""
    per_node = [
        min(
            math.floor(n.cpus / cpus + EPS) if cpus > 0 else 10**6,
            math.floor(n.gpus / gpus + EPS) if gpus > 0 else 10**6,
        )
        for n in nodes
    ]
    if sum(per_node) >= 1:
        return f"audit.workers = {sum(per_node)}"
    if gpus > 0 and max(n.gpus for n in nodes) > 0:
        return f"audit.num-gpus = {_num(max(n.gpus for n in nodes) / 2)}"
    return "audit.num-gpus = 0, audit.threads-per-attack = 1"


# -- Ray ---------------------------------------------------------------------------


def local_nodes(
    backend: BackendConfig, audit: AuditConfig, audit_workers: int
) -> list[NodeResources]:
    """This machine as the Ray fedsim would start on it (before it starts), with a CPU per
    thread of the audit's ``audit_workers`` on top of its cores."""
    import torch

    cpus = backend.ray_cpus or os.cpu_count() or 1
    cpus += audit_workers * audit.threads_per_attack
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else test_logical_gpus()
    return [NodeResources("this machine", float(cpus), float(gpus))]


def cluster_nodes() -> list[NodeResources]:
    """The connected Ray cluster's live nodes (totals: Flower counts totals too)."""
    import ray

    nodes = []
    for node in ray.nodes():
        res = node.get("Resources") or {}
        if not node.get("Alive", True) or not res:
            continue
        pin = next((k for k in res if k.startswith("node:") and k != "node:__internal_head__"), "")
        nodes.append(
            NodeResources(
                node.get("NodeManagerAddress", pin) + f" ({node['NodeID'][:8]})",
                float(res.get("CPU", 0)),
                float(res.get("GPU", 0)),
                pin,
            )
        )
    return nodes


def check_address_answers(address: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """A Ray head answers at ``address`` (``HOST:PORT``) within ``timeout`` seconds."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ScenarioError(
            "backend.address", address, 'expected "HOST:PORT", e.g. "127.0.0.1:6379"'
        )
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except OSError as err:
        raise ScenarioError(
            "backend.address",
            address,
            f"no Ray cluster answers there within {_num(timeout)} s ({err.strerror or err}); "
            f"start one with `ray start --head --port {port}` or leave backend.address empty",
        ) from None


def ray_runtime_env() -> dict[str, Any]:
    """Workers import fedsim, and the scenario's plugins, from where this driver does (as
    Flower's own init does); every worker's registries import the plugins the scenario
    named (:data:`~fedsim.core.plugins.PLUGINS_ENV`) on their first lookup."""
    paths = [p for p in sys.path if p] + [os.getcwd()]
    pythonpath = os.pathsep.join(dict.fromkeys(paths))
    if os.environ.get("PYTHONPATH"):
        pythonpath += os.pathsep + os.environ["PYTHONPATH"]
    env_vars = {"PYTHONPATH": pythonpath}
    if os.environ.get(PLUGINS_ENV):
        env_vars[PLUGINS_ENV] = os.environ[PLUGINS_ENV]
    return {"env_vars": env_vars}


KEEP_IDLE_WORKERS = {"idle_worker_killing_time_threshold_ms": 3_600_000}
"""Ray's settings for a Ray fedsim starts: idle workers live an hour, not Ray's 1 s.

Ray kills idle workers above its soft limit (the CPU count, which client actors
already fill) after 1 s, so every round's attack tasks started fresh workers
and paid their start-up and torch import again: 6-28 s a round measured here
(a fresh pair per round before, the same pair every round after). A
cluster fedsim joins keeps its own settings.
"""


def start_ray(backend: BackendConfig, audit: AuditConfig, audit_workers: int) -> ResourcePlan:
    """Start or join Ray and return the plan (the audit reserving ``audit_workers``);
    refuses a split before any client starts."""
    import logging

    import ray

    common: dict[str, Any] = {
        "logging_level": logging.ERROR,
        "log_to_driver": False,
        "include_dashboard": False,
        "runtime_env": ray_runtime_env(),
    }
    if backend.address:
        check_address_answers(backend.address)
        ray.init(address=backend.address, **common)
        try:
            where = f"the Ray cluster at {backend.address}"
            return plan_resources(backend, audit, cluster_nodes(), where, audit_workers)
        except BaseException:
            ray.shutdown()
            raise
    (machine,) = local_nodes(backend, audit, audit_workers)
    plan = plan_resources(backend, audit, [machine], "this machine", audit_workers)
    # "local": a new Ray of our own, never a cluster that ``ray start`` left in
    # /tmp/ray/ray_current_cluster (ray.init() without an address joins that one).
    ray.init(
        address="local",
        num_cpus=int(machine.cpus),
        num_gpus=int(machine.gpus),
        _system_config=KEEP_IDLE_WORKERS,
        **common,
    )
    return plan


def reserve_audit(plan: ResourcePlan, timeout: float) -> Any:
    """Hold the audit's bundles as a named placement group; ``None`` without an audit.

    Raises :class:`ResourceWaitError` when the cluster cannot grant it within ``timeout``
    (another job holding the resources the plan counted on).
    """
    if not plan.audit_workers:
        return None
    import ray
    from ray.util.placement_group import placement_group

    group = placement_group(plan.bundles(), strategy="PACK", name=AUDIT_RESERVATION_NAME)
    if not group.wait(timeout_seconds=timeout):
        available = {k: v for k, v in ray.available_resources().items() if k in ("CPU", "GPU")}
        ray.util.remove_placement_group(group)
        raise ResourceWaitError(
            f"the audit's reservation {plan.bundles()} was not granted within "
            f"{_num(timeout)} s: the cluster has {available} available "
            "(another job may hold it); free resources or lower audit.workers / audit.num-gpus"
        )
    return group
