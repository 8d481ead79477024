"""L-BFGS for R independent problems at once: the optimiser behind DLG's restarts run as one computation.

``torch.optim.LBFGS`` couples every tensor it is given into one flat vector, so stacking R restarts into one
tensor would share step sizes and curvature pairs between them. :class:`BatchedLBFGS` keeps one L-BFGS state per
row and does what R separate ``torch.optim.LBFGS(params, lr=lr, max_iter=1, history_size=...,
line_search_fn=None)`` instances do, one iteration (one objective evaluation) per :meth:`step`. The curvature
pairs of all rows live in one ring of ``history_size`` slots and the direction comes from the compact form of
L-BFGS (a few matrix products for all rows); the only difference from torch: a row that rejects a pair
(``y^T s <= 1e-10``) in a step where another row accepts one keeps a window one pair shorter.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["BatchedLBFGS"]


def _products(ring: Tensor, vectors: Tensor) -> Tensor:
    """``ring (R, H, P)`` times ``vectors (R, P)`` per row, ``(R, H)``; as row vectors times the transposed ring,
    the form CPU ``bmm`` runs fastest (docs/performance.md, "Attack speed")."""
    return torch.bmm(vectors[:, None, :], ring.mT)[:, 0]


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
        # a ring of the last `history_size` steps, (R, H, P); a row that rejects a pair in a step where another row
        # accepts one stores a zero pair there (a no-op), so its window is one pair shorter than torch's
        self._y: Tensor | None = None
        self._s: Tensor | None = None
        self._sy: Tensor | None = None  # (R, H, H): s_i^T y_j of the ring's slots
        self._yy: Tensor | None = None  # (R, H, H): y_i^T y_j
        self._filled, self._next = 0, 0

    def _append_pairs(self, y: Tensor, s: Tensor, valid: Tensor) -> None:
        ys = (y * s).sum(1)
        if self._y is None:
            rows, size = y.shape
            self._y, self._s = y.new_zeros(rows, self.history_size, size), y.new_zeros(rows, self.history_size, size)
            self._sy = y.new_zeros(rows, self.history_size, self.history_size)
            self._yy = torch.zeros_like(self._sy)
        y, s = y * valid[:, None], s * valid[:, None]
        slot = self._next
        self._y[:, slot], self._s[:, slot] = y, s
        self._sy[:, slot, :] = _products(self._y, s)
        self._sy[:, :, slot] = _products(self._s, y)
        self._yy[:, slot, :] = self._yy[:, :, slot] = _products(self._y, y)
        self._next = (slot + 1) % self.history_size
        self._filled = min(self._filled + 1, self.history_size)
        self.h_diag = torch.where(valid, ys / torch.where(valid, (y * y).sum(1), 1.0), self.h_diag)

    def _direction(self, grad: Tensor) -> Tensor:
        """The L-BFGS direction ``-H grad`` per row: what the two-loop recursion of Nocedal & Wright (Algorithm 7.4)
        computes, here in the compact form of Byrd, Nocedal & Schnabel (1994, Theorem 2.2),

        .. math:: H g = \\gamma g + S w - \\gamma Y u,\\quad u = R^{-1} S^T g,\\quad
            w = R^{-T}\\big((D + \\gamma Y^T Y) u - \\gamma Y^T g\\big),

        with :math:`R` the upper triangle of :math:`S^T Y` (pairs oldest first), :math:`D` its diagonal and
        :math:`\\gamma` = ``h_diag``. :math:`S^T Y` and :math:`Y^T Y` grow by one row and column per pair, so a step
        costs a few matrix-vector products and two small triangular solves instead of ~600 vector operations
        (the recursion over 100 pairs). A zero (rejected) pair gets a unit diagonal in :math:`R`, which leaves it
        out, as ``rho = 0`` does in the recursion."""
        gamma = self.h_diag[:, None]
        if self._y is None:
            return -grad * gamma
        # slots oldest first: the ring's first `filled` slots until it wraps, then rolled to start at the oldest
        count, shift = self._filled, (self._next if self._filled == self.history_size else 0)

        def chronological(ring: Tensor, dims: tuple[int, ...]) -> Tensor:
            return ring.roll([-shift] * len(dims), dims) if shift else ring

        sy = chronological(self._sy, (1, 2))[:, :count, :count]
        diagonal = sy.diagonal(dim1=1, dim2=2)
        upper = sy.triu(1) + torch.diag_embed(torch.where(diagonal == 0, 1.0, diagonal))
        s_g = chronological(_products(self._s, grad), (1,))[:, :count, None]
        y_g = chronological(_products(self._y, grad), (1,))[:, :count, None]
        u = torch.linalg.solve_triangular(upper, s_g, upper=True)
        yy = chronological(self._yy, (1, 2))[:, :count, :count]
        rhs = diagonal[:, :, None] * u + gamma[:, :, None] * (torch.bmm(yy, u) - y_g)
        w = torch.linalg.solve_triangular(upper.mT, rhs, upper=False)
        # back to ring order: rolled back once wrapped, else the first `count` slots (the rest are zero)
        w, u = (w.roll(shift, 1), u.roll(shift, 1)) if shift else (w, u)
        h_g = gamma * grad + torch.bmm(w.mT, self._s[:, :count])[:, 0]
        return -(h_g - gamma * torch.bmm(u.mT, self._y[:, :count])[:, 0])

    def keep(self, rows: Tensor) -> None:
        """Drop every row but ``rows`` (1-D indices), keeping their state: later :meth:`step` calls take
        ``(len(rows), P)`` gradients."""
        self.num_rows = len(rows)
        self.n_iter, self.step_size, self.h_diag = self.n_iter[rows], self.step_size[rows], self.h_diag[rows]
        if self.direction is not None:
            self.direction, self.prev_grad = self.direction[rows], self.prev_grad[rows]
        if self._y is not None:
            self._y, self._s, self._sy, self._yy = self._y[rows], self._s[rows], self._sy[rows], self._yy[rows]

    def reset(self, rows: Tensor) -> None:
        """Forget the step history of the rows in the boolean mask ``rows`` ``(R,)``: their next :meth:`step` is a
        first step (a scaled gradient step) and their stored curvature pairs become zero (no-op) pairs. For a row
        moved to a new point (a fresh start, or back to an earlier iterate) by its caller."""
        self.n_iter = torch.where(rows.to(self.n_iter.device), 0, self.n_iter)
        self.h_diag = torch.where(rows.to(self.h_diag.device), 1.0, self.h_diag)
        if self._y is not None:
            kept = (~rows).to(self._y)
            for ring in (self._y, self._s, self._sy, self._yy):
                ring.mul_(kept.view(-1, *[1] * (ring.dim() - 1)))

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
        direction = torch.where(first[:, None], -grad, self._direction(grad))
        step_size = torch.where(
            first, torch.clamp(1.0 / grad.abs().sum(1), max=1.0) * self.lr, torch.full_like(self.step_size, self.lr)
        )
        self.n_iter = self.n_iter + active.long()
        self.prev_grad = torch.where(active[:, None], grad, self.prev_grad)
        self.direction = torch.where(active[:, None], direction, self.direction)
        self.step_size = torch.where(active, step_size, self.step_size)
        moves = active & ((grad * direction).sum(1) <= -self.tolerance_change)
        return torch.where(moves[:, None], direction * step_size[:, None], 0.0)
