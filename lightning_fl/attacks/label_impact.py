r"""LLG+'s impact and offset: how one label occurrence, and a class's absence, show in the classifier's gradient.

For cross-entropy averaged over a batch of B inputs, the row sum of the classifier's weight gradient is
:math:`g_c = \frac{1}{B} \sum_b (p_{b,c} - y_{b,c})\, O_b` (:math:`O_b` the sum of the classifier's input
features). LLG (Wainakh et al., PoPETs 2022, Sec. 4) reads labels off it with two quantities: the *impact*
:math:`m`, what one occurrence of a class adds to its row sum, and the *offset* :math:`s_c`, the row sum of a class
that is absent. LLG-simple estimates :math:`m` from the batch's own negative rows and takes :math:`s = 0`; LLG+
measures both on the model the attacker holds, with batches of known labels:

.. math::

    m = \Big(1 + \frac{1}{K}\Big) \frac{1}{K B} \sum_{i=1}^{K} g_i\big(X_i, i\big), \qquad
    s_c = \frac{1}{K - 1} \sum_{i \ne c} g_c\big(X_i, i\big),

where :math:`g(X_i, i)` is the row-sum vector of the gradient of a batch :math:`X_i` whose inputs all carry label
:math:`i`, and the factor :math:`1 + 1/K` is LLG's correction for the other classes' share (Sec. 4.2). The paper's
attacker draws :math:`X_i` from auxiliary data of class :math:`i`; an attacker without data uses dummy inputs
(the same :math:`X` for every class).

Inferred: :math:`g(X_i, i)` of a mean loss does not depend on the batch's size, so one batch per class (all of
:math:`X_i`) replaces the authors' ten repeated batches of B (their code, tklab-tud/LLG), and :math:`B` enters
only in the division; :class:`LabelImpact` keeps :math:`m` per unit of :math:`1/B`.

References:
    Wainakh, Ventola, Müßig, Keim, Garcia Cordero, Zimmer, Grube, Kersting, Mühlhäuser. "User-Level Label Leakage
    from Gradients in Federated Learning", PoPETs 2022(2). https://arxiv.org/abs/2105.09369
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["LabelImpact", "label_impact", "llg_labels"]


@dataclass(frozen=True)
class LabelImpact:
    r"""LLG+'s measurements of a model (Wainakh et al., 2022, Sec. 4).

    Args:
        impact: :math:`B m`, the impact of one occurrence times the batch size (a mean loss divides it by B).
        offset: :math:`s`, the row sum of each absent class ``(K,)``.
    """

    impact: float
    offset: Tensor

    def at(self, num_images: int) -> float:
        """The impact :math:`m` of one occurrence in a batch of ``num_images``."""
        return self.impact / num_images


def label_impact(model: nn.Module, *, classifier_weight: str, inputs_per_class: Sequence[Tensor]) -> LabelImpact:
    r"""Measure LLG+'s impact and offset on ``model`` (a copy; no parameter changes).

    Args:
        model: the public model (its train/eval mode is kept).
        classifier_weight: name of the classifier's weight :math:`W` ``(K, D)``.
        inputs_per_class: :math:`X_i` for each of the :math:`K` classes, labelled :math:`i` (auxiliary data of that
            class, or dummy inputs).

    Raises:
        ValueError: when ``inputs_per_class`` does not have one batch per row of the classifier.

    Example:
        >>> net = nn.Sequential(nn.Flatten(), nn.Linear(4, 3), nn.Sigmoid(), nn.Linear(3, 2))
        >>> measured = label_impact(net, classifier_weight="3.weight", inputs_per_class=[torch.rand(8, 4)] * 2)
        >>> measured.impact < 0, measured.offset.shape, bool((measured.offset > 0).all())
        (True, torch.Size([2]), True)
    """
    model = copy.deepcopy(model)
    weight = model.get_parameter(classifier_weight)
    num_classes = weight.shape[0]
    if len(inputs_per_class) != num_classes:
        raise ValueError(
            f"inputs_per_class has {len(inputs_per_class)} batches; LLG+ needs one per class ({num_classes})."
        )
    own = torch.zeros(num_classes, dtype=torch.float64)
    others = torch.zeros(num_classes, dtype=torch.float64)
    for label, inputs in enumerate(inputs_per_class):
        inputs = inputs.to(weight.device, weight.dtype)
        targets = torch.full((len(inputs),), label, device=weight.device)
        loss = F.cross_entropy(model(inputs), targets)
        (gradient,) = torch.autograd.grad(loss, [weight])
        sums = gradient.detach().double().sum(1).cpu()
        own[label] = sums[label]
        others += sums
        others[label] -= sums[label]
    impact = (1 + 1 / num_classes) * float(own.mean())
    return LabelImpact(impact=impact, offset=others / (num_classes - 1))


def llg_labels(row_sums: Tensor, *, num_images: int, impact: float, offset: Tensor | None = None) -> Tensor:
    r"""LLG's extraction (Wainakh et al., 2022, Sec. 4.2): every class with a negative row sum is present once; the
    row sums less the offset, less the impact for each label taken, then give the remaining labels one at a time
    (the most negative first), so classes can repeat.

    Args:
        row_sums: :math:`g` ``(K,)``.
        num_images: B.
        impact: :math:`m` of one occurrence (negative).
        offset: :math:`s` ``(K,)``; ``None``: 0 (LLG-simple).

    Example:
        >>> llg_labels(torch.tensor([-0.9, 0.2, -0.3]), num_images=4, impact=-0.3)
        tensor([0, 2, 0, 0])
    """
    sums = row_sums.detach().double().cpu()
    labels = [int(c) for c in torch.nonzero(sums < 0).flatten()][:num_images]
    remaining = sums - (offset.double().cpu() if offset is not None else 0.0)
    remaining[labels] -= impact
    while len(labels) < num_images:
        chosen = int(remaining.argmin())
        labels.append(chosen)
        remaining[chosen] -= impact
    return torch.tensor(labels, dtype=torch.long)
