from __future__ import annotations

import math

import pytest
import torch

from lightning_fl.defences.dp.baselines import GaussianNoise, GradientPruning, add_gaussian_noise, prune_smallest
from lightning_fl.messages import ClientUpdate
from tests.conftest import plugin_context


def _update(**metadata: object) -> ClientUpdate:
    delta = {"w": torch.linspace(-1, 1, 1000).reshape(10, 100), "b": torch.zeros(10)}
    return ClientUpdate(client_id=0, round_idx=0, delta=delta, num_samples=10, loss=0.0, metadata=metadata)


@pytest.mark.parametrize("noise_std", [0.01, 0.5])
def test_add_gaussian_noise_has_the_requested_std(noise_std: float) -> None:
    noisy = add_gaussian_noise(
        {"w": torch.zeros(20_000)}, noise_std=noise_std, generator=torch.Generator().manual_seed(0)
    )
    assert abs(float(noisy["w"].std()) / noise_std - 1) < 0.03


def test_gaussian_noise_in_gradient_units_scales_with_lr_and_steps() -> None:
    update = _update(lr=0.01, local_steps=16)
    transform = GaussianNoise(0.128)
    assert math.isclose(transform.update_noise_std(update), 0.128 * 0.01 * 4)
    noised = transform(update, ctx=plugin_context())
    assert abs(float(noised.delta["b"].std()) - 0.00512) < 0.003
    assert noised.metadata["noise_std"] == 0.128 and set(noised.delta) == {"w", "b"}


def test_gaussian_noise_in_update_units_is_added_as_is() -> None:
    assert GaussianNoise(0.3, unit="update").update_noise_std(_update()) == 0.3


def test_gaussian_noise_in_gradient_units_needs_lr_metadata() -> None:
    with pytest.raises(ValueError, match="needs the update's 'lr' and 'local_steps' metadata"):
        GaussianNoise(0.1)(_update(), ctx=plugin_context())


@pytest.mark.parametrize("ratio", [0.0, 0.2, 0.9])
def test_prune_smallest_zeroes_exactly_the_smallest_share_per_tensor(ratio: float) -> None:
    values = torch.randn(50, 20, generator=torch.Generator().manual_seed(1))
    pruned = prune_smallest({"w": values}, ratio=ratio)["w"]
    zeroed = pruned == 0
    assert int(zeroed.sum()) == math.floor(ratio * values.numel())
    if zeroed.any():
        assert values[zeroed].abs().max() <= values[~zeroed].abs().min()
    assert torch.equal(pruned[~zeroed], values[~zeroed])


def test_prune_smallest_over_the_update_ranks_across_tensors() -> None:
    tensors = {"small": torch.full((4,), 0.1), "large": torch.full((4,), 5.0)}
    pruned = prune_smallest(tensors, ratio=0.5, scope="update")
    assert torch.equal(pruned["small"], torch.zeros(4)) and torch.equal(pruned["large"], tensors["large"])
    per_tensor = prune_smallest(tensors, ratio=0.5)
    assert int((per_tensor["large"] == 0).sum()) == 2


def test_gradient_pruning_transform_prunes_the_shared_update() -> None:
    pruned = GradientPruning(0.2)(_update(), ctx=plugin_context())
    assert int((pruned.delta["w"] == 0).sum()) == 200
    assert pruned.metadata["prune_ratio"] == 0.2


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: GaussianNoise(-1.0), r"noise_std=-1.0\) must be a finite number >= 0"),
        (lambda: GaussianNoise(0.1, unit="weights"), r"unit='weights'\) is unknown"),
        (lambda: GradientPruning(1.0), r"ratio=1.0\) must be in \[0, 1\)"),
        (lambda: GradientPruning(0.2, scope="layer"), r"scope='layer'\) is unknown"),
    ],
)
def test_baselines_reject_bad_options(build: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build()
