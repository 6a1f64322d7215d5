"""Leaks besides reconstruction: what an update tells about labels, members and classes.

A reconstruction attack (:class:`~fedsim.attacks.base.Attack`) returns images.
An update of hundreds of images over several local epochs of Adam is beyond
reconstruction, yet the honest-but-curious server still learns from it:

- ``labels``: how many examples of each class the victim trained on this round
  (:class:`LabelLeak`);
- ``membership``: which of a set of candidate records the victim trained on
  (:class:`MembershipLeak`, one score per candidate, higher = more likely a member);
- ``representatives``: one image (or feature vector) per class the victim holds
  (:class:`RepresentativesLeak`);
- ``words``: which tokens a text client used (:class:`WordsLeak`).

A :class:`LeakAnalysis` is found by name in :data:`LEAKS` and receives one narrow
:class:`LeakInput`: the :class:`~fedsim.attacks.base.Observation` (what the server
saw), the server's public labelled data (:class:`PublicData`: the public half of
the dataset's held-out split, which no client trains on), and for membership the
candidate records (:class:`Candidates`) without their membership. Which
candidates were members, and what the victim really trained on, reach only the
scorer (:mod:`fedsim.audit.leak_scoring`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch

from fedsim.attacks.base import AttackSetting, Observation, PublicData
from fedsim.core.params.leaks import LEAK_PARAMS
from fedsim.core.registry import Registry
from fedsim.core.threat import ALL_THREAT_MODELS, ThreatModel

LeakKind = Literal["labels", "membership", "representatives", "words"]
"""The kinds of leak besides reconstruction (``reconstruction`` is the attacks')."""

LEAK_KINDS: tuple[LeakKind, ...] = ("labels", "membership", "representatives", "words")


@dataclass(frozen=True)
class Candidates:
    """Records whose membership in the victim's round is asked, in a shuffled order.

    Images in model-input space and their labels; which of them the victim
    trained on is the scorer's alone.
    """

    images: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return len(self.labels)


@dataclass(frozen=True)
class LeakInput:
    """The one door into a leak analysis: what the server saw and holds, no truth."""

    observation: Observation
    public: PublicData
    candidates: Candidates | None = None


@dataclass(frozen=True)
class LabelLeak:
    """Estimated examples per class, ``(K,)`` float, summing to the examples the
    update was computed on (``Observation.num_examples``). ``prior``: the data-free
    guess scored beside it, the public data's class counts (set by the audit)."""

    counts: torch.Tensor
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)
    prior: torch.Tensor | None = None

    @property
    def proportions(self) -> torch.Tensor:
        total = self.counts.clamp_min(0).sum()
        if float(total) <= 0:
            return torch.full_like(self.counts, 1.0 / len(self.counts))
        return self.counts.clamp_min(0) / total


@dataclass(frozen=True)
class MembershipLeak:
    """One score per candidate (in :class:`Candidates` order), higher = more likely a member."""

    scores: torch.Tensor
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RepresentativesLeak:
    """One representative per class found in the update.

    ``classes`` ``(m,)`` long; ``images`` ``(m, C, H, W)`` in pixel space [0, 1]
    where the attacker could invert to images (the extractor was sent), else
    ``None``; ``features`` ``(m, D)``: what was read before any inversion (the
    input of the layer named in ``details["layer"]``). ``converged``: the
    inversion reproduced the features (always true without an inversion).
    ``prior``: the public class-mean image of each class (pixel space), the data-free
    guess scored beside it (set by the audit where the server holds public data).
    """

    classes: torch.Tensor
    images: torch.Tensor | None
    features: torch.Tensor
    converged: bool = True
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)
    prior: torch.Tensor | None = None


@dataclass(frozen=True)
class WordsLeak:
    """The token ids the victim used this round, sorted, and beside them the guess of a
    server without the update (``prior``: the most frequent public tokens)."""

    tokens: torch.Tensor
    prior: torch.Tensor
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)


Leak = LabelLeak | MembershipLeak | RepresentativesLeak | WordsLeak


class LeakAnalysis(ABC):
    """A leak analysis: a frozen ``Params`` dataclass, its :attr:`kind`, :meth:`analyse`.

    Like an attack, it states before any work where it applies
    (:meth:`check_setting`, raising :class:`~fedsim.core.config.ScenarioError`
    in one line) and sees only its :class:`LeakInput`.
    """

    Params: ClassVar[type]
    kind: ClassVar[LeakKind]
    needs_candidates: ClassVar[bool] = False
    # Cheap analyses run on every client of an audited round; the others (an
    # inversion per class) on the audit's victims only, as the attacks do.
    every_client: ClassVar[bool] = True
    # Whether `audit.leaks = "auto"` runs it (an expensive one is opted into by name).
    in_auto: ClassVar[bool] = True
    # Analyses that "auto" leaves out wherever this one applies (it reads the same kind
    # better and cheaper there); where it is refused they still run.
    supersedes: ClassVar[tuple[str, ...]] = ()
    # The threat models whose observations it reads (refused under the others, in one
    # line, by :func:`fedsim.scenario.applicability.check_applies`).
    threat_models: ClassVar[frozenset[ThreatModel]] = ALL_THREAT_MODELS

    def __init__(self, params: Any, device: torch.device | str = "cpu") -> None:
        self.params = params
        self.device = torch.device(device)

    @classmethod
    def check_setting(cls, setting: AttackSetting, key: str) -> None:
        """Reject, before Ray starts, a setting whose server never sees what this
        analysis needs: raise :class:`~fedsim.core.config.ScenarioError`."""
        return None

    @abstractmethod
    def analyse(self, inputs: LeakInput, seed: int = 0) -> Leak:
        """What the victim's upload leaks, from ``inputs`` alone."""

    def analyse_many(self, inputs: Sequence[LeakInput], seed: int = 0) -> list[Leak]:
        """Several victims (one by one here; batched where an analysis can)."""
        return [self.analyse(one, seed) for one in inputs]


LEAKS: Registry[Any] = Registry(
    "leak analysis",
    ("fedsim.attacks.leaks",),
    group="fedsim.leaks",
    subclass_of=LeakAnalysis,
    needs=("Params", "kind"),
    params=LEAK_PARAMS,
)
