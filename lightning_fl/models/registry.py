"""Backbones by name: one dict, one Literal (strings become objects here and nowhere else)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from torch import nn

from lightning_fl.models.cifar import AlexNetCIFAR, resnet18, resnet20, resnet32, vgg16
from lightning_fl.models.convnet import ConvNet, conv_bn_pool, conv_bn_small
from lightning_fl.models.lenet import LeNet5, LeNetDLG
from lightning_fl.models.mlp import MLP

__all__ = ["BACKBONES", "BackboneName", "build_backbone"]

BackboneName = Literal[
    "lenet_dlg",
    "convnet",
    "convnet_small",
    "conv_bn_small",
    "conv_bn_pool",
    "lenet5",
    "mlp",
    "alexnet",
    "resnet18",
    "resnet18_cifar",
    "resnet20",
    "resnet32",
    "vgg16",
]

BACKBONES: dict[str, Callable[[int, int, int], nn.Module]] = {
    "lenet_dlg": lambda c, k, s: LeNetDLG(in_channels=c, num_classes=k, image_size=s),
    "lenet5": lambda c, k, s: LeNet5(in_channels=c, num_classes=k, image_size=s),
    "mlp": lambda c, k, s: MLP(in_channels=c, num_classes=k, image_size=s),
    "convnet": lambda c, k, s: ConvNet(width=16, in_channels=c, num_classes=k, image_size=s),
    "convnet_small": lambda c, k, s: ConvNet(width=8, in_channels=c, num_classes=k, image_size=s),
    "conv_bn_small": lambda c, k, s: conv_bn_small(in_channels=c, num_classes=k, image_size=s),
    "conv_bn_pool": lambda c, k, s: conv_bn_pool(in_channels=c, num_classes=k, image_size=s),
    "alexnet": lambda c, k, s: AlexNetCIFAR(in_channels=c, num_classes=k),
    "resnet18": lambda c, k, s: resnet18(in_channels=c, num_classes=k),
    "resnet18_cifar": lambda c, k, s: resnet18(in_channels=c, num_classes=k, cifar_stem=True),
    "resnet20": lambda c, k, s: resnet20(in_channels=c, num_classes=k),
    "resnet32": lambda c, k, s: resnet32(in_channels=c, num_classes=k),
    "vgg16": lambda c, k, s: vgg16(in_channels=c, num_classes=k),
}


def build_backbone(name: str, *, in_channels: int, num_classes: int, image_size: int = 32) -> nn.Module:
    """Build the backbone called ``name``.

    Raises:
        ValueError: for an unknown name, listing the known ones.

    Example:
        >>> type(build_backbone("lenet_dlg", in_channels=1, num_classes=10)).__name__
        'LeNetDLG'
    """
    if name not in BACKBONES:
        raise ValueError(f"model.backbone={name!r} is unknown; use one of {sorted(BACKBONES)} or pass a module.")
    return BACKBONES[name](in_channels, num_classes, image_size)
