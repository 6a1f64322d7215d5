"""A researcher's own files as a dataset: image folders, and Flower Datasets'
FederatedDataset on local parquet or imagefolder files; on generated files, offline."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedsim.core.config import ComponentConfig, DataConfig, ScenarioError
from fedsim.core.data import check_dataset_available, load_dataset, load_raw
from fedsim.core.partition import partition_dataset

CLASSES = ("cat", "dog", "emu")


def _png(path: Path, value: int, size: int = 12, mode: str = "RGB") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fill = value if mode == "L" else (value, 255 - value, 128)
    Image.new(mode, (size, size), fill).save(path)


def _tree(root: Path, per_class: int = 10, mode: str = "RGB") -> Path:
    for c, name in enumerate(CLASSES):
        for i in range(per_class):
            _png(root / name / f"{i:03d}.png", 40 * c + i, mode=mode)
    return root


def _cfg(dataset: str, root: Path | str, **kw: object) -> DataConfig:
    return replace(DataConfig(dataset=dataset, root=str(root)), **kw)  # type: ignore[arg-type]


def _refusal(dataset: str, root: Path | str) -> str:
    with pytest.raises(ScenarioError) as err:
        check_dataset_available(_cfg(dataset, root))
    text = str(err.value)
    assert "\n" not in text and text.startswith("data.root = ")
    return text


def test_an_image_folder_is_a_class_per_subfolder_with_every_fifth_image_held_out(
    tmp_path: Path,
) -> None:
    root = _tree(tmp_path / "pets")

    raw = load_raw(_cfg("image-folder", root))

    assert raw.num_classes == 3
    assert raw.train_images.shape == (24, 12, 12, 3)
    assert raw.test_images.shape == (6, 12, 12, 3)
    assert np.bincount(raw.test_labels).tolist() == [2, 2, 2]
    assert raw.train_images.min() >= 0.0 and raw.train_images.max() <= 1.0


def test_an_image_folder_is_shaped_like_the_zoos_datasets(tmp_path: Path) -> None:
    root = _tree(tmp_path / "pets", mode="L")

    gray = load_dataset(_cfg("image-folder", root, image_size=16))
    rgb = load_dataset(_cfg("image-folder", root, image_size=16, channels="rgb", normalize=True))

    assert gray.train_images.shape == (24, 1, 16, 16) and gray.num_classes == 3
    assert rgb.train_images.shape == (24, 3, 16, 16)
    assert abs(float(rgb.train_images.mean())) < 1e-4  # standardised
    assert rgb.normalization.std != (1.0, 1.0, 1.0)


def test_train_and_test_trees_are_the_split_and_other_sizes_are_resized(
    tmp_path: Path,
) -> None:
    root = tmp_path / "split"
    _tree(root / "train", per_class=4)
    _png(root / "test" / "dog" / "x.png", 7, size=20)
    _png(root / "test" / "cat" / "y.jpg", 9, size=12)

    raw = load_raw(_cfg("image-folder", root))

    assert raw.train_images.shape == (12, 12, 12, 3)
    assert raw.test_images.shape == (2, 12, 12, 3)
    assert sorted(raw.test_labels.tolist()) == [0, 1]


def test_image_folder_refusals_are_one_line_before_any_work(tmp_path: Path) -> None:
    flat = tmp_path / "flat"
    _png(flat / "a.png", 1)
    empty_class = _tree(tmp_path / "some") / "emu"
    for f in empty_class.iterdir():
        f.unlink()
    broken = _tree(tmp_path / "broken", per_class=2)
    (broken / "dog" / "001.png").write_bytes(b"not a png at all")
    strange = tmp_path / "strange"
    _tree(strange / "train", per_class=2)
    _png(strange / "test" / "yak" / "0.png", 3)
    (tmp_path / "file.png").write_bytes(b"")
    (tmp_path / "empty").mkdir()

    assert "image-folder needs data.root" in _refusal("image-folder", "")
    assert "missing" in _refusal("image-folder", tmp_path / "nowhere")
    assert "is a file" in _refusal("image-folder", tmp_path / "file.png")
    assert "no class subfolders" in _refusal("image-folder", tmp_path / "empty")
    assert "no class subfolders" in _refusal("image-folder", flat)
    assert "class folder 'emu' holds no images" in _refusal("image-folder", tmp_path / "some")
    assert "dog/001.png is not a readable image" in _refusal("image-folder", broken)
    assert "test/ has classes ['yak'] that train/ lacks" in _refusal("image-folder", strange)


def _parquet(path: Path, rows: int, writers: int = 4, seed: int = 0) -> Path:
    import datasets

    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 3, rows)
    images = [Image.new("L", (10, 10), int(v)) for v in rng.integers(0, 255, rows)]
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "label": datasets.ClassLabel(names=list(CLASSES)),
            "writer": datasets.Value("string"),
        }
    )
    table = {
        "image": images,
        "label": labels.tolist(),
        "writer": [f"w{i % writers}" for i in range(rows)],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_dict(table, features=features).to_parquet(str(path))
    return path


def test_flwr_local_reads_parquet_files_and_their_extra_columns_offline(tmp_path: Path) -> None:
    single = _parquet(tmp_path / "one.parquet", 40)
    folder = tmp_path / "two"
    _parquet(folder / "train-00000.parquet", 30)
    _parquet(folder / "test-00000.parquet", 8, seed=1)

    held_out = load_raw(_cfg("flwr-local", single))
    split = load_raw(_cfg("flwr-local", folder))

    assert held_out.num_classes == 3 and held_out.train_images.shape[1:] == (10, 10)
    assert len(held_out.train_labels) + len(held_out.test_labels) == 40
    assert set(held_out.train_columns) == {"writer"}
    assert len(held_out.train_columns["writer"]) == len(held_out.train_labels)
    assert (len(split.train_labels), len(split.test_labels)) == (30, 8)


def test_a_natural_id_partition_over_a_generated_writer_column(tmp_path: Path) -> None:
    root = _parquet(tmp_path / "writers.parquet", 60, writers=5)
    cfg = _cfg(
        "flwr-local",
        root,
        partitioner=ComponentConfig("flwr:NaturalIdPartitioner", {"partition-by": "writer"}),
        test_fraction=0.0,
    )
    writers = load_raw(cfg).train_columns["writer"]

    splits = partition_dataset(cfg, 5, 0)

    assert sorted(len(set(writers[s.train])) for s in splits) == [1] * 5
    assert sorted(str(writers[s.train][0]) for s in splits) == [f"w{i}" for i in range(5)]
    assert sum(len(s.train) for s in splits) == len(writers)


def test_flwr_local_reads_an_imagefolder_tree(tmp_path: Path) -> None:
    root = _tree(tmp_path / "hf", per_class=5)

    raw = load_raw(_cfg("flwr-local", root))

    assert raw.num_classes == 3
    assert len(raw.train_labels) + len(raw.test_labels) == 15
    assert raw.train_images.shape[1:] == (12, 12, 3)


def test_natural_id_over_an_imagefolders_metadata_writer_column(tmp_path: Path) -> None:
    root = tmp_path / "scans"
    rows = ["file_name,label,writer"]
    for i in range(24):
        _png(root / f"{i:02d}.png", 10 * i, size=8, mode="L")
        rows.append(f"{i:02d}.png,{i % 3},w{i % 4}")
    (root / "metadata.csv").write_text("\n".join(rows) + "\n")
    cfg = _cfg(
        "flwr-local",
        root,
        partitioner=ComponentConfig("flwr:NaturalIdPartitioner", {"partition-by": "writer"}),
    )
    writers = load_raw(cfg).train_columns["writer"]

    splits = partition_dataset(cfg, 4, 0)

    held = [np.concatenate([s.train, s.test]) for s in splits]
    assert sorted(str(writers[h][0]) for h in held) == ["w0", "w1", "w2", "w3"]
    assert all(len(set(writers[h])) == 1 for h in held)


def test_flwr_local_refuses_hub_names_and_other_files_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "notes.csv").write_text("a,b\n1,2\n")
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 but not really")

    assert "hub names need the network" in _refusal("flwr-local", "ylecun/mnist")
    assert "not a .parquet file" in _refusal("flwr-local", tmp_path / "notes.csv")
    assert "holds no parquet data Flower Datasets loads" in _refusal(
        "flwr-local", tmp_path / "bad.parquet"
    )
