"""Inputs that are wrong in what they mean stop before Ray: one line, key, value, exit 2.

One case per row of issue 18's table of inputs seen failing (a traceback deep
in Ray, Flower or torch, a hang, or a silent run on nonsense). Ray is never
reached: the simulation entry point is replaced by one that fails the test.
"""

from __future__ import annotations

import gzip
import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tomli_w

from fedsim.cli import main
from fedsim.core.config import DataConfig, ScenarioError
from fedsim.core.data import load_raw

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = str(REPO / "scenarios" / "quickstart.toml")
MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
SECONDS = 60  # "within seconds": generous for a loaded 2-core machine (measured 1-6 s idle)


@pytest.fixture(autouse=True)
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    def reached(**_: object) -> None:
        raise AssertionError("bad input reached the simulation")

    monkeypatch.setattr("flwr.simulation.run_simulation", reached)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private HOME, so dataset caches land in the test's folder."""
    folder = tmp_path / "home"
    folder.mkdir()
    monkeypatch.setenv("HOME", str(folder))
    yield folder


def refused(argv: list[str], capsys: pytest.CaptureFixture[str], key: str, fragment: str) -> str:
    """``fedsim argv`` exits 2 with one line naming ``key`` and ``fragment``, in seconds."""
    start = time.monotonic()
    assert main(argv) == 2
    assert time.monotonic() - start < SECONDS
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"fedsim: error: {key} = "), err
    assert fragment in err, err
    return err


def write(path: Path, content: bytes) -> str:
    path.write_bytes(content)
    return str(path)


def test_file_level_bytes_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    binary = write(tmp_path / "binary.toml", bytes(range(256)))
    latin = write(tmp_path / "latin.toml", 'name = "café"\n'.encode("latin-1"))
    refused(["run", binary], capsys, "scenario", "is not UTF-8 text")
    refused(["run", latin], capsys, "scenario", "is not UTF-8 text")
    refused(["compare", binary], capsys, "spec", "is not UTF-8 text")


def test_an_unreadable_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path / "locked.toml", b'name = "x"\n')
    os.chmod(path, 0)
    if os.access(path, os.R_OK):  # root reads anything: make the read fail as it would
        real = Path.read_bytes

        def denied(self: Path) -> bytes:
            if self == Path(path):
                raise PermissionError(13, "Permission denied")
            return real(self)

        monkeypatch.setattr(Path, "read_bytes", denied)
    refused(["run", path], capsys, "scenario", "cannot be read (Permission denied)")


def test_paths_of_the_wrong_kind_are_refused_saying_what_they_are(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = write(tmp_path / "run.toml", b'name = "x"\n')
    refused(["run", str(tmp_path)], capsys, "scenario", "is a directory; expected a TOML file")
    refused(["run", os.devnull], capsys, "scenario", "is a character device; expected a TOML")
    refused(["compare", str(tmp_path)], capsys, "spec", "is a directory; expected a TOML file")
    refused(["run", "--resume", file], capsys, "--resume", "is a file; expected a run directory")


@pytest.mark.parametrize(
    ("overrides", "key", "fragment"),
    [
        (["data.image-size=9"], "data.image-size", "does not fit model 'lenet5-split'"),
        (
            ["strategy=fedcg", "model.name=lenet5-split", "data.image-size=8"],
            "data.image-size",
            "does not fit model",
        ),
        (["data.image-size=100000"], "data.image-size", "between 8 and 1024"),
        (
            ['data.partitioner={name="dirichlet", min-size=5000}'],
            "data.partitioner",
            "need 20000, the dataset has 4000",
        ),
        (
            ['data.partitioner={name="shards", classes-per-client=50}'],
            "data.partitioner",
            "classes-per-client = 50 is above the dataset's 10 classes; allowed 1 to 10",
        ),
        (["federation.seed=-1"], "federation.seed", ">= 0"),
        (["audit.seed=-3"], "audit.seed", ">= 0"),
        (
            ["data.samples-per-client=500", "data.test-fraction=0.999"],
            "data.test-fraction",
            "no training examples",
        ),
        (["federation.num-clients=1000000000000"], "federation.num-clients", "at most 4000"),
        (["federation.num-clients=5000"], "federation.num-clients", "at most 4000"),
        (["backend.num-cpus=0.00001"], "backend.num-cpus", ">= 0.0001"),
        (["backend.num-cpus=0.001"], "backend.num-cpus", "client actors"),
        (["backend.num-cpus=inf"], "backend.num-cpus", "finite"),
        (["backend.ray-cpus=100000"], "backend.ray-cpus", "per core"),
        (["client.lr=inf"], "client.lr", "finite"),
        (["client.weight-decay=inf"], "client.weight-decay", "finite"),
        (["client.lr=nan"], "client.lr", "finite"),
        (["audit.enabled=true", "audit.victim-ids=[7]"], "audit.victim-ids", "0 to 3"),
        (["audit.enabled=true", "audit.rounds=[9]"], "audit.rounds", "1 to 5"),
        (
            ["audit.enabled=true", 'audit.attacks=[{name="aligned-dlg"}]'],
            "audit.attacks[0].name",
            "uploaded generator",
        ),
        (["data=3"], "data", "must be a table"),
        (["audit=false"], "audit", "must be a table"),
        (["name=../../escape"], "name", "plain file name"),
        (["output.dir=/proc/no/such"], "output.dir", "cannot be created"),
        # ResNet-18's last block is 1x1 at 8 pixels: batch norm cannot train on one example.
        (
            ["model.name=resnet18", "data.image-size=8", "client.batch-size=1"],
            "client.batch-size",
            "gives batches of one",
        ),
        (
            [
                "model.name=resnet18",
                "data.image-size=8",
                "data.samples-per-client=35",
                "client.batch-size=3",
            ],
            "client.batch-size",
            "(28 training examples) a last batch of one",
        ),
    ],
)
def test_scenarios_wrong_in_meaning_are_refused(
    overrides: list[str], key: str, fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", QUICKSTART]
    for item in overrides:
        argv += ["--set", item]
    refused(argv, capsys, key, fragment)


def _idx(magic: int, array: np.ndarray) -> bytes:
    return struct.pack(">" + "I" * (1 + array.ndim), magic, *array.shape) + array.tobytes()


def write_mnist_root(root: Path, count: int = 8) -> None:
    """A valid, tiny MNIST root of bare idx.gz files (what torchvision's mirror expects)."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (count, 28, 28), dtype=np.uint8)
    labels = (np.arange(count) % 10).astype(np.uint8)
    for name in MNIST_FILES:
        content = _idx(0x803, images) if "images" in name else _idx(0x801, labels)
        (root / f"{name}.gz").write_bytes(gzip.compress(content))


def test_data_roots_that_hold_no_data_are_refused(
    tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty, bad = tmp_path / "empty", tmp_path / "bad"
    empty.mkdir()
    bad.mkdir()
    for name in MNIST_FILES:
        (bad / f"{name}.gz").write_bytes(b"not gzip at all")
    base = ["run", QUICKSTART, "--set", "data.dataset=mnist", "--set"]
    refused([*base, f"data.root={empty}"], capsys, "data.root", "holds no mnist data that loads")
    refused([*base, f"data.root={bad}"], capsys, "data.root", "is not a readable gzip file")


def test_a_failed_unpack_leaves_no_cache_so_fixed_data_loads(tmp_path: Path, home: Path) -> None:
    root = tmp_path / "mnist"
    root.mkdir()
    write_mnist_root(root)
    (root / f"{MNIST_FILES[0]}.gz").write_bytes(b"\x1f\x8b truncated gzip")
    cfg = DataConfig(dataset="mnist", root=str(root))
    with pytest.raises(ScenarioError, match="not a readable gzip file"):
        load_raw(cfg)
    cached = [p for p in (home / ".cache").rglob("*") if p.is_file()]
    assert all(p.stat().st_size > 0 for p in cached)
    assert not any(p.name == MNIST_FILES[0] for p in cached)

    write_mnist_root(root)  # the data is fixed
    raw = load_raw(cfg)

    assert raw.train_images.shape == (8, 28, 28)
    assert raw.train_labels.tolist() == list(range(8))


def write_spec(folder: Path, spec: dict[str, object]) -> str:
    (folder / "base.toml").write_text((REPO / "scenarios" / "quickstart.toml").read_text())
    path = folder / "spec.toml"
    path.write_text(tomli_w.dumps({"base": "base.toml", **spec}))
    return str(path)


@pytest.mark.parametrize(
    ("spec", "key", "fragment"),
    [
        ({"seeds": [0, -1]}, "seeds[1]", ">= 0"),
        ({"overrides": {"data": 3}}, "[fedavg, seed 0] data", "would replace the table"),
        ({"overrides": {"name": {"x": 1}}}, "[fedavg, seed 0] name", "is not a table here"),
        ({"overrides": {"client": {"lr": 1e309}}}, "[fedavg, seed 0] client.lr", "finite"),
        ({"name": "../up"}, "name", "plain file name"),
    ],
)
def test_compare_specs_wrong_in_meaning_are_refused(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    spec: dict[str, object],
    key: str,
    fragment: str,
) -> None:
    refused(["compare", write_spec(tmp_path, spec), "--dry-run"], capsys, key, fragment)


@pytest.mark.parametrize(
    ("flags", "key", "fragment"),
    [
        (["--device", "cuda:7"], "--device", "CUDA device(s); use auto or cpu"),
        (["--device", "gpu"], "--device", "one of auto, cpu, cuda or cuda:N"),
        (["--model", "lenet5-split", "--image-size", "9"], "--image-size", "does not fit"),
        (["--image-size", "100000"], "--image-size", "between 8 and 1024"),
        (["--num-classes", "0"], "--num-classes", "between 1 and 10000"),
        (["--num-images", "5", "--batch-size", "2"], "--num-images", "multiple of"),
        (["--attack", "nope"], "--attack", "dlg"),
        (["--set", "steps=inf"], "attack.steps", "integer"),
        (["--restarts", "5000"], "attack.restarts", "between 1 and 1024"),
        (["--threads", "100000"], "--threads", "cores"),
    ],
)
def test_attack_command_input_wrong_in_meaning_is_refused(
    flags: list[str], key: str, fragment: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    refused(["attack", *flags, "--out", str(tmp_path / "out")], capsys, key, fragment)
    assert not (tmp_path / "out").exists()
