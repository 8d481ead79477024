"""Defence bundles: one list, model layers applied once, parts merged, misplacement explained."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from lightning_fl import FedAvg, FederatedLoop
from lightning_fl.defences import FedCDP, GaussianNoise, KeyLocks, apply_defences
from lightning_fl.defences.base import Defence, DefenceParts, collect_parts
from lightning_fl.private import private_state
from tests.conftest import make_classifier


def _net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU())


def test_apply_defences_retrofits_once_even_when_called_again() -> None:
    keylock, net = KeyLocks(key_length=8), _net()
    apply_defences(net, [keylock])
    keys = set(private_state(net))
    apply_defences(net, [keylock])
    assert keys and set(private_state(net)) == keys


def test_apply_defences_rejects_what_is_not_a_bundle() -> None:
    with pytest.raises(TypeError, match=r"FedAvg, \.\.\.\] is not a Defence"):
        apply_defences(_net(), [FedAvg()])


class _NeedsFedAvg(Defence):
    def parts(self) -> DefenceParts:
        return DefenceParts(aggregator=FedAvg(weighted=False))


def test_parts_are_merged_and_two_aggregators_conflict() -> None:
    noise = GaussianNoise(0.1)
    parts = collect_parts([noise, FedCDP()], model=nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU()))  # DP-SGD: no BN
    assert parts.client_transforms == [noise] and len(parts.client_callbacks) == 1 and len(parts.callbacks) == 1
    with pytest.raises(ValueError, match=r"_NeedsFedAvg sets the aggregator, but loop\.aggregator"):
        collect_parts([_NeedsFedAvg()], model=_net(), aggregator=FedAvg())


def test_a_bundle_put_among_callbacks_says_to_use_defences(tiny_digits, tmp_path: Path) -> None:
    torch.manual_seed(0)
    loop = FederatedLoop(
        make_classifier(tiny_digits), tiny_digits, num_rounds=1, callbacks=[FedCDP()], output_dir=tmp_path
    )
    with pytest.raises(ValueError, match=r"put it in loop\.defences"):
        loop.fit()
