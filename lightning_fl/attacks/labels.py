"""Analytic label inference from the last layer's gradient (iDLG and its batch variants).

For cross-entropy on softmax outputs, the gradient of the last linear layer's weight row c is
:math:`\\sum_b (p_{b,c} - y_{b,c})\\, h_b`. With non-negative penultimate features :math:`h_b` (sigmoid or ReLU
networks), rows of true labels tend to be negative and the others positive: iDLG (Zhao et al., 2020, Sec. 3)
reads the label of a single image off the sign; the ranking rules below extend it to batches, and the count rules
(:mod:`~lightning_fl.attacks.label_counts`) estimate how often each class occurs.
"""

from __future__ import annotations

from itertools import combinations_with_replacement, islice
from typing import Literal

import torch
from torch import Tensor, nn

from lightning_fl.attacks.label_counts import DummyStatistics, counts_to_labels, label_counts
from lightning_fl.attacks.label_impact import LabelImpact, llg_labels

__all__ = [
    "COUNT_STRATEGIES",
    "LABEL_STRATEGIES",
    "LabelStrategy",
    "infer_labels",
    "last_layer_bias_name",
    "last_layer_weight_name",
    "sign_search_candidates",
]

LabelStrategy = Literal["idlg", "yin", "llg", "llg_plus", "bias_count", "weight_count", "sign_search"]
LABEL_STRATEGIES: frozenset[str] = frozenset(
    {"idlg", "yin", "llg", "llg_plus", "bias_count", "weight_count", "sign_search"}
)
COUNT_STRATEGIES: frozenset[str] = frozenset({"bias_count", "weight_count"})
"""The strategies that need :class:`~lightning_fl.attacks.label_counts.DummyStatistics` of the model."""


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


def last_layer_bias_name(model: nn.Module, *, weight_name: str) -> str | None:
    """Name of the bias beside the classifier weight ``weight_name``, or ``None`` when it has none.

    Example:
        >>> last_layer_bias_name(nn.Linear(4, 3), weight_name="weight")
        'bias'
    """
    prefix = weight_name.removesuffix("weight")
    return f"{prefix}bias" if f"{prefix}bias" in dict(model.named_parameters()) else None


def infer_labels(
    last_layer_gradient: Tensor,
    *,
    num_images: int,
    strategy: LabelStrategy = "idlg",
    bias_gradient: Tensor | None = None,
    dummy: DummyStatistics | None = None,
    impact: LabelImpact | None = None,
) -> Tensor:
    r"""Infer the labels of a batch from the gradient :math:`\nabla W` of the last linear layer, shape ``(K, D)``.

    Strategies (the ranking rules assume non-negative penultimate features, e.g. the sigmoid LeNet):

    - ``"idlg"``: iDLG (Zhao et al., arXiv:2001.02610, Sec. 3.1): the label of one image is the row with a
      negative sum, :math:`\arg\min_c \sum_j \nabla W_{c,j}`. Inferred, for B > 1: the B rows with the most
      negative sums (the negative-row-sum heuristic), which assumes distinct labels.
    - ``"yin"``: GradInversion (Yin et al., CVPR 2021, Eq. 6): the B rows with the smallest minimum entry;
      distinct labels.
    - ``"llg"``: LLG (Wainakh et al., PoPETs 2022, "LLG-simple"): every class with a negative row sum is present;
      the impact :math:`m = \frac{1}{B}(1 + \frac{1}{K}) \sum_{c: s_c < 0} s_c` is subtracted from a class's sum
      each time it is chosen, and the remaining labels are the repeatedly most negative sums, so repeated
      labels can be recovered.
    - ``"llg_plus"``: LLG+ (Wainakh et al., Sec. 4): the same extraction with the impact and the offset of absent
      classes measured on the model with batches of known labels (:mod:`~lightning_fl.attacks.label_impact`);
      needs ``impact``.
    - ``"bias_count"``: Geng et al. (arXiv:2110.09074, Sec. 3.1): the count of class c is
      :math:`n_c = B(\bar p_c - \partial L/\partial b_c)`, exact up to the batch-mean softmax output
      :math:`\bar p`, which is estimated on dummy inputs (:mod:`~lightning_fl.attacks.label_counts`); needs
      ``bias_gradient`` and ``dummy``. Holds for repeated labels and features of any sign.
    - ``"weight_count"``: the same count from the weight gradient's row sums, for a classifier without a bias
      (Geng et al., Sec. 3.1), with the dummies' mean feature sum; needs ``dummy``.
    - ``"sign_search"``: the classes present are the rows with a negative entry (the sign evidence of iDLG and
      Yin et al.), how often each occurs is left to a search: the first of :func:`sign_search_candidates`, whose
      other candidates a gradient-matching attack tries in its restarts.

    The gradient is of the loss averaged over the batch. A multi-step update is :math:`-\eta \sum_t g_t`: pass its
    pseudo-gradient averaged over the steps, :math:`-\Delta W / (\eta T)` (the ranking rules are scale-invariant).

    Args:
        last_layer_gradient: :math:`\nabla W` of the classifier weight, ``(K, D)``.
        num_images: batch size B (public metadata).
        strategy: one of :data:`LABEL_STRATEGIES`.
        bias_gradient: :math:`\nabla b` of the classifier bias ``(K,)`` (``"bias_count"``).
        dummy: the model's statistics on dummy inputs (the count strategies).
        impact: LLG+'s measurements of the model (``"llg_plus"``).

    Returns:
        ``(B,)`` integer labels (sorted by evidence, not in batch order).

    Raises:
        ValueError: on an unknown strategy, B > K for a strategy that assumes distinct labels, or a count strategy
            without its inputs.

    Example:
        >>> import torch
        >>> grad = torch.tensor([[0.2, 0.1], [-0.5, -0.4], [0.3, 0.2]])
        >>> infer_labels(grad, num_images=1)
        tensor([1])
    """
    if strategy not in LABEL_STRATEGIES:
        raise ValueError(f"label strategy {strategy!r} is unknown; use one of {sorted(LABEL_STRATEGIES)}.")
    if last_layer_gradient.ndim != 2:
        raise ValueError(f"expected the last layer's weight gradient (K, D), got shape {last_layer_gradient.shape}.")
    num_classes = last_layer_gradient.shape[0]
    if strategy == "sign_search":
        return sign_search_candidates(last_layer_gradient, num_images=num_images, limit=1)[0]
    if strategy in ("idlg", "yin") and num_images > num_classes:
        raise ValueError(
            f"label strategy {strategy!r} assumes distinct labels but num_images={num_images} > {num_classes} "
            "classes; use strategy='llg'."
        )
    if strategy in COUNT_STRATEGIES:
        if dummy is None or (strategy == "bias_count" and bias_gradient is None):
            needs = "bias_gradient and dummy" if strategy == "bias_count" else "dummy"
            raise ValueError(
                f"label strategy {strategy!r} needs {needs} (see lightning_fl.attacks.label_counts); for a "
                "classifier without a bias use strategy='weight_count'."
            )
        bias = bias_gradient if strategy == "bias_count" else None
        counts, least = label_counts(
            weight_gradient=last_layer_gradient, bias_gradient=bias, num_images=num_images, dummy=dummy
        )
        return counts_to_labels(counts, num_images=num_images, least=least)
    grad = last_layer_gradient.detach().double()
    if strategy == "idlg":
        return grad.sum(1).argsort()[:num_images]
    if strategy == "yin":
        return grad.amin(1).argsort()[:num_images]
    sums = grad.sum(1)
    if strategy == "llg_plus":
        if impact is None:
            raise ValueError(
                "label strategy 'llg_plus' needs impact=label_impact(model, ...) (lightning_fl.attacks.label_impact)."
            )
        return llg_labels(sums, num_images=num_images, impact=impact.at(num_images), offset=impact.offset)
    batch_impact = float(sums.clamp(max=0).sum()) * (1 + 1 / num_classes) / num_images
    return llg_labels(sums, num_images=num_images, impact=batch_impact)


def sign_search_candidates(last_layer_gradient: Tensor, *, num_images: int, limit: int) -> Tensor:
    r"""Label multisets ``(n, B)``, ``n <= limit``, that hold exactly the classes present in a batch, most plausible
    first: the candidates of the label search (``label_strategy="sign_search"``).

    A class absent from the batch has the weight-gradient row :math:`\sum_b p_{b,c} h_b`, with no negative entry
    when the penultimate features :math:`h_b` are non-negative (ReLU or sigmoid networks; over a multi-step update
    too, as a sum of such rows); a present class's row has the negative term :math:`-\sum_{b: y_b = c} h_b`. So the
    present classes are the rows whose smallest entry is below -1 % of the most negative row's (the sign evidence
    of iDLG, Zhao et al. 2020, and of GradInversion's Eq. 6, Yin et al. CVPR 2021, which keep B such rows and so
    assume distinct labels). How often each present class occurs is what the sign does not tell: every way of
    giving the other B - m labels to the m present classes is a candidate, those that give them to the rows with
    the most negative entries first (at most B of the most negative rows count as present, at least one). A rule
    for small batches with few repeats: with many images per class, or dense features whose positive terms outweigh
    a class's one negative term, the count rules are better (docs/attacks.md, "Label inference").

    Example:
        >>> grad = torch.tensor([[0.2, 0.1], [-0.5, 0.4], [0.3, 0.2], [0.1, -0.9]])
        >>> sign_search_candidates(grad, num_images=3, limit=4)
        tensor([[1, 3, 3],
                [1, 1, 3]])
    """
    minima = last_layer_gradient.detach().double().amin(1)
    ranked = minima.argsort()
    present = ranked[minima[ranked] < 0.01 * minima.min().clamp(max=0)][:num_images]
    present = present if len(present) else ranked[:1]
    extras = combinations_with_replacement(range(len(present)), num_images - len(present))
    sets = [torch.cat([present, present[list(extra)]]).sort().values for extra in islice(extras, limit)]
    return torch.stack(sets)
