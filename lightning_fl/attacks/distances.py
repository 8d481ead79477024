"""Gradient distances of the gradient-matching attacks: DLG's squared Euclidean and Inverting Gradients' cosine."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from torch import Tensor

__all__ = ["DISTANCES", "DistanceName", "cosine_distance", "euclidean_distance"]

DistanceName = Literal["euclidean", "cosine"]


def euclidean_distance(*, candidate: Sequence[Tensor], target: Sequence[Tensor]) -> Tensor:
    r"""DLG's gradient distance :math:`\sum_l \|\nabla W'_l - \nabla W_l\|^2` (Zhu et al., 2019, Eq. 4).

    Example:
        >>> import torch
        >>> euclidean_distance(candidate=[torch.ones(2)], target=[torch.zeros(2)])
        tensor(2.)
    """
    return sum(((c - t) ** 2).sum() for c, t in zip(candidate, target, strict=True))


def cosine_distance(*, candidate: Sequence[Tensor], target: Sequence[Tensor]) -> Tensor:
    r"""Inverting Gradients' distance :math:`1 - \langle g', g\rangle / (\|g'\|\,\|g\|)` over all layers together.

    Implements the data term of Eq. (4) of Geiping et al. (NeurIPS 2020): the gradients of all matched layers are
    one vector (as ``inversefed.reconstruction_costs(cost_fn="sim")`` computes it), so the loss is invariant to the
    gradient's magnitude.

    Example:
        >>> import torch
        >>> cosine_distance(candidate=[torch.tensor([2.0, 0.0])], target=[torch.tensor([1.0, 0.0])])
        tensor(0.)
    """
    dot = sum((c * t).sum() for c, t in zip(candidate, target, strict=True))
    norm_c = sum(c.pow(2).sum() for c in candidate).sqrt()
    norm_t = sum(t.pow(2).sum() for t in target).sqrt()
    return 1 - dot / (norm_c * norm_t).clamp_min(1e-12)


DISTANCES: dict[str, Callable[..., Tensor]] = {"euclidean": euclidean_distance, "cosine": cosine_distance}
