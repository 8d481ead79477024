"""Robbing the Fed: the malicious imprint block, its read-out, and both in a federated run and the CLI."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from lightning_fl import FederatedLoop
from lightning_fl.attacks import ImprintBlock, MaliciousImprint, RobbingTheFedAttack
from lightning_fl.attacks.imprint import gaussian_bin_thresholds
from lightning_fl.attacks.metrics import RECOVERED_PSNR, match_reconstructions, psnr
from lightning_fl.attacks.standalone import client_view
from lightning_fl.callbacks import GradientLeakage
from lightning_fl.cli import main
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.defences import KeyLocks, apply_defences
from lightning_fl.models import ImageClassifier
from lightning_fl.transforms import apply_server_plugins
from tests.conftest import make_classifier

CONFIGS = Path(__file__).parents[2] / "configs"


@pytest.fixture(scope="module")
def digits() -> FederatedDataModule:
    dm = FederatedDataModule("digits", num_clients=2, partition="iid", image_size=16, val_fraction=0.0)
    dm.setup()
    return dm


def _held_out(dm: FederatedDataModule, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``count`` test-split digits: images no setting here was chosen on."""
    images, labels = zip(*(dm.test_set[i] for i in range(count)), strict=True)
    return torch.stack(images), torch.stack(labels)


def _imprint(dm: FederatedDataModule, num_bins: int, gain: float = 1.0) -> MaliciousImprint:
    """Bins on a random direction, placed by the feature's statistics on a training split (the server's public data)."""
    train_images, _ = dm.client_train_set(1).tensors()
    block = ImprintBlock(dm.input_shape, num_bins=2, feature="random", feature_mean=0.0, feature_std=1.0)
    h = block.feature(train_images)
    mean, std = float(h.mean()), float(h.std())
    return MaliciousImprint(num_bins=num_bins, feature="random", feature_mean=mean, feature_std=std, gain=gain)


def _imprinted(dm: FederatedDataModule, num_bins: int, gain: float = 1.0) -> ImageClassifier:
    return apply_server_plugins(make_classifier(dm, optimizer="sgd", lr=0.1), [_imprint(dm, num_bins, gain)])


def _recovered(images: torch.Tensor, truth: torch.Tensor) -> int:
    rows, cols = match_reconstructions(images, truth)
    return int((psnr(images[rows], truth[cols]) >= RECOVERED_PSNR).sum())


def test_gaussian_bin_thresholds_split_the_feature_into_equal_masses() -> None:
    thresholds = gaussian_bin_thresholds(8, mean=2.0, std=0.5)
    samples = 2.0 + 0.5 * torch.randn(200_000, generator=torch.Generator().manual_seed(0))
    counts = torch.bucketize(samples, thresholds[1:]).bincount(minlength=8) / len(samples)
    assert torch.allclose(counts, torch.full((8,), 1 / 8), atol=0.005)


@pytest.mark.parametrize(("num_bins", "std", "match"), [(1, 1.0, "num_bins=1"), (4, 0.0, "feature_std=0.0")])
def test_malicious_imprint_rejects_bad_settings(num_bins: int, std: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        MaliciousImprint(num_bins=num_bins, feature_mean=0.0, feature_std=std)


def test_imprint_block_keeps_the_models_function(digits: FederatedDataModule) -> None:
    images, _ = _held_out(digits, 32)
    model = make_classifier(digits)
    before = model(images).argmax(1)
    after = apply_server_plugins(model, [_imprint(digits, num_bins=256)])
    assert (after(images).argmax(1) == before).float().mean() >= 0.9


class _FlatLinear(torch.nn.Module):
    """A user's model with nothing that names its input shape."""

    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x.flatten(1))


def test_the_imprint_takes_its_input_shape_from_the_runs_data_on_a_model_without_image_hparams(
    digits: FederatedDataModule,
) -> None:
    users_model = _FlatLinear()  # no in_channels/image_size hparams
    imprint = _imprint(digits, num_bins=64)
    with pytest.raises(ValueError, match="cannot read the input shape of _FlatLinear"):
        imprint.apply_to_model(copy.deepcopy(users_model))
    imprint.use_data(digits)  # what the loop and the commands call first; the given statistics are kept
    assert imprint.feature_mean == _imprint(digits, num_bins=64).feature_mean
    images, _ = _held_out(digits, 8)
    assert imprint.apply_to_model(users_model)(images).shape == (8, 10)
    assert imprint.block is not None and imprint.block.input_shape == (1, 16, 16)


def test_the_imprint_runs_once_in_a_users_bare_sequential(digits: FederatedDataModule) -> None:
    """nn.Sequential's forward runs every child: the block is its first child, not a hook plus a last child."""
    users_model = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(256, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)
    )
    imprint = _imprint(digits, num_bins=512)
    imprint.use_data(digits)
    imprinted = imprint.apply_to_model(users_model)
    assert imprinted[0] is imprint.block
    images, labels = _held_out(digits, 8)
    assert imprinted(images).shape == (8, 10)
    view = client_view(imprinted, images, labels, num_classes=10)
    assert _recovered(RobbingTheFedAttack().reconstruct(view).images, images) >= 6


@pytest.mark.parametrize(("batch", "at_least"), [(8, 8), (32, 24)])
def test_attack_copies_most_of_a_held_out_batch_out_of_one_gradient(
    digits: FederatedDataModule, batch: int, at_least: int
) -> None:
    images, labels = _held_out(digits, batch)
    view = client_view(_imprinted(digits, num_bins=512), images, labels, num_classes=10)
    reconstruction = RobbingTheFedAttack().reconstruct(view)
    assert len(reconstruction.images) <= batch
    assert _recovered(reconstruction.images, images) >= at_least


def test_attack_reads_an_update_of_several_local_steps(digits: FederatedDataModule) -> None:
    images, labels = _held_out(digits, 16)
    view = client_view(_imprinted(digits, num_bins=512), images, labels, num_classes=10, local_steps=4, lr=0.01)
    assert view.kind == "update"
    assert _recovered(RobbingTheFedAttack().reconstruct(view).images, images) >= 12


def test_attack_without_an_imprint_block_says_what_to_add(digits: FederatedDataModule) -> None:
    images, labels = _held_out(digits, 2)
    view = client_view(make_classifier(digits), images, labels, num_classes=10)
    with pytest.raises(ValueError, match="add MaliciousImprint"):
        RobbingTheFedAttack().reconstruct(view)


def test_server_reimposes_the_imprint_and_the_attack_reads_both_leak_points(
    digits: FederatedDataModule, tmp_path: Path
) -> None:
    imprint = _imprint(digits, num_bins=256)
    leaks = [
        GradientLeakage(RobbingTheFedAttack(), leak_point=point, rounds=[1], clients=[0], max_images=64)
        for point in ("local_gradient", "client_update")
    ]
    loop = FederatedLoop(
        make_classifier(digits, optimizer="sgd", lr=0.1),
        FederatedDataModule("digits", num_clients=20, partition="iid", image_size=16, val_fraction=0.0, batch_size=8),
        server_plugins=[imprint],
        callbacks=leaks,
        num_rounds=2,
        clients_per_round=2,
        local_steps=2,
        eval_every=0,
        checkpoint=False,
        progress_bar=False,
        output_dir=tmp_path,
    )
    summary = loop.fit()
    assert any(k.startswith("imprint.bins") for k in loop.spec.update_keys)  # the block is public: it is shipped
    assert not torch.equal(loop.global_model.imprint.bins.bias, imprint.block.malicious["bins.bias"])  # FedAvg moved it
    sent = imprint.broadcast_transforms()[0](dict(loop.global_public_state()), ctx=loop.round_context())
    assert torch.equal(sent["imprint.bins.bias"], imprint.block.malicious["bins.bias"])
    entries = {e["leak_point"]: e for e in json.loads((tmp_path / "summary.json").read_text())["attacks"]}
    assert entries["local_gradient"]["recovered"] >= 6  # one step of 8 images
    assert entries["client_update"]["recovered"] >= 10  # two steps of 8 images
    assert summary["rounds_completed"] == 2


def test_an_update_of_one_step_on_one_image_is_scored_against_that_image(
    digits: FederatedDataModule, tmp_path: Path
) -> None:
    """At client_update with one local step on one image, the attack's candidates are matched against the image the
    step drew (not the client's whole training set): the copy is exact, so the mean PSNR is high, not a mean over
    the nearest of the client's other images."""
    leak = GradientLeakage(RobbingTheFedAttack(), leak_point="client_update", rounds=[0], clients=[0], max_images=8)
    FederatedLoop(
        make_classifier(digits, optimizer="sgd", lr=0.1),
        FederatedDataModule("digits", num_clients=2, partition="iid", image_size=16, val_fraction=0.0, batch_size=1),
        server_plugins=[_imprint(digits, num_bins=64)], callbacks=[leak], num_rounds=1, clients_per_round=2,
        local_steps=1,
        eval_every=0, checkpoint=False, progress_bar=False, output_dir=tmp_path,
    ).fit()  # fmt: skip
    entry = json.loads((tmp_path / "summary.json").read_text())["attacks"][0]
    assert entry["leak_point"] == "client_update" and entry["recovered"] == 1
    assert entry["psnr"] >= 60, entry


def test_model_defences_do_not_stop_it(digits: FederatedDataModule) -> None:
    """A key-lock behind the block changes what reaches the rest of the model, not the ratio of its gradients."""
    images, labels = _held_out(digits, 8)
    model = apply_defences(_imprinted(digits, num_bins=256), [KeyLocks(key_length=16)])
    reconstruction = RobbingTheFedAttack().reconstruct(client_view(model, images, labels, num_classes=10))
    assert _recovered(reconstruction.images, images) == 8


def test_attack_config_parses(capsys: pytest.CaptureFixture) -> None:
    for name in ("robbing_the_fed_digits", "robbing_the_fed_photos"):
        with pytest.raises(SystemExit):
            main(["attack", "--config", str(CONFIGS / f"{name}.yaml"), "--print_config"])
        assert "MaliciousImprint" in capsys.readouterr().out


@pytest.mark.parametrize(("gain", "at_least", "at_most"), [(1.0, 0, 0), (1e-5, 7, 8)])
def test_a_lower_gain_outshouts_noise_without_clipping(
    digits: FederatedDataModule, gain: float, at_least: int, at_most: int
) -> None:
    images, labels = _held_out(digits, 8)
    view = client_view(_imprinted(digits, num_bins=256, gain=gain), images, labels, num_classes=10)
    noise = torch.Generator().manual_seed(0)
    noisy = {k: v + 1e-2 * torch.randn(v.shape, generator=noise) for k, v in view.tensors.items()}
    recovered = _recovered(RobbingTheFedAttack().reconstruct(replace(view, tensors=noisy)).images, images)
    assert at_least <= recovered <= at_most


def test_the_attack_command_scores_every_image_of_the_batch(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """With 64 bins for a batch of 64 images some share a bin and are missed: summary.json's means and counts are
    over all 64 images (a miss scored as the mid-grey guess), not over the images the attack returned."""
    out = tmp_path / "rtf"
    args = ["attack", "-c", str(CONFIGS / "robbing_the_fed_digits.yaml"), "--output_dir", str(out)]
    assert main([*args, "--server_plugins.0.init_args.num_bins", "64"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    (entry,), totals = summary["attacks"], summary["totals"]
    assert entry["num_images"] == totals["num_images"] == len(entry["per_image"]["psnr"]) == 64
    assert entry["recovered"] <= entry["reconstructed"] < 64
    assert totals["reconstructed"] == entry["reconstructed"] and totals["psnr_capped"] == entry["psnr_capped"]
    assert entry["per_image"]["reconstructed"].count(False) == 64 - entry["reconstructed"]
    assert totals["share_recovered"] == pytest.approx(sum(v >= 0.5 for v in entry["per_image"]["ssim"]) / 64)
    assert f"{entry['reconstructed']} of 64" in capsys.readouterr().out
