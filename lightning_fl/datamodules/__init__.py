"""Federated data: datasets by name, partitioners and the FederatedDataModule."""

from lightning_fl.datamodules.datasets import OFFLINE_DATASETS, ImageTensorDataset, load_dataset
from lightning_fl.datamodules.federated import NAME_ONLY_KEYS, DataSource, FederatedDataModule, check_name_only_keys
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
    "NAME_ONLY_KEYS",
    "OFFLINE_DATASETS",
    "PARTITIONERS",
    "DataSource",
    "FederatedDataModule",
    "ImageTensorDataset",
    "check_name_only_keys",
    "dataset_labels",
    "dirichlet_partition",
    "iid_partition",
    "label_bucket_partition",
    "load_dataset",
    "partition",
    "shard_partition",
]
