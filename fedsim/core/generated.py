"""Generated datasets: each device's examples are a pure function of (seed, device).

A real dataset is loaded whole and split by a partitioner
(:func:`fedsim.core.partition.partition_dataset`, population-sized). A generated
one is never held centrally: client ``k`` draws its own examples from named seed
streams keyed by the generator's ``seed`` and ``k`` when it first needs them, so a
run costs what its sampled clients cost, whatever the population. The server's
held-out test set is fresh draws from a fixed sample of devices (the first
``test-devices``), never a client's own examples.

Examples are feature vectors, held as ``(N, F, 1, 1)`` tensors (features as
channels of a 1x1 image), so the model zoo's :class:`~fedsim.core.models.InputSpec`
(channels, side, classes) describes them and models that flatten their input
(``logreg``, ``mlp-2nn``) take them unchanged. They are not images: the audit's
gradient-inversion attacks and image scores refuse them (validation says so).

``synthetic`` is Synthetic(alpha, beta) of Li et al., FedProx (MLSys 2020), after
Shamir et al. (2014); see :class:`SyntheticParams` and ``docs/scenarios.md``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from fedsim.core.config import DataConfig, require
from fedsim.core.raw import RawDataset
from fedsim.core.scenario_file import component_params
from fedsim.core.seeds import SeedStream, stream_rng


class GeneratedDataset(ABC):
    """A dataset generated per device; registered in ``DATASETS`` like any loader.

    Called as a loader it returns the server's held-out test set only (no training
    examples: those are the devices', :meth:`device_examples`).
    """

    Params: type

    @abstractmethod
    def shape(self, params: Any) -> tuple[int, int]:
        """``(features, classes)`` of every example."""

    @abstractmethod
    def device_size(self, params: Any, device: int) -> int:
        """How many examples ``device`` holds (cheap: draws no examples)."""

    @abstractmethod
    def min_size(self, params: Any) -> int:
        """The fewest examples any device can hold (validation checks that device)."""

    @abstractmethod
    def device_examples(
        self, params: Any, device: int, count: int, stream: SeedStream
    ) -> tuple[np.ndarray, np.ndarray]:
        """``count`` examples of ``device`` from ``stream``: features ``(count, F)``
        float32 and labels ``(count,)`` int64."""

    @abstractmethod
    def test_devices(self, params: Any) -> int:
        """The server's test set comes from devices ``0 .. test_devices - 1``."""

    @abstractmethod
    def test_samples(self, params: Any) -> int:
        """Fresh examples per test device in the server's test set."""

    def params(self, cfg: DataConfig) -> Any:
        """``data.generator`` checked against :attr:`Params`."""
        return component_params(self, cfg.generator, "data.generator")

    def test_set(self, params: Any) -> tuple[np.ndarray, np.ndarray]:
        """The server's held-out test set (``GENERATED_TEST`` draws, not a client's data)."""
        parts = [
            self.device_examples(params, k, self.test_samples(params), SeedStream.GENERATED_TEST)
            for k in range(self.test_devices(params))
        ]
        return np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts])

    def __call__(self, cfg: DataConfig) -> RawDataset:
        params = self.params(cfg)
        features, classes = self.shape(params)
        x, y = self.test_set(params)
        empty = np.zeros((0, 1, 1, features), dtype=np.float32)
        return RawDataset(
            empty, np.zeros(0, dtype=np.int64), x[:, None, None, :], y, num_classes=classes
        )


@dataclass(frozen=True)
class SyntheticParams:
    """Synthetic(alpha, beta) (Li et al., FedProx, 2020): ``data.generator``'s keys.

    Per device k: ``u_k ~ N(0, alpha)``, ``W_k`` (classes x features) and ``b_k``
    ``~ N(u_k, 1)``; ``B_k ~ N(0, beta)``, ``v_k ~ N(B_k, 1)``; examples
    ``x ~ N(v_k, Sigma)``, ``Sigma`` diagonal with ``Sigma_jj = j^-1.2``;
    ``y = argmax(W_k x + b_k)``. ``scale`` says whether alpha and beta are
    variances (the paper's notation, the default) or standard deviations (what
    the FedProx code passes to ``np.random.normal``). ``iid``: one ``W, b ~ N(0, 1)``
    for all devices and ``v = 0`` (the FedProx code's Synthetic-IID; alpha and beta
    must stay 0). Device sizes: ``floor(LogNormal(size-mu, size-sigma)) +
    min-samples`` (the FedProx code's ``lognormal(4, 2) + 50``, the paper's
    "power law"). ``seed`` fixes the devices; ``federation.seed`` does not change them.
    """

    alpha: float = 0.0
    beta: float = 0.0
    iid: bool = False
    scale: Literal["variance", "std"] = "variance"
    features: int = 60
    classes: int = 10
    size_mu: float = 4.0
    size_sigma: float = 2.0
    min_samples: int = 50
    test_devices: int = 10
    test_samples: int = 100
    seed: int = 0

    def __post_init__(self) -> None:
        for key, value in (("alpha", self.alpha), ("beta", self.beta)):
            require(math.isfinite(value) and value >= 0, key, value, "must be >= 0")
            require(
                not self.iid or value == 0,
                key,
                value,
                "must be 0 with iid = true (one W, b and v for every device)",
            )
        require(self.features >= 1, "features", self.features, "must be >= 1")
        require(self.classes >= 2, "classes", self.classes, "must be >= 2")
        require(
            math.isfinite(self.size_sigma) and self.size_sigma >= 0,
            "size-sigma",
            self.size_sigma,
            "must be >= 0",
        )
        require(math.isfinite(self.size_mu), "size-mu", self.size_mu, "must be finite")
        require(self.min_samples >= 1, "min-samples", self.min_samples, "must be >= 1")
        require(self.test_devices >= 1, "test-devices", self.test_devices, "must be >= 1")
        require(self.test_samples >= 1, "test-samples", self.test_samples, "must be >= 1")
        require(self.seed >= 0, "seed", self.seed, "must be >= 0")

    def spread(self, value: float) -> float:
        """The standard deviation that alpha or beta stands for."""
        return math.sqrt(value) if self.scale == "variance" else value


@dataclass(frozen=True)
class _Device:
    weights: np.ndarray  # (classes, features)
    bias: np.ndarray  # (classes,)
    mean: np.ndarray  # (features,): v_k


class Synthetic(GeneratedDataset):
    """The FedProx paper's Synthetic(alpha, beta) and Synthetic-IID."""

    Params = SyntheticParams

    def shape(self, params: SyntheticParams) -> tuple[int, int]:
        return params.features, params.classes

    def device_size(self, params: SyntheticParams, device: int) -> int:
        rng = stream_rng(SeedStream.GENERATED_DEVICE, params.seed, device)
        return self._size(params, rng)

    @staticmethod
    def _size(params: SyntheticParams, rng: np.random.Generator) -> int:
        # The first draw of the device's stream: sizes cost nothing else.
        return int(rng.lognormal(params.size_mu, params.size_sigma)) + params.min_samples

    def min_size(self, params: SyntheticParams) -> int:
        return params.min_samples

    def device(self, params: SyntheticParams, device: int) -> _Device:
        """Device ``device``'s model (W_k, b_k) and feature mean v_k."""
        rng = stream_rng(SeedStream.GENERATED_DEVICE, params.seed, device)
        self._size(params, rng)
        c, f = params.classes, params.features
        if params.iid:
            shared = stream_rng(SeedStream.GENERATED_SHARED, params.seed)
            return _Device(shared.normal(0, 1, (c, f)), shared.normal(0, 1, c), np.zeros(f))
        u = rng.normal(0, params.spread(params.alpha))
        weights, bias = rng.normal(u, 1, (c, f)), rng.normal(u, 1, c)
        b = rng.normal(0, params.spread(params.beta))
        return _Device(weights, bias, rng.normal(b, 1, f))

    @staticmethod
    def covariance(params: SyntheticParams) -> np.ndarray:
        """``Sigma``'s diagonal: ``j^-1.2`` for ``j = 1 .. features``."""
        return np.arange(1, params.features + 1, dtype=np.float64) ** -1.2

    def device_examples(
        self, params: SyntheticParams, device: int, count: int, stream: SeedStream
    ) -> tuple[np.ndarray, np.ndarray]:
        d = self.device(params, device)
        rng = stream_rng(stream, params.seed, device)
        noise = rng.standard_normal((count, params.features))
        x = d.mean + noise * np.sqrt(self.covariance(params))
        y = np.argmax(x @ d.weights.T + d.bias, axis=1)  # softmax keeps the argmax
        return x.astype(np.float32), y.astype(np.int64)

    def test_devices(self, params: SyntheticParams) -> int:
        return params.test_devices

    def test_samples(self, params: SyntheticParams) -> int:
        return params.test_samples


SYNTHETIC = Synthetic()
