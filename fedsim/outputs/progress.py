"""Progress for people: start-up phases and running attacks, as plain lines.

Lines (not a live display) because they read the same on a terminal and in a
CI log; rich drops the colours when the output is not a terminal. Rounds print
their own line with an ETA (:class:`fedsim.outputs.results.RunRecorder`).

Attacks report through :attr:`fedsim.attacks.base.Attack.progress` about 20
times per optimisation; :class:`AttackProgressLines` prints a line at each
quarter. Audit attacks run in Ray tasks: they post to a
:class:`~fedsim.audit.progress_board.ProgressBoard` actor, which the driver drains while it
waits for results.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rich.console import Console


@dataclass
class AttackProgressLines:
    """A progress callback printing ``label: step s/n, best objective b`` at each quarter."""

    console: Console
    label: str
    _quarters: int = field(default=0, init=False)

    def __call__(self, step: int, total: int, best: float) -> None:
        quarters = 4 * step // max(1, total)
        if quarters > self._quarters and step < total:
            self._quarters = quarters
            self.console.print(
                f"  {self.label}: step {step}/{total}, best objective {best:.3g}", highlight=False
            )


@dataclass
class Phases:
    """Start-up phase lines with the seconds since the run began."""

    console: Console
    started: float = field(default_factory=time.monotonic)

    def __call__(self, text: str) -> None:
        elapsed = time.monotonic() - self.started
        self.console.print(f"[dim]{elapsed:6.1f}s[/dim]  {text}", highlight=False)
