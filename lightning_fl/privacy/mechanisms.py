"""Additive noise mechanisms: Laplace (pure epsilon-DP) and Gaussian ((epsilon, delta)-DP).

Both draw from an optional ``torch.Generator`` so that every noise draw of a federated run is reproducible
from the loop's seed (see :meth:`~lightning_fl.contexts.RoundContext.rng`).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["gaussian_noise", "laplace_noise"]


def _uniform(like: Tensor, generator: torch.Generator | None) -> Tensor:
    return torch.rand(like.shape, generator=generator, dtype=like.dtype if like.is_floating_point() else None).to(
        like.device
    )


def laplace_noise(like: Tensor, *, scale: float, generator: torch.Generator | None = None) -> Tensor:
    r"""I.i.d. Laplace noise :math:`\mathrm{Lap}(\beta)` with the shape, dtype and device of ``like``.

    Implements Def. 2 of DPFL (Zhu et al., IEEE IoT-J 2021): density :math:`\frac{1}{2\beta} e^{-|x|/\beta}`.
    Drawn as the difference of two exponentials, :math:`\beta(\ln(1-u_2) - \ln(1-u_1))`, which is finite
    for every uniform draw in [0, 1).

    Args:
        like: tensor whose shape the noise takes.
        scale: :math:`\beta = \Delta f / \epsilon`; must be >= 0 (0 gives zeros).
        generator: random source.

    Raises:
        ValueError: if ``scale`` is negative or not finite.

    Example:
        >>> noise = laplace_noise(torch.zeros(100_000), scale=2.0, generator=torch.Generator().manual_seed(0))
        >>> round(noise.abs().mean().item(), 1)  # E|X| = beta
        2.0
    """
    if not (scale >= 0 and torch.isfinite(torch.tensor(scale))):
        raise ValueError(f"laplace_noise(scale={scale}) must be finite and >= 0; it is Delta f / epsilon.")
    u1, u2 = _uniform(like, generator), _uniform(like, generator)
    return scale * (torch.log1p(-u2) - torch.log1p(-u1))


def gaussian_noise(like: Tensor, *, std: float, generator: torch.Generator | None = None) -> Tensor:
    r"""I.i.d. Gaussian noise :math:`\mathcal N(0, \mathrm{std}^2)` with the shape, dtype and device of ``like``.

    The Gaussian mechanism of Fed-CDP/Fed-SDP (Wei et al., ICDCS 2021, Def. 2) and 2DP-FL (Xiong et al.,
    IEEE TII 2021, Alg. 1) with ``std`` :math:`= \sigma S` (noise multiplier times sensitivity).

    Args:
        like: tensor whose shape the noise takes.
        std: absolute standard deviation; must be >= 0.
        generator: random source.

    Raises:
        ValueError: if ``std`` is negative or not finite.

    Example:
        >>> noise = gaussian_noise(torch.zeros(100_000), std=3.0, generator=torch.Generator().manual_seed(0))
        >>> round(noise.std().item(), 1)
        3.0
    """
    if not (std >= 0 and torch.isfinite(torch.tensor(std))):
        raise ValueError(f"gaussian_noise(std={std}) must be finite and >= 0; it is noise_multiplier * clip bound.")
    return std * torch.randn(like.shape, generator=generator, dtype=like.dtype).to(like.device)
