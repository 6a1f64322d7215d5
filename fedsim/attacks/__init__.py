"""Gradient-inversion attacks, found by name in :data:`ATTACKS`, and the leak analyses
besides reconstruction, found by name in :data:`~fedsim.attacks.leakage.LEAKS`.

An attack sees only an :class:`~fedsim.attacks.base.Observation` (what the server
received and sent) and returns a :class:`~fedsim.attacks.base.Reconstruction`.
Ground truth never enters this package; scoring lives in :mod:`fedsim.core.metrics`.

The package by role:

- here, the contracts: :mod:`~fedsim.attacks.base` (``Attack``, ``Observation``,
  ``Reconstruction``), :mod:`~fedsim.attacks.registry` (``ATTACKS``),
  :mod:`~fedsim.attacks.presets` (``StepCaps``), :mod:`~fedsim.attacks.leakage`
  (``LeakAnalysis``, its input and outputs, ``LEAKS``);
- :mod:`fedsim.attacks.reconstruction`: the reconstruction attacks, one module each;
- :mod:`fedsim.attacks.leaks`: the leak analyses, one module each;
- :mod:`fedsim.attacks.toolkits`: the machinery they share (gradients, label inference,
  the client's replay, the gradient-matching loop, closed-form reads, the analytic
  attacks' bases, ...).

An attack or analysis imports the contracts and the toolkits, never another attack or
analysis (``tests/test_layers.py``).

The public classes at package level::

    from fedsim.attacks import DLG, InvertingGradients, Observation, create_attack
"""

from __future__ import annotations

from fedsim.attacks.base import Attack, Observation, Reconstruction
from fedsim.attacks.leaks.generator_leak import GeneratorRepresentatives
from fedsim.attacks.leaks.label_leaks import LLG, GradientCount
from fedsim.attacks.leaks.membership import GradientAlignment, LossDrop
from fedsim.attacks.leaks.representatives import ClassRepresentatives
from fedsim.attacks.reconstruction.adam_signs import AdamSigns
from fedsim.attacks.reconstruction.aligned import AlignedDLG
from fedsim.attacks.reconstruction.analytic_fc import AnalyticFC
from fedsim.attacks.reconstruction.cocktail import CocktailParty
from fedsim.attacks.reconstruction.dager import Dager
from fedsim.attacks.reconstruction.dlg import DLG
from fedsim.attacks.reconstruction.fedavg_leakage import FedAvgLeakage
from fedsim.attacks.reconstruction.grnn import GRNN
from fedsim.attacks.reconstruction.ig import InvertingGradients
from fedsim.attacks.reconstruction.rgap import RGAP
from fedsim.attacks.reconstruction.sapag import SAPAG
from fedsim.attacks.reconstruction.spear import Spear
from fedsim.attacks.reconstruction.tag import Tag
from fedsim.attacks.reconstruction.unrolled import UnrolledDLG
from fedsim.attacks.reconstruction.vertices import BoxVertices
from fedsim.attacks.registry import ATTACKS, create_attack, resolve_attack

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
