"""FederatedDataModule: one dataset split across N clients, with per-client loaders and a global test loader."""

from __future__ import annotations

from functools import cached_property
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader

from lightning_fl.datamodules.datasets import ImageTensorDataset, load_dataset
from lightning_fl.datamodules.partitioners import PARTITIONERS, PartitionName, partition
from lightning_fl.messages import GroundTruth

__all__ = ["FederatedDataModule"]


class FederatedDataModule:
    """Split a dataset across ``num_clients`` clients; give each its own train/validation loaders.

    Not a ``LightningDataModule``: there is one of these for the whole federation, and it hands each
    client's own ``lightning.Trainer`` the loaders of that client. Data is held in memory as tensors,
    so per-client loaders are built once and reused every round.

    Args:
        dataset: a dataset name (``digits`` default, ``lfw_faces``, ``mnist``, ``fashion_mnist``,
            ``cifar10``, ``cifar100``, ``lfw``) or an ImageFolder directory; see
            :func:`~lightning_fl.datamodules.datasets.load_dataset`.
        num_clients: number of clients N.
        partition: ``iid``, ``dirichlet`` (label skew), ``shards`` (McMahan) or ``label_buckets`` (2DP-FL).
        alpha: Dirichlet concentration (``partition="dirichlet"``); smaller is more skewed.
        shards_per_client: shards per client (``partition="shards"``).
        overlapping_buckets: 2DP-FL's overlapping bucket scheme (``partition="label_buckets"``).
        val_fraction: share of each client's samples held out as its validation set (used by PoGZ,
            FedBoosting and early stopping; 0 disables).
        batch_size: local mini-batch size for training.
        eval_batch_size: batch size of validation and test loaders.
        image_size: side length images are resized to (``None`` keeps the native size).
        channels: force 1 or 3 channels (``None`` keeps the native count).
        root: where torchvision datasets are stored / downloaded.
        download: allow torchvision downloads.
        seed: seed of the partition and of the validation split.

    Raises:
        ValueError: on an unknown dataset or partition, or a split that cannot be made (see messages).

    Example:
        >>> dm = FederatedDataModule("digits", num_clients=4, partition="iid", image_size=16)
        >>> dm.num_classes, dm.input_shape, sum(dm.num_train_samples(k) for k in range(4))
        (10, (1, 16, 16), 1296)
    """

    def __init__(
        self,
        dataset: str = "digits",
        *,
        num_clients: int = 10,
        partition: PartitionName = "dirichlet",
        alpha: float = 0.5,
        shards_per_client: int = 2,
        overlapping_buckets: bool = False,
        val_fraction: float = 0.1,
        batch_size: int = 32,
        eval_batch_size: int = 512,
        image_size: int | None = 32,
        channels: int | None = None,
        root: str | None = None,
        download: bool = True,
        seed: int = 0,
    ) -> None:
        if not 0.0 <= val_fraction < 1.0:
            raise ValueError(f"data.val_fraction={val_fraction} must be in [0, 1).")
        if batch_size < 1 or eval_batch_size < 1:
            raise ValueError(f"data.batch_size={batch_size} and data.eval_batch_size must be >= 1.")
        if num_clients < 1:
            raise ValueError(f"data.num_clients={num_clients} must be >= 1.")
        if partition not in PARTITIONERS:
            raise ValueError(f"data.partition={partition!r} is unknown; use one of {sorted(PARTITIONERS)}.")
        if partition == "dirichlet" and alpha <= 0:
            raise ValueError(f"data.alpha={alpha} must be > 0 (the Dirichlet concentration; 0.5 is common).")
        if partition == "shards" and shards_per_client < 1:
            raise ValueError(f"data.shards_per_client={shards_per_client} must be >= 1.")
        self.dataset = dataset
        self.num_clients = num_clients
        self.partition = partition
        self.alpha = alpha
        self.shards_per_client = shards_per_client
        self.overlapping_buckets = overlapping_buckets
        self.val_fraction = val_fraction
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.image_size = image_size
        self.channels = channels
        self.root = root
        self.download = download
        self.seed = seed

    # -- data ------------------------------------------------------------------------------------------
    def _load(self, train: bool) -> ImageTensorDataset:
        return load_dataset(
            self.dataset,
            train=train,
            root=self.root,
            image_size=self.image_size,
            channels=self.channels,
            download=self.download,
        )

    @cached_property
    def train_set(self) -> ImageTensorDataset:
        """The whole training split (all clients together)."""
        return self._load(train=True)

    @cached_property
    def test_set(self) -> ImageTensorDataset:
        """The global test split, used to evaluate the global model."""
        return self._load(train=False)

    @cached_property
    def client_indices(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per client, ``(train_indices, val_indices)`` into :attr:`train_set`."""
        parts = partition(
            self.train_set.labels.numpy(),
            scheme=self.partition,
            num_clients=self.num_clients,
            seed=self.seed,
            alpha=self.alpha,
            shards_per_client=self.shards_per_client,
            overlapping_buckets=self.overlapping_buckets,
        )
        rng = np.random.default_rng(self.seed + 1)
        splits = []
        for k, idx in enumerate(parts):
            if len(idx) == 0:
                raise ValueError(f"client {k} received no samples; lower data.num_clients or change the partition.")
            shuffled = rng.permutation(idx)
            n_val = int(len(idx) * self.val_fraction) if len(idx) > 1 else 0
            splits.append((np.sort(shuffled[n_val:]), np.sort(shuffled[:n_val])))
        return splits

    def setup(self) -> None:
        """Load the data and make the split now (otherwise it happens on first use)."""
        _ = self.client_indices, self.test_set

    @property
    def num_classes(self) -> int:
        return self.train_set.num_classes

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return tuple(self.train_set.images.shape[1:])  # type: ignore[return-value]

    @cached_property
    def input_stats(self) -> tuple[list[float], list[float]]:
        """Per-channel mean and standard deviation of the training images (for model-side standardisation)."""
        images, _ = self.train_set.tensors()
        return images.mean(dim=(0, 2, 3)).tolist(), images.std(dim=(0, 2, 3)).clamp_min(1e-6).tolist()

    @property
    def model_options(self) -> dict[str, Any]:
        """What a model needs to know about the data: ``num_classes``, ``in_channels``, ``image_size``,
        ``input_mean``, ``input_std`` (the keyword arguments of :class:`~lightning_fl.models.ImageClassifier`).

        Example:
            >>> sorted(FederatedDataModule("digits", num_clients=2, image_size=16).model_options)
            ['image_size', 'in_channels', 'input_mean', 'input_std', 'num_classes']
        """
        mean, std = self.input_stats
        return {
            "num_classes": self.num_classes,
            "in_channels": self.input_shape[0],
            "image_size": self.input_shape[-1],
            "input_mean": mean,
            "input_std": std,
        }

    def _check_client(self, client_id: int) -> None:
        if not 0 <= client_id < self.num_clients:
            raise IndexError(f"client_id={client_id} is out of range for data.num_clients={self.num_clients}.")

    def client_train_set(self, client_id: int) -> ImageTensorDataset:
        self._check_client(client_id)
        return self._client_sets[client_id][0]

    def client_val_set(self, client_id: int) -> ImageTensorDataset:
        self._check_client(client_id)
        return self._client_sets[client_id][1]

    @cached_property
    def _client_sets(self) -> list[tuple[ImageTensorDataset, ImageTensorDataset]]:
        return [(self.train_set.subset(tr), self.train_set.subset(va)) for tr, va in self.client_indices]

    def num_train_samples(self, client_id: int) -> int:
        return len(self.client_train_set(client_id))

    # -- loaders ---------------------------------------------------------------------------------------
    def train_dataloader(self, client_id: int, *, seed: int = 0) -> DataLoader:
        """Shuffled training loader of one client; ``seed`` fixes the shuffle order."""
        ds = self.client_train_set(client_id)
        return DataLoader(
            ds,
            batch_size=min(self.batch_size, len(ds)),
            shuffle=True,
            generator=torch.Generator().manual_seed(seed),
        )

    def val_dataloader(self, client_id: int) -> DataLoader:
        return DataLoader(self.client_val_set(client_id), batch_size=self.eval_batch_size)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.test_set, batch_size=self.eval_batch_size)

    def ground_truth(self, client_id: int, max_items: int | None = None) -> GroundTruth:
        """The client's local training samples, for scoring attacks only."""
        images, labels = self.client_train_set(client_id).tensors()
        return GroundTruth(images[:max_items].clone(), labels[:max_items].clone())

    def sample_batch(self, client_id: int, batch_size: int, *, seed: int = 0) -> tuple[Tensor, Tensor]:
        """A reproducible batch of distinct samples from one client (used by attack demos)."""
        ds = self.client_train_set(client_id)
        idx = torch.randperm(len(ds), generator=torch.Generator().manual_seed(seed))[:batch_size]
        images, labels = ds.subset(idx).tensors()
        return images, labels
