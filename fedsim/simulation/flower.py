"""The one place fedsim touches Flower's internals.

Everything else uses Flower's public API (``flwr.app``, ``flwr.clientapp``,
``flwr.serverapp``, ``flwr.simulation``). What is here depends on a Flower
internal and checks it before relying on it, falling back to Flower's public
behaviour when the internal changed:

- :func:`waiting_nodes_polling`: while a simulation runs, Flower's loop that
  hands messages to the client actors asks only nodes with a waiting message.
  Applied only when Flower's function is exactly the one it replaces
  (:data:`REPLACED_SOURCE`), and restored afterwards.
- :func:`actor_pool_size`: Flower's simulation starts the number of client
  actors fedsim's resource plan computed (:mod:`fedsim.simulation.resources`)
  instead of one per CPU/GPU share of each node's total, which leaves no room
  for the audit. Applied only when Flower's actor pool still takes its size
  from :data:`POOL_SIZE_CALL`, and restored afterwards.
- :func:`registered_partitions`: the node of each partition, read from the
  order in which the simulation registered its nodes.
- :func:`message_context`: lets tests and benches build server messages
  outside a running Flower app.
- :func:`quiet_flower`: Flower's and Ray's log noise and environment pitfalls.
- :func:`simulated`: whether a ServerApp's grid is Flower's simulation grid
  (whose Ray backend runs in the ServerApp's own process).
"""

from __future__ import annotations

import inspect
import logging
import os
import queue
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flwr.app import Message
from flwr.serverapp import Grid

log = logging.getLogger(__name__)

# flwr 1.42's vce_api.add_messages_to_queue, which waiting_nodes_polling replaces.
REPLACED_SOURCE = '''def add_messages_to_queue(
    state: LinkState,
    queue: Queue[Message],
    nodes_mapping: NodeToPartitionMapping,
    f_stop: threading.Event,
) -> None:
    """Put Messages in the queue from the LinkState."""
    while not f_stop.is_set():
        for node_id in nodes_mapping.keys():
            message_ins_list = state.get_message_ins(node_id=node_id, limit=1)
            for msg in message_ins_list:
                queue.put(msg)
        f_stop.wait(0.1)
'''


def _vce_api() -> Any:
    from flwr.server.superlink.fleet.vce import vce_api

    return vce_api


def replaced_function_unchanged() -> bool:
    """Whether Flower's message loop is the one :func:`waiting_nodes_polling` was written for."""
    try:
        return inspect.getsource(_vce_api().add_messages_to_queue) == REPLACED_SOURCE
    except (ImportError, AttributeError, OSError, TypeError):
        return False


def _queue_waiting_messages(
    state: Any,
    queue: queue.Queue[Message],  # named as in Flower, whose signature it replaces
    nodes_mapping: dict[int, int],
    f_stop: threading.Event,
) -> None:
    """Flower's ``add_messages_to_queue``, asking only nodes that have a message.

    Flower's loop asks every node for a message ten times a second, and each
    ask scans the whole message store under the state's lock: 20 ms a sweep at
    1,000 clients, so a round cost more server CPU the more clients existed,
    sampled or not. One pass over the store finds the nodes with an
    undelivered message; they are asked in Flower's order (the nodes'
    registration order), one message each. Nothing here walks the nodes: a
    sweep over 100,000 of them took 19 ms, ten times a second (0.03 ms now).
    A state without the in-memory store's fields gets Flower's own loop.
    """
    if not all(hasattr(state, a) for a in ("lock", "message_ins_store", "get_message_ins")):
        _ORIGINAL["add_messages_to_queue"](state, queue, nodes_mapping, f_stop)
        return
    while not f_stop.is_set():
        with state.lock:
            waiting = {
                m.metadata.dst_node_id
                for m in state.message_ins_store.values()
                if m.metadata.delivered_at == ""
            }
        asked = [node for node in waiting if node in nodes_mapping]
        for node_id in sorted(asked, key=nodes_mapping.__getitem__):
            for message in state.get_message_ins(node_id=node_id, limit=1):
                queue.put(message)
        f_stop.wait(0.1)


_ORIGINAL: dict[str, Any] = {}


@contextmanager
def waiting_nodes_polling() -> Iterator[bool]:
    """Within the block, a simulation polls only nodes with waiting messages.

    Yields whether the replacement is active: it is not when Flower's function
    differs from :data:`REPLACED_SOURCE` (then Flower's own loop runs, slower
    with many clients but correct). Flower's function is restored on exit.
    """
    if not replaced_function_unchanged():
        log.info("Flower's simulation loop changed; keeping its own message polling")
        yield False
        return
    vce_api = _vce_api()
    original = vce_api.add_messages_to_queue
    _ORIGINAL["add_messages_to_queue"] = original
    vce_api.add_messages_to_queue = _queue_waiting_messages
    try:
        yield True
    finally:
        vce_api.add_messages_to_queue = original


# How flwr 1.42's BasicActorPool sizes itself; actor_pool_size replaces the callee.
POOL_SIZE_CALL = "self.actors_capacity = pool_size_from_resources(client_resources)"


@contextmanager
def actor_pool_size(actors: int) -> Iterator[bool]:
    """Within the block, Flower's simulation starts exactly ``actors`` client actors.

    Yields whether the replacement is active: it is not when Flower's actor
    pool no longer calls :data:`POOL_SIZE_CALL` (then Flower counts actors
    itself, and the run's bounded waits report any actor left unplaced).
    """
    from flwr.simulation.ray_transport import ray_actor

    try:
        sized_there = POOL_SIZE_CALL in inspect.getsource(ray_actor.BasicActorPool.__init__)
    except (AttributeError, OSError, TypeError):
        sized_there = False
    if not sized_there:
        log.warning("Flower's actor pool changed; it sizes itself from the cluster's totals")
        yield False
        return
    original = ray_actor.pool_size_from_resources

    def planned(client_resources: dict[str, int | float]) -> int:
        return actors

    ray_actor.pool_size_from_resources = planned
    try:
        yield True
    finally:
        ray_actor.pool_size_from_resources = original


def registered_partitions(grid: Grid, nodes: list[int]) -> dict[int, int] | None:
    """Partition -> node from the order the simulation registered its nodes, if readable.

    Flower's simulation registers partition ``i`` as the ``i``-th node of its
    in-memory link state (flwr 1.42, ``vce_api._register_nodes``). Reading that
    order replaces one query message per node (54 s for 1,000 clients on two
    cores). ``None`` when the grid has no such state (other grids, other
    Flower versions): the caller then asks every node. Callers check the map
    against replies, so a change in Flower fails loudly, never silently.
    """
    registered = getattr(getattr(grid, "state", None), "nodes", None)
    if not isinstance(registered, dict) or set(registered) != set(nodes):
        return None
    return {partition: int(node) for partition, node in enumerate(registered)}


def simulated(grid: Grid) -> bool:
    """Whether ``grid`` is Flower's in-memory simulation grid (flwr 1.42: ``InMemoryGrid``).

    On other versions, a grid holding a link state in memory (``grid.state``)
    counts as simulated, as :func:`registered_partitions` reads it.
    """
    try:
        from flwr.superlink.grid import InMemoryGrid
    except ImportError:
        return hasattr(grid, "state")
    return isinstance(grid, InMemoryGrid)


@contextmanager
def message_context() -> Iterator[None]:
    """Flower builds server messages only inside a run: play the SuperLink's part.

    For tests and benches that drive strategies without a Flower app.
    """
    from flwr.supercore.task_identity import TaskIdentity

    saved = TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 1
    try:
        yield
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


def quiet_flower(*filters: logging.Filter) -> None:
    """Flower logs only errors (with ``filters``); Ray's and Flower's environment pitfalls set.

    Flower logs every phase at INFO; fedsim prints its own per-round lines.
    ``run_simulation``'s deprecation notice is a warning users cannot act on.
    """
    flwr_logger = logging.getLogger("flwr")
    flwr_logger.setLevel(logging.ERROR)
    for new in filters:
        if not any(type(f) is type(new) for f in flwr_logger.filters):
            flwr_logger.addFilter(new)
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    # A stale address file makes ray.init() retry a dead cluster.
    stale = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
    if stale.exists() and not os.environ.get("RAY_ADDRESS"):
        stale.unlink(missing_ok=True)
