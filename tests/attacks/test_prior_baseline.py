"""The prior-only baseline: guesses from public data only, labels read off the gradient, scores at guessing level."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset

from lightning_fl.attacks import PriorBaseline, score_reconstruction
from lightning_fl.datamodules.datasets import load_dataset
from tests.attacks.views import digits_view


def _public() -> TensorDataset:
    test = load_dataset("digits", train=False, image_size=16)  # the attacker's own data: the test split
    return TensorDataset(*test.tensors())


@pytest.mark.parametrize("batch_size", [1, 4])
def test_class_sample_reads_the_labels_and_draws_public_images_of_them(batch_size: int) -> None:
    view, truth = digits_view(batch_size=batch_size, distinct_labels=True)
    public = _public()
    reconstruction = PriorBaseline(public, guess="class_sample").reconstruct(view)
    assert reconstruction.images.shape == truth.inputs.shape
    assert sorted(reconstruction.labels.tolist()) == sorted(truth.targets.tolist())  # bias_count on a clean gradient
    images, labels = public.tensors
    for image, label in zip(reconstruction.images, reconstruction.labels, strict=True):
        index = int((images - image).flatten(1).abs().sum(1).argmin())
        assert torch.equal(images[index], image) and int(labels[index]) == int(label)  # a public image of the class
    again = PriorBaseline(public, guess="class_sample").reconstruct(view)
    assert torch.equal(again.images, reconstruction.images)  # seeded


def test_guessing_gives_no_copy_of_the_image() -> None:
    """A guess scores 10-15 dB; on 16x16 digits its SSIM can pass 0.5 (docs/bench.md), never a copy's."""
    view, truth = digits_view(batch_size=1, seed=1)
    scores = {
        guess: score_reconstruction(PriorBaseline(_public(), guess=guess).reconstruct(view), truth, num_classes=10)
        for guess in ("mean", "class_sample")
    }
    assert scores["mean"]["label_accuracy"] is None and scores["class_sample"]["label_accuracy"] == 1.0
    for score in scores.values():
        assert 5.0 < score["psnr"] < 20.0 and score["ssim"] < 0.9 and score["recovered"] == 0


def test_public_images_of_another_shape_are_refused() -> None:
    view, _ = digits_view()
    big = TensorDataset(torch.rand(3, 1, 8, 8), torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="public_data images are"):
        PriorBaseline(big).reconstruct(view)
    with pytest.raises(ValueError, match="guess="):
        PriorBaseline(big, guess="median")
