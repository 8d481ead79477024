"""The ``photos`` data set of natural crops, and ImageFolders of a user's own few images."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
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


@pytest.mark.parametrize("name", ["photos", "digits", "lfw_faces"])
def test_a_loaded_data_set_is_the_callers_own_copy(name: str) -> None:
    """The packaged images are decoded once per process (every bench run loads them): what a caller changes in its
    data set never reaches the next one, at the native size (no resize copies it) or any other."""
    for image_size in (None, 16):
        first = load_dataset(name, train=True, image_size=image_size)
        first.images.zero_()
        first.labels.zero_()
        again = load_dataset(name, train=True, image_size=image_size)
        assert float(again.images.abs().sum()) > 0 and int(again.labels.max()) > 0


def test_a_folder_with_one_image_per_class_is_all_training_data(tmp_path: Path) -> None:
    for k, name in enumerate(["cat", "cup", "rocket"]):
        (tmp_path / name).mkdir()
        save_image(torch.full((3, 20, 20), 0.2 * (k + 1)), tmp_path / name / f"{name}.png")
    dm = FederatedDataModule(str(tmp_path), num_clients=1, partition="iid")
    assert dm.num_train_samples(0) == 3 and len(dm.test_set) == 0
    assert dm.client_train_set(0).sources[0].endswith("cat/cat.png")


def _png_folder(root: Path, mode: str) -> Path:
    """Two classes of two 12x12 PNGs each, saved in PIL ``mode`` (``"L"``: grayscale files, ``"RGB"``: colour)."""
    from PIL import Image

    for k, name in enumerate(["a", "b"]):
        (root / name).mkdir(parents=True)
        for i in range(2):
            pixels = np.full((12, 12, 3), 40 * (2 * k + i + 1), dtype=np.uint8)
            pixels[..., 1] //= 2  # colour files are not gray
            Image.fromarray(pixels).convert(mode).save(root / name / f"{i}.png")
    return root


def test_a_grayscale_folder_keeps_one_channel_and_a_colour_folder_three(tmp_path: Path) -> None:
    gray = load_dataset(str(_png_folder(tmp_path / "gray", "L")), train=True, image_size=None)
    colour = load_dataset(str(_png_folder(tmp_path / "rgb", "RGB")), train=True, image_size=None)
    assert gray.images.shape[1:] == (1, 12, 12) and colour.images.shape[1:] == (3, 12, 12)
    dm = FederatedDataModule(str(tmp_path / "gray"), num_clients=1, partition="iid", image_size=None)
    assert dm.model_options["in_channels"] == 1
    forced = load_dataset(str(tmp_path / "gray"), train=True, image_size=None, channels=3)
    assert forced.images.shape[1] == 3 and torch.equal(forced.images[:, 0], forced.images[:, 2])


def test_a_folder_mixing_grayscale_and_colour_files_says_what_it_became(tmp_path: Path) -> None:
    _png_folder(tmp_path, "RGB")
    from PIL import Image

    Image.open(tmp_path / "a" / "0.png").convert("L").save(tmp_path / "a" / "0.png")
    with pytest.warns(UserWarning, match="mixes 1 grayscale and 3 colour images"):
        mixed = load_dataset(str(tmp_path), train=True, image_size=None)
    assert mixed.images.shape[1] == 3
