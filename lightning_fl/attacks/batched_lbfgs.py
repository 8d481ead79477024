"""L-BFGS for R independent problems at once: the optimiser behind DLG's restarts run as one computation.

``torch.optim.LBFGS`` couples every tensor it is given into one flat vector, so stacking R restarts into one
tensor would share step sizes and curvature pairs between them. :class:`BatchedLBFGS` keeps one L-BFGS state per
row and does what R separate ``torch.optim.LBFGS(params, lr=lr, max_iter=1, history_size=...,
line_search_fn=None)`` instances do, one iteration (one objective evaluation) per :meth:`step`. The curvature
pairs of all rows live in one ring of ``history_size`` slots, so the two-loop recursion costs one set of
vector operations for all rows; the only difference from torch: a row that rejects a pair
(``y^T s <= 1e-10``) in a step where another row accepts one keeps a window one pair shorter.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["BatchedLBFGS"]


class BatchedLBFGS:
    """One L-BFGS iteration per call for R problems stacked along the first dimension.

    Implements the two-loop recursion of Nocedal & Wright (Numerical Optimization, Algorithm 7.4) with
    torch's conventions: fixed step ``lr`` without line search, a first step of ``min(1, 1/|g|_1) * lr``,
    curvature pairs kept only when ``y^T s > 1e-10``, and a row stops moving once its gradient's largest entry
    is at most ``tolerance_grad``. Calling :meth:`step` N times with row r's gradients gives row r the
    iterates of N ``step()`` calls of ``torch.optim.LBFGS(max_iter=1)`` (tested to 1e-8); the DLG code's 300
    ``step()`` calls with torch's default ``max_iter=20`` are about 6000 such iterations.
    The state lives on the device and in the dtype of the first gradient passed to :meth:`step`.

    Args:
        num_rows: number of independent problems R.
        lr: step size (DLG uses 1).
        history_size: curvature pairs kept per row.
        tolerance_grad: a row whose gradient's max-abs entry is at most this is converged.
        tolerance_change: a row does not move when the directional derivative exceeds ``-tolerance_change``.

    Example:
        >>> x = torch.tensor([[3.0, -1.0], [0.5, 2.0]])  # two rows, minimise |x|^2 / 2 row-wise
        >>> opt = BatchedLBFGS(num_rows=2)
        >>> for _ in range(5):
        ...     x = x + opt.step(x.clone())
        >>> x.abs().max() < 1e-6
        tensor(True)
    """

    def __init__(
        self,
        *,
        num_rows: int,
        lr: float = 1.0,
        history_size: int = 100,
        tolerance_grad: float = 1e-7,
        tolerance_change: float = 1e-9,
    ) -> None:
        if lr <= 0:
            raise ValueError(f"BatchedLBFGS(lr={lr}) must be > 0.")
        if history_size < 1:
            raise ValueError(f"BatchedLBFGS(history_size={history_size}) must be >= 1.")
        self.num_rows, self.lr, self.history_size = num_rows, lr, history_size
        self.tolerance_grad, self.tolerance_change = tolerance_grad, tolerance_change
        self.n_iter = torch.zeros(num_rows, dtype=torch.long)
        self.direction: Tensor | None = None
        self.step_size = torch.zeros(num_rows)
        self.prev_grad: Tensor | None = None
        self.h_diag = torch.ones(num_rows)
        # a ring of the last `history_size` accepted steps; a row that rejects a pair in a step where another row
        # accepts one gets rho = 0 there (a no-op pair), so its window is one pair shorter than torch's
        self._y: Tensor | None = None  # (H, R, P) curvature pairs y, s and their rho-scaled copies
        self._s: Tensor | None = None
        self._y_rho: Tensor | None = None
        self._s_rho: Tensor | None = None
        self._filled, self._next = 0, 0

    def _append_pairs(self, y: Tensor, s: Tensor, valid: Tensor) -> None:
        ys = (y * s).sum(1)
        if self._y is None:
            shape = (self.history_size, *y.shape)
            self._y, self._s = y.new_zeros(shape), y.new_zeros(shape)
            self._y_rho, self._s_rho = y.new_zeros(shape), y.new_zeros(shape)
        rho = torch.where(valid, 1.0 / torch.where(valid, ys, 1.0), 0.0)[:, None]
        slot = self._next
        self._y[slot], self._s[slot] = y, s
        self._y_rho[slot], self._s_rho[slot] = y * rho, s * rho
        self._next = (slot + 1) % self.history_size
        self._filled = min(self._filled + 1, self.history_size)
        self.h_diag = torch.where(valid, ys / torch.where(valid, (y * y).sum(1), 1.0), self.h_diag)

    def _two_loop(self, grad: Tensor) -> Tensor:
        """Nocedal & Wright Algorithm 7.4 per row, newest pair first in the first loop.

        The ring is unbound into per-slot views once per call, so each pair costs three small tensor operations
        per loop (this recursion is most of an L-BFGS step's cost at DLG's problem sizes)."""
        q = -grad
        if self._y is None:
            return q * self.h_diag[:, None]
        order = [(self._next - 1 - k) % self.history_size for k in range(self._filled)]
        ys, ss = self._y.unbind(0), self._s.unbind(0)
        ys_rho, ss_rho = self._y_rho.unbind(0), self._s_rho.unbind(0)
        alphas = []
        for slot in order:
            alpha = torch.linalg.vecdot(ss_rho[slot], q).unsqueeze(1)
            q = q.addcmul(alpha, ys[slot], value=-1)
            alphas.append(alpha)
        r = q * self.h_diag[:, None]
        for slot, alpha in zip(reversed(order), reversed(alphas), strict=True):
            r = r.addcmul(alpha - torch.linalg.vecdot(ys_rho[slot], r).unsqueeze(1), ss[slot])
        return r

    def keep(self, rows: Tensor) -> None:
        """Drop every row but ``rows`` (1-D indices), keeping their state: later :meth:`step` calls take
        ``(len(rows), P)`` gradients."""
        self.num_rows = len(rows)
        self.n_iter, self.step_size, self.h_diag = self.n_iter[rows], self.step_size[rows], self.h_diag[rows]
        if self.direction is not None:
            self.direction, self.prev_grad = self.direction[rows], self.prev_grad[rows]
        if self._y is not None:
            self._y, self._s = self._y[:, rows], self._s[:, rows]
            self._y_rho, self._s_rho = self._y_rho[:, rows], self._s_rho[:, rows]

    def reset(self, rows: Tensor) -> None:
        """Forget the step history of the rows in the boolean mask ``rows`` ``(R,)``: their next :meth:`step` is a
        first step (a scaled gradient step) and their stored curvature pairs become no-ops. For a row moved to a
        new point (a fresh start, or back to an earlier iterate) by its caller."""
        self.n_iter = torch.where(rows.to(self.n_iter.device), 0, self.n_iter)
        self.h_diag = torch.where(rows.to(self.h_diag.device), 1.0, self.h_diag)
        if self._y_rho is not None:
            kept = (~rows).to(self._y_rho)[None, :, None]
            self._y_rho.mul_(kept)
            self._s_rho.mul_(kept)

    @torch.no_grad()
    def step(self, grad: Tensor) -> Tensor:
        """Given the gradients ``(R, P)`` at the current iterates, return the update ``(R, P)`` to add to them."""
        grad = grad.reshape(self.num_rows, -1)
        if self.direction is None:  # the state follows the first gradient's device and dtype
            self.direction, self.prev_grad = torch.zeros_like(grad), grad.clone()
            self.step_size = self.step_size.to(grad)
            self.h_diag = self.h_diag.to(grad)
            self.n_iter = self.n_iter.to(grad.device)
        active = grad.abs().amax(1) > self.tolerance_grad
        first = active & (self.n_iter == 0)
        later = active & ~first
        if later.any():
            y, s = grad - self.prev_grad, self.direction * self.step_size[:, None]
            valid = later & ((y * s).sum(1) > 1e-10)
            if valid.any():
                self._append_pairs(y, s, valid)
        direction = torch.where(first[:, None], -grad, self._two_loop(grad))
        step_size = torch.where(
            first, torch.clamp(1.0 / grad.abs().sum(1), max=1.0) * self.lr, torch.full_like(self.step_size, self.lr)
        )
        self.n_iter = self.n_iter + active.long()
        self.prev_grad = torch.where(active[:, None], grad, self.prev_grad)
        self.direction = torch.where(active[:, None], direction, self.direction)
        self.step_size = torch.where(active, step_size, self.step_size)
        moves = active & ((grad * direction).sum(1) <= -self.tolerance_change)
        return torch.where(moves[:, None], direction * step_size[:, None], 0.0)
