"""The ``photos`` data set of natural crops, and ImageFolders of a user's own few images."""

from __future__ import annotations

from pathlib import Path

import torch
from torchvision.utils import save_image

from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.datamodules.datasets import PHOTO_SOURCES, load_dataset


def test_photos_are_nine_classes_of_natural_rgb_crops_with_sources() -> None:
    train, test = load_dataset("photos", train=True), load_dataset("photos", train=False)
    assert train.num_classes == len(PHOTO_SOURCES) == 9
    assert len(train) + len(test) == 81 and train.images.shape[1:] == (3, 32, 32)
    assert set(train.sources).isdisjoint(test.sources)
    assert train.sources[0].startswith(PHOTO_SOURCES[int(train.labels[0])])
    assert float(train.images.std()) > 0.15  # real photographs, not flat colour


def test_a_folder_with_one_image_per_class_is_all_training_data(tmp_path: Path) -> None:
    for k, name in enumerate(["cat", "cup", "rocket"]):
        (tmp_path / name).mkdir()
        save_image(torch.full((3, 20, 20), 0.2 * (k + 1)), tmp_path / name / f"{name}.png")
    dm = FederatedDataModule(str(tmp_path), num_clients=1, partition="iid")
    assert dm.num_train_samples(0) == 3 and len(dm.test_set) == 0
    assert dm.client_train_set(0).sources[0].endswith("cat/cat.png")
