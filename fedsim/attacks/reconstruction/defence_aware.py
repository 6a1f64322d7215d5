"""Defence-aware gradient matching: DLG and Inverting Gradients that know the defence.

Kerckhoffs's principle: the server knows which defence its clients run and with what
parameters (they are in the scenario, like the learning rate), not the client's data.
Balunović et al. ("Bayesian Framework for Gradient Leakage", ICLR 2022; code
eth-sri/bayes-framework-leakage) broke Soteria, ATS and PRECODE with attacks that model
the defence instead of matching its output as if it were the gradient. Here the attacker
reads, from the observed tensor and the known defence, the set each true entry lies in
(a *cell* ``[low, high]``) and matches the dummy's gradient to that set:

- ``soteria``: the zeroed columns of the defended layer are visible (exact zeros; a
  sigmoid network's feature is never 0): those entries are unconstrained, every other
  entry is exact;
- ``prune``: a zero entry was pruned, so its magnitude was at most the smallest kept
  one (``scope = "layer"``: in its tensor; ``"global"``: in the whole upload), the
  kept entries are exact;
- ``quantize``: each entry lies within half a step of its level, the step being the
  tensor's largest magnitude over ``2^(bits-1) - 1`` (the largest entry is a level);
  ``half`` casts lose at most a relative 2^-11 (2^-25 below half's normal range, in
  the units of a probe's gradient).

``dlg-defence-aware`` matches with ``sum ||g' - clamp(g', low, high)||^2`` (DLG's
distance where the cells are points; zero inside a cell); ``ig-defence-aware`` takes
Inverting Gradients' cosine between ``g'`` and its projection onto the cells, over the
constrained entries. Both scale with the update's units (an update read as a gradient
divides every entry by ``lr * steps``: zeros stay zeros and steps stay the largest
magnitude's share). ``audit.attacks = "auto"`` runs them where a scenario lists one of
these defences (the last of them in the chain, which decides what the server sees) and
sets ``defence`` and its parameters from it; listed by hand they take what is written.
Under secure aggregation (``aggregate``) the sum hides each client's zeros and levels,
so they do not apply there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from fedsim.attacks.base import AttackSetting, Observation
from fedsim.attacks.registry import ATTACKS
from fedsim.attacks.toolkits.dlg_matching import DLGMatching
from fedsim.attacks.toolkits.ig_matching import IGMatching
from fedsim.attacks.toolkits.matching import GradientMatchingAttack
from fedsim.core.config import ComponentConfig, ScenarioError
from fedsim.core.params.matching import (
    MODELLED,
    DefenceAwareDLGParams,
    DefenceAwareIGParams,
    DefenceModel,
)
from fedsim.core.threat import ThreatModel

HALF_RELATIVE = 2.0**-11  # half precision's round-to-nearest error, relative (normal range)
HALF_SUBNORMAL = 2.0**-25  # and absolute, below it (half the smallest subnormal step)


def cells(model: DefenceModel, target: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``[low_0, high_0, low_1, high_1, ...]``: per observed tensor, the bounds each true
    entry lies within under ``model`` (``-inf, inf``: unconstrained; ``low = high``: exact)."""
    if model.defence == "soteria":
        out = []
        for t in target:
            free = t == 0
            out += [t.masked_fill(free, -torch.inf), t.masked_fill(free, torch.inf)]
        return out
    if model.defence == "prune":
        return _pruned_cells(target, model.scope)
    return _quantised_cells(target, model.bits, model.half)


def _smallest_kept(t: torch.Tensor) -> torch.Tensor:
    kept = t.abs()[t != 0]
    return kept.min() if kept.numel() else torch.tensor(torch.inf, device=t.device)


def _pruned_cells(target: Sequence[torch.Tensor], scope: str) -> list[torch.Tensor]:
    """A zero was pruned, so its magnitude was at most the smallest kept one (within its
    tensor or the whole upload): an upper bound also under a global ranking."""
    smallest = [_smallest_kept(t) for t in target]
    overall = torch.stack(smallest).min()
    out = []
    for t, own in zip(target, smallest, strict=True):
        bound = overall if scope == "global" or torch.isinf(own) else own
        zero = t == 0
        out += [torch.where(zero, -bound, t), torch.where(zero, bound, t)]
    return out


def _quantised_cells(target: Sequence[torch.Tensor], bits: int, half: bool) -> list[torch.Tensor]:
    """Each entry within half a level of its observed level."""
    out = []
    levels = 2 ** (bits - 1) - 1
    for t in target:
        if half:
            width = torch.clamp(t.abs() * HALF_RELATIVE, min=HALF_SUBNORMAL)
        else:
            width = t.abs().max() / levels / 2
        out += [t - width, t + width]
    return out


def defence_model(defences: Sequence[ComponentConfig]) -> DefenceModel | None:
    """The model of the last of ``defences`` (a scenario's chain) that this module models,
    with its parameters; ``None`` when the chain has none of them."""
    known = [d for d in defences if d.name in MODELLED]
    if not known:
        return None
    last = known[-1]
    params = {k.replace("-", "_"): v for k, v in last.params.items()}
    return DefenceModel(
        defence=last.name,  # type: ignore[arg-type]
        scope=params.get("scope", "layer"),
        bits=int(params.get("bits", 8)),
        half=bool(params.get("half", False)),
    )


def project(dummy: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """``dummy`` clamped into its cells (where it would be if the defence let it through)."""
    return torch.maximum(torch.minimum(dummy, high), low)


class DefenceAware(GradientMatchingAttack):
    """What the defence-aware attacks share: the scenario check, the preset, the cells and
    the fidelity residual against them."""

    threat_models = frozenset({ThreatModel.PROBE, ThreatModel.UPDATE})
    in_auto = True
    params: Any

    @classmethod
    def check_setting(cls, setting: AttackSetting, key: str) -> None:
        """Refused where the scenario's clients run none of the modelled defences."""
        if defence_model(setting.defences) is None:
            raise ScenarioError(
                f"{key}.name",
                ATTACKS.name_of(cls),
                "models a soteria, prune or quantize defence of the clients; this scenario "
                "lists none (the plain attack is the same there)",
            )

    @classmethod
    def audit_preset(cls, setting: AttackSetting) -> dict[str, Any]:
        """The plain attack's preset and the scenario's last modelled defence (Kerckhoffs)."""
        preset: dict[str, Any] = super().audit_preset(setting)
        model = defence_model(setting.defences)
        if model is None:
            return preset
        return preset | {
            "defence": model.defence,
            "scope": model.scope,
            "bits": model.bits,
            "half": model.half,
        }

    def defence_cells(self, target: list[torch.Tensor]) -> list[torch.Tensor]:
        """The cells of ``target`` under the modelled defence (:func:`cells`)."""
        p = self.params
        return cells(DefenceModel(p.defence, p.scope, p.bits, p.half), target)

    def fidelity_residual(
        self, observation: Observation, images: torch.Tensor, labels: torch.Tensor, seed: int = 0
    ) -> float:
        """``||simulated - cells(simulated)|| / ||observed||``: zero (up to rounding) when the
        true batch's gradient lies in every cell, i.e. the defence is modelled exactly."""
        problem = self.build_problem([observation], seed, infer=False)
        params = {k: v[0] for k, v in problem.params.items()}
        x = observation.normalization.to_model(images.to(self.device, torch.float32))
        y = F.one_hot(labels.to(self.device).long(), problem.num_classes).float()
        simulated = self.simulated_gradient(problem, params, x, y, functional=False)
        target = [t[0] for t in problem.target]
        bounds = self.defence_cells(target)
        outside = sum(
            float((s.detach() - project(s.detach(), lo, hi)).square().sum())
            for s, lo, hi in zip(simulated, bounds[0::2], bounds[1::2], strict=True)
        )
        scale = sum(float(t.square().sum()) for t in target)
        return (outside / scale) ** 0.5 if scale > 0 else float("inf")


@ATTACKS.register("dlg-defence-aware")
class DefenceAwareDLG(DefenceAware, DLGMatching):
    """DLG matching only what the defence leaves: squared distance to the cells."""

    Params = DefenceAwareDLGParams
    params: DefenceAwareDLGParams
    variant_of = DLGMatching

    @staticmethod
    def distance(
        dummy: list[torch.Tensor], target: list[torch.Tensor], constants: list[torch.Tensor]
    ) -> torch.Tensor:
        """``sum_l ||g'_l - clamp(g'_l, low_l, high_l)||^2``."""
        lows, highs = constants[0::2], constants[1::2]
        return torch.stack(
            [
                (d - project(d, lo, hi)).square().sum()
                for d, lo, hi in zip(dummy, lows, highs, strict=True)
            ]
        ).sum()

    def distance_constants(
        self, target: list[torch.Tensor], depths: list[int]
    ) -> list[torch.Tensor]:
        """The cells of every matched tensor, low and high in turn."""
        return self.defence_cells(target)


@ATTACKS.register("ig-defence-aware")
class DefenceAwareIG(DefenceAware, IGMatching):
    """Inverting Gradients' cosine between the dummy's gradient and its projection onto
    the cells, over the entries the defence constrains."""

    Params = DefenceAwareIGParams
    params: DefenceAwareIGParams
    variant_of = IGMatching

    @staticmethod
    def distance(
        dummy: list[torch.Tensor], target: list[torch.Tensor], constants: list[torch.Tensor]
    ) -> torch.Tensor:
        """Weighted cosine distance of ``g'`` to ``clamp(g', low, high)`` on constrained
        entries; ``constants``: layer weights, the joint flag, then the cells."""
        lows, highs = constants[2::2], constants[3::2]
        kept, projected = [], []
        for d, lo, hi in zip(dummy, lows, highs, strict=True):
            free = torch.isinf(lo) & torch.isinf(hi)
            kept.append(torch.where(free, 0.0, d))
            projected.append(torch.where(free, 0.0, project(d, lo, hi)))
        return IGMatching.distance(kept, projected, constants[:2])

    def distance_constants(
        self, target: list[torch.Tensor], depths: list[int]
    ) -> list[torch.Tensor]:
        """Inverting Gradients' constants, then the cells."""
        return super().distance_constants(target, depths) + self.defence_cells(target)
