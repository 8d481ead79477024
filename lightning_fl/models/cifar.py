"""CIFAR-sized networks: AlexNet for 32x32, ResNet-20/32 (He et al., 2016, Sec. 4.2), and adapters of
torchvision's ResNet-18 (ImageNet or 32x32 stem) and VGG-16 for any channel and class count."""

from __future__ import annotations

from torch import Tensor, nn
from torchvision import models as tv

__all__ = ["AlexNetCIFAR", "CifarResNet", "resnet18", "resnet20", "resnet32", "vgg16"]


class AlexNetCIFAR(nn.Module):
    """AlexNet scaled to 32x32 inputs (five convolutions, three linear layers), as in FL benchmarks.

    Example:
        >>> import torch
        >>> AlexNetCIFAR(3, 10)(torch.zeros(1, 3, 32, 32)).shape
        torch.Size([1, 10])
    """

    def __init__(self, in_channels: int = 3, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 64, 3, stride=2, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(64, 192, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(192, 384, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(256, 256, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Dropout(),
            nn.Linear(256 * 4, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(),
            nn.Linear(4096, 4096),
            nn.ReLU(inplace=True),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x).flatten(1))


class _BasicBlock(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )
        self.relu = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet for 32x32 images (He et al., CVPR 2016, Sec. 4.2): 6n+2 layers in three stages of 16/32/64.

    Uses projection (1x1 conv) shortcuts where the shape changes.

    Args:
        depth: 6n + 2 (20, 32, 44, 56, 110).
        in_channels: image channels.
        num_classes: output classes.
    """

    def __init__(self, depth: int = 20, in_channels: int = 3, num_classes: int = 10) -> None:
        super().__init__()
        if (depth - 2) % 6:
            raise ValueError(f"CifarResNet(depth={depth}) must be 6n+2 (20, 32, 44, 56, 110).")
        n = (depth - 2) // 6
        self.conv1 = nn.Conv2d(in_channels, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU()
        layers, in_planes = [], 16
        for stage, planes in enumerate((16, 32, 64)):
            for block in range(n):
                stride = 2 if stage > 0 and block == 0 else 1
                layers.append(_BasicBlock(in_planes, planes, stride))
                in_planes = planes
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        out = self.layers(self.relu(self.bn1(self.conv1(x))))
        return self.fc(self.pool(out).flatten(1))


def resnet20(in_channels: int = 3, num_classes: int = 10) -> CifarResNet:
    """ResNet-20 for 32x32 inputs."""
    return CifarResNet(20, in_channels, num_classes)


def resnet32(in_channels: int = 3, num_classes: int = 10) -> CifarResNet:
    """ResNet-32 for 32x32 inputs."""
    return CifarResNet(32, in_channels, num_classes)


def resnet18(in_channels: int = 3, num_classes: int = 10, *, cifar_stem: bool = False) -> nn.Module:
    """torchvision's ResNet-18 (untrained) with its first convolution adapted to ``in_channels``.

    ``cifar_stem`` replaces the ImageNet stem (7x7 stride-2 convolution and max-pool, which leave a 32x32 image 1x1
    before the last stage) with one 3x3 stride-1 convolution and no pool: the ResNet-18 of the 32x32 gradient-
    inversion experiments (Geiping et al., NeurIPS 2020, Sec. 5; Huang et al., NeurIPS 2021, Sec. 3).

    Example:
        >>> import torch
        >>> net = resnet18(num_classes=9, cifar_stem=True)
        >>> net.conv1.stride, type(net.maxpool).__name__, net(torch.zeros(2, 3, 32, 32)).shape
        ((1, 1), 'Identity', torch.Size([2, 9]))
    """
    net = tv.resnet18(weights=None, num_classes=num_classes)
    if cifar_stem:
        net.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        net.maxpool = nn.Identity()
    elif in_channels != 3:
        net.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return net


def vgg16(in_channels: int = 3, num_classes: int = 10) -> nn.Module:
    """torchvision's VGG-16 (untrained) with its first convolution adapted to ``in_channels``."""
    net = tv.vgg16(weights=None, num_classes=num_classes)
    if in_channels != 3:
        net.features[0] = nn.Conv2d(in_channels, 64, kernel_size=3, padding=1)
    return net
