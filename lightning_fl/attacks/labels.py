"""Analytic label inference from the last layer's gradient (iDLG and its batch variants).

For cross-entropy on softmax outputs, the gradient of the last linear layer's weight row c is
:math:`\\sum_b (p_{b,c} - y_{b,c})\\, h_b`. With non-negative penultimate features :math:`h_b` (sigmoid or ReLU
networks), rows of true labels tend to be negative and the others positive: iDLG (Zhao et al., 2020, Sec. 3)
reads the label of a single image off the sign; the batch variants below rank the rows.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

__all__ = ["LABEL_STRATEGIES", "LabelStrategy", "infer_labels", "last_layer_weight_name"]

LabelStrategy = Literal["idlg", "yin", "llg"]
LABEL_STRATEGIES: frozenset[str] = frozenset({"idlg", "yin", "llg"})


def last_layer_weight_name(model: nn.Module, *, num_classes: int) -> str:
    """Name of the last 2-D parameter with ``num_classes`` rows: the classifier's weight.

    Raises:
        ValueError: when the model has no such parameter.

    Example:
        >>> last_layer_weight_name(nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 3)), num_classes=3)
        '1.weight'
    """
    names = [n for n, p in model.named_parameters() if p.ndim == 2 and p.shape[0] == num_classes]
    if not names:
        raise ValueError(
            f"{type(model).__name__} has no 2-D parameter with num_classes={num_classes} rows, so labels cannot be "
            "inferred analytically; use labels='optimise' (DLG's joint soft labels) instead."
        )
    return names[-1]


def infer_labels(last_layer_gradient: Tensor, *, num_images: int, strategy: LabelStrategy = "idlg") -> Tensor:
    r"""Infer the labels of a batch from the gradient :math:`\nabla W` of the last linear layer, shape ``(K, D)``.

    Strategies (each assumes non-negative penultimate features, e.g. the sigmoid LeNet):

    - ``"idlg"``: iDLG (Zhao et al., arXiv:2001.02610, Sec. 3.1): the label of one image is the row with a
      negative sum, :math:`\arg\min_c \sum_j \nabla W_{c,j}`. Inferred, for B > 1: the B rows with the most
      negative sums (the negative-row-sum heuristic), which assumes distinct labels.
    - ``"yin"``: GradInversion (Yin et al., CVPR 2021, Eq. 6): the B rows with the smallest minimum entry;
      distinct labels.
    - ``"llg"``: LLG (Wainakh et al., PoPETs 2022, "LLG-simple"): every class with a negative row sum is present;
      the impact :math:`m = \frac{1}{B}(1 + \frac{1}{K}) \sum_{c: s_c < 0} s_c` is subtracted from a class's sum
      each time it is chosen, and the remaining labels are the repeatedly most negative sums, so repeated
      labels can be recovered.

    A multi-step update is :math:`-\eta \sum_t g_t`: pass its pseudo-gradient :math:`-\Delta W / \eta`.

    Args:
        last_layer_gradient: :math:`\nabla W` of the classifier weight, ``(K, D)``.
        num_images: batch size B (public metadata).
        strategy: one of :data:`LABEL_STRATEGIES`.

    Returns:
        ``(B,)`` integer labels (sorted by evidence, not in batch order).

    Raises:
        ValueError: on an unknown strategy, or B > K for a strategy that assumes distinct labels.

    Example:
        >>> grad = torch.tensor([[0.2, 0.1], [-0.5, -0.4], [0.3, 0.2]])
        >>> infer_labels(grad, num_images=1)
        tensor([1])
    """
    if strategy not in LABEL_STRATEGIES:
        raise ValueError(f"label strategy {strategy!r} is unknown; use one of {sorted(LABEL_STRATEGIES)}.")
    if last_layer_gradient.ndim != 2:
        raise ValueError(f"expected the last layer's weight gradient (K, D), got shape {last_layer_gradient.shape}.")
    num_classes = last_layer_gradient.shape[0]
    if strategy in ("idlg", "yin") and num_images > num_classes:
        raise ValueError(
            f"label strategy {strategy!r} assumes distinct labels but num_images={num_images} > {num_classes} "
            "classes; use strategy='llg'."
        )
    grad = last_layer_gradient.detach().double()
    if strategy == "idlg":
        return grad.sum(1).argsort()[:num_images]
    if strategy == "yin":
        return grad.amin(1).argsort()[:num_images]
    sums = grad.sum(1)
    impact = sums.clamp(max=0).sum() * (1 + 1 / num_classes) / num_images
    labels = [int(c) for c in torch.nonzero(sums < 0).flatten()][:num_images]
    remaining = sums.clone()
    remaining[labels] -= impact
    while len(labels) < num_images:
        chosen = int(remaining.argmin())
        labels.append(chosen)
        remaining[chosen] -= impact
    return torch.tensor(labels, dtype=torch.long)
