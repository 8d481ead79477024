"""A multilayer perceptron on flattened images: the victim of the analytic attacks on fully connected layers."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from torch import Tensor, nn

__all__ = ["MLP"]


class MLP(nn.Module):
    """Flatten, then fully connected layers with ReLU between them (Phong et al., 2017, Sec. 3's perceptron setting).

    Args:
        in_channels: image channels.
        num_classes: output classes.
        image_size: input side length.
        hidden: widths of the hidden layers.

    Example:
        >>> import torch
        >>> MLP(in_channels=1, num_classes=10, image_size=8)(torch.zeros(2, 1, 8, 8)).shape
        torch.Size([2, 10])
    """

    def __init__(
        self, in_channels: int = 1, num_classes: int = 10, image_size: int = 32, hidden: Sequence[int] = (256,)
    ) -> None:
        super().__init__()
        widths = [in_channels * image_size * image_size, *hidden]
        layers: list[nn.Module] = [nn.Flatten()]
        for width_in, width_out in itertools.pairwise(widths):
            layers += [nn.Linear(width_in, width_out), nn.ReLU()]
        layers.append(nn.Linear(widths[-1], num_classes))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)
