"""The audit's data: the server's public half of the held-out split, and membership candidates.

The dataset's held-out split (its test set) is never trained on by any
client: clients train on their partitions of the training set and at most
evaluate on slices of the held-out one. The audit cuts it once, by the
attacker's ``audit-pool`` stream, into two halves:

- the *public* half, which the server holds like any evaluation data and may
  use to calibrate an analysis (:class:`~fedsim.attacks.leakage.PublicData`);
- the *non-member* half, from which each victim's membership candidates that it
  did not train on are drawn.

The one-run audit's canaries (:mod:`fedsim.audit.canaries`) are taken out of
the split before it is cut: a canary is neither public nor a non-member.

A victim's candidates (:func:`draw_candidates`) are up to ``count`` examples it
trained on this round and as many non-members, matched label by label so that
both halves have the victim's class mix: a label alone then tells nothing. Which
candidates are members is returned beside them, for the scorer only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedsim.attacks.leakage import Candidates, PublicData
from fedsim.core.data import Normalization
from fedsim.core.modality import of_inputs
from fedsim.core.seeds import SeedStream, stream_rng
from fedsim.core.truth import GroundTruth


@dataclass(frozen=True)
class AuditPool:
    """The held-out split cut in two: public data and non-members (model-input space)."""

    public: PublicData
    non_members: PublicData

    @classmethod
    def split(
        cls,
        images: torch.Tensor,
        labels: torch.Tensor,
        seed: int,
        exclude: np.ndarray | None = None,
    ) -> AuditPool:
        """Halves of ``(images, labels)`` (the held-out split), drawn from ``seed``,
        without the records ``exclude`` lists (the audit's canaries,
        :mod:`fedsim.core.canaries`: never public data, never a non-member)."""
        drawn = stream_rng(SeedStream.AUDIT_POOL, seed).permutation(len(labels))
        if exclude is not None:
            drawn = drawn[~np.isin(drawn, exclude)]
        order = torch.from_numpy(drawn)
        half = len(order) // 2
        public, rest = order[:half].sort().values, order[half:].sort().values
        return cls(
            PublicData(images[public], labels[public]), PublicData(images[rest], labels[rest])
        )


def draw_candidates(
    trained: GroundTruth,
    pool: AuditPool,
    count: int,
    normalization: Normalization,
    seed: int,
    server_round: int,
    partition: int,
) -> tuple[Candidates, torch.Tensor]:
    """Membership candidates for one victim and which of them are members.

    Members are drawn from ``trained`` (what the victim trained on this round, as the
    scorer holds it: pixels, or token ids), each with a non-member of the same label
    (class, or a text window's speaking role) from the pool; a member
    whose label the pool has run out of is left out, so both halves keep the same
    class mix. At most ``count`` of each; shuffled together.
    """
    rng = stream_rng(SeedStream.AUDIT_CANDIDATES, seed, server_round, partition)
    outside = pool.non_members
    # Each label's pool positions, ascending, shuffled label by label in ascending order.
    # One sort, not a scan of the pool per label: a text pool has a label per speaking role.
    pool_labels = outside.labels.cpu().numpy()
    by_label = np.argsort(pool_labels, kind="stable")
    labels_present, starts = np.unique(pool_labels[by_label], return_index=True)
    unused = {
        int(c): list(rng.permutation(positions))
        for c, positions in zip(labels_present, np.split(by_label, starts[1:]), strict=True)
    }
    members: list[int] = []
    others: list[int] = []
    trained_labels = trained.labels.cpu().numpy()  # indexing a tensor per record is slow
    for i in rng.permutation(len(trained_labels)):
        if len(members) == count:
            break
        left = unused.get(int(trained_labels[i]), [])
        if left:
            members.append(int(i))
            others.append(int(left.pop()))
    inside = of_inputs(outside.images).model_input(normalization, trained.images[members])
    images = torch.cat([inside, outside.images[others]])
    labels = torch.cat([trained.labels[members].long(), outside.labels[others].long()])
    is_member = torch.cat([torch.ones(len(members)), torch.zeros(len(others))]).bool()
    order = torch.from_numpy(rng.permutation(len(labels)))
    return Candidates(images[order], labels[order]), is_member[order]
