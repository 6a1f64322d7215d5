"""Images read off an Adam client's update as sign patterns of a first linear layer.

Adam's per-entry step ``m_hat / (sqrt(v_hat) + eps)`` does not change when an
entry's whole gradient history is scaled by a positive number. For a first
layer ``z = W x + b`` on the flattened image, the gradient of row ``i`` in one
local step is ``sum_n delta_{n,i} [x_n, 1]`` over the step's batch. A ReLU unit
that is active for one image ``n`` only, in every step, has a gradient history
``delta_{t,i} [x_n, 1]``: entry ``j`` of its update is the bias entry's update
times ``sign(x_{n,j})`` (up to Adam's ``eps``), whatever the deltas were. Its
row of ``W``'s update divided by its bias update is a pure sign pattern of
``x_n`` in model space: ``+1`` where the pixel lies above the value that the
normalisation maps to 0 (the dataset mean; for unnormalised pixels, 0), ``-1``
below, ``0`` on it. With ReLU a unit is active for just one of ``N`` images
with probability about ``N / 2^N``; of ``mlp-2nn``'s 200 units most images of
a handful own some. Steps without image ``n`` give such a row zero gradient
but still a step from the decaying moments, along the same signs.

A row is *pure* when the 90th percentile of ``||u_ij / u_i| - 1|`` over its
nonzero entries is at most ``tolerance``. Measured on embedded MNIST
(``mlp-2nn``, Adam lr 1e-3): one image's rows have 90th percentiles of 1e-4 to
3e-3, rows of two images 0.1 to 1. The worst pixel of a pure row may deviate
up to 0.36, always one near the threshold (``eps`` is then comparable to
``|x| sqrt(v_hat)``): a percentile, not the maximum, leaves it its sign.

Some pure rows are not one image: a unit whose gradient was nonzero in one
step only (it died or woke up; every unit of a one-epoch client) gives the
sign pattern of that step's *mixture* ``sum_n delta_n x_n``. Patterns are
taken most rows first (identical rows are one image), at most one per
example; one is dropped when no image in the box has it (``-1`` entries where
black is 0 in model space: a mixture of deltas of both signs on unnormalised
pixels) or when it lies *between* two taken before it (no pixel differs from
both: a mixture of their two images). Measured on clients of 4 digits, the
images' patterns have 4 to 22 rows each and the mixtures mostly 1.

Each pattern taken is a binary mask of an image. A prior fitted on the
server's public data (:attr:`~fedsim.attacks.base.Observation.public`, the
held-out split no client trains on) turns the mask into an image: the mean
public pixel value for each pixel's 3x3 binary neighbourhood (512 codes), kept
inside the pixel's side of the threshold. With the true masks of 200 training
digits (32x32, standardised; the public half of the held-out split) it gives a
median 24.7 dB, every digit at 20 dB and SSIM 0.8 (at 28x28: 22.8 dB, 99 %;
the mask alone 17.6 dB, a Gaussian blur of it 19.5-19.7 dB). Unnormalised
pixels give only the support (``pixel > 0``): at 32x32 the same prior on true
supports reaches a median 18.1 dB, 3 % of digits recovered, which is why the
pixel values are read from ``eps`` wherever float32 resolves them.

Adam's ``eps`` keeps more than the sign: for one step ``|u_ij / u_i| = |x_j|
(s + eps) / (|x_j| s + eps)``, a known function of ``|x_j|`` up to the row's
``s / eps``. Where black pixels sit off the threshold (standardised pixels)
and most of the public data's off pixels are black, the black background
fixes ``s / eps`` and the row gives every pixel's value (:func:`eps_read`);
the best-conditioned row of an image is read where its deviation stands
``min_snr`` times above float32 rounding, else the prior paints the mask.
Unnormalised pixels put black at 0 (no deviation off the support): there the
public data's mean on-pixel value fixes ``s / eps`` (:func:`support_read`).

Labels: the label of the nearest public image (pixel space), a cheap honest
read; ``details["labels"]`` says so.

Residuals: the client's Adam steps replayed on a batch
(:func:`~fedsim.attacks.toolkits.closed_form.replayed_residual`), exact where every step
is the whole batch; where an epoch takes several, the client's private reshuffle makes
the replay unorderable, the residual is NaN and ``details["no_residual"]`` says why
(:func:`residual_refusal`).

This is fedsim's own attack. It needs Adam or AdamW from a fresh state (a kept
state adds a private history to every entry), no L2 weight decay for Adam
(``wd * w`` joins each step's gradient and breaks the scale invariance); AdamW's
decoupled decay is known exactly from the sent weights and the number of local
steps (``w_T = (1 - lr wd)^T w_0 - lr sum_t (1 - lr wd)^(T-t) step_t``) and is
removed before reading.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from fedsim.attacks.base import AttackSetting, Observation, PublicData, Reconstruction
from fedsim.attacks.registry import ATTACKS
from fedsim.attacks.toolkits.analytic import AnalyticAttack
from fedsim.attacks.toolkits.closed_form import replayed_residual, setting_model, uploaded
from fedsim.attacks.toolkits.first_layer import first_linear_layer
from fedsim.attacks.toolkits.gradients import local_steps_taken, victim_model
from fedsim.attacks.toolkits.replay import replay_refusal
from fedsim.core.config import ClientConfig, require
from fedsim.core.data import Normalization
from fedsim.core.params.analytic import AdamSignsParams
from fedsim.core.threat import ONE_UPDATE, SharedKind

NEIGHBOURHOOD = 3  # a pixel's binary 3x3 neighbourhood indexes the prior's table
CODES = 1 << NEIGHBOURHOOD**2


def adam_refusal(cfg: ClientConfig) -> str | None:
    """Why a client's update is not a readable Adam sign pattern, or ``None``."""
    if cfg.optimizer not in ("adam", "adamw"):
        return (
            f"reads Adam or AdamW updates; client.optimizer = {cfg.optimizer!r} "
            "(an SGD update is a sum of gradients, not a sign pattern: other attacks read it)"
        )
    if cfg.optimizer == "adam" and cfg.weight_decay:
        return (
            f"reads Adam without weight decay; client.weight-decay = {cfg.weight_decay} "
            "(Adam's L2 decay joins every gradient and breaks the sign pattern; AdamW's is read)"
        )
    refusal = replay_refusal(cfg)
    if refusal is None:
        return None
    return (
        f"cannot read the sign patterns: {refusal} "
        '(it reads optimizer-state = "fresh", augment = "none")'
    )


def residual_refusal(observation: Observation) -> str | None:
    """Why a reconstruction's residual says nothing here, or ``None`` where it does.

    The residual replays the client's Adam steps on the batch. Where every step is the
    whole batch, the order is moot and the true batch gives 0 (float rounding). Where an
    epoch takes several steps, the client's private reshuffle decides which images each
    step saw; Adam's normalised steps depend on it, and the true batch in slot order
    replays no better than predicting no update at all (measured in docs/attacks.md).
    """
    cfg, examples = observation.train_config, observation.num_examples
    if cfg.batch_size >= examples:
        return None
    return (
        f"no residual: {examples} examples in batches of {cfg.batch_size}, reshuffled every "
        "epoch; the attacker cannot order Adam's replay (the true batch out of order "
        "replays no better than no update)"
    )


def weight_update(observation: Observation, layer: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The first layer's weight and bias updates (float64), AdamW's known decay removed."""
    cfg = observation.train_config
    decay = 1.0
    if cfg.optimizer == "adamw" and cfg.weight_decay:
        decay = (1 - cfg.lr * cfg.weight_decay) ** local_steps_taken(observation)
    out = []
    for part in ("weight", "bias"):
        name = f"{layer}.{part}"
        sent = observation.global_params[name].double()
        out.append(observation.shared[name].double().cpu() - decay * sent.cpu())
    return out[0], out[1]


@dataclass(frozen=True)
class PureRows:
    """The pure rows of a first layer's update and the sign patterns they show."""

    patterns: torch.Tensor  # (P, d) int8 in {-1, 0, 1}, identical rows merged, most rows first
    rows: torch.Tensor  # (P,) rows per pattern
    ratios: torch.Tensor  # (R, d) each pure row's u_ij / u_i
    pattern_of: torch.Tensor  # (R,) the pattern each pure row shows
    noise: torch.Tensor  # (R,) each row's float32 rounding, relative to its bias update


def pure_rows(
    weight: torch.Tensor, bias: torch.Tensor, uploaded: torch.Tensor, tolerance: float
) -> PureRows:
    """The rows whose 90th-percentile deviation ``||u_ij / u_i| - 1|`` is at most
    ``tolerance``, with their patterns (``uploaded``: the layer's uploaded weights, whose
    float32 rounding bounds what the ratios can tell)."""
    active = bias.abs() > 0
    ratio = weight[active] / bias[active, None]
    nonzero = ratio != 0
    deviation = torch.where(nonzero, (ratio.abs() - 1).abs(), torch.nan)
    spread = torch.nanquantile(deviation, 0.9, dim=1)
    pure = (spread <= tolerance) & nonzero.any(dim=1)
    ratios = ratio[pure]
    rounding = torch.finfo(torch.float32).eps * uploaded[active][pure].double().abs()
    noise = rounding.median(dim=1).values / bias[active][pure].abs()
    signs = torch.sign(ratios).to(torch.int8)
    if not len(signs):
        empty = torch.zeros(0, dtype=torch.long)
        return PureRows(signs, empty, ratios, empty, noise)
    patterns, inverse, counts = torch.unique(signs, dim=0, return_inverse=True, return_counts=True)
    order = torch.argsort(counts, descending=True, stable=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order))
    return PureRows(patterns[order], counts[order], ratios, rank[inverse], noise)


def eps_read(
    ratios: torch.Tensor, noise: torch.Tensor, black: torch.Tensor, min_snr: float
) -> torch.Tensor | None:
    """One image's pixel values (model space) from Adam's ``eps`` in its pure rows, or
    ``None`` where no row reads them above float32 rounding.

    For one row, ``|u_ij / u_i| = |x_j| (s + eps) / (|x_j| s + eps)`` (``s``: the bias
    entry's ``sqrt(v_hat)``), so ``d_j = 1 - |u_ij / u_i|`` gives
    ``|x_j| = (1 - d_j) / (1 + d_j s / eps)``. ``s / eps`` is fixed by the black
    background, whose model-space magnitude ``black`` is known: ``d`` at its median off
    pixel is taken to be black. The row whose background ``d`` stands furthest above its
    rounding (at least ``min_snr`` times) is read.
    """
    d = 1 - ratios.abs()
    off = ratios < 0
    background = torch.stack(
        [
            row[mask].median() if mask.any() else row.new_tensor(0.0)
            for row, mask in zip(d, off, strict=True)
        ]
    )
    snr = background / noise
    best = int(snr.argmax())
    if not float(snr[best]) >= min_snr:
        return None
    level = float(black[off[best]].median())
    scale = ((1 - float(background[best])) / level - 1) / float(background[best])
    return torch.sign(ratios[best]) * (1 - d[best]) / (1 + d[best] * scale)


def support_read(
    ratios: torch.Tensor, noise: torch.Tensor, on_mean: float, min_snr: float
) -> torch.Tensor | None:
    """As :func:`eps_read` where black is 0 in model space (unnormalised pixels): off
    pixels give no deviation, so ``s / eps`` is fixed by a prior instead, the public
    data's mean on-pixel value ``on_mean``, which the image's on pixels are given.
    The row whose 90th-percentile on-pixel ``d`` stands furthest above its rounding (at
    least ``min_snr`` times) is read."""
    on = ratios[0] > 0
    d = (1 - ratios[:, on]).clamp(min=0)
    snr = d.quantile(0.9, dim=1) / noise
    best = int(snr.argmax())
    if not float(snr[best]) >= min_snr:
        return None
    row = d[best]

    def mean_at(scale: float) -> float:
        return float(((1 - row) / (1 + row * scale)).mean())

    low, high = 1.0, 1e12  # s / eps: the mean falls from about 1 as it grows
    if not mean_at(high) <= on_mean <= mean_at(low):
        return None
    for _ in range(80):  # bisection in log scale
        middle = math.sqrt(low * high)
        low, high = (middle, high) if mean_at(middle) > on_mean else (low, middle)
    x = torch.zeros_like(ratios[0])
    x[on] = (1 - row) / (1 + row * math.sqrt(low * high))
    return x


def possible(patterns: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """Which patterns some image in the box could have: a ``-1`` needs a pixel whose
    model-space value can be negative (``zero``: each pixel's model value at 0)."""
    below = zero < 0
    return ~((patterns < 0) & ~below).any(dim=1)


def lies_between(pattern: torch.Tensor, kept: list[torch.Tensor]) -> bool:
    """Whether ``pattern`` lies between two of ``kept`` (a one-step mixture of their
    images): no pixel of it differs from both."""
    if len(kept) < 2:
        return False
    differs = (torch.stack(kept) != pattern).double()
    both = differs @ differs.T  # pixels where it differs from q and from r
    both.fill_diagonal_(1.0)
    return bool((both == 0).any())


def image_patterns(patterns: torch.Tensor, zero: torch.Tensor, limit: int) -> list[int]:
    """Indices of the patterns read as images, at most ``limit``: in order (most rows
    first), each one some image could have and not between two taken before it."""
    taken: list[int] = []
    for k in torch.nonzero(possible(patterns, zero)).flatten().tolist():
        if len(taken) == limit:
            break
        if not lies_between(patterns[k], [patterns[j] for j in taken]):
            taken.append(k)
    return taken


def neighbourhood_codes(masks: np.ndarray) -> np.ndarray:
    """Each pixel's 3x3 binary neighbourhood as a code in ``0 .. 511`` (outside: off);
    ``masks`` ``(N, C, H, W)`` bool, codes of the same shape."""
    pad = NEIGHBOURHOOD // 2
    height, width = masks.shape[-2:]
    padded = np.pad(masks, [(0, 0), (0, 0), (pad, pad), (pad, pad)]).astype(np.int64)
    codes = np.zeros(masks.shape, dtype=np.int64)
    for bit, (dy, dx) in enumerate(np.ndindex(NEIGHBOURHOOD, NEIGHBOURHOOD)):
        codes |= padded[..., dy : dy + height, dx : dx + width] << bit
    return codes


@dataclass(frozen=True)
class NeighbourhoodPrior:
    """Mean public pixel value per 3x3 mask neighbourhood (unseen codes: the mean of
    the public pixels on the same side of the threshold)."""

    table: np.ndarray  # CODES
    seen: np.ndarray  # CODES, bool
    on_mean: float
    off_mean: float

    @classmethod
    def fit(cls, pixels: np.ndarray, threshold: np.ndarray) -> NeighbourhoodPrior:
        """From public ``pixels`` ``(N, C, H, W)`` in [0, 1] and each channel's threshold."""
        masks = pixels > threshold
        codes = neighbourhood_codes(masks).ravel()
        totals = np.bincount(codes, weights=pixels.ravel(), minlength=CODES)
        counts = np.bincount(codes, minlength=CODES)
        on, off = pixels[masks], pixels[~masks]
        return cls(
            totals / np.maximum(counts, 1),
            counts > 0,
            float(on.mean()) if on.size else 1.0,
            float(off.mean()) if off.size else 0.0,
        )

    def image(self, mask: np.ndarray, threshold: np.ndarray) -> np.ndarray:
        """The prior's image for ``mask`` ``(C, H, W)``, each pixel on its side of the box."""
        codes = neighbourhood_codes(mask[None])[0]
        fallback = np.where(mask, self.on_mean, self.off_mean)
        estimate = np.where(self.seen[codes], self.table[codes], fallback)
        return np.where(mask, np.clip(estimate, threshold, 1), np.clip(estimate, 0, threshold))


def pixel_threshold(normalization: Normalization, channels: int) -> np.ndarray:
    """Each channel's pixel value that the normalisation maps to 0, shaped ``(C, 1, 1)``."""
    zero = normalization.to_pixels(torch.zeros(1, channels, 1, 1, dtype=torch.float64))
    return zero[0].numpy()


def nearest_labels(images: torch.Tensor, public: PublicData, pixels: torch.Tensor) -> torch.Tensor:
    """The label of each image's nearest public image (pixel space)."""
    distance = torch.cdist(images.flatten(1).double(), pixels.flatten(1).double())
    return public.labels[distance.argmin(dim=1)].long()


@ATTACKS.register("adam-signs")
class AdamSigns(AnalyticAttack):
    """Images from the sign patterns Adam leaves in a first linear layer's update."""

    Params = AdamSignsParams
    params: AdamSignsParams
    # The largest client measured with an image recovered (docs/attacks.md,
    # "Adam's sign patterns"): the audit runs it on updates up to this size.
    max_batch = 512
    reads_public = True
    threat_models = ONE_UPDATE  # a sum of updates is not Adam-normalised; a probe no update

    @classmethod
    def check_setting(cls, setting: AttackSetting, key: str) -> None:
        """One client's Adam update through a shared first linear layer, public data."""
        refusal = adam_refusal(setting.client)
        require(refusal is None, f"{key}.name", cls.registered_name(), str(refusal))
        cls.check_architecture(setting, key)
        require(
            setting.held_out,
            f"{key}.name",
            cls.registered_name(),
            f"fits its prior on the server's public data; data.dataset = "
            f"{setting.data.dataset!r} has no held-out split (generated, or its test "
            "images are its training images)",
        )

    @classmethod
    def check_architecture(cls, setting: AttackSetting, key: str) -> None:
        """The first layer is linear with a bias on the image, and shared."""
        layer = first_linear_layer(setting_model(setting))
        require(
            layer is not None and uploaded(f"{layer}.weight", setting.uploads),
            f"{key}.name",
            cls.registered_name(),
            "needs a shared first linear layer with a bias on the image; "
            f"model {setting.model.name!r} under strategy {setting.strategy!r} has none",
        )

    def fidelity_residual(
        self, observation: Observation, images: torch.Tensor, labels: torch.Tensor, seed: int = 0
    ) -> float:
        """The client's Adam training replayed on a batch (:func:`replayed_residual`), where
        its order cannot matter; NaN where it can (:func:`residual_refusal` says why)."""
        if residual_refusal(observation) is not None:
            return math.nan
        return replayed_residual(observation, (images, labels), seed)

    def checked_layer(self, observation: Observation, seed: int) -> str:
        """The shared first linear layer, refusing observations the attack cannot read."""
        refusal = adam_refusal(observation.train_config)
        if observation.shared_kind != SharedKind.UPDATE or observation.summed_examples:
            refusal = "reads one client's update (not a gradient or a sum of updates)"
        if refusal is not None:
            raise ValueError(f"{self.registered_name()} {refusal}")
        if observation.public is None:
            raise ValueError(
                f"{self.registered_name()} fits its prior on the server's public data: none given"
            )
        self.check_batch(observation)
        model, _ = victim_model(observation, torch.device("cpu"), seed)
        layer = first_linear_layer(model)
        if layer is None or f"{layer}.weight" not in observation.shared:
            raise ValueError(
                f"{self.registered_name()} needs a shared first linear layer with a bias"
            )
        return layer

    def reconstruct(self, observation: Observation, seed: int = 0) -> Reconstruction:
        """Read the pure rows' patterns, drop mixtures, paint each mask with the prior."""
        start = time.perf_counter()
        layer = self.checked_layer(observation, seed)
        public = observation.public
        assert public is not None  # checked above
        spec, norm = observation.input_spec, observation.normalization
        shape = (spec.channels, spec.image_size, spec.image_size)
        weight, bias = weight_update(observation, layer)
        uploaded = observation.shared[f"{layer}.weight"].cpu()
        read = pure_rows(weight, bias, uploaded, self.params.tolerance)
        patterns, rows = read.patterns, read.rows
        zero = norm.to_model(torch.zeros(1, *shape, dtype=torch.float64)).flatten()
        batch = observation.num_examples
        taken = image_patterns(patterns, zero, batch)
        found = len(taken)
        threshold = pixel_threshold(norm, spec.channels)
        public_pixels = norm.to_pixels(public.images.double()).clamp(0, 1)
        prior = NeighbourhoodPrior.fit(public_pixels.numpy(), threshold)
        # eps's read needs black to sit off the threshold (standardised pixels) and most
        # off pixels to be black (checked on the public data: digits, not photographs).
        off = public_pixels <= torch.as_tensor(threshold)
        exact = spec.channels == 1 and bool((public_pixels[off] == 0).double().mean() > 0.5)
        black_at_zero = bool((zero == 0).all())
        on_mean = float(public.images[public.images > 0].double().mean()) if exact else 0.0
        images = torch.full((batch, *shape), 0.5)
        labels = torch.zeros(batch, dtype=torch.long)
        exact_reads = 0
        for slot, k in enumerate(taken):
            mask = (patterns[k] > 0).reshape(shape).numpy()
            mine = read.pattern_of == k
            ratios, noise, min_snr = read.ratios[mine], read.noise[mine], self.params.min_snr
            x = None
            if exact and black_at_zero:
                x = support_read(ratios, noise, on_mean, min_snr)
            elif exact:
                x = eps_read(ratios, noise, zero.abs(), min_snr)
            if x is None:
                images[slot] = torch.as_tensor(prior.image(mask, threshold)).float()
                continue
            exact_reads += 1
            pixels = norm.to_pixels(x.reshape(1, *shape))[0].numpy()
            boxed = np.where(mask, np.clip(pixels, threshold, 1), np.clip(pixels, 0, threshold))
            images[slot] = torch.as_tensor(boxed).float()
        if found:
            labels[:found] = nearest_labels(images[:found], public, public_pixels)
        details = {
            "layer": layer,
            "found": found,
            "pure_rows": int(rows.sum()),
            "patterns": len(patterns),
            "rows_per_image": rows[taken].tolist(),
            "read_from_eps": exact_reads,
            "labels": "nearest public image",
            "gradient_residual": self.fidelity_residual(observation, images, labels, seed),
            "no_residual": residual_refusal(observation) or "",
        }
        return Reconstruction(
            images=images,
            labels=labels,
            objective_trace=[],
            iterations=0,
            final_objective=math.nan,
            seconds=time.perf_counter() - start,
            converged=found == batch,
            details=details,
        )
