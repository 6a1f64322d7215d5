"""The ``local`` baseline (FedCG Table 1): every client trains alone.

Nothing is shared or averaged: train messages carry an empty model and the
round's config, replies an empty model and metrics. Each client's whole
network is its private state (:mod:`fedsim.clients.local`), evaluated on its local
test split (``client-eval-*``); there is no global model.

Message contract: FedAvg's (:class:`fedsim.strategies.fedavg.FedAvg`) with an
empty ``arrays`` both ways.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedsim.strategies.fedsplit import FedSplit
from fedsim.strategies.registry import STRATEGIES


@dataclass(frozen=True)
class LocalParams:
    """The local baseline has no hyper-parameters beyond the scenario's client config."""


@STRATEGIES.register("local")
class Local(FedSplit):
    """FedSplit with nothing shared."""

    Params: ClassVar[type] = LocalParams
    client_routine: ClassVar[str] = "local"
    shared_prefixes: ClassVar[tuple[str, ...]] = ()
    weighted_mean: ClassVar[bool] = False  # nothing is uploaded
    plain_mean: ClassVar[bool] = False
