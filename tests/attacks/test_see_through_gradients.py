"""See-Through-Gradients: the batch-norm prior, the label rule and the attack on held-out digits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from lightning_fl.attacks import SeeThroughGradientsAttack
from lightning_fl.attacks.batch_norm import batch_norm_prior
from lightning_fl.attacks.metrics import match_reconstructions, psnr
from lightning_fl.attacks.standalone import client_view
from lightning_fl.cli import main
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.models import ImageClassifier, conv_bn_small

CONFIGS = Path(__file__).parents[2] / "configs"


def _bn_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.BatchNorm2d(4))


def test_batch_norm_prior_vanishes_on_the_batch_whose_statistics_the_model_holds() -> None:
    net = _bn_net()
    batch = torch.rand(16, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    for module in net.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.momentum = None  # cumulative average: after one pass, the running statistics are this batch's
    net.train()(batch)
    prior = batch_norm_prior(net)
    assert float(prior(batch).detach()) < 5e-3  # running_var is the unbiased variance
    assert float(prior(batch.flip(-1) * 0.5).detach()) > 0.05


def test_batch_norm_prior_leaves_the_models_running_statistics_alone() -> None:
    net = _bn_net()
    before = net[1].running_mean.clone()
    batch_norm_prior(net)(torch.rand(4, 1, 8, 8))
    assert torch.equal(net[1].running_mean, before)


def test_batch_norm_prior_needs_a_batch_norm_layer() -> None:
    with pytest.raises(ValueError, match="no BatchNorm2d"):
        batch_norm_prior(nn.Sequential(nn.Conv2d(1, 2, 3)))


@pytest.mark.parametrize(
    ("options", "match"), [({"restarts": 1}, "needs restarts >= 2"), ({"bn_weight": -1}, "bn_weight")]
)
def test_see_through_gradients_rejects_bad_settings(options: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SeeThroughGradientsAttack(**options)


def _held_out_view(batch: int) -> tuple:
    """A small conv-BN network whose running statistics come from client 1's digits (the broadcast model's), and
    one gradient of ``batch`` held-out test digits with distinct labels."""
    dm = FederatedDataModule("digits", num_clients=2, partition="iid", image_size=16, val_fraction=0.0)
    dm.setup()
    torch.manual_seed(0)
    model = ImageClassifier(conv_bn_small(1, 10, 16), **dm.model_options)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.momentum = None
    with torch.no_grad():
        for chunk in dm.client_train_set(1).tensors()[0].split(64):
            model.train()(chunk)
    first_of_each = {}
    for i in range(len(dm.test_set)):
        first_of_each.setdefault(int(dm.test_set[i][1]), i)
    images, labels = zip(*(dm.test_set[i] for i in list(first_of_each.values())[:batch]), strict=True)
    images, labels = torch.stack(images), torch.stack(labels)
    return client_view(model, images, labels, num_classes=10), images, labels


def test_see_through_gradients_recovers_a_held_out_batch_and_its_priors_help() -> None:
    view, images, labels = _held_out_view(4)
    scores = {}
    for name, options in {"full": {}, "plain": {"bn_weight": 0.0, "group_weight": 0.0}}.items():
        result = SeeThroughGradientsAttack(max_iterations=200, restarts=2, progress_bar=False, **options).reconstruct(
            view
        )
        assert sorted(result.labels.tolist()) == sorted(labels.tolist())
        rows, cols = match_reconstructions(result.images, images)
        scores[name] = float(psnr(result.images[rows], images[cols]).mean())
    assert scores["full"] >= 24.0
    assert scores["full"] >= scores["plain"] + 0.5


def test_see_through_gradients_fit_config_parses(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(CONFIGS / "see_through_gradients_resnet_digits.yaml"), "--print_config"])
    assert "SeeThroughGradientsAttack" in capsys.readouterr().out
