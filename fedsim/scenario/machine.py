"""Can this machine run a scenario: its GPUs, its cores and Ray actors, its memory.

Part of :func:`fedsim.scenario.validate.check_machine`, before Ray starts; the
runner sizes Ray with :func:`ray_cpus` and :func:`actor_count` too.
"""

from __future__ import annotations

import os

import torch

from fedsim.core.config import BackendConfig, DataConfig, FederationConfig, ScenarioError, require
from fedsim.core.data import load_raw, shaped_channels
from fedsim.core.devices import test_logical_gpus
from fedsim.core.raw import IMAGE, RawDataset

MAX_ACTORS_PER_CORE = 4
"""Flower starts ``ray-cpus / num-cpus`` client actors; more per core flood the machine."""

BYTES_PER_VALUE = 4  # float32 images


def check_gpu_request(num_gpus: float, key: str) -> None:
    """Ray waits forever for GPUs that do not exist; refuse instead.

    Tests alone may grant logical GPUs (:data:`~fedsim.core.devices.TEST_LOGICAL_GPUS_ENV`):
    Ray then schedules GPU shares and everything runs on CPU.
    """
    if num_gpus > 0 and not torch.cuda.is_available() and not test_logical_gpus():
        raise ScenarioError(key, num_gpus, "must be 0 on a machine without a CUDA GPU")


def ray_cpus(backend: BackendConfig) -> int:
    """Logical CPUs of a local Ray head (``backend.ray-cpus``; 0 = this machine's cores)."""
    return backend.ray_cpus or os.cpu_count() or 1


def actor_count(backend: BackendConfig) -> int:
    """Client actors Flower starts on this machine: one per ``num-cpus`` CPUs."""
    return max(1, int(ray_cpus(backend) / backend.num_cpus))


def check_resources(backend: BackendConfig) -> None:
    """A local Ray head gets no more logical CPUs and actors than this machine can serve."""
    if backend.address:  # a cluster's size is the cluster's business
        return
    cores = os.cpu_count() or 1
    limit = MAX_ACTORS_PER_CORE * cores
    require(
        backend.ray_cpus <= limit,
        "backend.ray-cpus",
        backend.ray_cpus,
        f"must be at most {limit} ({MAX_ACTORS_PER_CORE} per core of this machine's {cores})",
    )
    require(
        actor_count(backend) <= limit,
        "backend.num-cpus",
        backend.num_cpus,
        f"starts {actor_count(backend)} client actors (ray-cpus / num-cpus); "
        f"at most {limit} fit this machine's {cores} cores",
    )


def physical_memory() -> int:
    """Bytes of RAM on this machine."""
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def held_bytes(raw: RawDataset, data: DataConfig) -> int:
    """Bytes of the dataset one process holds: images resized to ``data.image-size`` as
    float32; token windows as loaded (int64 ids, no resizing)."""
    if raw.modality != IMAGE:
        return int(raw.train_images.nbytes + raw.test_images.nbytes)
    examples = len(raw.train_labels) + len(raw.test_labels)
    return examples * shaped_channels(raw, data) * data.image_size**2 * BYTES_PER_VALUE


def check_data_fits(data: DataConfig, fed: FederationConfig, backend: BackendConfig) -> None:
    """Clients have examples to hold, and the shaped dataset fits in memory.

    The driver and every client actor each hold the whole dataset.
    """
    raw = load_raw(data)
    num_train = len(raw.train_labels)
    require(
        fed.num_clients <= num_train,
        "federation.num-clients",
        fed.num_clients,
        f"must be at most {num_train}, the training examples of {data.dataset}",
    )
    examples = num_train + len(raw.test_labels)
    per_process = held_bytes(raw, data)
    processes = 1 + (1 if backend.address else actor_count(backend))
    needed, have = per_process * processes, physical_memory()
    # The setting that made it too big: the image side, or a text dataset as it is.
    key, value = (
        ("data.image-size", data.image_size)
        if raw.modality == IMAGE
        else ("data.dataset", data.dataset)
    )
    require(
        needed <= have,
        key,
        value,
        f"{examples} examples need {per_process / 2**30:.1f} GiB in each of "
        f"{processes} processes, more than this machine's {have / 2**30:.1f} GiB",
    )
