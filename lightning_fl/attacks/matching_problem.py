"""The optimisation a gradient-matching attack runs, for every restart at once, and its per-iteration state."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor
from torch.func import vmap

__all__ = ["MatchingProblem", "MatchingState", "Objective", "over_restarts"]

Objective = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]
"""``(images, label_input) -> (objective, gradient distance)``."""


def over_restarts(
    objective: Callable[[Tensor, Tensor, dict[str, Tensor]], tuple[Tensor, Tensor]],
    *,
    restarts: int,
    unknowns: dict[str, Tensor],
) -> Objective:
    """``objective(images, label_input, unknowns)`` mapped over the leading restart dimension of all three, as an
    :data:`Objective` of the images and labels: ``unknowns`` holds each restart's own estimate ``(R, ...)`` of the
    tensors an adaptive attack optimises with the images. ``vmap`` for several restarts, a plain call for one."""
    if restarts > 1:
        mapped = vmap(objective)
        return lambda x, y: mapped(x, y, unknowns)

    def single(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        total, gap = objective(x[0], y[0], {name: u[0] for name, u in unknowns.items()})
        return total[None], gap[None]

    return single


@dataclass(frozen=True)
class MatchingState:
    """One iteration of :meth:`GradientMatchingAttack.iterate`, for every restart at once.

    Args:
        iteration: 0-based iteration (one objective evaluation).
        losses: objective of each restart ``(R,)`` at the iterate before this iteration's update.
        images: current candidates ``(R, B, C, H, W)`` after the update (before it, on the stopping iteration).
        labels: current labels ``(R, B)``.
        relative_gaps: each restart's gradient distance divided by the distance of an all-zero candidate
            gradient (``sum ||g||^2`` for the Euclidean distance, 1 for the cosine one), ``(R,)``.
        converged: true on the last state when a restart reached ``stop_below``.
        restart_ids: which of the original restarts each row is, ``(R,)`` (rows shrink to one after
            ``keep_best_after``).
        best_losses: each restart's smallest objective so far ``(R,)``.
        best_images: each restart's candidates at that objective ``(R, B, C, H, W)`` (breaching keeps this iterate,
            not the last one: signed steps end near, not at, the minimum they passed).
        best_labels: each restart's labels at that objective ``(R, B)``.
    """

    iteration: int
    losses: Tensor
    images: Tensor
    labels: Tensor
    relative_gaps: Tensor
    converged: bool
    restart_ids: Tensor
    best_losses: Tensor
    best_images: Tensor
    best_labels: Tensor


@dataclass(frozen=True)
class MatchingProblem:
    """The optimisation behind :meth:`GradientMatchingAttack.iterate`, for every restart at once.

    Args:
        objective: ``(images, label_input) -> (objective, gradient distance)``, each ``(R,)``: the batched
            per-restart objective (gradient distance plus regularisers).
        images: starting candidates ``(R, B, C, H, W)``, a leaf that requires grad.
        label_input: soft-label logits ``(R, B, K)`` (optimised) or one-hot inferred labels.
        variables: what the optimiser updates: ``[images]`` or ``[images, label_input]``, then any unknowns (an
            adaptive attack's guess of private tensors, one per restart).
        gap_scale: the gradient distance of an all-zero candidate gradient, which makes a distance relative.
        single: ``objective`` for one remaining restart ``(1, ...)`` without ``vmap``.
        redraw: ``count -> fresh starts of variables``: new random values for each of ``variables``, ``(count, ...)``,
            from the same seeded generator as the first starts (an unknown's start is its first guess again).
        stop_below: the early-stop threshold on the relative gradient distance for this batch (``None``: no stop).
        max_iterations: the iteration budget for this batch.
    """

    objective: Objective
    images: Tensor
    label_input: Tensor
    variables: list[Tensor]
    gap_scale: float
    single: Objective
    redraw: Callable[[int], list[Tensor]]
    stop_below: float | None
    max_iterations: int
