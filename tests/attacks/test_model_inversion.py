"""Model inversion: FDL-PP's colluding-client attack on a private/public split LeNet, and 2DP-FL's MI-Face."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_fl.attacks.dlg import DLGAttack
from lightning_fl.attacks.metrics import match_reconstructions, psnr, ssim
from lightning_fl.attacks.model_inversion import (
    ColludingClientInversion,
    MIFace,
    _public_view,
    forward_to_cut,
    private_cut,
)
from lightning_fl.attacks.standalone import client_view
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.datamodules.datasets import load_dataset
from lightning_fl.defences import KeyLocks, apply_defences
from lightning_fl.messages import ServerView
from lightning_fl.models import ImageClassifier
from lightning_fl.private import mark_private, private_state
from tests.conftest import make_classifier


def _split_lenet(image_size: int = 16) -> tuple[ImageClassifier, FederatedDataModule]:
    """FDL-PP's split (Sec. 3): the first convolution and its activation are private, the rest public."""
    dm = FederatedDataModule("digits", num_clients=2, partition="iid", image_size=image_size)
    torch.manual_seed(0)
    model = make_classifier(dm)
    mark_private(model.backbone.body[0])
    mark_private(model.backbone.body[1])
    return model, dm


def test_private_cut_is_the_last_private_module_that_runs() -> None:
    model, _ = _split_lenet()
    assert private_cut(model, input_shape=(1, 16, 16)) is model.backbone.body[1]


def test_private_cut_rejects_a_model_without_private_layers() -> None:
    with pytest.raises(ValueError, match=r"no private module; mark its leading layers private"):
        private_cut(nn.Sequential(nn.Flatten(), nn.Linear(4, 2)), input_shape=(1, 2, 2))


def test_private_cut_rejects_key_locks_interleaved_with_public_layers() -> None:
    """FedKL's key-lock layers follow public convolutions and return (output, key): not an FDL-PP split."""
    dm = FederatedDataModule("digits", num_clients=2, partition="iid", image_size=16)
    model = apply_defences(make_classifier(dm), [KeyLocks(key_length=16)])
    with pytest.raises(ValueError, match=r"not split as FDL-PP splits it .* public \['Conv2d'\] run before .* KeyLock"):
        private_cut(model, input_shape=(1, 16, 16))


def test_colluding_inversion_recovers_the_private_output_and_the_image() -> None:
    """The server sees only public-layer gradients, yet recovers O_prt and, through the colluder, the image."""
    model, dm = _split_lenet()
    images, labels = dm.sample_batch(0, 2, seed=0)
    view = client_view(model, images, labels, num_classes=dm.num_classes)
    assert not set(view.tensors) & set(private_state(model))  # the attacker never gets the private layers
    attack = ColludingClientInversion(
        feature_attack=DLGAttack(max_iterations=300, init="rand", progress_bar=False),
        iterations=500,
        progress_bar=False,
    )
    reconstruction = attack.reconstruct(view)
    features, _ = attack.recover_private_output(view)
    true_output = forward_to_cut(model, private_cut(model, input_shape=(1, 16, 16)), images).detach()
    cosine = F.cosine_similarity(features.flatten(1)[:, None], true_output.flatten(1)[None], dim=-1).amax(dim=0)
    random_images = torch.rand(images.shape, generator=torch.Generator().manual_seed(0))
    assert cosine.min() > 0.99  # colluder-visible output recovered, in some order (measured > 0.9999)
    assert reconstruction.labels.sort().values.tolist() == labels.sort().values.tolist()
    rows, cols = match_reconstructions(reconstruction.images, images)
    recovered = psnr(reconstruction.images[rows], images[cols])
    assert recovered.min() > 30  # measured 48 dB
    assert recovered.mean() > psnr(random_images, images).mean() + 20


def test_the_feature_attack_at_the_cut_gets_no_image_prior_for_a_batch() -> None:
    """DLG's "auto" batch settings add a total-variation prior for B > 1 images; the private output recovered at
    FDL-PP's cut is feature maps, where that prior cost 15 dB (docs/attacks.md), so the public view says so."""
    model, dm = _split_lenet()
    images, labels = dm.sample_batch(0, 2, seed=0)
    view = client_view(model, images, labels, num_classes=dm.num_classes)
    cut = private_cut(view.model, input_shape=(1, 16, 16))
    public = _public_view(view, cut, forward_to_cut(view.model, cut, images).shape[1:])
    assert public.metadata["inputs"] == "features" and "inputs" not in view.metadata
    for checked, has_prior in ((public, False), (view, True)):
        problem = DLGAttack(progress_bar=False).problem(checked)
        total, gap = problem.objective(problem.images, problem.label_input)
        assert bool((total > gap).all()) is has_prior and problem.stop_below is None


def test_colluding_inversion_fails_when_the_colluder_private_layers_differ() -> None:
    """FDL-PP's argument: a colluder whose private layers differ (passports) inverts to the wrong image."""
    model, dm = _split_lenet()
    images, labels = dm.sample_batch(0, 1, seed=0)
    view = client_view(model, images, labels, num_classes=dm.num_classes)
    other = copy.deepcopy(model)
    torch.nn.init.uniform_(other.backbone.body[0].weight, -0.5, 0.5)
    same = ColludingClientInversion(iterations=500, progress_bar=False)
    different = ColludingClientInversion(colluder_private=private_state(other), iterations=500, progress_bar=False)
    true_output = forward_to_cut(model, model.backbone.body[1], images).detach()
    good, _ = same.invert_private_model(same.colluder_model(view), true_output, input_shape=(1, 16, 16))
    bad, _ = different.invert_private_model(different.colluder_model(view), true_output, input_shape=(1, 16, 16))
    assert psnr(good, images).item() > 30 > psnr(bad, images).item() + 10


def _softmax_regression_on_digits(weight_decay: float = 1e-3) -> tuple[ImageClassifier, torch.Tensor, torch.Tensor]:
    """2DP-FL's inferred model (spec_000_002 B.7): multinomial logistic regression, here on 8x8 digits."""
    data = load_dataset("digits", train=True, image_size=None)
    torch.manual_seed(0)
    model = ImageClassifier(nn.Sequential(nn.Flatten(), nn.Linear(64, 10)), num_classes=10, in_channels=1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(200):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data.images), data.labels)
        (loss + weight_decay * sum(p.pow(2).sum() for p in model.parameters())).backward()
        optimizer.step()
    return model, data.images, data.labels


def test_mi_face_recovers_each_class_template() -> None:
    """Passive attack on the global model: every class inversion looks most like its own class (SSIM, 2DP-FL)."""
    model, images, labels = _softmax_regression_on_digits()
    view = ServerView("aggregate", model, {}, "gradient", {"num_classes": 10, "input_shape": (1, 8, 8)})
    reconstruction = MIFace(progress_bar=False).reconstruct(view)
    class_means = torch.stack([images[labels == c].mean(0) for c in range(10)])
    similarity = torch.stack([ssim(image.expand(10, -1, -1, -1), class_means) for image in reconstruction.images])
    assert reconstruction.labels.tolist() == list(range(10))
    assert similarity.argmax(dim=1).tolist() == list(range(10))  # measured: all ten
    assert similarity.diag().mean() > similarity.mean() + 0.2  # measured 0.48 vs 0.16


def test_mi_face_inverts_the_model_rebuilt_from_an_update() -> None:
    """Active attack: the victim's local model w = w_global + update, rebuilt from the intercepted update."""
    trained, _, _ = _softmax_regression_on_digits()
    start = copy.deepcopy(trained)
    nn.init.zeros_(start.backbone[1].weight)
    nn.init.zeros_(start.backbone[1].bias)
    state, initial = trained.state_dict(), start.state_dict()
    update = {k: state[k] - initial[k] for k in ("backbone.1.weight", "backbone.1.bias")}
    metadata = {"num_classes": 10, "input_shape": (1, 8, 8)}
    attack = MIFace(target_classes=[3, 8], progress_bar=False)
    from_update = attack.reconstruct(ServerView("client_update", start, update, "update", metadata))
    direct = attack.reconstruct(ServerView("aggregate", trained, {}, "gradient", metadata))
    assert torch.allclose(from_update.images, direct.images, atol=1e-5)
    assert from_update.labels.tolist() == [3, 8]


@pytest.mark.parametrize(
    ("options", "message"),
    [({"iterations": 0}, r"MIFace\(iterations=0\) must be > 0"), ({"lr": -1.0}, r"MIFace\(lr=-1.0\) must be > 0")],
)
def test_mi_face_rejects_bad_options(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MIFace(**options)


def test_mi_face_rejects_unknown_target_class() -> None:
    model = ImageClassifier(nn.Sequential(nn.Flatten(), nn.Linear(64, 10)), num_classes=10, in_channels=1)
    view = ServerView("aggregate", model, {}, "gradient", {"num_classes": 10, "input_shape": (1, 8, 8)})
    with pytest.raises(ValueError, match=r"target_classes=\[12\]\) must be classes in \[0, 10\)"):
        MIFace(target_classes=[12], progress_bar=False).reconstruct(view)
