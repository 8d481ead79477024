"""SGD and Adam on stacked client parameters: one update for K clients, each as ``torch.optim`` updates its own.

The vectorised inner fit (:mod:`~lightning_fl.federation.vectorised_fit`) keeps client ``k``'s copy of a parameter
in row ``k`` of a ``(K, ...)`` tensor. The updates below are the element-wise rules of ``torch.optim.SGD`` and
``torch.optim.Adam`` (single-tensor form, the one ``torch.optim`` runs on a CPU), applied to the rows of the clients
still training. Every row of a step has taken the same number of steps (clients are ordered by length, the ones
still training are a prefix), so the step count and the bias corrections are one Python float, as in ``torch.optim``.
Rows past the prefix are never read or written: a finished client's parameters and state do not move.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

__all__ = ["StackedOptimizer", "stacked_optimizer_refusal"]

_SGD_DEFAULTS = {"maximize": False, "foreach": None, "differentiable": False, "fused": None}
_ADAM_DEFAULTS = {**_SGD_DEFAULTS, "amsgrad": False, "capturable": False, "decoupled_weight_decay": False}


def stacked_optimizer_refusal(optimizer: torch.optim.Optimizer) -> str | None:
    """Why :class:`StackedOptimizer` cannot replay ``optimizer`` (one line), else ``None``.

    Only the exact classes ``torch.optim.SGD`` and ``torch.optim.Adam`` with float hyperparameters and their default
    variants (no ``maximize``, ``amsgrad``, fused or differentiable form) are replayed.

    Example:
        >>> stacked_optimizer_refusal(torch.optim.Adam([torch.zeros(1, requires_grad=True)], amsgrad=True))
        'Adam(amsgrad=True): only the default variant is replayed on stacked clients'
    """
    defaults = {torch.optim.SGD: _SGD_DEFAULTS, torch.optim.Adam: _ADAM_DEFAULTS}.get(type(optimizer))
    if defaults is None:
        return f"optimiser {type(optimizer).__name__}: only torch.optim.SGD and torch.optim.Adam are replayed"
    for group in optimizer.param_groups:
        for key, default in defaults.items():
            if group.get(key, default) != default:
                name = type(optimizer).__name__
                return f"{name}({key}={group[key]!r}): only the default variant is replayed on stacked clients"
        if isinstance(group["lr"], Tensor):
            return "a tensor learning rate: only float hyperparameters are replayed"
    return None


@dataclass
class StackedOptimizer:
    """``torch.optim.SGD`` or ``torch.optim.Adam`` over stacked parameters, one row per client.

    Args:
        kind: ``"sgd"`` or ``"adam"``.
        groups: one dict per parameter group: ``"names"`` (the stacked parameters it updates) and the group's
            hyperparameters as ``torch.optim`` holds them (``lr``, ``momentum``, ``betas``, ...).
    """

    kind: str
    groups: list[dict[str, Any]]
    state: dict[str, dict[str, Tensor]] = field(default_factory=dict)

    @classmethod
    def like(cls, optimizer: torch.optim.Optimizer, names: dict[int, str]) -> StackedOptimizer:
        """The stacked form of ``optimizer`` (see :func:`stacked_optimizer_refusal`); ``names`` maps ``id(param)``
        to the parameter's name."""
        groups = [
            {**{k: v for k, v in g.items() if k != "params"}, "names": [names[id(p)] for p in g["params"]]}
            for g in optimizer.param_groups
        ]
        return cls(type(optimizer).__name__.lower(), groups)

    @property
    def names(self) -> list[str]:
        """The names of the parameters it updates, in group order."""
        return [name for group in self.groups for name in group["names"]]

    @torch.no_grad()
    def step(self, params: dict[str, Tensor], grads: dict[str, Tensor], *, active: int, step: int) -> None:
        """Update rows ``[:active]`` of ``params`` (``(K, ...)`` tensors) in place with ``grads`` (``(active, ...)``)
        at the 1-based optimiser ``step`` of those rows."""
        for group in self.groups:
            for name in group["names"]:
                state = self.state.setdefault(name, {})
                update = _adam if self.kind == "adam" else _sgd
                update(params[name], grads[name], state, group, active=active, step=step)


def _rows(state: dict[str, Tensor], key: str, like: Tensor, active: int) -> Tensor:
    """Rows ``[:active]`` of the optimiser state ``key``, created as zeros shaped as ``like`` when missing."""
    if key not in state:
        state[key] = torch.zeros_like(like)
    return state[key][:active]


def _sgd(
    stacked: Tensor, grad: Tensor, state: dict[str, Tensor], group: dict[str, Any], *, active: int, step: int
) -> None:
    """``torch.optim.SGD``'s update (momentum buffer = the first gradient, then ``mu * b + (1 - dampening) * g``)."""
    param, weight_decay, momentum = stacked[:active], group["weight_decay"], group["momentum"]
    if weight_decay != 0:
        grad = grad.add(param, alpha=weight_decay)
    if momentum != 0:
        buf = _rows(state, "momentum_buffer", stacked, active)
        if step == 1:
            buf.copy_(grad)
        else:
            buf.mul_(momentum).add_(grad, alpha=1 - group["dampening"])
        grad = grad.add(buf, alpha=momentum) if group["nesterov"] else buf
    param.add_(grad, alpha=-group["lr"])


def _adam(
    stacked: Tensor, grad: Tensor, state: dict[str, Tensor], group: dict[str, Any], *, active: int, step: int
) -> None:
    """``torch.optim.Adam``'s update (Kingma & Ba, ICLR 2015, Algorithm 1, L2 weight decay added to the gradient)."""
    param, (beta1, beta2) = stacked[:active], group["betas"]
    exp_avg, exp_avg_sq = _rows(state, "exp_avg", stacked, active), _rows(state, "exp_avg_sq", stacked, active)
    if group["weight_decay"] != 0:
        grad = grad.add(param, alpha=group["weight_decay"])
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    step_size = group["lr"] / (1 - beta1**step)
    denom = torch.sqrt(exp_avg_sq, out=_rows(state, "denom", stacked, active))  # a scratch row block, no allocation
    denom.div_((1 - beta2**step) ** 0.5).add_(group["eps"])
    param.addcdiv_(exp_avg, denom, value=-step_size)
