"""Label counts from the classifier's gradient with the softmax-mean correction (Geng et al., 2021).

For cross-entropy averaged over a batch of B inputs, the gradient of the classifier's bias is

.. math:: \\frac{\\partial L}{\\partial b_c} = \\bar p_c - \\frac{n_c}{B}, \\qquad
    \\bar p_c = \\frac{1}{B} \\sum_b p_{b,c},

so the number of inputs of class c is :math:`n_c = B(\\bar p_c - \\partial L / \\partial b_c)`: exact but for the
batch-mean softmax output :math:`\\bar p`, which the attacker estimates by feeding dummy inputs through the public
model. Without a bias, the row sums of the weight gradient, :math:`\\sum_j \\partial L / \\partial W_{c,j}
= \\frac{1}{B} \\sum_b (p_{b,c} - y_{b,c}) O_b` with :math:`O_b = \\sum_j h_{b,j}`, give the same count once
:math:`O_b` is replaced by the dummies' mean feature sum :math:`\\bar O`.

References:
    Geng, Mou, Li, Li, Xu, Lyu. Towards General Deep Leakage in Federated Learning. arXiv:2110.09074, 2021
    (Sec. 3.1, the label-count estimate from the last layer's gradients).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

__all__ = ["DummyStatistics", "counts_to_labels", "dummy_inputs", "dummy_statistics", "label_counts"]


@dataclass(frozen=True)
class DummyStatistics:
    """What the attacker estimates from dummy inputs through the public model.

    Args:
        mean_probabilities: :math:`\\bar p`, the mean softmax output ``(K,)``.
        mean_feature_sum: :math:`\\bar O`, the mean sum of the classifier's input features.
    """

    mean_probabilities: Tensor
    mean_feature_sum: float


def dummy_inputs(num_dummies: int, *, input_shape: Sequence[int], seed: int = 0) -> Tensor:
    """Dummy inputs in [0, 1] ``(num_dummies, *input_shape)``, drawn on the CPU: four equal groups of images with
    i.i.d. pixels :math:`u`, :math:`u^2`, :math:`u^3` and :math:`\\mathbb{1}[u < 0.3]` for :math:`u \\sim U(0, 1)`.

    Example:
        >>> dummy_inputs(8, input_shape=(1, 2, 2)).shape
        torch.Size([8, 1, 2, 2])
    """
    u = torch.rand(num_dummies, *input_shape, generator=torch.Generator().manual_seed(seed))
    group = num_dummies // 4
    return torch.cat(
        [u[:group], u[group : 2 * group] ** 2, u[2 * group : 3 * group] ** 3, (u[3 * group :] < 0.3).float()]
    )


def dummy_statistics(
    model: nn.Module, *, classifier_weight: str, input_shape: Sequence[int], num_dummies: int = 256, seed: int = 0
) -> DummyStatistics:
    """Estimate :math:`\\bar p` and :math:`\\bar O` on dummy inputs in [0, 1] (a copy of ``model``, no gradients).

    Inferred (the paper leaves the dummy distribution open): :func:`dummy_inputs`, so that dark, sparse images
    (digits) and mid-grey ones (photos) are both represented; docs/attacks.md compares the choices.

    Args:
        model: the public model (its train/eval mode is kept; the copy absorbs any running-statistics update).
        classifier_weight: the name of the classifier's weight, whose module's input are the features :math:`h`.
        input_shape: ``(C, H, W)`` of one input.
        num_dummies: dummy inputs in all.
        seed: seed of the dummy inputs (drawn on the CPU).

    Example:
        >>> net = nn.Sequential(nn.Flatten(), nn.Linear(4, 3), nn.Sigmoid(), nn.Linear(3, 2))
        >>> stats = dummy_statistics(net, classifier_weight="3.weight", input_shape=(1, 2, 2))
        >>> stats.mean_probabilities.shape, round(float(stats.mean_probabilities.sum()), 6)
        (torch.Size([2]), 1.0)
    """
    model = copy.deepcopy(model)
    reference = next(model.parameters())
    dummies = dummy_inputs(num_dummies, input_shape=input_shape, seed=seed)
    features: list[Tensor] = []
    module = model.get_submodule(classifier_weight.rpartition(".")[0])
    handle = module.register_forward_hook(lambda _module, inputs, _output: features.append(inputs[0]))
    try:
        with torch.no_grad():
            logits = model(dummies.to(reference.device, reference.dtype))
    finally:
        handle.remove()
    probabilities = torch.softmax(logits.double(), dim=-1).mean(0)
    return DummyStatistics(probabilities.cpu(), float(features[0].double().flatten(1).sum(1).mean()))


def label_counts(
    *, weight_gradient: Tensor, bias_gradient: Tensor | None, num_images: int, dummy: DummyStatistics
) -> tuple[Tensor, Tensor]:
    """Real-valued label counts :math:`n_c` ``(K,)`` of a batch of ``num_images`` (Geng et al., 2021, Sec. 3.1), and
    the least count each class certainly has.

    With ``bias_gradient``: :math:`n_c = B(\\bar p_c - \\partial L / \\partial b_c)`, and since
    :math:`\\bar p_c \\ge 0`, at least :math:`\\lceil -B\\, \\partial L / \\partial b_c \\rceil` (which makes one
    image's label exact, as iDLG's sign rule). Without: :math:`n_c = B(\\bar p_c - \\sum_j \\partial L /
    \\partial W_{c,j} / \\bar O)` and no least count. Both gradients are of the loss averaged over the batch.
    """
    mean_p = dummy.mean_probabilities.double()
    if bias_gradient is not None:
        bias = bias_gradient.detach().double().cpu()
        least = torch.ceil(-num_images * bias - 1e-6).clamp(min=0)
        return num_images * (mean_p - bias), least
    row_sums = weight_gradient.detach().double().cpu().sum(1)
    return num_images * (mean_p - row_sums / dummy.mean_feature_sum), torch.zeros_like(mean_p)


def counts_to_labels(counts: Tensor, *, num_images: int, least: Tensor | None = None) -> Tensor:
    """Round real-valued counts to ``num_images`` labels: the floors of the counts (at least ``least``, at least 0),
    then one more for the largest remainders (cycling over the classes again while more are missing than there are
    classes: counts far off, as on a trained model's update of many images), or, when the floors overshoot, one less
    for the smallest ones. Least counts that add up to more than ``num_images`` (a noised gradient) are ignored.

    Example:
        >>> counts_to_labels(torch.tensor([1.8, -0.1, 1.3, 0.4]), num_images=4)
        tensor([0, 0, 2, 3])
        >>> counts_to_labels(torch.tensor([1.8, -0.1, 1.3, 0.4]), num_images=4, least=torch.tensor([0, 1, 0, 0]))
        tensor([0, 0, 1, 2])
        >>> counts_to_labels(torch.tensor([9.0, -3.0]), num_images=1, least=torch.tensor([5, 0]))
        tensor([0])
        >>> counts_to_labels(torch.tensor([0.5, 0.2]), num_images=5)
        tensor([0, 0, 0, 1, 1])
    """
    counts = counts.double()
    least = torch.zeros_like(counts) if least is None else least.double()
    if least.sum() > num_images:  # a noised gradient (DP): the least counts are not certain, so none are kept
        least = torch.zeros_like(counts)
    whole = torch.maximum(counts.floor(), least).clamp(min=0)
    remainder = counts - whole
    missing = num_images - int(whole.sum())
    if missing > 0:
        order = remainder.argsort(descending=True).repeat(missing // len(counts) + 1)[:missing]
        whole += torch.bincount(order, minlength=len(counts)).double()
    for _ in range(-missing):
        whole[torch.where(whole > least, remainder, torch.inf).argmin()] -= 1
    return torch.repeat_interleave(torch.arange(len(counts)), whole.long())
