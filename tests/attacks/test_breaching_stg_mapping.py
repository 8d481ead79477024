"""The translation of breaching 0.1.2's ``seethroughgradients`` config into ``SeeThroughGradientsAttack`` options
(benchmarks/breaching_parity.py ``matched_options``): on one candidate batch, breaching's objective equals ours
times ``0.5 * objective.scale``, term by term. Skipped where breaching and hydra are not installed (CI)."""

from __future__ import annotations

import copy
import re

import pytest
import torch
from torch import nn

pytest.importorskip("breaching")
pytest.importorskip("hydra")

from omegaconf import open_dict

from lightning_fl.attacks import SeeThroughGradientsAttack
from lightning_fl.attacks.batch_norm import batch_norm_prior
from lightning_fl.attacks.priors import total_variation
from tests.conftest import load_breaching_parity

parity = load_breaching_parity()


@pytest.fixture(scope="module")
def setting() -> tuple:
    """A one-BN-layer net in eval mode (running statistics of another batch), the eval-mode gradient of two
    images, breaching's shipped config at 10 steps, and one candidate batch in [0, 1]."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(256, 5))
    with torch.no_grad():
        net.train()(torch.rand(32, 3, 8, 8))
    images, labels = torch.rand(2, 3, 8, 8), torch.tensor([1, 3])
    view = parity.eval_view(net, images, labels, 5)
    config = parity.stg_config(10)
    with open_dict(config):  # ours has no extra weight on the first BN layer
        config.regularization.deep_inversion.first_bn_multiplier = 1
    return net, view, config, torch.rand(2, 3, 8, 8)


def test_matched_options_reproduce_breachings_objective_term_by_term(setting: tuple) -> None:
    net, view, config, candidate = setting
    options = parity.matched_options(config, batch_numel=candidate.numel())
    assert (options["restarts"], options["group_weight"], options["label_strategy"]) == (1, 0.0, "yin")
    factor = 0.5 * config.objective.scale
    terms, labels = parity.objective_terms(net, view, config, {"candidate": candidate})
    theirs = terms["candidate"]

    problem = SeeThroughGradientsAttack(**options, progress_bar=False).problem(view)
    one_hot = nn.functional.one_hot(labels.cpu(), 5).float()[None]
    total, gap = problem.objective(candidate[None], one_hot)
    assert float(gap[0]) * factor == pytest.approx(theirs["data"], rel=1e-4)
    bn = options["bn_weight"] * float(batch_norm_prior(view.model)(candidate))
    assert bn * factor == pytest.approx(theirs["DeepInversion"], rel=1e-4)
    l2 = options["l2_weight"] * float(candidate.pow(2).sum())
    assert l2 * factor == pytest.approx(theirs["NormRegularization"], rel=1e-4)
    tv = options["tv_weight"] * float(total_variation(candidate))
    assert tv * factor == pytest.approx(theirs["TotalVariation"], rel=0.1)  # breaching also counts the zero border
    assert float(total[0]) == pytest.approx(float(gap[0]) + bn + l2 + tv, rel=1e-5)


def test_matched_options_refuse_what_they_cannot_translate(setting: tuple) -> None:
    config = copy.deepcopy(setting[2])
    config.objective.type = "cosine-similarity"
    config.regularization.norm.pnorm = 1
    with pytest.raises(ValueError, match=re.escape("objective.type=cosine-similarity, norm.pnorm=1")):
        parity.matched_options(config, batch_numel=1)
