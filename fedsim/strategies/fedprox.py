"""FedProx (Li et al. 2020): FedAvg whose clients add a proximal term.

The server side is FedAvg plus one public train-config entry,
``proximal-mu``; the client (:mod:`fedsim.clients.fedprox`) adds
``(mu / 2) * ||w - w_global||^2`` to its loss. ``mu = 0`` is FedAvg exactly.

With stragglers (``federation.stragglers``) FedProx aggregates their partial
work where FedAvg drops it: the paper's second difference from FedAvg.

Message contract: FedAvg's (:class:`fedsim.strategies.fedavg.FedAvg`), and
train ``config`` adds ``proximal-mu`` (``fedsim.core.protocol.PROXIMAL_MU``),
as Flower's own ``FedProx`` sends it, so either answers the other's clients.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid

from fedsim.core import protocol
from fedsim.core.config import require
from fedsim.strategies.fedavg import FedAvg
from fedsim.strategies.registry import STRATEGIES


@dataclass(frozen=True)
class FedProxParams:
    """``proximal-mu``: weight of the proximal term (the FedCG paper tries 0.001 to 1)."""

    proximal_mu: float = 0.01

    def __post_init__(self) -> None:
        require(self.proximal_mu >= 0, "proximal-mu", self.proximal_mu, "must be >= 0")


@STRATEGIES.register("fedprox")
class FedProx(FedAvg):
    """FedAvg that sends ``proximal-mu`` to its clients and aggregates stragglers' partial work."""

    Params: ClassVar[type] = FedProxParams
    client_routine: ClassVar[str] = "fedprox"
    straggler_replies: ClassVar[Literal["drop", "aggregate"] | None] = "aggregate"

    def __init__(self, proximal_mu: float = 0.01, **flower_options: Any) -> None:
        super().__init__(**flower_options)
        self.params = FedProxParams(proximal_mu)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        config[protocol.PROXIMAL_MU] = self.params.proximal_mu
        return super().configure_train(server_round, arrays, config, grid)
