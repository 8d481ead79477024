"""The update rules of the gradient-matching attacks: batched L-BFGS (DLG) or Adam (Inverting Gradients).

Each rule takes the gradients of the optimised variables (one row per restart) and updates them in place.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, NamedTuple

import torch
from torch import Tensor

from lightning_fl.attacks.batched_lbfgs import BatchedLBFGS

__all__ = ["OPTIMIZERS", "OptimizerName", "Step", "Stepper", "make_stepper"]

OptimizerName = Literal["lbfgs", "adam"]
OPTIMIZERS: tuple[str, ...] = ("lbfgs", "adam")
Step = Callable[[Sequence[Tensor]], None]


class Stepper(NamedTuple):
    """An update rule and its restart bookkeeping.

    Args:
        step: takes the gradients of the variables and updates them in place.
        keep: ``keep(rows, kept_variables)`` drops all other restarts and returns the rule for the rest (L-BFGS).
        reset: ``reset(mask)`` clears the history of the masked restarts (L-BFGS).
    """

    step: Step
    keep: Callable[[Tensor, list[Tensor]], Step]
    reset: Callable[[Tensor], None]


def make_stepper(
    variables: list[Tensor],
    *,
    optimizer: OptimizerName,
    lr: float,
    max_iterations: int,
    signed: bool = False,
    boxed: bool = False,
    lr_decay: bool = False,
) -> Stepper:
    """The update rule for ``variables`` (``variables[0]`` the images, each ``(R, ...)``).

    Args:
        variables: the optimised leaf tensors, restarts first.
        optimizer: ``"lbfgs"``: :class:`BatchedLBFGS` without a line search, one state per restart (DLG);
            ``"adam"``: ``torch.optim.Adam``, element-wise, so the restarts stay independent (Inverting Gradients).
        lr: step size.
        max_iterations: the budget, which places the step decay.
        signed: step on the sign of the image gradient (Geiping et al., Sec. 4; Adam only).
        boxed: project the images onto [0, 1] after every step.
        lr_decay: multiply the step size by 0.1 at 3/8, 5/8 and 7/8 of ``max_iterations`` (Adam only).
    """
    images = variables[0]
    if optimizer == "lbfgs":
        lbfgs = BatchedLBFGS(num_rows=len(images), lr=lr)

        def keep(rows: Tensor, kept: list[Tensor]) -> Step:
            lbfgs.keep(rows)
            return _lbfgs_step(lbfgs, kept, boxed=boxed)

        return Stepper(_lbfgs_step(lbfgs, variables, boxed=boxed), keep, lbfgs.reset)
    adam = torch.optim.Adam(variables, lr=lr)
    third = max_iterations / 8
    milestones = [int(3 * third), int(5 * third), int(7 * third)] if lr_decay else []
    schedule = torch.optim.lr_scheduler.MultiStepLR(adam, milestones=milestones, gamma=0.1)

    def adam_step(grads: Sequence[Tensor]) -> None:
        for v, g in zip(variables, grads, strict=True):
            v.grad = g
        if signed:
            images.grad.sign_()
        adam.step()
        schedule.step()
        if boxed:
            with torch.no_grad():
                images.clamp_(0, 1)

    def no_keep(rows: Tensor, kept: list[Tensor]) -> Step:
        raise ValueError("keep_best_after needs optimizer='lbfgs'.")

    def no_reset(rows: Tensor) -> None:
        raise ValueError("recover_stalled needs optimizer='lbfgs'.")

    return Stepper(adam_step, no_keep, no_reset)


def _lbfgs_step(lbfgs: BatchedLBFGS, variables: list[Tensor], *, boxed: bool) -> Step:
    images = variables[0]

    def lbfgs_step(grads: Sequence[Tensor]) -> None:
        update = lbfgs.step(torch.cat([g.reshape(lbfgs.num_rows, -1) for g in grads], 1))
        with torch.no_grad():
            offset = 0
            for v in variables:
                size = v[0].numel()
                v.add_(update[:, offset : offset + size].reshape(v.shape))
                offset += size
            if boxed:
                images.clamp_(0, 1)

    return lbfgs_step
