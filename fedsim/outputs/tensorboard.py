"""Optional TensorBoard logging (``[log] tensorboard = true``).

A round callback after the recorder: every numeric value of the round's
``metrics.csv`` row becomes a scalar at step = round, and each audit
reconstruction grid (``audit/*.png``, labelled) an image at its round, logged
once it exists (async audits finish later; :meth:`TensorBoardLog.close` logs
the rest). Written through ``torch.utils.tensorboard`` to ``RUN_DIR/tensorboard``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from flwr.app import ArrayRecord
from PIL import Image

from fedsim.core import protocol
from fedsim.core.protocol import RoundRecord
from fedsim.outputs.results import RunRecorder
from fedsim.outputs.run_folder import AUDIT_IMAGES, TENSORBOARD_DIR


class TensorBoardLog:
    """Writes the recorder's rows and the audit grids as TensorBoard events."""

    def __init__(self, recorder: RunRecorder) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.recorder = recorder
        self.run_dir = recorder.run_dir
        self.writer = SummaryWriter(log_dir=str(self.run_dir / TENSORBOARD_DIR))
        self._images_logged: set[str] = set()

    def on_round_end(self, record: RoundRecord, arrays: ArrayRecord) -> None:
        row = self.recorder.rows[-1]
        for key, value in row.items():
            if key != protocol.ROUND and isinstance(value, int | float) and math.isfinite(value):
                self.writer.add_scalar(key, value, global_step=record.round)
        self._log_new_images()
        self.writer.flush()

    def _log_new_images(self) -> None:
        folder = self.run_dir / AUDIT_IMAGES
        for path in sorted(folder.glob("round-*.png")) if folder.is_dir() else []:
            if path.name in self._images_logged:
                continue
            self._images_logged.add(path.name)
            server_round = int(path.name.split("-")[1])
            pixels: Any = np.asarray(Image.open(path).convert("RGB"))
            tag = f"audit/{path.stem.split('-', 2)[2]}"  # client-C-ATTACK
            self.writer.add_image(tag, pixels, global_step=server_round, dataformats="HWC")

    def close(self) -> None:
        """Log the audit grids that arrived after the last round; close the event file."""
        self._log_new_images()
        self.writer.close()
