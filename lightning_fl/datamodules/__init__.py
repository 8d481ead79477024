"""Federated data: datasets by name, partitioners and the FederatedDataModule."""

from lightning_fl.datamodules.datasets import OFFLINE_DATASETS, ImageTensorDataset, load_dataset
from lightning_fl.datamodules.federated import DataSource, FederatedDataModule
from lightning_fl.datamodules.partitioners import (
    PARTITIONERS,
    dataset_labels,
    dirichlet_partition,
    iid_partition,
    label_bucket_partition,
    partition,
    shard_partition,
)

__all__ = [
    "OFFLINE_DATASETS",
    "PARTITIONERS",
    "DataSource",
    "FederatedDataModule",
    "ImageTensorDataset",
    "dataset_labels",
    "dirichlet_partition",
    "iid_partition",
    "label_bucket_partition",
    "load_dataset",
    "partition",
    "shard_partition",
]
