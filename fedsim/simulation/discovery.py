"""Which node is which partition: asked once at the start of a run.

Flower's simulation gives nodes random ids; every fedsim client knows its
partition id (node config ``partition-id``) and names it in every reply.
"""

from __future__ import annotations

import time

import numpy as np
from flwr.app import Message, MessageType, RecordDict
from flwr.serverapp import Grid

from fedsim.core import protocol
from fedsim.simulation.flower import registered_partitions


def _wait_for_nodes(grid: Grid, expected: int | None, wait_s: float) -> list[int]:
    # run_simulation starts the ServerApp before it registers the simulated
    # nodes; with many clients the first look sees only some of them.
    # Each look walks every registered node under the link state's lock (0.16 s at
    # 10,000 clients), holding up the registration it waits for: look again after
    # four times as long as the look took, so looking costs at most a fifth.
    deadline = time.monotonic() + wait_s
    while True:
        started = time.monotonic()
        nodes = sorted(grid.get_node_ids())
        if expected is None or len(nodes) >= expected:
            return nodes
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"only {len(nodes)} of {expected} simulated clients connected in {wait_s:.0f}s"
            )
        time.sleep(max(0.05, 4 * (time.monotonic() - started)))


def _query_partitions(grid: Grid, nodes: list[int], wait_s: float) -> dict[int, int]:
    """Partition -> node by asking every node (a ``query`` message each), within ``wait_s``."""
    queries = [
        Message(content=RecordDict(), message_type=MessageType.QUERY, dst_node_id=node)
        for node in nodes
    ]
    mapping: dict[int, int] = {}
    replies = list(grid.send_and_receive(queries, timeout=wait_s))
    if len(replies) < len(queries):
        raise RuntimeError(
            f"only {len(replies)} of {len(queries)} clients answered the first query within "
            f"{wait_s:.0f} s: the client actors were never started or placed (see the "
            "resources line at the start of the run)"
        )
    for reply in replies:
        if reply.has_error():
            raise RuntimeError(f"node {reply.metadata.src_node_id} failed discovery")
        partition = protocol.read_int(reply.content[protocol.METRICS], protocol.PARTITION_ID)
        mapping[partition] = reply.metadata.src_node_id
    return mapping


def discover_partitions(
    grid: Grid, *, expected: int | None = None, probes: int = 0, wait_s: float = 300.0
) -> dict[int, int]:
    """Partition -> node for every connected node (waiting for at least ``expected``).

    When the map comes from the simulation's registration order, ``probes``
    nodes spread over the partitions are queried all the same: their answers
    check the map early, and the queries warm the simulation's actors
    (imports, data) before the first round's reply deadline starts.
    """
    nodes = _wait_for_nodes(grid, expected, wait_s)
    mapping = registered_partitions(grid, nodes)
    if mapping is None:
        return _query_partitions(grid, nodes, wait_s)
    spread = np.linspace(0, len(mapping) - 1, min(probes, len(mapping))).round()
    answered = _query_partitions(grid, sorted({mapping[int(p)] for p in spread}), wait_s)
    wrong = [p for p, node in answered.items() if mapping.get(p) != node]
    if wrong:
        raise RuntimeError(
            f"partition {wrong[0]} answered from node {answered[wrong[0]]}, not from the "
            "node registered for it: Flower's simulation no longer registers "
            "partitions in order"
        )
    return mapping
