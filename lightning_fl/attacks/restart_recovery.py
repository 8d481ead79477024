"""The L-BFGS rescue of the gradient-matching attacks: restart lost restarts from their best iterate or afresh."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

__all__ = ["RestartRecovery"]


class RestartRecovery:
    """Each L-BFGS restart's best iterate, and what happens to a restart the optimiser has lost.

    L-BFGS without a line search (DLG's setting) scales its first quasi-Newton step by :math:`s^T y / y^T y`, which
    is huge where the gradient barely changed along the first short step: the step can throw the candidate so far
    that a sigmoid network saturates, every gradient becomes exactly zero and no later iteration can leave. Later,
    an unguarded step can also diverge after real progress. A restart is lost when its relative gradient distance
    is not finite, rose above ``blow_up`` times its best, or it stalled: its gradient vanished, or it did not move
    in an iteration (torch's tolerances stop a row whose directional derivative is tiny). A lost restart whose best
    distance came below ``near`` goes back to its best iterate; the others (a saturated start's best is the
    saturated point itself) are re-drawn from the attack's seeded generator; either way its L-BFGS history is
    cleared. Not in DLG's paper (docs/attacks.md, "Natural photos").

    Args:
        variables: the optimised tensors, each ``(R, ...)``; their values are the first iterate.
        vanished: the largest absolute gradient entry at which a restart counts as stalled (L-BFGS's
            ``tolerance_grad``).
    """

    near, blow_up = 0.1, 1e4

    def __init__(self, variables: list[Tensor], *, vanished: float) -> None:
        self.vanished = vanished
        self.best = torch.full((len(variables[0]),), torch.inf, device=variables[0].device)
        self.previous = self.best.clone()
        self.best_variables = [v.detach().clone() for v in variables]

    def keep(self, rows: Tensor) -> RestartRecovery:
        """The record of ``rows`` only (after ``keep_best_after``)."""
        self.best, self.best_variables = self.best[rows], [b[rows] for b in self.best_variables]
        self.previous = self.previous[rows]
        return self

    def record(self, relative: Tensor, variables: list[Tensor]) -> None:
        """Note the iterate ``variables`` (before this iteration's step) where its distance ``relative`` is a best."""
        improved = relative < self.best
        self.best = torch.where(improved, relative, self.best)
        for best, v in zip(self.best_variables, variables, strict=True):
            best.copy_(torch.where(improved.view(-1, *[1] * (v.dim() - 1)), v.detach(), best))

    def recover(
        self,
        relative: Tensor,
        grads: Sequence[Tensor],
        variables: list[Tensor],
        redraw: Callable[[int], list[Tensor]],
        reset: Callable[[Tensor], None],
    ) -> None:
        """After the step: move every lost restart back to its best iterate or to a fresh start."""
        vanished = torch.stack([g.flatten(1).abs().amax(1) for g in grads]).amax(0) <= self.vanished
        stalled = vanished | (relative == self.previous)
        lost = ~relative.isfinite() | (relative > self.blow_up * self.best) | stalled
        self.previous = relative
        if not bool(lost.any()):
            return
        back = lost & (self.best <= self.near)
        fresh = lost & ~back
        with torch.no_grad():
            for v, best in zip(variables, self.best_variables, strict=True):
                v[back] = best[back]
            if bool(fresh.any()):
                for v, start in zip(variables, redraw(int(fresh.sum())), strict=True):
                    v[fresh] = start
        self.best = torch.where(fresh, torch.inf, self.best)
        reset(lost)
