"""report.html in a real browser: headless Chromium loads the pages of a real run and of a
sweep; every section is in the DOM, every image decoded, and a screenshot is saved."""

from __future__ import annotations

from pathlib import Path

import pytest
from browser import Page, chromium_page, chromium_path
from rich.console import Console
from test_compare import FakeRuns, _configs

from fedsim.cli import main
from fedsim.core.scenario_file import load_scenario
from fedsim.outputs.run_folder import AUDIT_IMAGES, REPORT_FILE
from fedsim.simulation.resources import RESOURCES_FILE
from fedsim.simulation.runner import run_scenario
from fedsim.sweeps.runs import run_sweep

REPO = Path(__file__).resolve().parents[1]
RUN_SECTIONS = [
    "overview",
    "curves",
    "audit-leaks",
    "audit-verdict",
    "audit-curves",
    "audit-table",
    "reconstructions",
    "plan",
]
RUN_SECTIONS += ["scenario"]
SWEEP_SECTIONS = ["privacy-utility", "table", "runs"]
PAGE_STATE = """({
  sections: [...document.querySelectorAll('section')].map(s => s.id),
  images: [...document.images].map(i => [i.alt, i.naturalWidth, i.naturalHeight]),
  headings: [...document.querySelectorAll('h3')].map(h => h.textContent),
  cells: [...document.querySelectorAll('td')].map(td => td.textContent),
})"""

pytestmark = pytest.mark.skipif(chromium_path() is None, reason="make test installs chromium")


def _state(page: Page, report: Path, screenshot: Path) -> dict[str, list[object]]:
    page.open(report.resolve().as_uri())
    page.screenshot(screenshot)
    assert screenshot.read_bytes()[:4] == b"\x89PNG"
    return dict(page.evaluate(PAGE_STATE))


@pytest.mark.slow
def test_reports_of_a_real_run_and_a_sweep_render_in_chromium(tmp_path: Path) -> None:
    # A real, tiny audited run (2 rounds, one DLG victim a round, a short budget).
    scenario = load_scenario(
        REPO / "scenarios" / "audit-fedavg.toml",
        ["federation.rounds=2", "audit.attacks=[{name='dlg', steps=10, restarts=1}]"],
    )
    run_dir = tmp_path / "run"
    run_scenario(scenario, run_dir, console=Console(quiet=True))
    assert (run_dir / REPORT_FILE).is_file()  # written by the run itself
    assert (run_dir / RESOURCES_FILE).is_file()  # the resource plan, shown in the report
    (run_dir / REPORT_FILE).unlink()
    assert main(["report", str(run_dir)]) == 0
    spec, configs = _configs(tmp_path)
    run_sweep(spec, configs, tmp_path / "sweep", Console(quiet=True), FakeRuns())

    with chromium_page(tmp_path / "profile") as page:
        run = _state(page, run_dir / REPORT_FILE, tmp_path / "run-report.png")
        sweep = _state(page, tmp_path / "sweep" / REPORT_FILE, tmp_path / "sweep-report.png")

    assert run["sections"] == RUN_SECTIONS
    # curves; what the updates leak: the ROC curves, the label histograms, the representatives'
    # table per audited round (one class, one tile: a batch of one image); the verdict, audit
    # curves, then per audited round the truth and DLG's tile in the reconstruction table
    alts = [alt for alt, _, _ in run["images"]]
    assert alts[:3] == [
        "accuracy and loss per round",
        "membership ROC curves",
        "estimated against true label histograms",
    ]
    assert [a.split("-client-")[0] for a in alts[3:5]] == ["round-001", "round-002"]
    assert alts[5:7] == ["audit verdict per round", "audit PSNR, SSIM and label accuracy per round"]
    assert alts[7:] == ["truth", "reconstruction"] * 2
    assert all(width > 0 and height > 0 for _, width, height in run["images"])
    assert run["headings"][0] == "Class representatives"
    assert run["headings"][-3:] == ["Round 1", "Round 2", RESOURCES_FILE]
    # per round: DLG's labelled grid and its tile, the truth, the representative's tile
    assert len(list((run_dir / AUDIT_IMAGES).glob("*.png"))) == 2 * 4
    assert sweep["sections"] == SWEEP_SECTIONS
    assert [alt for alt, width, _ in sweep["images"] if width > 0] == [
        "final accuracy against audit PSNR"
    ]
    assert "runs/fedavg/seed-0/report.html" in sweep["cells"]
