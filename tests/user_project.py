"""A user's own Lightning project, written as a new user would: a DataModule over sklearn's digits and a small
LightningModule that logs its own loss and test accuracy. Shared by the datamodule and defence tests."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset


def digits_tensors(*, images: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """sklearn's 1,797 real 8x8 digits in [0, 1], as ``(N, 1, 8, 8)`` images (or ``(N, 64)`` rows) and labels."""
    x, y = load_digits(return_X_y=True)
    inputs = torch.tensor(x, dtype=torch.float32) / 16.0
    return (inputs.view(-1, 1, 8, 8) if images else inputs), torch.tensor(y, dtype=torch.long)


class DigitsPairs(Dataset):
    """A user's own map-style Dataset that hides its labels (no ``.targets``): samples are ``(x, y)`` pairs."""

    def __init__(self, inputs: torch.Tensor, labels: torch.Tensor) -> None:
        self._inputs, self._labels = inputs, labels

    def __len__(self) -> int:
        return len(self._labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self._inputs[index], int(self._labels[index])


class DigitsDataModule(L.LightningDataModule):
    """A user's DataModule: 1,500 training and 297 test digits, images ``(1, 8, 8)``."""

    def __init__(self, batch_size: int = 64) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.train_set: Dataset | None = None
        self.test_set: Dataset | None = None

    def setup(self, stage: str) -> None:
        x, y = digits_tensors()
        self.train_set, self.test_set = TensorDataset(x[:1500], y[:1500]), TensorDataset(x[1500:], y[1500:])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.test_set, batch_size=256)


class _LogsLossAndAccuracy(L.LightningModule):
    """The steps a user's classifier writes: cross-entropy logged as ``train_loss``, ``test_acc`` on test batches."""

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def test_step(self, batch, batch_idx: int) -> None:
        x, y = batch
        self.log("test_acc", (self(x).argmax(1) == y).float().mean())


class DigitsNet(_LogsLossAndAccuracy):
    """A user's LightningModule (BoringModel style): a small CNN that logs ``train_loss`` and ``test_acc``."""

    def __init__(self, lr: float = 0.05, channels: int = 8) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.features = nn.Sequential(nn.Conv2d(1, channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Linear(channels * 16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


class DigitsSplit(Dataset):
    """A user's Dataset built from a config (``class_path`` + ``init_args``): the first 1,500 digits or the rest."""

    def __init__(self, train: bool = True) -> None:
        x, y = digits_tensors()
        self.inputs, self.labels = (x[:1500], y[:1500]) if train else (x[1500:], y[1500:])

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[index], self.labels[index]


class PhotoNet(_LogsLossAndAccuracy):
    """A user's RGB classifier as the issue's user wrote it: two conv-BatchNorm-ReLU-pool blocks and a linear layer
    (optionally a dropout before it), for 32x32 colour tiles."""

    def __init__(self, num_classes: int = 9, width: int = 16, dropout: float = 0.0, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        block = [nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2)]
        block += [nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(), nn.MaxPool2d(2)]
        self.features = nn.Sequential(*block)
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(dropout), nn.Linear(2 * width * 64, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
