"""A user's own LightningModule, written without lightning-fl in mind (BoringModel style)."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn


class UserNet(L.LightningModule):
    """A small CNN that logs its loss as ``loss`` and its accuracy as ``acc``; nothing from lightning-fl."""

    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 16, lr: float = 0.1) -> None:
        super().__init__()
        self.lr = lr
        self.features = nn.Sequential(nn.Conv2d(in_channels, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Linear(8 * (image_size // 2) ** 2, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("loss", loss, on_epoch=True, on_step=False)
        return loss

    def test_step(self, batch, batch_idx: int) -> None:
        x, y = batch
        self.log("acc", (self(x).argmax(1) == y).float().mean())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)
