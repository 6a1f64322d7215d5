"""Server-side strategies (Flower ``Strategy`` subclasses), found by name in :data:`STRATEGIES`.

The public classes at package level, as ``flwr.serverapp.strategy`` has them::

    from fedsim.strategies import FedAvg, FedCG, FedProx, FedSplit, Local
"""

from __future__ import annotations

from fedsim.strategies.fedavg import FedAvg
from fedsim.strategies.fedcg import FedCG
from fedsim.strategies.fedprox import FedProx
from fedsim.strategies.fedsplit import FedSplit
from fedsim.strategies.local import Local
from fedsim.strategies.registry import STRATEGIES

__all__ = ["STRATEGIES", "FedAvg", "FedCG", "FedProx", "FedSplit", "Local"]
