"""The ReLU + BatchNorm ConvNet of the gradient-inversion literature, at a width that trains and is attacked on a CPU.

Shape of Geiping et al.'s ``ConvNet`` (``inversefed``/breaching, NeurIPS 2020, Sec. 5): eight 3x3
convolution-BatchNorm-ReLU layers of widths w, 2w, 2w, 4w, 4w, 4w | pool | 4w, 4w | pool, then one linear layer. The
papers use w = 64 (2.9 M parameters); ``width`` scales it.
"""

from __future__ import annotations

import itertools

from torch import Tensor, nn

__all__ = ["ConvNet", "conv_bn_pool", "conv_bn_small"]


class ConvNet(nn.Module):
    """Eight conv-BatchNorm-ReLU layers and a linear classifier (Geiping et al., 2020, the ``ConvNet`` of breaching).

    Args:
        width: channels of the first layer ``w``; later layers have ``2w`` and ``4w`` (64 in the papers).
        in_channels: image channels.
        num_classes: output classes.
        image_size: input height and width (the two 3x3 max-pools divide it by 9).

    Raises:
        ValueError: when ``width < 1`` or ``image_size < 9``.

    Example:
        >>> import torch
        >>> ConvNet(width=4, num_classes=9)(torch.zeros(2, 3, 32, 32)).shape
        torch.Size([2, 9])
    """

    def __init__(self, width: int = 16, in_channels: int = 3, num_classes: int = 10, image_size: int = 32) -> None:
        super().__init__()
        if width < 1 or image_size < 9:
            raise ValueError(f"ConvNet(width={width}, image_size={image_size}) needs width >= 1 and image_size >= 9.")
        widths = [in_channels, width, 2 * width, 2 * width, 4 * width, 4 * width, 4 * width]
        layers: list[nn.Module] = []
        for cin, cout in itertools.pairwise(widths):
            layers += [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]
        layers.append(nn.MaxPool2d(3))
        for _ in range(2):
            layers += [nn.Conv2d(4 * width, 4 * width, 3, padding=1), nn.BatchNorm2d(4 * width), nn.ReLU()]
        layers.append(nn.MaxPool2d(3))
        self.features = nn.Sequential(*layers)
        side = image_size // 3 // 3
        self.classifier = nn.Linear(4 * width * side * side, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x).flatten(1))


def conv_bn_pool(in_channels: int = 3, num_classes: int = 10, image_size: int = 32, width: int = 16) -> nn.Sequential:
    """Two 3x3 convolution-BatchNorm-ReLU-2x2-max-pool blocks of ``width`` and ``3 * width // 2`` channels and a
    linear classifier: the small ReLU + BatchNorm net a practitioner writes first (issue 30's victim), on which
    ``configs/inverting_gradients_full.yaml``'s prior weights were chosen.

    Raises:
        ValueError: when ``width < 2`` or ``image_size`` is not a multiple of 4.

    Example:
        >>> import torch
        >>> conv_bn_pool(3, 9, 32)(torch.zeros(2, 3, 32, 32)).shape
        torch.Size([2, 9])
    """
    if width < 2 or image_size % 4:
        raise ValueError(f"conv_bn_pool(width={width}, image_size={image_size}): width >= 2, image_size % 4 == 0.")
    wide = 3 * width // 2
    return nn.Sequential(
        nn.Conv2d(in_channels, width, 3, padding=1),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(width, wide, 3, padding=1),
        nn.BatchNorm2d(wide),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(wide * (image_size // 4) ** 2, num_classes),
    )


def conv_bn_small(in_channels: int = 1, num_classes: int = 10, image_size: int = 16) -> nn.Sequential:
    """Two 3x3 convolution-BatchNorm-ReLU layers of 16 channels (the second with stride 2) and a linear classifier:
    the small BatchNorm network on which See-Through-Gradients (Yin et al., CVPR 2021) is run at CPU budgets
    (``configs/see_through_gradients.yaml``).

    Example:
        >>> import torch
        >>> conv_bn_small(1, 10, 16)(torch.zeros(2, 1, 16, 16)).shape
        torch.Size([2, 10])
    """
    side = (image_size + 1) // 2
    return nn.Sequential(
        nn.Conv2d(in_channels, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1, stride=2),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(16 * side * side, num_classes),
    )
