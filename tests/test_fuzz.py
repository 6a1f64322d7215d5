"""Fuzzing the scenario input: every generated input runs or is refused, never crashes or hangs.

Hypothesis mutates the shipped scenarios (and a tiny one): keys set to values
of any type (extreme and non-finite numbers, odd strings, lists, tables),
keys deleted, unknown keys added, ``--set`` overrides of arbitrary text, and
files of random bytes. Each case goes through the real ``fedsim run`` command
in this process with Ray replaced by a sentinel, and must either

- be refused: exit status 2 and one line ``fedsim: error: KEY = VALUE: ...``, or
- be accepted: pass every check up to the point Ray would start; the cheap
  accepted ones (a few clients, rounds and examples) then really run, in
  process, against the real ClientApp (:mod:`inprocess`),

each within :data:`CASE_SECONDS`, with no other exception (no traceback).
Generation is derandomized (the same cases every run) and keeps no database.
The counts are printed at the end of each test.
"""

from __future__ import annotations

import copy
import math
import signal
import time
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from inprocess import run_inprocess

from fedsim.cli import main
from fedsim.core.config import load_scenario

REPO = Path(__file__).resolve().parents[1]
SHIPPED = ("quickstart", "audit-fedavg", "audit-fedsplit", "failures")
TINY: dict[str, Any] = {
    "name": "tiny",
    "federation": {"num-clients": 2, "rounds": 1, "seed": 0},
    "data": {"dataset": "mnist-embedded", "samples-per-client": 16, "image-size": 16},
    "model": {"name": "lenet-zhu"},
    "client": {"local-steps": 1, "batch-size": 8, "lr": 0.01},
}
BASES = {name: tomllib.loads((REPO / "scenarios" / f"{name}.toml").read_text()) for name in SHIPPED}
BASES["tiny"] = TINY
CASE_SECONDS = 60  # a loaded 2-core machine; cases take ~0.1-3 s on an idle one
MAX_REAL_RUNS = 3  # accepted cheap cases run for real, in process (~5 s each)
FUZZ = settings(
    max_examples=80,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


class WouldStartRay(Exception):
    """The sentinel: the input passed every check and the simulation was about to start."""


@pytest.fixture(autouse=True)
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    def start(**_: object) -> None:
        raise WouldStartRay

    monkeypatch.setattr("flwr.simulation.run_simulation", start)


@pytest.fixture(scope="module")
def counts() -> Counter[str]:
    return Counter()


text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
scalars = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.sampled_from([0, 1, -1, 2, 7, 2**31, 10**12]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.inf, -math.inf, math.nan, 1e-300, 1e300, 0.999, 0.5, -0.0]),
    st.booleans(),
    text,
    st.sampled_from(["../up", "", "fedavg", "fedcg", "dirichlet", "shards", "dlg", "aligned-dlg"]),
)
plausible = st.one_of(  # values of the right kind, so that many cases pass and run
    st.integers(min_value=0, max_value=8),
    st.floats(min_value=0, max_value=1),
    st.sampled_from(["iid", "lenet-zhu", "lenet5-split", "fedprox", "gray", "rgb"]),
)
values = st.one_of(
    plausible,
    plausible,
    scalars,
    st.lists(st.integers(min_value=-3, max_value=12), max_size=3),
    st.dictionaries(st.sampled_from(["name", "alpha", "min-size", "x"]), scalars, max_size=2),
)


def leaf_paths(table: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths: list[tuple[str, ...]] = []
    for key, value in table.items():
        paths.append((*prefix, key))
        if isinstance(value, dict):
            paths += leaf_paths(value, (*prefix, key))
    return paths


def _set(table: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = table
    for part in path[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            return
    node[path[-1]] = value


def _delete(table: dict[str, Any], path: tuple[str, ...]) -> None:
    node: Any = table
    for part in path[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(path[-1], None)


# Keys every scenario understands, so that mutations also reach tables a base lacks.
KNOWN = [
    ("federation", "num-clients"),
    ("federation", "clients-per-round"),
    ("federation", "fraction"),
    ("federation", "seed"),
    ("data", "image-size"),
    ("data", "test-fraction"),
    ("data", "samples-per-client"),
    ("data", "partitioner"),
    ("data", "channels"),
    ("model", "name"),
    ("strategy",),
    ("client", "lr"),
    ("client", "batch-size"),
    ("backend", "num-cpus"),
    ("backend", "ray-cpus"),
    ("audit", "enabled"),
    ("audit", "victim-ids"),
    ("audit", "rounds"),
    ("audit", "attacks"),
    ("failures", "fraction"),
    ("name",),
]


@st.composite
def mutated(draw: st.DrawFn) -> tuple[dict[str, Any], list[str]]:
    """A base scenario with 1-3 mutations, and 0-2 ``--set`` overrides."""
    # The tiny base thrice: its cases that pass are cheap enough to run for real.
    table = copy.deepcopy(BASES[draw(st.sampled_from([*sorted(BASES), "tiny", "tiny"]))])
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        path = draw(st.sampled_from(leaf_paths(table) + KNOWN))
        kind = draw(st.sampled_from(["set", "set", "set", "delete", "unknown"]))
        if kind == "set":
            _set(table, path, draw(values))
        elif kind == "delete":
            _delete(table, path)
        else:
            _set(table, (*path[:-1], draw(text) or "x"), draw(scalars))
    overrides = []
    for _ in range(draw(st.integers(min_value=0, max_value=2))):
        key = ".".join(draw(st.sampled_from(KNOWN)))
        raw = draw(st.one_of(text, values.map(lambda v: tomli_w.dumps({"v": v})[4:].strip())))
        overrides.append(draw(st.sampled_from([f"{key}={raw}", raw, f"{key}"])))
    return table, overrides


def cheap(path: Path, overrides: list[str]) -> bool:
    """Small enough to run for real in a few seconds, and without waits built in."""
    scenario = load_scenario(path, overrides)
    fed, data = scenario.federation, scenario.data
    return (
        fed.num_clients * fed.rounds <= 4
        and 0 < data.samples_per_client <= 32
        and data.image_size <= 32
        and scenario.client.local_steps in range(1, 4)
        and not scenario.audit.enabled
        and scenario.failures.fraction == 0
    )


def check_case(
    argv: list[str], out: Path, counts: Counter[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """``fedsim argv`` is refused with one line or accepted; a cheap accepted case then runs."""

    def too_long(*_: object) -> None:
        raise TimeoutError(f"no answer within {CASE_SECONDS} s: {argv}")

    previous = signal.signal(signal.SIGALRM, too_long)
    signal.alarm(CASE_SECONDS)
    start = time.monotonic()
    try:
        status = main([*argv, "--out", str(out)])
    except WouldStartRay:
        status = None
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    elapsed_ms = int(1000 * (time.monotonic() - start))
    counts["cases"] += 1
    counts["slowest answer (ms)"] = max(counts["slowest answer (ms)"], elapsed_ms)
    err = capsys.readouterr().err
    if status == 0:  # compare --dry-run: a valid sweep, listed
        counts["accepted"] += 1
        return
    if status is None:
        counts["accepted"] += 1
        scenario_path, overrides = Path(argv[1]), argv[3::2]
        if counts["ran ok"] < MAX_REAL_RUNS and cheap(scenario_path, overrides):
            run = run_inprocess(load_scenario(scenario_path, overrides), out / "client_state")
            assert len(run.records) == load_scenario(scenario_path, overrides).federation.rounds
            counts["ran ok"] += 1
        return
    counts["refused"] += 1
    assert status == 2, err
    assert err.startswith("fedsim: error: ") and err.count("\n") == 1, err
    assert " = " in err, err  # KEY = VALUE: what is allowed


def test_mutated_scenarios_run_or_are_refused_in_one_line(
    tmp_path_factory: pytest.TempPathFactory,
    counts: Counter[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    @FUZZ
    @given(mutated())
    def case(mutation: tuple[dict[str, Any], list[str]]) -> None:
        table, overrides = mutation
        folder = tmp_path_factory.mktemp("fuzz")
        path = folder / "case.toml"
        path.write_text(tomli_w.dumps(table))
        argv = ["run", str(path)]
        for item in overrides:
            argv += ["--set", item]
        check_case(argv, folder / "run", counts, capsys)

    case()
    with capsys.disabled():
        print(f"\nmutated scenarios: {dict(counts)}")
    # Every outcome was exercised (generation is derandomized: the same cases each run).
    assert counts["refused"] > 0 and counts["accepted"] > 0 and counts["ran ok"] > 0


def test_random_bytes_are_refused_in_one_line(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    tally: Counter[str] = Counter()

    @settings(FUZZ, max_examples=30)
    @given(st.binary(max_size=200))
    def case(content: bytes) -> None:
        folder = tmp_path_factory.mktemp("bytes")
        (folder / "case.toml").write_bytes(content)
        for command in ("run", "compare"):
            argv = [command, str(folder / "case.toml")]
            if command == "compare":
                argv.append("--dry-run")
            check_case(argv, folder / "run", tally, capsys)

    case()
    with capsys.disabled():
        print(f"\nrandom bytes: {dict(tally)}")
    assert tally["refused"] > 0
