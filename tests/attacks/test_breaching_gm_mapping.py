"""The ``ig`` part of benchmarks/breaching_parity.py compares like with like: our Inverting Gradients matched to
breaching 0.1.2's shipped ``invertinggradients`` config (``our_attacks``) starts from breaching's random start and
evaluates breaching's objective (cosine distance plus total variation) on a training-mode gradient. Skipped where
breaching and hydra are not installed (CI)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

pytest.importorskip("breaching")
pytest.importorskip("hydra")

import breaching

from lightning_fl.attacks.priors import total_variation
from lightning_fl.attacks.standalone import client_view
from tests.conftest import load_breaching_parity

parity = load_breaching_parity()


@pytest.fixture(scope="module")
def setting() -> tuple:
    """A one-BN-layer net, the training-mode gradient of one image (no buffers sent), breaching's shipped IG config
    at 10 steps, our matched attack with seed 3, and one candidate image in [0, 1]."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(256, 5))
    view = client_view(net, torch.rand(1, 3, 8, 8), torch.tensor([2]), num_classes=5)
    config = parity.attack_config("invertinggradients", 10)
    attack = parity.our_attacks("ig", config, iterations=10, seed=3)["ours matched"]
    return net, view, config, attack, torch.rand(1, 3, 8, 8)


def test_matched_ig_starts_where_breaching_starts(setting: tuple) -> None:
    net, view, config, attack, _ = setting
    attacker = breaching.attacks.prepare_attack(net, nn.CrossEntropyLoss(), config, parity.CPU)
    torch.manual_seed(3)
    theirs = attacker._initialize_data([1, 3, 8, 8])
    assert torch.equal(attack.problem(view).images[0].detach(), theirs.detach())


def test_matched_ig_evaluates_breachings_objective(setting: tuple) -> None:
    net, view, config, attack, candidate = setting
    assert (attack.restarts, attack.lr, attack.tv_weight, attack.max_iterations) == (1, 0.1, 0.2, 10)
    terms, labels = parity.objective_terms(net, view, config, {"candidate": candidate}, buffers=False)
    theirs = terms["candidate"]
    total, gap = attack.problem(view).objective(candidate[None], nn.functional.one_hot(labels.cpu(), 5).float()[None])
    assert float(gap[0]) == pytest.approx(theirs["data"], rel=1e-4)
    tv = attack.tv_weight * float(total_variation(candidate))
    assert tv == pytest.approx(theirs["TotalVariation"], rel=0.1)  # breaching also counts the zero-padded border
    assert float(total[0]) == pytest.approx(float(gap[0]) + tv, rel=1e-5)


def test_config_side_runs_the_shipped_full_config() -> None:
    config = parity.attack_config("invertinggradients", 10)
    attack = parity.our_attacks("ig", config, iterations=10, seed=3)["ours config"]
    shipped = parity.read_yaml(parity.FULL_CONFIG)["attack"]["init_args"]
    assert shipped["bn_weight"] > 0 and shipped["restarts"] > 1  # the config's priors and restarts, not breaching's
    for key, value in shipped.items():
        assert getattr(attack, key) == (3 if key == "seed" else False if key == "progress_bar" else value), key
