"""What the loop needs from a user's ``LightningModule``, checked before any training, with the fix in the error.

The contract (any ``LightningModule`` meets it without subclassing anything):

1. ``training_step`` logs the training loss under ``loop.train_loss_key`` (``"train_loss"`` by default) with
   ``self.log(...)``; the loop reports its mean over clients. A model that logs nothing still trains; the
   round's ``train_loss`` is then ``None`` and a warning names the logged keys.
2. ``configure_optimizers`` returns one optimiser (or a dict/list with one); its first parameter group's
   ``lr`` is reported as public metadata (attacks that replay local steps need it).
3. Batches are ``(inputs, targets, ...)``. For another structure (dicts, several inputs) define
   ``fl_split_batch(self, batch) -> tuple[Tensor, Tensor]`` on the module: the hook that tells the loop
   which part is the input and which the label, for the type-2 leak point's ground truth and its metadata.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import lightning as L
import torch
from torch import Tensor

__all__ = ["check_model", "check_model_takes_inputs", "check_train_loss_key", "split_batch"]


def check_model(model: object) -> None:
    """Raise at loop construction when ``model`` cannot be a client model, saying how to fix it.

    Raises:
        TypeError: if ``model`` is not a ``LightningModule`` or does not define ``training_step`` or
            ``configure_optimizers``.
    """
    if not isinstance(model, L.LightningModule):
        raise TypeError(
            f"FederatedLoop(model=...) got a {type(model).__name__}; wrap your torch module in a "
            "lightning.LightningModule with training_step and configure_optimizers."
        )
    for hook in ("training_step", "configure_optimizers"):
        if getattr(type(model), hook) is getattr(L.LightningModule, hook):
            raise TypeError(
                f"{type(model).__name__} does not define {hook}; every client trains it with its own Lightning "
                f"Trainer, which calls {hook}. Add it (and log the loss with self.log('train_loss', loss))."
            )


def check_train_loss_key(
    model: L.LightningModule, loader: Iterable[Any], *, key: str, trainer_options: dict[str, Any]
) -> None:
    """Train a copy of ``model`` for one step on one batch of ``loader``, so a ``loop.train_loss_key`` the model
    never logs fails before training. A model that logs nothing in ``training_step`` is left alone (contract 1),
    and so is one whose step fails here without the clients' callbacks: the run itself reports that.

    Raises:
        KeyError: naming ``loop.train_loss_key``, the keys ``training_step`` logged and the fix.
    """
    from lightning_fl.trainers import build_trainer, quiet_lightning

    options = {**trainer_options, "limit_train_batches": 1}
    with quiet_lightning():
        trainer = build_trainer(options, max_steps=1, max_epochs=1)
        try:
            trainer.fit(copy.deepcopy(model), train_dataloaders=loader)
        except Exception:  # e.g. a step that needs a defence's client callbacks: the run reports it, not this check
            return
    logged = sorted(trainer.callback_metrics)
    if logged and key not in logged:
        raise KeyError(
            f"loop.train_loss_key={key!r} was not logged by {type(model).__name__}.training_step; logged: {logged}. "
            f"HINT: set loop.train_loss_key to the loss's name or log it with self.log({key!r}, loss)."
        )


def check_model_takes_inputs(model: L.LightningModule, loader: Iterable[Any]) -> None:
    """Run a copy of ``model`` (eval mode, no gradients) on the inputs of one batch of ``loader``, so a model built
    for other inputs than the data's (image size, channels) fails before training with the shape and the fix. A
    model without ``forward`` (it trains through ``training_step`` alone) is left alone.

    Raises:
        ValueError: naming the model, the inputs' shape, the error and the fix.
    """
    inputs, _ = split_batch(model, next(iter(loader)))
    try:
        with torch.no_grad():
            copy.deepcopy(model).eval()(inputs)
    except NotImplementedError:
        return
    except RuntimeError as err:
        reason = " ".join(str(err).split())[:200]
        raise ValueError(
            f"model {type(model).__name__} does not take the data's inputs of shape {tuple(inputs.shape)} "
            f"({reason}); set data.image_size / data.channels to what the model expects, or build the model for "
            "those inputs."
        ) from None


def split_batch(model: Any, batch: Any) -> tuple[Tensor, Tensor]:
    """``(inputs, targets)`` of one batch: ``model.fl_split_batch(batch)`` if defined, else ``batch[0], batch[1]``.

    Raises:
        TypeError: if the batch is not a sequence of at least two tensors and the model has no ``fl_split_batch``.
    """
    hook = getattr(model, "fl_split_batch", None)
    if callable(hook):
        return hook(batch)
    if isinstance(batch, list | tuple) and len(batch) >= 2 and all(isinstance(b, Tensor) for b in batch[:2]):
        return batch[0], batch[1]
    raise TypeError(
        f"{type(model).__name__} trains on batches of type {type(batch).__name__}; the loop reads (inputs, targets) "
        "from them. Define fl_split_batch(self, batch) -> (inputs, targets) on the module."
    )
