"""Figures shared by ``fedsim attack``, the audit and the reports (matplotlib, no display).

:func:`draw_pairs` is the labelled reconstruction grid: each true image above
its matched reconstruction, titled with the true label, and the
reconstruction's PSNR, SSIM and predicted label.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from matplotlib.figure import Figure

from fedsim.core.metrics import ReconstructionScore


@dataclass(frozen=True)
class Pair:
    """One true image, its matched reconstruction and their scores."""

    truth: torch.Tensor
    reconstruction: torch.Tensor
    psnr: float
    ssim: float
    true_label: int | None = None
    predicted_label: int | None = None


def scored_pairs(
    truth_images: torch.Tensor,
    truth_labels: torch.Tensor | None,
    images: torch.Tensor,
    labels: torch.Tensor,
    score: ReconstructionScore,
) -> list[Pair]:
    """The pairs of a scored batch, reconstructions in the scorer's matched order.

    An attack's labels come one per reconstructed image; the predicted label
    shown under a reconstruction is the one its image came with.
    """
    order = list(score.assignment)
    matched = images.detach().cpu().clamp(0, 1)[order]
    per_image_labels = len(labels) == len(images)
    return [
        Pair(
            truth=truth_images[i].detach().cpu(),
            reconstruction=matched[i],
            psnr=score.per_image_psnr[i],
            ssim=score.per_image_ssim[i],
            true_label=int(truth_labels[i]) if truth_labels is not None else None,
            predicted_label=int(labels[order[i]]) if per_image_labels else None,
        )
        for i in range(len(truth_images))
    ]


def _show(ax: object, image: torch.Tensor) -> None:
    pixels = image.detach().cpu().permute(1, 2, 0).numpy()
    ax.imshow(  # type: ignore[attr-defined]
        pixels.squeeze(-1) if pixels.shape[-1] == 1 else pixels, cmap="gray", vmin=0, vmax=1
    )


def pairs_figure(pairs: Sequence[Pair], title: str = "", columns: int = 8) -> Figure:
    """Each true image above its reconstruction, ``columns`` pairs a row, labelled."""
    cols = max(1, min(columns, len(pairs)))
    bands = max(1, math.ceil(len(pairs) / cols))
    fig = Figure(figsize=(max(1.6 * cols, 3.2), 3.2 * bands + (0.4 if title else 0)))
    axes = fig.subplots(2 * bands, cols, squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for i, pair in enumerate(pairs):
        band, col = divmod(i, cols)
        top, bottom = axes[2 * band, col], axes[2 * band + 1, col]
        _show(top, pair.truth)
        top.set_title(
            "truth" + (f"\nlabel {pair.true_label}" if pair.true_label is not None else ""),
            fontsize=7,
        )
        _show(bottom, pair.reconstruction)
        predicted = f"\nlabel {pair.predicted_label}" if pair.predicted_label is not None else ""
        bottom.set_title(f"{pair.psnr:.1f} dB, SSIM {pair.ssim:.2f}{predicted}", fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def draw_pairs(path: Path, pairs: Sequence[Pair], title: str = "") -> None:
    """:func:`pairs_figure` saved as a PNG at ``path``."""
    pairs_figure(pairs, title).savefig(path, dpi=120)


def figure_png(fig: Figure, dpi: int = 110) -> bytes:
    """``fig`` as PNG bytes."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    return buffer.getvalue()


def data_uri(png: bytes) -> str:
    """A ``data:`` URI embedding ``png``, so a page carries its images with it."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")
