"""tinylab's strategy: FedAvg whose clients train with label smoothing."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid

from fedsim.core.config import require
from fedsim.strategies.fedavg import FedAvg
from fedsim.strategies.registry import STRATEGIES
from tinylab.protocol import SMOOTHING


@dataclass(frozen=True)
class SmoothParams:
    """``smoothing``: the label-smoothing weight each client trains with."""

    smoothing: float = 0.1

    def __post_init__(self) -> None:
        require(0 <= self.smoothing < 1, "smoothing", self.smoothing, "must be in [0, 1)")


@STRATEGIES.register("tinylab-smooth")
class SmoothFedAvg(FedAvg):
    """FedAvg that sends tinylab-smoothing to its clients (routine tinylab-smooth)."""

    Params: ClassVar[type] = SmoothParams
    client_routine: ClassVar[str] = "tinylab-smooth"

    def __init__(self, smoothing: float = 0.1, **flower_options: Any) -> None:
        super().__init__(**flower_options)
        self.params = SmoothParams(smoothing)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        config[SMOOTHING] = self.params.smoothing
        return super().configure_train(server_round, arrays, config, grid)
