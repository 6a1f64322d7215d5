"""Optimisers that run many independent problems at once.

Restarts of an attack, and attacks on several victims, are independent
minimisation problems of the same shape. Stacking them as the rows of one
tensor ``z`` of shape ``(P, D)`` lets one batched objective evaluation
(``torch.func.vmap``) serve them all, provided the optimiser treats every row
as its own problem. Both optimisers here do:

- :class:`BatchedLBFGS` is ``torch.optim.LBFGS`` without line search (its
  control flow, tolerances and first-step scaling, step for step), with one
  history per row. The two-loop recursion is replaced by the compact
  representation of Byrd, Nocedal and Schnabel (1994, Thm 2.2), which gives
  the same direction with a handful of batched matrix products instead of
  ``4 * history`` small vector operations.
- :class:`BatchedAdamW` wraps ``torch.optim.AdamW``, which is element-wise and
  therefore already row-independent; optionally on the gradient's sign with a
  step-decayed learning rate (Inverting Gradients' optimiser).

A row whose objective or gradient is not finite has diverged: it stops, is
put back to its last finite point, and reports an infinite objective, so a
restart that blew up is never the one an attack keeps. A row the caller
marks ``stopped`` (it has converged) is no longer evaluated or moved, so
the rows still improving get the compute.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

import torch

Objective = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""``(z_rows, row_indices) -> (values (n,), gradients (n, D))`` for the given rows."""


class BatchedOptimizer(ABC):
    """Minimises ``P`` independent objectives stored as the rows of ``z``.

    Parameters
    ----------
    z:
        Initial points, ``(P, D)``; the optimiser owns and updates a copy.
    bounds:
        ``(lower, upper)``, each ``(D,)``: project every update into the box.
    """

    def __init__(
        self, z: torch.Tensor, bounds: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> None:
        self.bounds = bounds
        self.z = z.detach().clone()
        rows = z.shape[0]
        self.loss = torch.full((rows,), float("inf"), dtype=z.dtype, device=z.device)
        self.grad = torch.zeros_like(self.z)
        self.diverged = torch.zeros(rows, dtype=torch.bool, device=z.device)
        self.stopped = torch.zeros(rows, dtype=torch.bool, device=z.device)
        self.evaluations = torch.zeros(rows, dtype=torch.long, device=z.device)
        self._last_finite = self.z.clone()

    def evaluate(self, objective: Objective, rows: torch.Tensor) -> torch.Tensor:
        """Evaluate the rows in mask ``rows``; return the mask of those still finite."""
        idx = rows.nonzero().squeeze(1)
        if idx.numel() == 0:
            return rows
        value, grad = objective(self.z[idx], idx)
        self.evaluations[idx] += 1
        finite = torch.isfinite(value) & torch.isfinite(grad).all(dim=1)
        good, bad = idx[finite], idx[~finite]
        self.loss[good], self.grad[good] = value[finite], grad[finite]
        self._last_finite[good] = self.z[good]
        if bad.numel():
            self.diverged[bad] = True
            self.loss[bad] = float("inf")
            self.z[bad] = self._last_finite[bad]
        return rows & ~self.diverged

    def project(self, lower: torch.Tensor, upper: torch.Tensor) -> None:
        """Clamp every row into ``[lower, upper]`` (both ``(D,)``)."""
        torch.maximum(self.z, lower, out=self.z)
        torch.minimum(self.z, upper, out=self.z)

    @abstractmethod
    def step(self, objective: Objective) -> torch.Tensor:
        """One optimiser step for every live row; the objective at its start, ``(P,)``."""

    @property
    def active(self) -> torch.Tensor:
        """Rows still optimised: neither diverged nor stopped."""
        return ~self.diverged & ~self.stopped

    @property
    def last_phase(self) -> bool:
        """Whether the learning rate has no further phase to drop to."""
        return True

    def next_phase(self) -> bool:
        """Move on to the next learning-rate phase now; ``False`` when there is none."""
        return False


class BatchedLBFGS(BatchedOptimizer):
    """``torch.optim.LBFGS`` (no line search) applied to each row independently.

    Parameters mirror ``torch.optim.LBFGS``: ``lr``, ``max_iter`` (inner
    iterations per :meth:`step`), ``max_eval`` (default ``max_iter * 5 // 4``),
    ``tolerance_grad``, ``tolerance_change`` and ``history_size``. With
    ``bounds``, every inner iteration's move is projected into the box and
    the curvature pair records the move actually made (projected L-BFGS).
    """

    def __init__(
        self,
        z: torch.Tensor,
        bounds: tuple[torch.Tensor, torch.Tensor] | None = None,
        lr: float = 1.0,
        max_iter: int = 20,
        max_eval: int | None = None,
        tolerance_grad: float = 1e-7,
        tolerance_change: float = 1e-9,
        history_size: int = 100,
    ) -> None:
        super().__init__(z, bounds)
        self.lr, self.max_iter = lr, max_iter
        self.max_eval = max_eval if max_eval is not None else max_iter * 5 // 4
        self.tolerance_grad, self.tolerance_change = tolerance_grad, tolerance_change
        rows, dim = self.z.shape
        m, dev, dt = history_size, self.z.device, self.z.dtype
        self.iterations = torch.zeros(rows, dtype=torch.long, device=dev)
        self.direction = torch.zeros_like(self.z)
        self.step_size = torch.zeros(rows, dtype=dt, device=dev)
        self.move = torch.zeros_like(self.z)  # torch's ``d * t``: the last step taken
        self.prev_grad = torch.zeros_like(self.z)
        self.prev_loss = torch.zeros(rows, dtype=dt, device=dev)
        # Curvature pairs in a ring buffer per row (slot = append count mod m);
        # their inner products are kept in float64 for the small solves.
        self.s = torch.zeros(rows, m, dim, dtype=dt, device=dev)
        self.y = torch.zeros(rows, m, dim, dtype=dt, device=dev)
        self.sy = torch.zeros(rows, m, m, dtype=torch.float64, device=dev)
        self.yy = torch.zeros(rows, m, m, dtype=torch.float64, device=dev)
        self.appended = torch.zeros(rows, dtype=torch.long, device=dev)
        self.gamma = torch.ones(rows, dtype=torch.float64, device=dev)

    def _direction(self, rows: torch.Tensor) -> torch.Tensor:
        """Store the last move's curvature pair in ``rows``; return ``-H g`` for all rows.

        ``H`` is the L-BFGS inverse-Hessian estimate. The history is read twice
        per call (as often as the two-loop recursion reads it): once for every
        inner product with the new pair and the gradient, once to map the
        small system's solution back.
        """
        g = self.grad
        s_new = self.move
        y_new = g - self.prev_grad
        ys = (y_new * s_new).sum(dim=1)
        add = (rows & (ys > 1e-10)).nonzero().squeeze(1)
        m = self.s.shape[1]
        slot = self.appended[add] % m
        self.s[add, slot], self.y[add, slot] = s_new[add], y_new[add]
        # Right-hand sides stacked as (P, k, D) and viewed transposed: BLAS reads
        # them contiguously (four times faster than stacking along the last dim).
        with_s = torch.bmm(self.s, torch.stack([y_new, g], dim=1).mT).double()
        with_y = torch.bmm(self.y, torch.stack([s_new, y_new, g], dim=1).mT).double()
        self.sy[add, :, slot] = with_s[add, :, 0]  # s_i . y_new
        self.sy[add, slot, :] = with_y[add, :, 0]  # s_new . y_i
        self.yy[add, :, slot] = self.yy[add, slot, :] = with_y[add, :, 1]
        self.appended[add] += 1
        self.gamma[add] = ys[add].double() / (y_new[add] * y_new[add]).sum(dim=1).double()

        # The compact form needs the pairs in chronological order: gather the
        # small matrices and vectors (never the ring buffers) into it. Empty
        # slots come first and hold zeros.
        order = (self.appended[:, None] - m + torch.arange(m, device=g.device)) % m
        empty = torch.arange(m, device=g.device) < (m - self.appended.clamp(max=m))[:, None]
        square = (order[:, :, None].expand(-1, -1, m), order[:, None, :].expand(-1, m, -1))
        sy = self.sy.gather(1, square[0]).gather(2, square[1])
        yy = self.yy.gather(1, square[0]).gather(2, square[1])
        a, b = with_s[:, :, 1].gather(1, order), with_y[:, :, 2].gather(1, order)
        # R = triu(S^T Y); an empty slot gets a unit pivot and then contributes nothing.
        r = torch.triu(sy) + torch.diag_embed(empty.double())
        gamma = self.gamma[:, None]
        u = torch.linalg.solve_triangular(r, a[:, :, None], upper=True).squeeze(2)
        w = torch.diagonal(sy, dim1=1, dim2=2) * u + gamma * (yy @ u[:, :, None]).squeeze(2)
        w = w - gamma * b
        p = torch.linalg.solve_triangular(r.mT, w[:, :, None], upper=False).squeeze(2)
        # H g = gamma g + S p - gamma Y u, the products taken in storage order.
        p_store = torch.zeros_like(p).scatter(1, order, p).to(g.dtype)
        u_store = torch.zeros_like(u).scatter(1, order, gamma * u).to(g.dtype)
        hg = gamma.to(g.dtype) * g + torch.bmm(p_store[:, None, :], self.s).squeeze(1)
        return torch.bmm(u_store[:, None, :], self.y).squeeze(1) - hg

    def _move(self, rows: torch.Tensor) -> None:
        """Apply ``self.move`` to ``rows``, projected into the bounds; keep the move made."""
        before = self.z[rows]
        after = before + self.move[rows]
        if self.bounds is not None:
            after = torch.clamp(after, *self.bounds)
            self.move[rows] = after - before
        self.z[rows] = after

    def step(self, objective: Objective) -> torch.Tensor:
        """``max_iter`` L-BFGS iterations per live row (fewer where a tolerance stops it)."""
        live = self.evaluate(objective, self.active)
        start = self.loss.clone()
        running = live & ~(self.grad.abs().amax(dim=1) <= self.tolerance_grad)
        evals, n_iter = 1, 0
        while n_iter < self.max_iter and bool(running.any()):
            n_iter += 1
            self.iterations[running] += 1
            first = running & (self.iterations == 1)
            later = running & ~first
            if bool(later.any()):
                self.direction[later] = self._direction(later)[later]
            if bool(first.any()):
                self.direction[first] = -self.grad[first]
                self.appended[first] = 0
                self.gamma[first] = 1.0
            self.prev_grad[running] = self.grad[running]
            self.prev_loss[running] = self.loss[running]
            first_size = (1.0 / self.grad.abs().sum(dim=1)).clamp(max=1.0) * self.lr
            self.step_size[first] = first_size[first]
            self.step_size[later] = self.lr
            self.move[running] = (self.step_size[:, None] * self.direction)[running]
            gtd = (self.grad * self.direction).sum(dim=1)
            running &= ~(gtd > -self.tolerance_change)
            self._move(running)
            if n_iter == self.max_iter:
                break
            running = self.evaluate(objective, running)
            evals += 1
            if evals >= self.max_eval:
                break
            running &= ~(self.grad.abs().amax(dim=1) <= self.tolerance_grad)
            running &= ~(self.move.abs().amax(dim=1) <= self.tolerance_change)
            running &= ~((self.loss - self.prev_loss).abs() < self.tolerance_change)
        return start


class BatchedAdamW(BatchedOptimizer):
    """``torch.optim.AdamW`` on the rows of ``z`` (element-wise, so rows are independent).

    ``signed``: step on the sign of the gradient (Geiping et al. 2020: robust
    to the tiny, badly scaled gradients of cosine matching). ``milestones``:
    step counts at which the learning rate is multiplied by ``decay``
    (``torch.optim.lr_scheduler.MultiStepLR``).
    """

    def __init__(
        self,
        z: torch.Tensor,
        bounds: tuple[torch.Tensor, torch.Tensor] | None = None,
        lr: float = 1e-3,
        weight_decay: float = 0.01,
        signed: bool = False,
        milestones: Sequence[int] = (),
        decay: float = 0.1,
    ) -> None:
        super().__init__(z, bounds)
        # The gradient comes from the objective, so z itself needs no autograd:
        # AdamW only reads ``z.grad``.
        self.optimizer = torch.optim.AdamW([self.z], lr=lr, weight_decay=weight_decay)
        self.signed = signed
        # MultiStepLR's schedule, kept by hand so that a stall can end a phase early:
        # the rate drops at each milestone step, or at next_phase, whichever is first.
        self.milestones, self.decay = sorted(milestones), decay
        self.steps_done = 0

    @property
    def last_phase(self) -> bool:
        return not self.milestones

    def next_phase(self) -> bool:
        """Drop the rate to the next phase's now (the phase's milestone is then skipped)."""
        if not self.milestones:
            return False
        self.milestones.pop(0)
        for group in self.optimizer.param_groups:
            group["lr"] *= self.decay
        return True

    def step(self, objective: Objective) -> torch.Tensor:
        """One AdamW update per live row."""
        live = self.evaluate(objective, self.active)
        grad = self.grad.sign() if self.signed else self.grad
        self.z.grad = torch.where(live[:, None], grad, torch.zeros_like(grad))
        frozen = self.z[~live].clone()
        self.optimizer.step()
        self.steps_done += 1
        while self.milestones and self.milestones[0] <= self.steps_done:
            self.next_phase()
        self.z[~live] = frozen  # weight decay must not move a stopped row
        if self.bounds is not None:
            self.project(*self.bounds)
        return self.loss.clone()
