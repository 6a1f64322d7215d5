"""Fuzzing the scenario input: every generated input runs or is refused, never crashes or hangs.

Hypothesis mutates the shipped scenarios (and a tiny one): keys set to values
of any type (extreme and non-finite numbers, odd strings, lists, tables),
keys deleted, unknown keys added, ``--set`` overrides of arbitrary text, and
files of random bytes; and ``fedsim attack`` command lines (every flag, with
values of the right kind, odd ones and unparseable ones). Each case goes
through the real command in this process with Ray (for ``fedsim attack``: the
attack's optimisation, after the victim's real gradient was taken) replaced by
a sentinel, and must either

- be refused: exit status 2 and one line ``fedsim: error: KEY = VALUE: ...``
  (or argparse's usage and one ``error: argument ...`` line for a flag value
  of the wrong type), or
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

from fedsim.attacks import ATTACKS
from fedsim.cli import build_parser, main
from fedsim.core.scenario_file import load_scenario

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
ATTACK_NAMES = ATTACKS.names()
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


class WouldStartAttack(Exception):
    """The sentinel: ``fedsim attack`` built every probe and was about to optimise."""


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
) -> bool:
    """``fedsim argv`` is refused with one line or accepted; returns whether it was accepted."""

    def too_long(*_: object) -> None:
        raise TimeoutError(f"no answer within {CASE_SECONDS} s: {argv}")

    previous = signal.signal(signal.SIGALRM, too_long)
    signal.alarm(CASE_SECONDS)
    start = time.monotonic()
    try:
        status = main([*argv, "--out", str(out)])
    except (WouldStartRay, WouldStartAttack):
        status = None
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    elapsed_ms = int(1000 * (time.monotonic() - start))
    counts["cases"] += 1
    counts["slowest answer (ms)"] = max(counts["slowest answer (ms)"], elapsed_ms)
    err = capsys.readouterr().err
    if status in (0, None):  # 0: compare --dry-run listed a valid sweep
        counts["accepted"] += 1
        return True
    counts["refused"] += 1
    assert status == 2, err
    assert err.startswith("fedsim: error: ") and err.count("\n") == 1, err
    assert " = " in err, err  # KEY = VALUE: what is allowed
    return False


def run_if_cheap(argv: list[str], out: Path, counts: Counter[str]) -> None:
    """An accepted ``fedsim run`` case small enough runs for real, in process."""
    if argv[0] != "run" or counts["ran ok"] >= MAX_REAL_RUNS:
        return
    scenario_path, overrides = Path(argv[1]), argv[3::2]
    if cheap(scenario_path, overrides):
        run = run_inprocess(load_scenario(scenario_path, overrides), out / "client_state")
        assert len(run.records) == load_scenario(scenario_path, overrides).federation.rounds
        counts["ran ok"] += 1


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
        if check_case(argv, folder / "run", counts, capsys):
            run_if_cheap(argv, folder / "run", counts)

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
            if check_case(argv, folder / "run", tally, capsys):
                run_if_cheap(argv, folder / "run", tally)

    case()
    with capsys.disabled():
        print(f"\nrandom bytes: {dict(tally)}")
    assert tally["refused"] > 0


def _integer_text(low: int, high: int) -> st.SearchStrategy[str]:
    return st.one_of(
        st.integers(min_value=low, max_value=high).map(str),
        st.sampled_from(["0", "-1", "x", "", "1e3", "99999999999"]),
    )


# Flag -> values: mostly plausible (so that many cases are accepted), some not.
ATTACK_FLAGS: dict[str, st.SearchStrategy[str]] = {
    "--attack": st.sampled_from([*ATTACK_NAMES, "nope", ""]),
    "--dataset": st.sampled_from(
        ["cifar100-samples", "cifar10-samples", "lfw-faces", "mnist-embedded", "cifar10", "nope"]
    ),
    "--model": st.sampled_from(["lenet-zhu", "lenet5-split", "lenet-sapag", "resnet18", "x"]),
    "--init": st.sampled_from(["uniform", "default", "x"]),
    "--batch-size": _integer_text(1, 4),
    "--num-images": _integer_text(1, 4),
    "--seed": _integer_text(0, 3),
    "--restarts": _integer_text(1, 2),
    "--steps": _integer_text(1, 2),
    "--shared": st.sampled_from(["gradient", "update", "weights"]),
    "--channels": st.sampled_from(["native", "gray", "rgb", "cmyk"]),
    "--image-size": st.sampled_from(["8", "9", "16", "32", "1025", "0", "-8", "x"]),
    "--num-classes": _integer_text(1, 200),
    "--parallel": _integer_text(1, 4),
    "--device": st.sampled_from(["auto", "cpu", "cuda", "cuda:3", "tpu", ""]),
    "--threads": _integer_text(0, 2),
    "--precision": st.sampled_from(["float32", "float64", "float16"]),
    "--set": st.one_of(
        st.sampled_from(["steps=1", "restarts=1", "labels=infer", "lr=inf", "tv=-1", "x=1"]),
        text,
    ),
}


def cheap_attack(argv: list[str]) -> bool:
    """A few small images, a step or two: seconds to run for real."""
    args = build_parser().parse_args(argv)
    return (
        args.steps <= 2
        and args.restarts <= 2
        and args.num_images <= 4
        and args.image_size <= 32
        and args.model != "resnet18"
        and not args.params
    )


@st.composite
def attack_command_lines(draw: st.DrawFn) -> list[str]:
    """``fedsim attack`` with 1-5 flags set; few steps and images unless a flag says otherwise."""
    argv = ["attack", "--steps", "1", "--restarts", "1", "--num-images", "1"]
    for flag in draw(st.lists(st.sampled_from(sorted(ATTACK_FLAGS)), min_size=1, max_size=5)):
        argv += [flag, draw(ATTACK_FLAGS[flag])]
    return argv


def test_attack_command_lines_run_or_are_refused_in_one_line(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    tally: Counter[str] = Counter()
    ran: list[list[str]] = []

    def sentinel(*_: object) -> None:
        raise WouldStartAttack

    @settings(FUZZ, max_examples=120)
    @given(attack_command_lines())
    def case(argv: list[str]) -> None:
        out = tmp_path_factory.mktemp("attack") / "out"
        with monkeypatch.context() as patched:
            patched.setattr("fedsim.audit.experiment.attack_precision", sentinel)
            try:
                accepted = check_case(argv, out, tally, capsys)
            except SystemExit as exit_:  # argparse: a flag value of the wrong type
                err = capsys.readouterr().err
                assert exit_.code == 2, err
                assert err.startswith("usage: fedsim attack"), err
                assert err.strip().splitlines()[-1].startswith("fedsim attack: error: argument")
                tally["cases"] += 1
                tally["refused"] += 1
                tally["refused by argparse"] += 1
                return
        if accepted and len(ran) < MAX_REAL_RUNS and cheap_attack(argv):
            ran.append(argv)  # it also runs for real
            assert main([*argv, "--out", str(out)]) == 0
            assert (out / "results.csv").is_file()
            capsys.readouterr()

    case()
    tally["ran ok"] = len(ran)
    with capsys.disabled():
        print(f"\nattack command lines: {dict(tally)}")
    assert tally["refused"] > 0 and tally["accepted"] > 0 and tally["ran ok"] > 0
