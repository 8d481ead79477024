from __future__ import annotations

import numpy as np
import pytest

from lightning_fl.datamodules import FederatedDataModule, load_dataset


def test_client_splits_are_disjoint_and_cover_the_training_set() -> None:
    dm = FederatedDataModule("digits", num_clients=5, partition="dirichlet", alpha=0.5, val_fraction=0.2)
    indices = np.concatenate([np.concatenate(split) for split in dm.client_indices])
    assert len(indices) == len(dm.train_set) == len(np.unique(indices))
    assert all(len(val) > 0 for _, val in dm.client_indices)


def test_images_are_in_unit_range_with_the_requested_size() -> None:
    dm = FederatedDataModule("lfw_faces", num_clients=2, image_size=24, channels=3)
    images, labels = next(iter(dm.train_dataloader(0)))
    assert images.shape[1:] == (3, 24, 24) and images.min() >= 0.0 and images.max() <= 1.0
    assert dm.num_classes == 2 and labels.max() <= 1


def test_train_loader_order_is_fixed_by_seed() -> None:
    dm = FederatedDataModule("digits", num_clients=2, partition="iid")
    first = next(iter(dm.train_dataloader(0, seed=4)))[1]
    again = next(iter(dm.train_dataloader(0, seed=4)))[1]
    assert first.equal(again)


def test_unknown_dataset_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"data\.dataset='not-a-dataset' is neither a known dataset"):
        load_dataset("not-a-dataset", train=True)


def test_torchvision_dataset_offline_error_says_how_to_supply_it(tmp_path) -> None:
    with pytest.raises(RuntimeError, match="Without a network, place the torchvision files for 'mnist'"):
        load_dataset("mnist", train=True, root=str(tmp_path), download=False)


def test_image_folder_path_loads(tmp_path) -> None:
    from PIL import Image

    for label in ("cat", "dog"):
        (tmp_path / label).mkdir()
        for i in range(3):
            Image.fromarray(np.full((8, 8, 3), 40 * i, dtype=np.uint8)).save(tmp_path / label / f"{i}.png")
    ds = load_dataset(str(tmp_path), train=True, image_size=8, test_fraction=0.34)
    assert ds.num_classes == 2 and len(ds) == 4 and ds.images.shape[1:] == (3, 8, 8)
