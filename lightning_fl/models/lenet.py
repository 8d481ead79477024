"""LeNet variants: the sigmoid LeNet of the gradient-leakage papers, and LeNet-5."""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["LeNet5", "LeNetDLG"]


class LeNetDLG(nn.Module):
    """The LeNet of DLG (Zhu et al., NeurIPS 2019) and iDLG (Zhao et al., 2020): 3 conv layers, sigmoid.

    Three 5x5 convolutions of 12 channels (strides 2, 2, 1, padding 2), each followed by a sigmoid, then
    one linear layer. Sigmoid (not ReLU) keeps the network twice differentiable everywhere, which the
    L-BFGS gradient-matching attacks rely on. The original code initialises every weight and bias from
    U(-0.5, 0.5) (``uniform_init=True``, the default, as the DLG and GRNN code do); the thesis' FedKL
    experiments use PyTorch's default initialisation (``uniform_init=False``).

    Args:
        in_channels: image channels (1 or 3).
        num_classes: output classes.
        image_size: input side length; sets the width of the linear layer (12 * (size/4)^2).
        uniform_init: draw all weights from U(-0.5, 0.5) as the DLG code does.

    Example:
        >>> LeNetDLG(in_channels=1, num_classes=10)(torch.zeros(2, 1, 32, 32)).shape
        torch.Size([2, 10])
    """

    def __init__(
        self, in_channels: int = 3, num_classes: int = 10, image_size: int = 32, uniform_init: bool = True
    ) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, 12, kernel_size=5, padding=2, stride=2),
            nn.Sigmoid(),
            nn.Conv2d(12, 12, kernel_size=5, padding=2, stride=2),
            nn.Sigmoid(),
            nn.Conv2d(12, 12, kernel_size=5, padding=2, stride=1),
            nn.Sigmoid(),
        )
        side = (image_size + 3) // 4
        self.fc = nn.Linear(12 * side * side, num_classes)
        if uniform_init:
            for p in self.parameters():
                nn.init.uniform_(p, -0.5, 0.5)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.body(x).flatten(1))


class LeNet5(nn.Module):
    """LeNet-5 (LeCun et al., 1998) with ReLU and max pooling, for 28x28 or 32x32 inputs.

    Example:
        >>> LeNet5(in_channels=3, num_classes=100)(torch.zeros(1, 3, 32, 32)).shape
        torch.Size([1, 100])
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 32) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 6, kernel_size=5, padding=2 if image_size == 28 else 0),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, kernel_size=5),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        side = ((image_size + (4 if image_size == 28 else 0) - 4) // 2 - 4) // 2
        self.classifier = nn.Sequential(
            nn.Linear(16 * side * side, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))
