"""Baseline defences on the shared update: fixed-sigma Gaussian noise (FDL-PP's FL-DP) and gradient pruning (DLG).

Both are :class:`~lightning_fl.transforms.ClientTransform` objects: they run on the client, on the update it is
about to send, so what the server (and a type-1 attacker) receives is the noised or pruned update.

References:
    FL-DP(sigma): Gu et al., FDL-PP, Table 1.
    Gradient pruning: Zhu et al., "Deep Leakage from Gradients", NeurIPS 2019, Sec. 6 (Fig. 7, "pruning").
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor
from typing_extensions import override

from lightning_fl.defences.base import Defence, DefenceParts
from lightning_fl.messages import ClientUpdate
from lightning_fl.transforms import ClientTransform
from lightning_fl.validation import check_non_negative

if TYPE_CHECKING:
    from lightning_fl.contexts import ClientContext

__all__ = ["GaussianNoise", "GradientPruning", "NoiseUnit", "PruneScope", "add_gaussian_noise", "prune_smallest"]

NoiseUnit = Literal["gradient", "update"]
"""What ``noise_std`` refers to: each local ``gradient`` step (scaled to the update, see :class:`GaussianNoise`)
or the shared ``update`` itself."""

PruneScope = Literal["tensor", "update"]
"""Where the smallest magnitudes are ranked: within each ``tensor`` (per layer) or across the whole ``update``."""


def add_gaussian_noise(
    tensors: dict[str, Tensor], *, noise_std: float, generator: torch.Generator
) -> dict[str, Tensor]:
    r"""Add i.i.d. Gaussian noise to every tensor: :math:`\tilde g = g + \mathcal N(0, \sigma^2 I)`.

    Args:
        tensors: the shared tensors, keyed by name.
        noise_std: absolute standard deviation :math:`\sigma`; must be >= 0.
        generator: source of the noise (seed it for reproducible runs).

    Raises:
        ValueError: if ``noise_std`` is negative.

    Example:
        >>> generator = torch.Generator().manual_seed(0)
        >>> noisy = add_gaussian_noise({"w": torch.zeros(10_000)}, noise_std=0.1, generator=generator)
        >>> round(float(noisy["w"].std()), 2)
        0.1
    """
    check_non_negative(
        noise_std, owner="add_gaussian_noise", name="noise_std", hint="; it is the absolute standard deviation sigma"
    )
    return {
        key: value + noise_std * torch.randn(value.shape, generator=generator, dtype=value.dtype).to(value.device)
        for key, value in tensors.items()
    }


def prune_smallest(tensors: dict[str, Tensor], *, ratio: float, scope: PruneScope = "tensor") -> dict[str, Tensor]:
    """Set the ``ratio`` share of entries with the smallest magnitude to zero (DLG's pruning defence).

    Args:
        tensors: the shared tensors, keyed by name.
        ratio: pruning ratio p in [0, 1): ``floor(p * n)`` entries are zeroed.
        scope: rank magnitudes within each tensor (``tensor``) or across all of them (``update``).

    Raises:
        ValueError: if ``ratio`` is outside [0, 1) or ``scope`` is unknown.

    Example:
        >>> prune_smallest({"w": torch.tensor([0.1, -3.0, 0.2, 4.0])}, ratio=0.5)
        {'w': tensor([ 0., -3.,  0.,  4.])}
    """
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"ratio={ratio} must be in [0, 1); it is the share of entries set to zero.")
    if scope not in ("tensor", "update"):
        raise ValueError(f"scope={scope!r} is unknown; use 'tensor' or 'update'.")
    if scope == "tensor":
        return {key: _prune_flat(value.flatten(), ratio).view_as(value) for key, value in tensors.items()}
    flat = _prune_flat(torch.cat([v.flatten() for v in tensors.values()]), ratio)
    sizes = [v.numel() for v in tensors.values()]
    return {key: chunk.view_as(value) for (key, value), chunk in zip(tensors.items(), flat.split(sizes), strict=True)}


def _prune_flat(values: Tensor, ratio: float) -> Tensor:
    count = math.floor(ratio * values.numel())
    if count == 0:
        return values.clone()
    smallest = values.abs().argsort()[:count]
    pruned = values.clone()
    pruned[smallest] = 0
    return pruned


class GaussianNoise(ClientTransform, Defence):
    r"""FL-DP(:math:`\sigma`) of FDL-PP: Gaussian noise of fixed standard deviation on the shared update.

    No clipping and no accounting, as in the paper (":math:`g_{shared} = g + \mathcal N(0,\sigma^2 I)`").
    With ``unit="gradient"`` (default) :math:`\sigma` is the noise on each local gradient step, as in the paper,
    where noise is added to shared gradients: the update of ``s`` SGD steps at rate :math:`\eta` is
    :math:`-\eta \sum_t g_t`, so its noise has standard deviation :math:`\eta \sigma \sqrt{s}` (read from the
    update's ``lr`` and ``local_steps`` metadata). Inferred: for adaptive optimisers (Adam) this is the same
    scaling applied to the weight update. With ``unit="update"``, :math:`\sigma` is added to the update as is.

    Args:
        noise_std: :math:`\sigma` (the paper uses 0.002, 0.032 and 0.128).
        unit: what :math:`\sigma` refers to (see :data:`NoiseUnit`).

    Raises:
        ValueError: if ``noise_std`` is negative or ``unit`` unknown; at run time, if ``unit="gradient"`` and the
            update carries no ``lr``/``local_steps`` metadata.
    """

    def __init__(self, noise_std: float, *, unit: NoiseUnit = "gradient") -> None:
        check_non_negative(noise_std, owner="GaussianNoise", name="noise_std")
        if unit not in ("gradient", "update"):
            raise ValueError(f"GaussianNoise(unit={unit!r}) is unknown; use 'gradient' or 'update'.")
        self.noise_std, self.unit = noise_std, unit

    def update_noise_std(self, update: ClientUpdate) -> float:
        """The standard deviation added to ``update``'s tensors."""
        if self.unit == "update":
            return self.noise_std
        lr, steps = update.metadata.get("lr"), update.metadata.get("local_steps")
        if lr is None or not steps:
            raise ValueError(
                "GaussianNoise(unit='gradient') needs the update's 'lr' and 'local_steps' metadata; "
                f"got lr={lr}, local_steps={steps}. Use unit='update' to give sigma on the update directly."
            )
        return self.noise_std * float(lr) * math.sqrt(steps)

    @override
    def parts(self) -> DefenceParts:
        return DefenceParts(client_transforms=[self])

    def __call__(self, update: ClientUpdate, *, ctx: ClientContext) -> ClientUpdate:
        std = self.update_noise_std(update)
        generator = ctx.rng("gaussian_noise", update.client_id)
        delta = add_gaussian_noise(update.delta, noise_std=std, generator=generator)
        return dataclasses.replace(update, delta=delta, metadata={**update.metadata, "noise_std": self.noise_std})

    def __repr__(self) -> str:
        return f"GaussianNoise(noise_std={self.noise_std}, unit={self.unit!r})"


class GradientPruning(ClientTransform, Defence):
    """DLG's defence (Zhu et al., 2019, Sec. 6): prune the smallest-magnitude share of the shared update.

    The DLG paper reports that reconstructions stop being recognisable once more than about 20% of the
    gradient is pruned. Inferred: the paper does not say whether magnitudes are ranked per layer or over the
    whole gradient; ``scope`` chooses, per tensor by default.

    Args:
        ratio: pruning ratio p in [0, 1).
        scope: rank magnitudes per tensor (per layer) or over the whole update.

    Raises:
        ValueError: if ``ratio`` is outside [0, 1) or ``scope`` is unknown.
    """

    def __init__(self, ratio: float = 0.2, *, scope: PruneScope = "tensor") -> None:
        if not 0.0 <= ratio < 1.0:
            raise ValueError(f"GradientPruning(ratio={ratio}) must be in [0, 1).")
        if scope not in ("tensor", "update"):
            raise ValueError(f"GradientPruning(scope={scope!r}) is unknown; use 'tensor' or 'update'.")
        self.ratio, self.scope = ratio, scope

    @override
    def parts(self) -> DefenceParts:
        return DefenceParts(client_transforms=[self])

    def __call__(self, update: ClientUpdate, *, ctx: ClientContext | None) -> ClientUpdate:
        delta = prune_smallest(update.delta, ratio=self.ratio, scope=self.scope)
        return dataclasses.replace(update, delta=delta, metadata={**update.metadata, "prune_ratio": self.ratio})

    def __repr__(self) -> str:
        return f"GradientPruning(ratio={self.ratio}, scope={self.scope!r})"
