r"""Robbing the Fed's read-out: the inputs behind an update, copied out of the imprint block's gradient.

Implements the recovery of Robbing the Fed (Fowl et al., ICLR 2022, Sec. 3). Bin :math:`i` of the
:class:`~lightning_fl.attacks.imprint.ImprintBlock` is active for every input whose feature exceeds its threshold,
:math:`h(x) > c_i`, and every bin reaches the rest of the model through the same path, so for a batch the
gradients of bin :math:`i` are :math:`\nabla_{W_i} L = \sum_{n: h(x_n) > c_i} \delta_n x_n` and
:math:`\nabla_{b_i} L = \sum_{n: h(x_n) > c_i} \delta_n`. Two consecutive bins differ by the inputs between their
thresholds; when one input :math:`x_n` is alone there,

.. math:: x_n = \frac{\nabla_{W_i} L - \nabla_{W_{i+1}} L}{\nabla_{b_i} L - \nabla_{b_{i+1}} L},

whatever :math:`\delta_n` (loss, labels, the rest of the model, private layers behind the block). The same holds
for a weight difference of local SGD steps (the :math:`-\eta` cancels, the bins move little between steps) and
for an aggregate of several clients (weights cancel too): secure aggregation hides whose image it is, not the
image. Two inputs in one bin give their weighted mean.

Threat model: a malicious server that shipped the block (:class:`~lightning_fl.attacks.imprint.MaliciousImprint`);
the attack itself only reads the :class:`~lightning_fl.messages.ServerView`.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from lightning_fl.attacks.base import GradientAttack, IterationCallback, Reconstruction
from lightning_fl.attacks.imprint import ImprintBlock
from lightning_fl.messages import ServerView

__all__ = ["RobbingTheFedAttack", "imprinted_inputs"]


def imprinted_inputs(weight_grad: Tensor, bias_grad: Tensor, thresholds: Tensor, *, min_share: float = 1e-6) -> Tensor:
    r"""The inputs read out of one imprint layer's gradient: :math:`(\nabla W_i - \nabla W_{i+1}) /
    (\nabla b_i - \nabla b_{i+1})` for consecutive bins (Fowl et al., 2022, Sec. 3), one row per non-empty bin.

    Args:
        weight_grad: gradient (or update) of :math:`W_1`, ``(k, N)``.
        bias_grad: gradient (or update) of :math:`b`, ``(k,)``.
        thresholds: the bins' thresholds :math:`c_i = -b_i` as the server set them, ``(k,)``; bins are put in
            increasing threshold order, so each bin's active set contains the next one's.
        min_share: a bin is empty when :math:`|\nabla b_i - \nabla b_{i+1}|` is at most this share of the largest
            such difference (float rounding of the cumulative sums).

    Returns:
        ``(M, N)``: one recovered input per non-empty bin, in threshold order.

    Example:
        >>> x = torch.tensor([[1.0, 2.0], [3.0, 5.0]])  # h = mean: 1.5 and 4.0
        >>> c = torch.tensor([-10.0, 2.0, 5.0])
        >>> active = (x.mean(1, keepdim=True) > c).float()  # (2 inputs, 3 bins), delta_n = 0.5 and 2.0
        >>> delta = torch.tensor([[0.5], [2.0]])
        >>> imprinted_inputs((active * delta).T @ x, (active * delta).sum(0), c)
        tensor([[1., 2.],
                [3., 5.]])
    """
    order = thresholds.argsort()
    weight, bias = weight_grad[order].double(), bias_grad[order].double()
    zero_w, zero_b = torch.zeros_like(weight[:1]), torch.zeros_like(bias[:1])
    weight_diff = weight - torch.cat([weight[1:], zero_w])
    bias_diff = bias - torch.cat([bias[1:], zero_b])
    scale = bias_diff.abs().max()
    full = bias_diff.abs() > min_share * scale if scale > 0 else torch.zeros_like(bias_diff, dtype=torch.bool)
    return (weight_diff[full] / bias_diff[full, None]).to(weight_grad.dtype)


def _find_block(view: ServerView) -> tuple[str, ImprintBlock]:
    blocks = [(name, m) for name, m in view.model.named_modules() if isinstance(m, ImprintBlock)]
    if not blocks:
        raise ValueError(
            f"{type(view.model).__name__} has no ImprintBlock: Robbing the Fed reads the block a malicious server "
            "planted; add MaliciousImprint to the run's server_plugins:."
        )
    return blocks[0]


class RobbingTheFedAttack(GradientAttack):
    """Copy the private inputs out of the imprint block's gradient (Fowl et al., ICLR 2022, Sec. 3).

    Works on a gradient (``local_gradient``), a client's update of several local steps (``client_update``) and
    the aggregate (``aggregate``): one division per bin, no optimisation. Recovers no labels.

    Args:
        min_share: see :func:`imprinted_inputs`.

    Raises:
        ValueError: on ``min_share`` outside [0, 1); in :meth:`reconstruct`, when the view's
            model has no :class:`~lightning_fl.attacks.imprint.ImprintBlock` or its gradient was not intercepted.
    """

    name = "robbing_the_fed"

    def __init__(self, *, min_share: float = 1e-6) -> None:
        if not 0 <= min_share < 1:
            raise ValueError(f"RobbingTheFedAttack(min_share={min_share}) must be in [0, 1).")
        self.min_share = min_share

    def reconstruct(self, view: ServerView, *, callback: IterationCallback | None = None) -> Reconstruction:
        """Read the inputs behind ``view`` out of its imprint block; images are clamped to [0, 1], on the CPU."""
        start = time.perf_counter()
        name, block = _find_block(view)
        keys = (f"{name}.bins.weight", f"{name}.bins.bias")
        missing = [k for k in keys if k not in view.tensors]
        if missing:
            raise ValueError(f"the {view.leak_point!r} view lacks {missing}: the imprint block's gradient is needed.")
        weight, bias = (view.tensors[k].detach().cpu() for k in keys)
        if not bool(bias.abs().gt(0).any()):
            raise ValueError(
                "the imprint block's bias gradient is zero: the inputs did not pass through it. The model's "
                "training_step must call the model itself (self(x)), whose forward pre-hook applies the block."
            )
        thresholds = -block.bins.bias.detach().cpu()
        recovered = imprinted_inputs(weight, bias, thresholds, min_share=self.min_share)
        images = recovered.reshape(-1, *block.input_shape).float().nan_to_num(0.5).clamp(0, 1)
        if callback is not None:
            callback(0, 0.0)
        return Reconstruction(
            images=images,
            labels=None,
            info={"recovered_bins": len(recovered), "num_bins": block.num_bins, "seconds": time.perf_counter() - start},
        )

    def __repr__(self) -> str:
        return f"RobbingTheFedAttack(min_share={self.min_share})"
