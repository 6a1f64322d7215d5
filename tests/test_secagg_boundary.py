"""Flower 1.42's SecAgg+ does not carry fedsim's Message API strategies or replies.

Pins the boundary described in docs/audit.md ("Secure aggregation's view"):
``SecAggPlusWorkflow`` runs only under a ``LegacyContext`` and calls the legacy
``Strategy.configure_fit``/``aggregate_fit``, and ``secaggplus_mod`` reads the
train reply as legacy ``fitres.*`` records, not fedsim's ``arrays``/``metrics``.
All in process: no Ray, no SuperLink, no training.

When a test here fails, Flower has started to accept what fedsim sends: revisit
that paragraph of docs/audit.md before changing the test.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.common.secure_aggregation.secaggplus_constants import (
    RECORD_KEY_CONFIGS,
    RECORD_KEY_STATE,
    Key,
    Stage,
)
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey

from fedsim.core import protocol
from fedsim.strategies.fedavg import FedAvg

NO_GRID: Any = None  # both server-side attempts fail before the workflow sends anything


def _context() -> Context:
    return Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})


def _workflow() -> SecAggPlusWorkflow:
    return SecAggPlusWorkflow(num_shares=3, reconstruction_threshold=2)


def test_the_workflow_needs_a_legacy_context() -> None:
    # What Strategy.start and fedsim's round loop hold is a plain Context.
    with pytest.raises(TypeError, match="Expect a LegacyContext, but get Context"):
        _workflow()(NO_GRID, _context())


def test_the_workflow_calls_the_legacy_strategy_api() -> None:
    # A LegacyContext holding fedsim's FedAvg (flwr.serverapp.strategy.FedAvg):
    # the workflow asks it for configure_fit, which Message API strategies lack.
    context = LegacyContext(_context(), strategy=FedAvg())  # type: ignore[arg-type]
    context.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({WorkflowKey.CURRENT_ROUND: 1})
    context.state.array_records[MAIN_PARAMS_RECORD] = ArrayRecord()
    with pytest.raises(AttributeError, match="'FedAvg' object has no attribute 'configure_fit'"):
        _workflow()(NO_GRID, context)


def test_the_client_mod_reads_legacy_fit_results(message_identity: None) -> None:
    # The client's stage that trains: secaggplus_mod passes the message on, then
    # reads the reply as a legacy FitRes. fedsim's ClientApp replies with
    # ``arrays`` and ``metrics`` (fedsim.clients.app).
    context = _context()
    context.state.config_records[RECORD_KEY_STATE] = ConfigRecord(
        {"current_stage": Stage.SHARE_KEYS}
    )
    stage = ConfigRecord(
        {Key.STAGE: Stage.COLLECT_MASKED_VECTORS, Key.CIPHERTEXT_LIST: [], Key.SOURCE_LIST: []}
    )
    message = Message(
        RecordDict({RECORD_KEY_CONFIGS: stage}), dst_node_id=100, message_type="train"
    )

    def fedsim_train(msg: Message, _: Context) -> Message:
        arrays = ArrayRecord(torch.nn.Linear(2, 2).state_dict())
        metrics = MetricRecord({protocol.NUM_EXAMPLES: 8, protocol.PARTITION_ID: 0})
        content = RecordDict({protocol.ARRAYS: arrays, protocol.METRICS: metrics})
        return Message(content=content, reply_to=msg)

    with pytest.raises(KeyError, match=r"'fitres\.parameters'"):
        secaggplus_mod(message, context, fedsim_train)
