"""The resource plan: client actors beside a reserved audit, refused splits, bounded waits.

Simulations use Ray's logical GPUs on this CPU-only machine through the
test-only switch ``FEDSIM_TEST_LOGICAL_GPUS``: Ray schedules GPU shares while
every component runs on CPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import ray
import torch
from rich.console import Console

from fedsim.attacks.registry import ATTACKS
from fedsim.attacks.toolkits.precision import attack_precision
from fedsim.audit.tasks import reserved_workers
from fedsim.cli import main
from fedsim.core.components import Resolved
from fedsim.core.config import ScenarioError
from fedsim.core.devices import TEST_LOGICAL_GPUS_ENV
from fedsim.core.scenario_file import load_scenario
from fedsim.outputs.run_folder import AUDIT_FILE, CLIENTS_FILE, METRICS_FILE
from fedsim.scenario.machine import check_gpu_request
from fedsim.simulation.resources import (
    RESOURCES_FILE,
    NodeResources,
    ResourceError,
    plan_resources,
)
from fedsim.simulation.runner import run_scenario

REPO = Path(__file__).resolve().parents[1]
AUDIT_FEDAVG = REPO / "scenarios" / "audit-fedavg.toml"
# A DLG budget that only has to finish: these tests check scheduling, not leakage.
SHORT_AUDIT = ["federation.rounds=2", "audit.attacks=[{name='dlg', steps=5, restarts=1}]"]
# The example plugin's model, dataset, strategy (and client routine) and attack, by path.
TINYLAB = REPO / "examples" / "plugin" / "tinylab"
WITH_PLUGIN = [
    f"plugins=['{TINYLAB}']",
    "data.dataset='tinylab-bars'",
    "data.image-size=16",
    "data.samples-per-client=40",
    "model.name='tinylab-mlp'",
    "model.init='default'",
    "strategy.name='tinylab-smooth'",
    "audit.attacks=[{name='tinylab-row-ratio'}]",
]
ONE_GPU = [NodeResources("gpu-node", 16.0, 1.0)]


def _scenario(*overrides: str):  # type: ignore[no-untyped-def]
    return load_scenario(AUDIT_FEDAVG, [*SHORT_AUDIT, *overrides])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the plan ----------------------------------------------------------------------


def test_quarter_gpu_clients_leave_the_audit_its_half() -> None:
    # Flower alone would start 4 actors x 0.25 GPU and starve a 0.5 GPU attack.
    scenario = _scenario("backend.num-gpus=0.25", "audit.num-gpus=0.5")

    plan = plan_resources(
        scenario.backend, scenario.audit, ONE_GPU, "a node", scenario.audit.workers
    )

    assert plan.actors == 2
    assert plan.actors * plan.actor_gpus + plan.audit_workers * plan.audit_gpus <= 1.0
    assert plan.bundles() == [{"CPU": 1.0, "GPU": 0.5}]


def test_cpu_reservation_comes_out_of_a_clusters_cpus() -> None:
    scenario = _scenario("audit.workers=2", "audit.threads-per-attack=2")
    nodes = [NodeResources("a", 4.0, 0.0), NodeResources("b", 4.0, 0.0, "node:10.0.0.2")]

    plan = plan_resources(
        scenario.backend, scenario.audit, nodes, "the cluster", scenario.audit.workers
    )

    assert plan.actors == 4  # 8 CPUs - 2 x 2 reserved
    assert sum(b["CPU"] for b in plan.bundles()) == 4.0


def test_an_audit_of_closed_form_attacks_alone_reserves_no_worker() -> None:
    # Closed-form attacks run on a driver thread: a reserved Ray worker would idle.
    scenario = _scenario("audit.workers=2")
    closed_form, optimised = (
        Resolved(name, ATTACKS.get(name), None, f"audit.attacks[{i}]")
        for i, name in enumerate(("analytic-fc", "dlg"))
    )

    assert reserved_workers(scenario.audit, [closed_form]) == 0
    assert reserved_workers(scenario.audit, [closed_form, optimised]) == 2
    plan = plan_resources(scenario.backend, scenario.audit, ONE_GPU, "a node", 0)
    assert plan.bundles() == [] and plan.actors == 16
    assert "audit reserves" not in plan.describe()


@pytest.mark.parametrize(
    ("overrides", "key", "fix"),
    [
        (
            ["backend.num-gpus=0.75", "audit.num-gpus=0.5"],
            "backend.num-gpus",
            "backend.num-gpus = 0.5",
        ),
        (["audit.num-gpus=0.5", "audit.workers=3"], "audit.workers", "audit.workers = 2"),
        (["audit.num-gpus=2"], "audit.workers", "audit.num-gpus = 0.5"),
    ],
)
def test_a_split_that_cannot_fit_names_keys_machine_and_a_fix(
    overrides: list[str], key: str, fix: str
) -> None:
    with pytest.raises(ResourceError) as err:
        scenario = _scenario(*overrides)
        plan_resources(scenario.backend, scenario.audit, ONE_GPU, "a node", scenario.audit.workers)

    message = str(err.value)
    assert "\n" not in message
    assert key in message and "16 CPUs and 1 GPUs" in message
    assert message.endswith(f"a split that fits: {fix}")


def test_suggested_split_fits() -> None:
    with pytest.raises(ResourceError) as err:
        scenario = _scenario("backend.num-gpus=0.75", "audit.num-gpus=0.5")
        plan_resources(scenario.backend, scenario.audit, ONE_GPU, "a node", scenario.audit.workers)
    suggested = str(err.value).rsplit("a split that fits: ", 1)[1]

    fixed = _scenario("audit.num-gpus=0.5", suggested.replace(" = ", "="))
    plan = plan_resources(fixed.backend, fixed.audit, ONE_GPU, "a node", fixed.audit.workers)

    assert plan.actors >= 1


def test_gpus_on_a_machine_without_cuda_are_for_tests_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    monkeypatch.delenv(TEST_LOGICAL_GPUS_ENV, raising=False)
    with pytest.raises(ScenarioError, match="without a CUDA GPU"):
        check_gpu_request(0.25, "backend.num-gpus")
    monkeypatch.setenv(TEST_LOGICAL_GPUS_ENV, "1")
    check_gpu_request(0.25, "backend.num-gpus")


def test_refused_split_costs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(TEST_LOGICAL_GPUS_ENV, "1")

    status = main(
        [
            "run",
            str(AUDIT_FEDAVG),
            "--set",
            "backend.num-gpus=0.75",
            "--set",
            "audit.num-gpus=0.5",
            "--out",
            str(tmp_path / "run"),
        ]
    )

    assert status == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "backend.num-gpus" in err
    assert not (tmp_path / "run").exists()
    assert not ray.is_initialized()  # refused before Ray started


def test_a_cluster_address_pointing_nowhere_fails_within_seconds(tmp_path: Path) -> None:
    scenario = _scenario(f"backend.address='127.0.0.1:{_free_port()}'")
    started = time.perf_counter()

    with pytest.raises(ScenarioError, match="no Ray cluster answers"):
        run_scenario(scenario, tmp_path / "run")

    # A refused connection answers at once, an unroutable host after the 5 s connect
    # limit; the margin is for a loaded machine (ray.init alone would retry for minutes).
    assert time.perf_counter() - started < 30
    assert not (tmp_path / "run").exists()


def test_attack_precision_switches_tf32_off_and_restores() -> None:
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv  # type: ignore[attr-defined]
    before = (matmul.fp32_precision, conv.fp32_precision, torch.get_default_dtype())

    with attack_precision("float64") as dtype:
        assert (matmul.fp32_precision, conv.fp32_precision) == ("ieee", "ieee")
        assert dtype == torch.float64 and torch.zeros(1).dtype == torch.float64

    assert (matmul.fp32_precision, conv.fp32_precision, torch.get_default_dtype()) == before


# -- real simulations on logical GPUs ------------------------------------------------


def _check_audited_run(run_dir: Path, actors: int) -> None:
    plan = json.loads((run_dir / RESOURCES_FILE).read_text())
    assert plan["actors"] == actors and plan["audit_gpus"] == 0.5
    audit = pd.read_csv(run_dir / AUDIT_FILE)
    assert sorted(audit["round"]) == [1, 2]
    # A logical GPU without CUDA runs on CPU, and says so.
    assert set(audit["device"]) == {"cuda" if torch.cuda.is_available() else "cpu"}
    assert audit["psnr"].notna().all()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_quarter_gpu_clients_and_half_gpu_audit_complete(
    mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TEST_LOGICAL_GPUS_ENV, "1")
    scenario = _scenario("backend.num-gpus=0.25", "audit.num-gpus=0.5", f"audit.mode='{mode}'")

    result = run_scenario(scenario, tmp_path / mode)

    assert [r["round"] for r in result.rounds] == [1, 2]
    _check_audited_run(tmp_path / mode, actors=2)


def _descendants(pid: int) -> list[int]:
    """``pid``'s process tree, from /proc (Linux)."""
    parent_of: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # The command name (field 2) may hold spaces; fields after it are plain.
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent_of[int(stat.parent.name)] = int(fields[1])
    tree, frontier = [], [pid]
    while frontier:
        children = [c for c, p in parent_of.items() if p in frontier]
        tree += children
        frontier = children
    return tree


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in _state(pid)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def _stop_tree(root: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process tree of ``root`` by PID, SIGKILL what is left after 15 s."""
    pids = [root.pid, *_descendants(root.pid)]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        root.poll()  # reap the head so it does not linger as a zombie
        time.sleep(0.2)
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    root.wait(timeout=15)


def _ray_start(*args: str) -> subprocess.Popen[bytes]:
    """``ray start --block ARGS`` in its own session, stopped by its PIDs (:func:`_stop_tree`)."""
    ray_cli = Path(sys.executable).with_name("ray")
    return subprocess.Popen(
        [str(ray_cli), "start", "--block", "--node-ip-address=127.0.0.1", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
    )


def _wait_for_nodes(address: str, count: int, started: list[subprocess.Popen[bytes]]) -> None:
    """Until the cluster at ``address`` has ``count`` live nodes (60 s at most)."""
    deadline = time.monotonic() + 60
    host, port = address.split(":")
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline or started[0].poll() is not None:
                raise RuntimeError("the test's Ray head did not start") from None
            time.sleep(0.5)
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        while sum(1 for node in ray.nodes() if node["Alive"]) < count:
            if time.monotonic() > deadline or any(p.poll() is not None for p in started):
                raise RuntimeError(f"the test's Ray cluster did not reach {count} nodes")
            time.sleep(0.5)
    finally:
        ray.shutdown()


@pytest.fixture
def ray_cluster() -> Iterator[str]:
    """A Ray cluster of this test's own on 127.0.0.1 (own temp dir): a head of 3 CPUs
    and 1 GPU, and a worker node of 1 CPU that joins it as a user's second machine
    would (``ray start --address``); both stopped by their PIDs.

    One per test: the cluster's processes are the test process's descendants, and a
    run kills its driver's descendants when it ends (:mod:`fedsim.simulation.lifecycle`).
    """
    port = _free_port()
    address = f"127.0.0.1:{port}"
    temp_dir = tempfile.mkdtemp(prefix="ray-t13-", dir="/tmp")  # short: Ray's socket paths
    started = [
        _ray_start(
            "--head",
            f"--port={port}",
            "--num-cpus=3",
            "--num-gpus=1",
            "--include-dashboard=false",
            f"--temp-dir={temp_dir}",
        )
    ]
    try:
        _wait_for_nodes(address, 1, started)
        started.append(_ray_start(f"--address={address}", "--num-cpus=1", "--num-gpus=0"))
        _wait_for_nodes(address, 2, started)
        yield address
    finally:
        for process in reversed(started):
            _stop_tree(process)
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.usefixtures("plugin_env")
def test_audited_run_on_a_separately_started_cluster(
    ray_cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The run is the example plugin's: its workers on the cluster load it too.
    monkeypatch.setenv(TEST_LOGICAL_GPUS_ENV, "1")  # the cluster's GPU is logical too
    scenario = _scenario(
        f"backend.address='{ray_cluster}'",
        "backend.num-gpus=0.25",
        "audit.num-gpus=0.5",
        *WITH_PLUGIN,
    )

    run_scenario(scenario, tmp_path / "cluster")

    # The head's 3 CPUs - 1 reserved for the audit = 2 actors (and 2 x 0.25 + 0.5 GPU
    # = 1); the worker node has no GPU, so no client actor there.
    _check_audited_run(tmp_path / "cluster", actors=2)
    where = json.loads((tmp_path / "cluster" / RESOURCES_FILE).read_text())["where"]
    assert ray_cluster in where
    audit = pd.read_csv(tmp_path / "cluster" / AUDIT_FILE)
    # The plugin's attack on the plugin's model: one example read back exactly.
    assert set(audit["attack"]) == {"tinylab-row-ratio"}
    assert set(audit["strategy"]) == {"tinylab-smooth"}
    assert (audit["psnr"] > 60).all()


class _CpusInUse:
    """Round callback: the cluster's CPUs that no one holds, at the end of every round."""

    def __init__(self) -> None:
        self.free: list[float] = []

    def on_round_end(self, record: object, arrays: object) -> None:
        self.free.append(ray.available_resources().get("CPU", 0.0))


@pytest.mark.slow
def test_a_hundred_thousand_clients_on_a_cluster_of_two_nodes(
    ray_cluster: str, tmp_path: Path
) -> None:
    # The shipped 100,000-client scenario, pointed at the cluster: no other change.
    scenario = load_scenario(
        REPO / "scenarios" / "scale-100k.toml",
        [f"backend.address='{ray_cluster}'", "federation.rounds=2"],
    )
    cpus = _CpusInUse()

    run_scenario(scenario, tmp_path / "run", Console(quiet=True), (cpus,))

    plan = json.loads((tmp_path / "run" / RESOURCES_FILE).read_text())
    assert len(plan["nodes"]) == 2 and plan["actors"] == 4  # 3 on the head, 1 on the worker
    # All 4 CPUs held by client actors: the head has 3, so one runs on the worker node.
    assert cpus.free == [0.0, 0.0]
    metrics = pd.read_csv(tmp_path / "run" / METRICS_FILE)
    clients = pd.read_csv(tmp_path / "run" / CLIENTS_FILE)
    assert list(metrics["clients-trained"]) == [100, 100]
    assert clients.groupby(["round", "phase"]).size().tolist() == [100, 100, 100, 100]
    assert clients["partition-id"].between(0, 99_999).all()
    assert clients["partition-id"].max() > 90_000  # sampled from the whole population
    assert metrics["test-acc"].notna().all()
