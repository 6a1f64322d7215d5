"""The command line's face: --version, fedsim list KIND, descriptions, shipped scenarios."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedsim import fedsim_version
from fedsim.cli import main
from fedsim.commands.list import KINDS, _registries
from fedsim.scenarios import scenario_path, shipped_scenarios


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])

    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"fedsim {fedsim_version()}"


def test_every_registered_name_has_a_description() -> None:
    missing = [
        f"{kind}:{name}"
        for kind, registry in _registries().items()
        for name in registry.names()
        if not registry.describe(name)
    ]

    assert missing == []


@pytest.mark.parametrize("kind", ["strategies", "strategy", "partitioners", "scenarios"])
def test_list_one_kind(kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", kind]) == 0

    out = capsys.readouterr().out
    plural = next(k for k in KINDS if k.startswith(kind[:6]))
    first_cells = {line.split("│")[1].strip() for line in out.splitlines() if "│" in line}
    assert first_cells == {plural, ""}  # "" where a long description wraps
    if plural == "scenarios":
        assert "quickstart" in out


def test_list_refuses_an_unknown_kind(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "widgets"]) == 2

    err = capsys.readouterr().err.strip()
    assert err.startswith("fedsim: error: KIND = 'widgets'") and "strategies" in err


def test_shipped_scenarios_resolve_from_any_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)

    for given in ("quickstart", "quickstart.toml", "scenarios/quickstart.toml"):
        path = scenario_path(given)
        assert path.is_file() and path.name == "quickstart.toml", given
    assert {"quickstart", "audit-fedavg", "compare-table2"} <= set(shipped_scenarios())
    (tmp_path / "mine.toml").write_text("name = 'mine'\n")
    assert scenario_path("mine.toml") == Path("mine.toml")  # a real file wins


def test_list_leaks_shows_each_analysis_kind(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedsim.attacks.leakage import LEAKS

    monkeypatch.setenv("COLUMNS", "300")  # one line a row

    assert main(["list", "leaks"]) == 0

    rows = {
        line.split("│")[2].strip(): line.split("│")[5].strip()
        for line in capsys.readouterr().out.splitlines()
        if line.count("│") > 4
    }
    assert set(rows) == set(LEAKS.names())
    for name, described in rows.items():
        assert described.startswith(f"{LEAKS.get(name).kind}: "), name
    assert rows["loss-drop"].startswith("membership: ")
    assert rows["llg"].startswith("labels: ")
