import math

import pytest
import torch

from lightning_fl.privacy import gaussian_noise, laplace_noise


@pytest.mark.parametrize("scale", [0.1, 1.0, 7.5])
def test_laplace_noise_matches_laplace_moments(scale: float) -> None:
    noise = laplace_noise(torch.zeros(200_000), scale=scale, generator=torch.Generator().manual_seed(0))
    assert noise.mean().abs() < 0.02 * scale
    assert noise.abs().mean() == pytest.approx(scale, rel=0.02)  # E|X| = b
    assert noise.std() == pytest.approx(math.sqrt(2) * scale, rel=0.02)  # Var = 2 b^2
    assert torch.isfinite(noise).all()


@pytest.mark.parametrize("std", [0.5, 3.0])
def test_gaussian_noise_matches_std_and_tails(std: float) -> None:
    noise = gaussian_noise(torch.zeros(200_000), std=std, generator=torch.Generator().manual_seed(1))
    assert noise.std() == pytest.approx(std, rel=0.01)
    assert (noise.abs() > 2 * std).float().mean() == pytest.approx(0.0455, abs=0.003)


def test_noise_is_reproducible_from_the_generator_and_keeps_shape() -> None:
    like = torch.zeros(3, 4, dtype=torch.float64)
    a = laplace_noise(like, scale=1.0, generator=torch.Generator().manual_seed(5))
    b = laplace_noise(like, scale=1.0, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b) and a.shape == like.shape and a.dtype == torch.float64


@pytest.mark.parametrize(
    ("fn", "kwargs", "match"),
    [(laplace_noise, {"scale": -1.0}, "Delta f"), (gaussian_noise, {"std": float("inf")}, "noise_multiplier")],
)
def test_noise_rejects_bad_scale(fn, kwargs, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        fn(torch.zeros(2), **kwargs)
