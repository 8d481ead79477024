r"""Add FedProx's proximal term to the local objective of any LightningModule (a Lightning callback)."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from opacus.optimizers import DPOptimizer
from torch import Tensor
from typing_extensions import override

__all__ = ["FedProx"]


class FedProx(L.Callback):
    r"""FedProx's client objective (Li et al., MLSys 2020, Alg. 2, Eq. (2)) for any LightningModule.

    Each client minimises :math:`h_k(w; w^t) = F_k(w) + \frac{\mu}{2}\|w - w^t\|^2`, where :math:`w^t` is the
    model the client received. The callback records :math:`w^t` when the fit starts and, before every optimiser
    step, adds the proximal gradient :math:`\mu(w - w^t)` to each trainable parameter's gradient: the gradient of
    :math:`h_k`, so the module's ``training_step`` and loss stay as they are. The server side of FedProx is FedAvg
    (the loop's default aggregator). Put it in ``loop.client_callbacks`` (YAML:
    ``loop: {client_callbacks: [{class_path: lightning_fl.FedProx, init_args: {mu: 0.01}}]}``) or in a plain
    ``L.Trainer(callbacks=[...])``.

    Deviation: the term is added once per optimiser step, after gradient accumulation, as if the accumulated loss
    carried it once; with ``mu`` = 0 it is FedAvg exactly.

    Args:
        mu: proximal weight :math:`\mu` (the paper tunes it in {0.001, 0.01, 0.1, 1}; Flower's examples use 0.1).

    Raises:
        ValueError: if ``mu`` is negative; at the first step, when the optimiser computes its own gradients
            (Opacus' DP optimiser, which would drop the term silently).

    Example:
        >>> trainer = L.Trainer(callbacks=[FedProx(mu=0.01)], logger=False, enable_progress_bar=False)
        >>> FedProx(mu=0.01).mu
        0.01
    """

    def __init__(self, *, mu: float = 0.01) -> None:
        if mu < 0:
            raise ValueError(f"FedProx(mu={mu}) must be >= 0; it is the proximal weight of Eq. (2).")
        self.mu = mu
        self._anchor: dict[Tensor, Tensor] = {}

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._anchor = {p: p.detach().clone() for p in pl_module.parameters() if p.requires_grad}

    @override
    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        if isinstance(optimizer, DPOptimizer):
            raise ValueError(
                "FedProx cannot add its proximal gradient under Opacus' DPOptimizer (PerExampleDP): the DP step "
                "rebuilds the gradient from per-example gradients; remove one of the two."
            )
        if self.mu == 0:
            return
        with torch.no_grad():
            for p, anchor in self._anchor.items():
                if p.grad is not None:
                    p.grad.add_(p.detach() - anchor, alpha=self.mu)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._anchor = {}
