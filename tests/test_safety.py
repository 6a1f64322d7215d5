"""A run folder is data, never a key to the machine; damaged checkpoints are refused whole.

Each test plants what a crafted or damaged run folder could hold (links, ``../``
names, truncated or replaced files) and checks that ``--resume`` refuses it with
one line and touches nothing outside the folder.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import tomli_w
import torch
from flwr.app import ArrayRecord
from rich.console import Console

from fedsim.cli import main as cli_main
from fedsim.core.config import OutputConfig, ScenarioError
from fedsim.core.protocol import RoundRecord
from fedsim.core.scenario_file import scenario_from_dict, scenario_to_dict
from fedsim.outputs.results import RunRecorder
from fedsim.outputs.run_folder import (
    CHECKPOINT_DIR,
    CLIENT_STATE_DIR,
    LOCK_FILE,
    check_out_folder,
    new_run_dir,
    unlock_run_dir,
    write_scenario,
)
from fedsim.simulation import runner
from fedsim.simulation.checkpoint import (
    DELETED_FILE,
    MANIFEST_FILE,
    STATE_FILE,
    Checkpointer,
    commit,
    recover,
    sha256,
)
from fedsim.simulation.resume import open_resume
from fedsim.sweeps.runs import MARKER, is_finished

QUIET = Console(quiet=True)
SCENARIO: dict[str, Any] = {
    "name": "safe",
    "federation": {"num-clients": 2, "rounds": 4, "seed": 0},
    "data": {"dataset": "mnist-embedded", "samples-per-client": 20},
    "model": {"name": "lenet5-split"},
}


def private_bytes(partition: int) -> bytes:
    """A client's private-state file as fedsim writes it (resuming loads every one)."""
    buffer = io.BytesIO()
    torch.save({"round": 2, "arrays": {"w": torch.full((2,), float(partition))}}, buffer)
    return buffer.getvalue()


def checkpointed(folder: Path, files: dict[str, bytes] | None = None) -> Path:
    """A run folder with a round-2 checkpoint holding client ``files`` (no simulation)."""
    scenario = scenario_from_dict(SCENARIO)
    run_dir = new_run_dir(scenario.output, scenario.name, folder)
    write_scenario(scenario, run_dir)
    for name, content in (files or {"partition-0.pt": private_bytes(0)}).items():
        (run_dir / CLIENT_STATE_DIR).mkdir(exist_ok=True)
        (run_dir / CLIENT_STATE_DIR / name).write_bytes(content)
    recorder = RunRecorder(run_dir, 4, QUIET)
    record = RoundRecord(round=2, seconds=1.0, sampled=2, replies=2, failures=0)
    recorder.on_round_end(record, ArrayRecord())
    stateless = cast(Any, SimpleNamespace(state_for_checkpoint=dict))
    arrays = ArrayRecord({"w": torch.arange(4.0)})
    Checkpointer(run_dir, stateless, scenario_to_dict(scenario), [recorder]).on_round_end(
        record, arrays
    )
    return run_dir


def snapshot(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder beside the run folder, holding a file that must survive untouched."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "precious.txt").write_bytes(b"do not touch")
    return folder


def refused(run_dir: Path, fragment: str) -> None:
    with pytest.raises(ScenarioError) as err:
        open_resume(run_dir)
    assert fragment in str(err.value)
    assert "\n" not in str(err.value)


def test_deleted_json_with_parent_paths_deletes_nothing_outside(
    tmp_path: Path, outside: Path
) -> None:
    run_dir = checkpointed(tmp_path / "run")
    pending = run_dir / CHECKPOINT_DIR / "commit-3"
    pending.mkdir()
    target = Path("..", "..", "..", "outside", "precious.txt").as_posix()
    (pending / DELETED_FILE).write_text(json.dumps([target, str(outside / "precious.txt")]))

    refused(run_dir, "outside itself")

    assert snapshot(outside) == {"precious.txt": b"do not touch"}


@pytest.mark.parametrize("where", [CLIENT_STATE_DIR, f"{CHECKPOINT_DIR}/{CLIENT_STATE_DIR}"])
def test_a_link_in_the_run_folder_is_refused_and_never_followed(
    tmp_path: Path, outside: Path, where: str
) -> None:
    run_dir = checkpointed(tmp_path / "run")
    (run_dir / where / "partition-0.pt").unlink()
    (run_dir / where / "partition-0.pt").symlink_to(outside / "precious.txt")
    before = snapshot(run_dir)

    refused(run_dir, "symbolic link")

    assert snapshot(outside) == {"precious.txt": b"do not touch"}
    assert snapshot(run_dir) == before  # nothing pulled in from outside


def test_a_linked_client_state_folder_is_refused(tmp_path: Path, outside: Path) -> None:
    run_dir = checkpointed(tmp_path / "run")
    for path in (run_dir / CLIENT_STATE_DIR).iterdir():
        path.unlink()
    (run_dir / CLIENT_STATE_DIR).rmdir()
    (run_dir / CLIENT_STATE_DIR).symlink_to(outside, target_is_directory=True)

    refused(run_dir, "symbolic link")

    assert snapshot(outside) == {"precious.txt": b"do not touch"}


def test_a_forced_run_into_an_old_folder_removes_links_not_their_targets(
    tmp_path: Path, outside: Path
) -> None:
    run_dir = checkpointed(tmp_path / "run")
    for path in (run_dir / CLIENT_STATE_DIR).iterdir():
        path.unlink()
    (run_dir / CLIENT_STATE_DIR).rmdir()
    (run_dir / CLIENT_STATE_DIR).symlink_to(outside, target_is_directory=True)

    new_run_dir(OutputConfig(), "safety", run_dir, force=True)

    assert not (run_dir / CLIENT_STATE_DIR).exists()
    assert snapshot(outside) == {"precious.txt": b"do not touch"}


def test_commit_copies_no_link_into_the_checkpoint(tmp_path: Path, outside: Path) -> None:
    live = tmp_path / CLIENT_STATE_DIR
    live.mkdir()
    (live / "partition-0.pt").write_bytes(b"mine")
    (live / "partition-1.pt").symlink_to(outside / "precious.txt")

    commit(tmp_path, 1, {"round": 1})

    mirror = tmp_path / CHECKPOINT_DIR / CLIENT_STATE_DIR
    assert sorted(p.name for p in mirror.iterdir()) == ["partition-0.pt"]


@pytest.mark.parametrize("name", ["../escape", "..", "a/b", "", "tab\there"])
def test_scenario_and_spec_names_must_be_plain_file_names(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ScenarioError, match="plain file name"):
        scenario_from_dict({**SCENARIO, "name": name})
    (tmp_path / "base.toml").write_text(tomli_w.dumps(SCENARIO))
    spec = tmp_path / "spec.toml"
    spec.write_text(f'name = {json.dumps(name)}\nbase = "base.toml"\n')
    assert cli_main(["compare", str(spec), "--dry-run"]) == 2
    assert "name = " in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base.toml", "spec.toml"]


def _manifest(run_dir: Path) -> dict[str, Any]:
    return cast(dict[str, Any], json.loads((run_dir / CHECKPOINT_DIR / MANIFEST_FILE).read_text()))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _replace_arrays(path: Path) -> None:
    state = torch.load(path, weights_only=True)
    state["arrays"] = {"w": torch.zeros(4)}
    torch.save(state, path)


@pytest.mark.parametrize(
    ("damage", "fragment"),
    [
        (lambda d: _truncate(d / CHECKPOINT_DIR / STATE_FILE), "does not match its checksum"),
        (lambda d: _replace_arrays(d / CHECKPOINT_DIR / STATE_FILE), "does not match its checksum"),
        (lambda d: (d / CHECKPOINT_DIR / MANIFEST_FILE).unlink(), "manifest.json is missing"),
        (lambda d: (d / CHECKPOINT_DIR / MANIFEST_FILE).write_bytes(b"\xff"), "is damaged"),
        (
            lambda d: (d / CHECKPOINT_DIR / CLIENT_STATE_DIR / "partition-0.pt").unlink(),
            "partition-0.pt is missing",
        ),
        (
            lambda d: (d / CHECKPOINT_DIR / CLIENT_STATE_DIR / "partition-0.pt").write_bytes(b"?"),
            "partition-0.pt does not match its checksum",
        ),
    ],
    ids=["truncated", "arrays-replaced", "no-manifest", "bad-manifest", "client-gone", "garbage"],
)
def test_damaged_checkpoints_are_refused_before_anything_loads(
    tmp_path: Path, damage: Any, fragment: str
) -> None:
    run_dir = checkpointed(tmp_path / "run")
    damage(run_dir)

    refused(run_dir, fragment)


def test_a_checkpoint_missing_keys_is_refused(tmp_path: Path) -> None:
    run_dir = checkpointed(tmp_path / "run")
    path = run_dir / CHECKPOINT_DIR / STATE_FILE
    state = torch.load(path, weights_only=True)
    del state["rng"]
    torch.save(state, path)
    manifest = _manifest(run_dir)
    manifest["state"] = sha256(path)
    (run_dir / CHECKPOINT_DIR / MANIFEST_FILE).write_text(json.dumps(manifest))

    refused(run_dir, "lacks rng")


def test_deleted_or_garbage_live_client_state_is_restored_from_the_checkpoint(
    tmp_path: Path,
) -> None:
    files = {f"partition-{p}.pt": private_bytes(p) for p in (0, 1)}
    run_dir = checkpointed(tmp_path / "run", files)
    live = run_dir / CLIENT_STATE_DIR
    (live / "partition-0.pt").unlink()
    (live / "partition-1.pt").write_bytes(bytes(len(files["partition-1.pt"])))  # same size

    open_resume(run_dir)

    assert {p.name: p.read_bytes() for p in live.iterdir()} == files


def test_recovery_of_a_clean_folder_changes_nothing(tmp_path: Path) -> None:
    run_dir = checkpointed(tmp_path / "run")
    before = snapshot(run_dir)
    recover(run_dir)
    assert snapshot(run_dir) == before


def test_two_processes_cannot_run_in_one_folder(tmp_path: Path) -> None:
    run_dir = checkpointed(tmp_path / "run")
    unlock_run_dir(run_dir)  # this process's run there is over
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys, time; f = open(sys.argv[1], 'a'); "
            "fcntl.flock(f, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(60)",
            str(run_dir / LOCK_FILE),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
        with pytest.raises(ScenarioError, match="in use by another fedsim process"):
            open_resume(run_dir)
        with pytest.raises(ScenarioError, match="in use by another fedsim process"):
            new_run_dir(OutputConfig(), "safety", run_dir)
        with pytest.raises(ScenarioError, match="in use by another fedsim process"):
            check_out_folder(run_dir, force=True)  # what a run checks before Ray starts
    finally:
        holder.kill()
        holder.wait()
    open_resume(run_dir)  # the lock died with its holder


def test_an_occupied_out_folder_is_refused_before_ray_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    finished = tmp_path / "finished"
    finished.mkdir()
    (finished / "metrics.csv").write_text("round\n1\n")

    def no_ray(*args: object) -> None:
        raise AssertionError("Ray started before the --out folder was checked")

    monkeypatch.setattr(runner, "start_ray", no_ray)
    with pytest.raises(ScenarioError, match=r"--out.*this one holds files"):
        runner.run_scenario(scenario_from_dict(SCENARIO), finished, console=QUIET)
    assert sorted(p.name for p in finished.iterdir()) == ["metrics.csv"]  # nothing created


@pytest.mark.parametrize("marker", [b"{half", b"[1, 2]", b"\xff\xfe"])
def test_a_damaged_sweep_marker_means_the_run_is_done_again(tmp_path: Path, marker: bytes) -> None:
    config = cast(Any, SimpleNamespace(scenario=scenario_from_dict(SCENARIO)))
    (tmp_path / MARKER).write_bytes(marker)

    assert not is_finished(config, tmp_path)
