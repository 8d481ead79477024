"""DefendedClassifier: an ImageClassifier whose backbone is retrofitted with model-level defences."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Literal

from torch import nn

from lightning_fl.models.classifier import ImageClassifier

__all__ = ["DefendedClassifier", "ModelDefence"]


class ModelDefence(ABC):
    """A retrofit: called on a backbone, changes it in place (private layers, passports, key-locks) and returns it.

    Subclasses (:class:`~lightning_fl.defences.Passports`, :class:`~lightning_fl.defences.KeyLocks`,
    :class:`~lightning_fl.defences.PrivateSplit`) hold the options and delegate to a retrofit function; being
    classes, they can be chosen in YAML with ``class_path``/``init_args``.
    """

    @abstractmethod
    def __call__(self, model: nn.Module) -> nn.Module:
        """Apply this retrofit to ``model`` in place and return it."""


class DefendedClassifier(ImageClassifier):
    """:class:`~lightning_fl.models.ImageClassifier` with ``defences`` applied to its backbone, in order.

    The YAML form of "drop a defence into your model"; in Python, calling the retrofit helpers
    (``add_passports(model)``, ``add_keylock(model)``, ``split_private(model)``) on any module does the same.

    Args:
        backbone: a backbone name (see :data:`~lightning_fl.models.BACKBONES`) or a module.
        defences: retrofits applied to the backbone, in order.
        num_classes: output classes (linked from the data in the CLI).
        in_channels: image channels (linked from the data in the CLI).
        image_size: input side length (linked from the data in the CLI).
        input_mean: per-channel mean subtracted in ``forward``.
        input_std: per-channel standard deviation divided in ``forward``.
        optimizer: ``"adam"`` or ``"sgd"``.
        lr: learning rate.
        momentum: SGD momentum.
        weight_decay: L2 penalty.

    Example:
        >>> from lightning_fl.defences import KeyLocks
        >>> model = DefendedClassifier("lenet_dlg", defences=[KeyLocks(key_length=32)], in_channels=1)
        >>> type(model.backbone.body[0][1]).__name__
        'KeyLockNorm2d'
    """

    def __init__(
        self,
        backbone: str | nn.Module = "lenet_dlg",
        *,
        defences: Sequence[ModelDefence] = (),
        num_classes: int = 10,
        in_channels: int = 1,
        image_size: int = 32,
        input_mean: Sequence[float] | None = None,
        input_std: Sequence[float] | None = None,
        optimizer: Literal["adam", "sgd"] = "adam",
        lr: float = 2e-3,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(
            backbone,
            num_classes=num_classes,
            in_channels=in_channels,
            image_size=image_size,
            input_mean=input_mean,
            input_std=input_std,
            optimizer=optimizer,
            lr=lr,
            momentum=momentum,
            weight_decay=weight_decay,
        )
        for defence in defences:
            self.backbone = defence(self.backbone)
