"""The client routine of tinylab's strategy: cross-entropy with label smoothing."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from flwr.app import ConfigRecord
from torch import nn

from fedsim.clients import CLIENT_ROUTINES
from fedsim.clients.base import ClientRoutine
from fedsim.core import protocol
from fedsim.core.models import SplitNet
from fedsim.core.training import LossFn
from tinylab.protocol import SMOOTHING


@CLIENT_ROUTINES.register("tinylab-smooth")
class SmoothClient(ClientRoutine):
    """Trains the whole model on label-smoothed cross-entropy; uploads all of it."""

    def loss(self, model: SplitNet, config: ConfigRecord) -> LossFn:
        smoothing = protocol.read_float(config, SMOOTHING)

        def loss(net: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(net(images), labels, label_smoothing=smoothing)

        return loss
