from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_fl import FederatedLoop
from lightning_fl.datamodules import FederatedDataModule
from lightning_fl.defences.model.passport import PassportConv2d, Passports, add_passports
from lightning_fl.models import ImageClassifier, LeNetDLG
from lightning_fl.private import private_state, public_state
from tests.defences.leakage import attack_scores


def test_passport_layer_is_deterministic_given_its_seed_and_differs_across_seeds() -> None:
    a, b = PassportConv2d(1, 12, 5, padding=2), PassportConv2d(1, 12, 5, padding=2)
    b.load_state_dict(a.state_dict())
    a.reset_private(torch.Generator().manual_seed(3))
    b.reset_private(torch.Generator().manual_seed(3))
    x = torch.rand(2, 1, 16, 16)
    assert torch.equal(a(x), b(x))
    b.reset_private(torch.Generator().manual_seed(4))
    gamma_a, beta_a = a.scale_and_shift()
    gamma_b, beta_b = b.scale_and_shift()
    assert not torch.allclose(gamma_a, gamma_b) and not torch.allclose(beta_a, beta_b)


def test_passport_layer_computes_eq_4_with_eq_5_scale_and_shift() -> None:
    layer = PassportConv2d(3, 8, 3, padding=1, passport_size=8, reduction="mean")
    x = torch.rand(2, 3, 8, 8)
    code_g = layer.conv(layer.passport_gamma).mean(dim=(0, 2, 3))
    gamma = layer.decoder(nn.functional.leaky_relu(layer.encoder(code_g)))
    code_b = layer.conv(layer.passport_beta).mean(dim=(0, 2, 3))
    beta = layer.decoder(nn.functional.leaky_relu(layer.encoder(code_b)))
    expected = gamma.view(1, -1, 1, 1) * layer.conv(x) + beta.view(1, -1, 1, 1)
    assert torch.allclose(layer(x), expected)


def test_normalized_mean_reduction_gives_unit_rms_codes() -> None:
    layer = PassportConv2d(1, 12, 5, padding=2, passport_size=32)
    code = layer.conv(layer.passport_gamma).mean(dim=(0, 2, 3))
    assert float(code.pow(2).mean().sqrt()) < 0.1  # the literal spatial mean is tiny for U(-1, 1) passports
    normalised = code / code.pow(2).mean().sqrt()
    expected = layer.decoder(nn.functional.leaky_relu(layer.encoder(normalised)))
    assert torch.allclose(layer.scale_and_shift()[0], expected)


def test_add_passports_keeps_the_conv_kernel_and_makes_the_layers_private() -> None:
    net = LeNetDLG(in_channels=1)
    kernels = [net.body[i].weight.detach().clone() for i in (0, 2, 4)]
    add_passports(net, num_convs=3, passport_size=16)
    assert all(isinstance(net.body[i], PassportConv2d) for i in (0, 2, 4))
    for i, kernel in zip((0, 2, 4), kernels, strict=True):
        assert torch.equal(net.body[i].conv.weight, kernel)
    assert not any(k.startswith("body.") for k in public_state(net))
    assert {"body.0.passport_gamma", "body.0.passport_beta", "body.4.encoder.weight"} <= set(private_state(net))
    assert net(torch.rand(1, 1, 32, 32)).shape == (1, 10)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"passport_dist": "laplace"}, r"passport_dist='laplace'\) is unknown"),
        ({"reduction": "max"}, r"reduction='max'\) is unknown"),
        ({"passport_size": 2}, r"passport_size=2\) is smaller than the kernel"),
        ({"hidden_features": 0}, r"hidden_features=0\) must be >= 1"),
    ],
)
def test_passport_layer_rejects_bad_options(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PassportConv2d(1, 4, 5, **kwargs)


def test_add_passports_rejects_more_convs_than_the_model_has() -> None:
    with pytest.raises(ValueError, match="num_convs=4 must be between 1 and the model's 3 convolutions"):
        add_passports(LeNetDLG(), num_convs=4)


def test_passports_defence_is_add_passports() -> None:
    net = Passports(num_convs=2, passport_dist="normal", passport_size=8).apply_to_model(LeNetDLG(in_channels=1))
    assert isinstance(net.body[2], PassportConv2d) and net.body[2].passport_beta.shape == (1, 12, 8, 8)


@pytest.mark.parametrize("attack", ["dlg", "ig"])
def test_passports_defeat_gradient_matching_without_the_passports(attack: str) -> None:
    undefended, defended = attack_scores("none", attack), attack_scores("passports", attack)
    assert undefended["psnr"] >= 30.0, undefended
    assert defended["psnr"] <= undefended["psnr"] - 10.0, defended
    assert defended["ssim"] < 0.3, defended


def test_a_passport_conv_takes_the_batchnorm_after_it_into_the_private_layer() -> None:
    """A conv-BatchNorm block: the norm normalises the client's own features, so it is private with the conv."""
    net = add_passports(ImageClassifier("conv_bn_pool", num_classes=9, in_channels=3), num_convs=1)
    norm = {k for k in private_state(net) if not k.startswith("backbone.0.")}
    assert norm == {f"backbone.1.{k}" for k in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")}
    assert "backbone.4.weight" in public_state(net)  # the second block stays shared


def test_passports_on_a_relu_batchnorm_net_train_in_fedavg(tmp_path) -> None:
    """FedAvg with passports on the two-block conv-BatchNorm net (photo tiles, 4 clients, each scored on its own
    model): with the BatchNorm after the passport conv averaged over clients whose passports differ, the run stayed
    near chance (0.14 of 9 classes); private, it trains."""
    dm = FederatedDataModule("photo_tiles", num_clients=4, partition="iid", batch_size=8, image_size=32, seed=0)
    torch.manual_seed(0)
    model = ImageClassifier("conv_bn_pool", **dm.model_options, optimizer="sgd", lr=0.05, standardize=False)
    options = {"clients_per_round": 4, "local_epochs": 2, "eval_every": 10, "eval_on": "clients"}
    loop = FederatedLoop(
        model,
        dm,
        num_rounds=10,
        output_dir=tmp_path,
        seed=0,
        defences=[Passports(passport_size=16)],
        checkpoint=False,
        progress_bar=False,
        **options,
    )
    assert loop.fit()["test_accuracy"] >= 0.35
