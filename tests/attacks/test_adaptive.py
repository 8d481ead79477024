"""Adaptive attacks: each recovers clearly more than the non-adaptive Inverting Gradients from the defended view."""

from __future__ import annotations

import copy
import dataclasses
import itertools

import pytest
import torch
import torch.nn.functional as F

from lightning_fl.attacks import (
    GradientMatchingAttack,
    InvertingGradientsAttack,
    KnownMaskAttack,
    NoiseAwareAttack,
    PrivateUnknownsAttack,
)
from lightning_fl.attacks.metrics import score_reconstruction
from lightning_fl.attacks.standalone import client_view
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.defences import KeyLocks, Passports, PrivateSplit, apply_defences
from lightning_fl.defences.dp.baselines import add_gaussian_noise, prune_smallest
from lightning_fl.messages import GroundTruth, ServerView
from lightning_fl.private import load_state_into, public_state, reset_private_state
from tests.attacks.views import digits_view, user_net_tile_view
from tests.conftest import make_classifier

pytestmark = pytest.mark.filterwarnings("ignore:LPIPS")


def _scores(attack: GradientMatchingAttack, view: ServerView, truth: GroundTruth) -> tuple[float, float]:
    scores = score_reconstruction(attack.reconstruct(view), truth)
    return scores["psnr"], scores["ssim"]


def _ig(iterations: int) -> InvertingGradientsAttack:
    return InvertingGradientsAttack(max_iterations=iterations, restarts=1, progress_bar=False)


def test_known_mask_recovers_the_image_that_pruning_hides_from_inverting_gradients() -> None:
    view, truth = digits_view()
    pruned = dataclasses.replace(view, tensors=prune_smallest(view.tensors, ratio=0.9))
    plain = _scores(_ig(200), pruned, truth)
    adaptive = _scores(KnownMaskAttack(max_iterations=200, restarts=1, progress_bar=False), pruned, truth)
    assert plain[0] < 15 and adaptive[0] > plain[0] + 8 and adaptive[1] > 0.8, (plain, adaptive)


@pytest.mark.parametrize("noise", ["gaussian", "laplace"])
def test_noise_aware_objective_recovers_more_than_inverting_gradients_under_noise(noise: str) -> None:
    view, truth = digits_view()
    scale = 0.1 if noise == "gaussian" else 0.07  # noise about the gradient's own RMS (0.12)
    generator = torch.Generator().manual_seed(1)
    if noise == "gaussian":
        tensors = add_gaussian_noise(view.tensors, noise_std=scale, generator=generator)
    else:
        laplace = torch.distributions.Laplace(0.0, scale)
        torch.manual_seed(1)
        tensors = {k: v + laplace.sample(v.shape) for k, v in view.tensors.items()}
    noisy = dataclasses.replace(view, tensors=tensors)
    plain = _scores(_ig(200), noisy, truth)
    attack = NoiseAwareAttack(noise=noise, noise_scale=scale, max_iterations=200, restarts=1, progress_bar=False)
    adaptive = _scores(attack, noisy, truth)
    # measured: Gaussian +2.1 dB / +0.08, Laplace above +3 dB / +0.1 (docs/attacks.md, "Adaptive attacks")
    psnr_gain, ssim_gain = (1.5, 0.05) if noise == "gaussian" else (3.0, 0.1)
    assert adaptive[0] > plain[0] + psnr_gain and adaptive[1] > plain[1] + ssim_gain, (plain, adaptive)


def test_noise_aware_is_as_strong_as_inverting_gradients_on_a_batchnorm_net_with_small_noise() -> None:
    """On the user's ReLU + BatchNorm net the update's noise (std 0.01, 0.1 % of the gradient's energy) is far below
    the attacker's own model error, so the posterior keeps Inverting Gradients' prior weights (TV 2, BatchNorm 0.3)
    and recovers the tile as Inverting Gradients does; an objective whose prior is weighed by the noise alone
    (lambda 2 s^2) runs without priors and stays at SSIM ~0.2 (docs/attacks.md, "Adaptive attacks")."""
    view, truth = user_net_tile_view()
    generator = torch.Generator().manual_seed(100)
    parameters = dict(view.model.named_parameters())
    tensors = {  # GaussianNoise(unit="gradient"): std 0.01 on the pseudo-gradient, std 0.01 * lr on the buffers
        name: value + (0.01 if name in parameters else 0.01 * 0.05) * torch.randn(value.shape, generator=generator)
        for name, value in view.tensors.items()
    }
    noisy = dataclasses.replace(view, tensors=tensors)
    attack = NoiseAwareAttack(
        noise_scale=0.01,
        prior_weight=2.0,
        bn_statistics="auto",
        bn_weight=0.3,
        init="image_randn",
        max_iterations=400,
        restarts=1,
        progress_bar=False,
    )
    psnr, ssim = _scores(attack, noisy, truth)
    assert ssim > 0.5, (psnr, ssim)  # the success bar; 0.65 measured, ~0.2 with the prior weighed by s^2 alone


def _private_view(
    defence: object,
    *,
    train_steps: int = 0,
    image_seed: int = 0,
    key_seed: int = 7,
    backbone: str = "lenet_dlg",
    local_steps: int = 1,
) -> tuple[ServerView, GroundTruth]:
    """One digit's gradient (or the update of ``local_steps`` steps on two digits of distinct classes each) from a
    client whose private state the server's model does not hold: its own secrets (drawn by ``reset_private``) and,
    after ``train_steps`` SGD steps, its own trained private layers."""
    dm = FederatedDataModule("digits", num_clients=2, partition="iid", image_size=16)
    torch.manual_seed(0)
    server = apply_defences(make_classifier(dm, backbone=backbone), [defence])
    client = copy.deepcopy(server)
    reset_private_state(client, generator=torch.Generator().manual_seed(key_seed))
    if train_steps:
        images, labels = dm.sample_batch(0, 64, seed=5)
        optimizer = torch.optim.SGD(client.parameters(), lr=0.1)
        for _ in range(train_steps):
            optimizer.zero_grad()
            F.cross_entropy(client(images), labels).backward()
            optimizer.step()
        load_state_into(server, dict(public_state(client)))
    images, labels = dm.sample_batch(0, 1 if local_steps == 1 else 100, seed=image_seed)
    if local_steps > 1:
        first = [int((labels == c).nonzero()[0]) for c in labels.unique()[: 2 * local_steps]]
        images, labels = images[first], labels[first]
    view = client_view(client, images, labels, num_classes=dm.num_classes, local_steps=local_steps, lr=0.1)
    return dataclasses.replace(view, model=copy.deepcopy(server).train()), GroundTruth(images, labels)


@pytest.mark.parametrize(
    ("defence", "private", "step", "train_steps", "psnr_gain", "ssim_gain"),
    [
        (KeyLocks(key_length=1024), "secrets", 0.3, 0, 2.0, 0.3),
        (Passports(num_convs=1, passport_size=16), "secrets", 0.1, 0, 10.0, 0.4),
        (PrivateSplit(cut=1), "all", 0.1, 30, 4.0, 0.04),
    ],
    ids=["keylock", "passports", "split"],
)
def test_private_unknowns_recover_more_than_inverting_gradients_with_the_servers_guess(
    defence: object, private: str, step: float, train_steps: int, psnr_gain: float, ssim_gain: float
) -> None:
    view, truth = _private_view(defence, train_steps=train_steps)
    plain = _scores(_ig(400), view, truth)
    attack = PrivateUnknownsAttack(
        private=private, private_step=step, max_iterations=400, restarts=1, progress_bar=False
    )
    adaptive = _scores(attack, view, truth)
    assert adaptive[0] > plain[0] + psnr_gain and adaptive[1] > plain[1] + ssim_gain, (plain, adaptive)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("defence", "step"), [(KeyLocks(key_length=1024), 0.3), (Passports(num_convs=1, passport_size=16), 0.1)]
)
def test_secrets_hold_on_another_digit_although_the_joint_fit_matches_the_gradient_better(
    defence: object, step: float
) -> None:
    """The finding is mixed (docs/attacks.md): on this digit and key the joint fit of the secrets halves the
    gradient distance but the image stays unrecognisable, as with the server's own secrets."""
    view, truth = _private_view(defence, image_seed=1, key_seed=3)
    plain = _ig(400).reconstruct(view)
    attack = PrivateUnknownsAttack(
        private="secrets", private_step=step, max_iterations=400, restarts=1, progress_bar=False
    )
    adaptive = attack.reconstruct(view)
    gaps = plain.info["relative_gap"], adaptive.info["relative_gap"]
    ssims = [score_reconstruction(r, truth)["ssim"] for r in (plain, adaptive)]
    assert gaps[1] < 0.75 * gaps[0] and max(ssims) < 0.5, (gaps, ssims)


def test_private_unknowns_leave_the_views_model_unchanged() -> None:
    view, _ = _private_view(KeyLocks(key_length=16))
    before = {k: v.clone() for k, v in view.model.state_dict().items()}
    PrivateUnknownsAttack(max_iterations=2, restarts=1, progress_bar=False).reconstruct(view)
    after = view.model.state_dict()
    assert sorted(after) == sorted(before) and all(torch.equal(before[k], after[k]) for k in before)


def test_each_restart_fits_its_own_secrets() -> None:
    """A restart is one joint hypothesis of image and secrets: restart 0 of two follows the path of the same attack
    with one restart (they start from the same image). Secrets shared by the restarts took the other restart's pull
    too, and restart 0 left that path."""
    view, _ = _private_view(Passports(num_convs=1, passport_size=16))

    def run(restarts: int) -> list[torch.Tensor]:
        attack = PrivateUnknownsAttack(max_iterations=30, restarts=restarts, progress_bar=False)
        return [state.images[0] for state in attack.iterate(view)]

    alone, among_two = run(1), run(2)
    assert torch.allclose(alone[-1], among_two[-1], atol=1e-4)
    problem = PrivateUnknownsAttack(max_iterations=2, restarts=3, progress_bar=False).problem(view)
    secrets = problem.variables[1:]  # the images, then the passports: no labels with a known label
    assert secrets and all(len(s) == 3 for s in secrets)


def test_the_settle_step_starts_the_secrets_of_the_redrawn_restarts_again() -> None:
    """Restarts given another split of the labels into the two local steps start again from fresh images and from
    the first guess of the secrets: one Adam step (at most ``lr`` a coordinate) after the settle step they are that
    close to it, while the winner's secrets went on (more than ``lr`` from it)."""
    view, _ = _private_view(Passports(num_convs=1, passport_size=16), local_steps=2)
    attack = PrivateUnknownsAttack(max_iterations=6, restarts=3, settle_labels_after=3, progress_bar=False)
    problem = attack.problem(view)
    first_guess = [s.detach().clone() for s in problem.variables[1:]]
    states = list(itertools.islice(attack.iterate(view, problem=problem), 4))
    winner = int(states[2].best_losses.argmin())
    assert len({tuple(labels.tolist()) for labels in states[3].labels}) == 1
    secrets = zip(problem.variables[1:], first_guess, strict=True)
    moved = torch.stack([(s.detach() - g).flatten(1).abs().amax(1) for s, g in secrets]).amax(0)
    redrawn = [r for r in range(3) if r != winner]
    assert bool((moved[redrawn] <= attack.lr * 1.001).all()) and moved[winner] > 1.5 * attack.lr, (winner, moved)


def test_private_unknowns_take_the_batch_norm_prior_through_the_unknown_keys() -> None:
    """On a BatchNorm net the prior's statistics come from the same forward pass as the candidate's gradient, the
    client's keys as unknowns included; a weight of 0 leaves it out."""
    view, _ = _private_view(KeyLocks(key_length=16), backbone="conv_bn_pool")
    images = [
        PrivateUnknownsAttack(max_iterations=3, restarts=1, progress_bar=False, bn_statistics="auto", bn_weight=weight)
        .reconstruct(view)
        .images
        for weight in (0.0, 0.3)
    ]
    assert images[0].shape == images[1].shape == (1, 1, 16, 16)
    assert not torch.allclose(images[0], images[1])


def test_adaptive_attacks_reject_bad_settings() -> None:
    view, _ = digits_view()
    with pytest.raises(ValueError, match="has no private tensor"):
        PrivateUnknownsAttack(max_iterations=2, restarts=1, progress_bar=False).reconstruct(view)
    with pytest.raises(ValueError, match="private='x'"):
        PrivateUnknownsAttack(private="x")
    with pytest.raises(ValueError, match="noise='poisson'"):
        NoiseAwareAttack(noise="poisson", noise_scale=1.0)
    with pytest.raises(ValueError, match="the scale must be > 0"):
        NoiseAwareAttack(noise_scale=0.0)
