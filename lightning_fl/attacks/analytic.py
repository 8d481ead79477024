"""Analytic input recovery from a fully connected first layer: no optimisation, one division.

For a linear layer :math:`z = Wx + b` on the input,
:math:`\\partial L / \\partial W_i = (\\partial L / \\partial z_i)\\, x^T` and
:math:`\\partial L / \\partial b_i = \\partial L / \\partial z_i`, so every row i with a nonzero bias gradient
holds the input exactly: :math:`x = (\\partial L / \\partial W_i) / (\\partial L / \\partial b_i)` (Phong et al.,
2017, Sec. 3.2; R-GAP's fully connected case, Zhu & Blaschko, ICLR 2021, Sec. 3). For a batch of B inputs the same
ratio is :math:`\\sum_b \\delta_{b,i} x_b / \\sum_b \\delta_{b,i}`: a mix of the inputs, exact only for rows that
(through a ReLU) only one input activates.

References:
    Phong, Aono, Hayashi, Wang, Moriai. Privacy-Preserving Deep Learning via Additively Homomorphic Encryption.
    IEEE TIFS 13(5), 2018 (ATIS 2017). https://eprint.iacr.org/2017/715
    Zhu, Blaschko. R-GAP: Recursive Gradient Attack on Privacy. ICLR 2021. https://arxiv.org/abs/2010.07733
"""

from __future__ import annotations

import math
import time

import torch
from torch import Tensor, nn

from lightning_fl.attacks.base import GradientAttack, IterationCallback, Reconstruction
from lightning_fl.attacks.labels import last_layer_bias_name, last_layer_weight_name
from lightning_fl.attacks.matching_labels import target_label_sets
from lightning_fl.attacks.targets import matching_target
from lightning_fl.messages import ServerView

__all__ = ["AnalyticLinearAttack", "first_linear_layer", "linear_layer_inputs"]


def first_linear_layer(model: nn.Module) -> str:
    """Name of the first ``nn.Linear`` module with a bias, in module order.

    Raises:
        ValueError: when the model has none.

    Example:
        >>> first_linear_layer(nn.Sequential(nn.Flatten(), nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)))
        '1'
    """
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and module.bias is not None:
            return name
    raise ValueError(
        f"{type(model).__name__} has no nn.Linear layer with a bias, so its input cannot be read off analytically; "
        "use an optimisation attack (DLGAttack, InvertingGradientsAttack)."
    )


def linear_layer_inputs(weight_gradient: Tensor, bias_gradient: Tensor, *, count: int) -> Tensor:
    """The inputs ``(count, D)`` of a linear layer from its gradients ``(K, D)`` and ``(K,)``.

    ``count = 1``: the least-squares solution of :math:`\\nabla W_i = \\nabla b_i\\, x` over all rows,
    :math:`x = \\sum_i \\nabla b_i \\nabla W_i / \\sum_i \\nabla b_i^2`, which is exact for one input (Phong et
    al., Sec. 3.2). ``count > 1``: the per-row ratios :math:`\\nabla W_i / \\nabla b_i`; a row that (behind a
    ReLU) one input alone activates holds that input exactly, and so do all other such rows of the same input, so
    the ratios shared by the most rows are taken first, one per group of equal ratios, then the rows with the
    largest :math:`|\\nabla b_i|` (Inferred: the papers recover one input; a ratio shared by no other row is a mix
    of the inputs that activate its row).

    Example:
        >>> x = torch.tensor([1.0, 2.0])
        >>> delta = torch.tensor([0.5, -2.0])
        >>> linear_layer_inputs(delta[:, None] * x, delta, count=1)
        tensor([[1., 2.]], dtype=torch.float64)
    """
    weight, bias = weight_gradient.detach().double().cpu(), bias_gradient.detach().double().cpu()
    if count == 1:
        return ((bias[:, None] * weight).sum(0) / bias.pow(2).sum().clamp_min(1e-300))[None]
    rows = torch.nonzero(bias.abs() > 1e-6 * bias.abs().max()).flatten()
    rows = rows[bias[rows].abs().argsort(descending=True)]
    candidates = weight[rows] / bias[rows, None]
    scale = candidates.norm(dim=1, keepdim=True).clamp_min(1e-300)
    same = torch.cdist(candidates, candidates) <= 1e-5 * torch.minimum(scale, scale.T)
    order = same.sum(1).argsort(descending=True, stable=True)
    chosen: list[int] = []
    for row in order.tolist():
        if not any(bool(same[row, c]) for c in chosen):
            chosen.append(row)
        if len(chosen) == count:
            break
    picked = candidates[chosen]
    return picked.repeat(math.ceil(count / len(picked)), 1)[:count]


class AnalyticLinearAttack(GradientAttack):
    """Read the private input off the gradient of a fully connected first layer (Phong et al., 2017).

    Exact for one input per gradient whose first layer is an ``nn.Linear`` with a bias on the flattened image (an
    MLP); a batch gives mixes of its inputs (see :func:`linear_layer_inputs`). An ``ImageClassifier``'s input
    standardisation (its public ``input_mean`` / ``input_std`` buffers) is undone. An update of one local SGD step
    is attacked as its gradient (the learning rate cancels in the ratio). Labels come from the classifier's bias
    gradient (:func:`~lightning_fl.attacks.labels.infer_labels`, ``"bias_count"``; ``"weight_count"`` without
    one). Threat model: an honest-but-curious server.

    Example:
        >>> AnalyticLinearAttack().name
        'analytic_linear'
    """

    name = "analytic_linear"

    def reconstruct(self, view: ServerView, *, callback: IterationCallback | None = None) -> Reconstruction:
        """The inputs behind ``view`` (on the CPU, clamped to [0, 1]), with labels from the bias gradient."""
        start = time.perf_counter()
        layer = first_linear_layer(view.model)
        target = matching_target(view)
        gradients = {n: t / target.local_steps for n, t in zip(target.names, target.tensors, strict=True)}
        for name in (f"{layer}.weight", f"{layer}.bias"):
            if name not in gradients:
                raise ValueError(f"the analytic attack needs the gradient of {name!r}, which the view does not hold.")
        flat = linear_layer_inputs(gradients[f"{layer}.weight"], gradients[f"{layer}.bias"], count=target.num_images)
        input_shape = tuple(view.metadata.get("input_shape") or ())
        if math.prod(input_shape) != flat.shape[1]:
            raise ValueError(
                f"the first linear layer {layer!r} takes {flat.shape[1]} inputs, not the image's {input_shape}: the "
                "analytic attack needs a fully connected first layer on the flattened image (an MLP)."
            )
        images = flat.reshape(-1, *input_shape).float()
        mean, std = getattr(view.model, "input_mean", None), getattr(view.model, "input_std", None)
        if isinstance(mean, Tensor) and isinstance(std, Tensor):
            images = images * std.cpu() + mean.cpu()
        num_classes = int(view.metadata.get("num_classes") or 0)
        classifier = last_layer_weight_name(view.model, num_classes=num_classes)
        has_bias = last_layer_bias_name(view.model, weight_name=classifier) in target.names
        labels = target_label_sets(
            view.model,
            target,
            num_classes=num_classes,
            input_shape=input_shape,
            strategy="bias_count" if has_bias else "weight_count",
        )[0]
        if callback is not None:
            callback(0, 0.0)
        return Reconstruction(
            images=images.nan_to_num(0.5).clamp(0, 1).cpu(),
            labels=labels,
            loss_history=[0.0],
            info={"layer": layer, "seconds": time.perf_counter() - start},
        )
