"""Where tensors live: the one device choice, and the tests' logical GPUs.

Every path picks CUDA when it is present and asked for, else the CPU; a named
CUDA device must exist. Ray hands a task or actor the GPUs it reserved, so
"auto" inside one is the device Ray granted.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from fedsim.core.config import ScenarioError, require

DEVICES = "auto, cpu, cuda or cuda:N"

# Test-only: the number of logical GPUs a fedsim-started Ray declares on a
# machine without CUDA, and permission to ask for GPUs there. Never for users:
# their work would run on CPU while the plan says GPU.
TEST_LOGICAL_GPUS_ENV = "FEDSIM_TEST_LOGICAL_GPUS"


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Torch on ``count`` intra-op threads inside the block, restored after.

    For small work beside other busy threads (client actors, the server's own thread): on
    a loaded 2-core machine a second OpenMP thread mostly waits for a core. OpenMP's count
    is the calling thread's, so other threads keep theirs; torch's default for threads
    that first run torch meanwhile is ``count`` too, until restored."""
    threads = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def pick_device(name: str = "auto", key: str = "device") -> torch.device:
    """``auto`` is CUDA when available, else the CPU; a named CUDA device must exist.

    ``key`` names the setting in the error a bad ``name`` raises.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ScenarioError(key, name, f"one of {DEVICES}") from None
    require(device.type in ("cpu", "cuda"), key, name, f"one of {DEVICES}")
    if device.type == "cuda":
        count = torch.cuda.device_count()
        require(
            (device.index or 0) < count,
            key,
            name,
            f"this machine has {count} CUDA device(s); use auto or cpu",
        )
    return device


def gpu_if(wanted: bool) -> torch.device:
    """CUDA when ``wanted`` (the scenario reserved GPUs) and present, else the CPU."""
    return pick_device("auto" if wanted else "cpu")


def test_logical_gpus() -> int:
    """Logical GPUs granted by the test-only :data:`TEST_LOGICAL_GPUS_ENV` (0 when unset)."""
    raw = os.environ.get(TEST_LOGICAL_GPUS_ENV, "")
    return int(raw) if raw.strip().isdigit() else 0
