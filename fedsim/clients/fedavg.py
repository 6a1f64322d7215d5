"""FedAvg's client: plain local training of the whole received model."""

from __future__ import annotations

from fedsim.clients import CLIENT_ROUTINES
from fedsim.clients.base import ClientRoutine


@CLIENT_ROUTINES.register("fedavg")
class FedAvgClient(ClientRoutine):
    """Trains every parameter with cross-entropy; uploads the whole model."""
