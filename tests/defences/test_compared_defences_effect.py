"""Soteria, PRECODE, MixUp and InstaHide in a federated run: the update DLG sees is the defended one, and what DLG
recovers of one real digit from it; and the accuracy a short defended FedAvg keeps (the bounds in docs/defences.md).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from lightning_fl import FederatedLoop
from lightning_fl.attacks import DLGAttack
from lightning_fl.attacks.metrics import score_reconstruction
from lightning_fl.attacks.standalone import client_view
from lightning_fl.callbacks.base import FederatedCallback
from lightning_fl.defences import PRECODE, Defence, InstaHide, MixUp, Soteria
from lightning_fl.messages import GroundTruth, ServerView
from lightning_fl.models import ImageClassifier
from tests.defences.leakage import MODEL_SEED, digits

STRONG = {
    "none": lambda: [],
    "soteria": lambda: [Soteria(prune_percent=80.0)],
    "precode": lambda: [PRECODE(bottleneck_size=256, beta=1e-3)],
    "mixup": lambda: [MixUp(k=4)],
    "instahide": lambda: [InstaHide(k=4, center=0.5)],  # digits pixels are in [0, 1]
}


class _Intercept(FederatedCallback):
    """The type-1 view (the client's update as the server receives it) and the examples behind it."""

    def __init__(self) -> None:
        self.seen: list[tuple[ServerView, GroundTruth]] = []

    def on_client_update(self, loop: FederatedLoop, view: ServerView, ground_truth: GroundTruth) -> None:
        self.seen.append((view, ground_truth))


def _model(dm: object, **options: object) -> ImageClassifier:
    torch.manual_seed(MODEL_SEED)
    return ImageClassifier("lenet_dlg", **dm.model_options, **options)


def _fedsgd_view(defences: list[Defence], tmp: Path) -> tuple[ServerView, GroundTruth, ImageClassifier]:
    """FedSGD on one digit (one SGD step at lr 0.1, batch 1): the update the server receives, its ground truth, and
    the undefended model the client started from."""
    dm = digits(batch_size=1)
    model, intercept = _model(dm, optimizer="sgd", lr=0.1), _Intercept()
    start = _model(dm, optimizer="sgd", lr=0.1)
    options = {"clients_per_round": 1, "local_steps": 1, "eval_every": 0, "checkpoint": False, "progress_bar": False}
    FederatedLoop(
        model, dm, num_rounds=1, output_dir=tmp, seed=0, callbacks=[intercept], defences=defences, **options
    ).fit()
    ((view, truth),) = intercept.seen
    return view, truth, start


def _undefended_update(start: ImageClassifier, truth: GroundTruth) -> dict[str, torch.Tensor]:
    plain = client_view(start, truth.inputs, truth.targets, num_classes=10)
    return {name: -0.1 * grad for name, grad in plain.tensors.items()}


def _dlg_score(view: ServerView, truth: GroundTruth) -> dict[str, float]:
    attack = DLGAttack(max_iterations=300, progress_bar=False, seed=0)
    return score_reconstruction(attack.reconstruct(view), truth, num_classes=10)


@pytest.mark.parametrize(
    ("defence", "max_psnr", "max_ssim"),
    [("soteria", 10.0, 0.3), ("instahide", 15.0, 0.4), ("mixup", 20.0, 0.8), ("precode", 30.0, 0.95)],
)
def test_dlg_on_the_defended_update_falls_below_the_bar(
    defence: str, max_psnr: float, max_ssim: float, tmp_path: Path
) -> None:
    view, truth, start = _fedsgd_view(STRONG[defence](), tmp_path / defence)
    plain = _undefended_update(start, truth)
    if defence == "soteria":  # the attack sees the pruned classifier gradient: 80 % of its columns are zero
        columns = view.tensors["backbone.fc.weight"].abs().sum(dim=0)
        assert int((columns == 0).sum()) == math.floor(0.8 * len(columns)) == 153
    elif defence == "precode":  # the model the attacker simulates has the bottleneck, and its gradient is shared
        assert "backbone.fc.0.encoder_weight" in view.tensors
    else:  # the update was computed on a mixture, not on the private image alone
        assert not torch.allclose(view.tensors["backbone.fc.weight"], plain["backbone.fc.weight"], atol=1e-6)
    score = _dlg_score(view, truth)
    assert score["psnr"] < max_psnr and score["ssim"] < max_ssim, score


def test_dlg_reconstructs_the_undefended_update(tmp_path: Path) -> None:
    view, truth, start = _fedsgd_view([], tmp_path)
    plain = _undefended_update(start, truth)
    assert all(torch.allclose(view.tensors[n], plain[n], atol=1e-6) for n in plain)
    score = _dlg_score(view, truth)
    assert score["psnr"] > 40 and score["ssim"] > 0.95, score


@pytest.fixture(scope="module")
def fedavg_accuracy(tmp_path_factory: pytest.TempPathFactory) -> float:
    return _accuracy("none", tmp_path_factory.mktemp("fedavg"))


def _accuracy(defence: str, tmp: Path) -> float:
    """Test accuracy after 5 rounds of FedAvg on digits (4 IID clients, 1 local epoch of batches of 32, Adam)."""
    dm = digits()
    options = {"clients_per_round": 4, "local_epochs": 1, "eval_every": 5, "checkpoint": False, "progress_bar": False}
    loop = FederatedLoop(_model(dm), dm, num_rounds=5, output_dir=tmp, seed=0, defences=STRONG[defence](), **options)
    return float(loop.fit()["test_accuracy"])


@pytest.mark.slow
@pytest.mark.parametrize(("defence", "max_drop"), [("soteria", 0.05), ("precode", 0.05), ("mixup", 0.15)])
def test_defended_fedavg_keeps_accuracy_within_the_stated_bound(
    defence: str, max_drop: float, fedavg_accuracy: float, tmp_path: Path
) -> None:
    accuracy = _accuracy(defence, tmp_path)
    assert accuracy >= fedavg_accuracy - max_drop, (accuracy, fedavg_accuracy)
