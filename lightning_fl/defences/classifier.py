"""Model-level defences: the retrofit base, DefendedClassifier, and loading a defended model's checkpoint."""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import torch
from torch import nn

from lightning_fl.models.classifier import ImageClassifier

__all__ = ["DefendedClassifier", "ModelDefence", "load_defended"]

ModelT = TypeVar("ModelT", bound=nn.Module)


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


def load_defended(
    model_class: type[ModelT],
    checkpoint_path: str | Path,
    *,
    defences: Sequence[Callable[[nn.Module], nn.Module]],
    map_location: str | torch.device | None = "cpu",
    **init_kwargs: Any,
) -> ModelT:
    """Restore a model that was retrofitted with defences (passports, key-locks) from its Lightning checkpoint.

    ``MyNet.load_from_checkpoint`` cannot do it: it builds a plain ``MyNet``, whose layers no longer match the
    checkpoint's passport or key-lock layers. This builds ``model_class`` from the checkpoint's saved
    hyper-parameters (and ``init_kwargs``), applies ``defences`` in order, exactly as before training (the same
    retrofits with the same options: ``add_passports``, ``Passports(...)``, ``KeyLocks(...)``,
    ``functools.partial(add_keylock, ...)``), calls ``on_load_checkpoint`` and loads every tensor strictly, private
    ones (passports, keys, locks) included. The file is read with ``torch.load(weights_only=True)``.

    Args:
        model_class: the user's own class (a ``LightningModule`` or any ``nn.Module``).
        checkpoint_path: a checkpoint written by Lightning (``ModelCheckpoint``, ``trainer.save_checkpoint``).
        defences: the retrofits applied to the model before training, in the same order.
        map_location: where tensors are loaded.
        init_kwargs: constructor arguments that override (or replace missing) saved hyper-parameters.

    Raises:
        ValueError: if the file is not a Lightning checkpoint, or the rebuilt model's tensors do not match it
            (the message lists the first missing and unexpected keys).

    Example:
        >>> import lightning as L, tempfile, os
        >>> from lightning_fl.defences import Passports
        >>> from lightning_fl.models import ImageClassifier
        >>> model = Passports(num_convs=1)(ImageClassifier("lenet_dlg", in_channels=1))
        >>> trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False)
        >>> trainer.strategy.connect(model)
        >>> path = os.path.join(tempfile.mkdtemp(), "defended.ckpt")
        >>> trainer.save_checkpoint(path)
        >>> restored = load_defended(ImageClassifier, path, defences=[Passports(num_convs=1)])
        >>> type(restored.backbone.body[0]).__name__
        'PassportConv2d'
    """
    checkpoint = torch.load(checkpoint_path, map_location=map_location, weights_only=True)
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise ValueError(
            f"load_defended: {checkpoint_path} is not a Lightning checkpoint (no 'state_dict'); save it with "
            "trainer.save_checkpoint(path) or ModelCheckpoint."
        )
    model = model_class(**_init_arguments(model_class, {**checkpoint.get("hyper_parameters", {}), **init_kwargs}))
    for defence in defences:
        model = defence(model)
    if hasattr(model, "on_load_checkpoint"):
        model.on_load_checkpoint(checkpoint)
    missing, unexpected = model.load_state_dict(checkpoint["state_dict"], strict=False)
    if missing or unexpected:
        raise ValueError(
            f"load_defended: {model_class.__name__} with defences {list(defences)} does not match the checkpoint "
            f"(missing {missing[:4]}, unexpected {unexpected[:4]}); pass the retrofits, in order and with the "
            "options, used before training."
        )
    return model


def _init_arguments(model_class: type, hparams: dict[str, Any]) -> dict[str, Any]:
    """The saved hyper-parameters that ``model_class.__init__`` accepts (all of them if it takes ``**kwargs``)."""
    parameters = inspect.signature(model_class.__init__).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return dict(hparams)
    names = {p.name for p in parameters}
    return {k: v for k, v in hparams.items() if k in names}
