"""Image priors of the gradient-matching attacks: total variation (Inverting Gradients)."""

from __future__ import annotations

from torch import Tensor

__all__ = ["TotalVariation", "total_variation"]


def total_variation(images: Tensor) -> Tensor:
    r"""Anisotropic total variation: mean absolute difference of vertical plus horizontal neighbours.

    The image prior of Inverting Gradients (Geiping et al., 2020, Eq. 4; ``inversefed.metrics.total_variation``).

    Example:
        >>> import torch
        >>> total_variation(torch.tensor([[[[0.0, 1.0], [0.0, 1.0]]]]))
        tensor(1.)
    """
    dy = (images[..., 1:, :] - images[..., :-1, :]).abs().mean()
    dx = (images[..., :, 1:] - images[..., :, :-1]).abs().mean()
    return dx + dy


class TotalVariation:
    """Total-variation regulariser :math:`\\alpha\\,TV(x)` (Geiping et al., 2020, Eq. 4).

    Args:
        weight: :math:`\\alpha`, must be >= 0.
    """

    def __init__(self, weight: float) -> None:
        if weight < 0:
            raise ValueError(f"TotalVariation(weight={weight}) must be >= 0.")
        self.weight = weight

    def __call__(self, images: Tensor) -> Tensor:
        return self.weight * total_variation(images)

    def __repr__(self) -> str:
        return f"TotalVariation(weight={self.weight})"
