"""The BatchNorm statistics an attacker knows: read off a FedSGD update, used as a prior, refused where absent."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.func import replace_all_batch_norm_modules_

from lightning_fl.attacks import InvertingGradientsAttack
from lightning_fl.attacks.batch_norm import (
    batch_norm_distance,
    batch_norm_prior,
    batch_norm_statistics,
    batch_norm_step_weights,
    leaked_batch_statistics,
)
from lightning_fl.attacks.local_update import simulated_pseudo_gradient
from lightning_fl.attacks.priors import total_variation
from lightning_fl.attacks.standalone import AttackRun, client_view, run_attack
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.datamodules.datasets import load_dataset
from lightning_fl.messages import ServerView
from lightning_fl.models import ConvNet, ImageClassifier


def photo_tile(index: int = 80) -> tuple[torch.Tensor, torch.Tensor]:
    data = load_dataset("photo_tiles", train=True, image_size=32)
    images = data.images[index : index + 1]
    return (images.float() / 255 if images.dtype == torch.uint8 else images), data.labels[index : index + 1]


def two_step_view() -> tuple[ServerView, torch.Tensor, torch.Tensor]:
    """The update of two SGD steps (lr 0.1) on two pairs of photo tiles by a width-4 ConvNet, and its batch."""
    torch.manual_seed(0)
    model = ConvNet(width=4, num_classes=9)
    data = load_dataset("photo_tiles", train=True, image_size=32)
    images, labels = data.images[80:84].float() / 255, data.labels[80:84]
    return client_view(model, images, labels, num_classes=9, local_steps=2, lr=0.1), images, labels


def test_a_fedsgd_update_of_a_batchnorm_net_leaks_every_layers_batch_statistics() -> None:
    torch.manual_seed(0)
    model = ConvNet(width=4, num_classes=9)
    images, labels = photo_tile()
    view = client_view(model, images, labels, num_classes=9)
    leaked = leaked_batch_statistics(view)
    seen: list[torch.Tensor] = []
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    hooks = [m.register_forward_pre_hook(lambda _, args: seen.append(args[0])) for m in norms]
    model.train()(images)
    for hook in hooks:
        hook.remove()
    assert leaked is not None and len(leaked) == len(norms) == 8
    for (mean, var), features in zip(leaked, seen, strict=True):
        assert torch.allclose(mean, features.mean((0, 2, 3)), atol=1e-4)
        assert torch.allclose(var, features.var((0, 2, 3)), rtol=1e-3, atol=1e-4)
    prior = batch_norm_prior(view.model, leaked, correction=1)
    assert float(prior(images).detach()) < 1e-2 < float(prior(torch.rand_like(images)).detach())


def test_a_two_step_update_leaks_the_weighted_mean_of_its_batches_statistics() -> None:
    view, images, labels = two_step_view()
    leaked = leaked_batch_statistics(view)
    attacker = copy.deepcopy(view.model)
    replace_all_batch_norm_modules_(attacker)
    norms = [m for m in attacker.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    params = {n: p.detach() for n, p in attacker.named_parameters()}
    buffers = {n: b.detach() for n, b in attacker.named_buffers()}

    def distance(candidates: torch.Tensor, weights: list[list[float]] | None = None) -> float:
        _, step_inputs = simulated_pseudo_gradient(
            attacker,
            params,
            buffers,
            candidates,
            F.one_hot(labels, 9).float(),
            local_steps=2,
            lr=0.1,
            data_per_step=2,
            modules=norms,
        )
        weights = weights or batch_norm_step_weights(view.model, 2)
        return float(batch_norm_distance(step_inputs, leaked, correction=1, step_weights=weights).detach())

    assert leaked is not None and len(leaked) == len(norms) == 8
    assert distance(images) < 1e-2 < 1.0 < distance(torch.rand_like(images))
    assert distance(images[[2, 3, 0, 1]]) > 1e-2  # each step's batch has its own weight and parameters
    assert distance(images, [[0.5, 0.5]] * 8) > 0.1  # the steps weigh as the momentum makes them (0.47, 0.53)
    buffers_withheld = {n: t for n, t in view.tensors.items() if not n.endswith(("running_mean", "running_var"))}
    view = dataclasses.replace(view, tensors=buffers_withheld)
    assert leaked_batch_statistics(view) is None and batch_norm_statistics(view, "auto") is None
    with pytest.raises(ValueError, match="bn_statistics='leaked' needs an update that shares the BatchNorm running"):
        batch_norm_statistics(view, "leaked")


def test_attack_run_over_several_batches_reports_totals_with_intervals(tmp_path: Path) -> None:
    dm = FederatedDataModule("digits", num_clients=2, partition="iid", image_size=16)
    torch.manual_seed(0)
    model = ImageClassifier(**dm.model_options, backbone="lenet_dlg")
    attack = InvertingGradientsAttack(max_iterations=5, restarts=1, progress_bar=False)
    totals = run_attack(attack, data=dm, model=model, run=AttackRun(batch_size=2, batches=3), output_dir=tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["totals"] == totals and len(summary["attacks"]) == 3
    assert totals["num_images"] == 6 and len(totals["per_image_ssim"]) == 6
    low, high = totals["ssim_interval"]
    assert low <= totals["ssim"] <= high and 0 <= totals["share_recovered"] <= 1
    attacked = [name for entry in summary["attacks"] for name in entry["attacked"]]
    assert len(set(attacked)) == 6  # disjoint batches
    with pytest.raises(ValueError, match=r"run.batches=0 must be >= 1"):
        AttackRun(batches=0)


def test_one_batch_of_several_images_reports_its_mean_with_an_interval(tmp_path: Path) -> None:
    dm = FederatedDataModule("digits", num_clients=2, partition="iid", image_size=16)
    torch.manual_seed(0)
    model = ImageClassifier(**dm.model_options, backbone="lenet_dlg")
    attack = InvertingGradientsAttack(max_iterations=3, restarts=1, progress_bar=False)
    entry = run_attack(attack, data=dm, model=model, run=AttackRun(batch_size=4), output_dir=tmp_path)
    totals = json.loads((tmp_path / "summary.json").read_text())["totals"]
    assert totals["batches"] == 1 and totals["num_images"] == entry["num_images"] == 4
    assert totals["ssim_interval"][0] <= totals["ssim"] <= totals["ssim_interval"][1]


def test_the_fused_batch_norm_prior_equals_the_separate_prior_model() -> None:
    torch.manual_seed(0)
    model = ConvNet(width=4, num_classes=9)
    images, labels = photo_tile()
    view = client_view(model, images, labels, num_classes=9)
    attack = InvertingGradientsAttack(
        max_iterations=1, restarts=2, tv_weight=0.5, bn_statistics="leaked", bn_weight=0.3, init="image_randn"
    )
    problem = attack.problem(view)
    candidates = problem.images.detach().requires_grad_()
    total, gap = problem.objective(candidates, problem.label_input)
    prior = batch_norm_prior(view.model, leaked_batch_statistics(view), correction=1)
    expected = torch.stack([gap[r] + 0.3 * prior(candidates[r]) + 0.5 * total_variation(candidates[r]) for r in (0, 1)])
    assert torch.allclose(total, expected, rtol=1e-5)
    fused, separate = (torch.autograd.grad(t.sum(), candidates, retain_graph=True)[0] for t in (total, expected))
    assert torch.allclose(fused, separate, rtol=1e-4, atol=1e-6)


def test_a_two_step_attack_matches_its_simulated_steps_statistics_to_the_leaked_ones() -> None:
    view, images, labels = two_step_view()
    attack = InvertingGradientsAttack(max_iterations=1, restarts=1, tv_weight=0.0, bn_statistics="leaked", bn_weight=1)
    problem = attack.problem(view)
    truth = F.one_hot(labels, 9).float()[None]
    at_truth, gap = problem.objective(images[None], truth)
    elsewhere, _ = problem.objective(torch.rand_like(images)[None], truth)
    assert float(at_truth.detach()) < 1e-3 < 1.0 < float(elsewhere.detach())
    assert float(gap.detach()) < 1e-4
