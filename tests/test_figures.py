"""The audit's tiles: torchvision's ``save_image`` pixel for pixel, without its import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.utils import save_image

from fedsim.outputs.figures import save_tiles


@pytest.mark.parametrize(
    ("shape", "per_row"), [((5, 1, 28, 28), 8), ((3, 3, 32, 32), 3), ((10, 1, 8, 8), 4)]
)
def test_tiles_match_torchvisions_save_image(
    shape: tuple[int, ...], per_row: int, tmp_path: Path
) -> None:
    images = torch.rand(shape, generator=torch.Generator().manual_seed(sum(shape)))
    save_image(images, tmp_path / "theirs.png", nrow=per_row)
    save_tiles(images, tmp_path / "ours.png", per_row=per_row)

    theirs, ours = (
        np.asarray(Image.open(tmp_path / f"{n}.png").convert("RGB")) for n in ("theirs", "ours")
    )
    np.testing.assert_array_equal(ours, theirs)


def test_the_audit_and_the_simulation_import_without_torchvision() -> None:
    # torchvision's import costs 3 s in every Ray worker and command that imports the audit.
    code = "import sys, fedsim.simulation.runner, fedsim.audit.tasks\n"
    code += "print('torchvision' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
