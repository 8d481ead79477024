"""The benchmark scripts read image folders through the CLI's loader: [0, 1] floats, never raw 0-255 pixels."""

from __future__ import annotations

from pathlib import Path

import torch
from torchvision.utils import save_image

from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.datamodules.datasets import load_dataset
from tests.conftest import load_benchmark


def native_folder(root: Path) -> Path:
    """A user's ImageFolder of 32x32 PNGs (no resize happens, so the loader keeps them as 8-bit pixels)."""
    tiles = load_dataset("photo_tiles", train=True, image_size=32)
    for label in range(3):
        for index in (tiles.labels == label).nonzero().flatten()[:6].tolist():
            (root / f"class{label}").mkdir(parents=True, exist_ok=True)
            save_image(tiles.images[index], root / f"class{label}" / f"{index}.png")
    return root


def test_stored_8_bit_pixels_read_as_unit_floats(tmp_path: Path) -> None:
    folder = str(native_folder(tmp_path))
    stored = load_dataset(folder, train=True, image_size=32)
    assert stored.pixels.dtype == torch.uint8 and stored.images.dtype == torch.float32
    assert float(stored.images.min()) >= 0.0 and float(stored.images.max()) <= 1.0
    cli_images = torch.stack([x for x, _ in FederatedDataModule(folder, num_clients=1, partition="iid").train_set])
    assert torch.equal(stored.images, cli_images)


def test_analytic_and_label_benchmarks_draw_the_clis_images(tmp_path: Path) -> None:
    folder = str(native_folder(tmp_path))
    images, labels, classes = load_benchmark("analytic_attack").held_out(folder)
    pooled, _ = load_benchmark("label_recovery").pool(folder)
    assert classes == 3 and len(images) == len(labels)
    for drawn in (images, pooled):
        assert drawn.dtype == torch.float32 and float(drawn.max()) <= 1.0 and float(drawn.max()) > 0.5
