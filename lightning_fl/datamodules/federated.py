"""FederatedDataModule: one dataset split across N clients, with per-client loaders and a global test loader."""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Subset

from lightning_fl.datamodules.datasets import TORCHVISION_DATASETS, ImageTensorDataset, load_dataset
from lightning_fl.datamodules.partitioners import PARTITIONERS, PartitionName, dataset_labels, partition
from lightning_fl.messages import GroundTruth

__all__ = ["NAME_ONLY_KEYS", "DataSource", "FederatedDataModule", "check_name_only_keys"]

DEFAULT_BATCH_SIZE = 32
"""Local batch size when neither ``data.batch_size`` nor a ``LightningDataModule`` gives one."""
DEFAULT_IMAGE_SIZE = 32
"""Side length that named datasets and ImageFolders are resized to by default."""

NAME_ONLY_KEYS = ("image_size", "channels", "root")
"""``data`` keys that say how a dataset name or ImageFolder path is read (resized, its channels, its folder). A
``Dataset`` or ``LightningDataModule`` is used as it is, so one of them given with it is refused
(:func:`check_name_only_keys`) rather than ignored. ``download`` is not one: it only permits a download, and a
DataModule that reads its own files asks for none."""


def check_name_only_keys(dataset: object, given: Mapping[str, Any]) -> None:
    """Refuse a key of :data:`NAME_ONLY_KEYS` that ``given`` sets (to anything but ``None``) when ``dataset`` is not
    a dataset name or ImageFolder path: it would be ignored.

    Args:
        dataset: ``data.dataset``, built (a ``Dataset``, a ``LightningDataModule``) or as a config writes it (a
            name, a path, a ``class_path`` mapping).
        given: the ``data`` keys the config or the command line gives (not the defaults).

    Raises:
        ValueError: one line naming the key, the data set and the fix.

    Example:
        >>> check_name_only_keys("digits", {"image_size": 16, "root": None})
        >>> check_name_only_keys({"class_path": "my.DataModule"}, {"image_size": None})
        >>> check_name_only_keys({"class_path": "my.DataModule"}, {"image_size": 32})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: data.image_size=32 applies to dataset names and ImageFolder paths; data.dataset is my.DataModule...
    """
    if isinstance(dataset, str | Path):
        return
    key = next((k for k in NAME_ONLY_KEYS if given.get(k) is not None), None)
    if key is None:
        return
    entry = dataset.get("class_path") if isinstance(dataset, Mapping) else getattr(dataset, "class_path", None)
    name = entry or type(dataset).__name__  # a config entry's class, or the built object's
    raise ValueError(
        f"data.{key}={given.get(key)!r} applies to dataset names and ImageFolder paths; data.dataset is {name}, "
        f"which is used as it is: drop data.{key} or set it to null (--data.{key} null), and resize or locate the "
        "data in its own code."
    )


DataSource = L.LightningDataModule | Dataset | str | Path
"""What a federation can be built from: a dataset name or ImageFolder path, any ``Dataset`` of ``(x, y)`` samples,
or a user's ``LightningDataModule``. The classes come first so that a config writes a chosen class back as
``class_path``/``init_args`` (a ``str`` first would write its ``Namespace(...)`` text, which does not load)."""


class FederatedDataModule:
    """Split a dataset across ``num_clients`` clients; give each its own train/validation loaders.

    Not a ``LightningDataModule``: there is one of these for the whole federation, and it hands each
    client's own ``lightning.Trainer`` the loaders of that client. Per-client datasets are built once and
    reused every round. The partitioners see only the labels (read without loading samples where the
    dataset allows: ``.targets``, ``.labels``, a ``TensorDataset``'s second tensor, a ``Subset`` of those).

    Args:
        dataset: what to split (see :data:`DataSource`):

            * a dataset name (``digits`` default, ``lfw_faces``, ``mnist``, ``fashion_mnist``, ``cifar10``,
              ``cifar100``, ``lfw``) or an ImageFolder directory; see
              :func:`~lightning_fl.datamodules.datasets.load_dataset`;
            * any ``torch.utils.data.Dataset`` of ``(x, y)`` samples with integer labels ``y``; its global
              test set is ``test_dataset``;
            * a user's ``LightningDataModule``: ``prepare_data()`` and ``setup("fit")`` are called and its
              ``train_dataloader().dataset`` is split; ``setup("test")`` and ``test_dataloader().dataset``
              (else ``val_dataloader().dataset``) give the global test set.
        num_clients: number of clients N.
        partition: ``iid``, ``dirichlet`` (label skew), ``shards`` (McMahan) or ``label_buckets`` (2DP-FL).
        alpha: Dirichlet concentration (``partition="dirichlet"``); smaller is more skewed.
        shards_per_client: shards per client (``partition="shards"``).
        overlapping_buckets: 2DP-FL's overlapping bucket scheme (``partition="label_buckets"``).
        val_fraction: share of each client's samples held out as its validation set (used by PoGZ,
            FedBoosting and early stopping; 0 disables).
        batch_size: local mini-batch size for training; ``None``: a ``LightningDataModule``'s own (its
            ``train_dataloader().batch_size``), else 32.
        eval_batch_size: batch size of validation and test loaders.
        image_size: side length images are resized to (``None`` keeps the native size); names and
            ImageFolder paths only: a ``Dataset`` or ``LightningDataModule`` is used as it is, and another value
            than the default is refused for them.
        channels: force 1 or 3 channels (``None`` keeps the native count); names and ImageFolder paths only.
        root: where torchvision datasets are stored / downloaded.
        download: allow torchvision downloads.
        test_dataset: the global test set when ``dataset`` is a ``Dataset`` (``None``: no global evaluation;
            set ``FederatedLoop(eval_every=0)``).
        seed: seed of the partition and of the validation split.

    Raises:
        TypeError: if ``dataset`` is none of the accepted kinds.
        ValueError: on an unknown dataset or partition, a ``LightningDataModule`` without a train set, or a
            split that cannot be made (see messages).

    Example:
        >>> dm = FederatedDataModule("digits", num_clients=4, partition="iid", image_size=16)
        >>> dm.num_classes, dm.input_shape, sum(dm.num_train_samples(k) for k in range(4))
        (10, (1, 16, 16), 1296)
        >>> from torch.utils.data import TensorDataset
        >>> xs, ys = torch.rand(40, 3), torch.arange(40) % 2
        >>> dm = FederatedDataModule(TensorDataset(xs, ys), num_clients=2, partition="iid", val_fraction=0.0)
        >>> dm.num_classes, dm.input_shape, dm.num_train_samples(0)
        (2, (3,), 20)
    """

    def __init__(
        self,
        dataset: DataSource = "digits",
        *,
        num_clients: int = 10,
        partition: PartitionName = "dirichlet",
        alpha: float = 0.5,
        shards_per_client: int = 2,
        overlapping_buckets: bool = False,
        val_fraction: float = 0.1,
        batch_size: int | None = None,
        eval_batch_size: int = 512,
        image_size: int | None = DEFAULT_IMAGE_SIZE,
        channels: int | None = None,
        root: str | None = None,
        download: bool = True,
        test_dataset: Dataset | None = None,
        seed: int = 0,
    ) -> None:
        if not isinstance(dataset, (str, Path, Dataset, L.LightningDataModule)):
            raise TypeError(
                f"data.dataset is a {type(dataset).__name__}; pass a dataset name, an ImageFolder path, a "
                "torch.utils.data.Dataset of (x, y) samples or a LightningDataModule."
            )
        if test_dataset is not None and not isinstance(dataset, Dataset):
            raise ValueError(
                "data.test_dataset is only used with a Dataset `dataset`; names, folders and LightningDataModules "
                "bring their own test set."
            )
        # the default image size cannot be told from one given: the commands check what their config gives
        shown = {"image_size": None if image_size == DEFAULT_IMAGE_SIZE else image_size}
        check_name_only_keys(dataset, {**shown, "channels": channels, "root": root})
        if not 0.0 <= val_fraction < 1.0:
            raise ValueError(f"data.val_fraction={val_fraction} must be in [0, 1).")
        if (batch_size is not None and batch_size < 1) or eval_batch_size < 1:
            raise ValueError(f"data.batch_size={batch_size} and data.eval_batch_size must be >= 1.")
        if num_clients < 1:
            raise ValueError(f"data.num_clients={num_clients} must be >= 1.")
        if partition not in PARTITIONERS:
            raise ValueError(f"data.partition={partition!r} is unknown; use one of {sorted(PARTITIONERS)}.")
        if partition == "dirichlet" and not (math.isfinite(alpha) and alpha > 0):
            raise ValueError(
                f"data.alpha={alpha} must be a finite number > 0 (the Dirichlet concentration; 0.5 is common, "
                "partition: iid for no label skew)."
            )
        if image_size is not None and image_size < 1:
            raise ValueError(f"data.image_size={image_size} must be >= 1 (the resized side length; null keeps it).")
        if partition == "shards" and shards_per_client < 1:
            raise ValueError(f"data.shards_per_client={shards_per_client} must be >= 1.")
        _check_root(dataset, root, download=download)
        self.dataset = str(dataset) if isinstance(dataset, Path) else dataset
        self.num_clients = num_clients
        self.partition = partition
        self.alpha = alpha
        self.shards_per_client = shards_per_client
        self.overlapping_buckets = overlapping_buckets
        self.val_fraction = val_fraction
        self._batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.image_size = image_size
        self.channels = channels
        self.root = root
        self.download = download
        self.test_dataset = test_dataset
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
    def _sources(self) -> tuple[Dataset, Dataset | None]:
        """``(train, test)`` datasets; ``test`` is ``None`` when the source has none."""
        if isinstance(self.dataset, str):
            return self._load(train=True), self._load(train=False)
        if isinstance(self.dataset, L.LightningDataModule):
            return _datamodule_sets(self.dataset)
        return self.dataset, self.test_dataset

    @property
    def batch_size(self) -> int:
        """The local batch size: ``data.batch_size``, else a ``LightningDataModule``'s own, else 32."""
        if self._batch_size is not None:
            return self._batch_size
        if isinstance(self.dataset, L.LightningDataModule):
            return self._own_batch_size
        return DEFAULT_BATCH_SIZE

    @cached_property
    def _own_batch_size(self) -> int:
        self._sources  # noqa: B018 -- setup("fit") first, as a Trainer would
        loader = self.dataset.train_dataloader()
        return int(getattr(loader, "batch_size", None) or DEFAULT_BATCH_SIZE)

    @property
    def train_set(self) -> Dataset:
        """The whole training split (all clients together)."""
        return self._sources[0]

    @property
    def test_set(self) -> Dataset:
        """The global test split, used to evaluate the global model.

        Raises:
            ValueError: if the source has no test set (say which argument supplies one).
        """
        test = self._sources[1]
        if test is None:
            raise ValueError(
                f"data.dataset ({type(self.dataset).__name__}) has no test set for global evaluation; pass "
                "data.test_dataset=..., give the LightningDataModule a test_dataloader(), or set loop.eval_every=0."
            )
        return test

    @property
    def has_test_set(self) -> bool:
        """Whether a global test set exists (names, folders: always; a ``Dataset``: when ``test_dataset`` is set)."""
        return self._sources[1] is not None

    @cached_property
    def train_labels(self) -> np.ndarray:
        """Integer label of every training sample (what the partitioners split on)."""
        return dataset_labels(self.train_set)

    @cached_property
    def client_indices(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per client, ``(train_indices, val_indices)`` into :attr:`train_set`."""
        parts = partition(
            self.train_labels,
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
        _ = self.client_indices, self._sources

    @property
    def num_classes(self) -> int:
        """Number of classes: the dataset's own count (``num_classes``, ``classes``) or the largest label + 1."""
        train = self.train_set
        if isinstance(train, ImageTensorDataset):
            return train.num_classes
        if hasattr(train, "classes"):
            return len(train.classes)
        return int(self.train_labels.max()) + 1

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one input sample, e.g. ``(C, H, W)`` for images."""
        train = self.train_set
        if isinstance(train, ImageTensorDataset):
            return tuple(train.pixels.shape[1:])
        return tuple(torch.as_tensor(train[0][0]).shape)

    @cached_property
    def input_stats(self) -> tuple[list[float], list[float]]:
        """Per-channel mean and standard deviation of the training images (for model-side standardisation).

        Raises:
            ValueError: if the samples are not images ``(C, H, W)``.
        """
        if len(self.input_shape) != 3:
            raise ValueError(
                f"data.dataset samples have shape {self.input_shape}, not images (C, H, W); input_stats and "
                "model_options describe image data: build your own model for these inputs."
            )
        if isinstance(self.train_set, ImageTensorDataset):
            images, _ = self.train_set.tensors()
            return images.mean(dim=(0, 2, 3)).tolist(), images.std(dim=(0, 2, 3)).clamp_min(1e-6).tolist()
        count, total, squares = 0, 0.0, 0.0
        for images, _ in DataLoader(self.train_set, batch_size=self.eval_batch_size):
            images = images.double()
            count += images.numel() // images.shape[1]
            total = total + images.sum(dim=(0, 2, 3))
            squares = squares + images.pow(2).sum(dim=(0, 2, 3))
        mean = total / count
        std = (squares / count - mean.pow(2)).clamp_min(0.0).mul(count / max(count - 1, 1)).sqrt()
        return mean.float().tolist(), std.clamp_min(1e-6).float().tolist()

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

    def client_train_set(self, client_id: int) -> Dataset:
        self._check_client(client_id)
        return self._client_sets[client_id][0]

    def client_val_set(self, client_id: int) -> Dataset:
        self._check_client(client_id)
        return self._client_sets[client_id][1]

    def _subset(self, indices: np.ndarray) -> Dataset:
        if isinstance(self.train_set, ImageTensorDataset):
            return self.train_set.subset(indices)
        return Subset(self.train_set, indices.tolist())

    @cached_property
    def _client_sets(self) -> list[tuple[Dataset, Dataset]]:
        return [(self._subset(tr), self._subset(va)) for tr, va in self.client_indices]

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
        images, labels = _stack(self.client_train_set(client_id), max_items)
        return GroundTruth(images.clone(), labels.clone())

    def sample_batch(self, client_id: int, batch_size: int, *, seed: int = 0) -> tuple[Tensor, Tensor]:
        """A reproducible batch of distinct samples from one client (used by attack demos)."""
        ds = self.client_train_set(client_id)
        idx = torch.randperm(len(ds), generator=torch.Generator().manual_seed(seed))[:batch_size]
        return _stack(Subset(ds, idx.tolist()), None)


def _check_root(dataset: object, root: str | None, *, download: bool) -> None:
    """``data.root`` names a folder, unless a torchvision download will create it (STYLE.md R3)."""
    if root is None or Path(root).is_dir():
        return
    if dataset in TORCHVISION_DATASETS:
        if download:
            return
        raise ValueError(
            f"data.root={root!r} is not a folder and data.download is false: set data.root to the folder that "
            f"holds the {dataset!r} files, or data.download: true."
        )
    raise ValueError(
        f"data.root={root!r} is not a folder, and data.dataset={str(dataset)!r} does not read it (only the "
        f"torchvision datasets {', '.join(TORCHVISION_DATASETS)} do): drop data.root, or fix the path."
    )


def _stack(dataset: Dataset, max_items: int | None) -> tuple[Tensor, Tensor]:
    """The first ``max_items`` samples of ``dataset`` as one ``(inputs, labels)`` pair of tensors."""
    if isinstance(dataset, ImageTensorDataset):
        images, labels = dataset.tensors()
        return images[:max_items], labels[:max_items]
    count = len(dataset) if max_items is None else min(max_items, len(dataset))
    samples = [dataset[i] for i in range(count)]
    inputs = torch.stack([torch.as_tensor(x) for x, _ in samples])
    return inputs, torch.as_tensor([int(y) for _, y in samples], dtype=torch.long)


def _loader_dataset(datamodule: L.LightningDataModule, hook: str) -> Dataset | None:
    """``datamodule.<hook>().dataset``, or ``None`` when the hook is not implemented."""
    try:
        loader = getattr(datamodule, hook)()
    except (MisconfigurationException, NotImplementedError):
        return None
    if isinstance(loader, (list, tuple)):
        loader = loader[0] if loader else None
    return getattr(loader, "dataset", None)


def _datamodule_sets(datamodule: L.LightningDataModule) -> tuple[Dataset, Dataset | None]:
    """Train and test datasets of a user's ``LightningDataModule``, prepared as a Trainer would."""
    name = type(datamodule).__name__
    datamodule.prepare_data()
    datamodule.setup("fit")
    train = _loader_dataset(datamodule, "train_dataloader")
    if train is None:
        raise ValueError(
            f"data.dataset={name} has no training set to split: its train_dataloader() must return a DataLoader "
            "over a map-style Dataset after setup('fit')."
        )
    datamodule.setup("test")
    test = _loader_dataset(datamodule, "test_dataloader") or _loader_dataset(datamodule, "val_dataloader")
    return train, test
