"""DLG and iDLG on natural RGB photographs that no default was tuned on (scikit-image crops of ``photos``)."""

from __future__ import annotations

import pytest
import torch

from lightning_fl.attacks import DLGAttack, IDLGAttack
from lightning_fl.attacks.metrics import score_reconstruction
from tests.attacks.views import photo_view


def test_idlg_recovers_a_held_out_photo_crop_with_its_label() -> None:
    view, truth = photo_view("skimage:chelsea[1,0]", seed=0)
    reconstruction = IDLGAttack(progress_bar=False, seed=0).reconstruct(view)
    scores = score_reconstruction(reconstruction, truth, num_classes=10)
    assert torch.equal(reconstruction.labels, truth.targets)
    assert scores["psnr"] >= 30.0 and scores["ssim"] >= 0.9
    assert reconstruction.info["converged"]


@pytest.mark.slow
@pytest.mark.parametrize("source", ["skimage:chelsea[0,0]", "skimage:retina[1,1]", "skimage:rocket[1,1]"])
def test_dlg_defaults_recover_held_out_photo_crops(source: str) -> None:
    view, truth = photo_view(source, seed=0)
    reconstruction = DLGAttack(progress_bar=False, seed=0).reconstruct(view)
    scores = score_reconstruction(reconstruction, truth, num_classes=10)
    assert scores["psnr"] >= 30.0 and scores["label_accuracy"] == 1.0


def test_the_paper_start_in_the_standardised_victim_stalls() -> None:
    """Why the DLG configs feed the LeNet [0, 1] pixels: with inputs standardised inside ``forward`` even a
    converging setting does not move from the paper's N(0, 1) start (the sigmoids saturate)."""
    from lightning_fl.attacks.standalone import client_view
    from lightning_fl.datamodules.datasets import load_dataset
    from lightning_fl.models import ImageClassifier

    data = load_dataset("photos", train=True, image_size=32)
    mean, std = data.images.mean((0, 2, 3)).tolist(), data.images.std((0, 2, 3)).tolist()
    index = data.sources.index("skimage:coffee[0,0]")
    torch.manual_seed(0)
    model = ImageClassifier("lenet_dlg", num_classes=10, in_channels=3, input_mean=mean, input_std=std)
    view = client_view(model, data.images[index : index + 1], data.labels[index : index + 1], num_classes=10)
    attack = IDLGAttack(init="randn", restarts=1, max_iterations=150, stop_below=None, progress_bar=False)
    states = list(attack.iterate(view))
    assert float(states[-1].relative_gaps.min()) > 1e-3


def test_a_restart_thrown_into_saturation_is_redrawn() -> None:
    """On this held-out crop and victim an unguarded L-BFGS step throws the kept restart into the sigmoids'
    saturation at iteration ~178, where every gradient is zero: the gap then stays at ~51 for good. With
    ``recover_stalled`` the restart is re-drawn and goes on converging."""
    view, _ = photo_view("skimage:rocket[1,1]", seed=0)
    gaps = {}
    for recover in (False, True):
        states = DLGAttack(max_iterations=300, recover_stalled=recover, progress_bar=False).iterate(view)
        gaps[recover] = float(list(states)[-1].relative_gaps.min())
    assert gaps[False] > 10.0 and gaps[True] < 0.05
