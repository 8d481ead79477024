"""Soteria, PRECODE, MixUp and InstaHide: each mechanism against its formula on tiny tensors; bad options refused."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch import nn
from torch.utils.data import TensorDataset

from lightning_fl.defences import (
    PRECODE,
    InstaHide,
    MixUp,
    Soteria,
    VariationalBottleneck,
    add_precode,
    apply_defences,
    flip_signs,
    gaussian_kl,
    mix_examples,
    representation_sensitivity,
    soteria_mask,
)


def _tiny_net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(6, 5), nn.Sigmoid(), nn.Linear(5, 3))


# -- MixUp / InstaHide ------------------------------------------------------------------------------------------------
def test_mix_examples_is_the_weighted_sum_of_inputs_and_one_hot_labels() -> None:
    generator = torch.Generator().manual_seed(0)
    inputs, labels = torch.randn(4, 3, 2, 5, generator=generator), torch.randint(0, 6, (4, 3), generator=generator)
    weights = torch.rand(4, 3, generator=generator)
    weights /= weights.sum(dim=1, keepdim=True)
    mask = torch.tensor([1.0, 1.0, 0.0])
    mixed, soft = mix_examples(inputs, labels, weights, num_classes=6, label_mask=mask)
    for i in range(4):
        assert torch.allclose(mixed[i], sum(weights[i, j] * inputs[i, j] for j in range(3)))
        expected = torch.zeros(6)
        for j in range(2):
            expected[labels[i, j]] += weights[i, j]
        assert torch.allclose(soft[i], expected)


def test_mixup_weights_are_dirichlet_or_equal() -> None:
    weights = MixUp(k=4, alpha=1.0).coefficients(20_000, torch.Generator().manual_seed(0))
    assert torch.allclose(weights.sum(dim=1), torch.ones(20_000), atol=1e-6)
    assert torch.allclose(weights.mean(dim=0), torch.full((4,), 0.25), atol=0.01)
    assert abs(float(weights[:, 0].var()) - 3 / 80) < 0.003  # Dirichlet(1,1,1,1): var = (k-1) / (k^2 (k+1))
    assert torch.equal(MixUp(k=4, alpha=None).coefficients(2, torch.Generator()), torch.full((2, 4), 0.25))


def test_instahide_weights_are_bounded_and_signs_flip_half_the_pixels() -> None:
    weights = InstaHide(k=4, max_coefficient=0.5).coefficients(1000, torch.Generator().manual_seed(0))
    assert torch.allclose(weights.sum(dim=1), torch.ones(1000), atol=1e-6) and float(weights.max()) <= 0.5
    images = torch.rand(8, 1, 16, 16)
    flipped = flip_signs(images, generator=torch.Generator().manual_seed(0), center=0.5)
    assert torch.allclose((flipped - 0.5).abs(), (images - 0.5).abs())
    assert abs(float(((flipped - 0.5).sign() != (images - 0.5).sign()).float().mean()) - 0.5) < 0.05


def _mixing_step(
    defence: MixUp | InstaHide,
) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """One training batch through ``defence``: what the step trains on, and the batch after the loss."""
    inputs, labels = torch.rand(5, 1, 4, 4), torch.zeros(5, dtype=torch.long)
    partner = torch.rand(1, 1, 4, 4)  # the training set: one example of class 1
    trainer = SimpleNamespace(train_dataloader=SimpleNamespace(dataset=TensorDataset(partner, torch.tensor([1]))))
    batch = [inputs, labels]
    defence.on_train_batch_start(trainer, SimpleNamespace(num_classes=3), batch, 0)
    trained = list(batch)
    defence.on_before_backward(trainer, None, torch.zeros(()))
    return trained, batch, inputs, partner


def test_mixup_callback_trains_on_mixtures_with_soft_labels_and_restores_the_batch() -> None:
    (mixed, soft), batch, inputs, partner = _mixing_step(MixUp(k=2, alpha=0.5))
    weight = soft[:, 0]  # label 0 is the example's own, label 1 the partner's
    assert torch.allclose(soft.sum(dim=1), torch.ones(5)) and soft[:, 2].eq(0).all()
    assert torch.allclose(mixed, weight.view(5, 1, 1, 1) * inputs + (1 - weight).view(5, 1, 1, 1) * partner)
    assert batch[0] is inputs and batch[1].dtype == torch.long  # the loop's record of the batch is the private one


def test_instahide_callback_mixes_then_flips_signs() -> None:
    (hidden, soft), batch, inputs, partner = _mixing_step(InstaHide(k=2, center=0.5))
    weight = soft[:, 0].view(5, 1, 1, 1)
    mixture = weight * inputs + (1 - weight) * partner
    assert torch.allclose((hidden - 0.5).abs(), (mixture - 0.5).abs(), atol=1e-6)
    assert not torch.allclose(hidden, mixture) and batch[0] is inputs


def test_instahide_public_images_fill_their_slots_and_stay_out_of_the_label() -> None:
    public = torch.full((3, 1, 4, 4), 7.0)
    hide = InstaHide(k=3, num_public=1, public_images=public)
    private = TensorDataset(torch.zeros(2, 1, 4, 4), torch.ones(2, dtype=torch.long))
    trainer = SimpleNamespace(train_dataloader=SimpleNamespace(dataset=private))
    inputs, labels = hide.partners(trainer, 4, torch.Generator().manual_seed(0))
    assert inputs.shape == (4, 1, 4, 4) and torch.equal(inputs[1::2], torch.full((2, 1, 4, 4), 7.0))
    assert labels.tolist() == [1, 0, 1, 0] and torch.equal(hide.label_mask(), torch.tensor([1.0, 1.0, 0.0]))


# -- Soteria ----------------------------------------------------------------------------------------------------------
def test_representation_sensitivity_matches_the_per_feature_ratio() -> None:
    net, x = _tiny_net(), torch.rand(3, 1, 2, 3)
    scores = representation_sensitivity(net, net[3], x)
    expected = torch.zeros(5)
    for b in range(3):
        xb = x[b : b + 1].clone().requires_grad_(True)
        r = net[2](net[1](net[0](xb)))[0]
        for i in range(5):
            (grad,) = torch.autograd.grad(r[i], xb, retain_graph=True)
            expected[i] += grad.norm() / r[i].detach()
    assert torch.allclose(scores, expected.abs(), rtol=1e-5)


@pytest.mark.parametrize("percent", [0.0, 40.0, 80.0])
def test_soteria_mask_prunes_the_least_sensitive_share(percent: float) -> None:
    scores = torch.rand(50, generator=torch.Generator().manual_seed(1))
    mask = soteria_mask(scores, prune_percent=percent)
    pruned = mask == 0
    assert int(pruned.sum()) == math.floor(percent / 100 * 50)
    if pruned.any():
        assert scores[pruned].max() <= scores[~pruned].min()


def test_soteria_zeroes_the_pruned_columns_of_the_layer_gradient() -> None:
    net, x, y = _tiny_net(), torch.rand(4, 1, 2, 3), torch.tensor([0, 1, 2, 0])
    F.cross_entropy(net(x), y).backward()
    before = net[3].weight.grad.clone()
    soteria = Soteria(prune_percent=60)
    soteria.on_train_batch_start(None, net, [x, y], 0)
    soteria.on_after_backward(None, net)
    mask = soteria_mask(representation_sensitivity(net, net[3], x), prune_percent=60)
    assert torch.equal(net[3].weight.grad, before * mask) and int((mask == 0).sum()) == 3
    assert soteria.defended_layer(net) is net[3]


# -- PRECODE ----------------------------------------------------------------------------------------------------------
def test_gaussian_kl_matches_torch_distributions() -> None:
    mu, sigma = torch.randn(3, 4), torch.rand(3, 4) + 0.1
    expected = torch.distributions.kl_divergence(
        torch.distributions.Normal(mu, sigma), torch.distributions.Normal(torch.zeros(3, 4), torch.ones(3, 4))
    ).sum(dim=1)
    assert torch.allclose(gaussian_kl(mu, sigma), expected, atol=1e-6)


def test_bottleneck_gradient_is_that_of_cross_entropy_plus_beta_kl() -> None:
    torch.manual_seed(0)
    hooked = VariationalBottleneck(6, bottleneck_size=4, beta=0.5)
    h, y, head = torch.randn(3, 6), torch.tensor([0, 1, 0]), nn.Linear(6, 2)
    torch.manual_seed(1)
    F.cross_entropy(head(hooked(h)), y).backward()
    hooked_grads = [p.grad.clone() for p in hooked.parameters()]
    hooked.zero_grad()
    hooked.beta = 0.0  # now the explicit loss of PRECODE Eq. 4, with the same noise
    torch.manual_seed(1)
    out = hooked(h)
    mu, s = F.linear(h, hooked.encoder_weight, hooked.encoder_bias).chunk(2, dim=1)
    (F.cross_entropy(head(out), y) + 0.5 * gaussian_kl(mu, F.softplus(s - 5)).mean()).backward()
    assert all(torch.allclose(a, p.grad, atol=1e-6) for a, p in zip(hooked_grads, hooked.parameters(), strict=True))


def test_add_precode_puts_the_bottleneck_before_the_head_and_is_deterministic_in_eval() -> None:
    net = apply_defences(_tiny_net(), [PRECODE(bottleneck_size=7, beta=1e-3)])
    assert isinstance(net[3][0], VariationalBottleneck) and isinstance(net[3][1], nn.Linear)
    x = torch.rand(2, 1, 2, 3)
    assert not torch.equal(net.train()(x), net(x))  # a new code per forward pass in training
    assert torch.equal(net.eval()(x), net(x))
    with pytest.raises(ValueError, match="already has a PRECODE"):
        add_precode(net)


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: Soteria(prune_percent=100), r"prune_percent=100\) must be in \[0, 100\)"),
        (lambda: PRECODE(bottleneck_size=0), r"bottleneck_size=0\) must be >= 1"),
        (lambda: PRECODE(beta=-1.0), r"beta=-1.0\) must be >= 0"),
        (lambda: add_precode(_tiny_net(), head="missing"), r"head='missing'\) names no nn.Linear"),
        (lambda: MixUp(k=0), r"k=0\) must be an integer >= 1"),
        (lambda: MixUp(alpha=0.0), r"alpha=0.0\) must be > 0"),
        (lambda: InstaHide(k=2, num_public=2), r"num_public=2\) must be in \[0, k=2\)"),
        (lambda: InstaHide(k=2, num_public=1), r"needs public_images"),
        (lambda: InstaHide(k=4, max_coefficient=0.2), r"max_coefficient=0.2\) must be in \[1/k, 1\]"),
    ],
)
def test_compared_defences_reject_bad_options(build: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build()


def test_soteria_names_the_layers_it_could_defend() -> None:
    with pytest.raises(ValueError, match=r"layer='fc'\) names no nn.Linear of the model; choose from \['1', '3'\]"):
        Soteria(layer="fc").defended_layer(_tiny_net())


def test_soteria_and_precode_take_the_models_own_head_not_a_block_a_malicious_server_planted() -> None:
    """Robbing the Fed's imprint adds an nn.Linear (its bins) to the model: "the last nn.Linear" must still be the
    classifier (PRECODE had wrapped the imprint's bins, so the server's read-out found no bins in the update)."""
    from lightning_fl.attacks import MaliciousImprint
    from lightning_fl.transforms import apply_server_plugins

    imprint = MaliciousImprint(num_bins=4, feature="random", feature_mean=0.0, feature_std=1.0, input_shape=[1, 2, 3])
    net = apply_server_plugins(_tiny_net(), [imprint])
    assert list(dict(net.named_modules()))[1:3] == ["imprint", "imprint.bins"]  # a Sequential's first child
    client = copy.deepcopy(net)  # the clients train copies of the shipped model
    assert Soteria().defended_layer(client) is client.get_submodule("3")
    apply_defences(client, [PRECODE(bottleneck_size=3)])
    assert isinstance(client.get_submodule("3")[0], VariationalBottleneck)
    assert {"imprint.bins.weight", "imprint.bins.bias"} <= set(client.state_dict())


def test_bench_photos_rows_build_the_four_defences() -> None:
    config = yaml.safe_load((Path(__file__).parents[2] / "configs" / "bench_photos.yaml").read_text())
    built = {}
    for row in ("soteria", "precode", "mixup", "instahide"):
        (entry,) = config["defences"][row]["defences"]
        module, _, name = entry["class_path"].rpartition(".")
        built[row] = getattr(__import__(module, fromlist=[name]), name)(**entry.get("init_args", {}))
    assert [type(d) for d in built.values()] == [Soteria, PRECODE, MixUp, InstaHide]


@pytest.mark.parametrize("mixing", [MixUp, InstaHide])
def test_mixing_takes_the_classes_from_the_data_or_the_models_hyperparameters_and_refuses_when_built(mixing) -> None:
    from tests.user_project import PhotoNet  # a user's model: num_classes is a hyperparameter, not an attribute

    defence = mixing(k=2)
    assert defence.classes(apply_defences(PhotoNet(), [defence])) == 9
    defence = mixing(k=2)
    assert defence.classes(apply_defences(nn.Linear(4, 3), [defence], data=SimpleNamespace(num_classes=10))) == 10
    with pytest.raises(ValueError, match=r"num_classes=None\): neither the run's data nor Linear"):
        apply_defences(nn.Linear(4, 3), [mixing(k=2)])  # before any training, not in a client's step
