"""configs/inverting_gradients_full.yaml runs unchanged on a user's own model and image folder; a model the attack
cannot simulate is refused before any work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torchvision.utils import save_image

from lightning_fl.cli import main
from lightning_fl.datamodules.datasets import load_dataset

CONFIG = str(Path(__file__).parents[2] / "configs" / "inverting_gradients_full.yaml")
QUICK = ["--attack.init_args.max_iterations", "4", "--attack.init_args.progress_bar", "false", "--run.batches", "3"]


@pytest.fixture
def photo_folder(tmp_path: Path) -> Path:
    """A user's ImageFolder of native 32x32 PNGs: four photographs' tiles, four per class."""
    data = load_dataset("photo_tiles", train=True, image_size=32)
    for label in range(4):
        for index in (data.labels == label).nonzero().flatten()[:4].tolist():
            image = data.images[index]
            image = image.float() / 255 if image.dtype == torch.uint8 else image
            (tmp_path / "photos" / f"class{label}").mkdir(parents=True, exist_ok=True)
            save_image(image, tmp_path / "photos" / f"class{label}" / f"{index}.png")
    return tmp_path / "photos"


def test_the_full_config_attacks_a_users_model_on_a_users_folder(tmp_path: Path, photo_folder: Path) -> None:
    model = "{class_path: tests.user_project.PhotoNet, init_args: {num_classes: 4}}"
    args = ["attack", "-c", CONFIG, "--model", model, "--data.dataset", str(photo_folder), *QUICK]
    assert main([*args, "--output_dir", str(tmp_path / "run")]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    totals = summary["totals"]
    assert totals["num_images"] == 3 and totals["batches"] == 3 and totals["success_ssim"] == 0.5
    assert totals["label_accuracy"] == 1.0  # labels from the bias gradient: exact for one image
    assert len(totals["per_image_own_colour_ssim"]) == 3  # the colour-only reference of each attacked image
    assert 0.0 <= totals["share_beyond_colour"] <= totals["share_recovered"]
    assert len({name for entry in summary["attacks"] for name in entry["attacked"]}) == 3


def test_a_model_the_attack_cannot_simulate_exits_2_naming_the_layer_before_any_work(
    tmp_path: Path, photo_folder: Path, capsys: pytest.CaptureFixture
) -> None:
    model = "{class_path: tests.user_project.PhotoNet, init_args: {num_classes: 4, dropout: 0.5}}"
    args = ["attack", "-c", CONFIG, "--model", model, "--data.dataset", str(photo_folder), *QUICK]
    assert main([*args, "--output_dir", str(tmp_path / "run")]) == 2
    assert "layer 'head.1' (Dropout(p=0.5" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
