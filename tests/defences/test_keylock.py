from __future__ import annotations

import pytest
import torch
from torch import nn
from torchvision import models as tv

from lightning_fl.defences.model.keylock import KeyLock, KeyLockNorm2d, KeyLocks, add_keylock, lock_parameter_share
from lightning_fl.models import LeNetDLG, resnet20, resnet32
from lightning_fl.private import private_state, public_state
from tests.defences.leakage import attack_scores


def _vgg16_with_keylock_block(num_classes: int) -> nn.Module:
    # The thesis' VGG-16 (spec 003 Sec. 3.5): VGG-16-BN behind an extra key-locked conv block 3->64; the first
    # VGG convolution then takes the block's 64 channels (the reference forward would not run as written).
    vgg = tv.vgg16_bn(weights=None, num_classes=num_classes)
    vgg.features[0] = nn.Conv2d(64, 64, 3, padding=1)
    return nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), KeyLockNorm2d(64), nn.ReLU(), vgg)


# Thesis Table 5.3 parameter proportions (3-channel inputs, 100 classes, key length 1024; spec 003 Sec. 3.5).
TABLE_5_3 = {
    "lenet": (lambda: add_keylock(LeNetDLG(in_channels=3, num_classes=100)), 22.43),
    "resnet20": (lambda: add_keylock(resnet20(num_classes=100)), 10.49),
    "resnet32": (lambda: add_keylock(resnet32(num_classes=100)), 6.46),
    "resnet18": (lambda: add_keylock(tv.resnet18(weights=None, num_classes=100)), 1.15),
    "resnet34": (lambda: add_keylock(tv.resnet34(weights=None, num_classes=100)), 0.61),
    "vgg16": (lambda: _vgg16_with_keylock_block(100), 0.097),
}


@pytest.mark.parametrize("name", sorted(TABLE_5_3))
def test_lock_parameter_share_matches_thesis_table_5_3(name: str) -> None:
    build, percent = TABLE_5_3[name]
    digits = 3 if percent < 0.1 else 2
    assert round(100 * lock_parameter_share(build()), digits) == percent


def test_add_keylock_replaces_the_batch_norm_after_the_first_conv() -> None:
    net = add_keylock(resnet20(num_classes=10))
    assert isinstance(net.bn1, KeyLockNorm2d)
    assert sum(isinstance(m, KeyLockNorm2d) for m in net.modules()) == 1
    assert net(torch.rand(2, 3, 32, 32)).shape == (2, 10)


def test_add_keylock_inserts_a_norm_after_a_conv_without_one() -> None:
    net = add_keylock(LeNetDLG(in_channels=1), conv="body.2")
    assert isinstance(net.body[2], nn.Sequential) and isinstance(net.body[2][1], KeyLockNorm2d)
    assert net(torch.rand(2, 1, 32, 32)).shape == (2, 10)


def test_keylock_private_state_is_exactly_key_and_locks() -> None:
    net = add_keylock(LeNetDLG(in_channels=1), key_length=64)
    assert sorted(private_state(net)) == [
        "body.0.1.lock.key",
        "body.0.1.lock.scale_fc.bias",
        "body.0.1.lock.scale_fc.weight",
        "body.0.1.lock.shift_fc.bias",
        "body.0.1.lock.shift_fc.weight",
    ]
    assert {"body.0.1.norm.running_mean", "body.0.1.norm.running_var"} <= set(public_state(net))


def test_keylock_reset_private_draws_a_seeded_key() -> None:
    a, b = KeyLock(4, key_length=32), KeyLock(4, key_length=32)
    a.reset_private(torch.Generator().manual_seed(7))
    b.reset_private(torch.Generator().manual_seed(7))
    assert torch.equal(a.key, b.key)
    b.reset_private(torch.Generator().manual_seed(8))
    assert not torch.equal(a.key, b.key)
    assert float(b.key.min()) >= 0 and float(b.key.max()) < 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"lock_act": "tanh"}, r"lock_act='tanh'\) is unknown"),
        ({"key_length": 0}, r"key_length=0\) must be >= 1"),
        ({"init_range": -1.0}, r"init_range=-1.0\) must be > 0"),
    ],
)
def test_keylock_rejects_bad_options(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        KeyLock(4, **kwargs)


def test_add_keylock_rejects_a_name_that_is_not_a_conv() -> None:
    with pytest.raises(ValueError, match=r"add_keylock\(conv='fc'\) is not an nn.Conv2d"):
        add_keylock(LeNetDLG(), conv="fc")


def test_lock_parameter_share_needs_a_lock() -> None:
    with pytest.raises(ValueError, match="has no KeyLock; retrofit one with add_keylock"):
        lock_parameter_share(LeNetDLG())


def test_keylocks_defence_is_add_keylock() -> None:
    net = KeyLocks(lock_act="sigmoid", key_length=16).apply_to_model(LeNetDLG(in_channels=1))
    lock = net.body[0][1].lock
    assert lock.key.numel() == 16 and isinstance(lock.activation, nn.Sigmoid)


@pytest.mark.parametrize("attack", ["dlg", "ig"])
def test_keylock_defeats_gradient_matching_without_the_key(attack: str) -> None:
    undefended, defended = attack_scores("none", attack), attack_scores("keylock", attack)
    assert undefended["psnr"] >= 30.0, undefended
    assert defended["psnr"] <= undefended["psnr"] - 10.0, defended
    assert defended["ssim"] < 0.3, defended
