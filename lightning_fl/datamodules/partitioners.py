"""Partition sample indices across clients: iid, Dirichlet label skew, McMahan shards, 2DP-FL label buckets.

Every partitioner is a pure function of the labels, the client count and a seed: deterministic, and every
sample goes to exactly one client (except the 2DP-FL *overlapping* buckets, which the paper defines as
drawing from the whole training set; see :func:`label_bucket_partition`).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from torch.utils.data import ConcatDataset, Dataset, IterableDataset, Subset, TensorDataset

__all__ = [
    "PARTITIONERS",
    "PartitionName",
    "dataset_labels",
    "dirichlet_partition",
    "iid_partition",
    "label_bucket_partition",
    "partition",
    "shard_partition",
]

PartitionName = Literal["iid", "dirichlet", "shards", "label_buckets"]


def dataset_labels(dataset: Dataset) -> np.ndarray:
    """Integer label of every sample of ``dataset``, read without loading the samples where possible.

    Reads ``.labels`` (our :class:`~lightning_fl.datamodules.ImageTensorDataset`), ``.targets`` (torchvision),
    the second tensor of a ``TensorDataset``, and looks through ``Subset`` and ``ConcatDataset``; any other
    map-style dataset is indexed once, sample by sample, taking ``y`` of each ``(x, y)``.

    Raises:
        ValueError: for an ``IterableDataset`` (it cannot be split by index) or samples that are not ``(x, y)``
            pairs with an integer ``y``.

    Example:
        >>> from torch.utils.data import TensorDataset
        >>> dataset_labels(Subset(TensorDataset(torch.zeros(4, 2), torch.tensor([3, 1, 2, 0])), [1, 3]))
        array([1, 0])
    """
    if isinstance(dataset, IterableDataset):
        raise ValueError(
            f"data.dataset is an IterableDataset ({type(dataset).__name__}); federated partitioning needs a "
            "map-style Dataset (with __len__ and __getitem__)."
        )
    if isinstance(dataset, Subset):
        return dataset_labels(dataset.dataset)[np.asarray(dataset.indices, dtype=np.int64)]
    if isinstance(dataset, ConcatDataset):
        return np.concatenate([dataset_labels(part) for part in dataset.datasets])
    if isinstance(dataset, TensorDataset) and len(dataset.tensors) >= 2:
        return _as_label_array(dataset.tensors[1], dataset)
    for attribute in ("labels", "targets"):
        stored = getattr(dataset, attribute, None)
        if stored is not None and not callable(stored) and len(stored) == len(dataset):
            return _as_label_array(stored, dataset)
    labels = []
    for i in range(len(dataset)):
        sample = dataset[i]
        if not isinstance(sample, (tuple, list)) or len(sample) < 2:
            raise ValueError(
                f"data.dataset ({type(dataset).__name__}) sample {i} is a {type(sample).__name__}, not an (x, y) "
                "pair; return (input, label) from __getitem__ or expose the labels as `.targets`."
            )
        labels.append(sample[1])
    return _as_label_array(labels, dataset)


def _as_label_array(labels: object, dataset: Dataset) -> np.ndarray:
    array = labels.cpu().numpy() if isinstance(labels, torch.Tensor) else np.asarray([int(y) for y in labels])
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(
            f"data.dataset ({type(dataset).__name__}) labels have shape {array.shape} and dtype {array.dtype}; "
            "partitioning needs one integer class label per sample."
        )
    return array.astype(np.int64)


def _check(labels: np.ndarray, num_clients: int) -> None:
    if num_clients < 1:
        raise ValueError(f"data.num_clients={num_clients} must be >= 1.")
    if num_clients > len(labels):
        raise ValueError(
            f"data.num_clients={num_clients} exceeds the {len(labels)} training samples; "
            "lower num_clients or use a larger dataset."
        )


def iid_partition(labels: np.ndarray, *, num_clients: int, seed: int = 0) -> list[np.ndarray]:
    """Shuffle and deal the samples into ``num_clients`` near-equal parts.

    Example:
        >>> [len(p) for p in iid_partition(np.zeros(10), num_clients=3)]
        [4, 3, 3]
    """
    _check(labels, num_clients)
    order = np.random.default_rng(seed).permutation(len(labels))
    return [np.sort(part) for part in np.array_split(order, num_clients)]


def dirichlet_partition(
    labels: np.ndarray, *, num_clients: int, alpha: float = 0.5, seed: int = 0, min_samples: int = 2
) -> list[np.ndarray]:
    r"""Label-skewed split: each class is divided among clients in proportions :math:`p \sim Dir(\alpha)`.

    The common non-iid benchmark of Hsu et al. (2019). Smaller ``alpha`` means stronger skew. Draws are
    repeated (with the same seeded generator) until every client holds at least ``min_samples``.

    Raises:
        ValueError: if ``alpha <= 0`` or no draw gives every client ``min_samples`` samples.

    Example:
        >>> parts = dirichlet_partition(np.repeat(np.arange(4), 25), num_clients=5, alpha=0.5)
        >>> sum(len(p) for p in parts)
        100
    """
    _check(labels, num_clients)
    if alpha <= 0:
        raise ValueError(f"data.alpha={alpha} must be > 0 (the Dirichlet concentration; 0.5 is common).")
    if num_clients * min_samples > len(labels):
        raise ValueError(
            f"data.num_clients={num_clients} clients with at least {min_samples} samples each need "
            f"{num_clients * min_samples} samples, but there are {len(labels)}; lower num_clients."
        )
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    for _ in range(1000):
        parts: list[list[int]] = [[] for _ in range(num_clients)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            cuts = (np.cumsum(rng.dirichlet(np.full(num_clients, alpha))) * len(idx)).astype(int)[:-1]
            for client, chunk in enumerate(np.split(idx, cuts)):
                parts[client].extend(chunk.tolist())
        if min(len(p) for p in parts) >= min_samples:
            return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]
    raise ValueError(
        f"no Dirichlet(alpha={alpha}) split gave every one of {num_clients} clients {min_samples} samples "
        "in 1000 draws; raise data.alpha or lower data.num_clients."
    )


def shard_partition(
    labels: np.ndarray, *, num_clients: int, shards_per_client: int = 2, seed: int = 0
) -> list[np.ndarray]:
    """McMahan et al. (2017) pathological non-iid split: sort by label, cut into shards, deal shards.

    Each client receives ``shards_per_client`` shards of ``len(labels) // (num_clients * shards_per_client)``
    consecutive label-sorted samples; the remainder is dealt one sample at a time so none is dropped.

    Example:
        >>> parts = shard_partition(np.repeat(np.arange(5), 4), num_clients=5, shards_per_client=2)
        >>> [len(p) for p in parts]
        [4, 4, 4, 4, 4]
    """
    _check(labels, num_clients)
    if shards_per_client < 1:
        raise ValueError(f"data.shards_per_client={shards_per_client} must be >= 1.")
    num_shards = num_clients * shards_per_client
    if num_shards > len(labels):
        raise ValueError(
            f"{num_clients} clients x {shards_per_client} shards = {num_shards} shards exceed the "
            f"{len(labels)} samples; lower data.shards_per_client or data.num_clients."
        )
    rng = np.random.default_rng(seed)
    order = np.argsort(labels, kind="stable")
    shards = np.array_split(order, num_shards)
    shard_ids = rng.permutation(num_shards)
    return [
        np.sort(np.concatenate([shards[s] for s in shard_ids[k * shards_per_client : (k + 1) * shards_per_client]]))
        for k in range(num_clients)
    ]


_BUCKETS_DISJOINT = [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)] + [(c,) for c in range(10)]
_BUCKETS_OVERLAPPING = [(0, 1, 2, 3), (2, 3, 4, 5), (4, 5, 6, 7), (6, 7, 8, 9), (8, 9, 0, 1)]


def label_bucket_partition(
    labels: np.ndarray, *, num_clients: int, overlapping: bool = False, seed: int = 0
) -> list[np.ndarray]:
    """2DP-FL non-iid label buckets (Xiong et al., IEEE IoT-J, Sec. VI-A) for 10-class data.

    Disjoint scheme (default): 15 buckets with label groups {0,1}, {2,3}, ..., {8,9}, {0}, ..., {9}. Inferred:
    each class is halved, one half to its pair bucket and one to its singleton bucket, so the
    buckets do not overlap. Buckets go to clients round-robin; when there are more clients than buckets a
    bucket is divided evenly among the clients it goes to, so every sample still has exactly one owner.

    Overlapping scheme: 5 buckets {0,1,2,3}, {2,3,4,5}, ... drawn from the whole training set, as the paper
    states, so samples may be shared by two buckets (the only partitioner that duplicates samples).

    Raises:
        ValueError: if the labels are not the 10 classes 0..9.
    """
    _check(labels, num_clients)
    if set(np.unique(labels).tolist()) != set(range(10)):
        raise ValueError("data.partition='label_buckets' is defined for 10-class data (labels 0..9).")
    rng = np.random.default_rng(seed)
    buckets: list[np.ndarray] = []
    if overlapping:
        groups = _BUCKETS_OVERLAPPING
        for group in groups:
            buckets.append(rng.permutation(np.flatnonzero(np.isin(labels, group))))
    else:
        halves = {}
        for c in range(10):
            idx = rng.permutation(np.flatnonzero(labels == c))
            halves[c] = (idx[: len(idx) // 2], idx[len(idx) // 2 :])
        for group in _BUCKETS_DISJOINT:
            half = 0 if len(group) == 2 else 1
            buckets.append(np.concatenate([halves[c][half] for c in group]))
    owners: list[list[int]] = [[] for _ in buckets]
    for k in range(max(num_clients, len(buckets))):
        owners[k % len(buckets)].append(k % num_clients)
    parts: list[list[int]] = [[] for _ in range(num_clients)]
    for bucket, bucket_owners in zip(buckets, owners, strict=True):
        for owner, chunk in zip(bucket_owners, np.array_split(bucket, len(bucket_owners)), strict=True):
            parts[owner].extend(chunk.tolist())
    return [np.sort(np.unique(np.asarray(p, dtype=np.int64))) for p in parts]


PARTITIONERS = {
    "iid": iid_partition,
    "dirichlet": dirichlet_partition,
    "shards": shard_partition,
    "label_buckets": label_bucket_partition,
}


def partition(
    labels: np.ndarray,
    *,
    scheme: PartitionName,
    num_clients: int,
    seed: int = 0,
    alpha: float = 0.5,
    shards_per_client: int = 2,
    overlapping_buckets: bool = False,
) -> list[np.ndarray]:
    """Dispatch to the partitioner named ``scheme`` with the options it takes."""
    if scheme not in PARTITIONERS:
        raise ValueError(f"data.partition={scheme!r} is unknown; use one of {sorted(PARTITIONERS)}.")
    labels = np.asarray(labels)
    if scheme == "dirichlet":
        return dirichlet_partition(labels, num_clients=num_clients, alpha=alpha, seed=seed)
    if scheme == "shards":
        return shard_partition(labels, num_clients=num_clients, shards_per_client=shards_per_client, seed=seed)
    if scheme == "label_buckets":
        return label_bucket_partition(labels, num_clients=num_clients, overlapping=overlapping_buckets, seed=seed)
    return iid_partition(labels, num_clients=num_clients, seed=seed)
