"""Server-side strategies: aggregation of client updates and client selection.

FedAvg follows McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized
Data" (AISTATS 2017, arXiv:1602.05629), Algorithm 1: the new global model is the sample-count weighted
average of the client models, here written on deltas: w <- w + sum_k (n_k / n) * delta_k.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from lightning_fl.messages import ClientUpdate

if TYPE_CHECKING:
    from lightning_fl.loop import FederatedLoop

__all__ = ["Aggregator", "ClientSelector", "FedAvg", "UniformSelector", "weighted_average"]


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
    coefficients = [w / total for w in weights]
    return {
        key: torch.stack([d[key] * c for d, c in zip(deltas, coefficients, strict=True)]).sum(dim=0)
        for key in deltas[0]
    }


class Aggregator(ABC):
    """Turns the updates of one round into one aggregate delta. Subclass and implement :meth:`aggregate`."""

    def setup(self, loop: FederatedLoop) -> None:
        """Called once before the first round (e.g. to reach the data a rule needs)."""

    @abstractmethod
    def aggregate(self, updates: Sequence[ClientUpdate], *, global_state: dict[str, Tensor]) -> dict[str, Tensor]:
        """Return the aggregate delta to add to ``global_state``."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


class FedAvg(Aggregator):
    """Federated Averaging (McMahan et al., 2017, Alg. 1): average of client deltas.

    Args:
        weighted: weight each client by its number of training samples ``n_k`` (the paper); if false,
            a plain mean.
    """

    def __init__(self, *, weighted: bool = True) -> None:
        self.weighted = weighted

    def aggregate(self, updates: Sequence[ClientUpdate], *, global_state: dict[str, Tensor]) -> dict[str, Tensor]:
        weights = [u.num_samples if self.weighted else 1.0 for u in updates]
        return weighted_average([u.delta for u in updates], weights)


class ClientSelector(ABC):
    """Chooses which clients train in a round. The default is uniform sampling without replacement."""

    def setup(self, loop: FederatedLoop) -> None:
        """Called once before the first round."""

    @abstractmethod
    def select(self, *, round_idx: int, num_clients: int, k: int, generator: torch.Generator) -> list[int]:
        """Return the ``k`` client ids that train in round ``round_idx``, drawing randomness from ``generator``."""

    def observe(self, updates: Sequence[ClientUpdate]) -> None:
        """See the updates of the round just finished (losses etc.), e.g. for active selection."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


class UniformSelector(ClientSelector):
    """Pick ``k`` distinct clients uniformly at random (FedAvg's C-fraction sampling).

    Example:
        >>> UniformSelector().select(round_idx=0, num_clients=10, k=3, generator=torch.Generator().manual_seed(0))
        [1, 4, 7]
    """

    def select(self, *, round_idx: int, num_clients: int, k: int, generator: torch.Generator) -> list[int]:
        return sorted(torch.randperm(num_clients, generator=generator)[:k].tolist())
