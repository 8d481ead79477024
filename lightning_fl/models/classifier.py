"""ImageClassifier: a LightningModule that wraps any backbone with loss, optimiser and accuracy."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy

from lightning_fl.models.registry import build_backbone
from lightning_fl.validation import check_learning_rate

__all__ = ["ImageClassifier"]


class ImageClassifier(L.LightningModule):
    """Cross-entropy image classifier around any backbone; images enter in [0, 1].

    Standardisation with ``input_mean``/``input_std`` happens inside ``forward`` (non-persistent buffers), so
    data stay in [0, 1] everywhere: attacks reconstruct and are scored in image space while the backbone
    still sees standardised pixels (the sigmoid LeNet trains only on standardised inputs).

    Args:
        backbone: a backbone name (see :data:`~lightning_fl.models.registry.BACKBONES`) or a module.
        num_classes: output classes (linked from the data in the CLI).
        in_channels: image channels (linked from the data in the CLI).
        image_size: input side length (linked from the data in the CLI).
        input_mean: per-channel mean subtracted in ``forward``; ``None`` for no standardisation.
        input_std: per-channel standard deviation divided in ``forward``.
        standardize: ``False`` ignores ``input_mean``/``input_std`` (even when the CLI links them) so the backbone
            sees [0, 1] pixels, as the victims of DLG and iDLG do (their code feeds ``ToTensor()`` images).
        optimizer: ``"adam"`` or ``"sgd"``.
        lr: learning rate.
        momentum: SGD momentum.
        weight_decay: L2 penalty.

    Example:
        >>> model = ImageClassifier("lenet_dlg", num_classes=10, in_channels=1)
        >>> model(torch.rand(2, 1, 32, 32)).shape
        torch.Size([2, 10])
    """

    def __init__(
        self,
        backbone: str | nn.Module = "lenet_dlg",
        *,
        num_classes: int = 10,
        in_channels: int = 1,
        image_size: int = 32,
        input_mean: Sequence[float] | None = None,
        input_std: Sequence[float] | None = None,
        standardize: bool = True,
        optimizer: Literal["adam", "sgd"] = "adam",
        lr: float = 2e-3,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__()
        if optimizer not in ("adam", "sgd"):
            raise ValueError(f"model.optimizer={optimizer!r} is unknown; use 'adam' or 'sgd'.")
        check_learning_rate(lr)
        for name, value in (("momentum", momentum), ("weight_decay", weight_decay)):
            if not 0 <= value < math.inf:
                raise ValueError(f"model.init_args.{name}={value} must be a finite number >= 0 (e.g. 0.9 or 0).")
        self.save_hyperparameters(ignore=["backbone"] if isinstance(backbone, nn.Module) else None)
        self.backbone = (
            backbone
            if isinstance(backbone, nn.Module)
            else build_backbone(backbone, in_channels=in_channels, num_classes=num_classes, image_size=image_size)
        )
        self.num_classes = num_classes
        self.optimizer_name, self.lr, self.momentum, self.weight_decay = optimizer, lr, momentum, weight_decay
        if not standardize:
            input_mean = input_std = None
        mean = torch.tensor(input_mean if input_mean is not None else [0.0] * in_channels).view(1, -1, 1, 1)
        std = torch.tensor(input_std if input_std is not None else [1.0] * in_channels).view(1, -1, 1, 1)
        self.register_buffer("input_mean", mean, persistent=False)
        self.register_buffer("input_std", std, persistent=False)
        self._loss_sum, self._loss_count = torch.zeros(()), 0
        self.val_acc = MulticlassAccuracy(num_classes=num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes=num_classes, average="micro")

    def forward(self, x: Tensor) -> Tensor:
        return self.backbone((x - self.input_mean) / self.input_std)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        # summed here and logged once per epoch: ``self.log`` costs ~2 ms a call, as much as a LeNet step; an empty
        # (Poisson-sampled, DP-SGD) batch has no loss to add (its mean is NaN)
        if len(y):
            self._loss_sum, self._loss_count = self._loss_sum + loss.detach() * len(y), self._loss_count + len(y)
        return loss

    def per_example_loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        """The cross-entropy of each example of ``batch``: ``training_step``'s loss is its mean (the contract of the
        vectorised client fit, :mod:`lightning_fl.federation.vectorised_contract`)."""
        x, y = batch
        return F.cross_entropy(self(x), y, reduction="none")

    def on_train_epoch_start(self) -> None:
        self._loss_sum, self._loss_count = torch.zeros((), device=self.device), 0

    def on_train_epoch_end(self) -> None:
        if self._loss_count:
            self.log("train_loss", self._loss_sum / self._loss_count)

    def _eval_step(self, batch: tuple[Tensor, Tensor], stage: str, metric: MulticlassAccuracy) -> None:
        x, y = batch
        logits = self(x)
        metric.update(logits, y)
        self.log(f"{stage}_loss", F.cross_entropy(logits, y), batch_size=len(y))
        self.log(f"{stage}_acc", metric, batch_size=len(y))

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "val", self.val_acc)

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "test", self.test_acc)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        params = [p for p in self.parameters() if p.requires_grad]
        if self.optimizer_name == "sgd":
            return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)
        return torch.optim.Adam(params, lr=self.lr, weight_decay=self.weight_decay)
