"""Federated data: datasets by name, partitioners and the FederatedDataModule."""

from lightning_fl.datamodules.datasets import OFFLINE_DATASETS, ImageTensorDataset, load_dataset
from lightning_fl.datamodules.federated import FederatedDataModule
from lightning_fl.datamodules.partitioners import (
    PARTITIONERS,
    dirichlet_partition,
    iid_partition,
    label_bucket_partition,
    partition,
    shard_partition,
)

__all__ = [
    "OFFLINE_DATASETS",
    "PARTITIONERS",
    "FederatedDataModule",
    "ImageTensorDataset",
    "dirichlet_partition",
    "iid_partition",
    "label_bucket_partition",
    "load_dataset",
    "partition",
    "shard_partition",
]
