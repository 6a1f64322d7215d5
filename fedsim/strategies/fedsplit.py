"""FedSplit as the FedCG paper's baseline (Gu et al. 2021), not operator splitting.

Clients share only their classifier: the global model is ``classifier.*``
alone, averaged by example count exactly as FedAvg averages whole models;
each client's extractor stays on the client (:mod:`fedsim.clients.fedsplit`).
Evaluation is personalised (each client's own extractor with the shared
classifier on its local test split: the ``client-eval-*`` columns and the
per-client rows of ``clients.csv``). There is no global model to test on the
held-out set (``global_model = False``).

Message contract: FedAvg's (:class:`fedsim.strategies.fedavg.FedAvg`), with
``arrays`` holding the shared parameters only (``classifier.*``,
``fedsim.core.protocol.FEDSPLIT_SHARED``) both ways; a client merges them
into its own network and replies with its classifier.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedsim.core import protocol
from fedsim.strategies.fedavg import FedAvg
from fedsim.strategies.registry import STRATEGIES


@dataclass(frozen=True)
class FedSplitParams:
    """FedSplit has no hyper-parameters beyond the scenario's client config."""


@STRATEGIES.register("fedsplit")
class FedSplit(FedAvg):
    """FedAvg over the shared part of the network only."""

    Params: ClassVar[type] = FedSplitParams
    client_routine: ClassVar[str] = "fedsplit"
    shared_prefixes: ClassVar[tuple[str, ...]] = protocol.FEDSPLIT_SHARED
    global_model: ClassVar[bool] = False  # without a client's private extractor, nothing to test
