"""How an attack reads a batch's labels off the output layer, shared by attacks and analyses."""

from __future__ import annotations

from typing import Literal

from fedsim.core.errors import require

BatchLabels = Literal["count", "ilrg"]
"""How a batch's labels are read off the output layer: bias-corrected counting or iLRG."""


def require_inferred(labels: str, batch_labels: BatchLabels) -> None:
    """Refuse a batch reading other than the default for labels that are not inferred."""
    require(
        batch_labels == "count" or labels == "infer",
        "batch-labels",
        batch_labels,
        f"reads inferred labels; labels = {labels!r} does not infer them (set labels = 'infer')",
    )
