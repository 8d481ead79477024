"""The attack report: scores plus a readable, labelled comparison grid."""

from __future__ import annotations

from pathlib import Path

import torch
from PIL import Image

from lightning_fl.attacks.base import Reconstruction
from lightning_fl.attacks.report import MIN_CELL, attack_report
from lightning_fl.messages import GroundTruth


def test_attack_report_scores_and_writes_an_upscaled_grid(tmp_path: Path) -> None:
    truth = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    reconstruction = Reconstruction(truth.flip(0), torch.tensor([4, 7]))
    report = attack_report(
        reconstruction,
        GroundTruth(truth, torch.tensor([7, 4])),
        num_classes=10,
        path=tmp_path / "g.png",
        names=["a.png", "b.png"],
    )
    assert report["psnr"] == 100.0 and report["label_accuracy"] == 1.0
    assert report["matched_sources"] == ["b.png", "a.png"]
    width, height = Image.open(report["image"]).size
    assert width >= 2 * MIN_CELL and height >= 2 * MIN_CELL


def test_attack_report_without_a_path_writes_nothing(tmp_path: Path) -> None:
    truth = torch.zeros(1, 1, 8, 8)
    report = attack_report(Reconstruction(truth, None), GroundTruth(truth, torch.tensor([0])), num_classes=2, path=None)
    assert report["image"] is None and report["label_accuracy"] is None
