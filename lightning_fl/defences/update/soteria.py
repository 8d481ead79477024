r"""Soteria: prune the gradient of a fully connected layer at the features that reveal the input most.

Sun, Li, Wang, Qi, Chen, Li, Li, "Soteria: Provable Defense against Privacy Leakage in Federated Learning from
Representation Perspective", CVPR 2021, Sec. 3-4: the defence perturbs the data representation :math:`r` (the
input of a fully connected layer) so that a reconstruction from it is far from the data. Its approximate solution
removes the features with the largest :math:`\|r_i\| / \|\nabla_x r_i\|` (removing feature :math:`i` moves the
reconstruction by about that much), i.e. zeroes those columns of the layer's weight gradient
:math:`\nabla_W \ell = \nabla_y \ell \, r^\top`. The reference code (jeremy313/Soteria, ``defense_soteria``) ranks by
the inverse, :math:`\sum_b \|\nabla_x r_{b,i}\| / r_{b,i}` over the batch, and prunes below a percentile; so do we.
"""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn
from typing_extensions import override

from lightning_fl.defences.base import Defence, DefenceParts
from lightning_fl.transforms import own_layers

__all__ = ["Soteria", "representation_sensitivity", "soteria_mask"]


def representation_sensitivity(model: nn.Module, layer: nn.Linear, inputs: Tensor) -> Tensor:
    r"""Soteria's per-feature score :math:`s_i = |\sum_b \|\nabla_{x_b} r_{b,i}\|_2 / r_{b,i}|`, shape ``(F,)``.

    :math:`r` is the input of ``layer`` when ``model`` runs on ``inputs``; features with the smallest :math:`s_i`
    (the largest :math:`\|r_i\| / \|\nabla_x r_i\|`) are the ones Soteria prunes. The model's buffers (batch-norm
    statistics) are restored afterwards; the per-example gradients assume the examples do not interact.

    Raises:
        ValueError: if the layer's input is not ``(B, F)``.

    Example:
        >>> net = nn.Sequential(nn.Flatten(), nn.Linear(4, 3), nn.Sigmoid(), nn.Linear(3, 2))
        >>> representation_sensitivity(net, net[3], torch.rand(2, 1, 2, 2)).shape
        torch.Size([3])
    """
    captured: list[Tensor] = []
    handle = layer.register_forward_pre_hook(lambda _module, args: captured.append(args[0]))
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    x = inputs.detach().clone().requires_grad_(True)
    try:
        with torch.enable_grad():
            model(x)
            r = captured[0]
            if r.dim() != 2:
                raise ValueError(f"Soteria defends a Linear layer on (B, F) features; its input is {tuple(r.shape)}.")
            features = r.shape[1]
            directions = torch.eye(features, dtype=r.dtype, device=r.device).unsqueeze(1).expand(features, *r.shape)
            (jacobian,) = torch.autograd.grad(r, x, grad_outputs=directions.contiguous(), is_grads_batched=True)
    finally:
        handle.remove()
        with torch.no_grad():  # after the backward: the graph may hold the buffers (input statistics)
            for name, b in model.named_buffers():
                b.copy_(buffers[name])
    norms = jacobian.flatten(2).norm(dim=2)  # (F, B): ||d r_{b,i} / d x_b||, examples independent
    return (norms / r.detach().T).sum(dim=1).abs()


def soteria_mask(scores: Tensor, *, prune_percent: float) -> Tensor:
    """0/1 mask over features: ``floor(prune_percent / 100 * F)`` features with the smallest score get 0.

    Example:
        >>> soteria_mask(torch.tensor([0.3, 0.1, 5.0, 2.0]), prune_percent=50)
        tensor([0., 0., 1., 1.])
    """
    count = math.floor(prune_percent / 100 * scores.numel())
    mask = torch.ones_like(scores)
    mask[scores.nan_to_num(nan=math.inf).argsort()[:count]] = 0
    return mask


class Soteria(Defence, L.Callback):
    """Soteria (Sun et al., CVPR 2021): after each backward pass, zero the columns of the defended layer's weight
    gradient at the ``prune_percent`` % of features most revealing of the input (:func:`soteria_mask`).

    A Lightning callback (``on_after_backward``), so every local gradient, and the update they sum to, carries the
    pruned gradient; ``Trainer(callbacks=[Soteria(prune_percent=80)])`` in plain Lightning, ``defences=[...]`` in a
    federated run. The paper defends the fully connected layer on the representation (ResNet's classifier); the
    default picks the last ``nn.Linear`` of the model. Costs one forward and a batched backward over the F features
    per step.

    Args:
        prune_percent: share of the layer's input features pruned, in [0, 100) (the paper uses 80 and more).
        layer: the dotted name of the defended ``nn.Linear`` in the LightningModule; ``None``: the last one.

    Raises:
        ValueError: if ``prune_percent`` is outside [0, 100); at run time, if ``layer`` names no ``nn.Linear``.

    Example:
        >>> import lightning as L
        >>> trainer = L.Trainer(callbacks=[Soteria(prune_percent=80)], logger=False, enable_checkpointing=False)
    """

    def __init__(self, *, prune_percent: float = 80.0, layer: str | None = None) -> None:
        if not 0.0 <= prune_percent < 100.0:
            raise ValueError(f"Soteria(prune_percent={prune_percent}) must be in [0, 100); it is a percentage.")
        self.prune_percent, self.layer = prune_percent, layer
        self._inputs: Tensor | None = None

    @override
    def parts(self) -> DefenceParts:
        return DefenceParts(client_callbacks=[self])

    def defended_layer(self, model: nn.Module) -> nn.Linear:
        """The ``nn.Linear`` this defence prunes the gradient of."""
        linears = own_layers(model, nn.Linear)
        if self.layer is None and linears:
            return list(linears.values())[-1]
        if self.layer in linears:
            return linears[self.layer]
        raise ValueError(f"Soteria(layer={self.layer!r}) names no nn.Linear of the model; choose from {list(linears)}.")

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._inputs = batch[0] if isinstance(batch, list | tuple) else batch

    @override
    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        layer = self.defended_layer(pl_module)
        if self._inputs is None or layer.weight.grad is None or self.prune_percent == 0:
            return
        scores = representation_sensitivity(pl_module, layer, self._inputs)
        layer.weight.grad.mul_(soteria_mask(scores, prune_percent=self.prune_percent))

    def __repr__(self) -> str:
        return f"Soteria(prune_percent={self.prune_percent}, layer={self.layer!r})"
