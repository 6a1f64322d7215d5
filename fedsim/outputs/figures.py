"""Figures shared by ``fedsim attack``, the audit and the reports (no display).

:func:`draw_pairs` (Pillow) is the labelled reconstruction grid: each true image above
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
from PIL import Image, ImageDraw, ImageFont

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


TILE_PX = 96  # a tile's smallest side: small images are enlarged (nearest neighbour)
CAPTION_PX = 11  # caption font size
GAP_PX = 6


def _tile(image: torch.Tensor, side: int) -> Image.Image:
    """``image`` (C x H x W in [0, 1]) as an RGB picture ``side`` pixels high, pixels kept sharp."""
    pixels = (image.detach().cpu().float().clamp(0, 1) * 255).round().to(torch.uint8)
    pixels = pixels.expand(3, -1, -1) if pixels.shape[0] == 1 else pixels[:3]
    picture = Image.fromarray(pixels.permute(1, 2, 0).numpy(), "RGB")
    width = max(1, round(picture.width * side / picture.height))
    return picture.resize((width, side), Image.Resampling.NEAREST)


def pairs_picture(
    pairs: Sequence[Pair], title: str = "", columns: int = 8, upper: str = "truth"
) -> Image.Image:
    """Each true image above its reconstruction, ``columns`` pairs a row, labelled
    (``upper``: the upper image's caption).

    Drawn with Pillow, not matplotlib: the audit draws one per attack and victim
    (every client in every round with ``victims = 0``), and a matplotlib figure
    cost about 0.36 s each, more than a closed-form attack itself.
    """
    font = ImageFont.load_default(size=CAPTION_PX)
    line = CAPTION_PX + 3
    cols = max(1, min(columns, len(pairs)))
    bands = max(1, math.ceil(len(pairs) / cols))
    side = max(TILE_PX, *(p.truth.shape[-2] for p in pairs)) if pairs else TILE_PX
    tiles = [(_tile(p.truth, side), _tile(p.reconstruction, side)) for p in pairs]
    cell_w = max([side, *(t.width for pair in tiles for t in pair)]) + GAP_PX
    cell_w = max(cell_w, 8 * CAPTION_PX + GAP_PX)  # room for "99.9 dB, SSIM 0.99"
    cell_h = side + 2 * line + GAP_PX
    top = 2 * line if title else GAP_PX
    width = max(cols * cell_w, round(font.getlength(title))) + 2 * GAP_PX
    canvas = Image.new("RGB", (width, top + 2 * bands * cell_h), "white")
    draw = ImageDraw.Draw(canvas)
    if title:
        draw.text((GAP_PX, line // 2), title, fill="black", font=font)
    for i, (pair, (truth, rec)) in enumerate(zip(pairs, tiles, strict=True)):
        band, col = divmod(i, cols)
        x, y = GAP_PX + col * cell_w, top + 2 * band * cell_h
        captions = (
            upper + (f"\nlabel {pair.true_label}" if pair.true_label is not None else ""),
            f"{pair.psnr:.1f} dB, SSIM {pair.ssim:.2f}"
            + (f"\nlabel {pair.predicted_label}" if pair.predicted_label is not None else ""),
        )
        for row, (picture, caption) in enumerate(zip((truth, rec), captions, strict=True)):
            cy = y + row * cell_h
            draw.multiline_text((x, cy), caption, fill="black", font=font, spacing=3)
            canvas.paste(picture, (x, cy + 2 * line))
    return canvas


def save_tiles(images: torch.Tensor, path: Path, per_row: int = 8) -> None:
    """``images`` (N x C x H x W in [0, 1]) at their own size, ``per_row`` a row, 2 pixels
    apart on black, as a PNG: torchvision's ``save_image``, whose import (its models and
    ops, ``torch._dynamo``) cost 3 s in every process that imports the audit."""
    count, _, height, width = images.shape
    pad, cols = 2, max(1, min(per_row, count))
    rows = math.ceil(count / cols)
    canvas = Image.new("RGB", (cols * (width + pad) + pad, rows * (height + pad) + pad), "black")
    for i, image in enumerate(images):
        row, col = divmod(i, cols)
        canvas.paste(_tile(image, height), (pad + col * (width + pad), pad + row * (height + pad)))
    canvas.save(path, format="PNG")


def draw_pairs(path: Path, pairs: Sequence[Pair], title: str = "", upper: str = "truth") -> None:
    """:func:`pairs_picture` saved as a PNG at ``path``."""
    pairs_picture(pairs, title, upper=upper).save(path, format="PNG")


def figure_png(fig: Figure, dpi: int = 110) -> bytes:
    """``fig`` as PNG bytes."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)  # the figures lay themselves out
    return buffer.getvalue()


def data_uri(png: bytes) -> str:
    """A ``data:`` URI embedding ``png``, so a page carries its images with it."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")
