"""A user's own ReLU + BatchNorm classifier, written as a Lightning user writes one (issue 30's victim).

Two convolution-BatchNorm-ReLU-max-pool blocks and a linear layer, 17.8 k parameters at 32x32 RGB and 9 classes:
nothing of lightning-fl in it. docs/attacks.md, "A user's ReLU + BatchNorm net", attacks it with
``configs/inverting_gradients_full.yaml`` given on the command line:

``PYTHONPATH=benchmarks lightning-fl attack -c configs/inverting_gradients_full.yaml --model user_convnet.UserConvNet``
"""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn


class UserConvNet(L.LightningModule):
    """Conv(3->w)-BN-ReLU-pool, Conv(w->3w/2)-BN-ReLU-pool, Linear; SGD.

    Args:
        num_classes: outputs of the linear layer.
        width: channels of the first convolution (the second has ``3 * width // 2``).
        lr: SGD step size.

    Example:
        >>> UserConvNet()(torch.zeros(2, 3, 32, 32)).shape
        torch.Size([2, 9])
    """

    def __init__(self, num_classes: int = 9, width: int = 16, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        wide = 3 * width // 2
        blocks = [
            [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2)]
            for cin, cout in ((3, width), (width, wide))
        ]
        self.features = nn.Sequential(*blocks[0], *blocks[1])
        self.classifier = nn.Linear(wide * 8 * 8, num_classes)  # 32x32 in, two 2x2 pools

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> None:
        x, y = batch
        self.log("val_accuracy", (self(x).argmax(1) == y).float().mean())

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> None:
        x, y = batch
        self.log("test_accuracy", (self(x).argmax(1) == y).float().mean())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
