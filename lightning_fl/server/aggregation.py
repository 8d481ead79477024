"""Aggregation maths, shared by every rule: weighted sums of state dicts, and the aggregator interface.

Flower keeps its maths in ``aggregate.py`` and lets strategies convert and delegate; here too. An
:class:`Aggregator` receives the round's updates, a :class:`~lightning_fl.contexts.RoundContext` and (when it declares
them) the round's failures, and returns ``(aggregate, metrics)``, as a Flower strategy's ``aggregate_fit`` returns
``(parameters, metrics)``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from lightning_fl.messages import ClientUpdate

if TYPE_CHECKING:
    from lightning_fl.contexts import RoundContext, SetupContext

__all__ = ["Aggregator", "weighted_average", "weighted_sum"]


def weighted_sum(deltas: Sequence[dict[str, Tensor]], weights: Sequence[float], normaliser: float = 1.0) -> dict:
    r""":math:`\sum_i w_i \Delta_i / \mathrm{normaliser}`, key by key.

    Example:
        >>> weighted_sum([{"w": torch.tensor([1.0])}, {"w": torch.tensor([3.0])}], [1, 2], normaliser=2)
        {'w': tensor([3.5000])}
    """
    return {
        key: torch.stack([d[key] * w for d, w in zip(deltas, weights, strict=True)]).sum(dim=0) / normaliser
        for key in deltas[0]
    }


def weighted_average(deltas: Sequence[dict[str, Tensor]], weights: Sequence[float]) -> dict[str, Tensor]:
    """Average state dicts with the given (unnormalised, non-negative) weights.

    Raises:
        ValueError: if there are no deltas, the lengths differ, or the weights sum to zero.

    Example:
        >>> weighted_average([{"w": torch.tensor([0.0])}, {"w": torch.tensor([3.0])}], [2, 1])
        {'w': tensor([1.])}
    """
    if not deltas:
        raise ValueError("weighted_average needs at least one delta.")
    if len(deltas) != len(weights):
        raise ValueError(f"got {len(deltas)} deltas but {len(weights)} weights.")
    total = float(sum(weights))
    if total <= 0:
        raise ValueError(f"weights must sum to > 0, got {list(weights)}.")
    return weighted_sum(deltas, [w / total for w in weights])


class Aggregator(ABC):
    """Turns the updates of one round into one aggregate delta. Subclass and implement :meth:`aggregate`.

    Attributes:
        needs_encryption: whether it only makes sense on encrypted updates (a client transform that ``encrypts``).
        reads_plaintext: whether it reads each client's plaintext update (no client transform may hide it).
    """

    needs_encryption: bool = False
    reads_plaintext: bool = False

    def setup(self, ctx: SetupContext) -> None:
        """Called once before the first round with the run's shape and parts."""

    @abstractmethod
    def aggregate(
        self, updates: Sequence[ClientUpdate], *, ctx: RoundContext, failures: Mapping[int, str] | None = None
    ) -> tuple[Any, dict[str, float]]:
        """Return ``(aggregate delta to add to ctx.global_state, metrics to log)``.

        Args:
            updates: the round's checked updates.
            ctx: the round.
            failures: client id to why that selected client sent no usable update (failed, unsound update, norm
                outlier), as Flower's ``aggregate_fit(server_round, results, failures)``. The loop passes it only to
                an ``aggregate`` that declares it, so an override without it keeps working.
        """

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
