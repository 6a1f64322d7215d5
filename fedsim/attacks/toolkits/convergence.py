"""When an optimisation attack has converged, diverged, or simply ran out of steps.

One stated rule for every optimisation attack, applied per row (a restart of
one victim):

- **stalled** at step ``t``: the lowest objective so far improved by at most
  ``rtol`` (relative) over the last ``window`` steps,
  ``best[t - window] - best[t] <= rtol * |best[t - window]|``;
- **converged**: stalled when the attack stopped (early, or at its budget),
  after its best objective fell below ``failure_ratio`` times its starting
  one; a row that was still improving at its last step has *not* converged,
  and a result built on it is a lower bound of what the attack could reach;
- **stalled at a failure**: stalled, but its objective fell only a little
  from its start (an L-BFGS whose steps stopped making progress: seen on a
  trained model, SAPAG from 14,236 to 10,164 in one step, then not moving,
  at 3.5 dB). Not converged: its result is a lower bound too;
- **diverged**: its objective became non-finite (the optimisers stop such a
  row, see :mod:`fedsim.attacks.toolkits.optim`) or ended above where it started.

With ``early_stop`` a row that has stalled stops and the compute goes to the
rest (for a step-decayed schedule, whose rows share one learning rate, a
stall of every row first moves them all on to the next, smaller rate; rows
stop one by one only in the last phase). A diverged restart is never kept
while another restart of its victim has not diverged; when all have, the
lowest finite one is kept, not converged.
"""

from __future__ import annotations

import torch

from fedsim.core.params.optimising import ConvergenceRule

StopReason = str
"""``converged``, ``stalled-at-failure``, ``still-improving`` or ``diverged``."""


class ConvergenceTracker:
    """Follows the objective of ``rows`` independent problems step by step.

    Call :meth:`update` with each step's objective (``(rows,)``, infinite for
    a diverged row); :meth:`stalled` says which rows have stalled since
    :meth:`restart_window` (a new learning-rate phase) or the start.
    """

    def __init__(
        self,
        rows: int,
        window: int,
        rtol: float,
        device: torch.device,
        failure_ratio: float = ConvergenceRule.failure_ratio,
    ) -> None:
        self.window, self.rtol, self.failure_ratio = window, rtol, failure_ratio
        self.best: list[torch.Tensor] = []  # best objective so far, per step
        self.first = torch.full((rows,), float("nan"), device=device)
        self.phase_start = 0

    @property
    def steps(self) -> int:
        """Steps recorded so far."""
        return len(self.best)

    def update(self, objective: torch.Tensor) -> None:
        """Record one step's objective per row."""
        value = objective.detach().to(self.first.dtype)
        if not self.best:
            self.first = value.clone()
            self.best.append(value.clone())
        else:
            self.best.append(torch.minimum(self.best[-1], value))

    def restart_window(self) -> None:
        """A new phase (a smaller learning rate) starts now: stalls count from here."""
        self.phase_start = self.steps

    def stalled(self) -> torch.Tensor:
        """Rows whose best objective improved by at most ``rtol`` over the last window."""
        if self.steps - self.phase_start <= self.window:
            return torch.zeros_like(self.first, dtype=torch.bool)
        old, new = self.best[-1 - self.window], self.best[-1]
        finite = torch.isfinite(old) & torch.isfinite(new)
        return finite & ((old - new) <= self.rtol * old.abs())

    def diverged(self, final: torch.Tensor) -> torch.Tensor:
        """Rows whose final objective is not finite or lies above their starting one."""
        final = final.to(self.first.dtype)
        return ~torch.isfinite(final) | (final > self.first)

    def failed(self) -> torch.Tensor:
        """Rows whose best objective stayed above ``failure_ratio`` of their starting one."""
        if not self.best:
            return torch.zeros_like(self.first, dtype=torch.bool)
        return self.best[-1] > self.failure_ratio * self.first.abs()

    def outcome(self, diverged: torch.Tensor) -> tuple[torch.Tensor, list[StopReason]]:
        """Which rows converged, and each row's stop reason (``diverged``: the rows that did)."""
        stalled, failed = self.stalled(), self.failed()
        converged = stalled & ~failed & ~diverged
        reasons = [
            "diverged"
            if bool(d)
            else "still-improving"
            if not bool(s)
            else "stalled-at-failure"
            if bool(f)
            else "converged"
            for d, s, f in zip(diverged.tolist(), stalled.tolist(), failed.tolist(), strict=True)
        ]
        return converged, reasons
