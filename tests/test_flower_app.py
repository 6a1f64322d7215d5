"""fedsim as a Flower app: ``flwr run`` against a real SuperLink with two SuperNodes.

The test starts ``flower-superlink`` and two ``flower-supernode`` processes on
127.0.0.1 (insecure, runtime dependency installation off, each in its own
process group torn down by its PID), submits the repository as a Flower app
with ``flwr run``, and compares the run directory the ServerApp wrote with
``fedsim run``'s for the same scenario and seed on the simulation engine.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from fedsim.app import run_dir_of, scenario_from_run_config
from fedsim.core.config import ScenarioError
from fedsim.core.scenario_file import load_scenario
from fedsim.scenarios import scenario_path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

# The audit-fedavg setting (FedSGD, LeNet-Zhu, DLG on one victim a round), small.
SCENARIO = """
name = "app-audit"
[federation]
num-clients = 2
clients-per-round = 2
rounds = 2
seed = 3
[data]
dataset = "mnist-embedded"
samples-per-client = 40
[model]
name = "lenet-zhu"
init = "uniform"
[client]
local-steps = 1
batch-size = 1
optimizer = "sgd"
lr = 0.01
[audit]
enabled = true
attacks = [{ name = "dlg", steps = 5, restarts = 1 }]
victims = 1
"""

# The example plugin's federation (its model, dataset, strategy and attack), small, with DLG
# beside its attack: the ServerApp, the ClientApps and the audit's workers all load the plugin.
TINYLAB = REPO / "examples" / "plugin" / "tinylab.toml"
TINYLAB_SMALL = [
    "federation.num-clients=2",
    "audit.attacks=[{name='dlg',steps=5,restarts=1},{name='tinylab-row-ratio'}]",
]


def test_run_config_names_a_shipped_scenario_or_a_file(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(SCENARIO)

    shipped = scenario_from_run_config({"scenario": "quickstart", "set": "federation.rounds=7"})
    own = scenario_from_run_config(
        {"scenario": str(path), "set": "client.lr=0.5; federation.seed=1"}
    )

    assert scenario_path("quickstart").name == "quickstart.toml"
    assert (shipped.name, shipped.federation.rounds) == ("quickstart", 7)
    assert (own.name, own.client.lr) == ("app-audit", 0.5)
    assert run_dir_of(own.output, own.name, {"out": ""}, 42) == Path("runs") / "app-audit-run42"
    assert run_dir_of(own.output, own.name, {"out": str(tmp_path)}, 42) == tmp_path
    with pytest.raises(ScenarioError, match="scenario"):
        scenario_from_run_config({"scenario": ""})
    with pytest.raises(ScenarioError, match="no such file"):
        scenario_from_run_config({"scenario": "no-such-scenario"})


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f}s")


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process's own group (it and the processes it spawned), then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(wait)
            # Children (SuperExec, ServerApp/ClientApp processes, Ray) may outlive the leader.
            os.killpg(process.pid, signal.SIGKILL)
            return
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            return


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[tuple[dict[str, str], str]]:
    """A SuperLink and two SuperNodes on 127.0.0.1; yields ``flwr``'s env and connection name."""
    link_port = _free_port()
    home = tmp_path / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "fedsim-test"\n\n[superlink.fedsim-test]\n'
        f'address = "127.0.0.1:{link_port}"\ninsecure = true\n'
    )
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "FLWR_HOME": str(home),
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "RAY_DEDUP_LOGS": "0",
    }
    logs = tmp_path / "logs"
    logs.mkdir()
    commands = [
        [
            "flower-superlink",
            "--insecure",
            "--host=127.0.0.1",
            f"--port={link_port}",
            "--disable-runtime-dependency-installation",
        ]
    ] + [
        [
            "flower-supernode",
            "--insecure",
            f"--superlink=127.0.0.1:{link_port}",
            f"--port={_free_port()}",
            "--node-config",
            f"partition-id={partition} num-partitions=2",
        ]
        for partition in (0, 1)
    ]
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for i, command in enumerate(commands):
            log = (logs / f"{command[0]}-{i}.log").open("wb")
            processes.append(
                subprocess.Popen(
                    command,
                    cwd=tmp_path,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group, torn down by its PID
                )
            )
            if i == 0:
                _wait_for_port(link_port, timeout=60)
        yield env, "fedsim-test"
    finally:
        for process in reversed(processes):
            _stop(process)


@pytest.mark.slow
@pytest.mark.usefixtures("plugin_env")
def test_flwr_run_on_superlink_gives_the_simulation_engines_metrics(
    tmp_path: Path, deployment: tuple[dict[str, str], str]
) -> None:
    from fedsim.simulation.runner import run_scenario

    env, connection = deployment
    # `fedsim run`'s engine, then `flwr run`, on the example plugin's scenario.
    scenario = load_scenario(TINYLAB, TINYLAB_SMALL)
    simulated = run_scenario(scenario, tmp_path / "simulation").run_dir
    deployed = tmp_path / "deployment"

    submitted = subprocess.run(
        [
            str(BIN / "flwr"),
            "run",
            str(REPO),
            connection,
            "--stream",
            "--run-config",
            f'scenario="{TINYLAB}" out="{deployed}" set="{";".join(TINYLAB_SMALL)}"',
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )

    assert submitted.returncode == 0, submitted.stdout[-3000:] + submitted.stderr[-3000:]
    assert (deployed / "model.pt").is_file(), submitted.stdout[-3000:]
    # The report is written from the app bundle's copy of fedsim (templates included).
    assert (deployed / "report.html").is_file(), submitted.stdout[-3000:]
    ours, theirs = (pd.read_csv(d / "metrics.csv") for d in (deployed, simulated))
    assert list(ours["round"]) == [1, 2]
    compared = [
        "train-loss",
        "test-acc",
        "test-loss",
        "client-eval-acc",
        "client-eval-loss",
        "clients-trained",
        "audit-psnr",
        "audit-label-acc",
    ]
    pd.testing.assert_frame_equal(ours[compared], theirs[compared], rtol=1e-5)
    audits = [pd.read_csv(d / "audit.csv") for d in (deployed, simulated)]
    assert list(audits[0]["client"]) == list(audits[1]["client"])
    # Both attacks each round, the plugin's reading one example back exactly, on either engine.
    ours_audit, theirs_audit = (
        a.sort_values(["round", "client", "attack"]).reset_index(drop=True) for a in audits
    )
    assert list(ours_audit["attack"]) == 2 * ["dlg", "tinylab-row-ratio"]
    assert set(ours_audit["strategy"]) == {"tinylab-smooth"}
    pd.testing.assert_series_equal(ours_audit["psnr"], theirs_audit["psnr"], rtol=1e-5)
    assert (ours_audit[ours_audit["attack"] == "tinylab-row-ratio"]["psnr"] > 60).all()
    clients = [
        pd.read_csv(d / "clients.csv").sort_values(["round", "phase", "partition-id"])
        for d in (deployed, simulated)
    ]
    assert list(clients[0]["partition-id"]) == list(clients[1]["partition-id"])
