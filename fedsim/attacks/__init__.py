"""Gradient-inversion attacks, found by name in :data:`ATTACKS`.

An attack sees only an :class:`~fedsim.attacks.base.Observation` (what the server
received and sent) and returns a :class:`~fedsim.attacks.base.Reconstruction`.
Ground truth never enters this package; scoring lives in :mod:`fedsim.core.metrics`.

The public classes at package level::

    from fedsim.attacks import DLG, InvertingGradients, Observation, create_attack
"""

from __future__ import annotations

from fedsim.attacks.adam_signs import AdamSigns
from fedsim.attacks.aligned import AlignedDLG
from fedsim.attacks.analytic import AnalyticFC
from fedsim.attacks.base import Attack, Observation, Reconstruction
from fedsim.attacks.cocktail import CocktailParty
from fedsim.attacks.dager import Dager
from fedsim.attacks.dlg import DLG
from fedsim.attacks.fedavg_leakage import FedAvgLeakage
from fedsim.attacks.generator_leak import GeneratorRepresentatives
from fedsim.attacks.grnn import GRNN
from fedsim.attacks.ig import InvertingGradients
from fedsim.attacks.label_leaks import LLG, GradientCount
from fedsim.attacks.membership import GradientAlignment, LossDrop
from fedsim.attacks.registry import ATTACKS, create_attack, resolve_attack
from fedsim.attacks.representatives import ClassRepresentatives
from fedsim.attacks.rgap import RGAP
from fedsim.attacks.sapag import SAPAG
from fedsim.attacks.spear import Spear
from fedsim.attacks.tag import Tag
from fedsim.attacks.unrolled import UnrolledDLG
from fedsim.attacks.vertices import BoxVertices

__all__ = [
    "ATTACKS",
    "DLG",
    "GRNN",
    "LLG",
    "RGAP",
    "SAPAG",
    "AdamSigns",
    "AlignedDLG",
    "AnalyticFC",
    "Attack",
    "BoxVertices",
    "ClassRepresentatives",
    "CocktailParty",
    "Dager",
    "FedAvgLeakage",
    "GeneratorRepresentatives",
    "GradientAlignment",
    "GradientCount",
    "InvertingGradients",
    "LossDrop",
    "Observation",
    "Reconstruction",
    "Spear",
    "Tag",
    "UnrolledDLG",
    "create_attack",
    "resolve_attack",
]
