"""The one module that touches Flower internals checks them before relying on them."""

from __future__ import annotations

import queue
import threading
from types import SimpleNamespace

import pytest
from flwr.app import Message, RecordDict
from flwr.server.superlink.fleet.vce import vce_api

from fedsim.engine import flower


def test_replaced_flower_function_is_the_saved_source() -> None:
    # Fails when an upgrade changes Flower's message loop: then the replacement
    # must be re-checked against the new source and REPLACED_SOURCE updated.
    assert flower.replaced_function_unchanged()


def test_polling_patch_is_scoped_and_restored_on_error() -> None:
    original = vce_api.add_messages_to_queue
    with pytest.raises(RuntimeError, match="boom"), flower.waiting_nodes_polling() as active:
        assert active
        assert vce_api.add_messages_to_queue is not original
        raise RuntimeError("boom")
    assert vce_api.add_messages_to_queue is original


def test_changed_flower_function_keeps_flowers_own_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flower, "REPLACED_SOURCE", flower.REPLACED_SOURCE + "# changed\n")
    original = vce_api.add_messages_to_queue
    with flower.waiting_nodes_polling() as active:
        assert not active
        assert vce_api.add_messages_to_queue is original


class _Store:
    """The in-memory link state's fields the replacement reads, recording every ask."""

    def __init__(self, waiting: dict[int, list[Message]]) -> None:
        self.lock = threading.Lock()
        self.waiting = waiting
        self.asked: list[int] = []
        self.message_ins_store = {
            id(m): SimpleNamespace(metadata=SimpleNamespace(dst_node_id=node, delivered_at=""))
            for node, messages in waiting.items()
            for m in messages
        }

    def get_message_ins(self, node_id: int, limit: int) -> list[Message]:
        self.asked.append(node_id)
        return self.waiting.get(node_id, [])[:limit]


def test_replacement_asks_only_nodes_with_waiting_messages() -> None:
    with flower.message_context():
        messages = {
            node: [Message(content=RecordDict(), dst_node_id=node, message_type="train")]
            for node in (11, 13)
        }
    store = _Store(messages)
    delivered: queue.Queue[Message] = queue.Queue()
    stop = threading.Event()
    with flower.waiting_nodes_polling():
        poller = threading.Thread(
            target=vce_api.add_messages_to_queue,
            args=(store, delivered, {node: p for p, node in enumerate(range(10, 15))}, stop),
        )
        poller.start()
        first, second = delivered.get(timeout=5), delivered.get(timeout=5)
        stop.set()
        poller.join(timeout=5)
    assert {first.metadata.dst_node_id, second.metadata.dst_node_id} == {11, 13}
    assert set(store.asked) == {11, 13}
