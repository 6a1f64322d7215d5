"""Datasets from a researcher's own files in ``data.root``: an image folder, or local
files through Flower Datasets' ``FederatedDataset`` (parquet, Hugging Face's
``imagefolder``), offline.

Both give a :class:`~fedsim.core.data.RawDataset`: images as they are on disk
(gray when every image is single-channel, else RGB; an image of another size is
resized to the first image's), then shaped like every zoo dataset (``image-size``,
``channels``, ``normalize``). Without a test split on disk, every fifth image of
each class (in file order) is held out as the test set. Every refusal is one
:class:`~fedsim.core.config.ScenarioError` on ``data.root``, raised when the data
is first loaded (:func:`~fedsim.core.data.check_dataset_available`, before Ray).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedsim.core.config import ScenarioError, first_line
from fedsim.core.flower_datasets import INDEX, LABEL, offline_import
from fedsim.core.raw import RawDataset
from fedsim.core.scenario_file import path_kind

if TYPE_CHECKING:
    from PIL.Image import Image

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm")

HOLD_OUT_EVERY = 5
"""Without a test split on disk, image 4, 9, 14, ... of each class is a test image."""

GRAY_MODES = ("1", "L", "LA", "I", "I;16", "F")


def _refuse(root: str, allowed: str) -> ScenarioError:
    return ScenarioError("data.root", root, allowed)


def stack_images(
    images: Sequence[Image], names: Sequence[str], root: str, like: np.ndarray | None = None
) -> np.ndarray:
    """``(N, H, W)`` or ``(N, H, W, 3)`` float32 in [0, 1], in the channels and size of
    ``like`` (a test set's of its training set's) or of the images; ``names`` say which
    image failed."""
    from PIL import Image as PILImage

    if like is not None:
        gray, size = like.ndim == 3, (int(like.shape[2]), int(like.shape[1]))
    else:
        gray, size = all(image.mode in GRAY_MODES for image in images), images[0].size
    arrays = []
    for image, name in zip(images, names, strict=True):
        try:
            converted = image.convert("L" if gray else "RGB")
            if converted.size != size:
                converted = converted.resize(size, PILImage.Resampling.BILINEAR)
            arrays.append(np.asarray(converted, dtype=np.float32) / 255.0)
        except (OSError, ValueError) as err:  # truncated or undecodable
            raise _refuse(root, f"{name} is not a readable image ({first_line(err)})") from None
    return np.stack(arrays)


def hold_out(labels: np.ndarray) -> np.ndarray:
    """A test mask: every :data:`HOLD_OUT_EVERY`-th example of each class."""
    mask = np.zeros(len(labels), dtype=bool)
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        mask[members[HOLD_OUT_EVERY - 1 :: HOLD_OUT_EVERY]] = True
    return mask


def _raw(
    images: np.ndarray,
    labels: np.ndarray,
    num_classes: int,
    test: tuple[np.ndarray, np.ndarray] | None,
    columns: dict[str, np.ndarray],
) -> RawDataset:

    if test is None:
        mask = hold_out(labels)
        if mask.any():
            test = images[mask], labels[mask]
            images, labels = images[~mask], labels[~mask]
            columns = {name: values[~mask] for name, values in columns.items()}
        else:  # under five images a class: too few to hold any out, train and test coincide
            return RawDataset(
                images, labels, images, labels, num_classes, train_columns=columns, held_out=False
            )
    return RawDataset(images, labels, test[0], test[1], num_classes, train_columns=columns)


# --- image folders ------------------------------------------------------------------------


def _listing(folder: Path, root: str) -> list[Path]:
    try:
        return sorted(folder.iterdir())
    except OSError as err:
        raise _refuse(root, f"{folder} cannot be read ({err.strerror})") from None


def _class_tree(folder: Path, root: str) -> dict[str, list[Path]]:
    """Class name -> its image files (sorted), for one tree of class subfolders."""
    classes = [d for d in _listing(folder, root) if d.is_dir() and not d.name.startswith(".")]
    if not classes:
        raise _refuse(
            root,
            f"{folder} has no class subfolders; an image folder holds one subfolder of "
            "images per class (cat/001.png, dog/002.png, ...)",
        )
    tree = {}
    for directory in classes:
        files = [
            f
            for f in _listing(directory, root)
            if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES
        ]
        if not files:
            raise _refuse(
                root,
                f"class folder {directory.name!r} holds no images ({', '.join(IMAGE_SUFFIXES)})",
            )
        tree[directory.name] = files
    return tree


def _read_tree(
    tree: dict[str, list[Path]], classes: list[str], root: str
) -> tuple[list[Image], np.ndarray, list[str]]:
    from PIL import Image as PILImage

    images: list[Image] = []
    labels, names = [], []
    base = Path(root).expanduser()
    for name, files in tree.items():
        for file in files:
            shown = str(file.relative_to(base))
            try:
                with PILImage.open(file) as image:
                    image.load()
                    images.append(image)
            except OSError as err:  # unreadable, or not an image PIL knows
                raise _refuse(
                    root, f"{shown} is not a readable image ({first_line(err)})"
                ) from None
            labels.append(classes.index(name))
            names.append(shown)
    return images, np.array(labels, dtype=np.int64), names


def image_folder(root: str) -> RawDataset:
    """``root/<class>/<image>``, or ``root/train/<class>/...`` beside ``root/test/<class>/...``."""
    if not root:
        raise _refuse(root, "image-folder needs data.root: a folder with a subfolder per class")
    folder = Path(root).expanduser()
    if not folder.is_dir():
        raise _refuse(root, f"is {path_kind(folder)}; expected a folder of class subfolders")
    split = (folder / "train").is_dir() and (folder / "test").is_dir()
    train_tree = _class_tree(folder / "train" if split else folder, root)
    classes = sorted(train_tree)
    images, labels, names = _read_tree(train_tree, classes, root)
    train = stack_images(images, names, root)
    test = None
    if split:
        test_tree = _class_tree(folder / "test", root)
        unknown = sorted(set(test_tree) - set(classes))
        if unknown:
            raise _refuse(
                root,
                f"test/ has classes {unknown} that train/ lacks; train/ has {classes}",
            )
        test_images, test_labels, test_names = _read_tree(test_tree, classes, root)
        test = stack_images(test_images, test_names, root, like=train), test_labels
    return _raw(train, labels, len(classes), test, {})


# --- Flower Datasets' FederatedDataset on local files -------------------------------------


def _builder(root: str) -> tuple[str, dict[str, Any]]:
    """The Hugging Face builder and its arguments for local ``root``."""
    path = Path(root).expanduser()
    if not path.exists():
        raise _refuse(
            root,
            "is no local file or folder; Hugging Face hub names need the network, which "
            "fedsim does not use: download the dataset's parquet files (or an imagefolder "
            "tree) and give their path",
        )
    if path.is_file():
        if path.suffix != ".parquet":
            raise _refuse(root, "is a file but not a .parquet file; give parquet or a folder")
        return "parquet", {"data_files": {"train": [str(path)]}}
    if any(path.rglob("*.parquet")):
        return "parquet", {"data_dir": str(path)}
    return "imagefolder", {"data_dir": str(path)}


def _columns(features: Any, root: str) -> tuple[str, str, list[str]]:
    """The image column, the label column and the other scalar columns."""
    datasets = offline_import("datasets")
    names = list(features)
    image = next((n for n in names if isinstance(features[n], datasets.Image)), None)
    if image is None:
        raise _refuse(
            root,
            f"has no image column (Hugging Face's Image type); its columns: {', '.join(names)}",
        )
    label = next((n for n in names if isinstance(features[n], datasets.ClassLabel)), None)
    if label is None and LABEL in names:
        label = LABEL
    if label is None:
        raise _refuse(
            root, f"has no label column (a ClassLabel, or 'label'); columns: {', '.join(names)}"
        )
    reserved = {image, label}
    extra = [
        n
        for n in names
        if n not in reserved and isinstance(features[n], datasets.Value) and n != INDEX
    ]
    return image, label, extra


def federated_dataset(root: str) -> RawDataset:
    """Local parquet or imagefolder files loaded through Flower Datasets' ``FederatedDataset``."""
    if not root:
        raise _refuse(
            root, "flwr-local needs data.root: a parquet file, a folder of them, or an imagefolder"
        )
    builder, kwargs = _builder(root)
    federated = offline_import("flwr_datasets").FederatedDataset
    with tempfile.TemporaryDirectory(prefix="fedsim-hf-") as cache:
        try:
            fds = federated(
                dataset=builder,
                partitioners={"train": 1},
                shuffle=False,
                cache_dir=cache,
                keep_in_memory=True,
                **kwargs,
            )
            train = fds.load_split("train")
            try:
                test = fds.load_split("test")
            except ValueError:  # no test split on disk: one is held out below
                test = None
        except ScenarioError:
            raise
        except Exception as err:  # Hugging Face's loaders raise many types; one line each
            raise _refuse(
                root,
                f"holds no {builder} data Flower Datasets loads "
                f"({type(err).__name__}: {first_line(err)})",
            ) from None
        image, label, extra = _columns(train.features, root)
        feature = train.features[label]
        labels = np.asarray(train[label], dtype=np.int64)
        if len(labels) == 0:
            raise _refuse(root, "holds no training examples")
        num_classes = int(getattr(feature, "num_classes", 0) or labels.max() + 1)
        images = stack_images(list(train[image]), [f"row {i}" for i in range(len(labels))], root)
        columns = {n: np.asarray(train[n]) for n in extra}
        held = None
        if test is not None and len(test):
            test_labels = np.asarray(test[label], dtype=np.int64)
            num_classes = max(num_classes, int(test_labels.max()) + 1)
            test_names = [f"test row {i}" for i in range(len(test_labels))]
            test_images = list(test[image])
            held = stack_images(test_images, test_names, root, like=images), test_labels
    return _raw(images, labels, num_classes, held, columns)
