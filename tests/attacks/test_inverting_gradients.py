"""Inverting Gradients: beats a random image clearly; batched restarts compute what separate runs compute."""

from __future__ import annotations

import torch

from lightning_fl.attacks import InvertingGradientsAttack, Reconstruction
from lightning_fl.attacks.metrics import score_reconstruction
from tests.attacks.views import digits_view


def test_inverting_gradients_beats_a_random_image_clearly() -> None:
    view, truth = digits_view(batch_size=1, image_size=16)
    reconstruction = InvertingGradientsAttack(max_iterations=200, restarts=2, progress_bar=False).reconstruct(view)
    attacked = score_reconstruction(reconstruction, truth, num_classes=10)
    noise = Reconstruction(torch.rand(truth.inputs.shape, generator=torch.Generator().manual_seed(0)), None)
    baseline = score_reconstruction(noise, truth)
    assert attacked["psnr"] >= baseline["psnr"] + 15.0
    assert attacked["ssim"] >= baseline["ssim"] + 0.5
    assert reconstruction.info["restarts"] == 2


def test_inverting_gradients_batched_restart_equals_a_single_run() -> None:
    view, _ = digits_view(batch_size=1, image_size=16)
    batched = InvertingGradientsAttack(max_iterations=15, restarts=3, progress_bar=False)
    single = InvertingGradientsAttack(max_iterations=15, restarts=1, progress_bar=False)
    for many, one in zip(batched.iterate(view), single.iterate(view), strict=True):
        assert torch.allclose(many.losses[0], one.losses[0], rtol=1e-4, atol=1e-6)
    assert torch.allclose(many.images[0], one.images[0], atol=1e-4)
