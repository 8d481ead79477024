"""The analytic attack on a fully connected first layer: held-out images behind one MLP gradient."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightning_fl import FederatedLoop
from lightning_fl.attacks import AnalyticLinearAttack
from lightning_fl.attacks.metrics import match_reconstructions, psnr
from lightning_fl.attacks.standalone import client_view
from lightning_fl.callbacks import GradientLeakage
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.datamodules.datasets import load_dataset
from lightning_fl.models import ImageClassifier
from tests.conftest import make_classifier


def _attack(data: str, batch_size: int, backbone: str = "mlp") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    held_out = load_dataset(data, train=False, image_size=32)
    channels = held_out.images.shape[1]
    torch.manual_seed(0)
    model = ImageClassifier(backbone, num_classes=held_out.num_classes, in_channels=channels, standardize=True)
    images, labels = held_out.images[:batch_size], held_out.labels[:batch_size]
    view = client_view(model, images, labels, num_classes=held_out.num_classes)
    reconstruction = AnalyticLinearAttack().reconstruct(view)
    rows, cols = match_reconstructions(reconstruction.images, images)
    return psnr(reconstruction.images[rows], images[cols]), reconstruction.labels, labels


@pytest.mark.parametrize("data", ["digits", "photos"])
def test_analytic_attack_copies_one_held_out_image_exactly(data: str) -> None:
    per_image, found, labels = _attack(data, batch_size=1)
    assert float(per_image.min()) >= 60.0
    assert torch.equal(found, labels)


def test_analytic_attack_copies_most_of_a_small_batch_and_mixes_a_large_one() -> None:
    # behind the ReLU, rows that one image alone activates hold it exactly; at B = 32 few such rows are left
    per_image, found, labels = _attack("digits", batch_size=4)
    assert int((per_image >= 60.0).sum()) >= 3
    assert sorted(found.tolist()) == sorted(labels.tolist())
    per_image, _, _ = _attack("digits", batch_size=32)
    assert int((per_image >= 60.0).sum()) < 16


def test_analytic_attack_explains_a_model_without_a_fully_connected_first_layer() -> None:
    with pytest.raises(ValueError, match=r"fully connected first layer on the flattened image"):
        _attack("digits", batch_size=1, backbone="lenet_dlg")


def test_analytic_attack_in_the_gradient_leakage_callback_copies_a_shared_update(tmp_path: Path) -> None:
    dm = FederatedDataModule("digits", num_clients=2, partition="iid", batch_size=1, image_size=16)
    torch.manual_seed(0)
    options = {"num_rounds": 1, "clients_per_round": 1, "local_steps": 1, "eval_every": 0, "checkpoint": False}
    attack = GradientLeakage(AnalyticLinearAttack(), leak_point="client_update")
    loop = FederatedLoop(
        make_classifier(dm, backbone="mlp", optimizer="sgd", lr=0.1),
        dm,
        callbacks=[attack],
        output_dir=tmp_path,
        progress_bar=False,
        **options,
    )
    entry = loop.fit()["attacks"][0]
    assert entry["psnr"] >= 60.0 and entry["label_accuracy"] == 1.0
