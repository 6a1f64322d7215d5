"""A long run stays flat: ``bench/soak.py``'s federation, shortened to a few minutes.

The bench runs 500 rounds (numbers in ``docs/soak.md``); here 80 rounds of 20
clients, 4 per round, an audit every 10th round and a checkpoint every round.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "soak.py"


def _bench() -> ModuleType:
    """``bench/soak.py`` as a module (``bench`` is no package)."""
    spec = importlib.util.spec_from_file_location("bench_soak", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # 80 rounds with 8 audits: 3.5 minutes on a busy 2-core machine (load 6)
def test_memory_object_store_and_folder_stay_flat_over_a_long_run(tmp_path: Path) -> None:
    soak = _bench()

    samples = soak.soak(tmp_path / "run", rounds=80, clients=20, per_round=4, sample_every=10)

    assert [s.round for s in samples] == [1, *range(10, 81, 10)]
    # From round 30 (actors warm, the audit's worker started) to round 80.
    _, rss = soak.growth(samples, "rss", 30)
    assert rss < 10  # percent over 50 rounds
    # Messages are freed once a round used them: at most a few in the store at a round's
    # end (500 rounds of the bench: 0 or 1 object, at most 0.5 MiB).
    assert max(s.store for s in samples if s.round >= 30) < 8 * 2**20
    # The folder grows by what its records add, and nothing else does.
    folder, records, checkpoint = (soak.growth(samples, c, 30)[0] for c in soak.COLUMNS[2:])
    assert folder <= records + checkpoint + 64 * 1024
