"""DLG (Zhu et al. 2019): match the squared L2 distance between gradients.

Dummy images ``x' ~ N(0, 1)`` and dummy label logits ``y' ~ N(0, 1)`` (soft
labels through a softmax) are optimised jointly to minimise
``sum_layers ||g(x', y') - g||^2`` with L-BFGS (lr 1, PyTorch defaults: 20
evaluations per step) for 300 steps. ``labels = "infer"`` gives iDLG: the
label is read from the last layer first and kept fixed. The objective, its
settings (:class:`~fedsim.attacks.toolkits.dlg_matching.DLGParams`) and step caps
are :class:`~fedsim.attacks.toolkits.dlg_matching.DLGMatching`'s, which
``unrolled-dlg`` and ``aligned-dlg`` extend too.
"""

from __future__ import annotations

from fedsim.attacks.registry import ATTACKS
from fedsim.attacks.toolkits.dlg_matching import DLGMatching


@ATTACKS.register("dlg")
class DLG(DLGMatching):
    """Deep Leakage from Gradients."""
