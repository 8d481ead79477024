"""Restore a model retrofitted with model-level defences (passports, key-locks) from its Lightning checkpoint."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from lightning_fl.defences.base import Defence, apply_defences

__all__ = ["load_defended"]

ModelT = TypeVar("ModelT", bound=nn.Module)


def load_defended(
    model_class: type[ModelT],
    checkpoint_path: str | Path,
    *,
    defences: Sequence[Defence],
    map_location: str | torch.device | None = "cpu",
    **init_kwargs: Any,
) -> ModelT:
    """Restore a model that was retrofitted with defences (passports, key-locks) from its Lightning checkpoint.

    ``MyNet.load_from_checkpoint`` cannot do it: it builds a plain ``MyNet``, whose layers no longer match the
    checkpoint's passport or key-lock layers. This builds ``model_class`` from the checkpoint's saved
    hyper-parameters (and ``init_kwargs``), applies the model layers of ``defences`` in order, exactly as before
    training (the same bundles with the same options: ``Passports(...)``, ``KeyLocks(...)``), calls
    ``on_load_checkpoint`` and loads every tensor strictly, private ones (passports, keys, locks) included. The
    file is read with ``torch.load(weights_only=True)``.

    Args:
        model_class: the user's own class (a ``LightningModule`` or any ``nn.Module``).
        checkpoint_path: a checkpoint written by Lightning (``ModelCheckpoint``, ``trainer.save_checkpoint``).
        defences: the defence bundles applied to the model before training, in the same order.
        map_location: where tensors are loaded.
        init_kwargs: constructor arguments that override (or replace missing) saved hyper-parameters.

    Raises:
        ValueError: if the file is not a Lightning checkpoint, or the rebuilt model's tensors do not match it
            (the message lists the first missing and unexpected keys).

    Example:
        >>> import lightning as L, tempfile, os
        >>> from lightning_fl.defences import Passports
        >>> from lightning_fl.models import ImageClassifier
        >>> model = Passports(num_convs=1).apply_to_model(ImageClassifier("lenet_dlg", in_channels=1))
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
    apply_defences(model, defences)
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
