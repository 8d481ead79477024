"""Client selection: which clients train in a round. Uniform sampling without replacement by default."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from lightning_fl.messages import ClientUpdate

if TYPE_CHECKING:
    from lightning_fl.federation.contexts import SetupContext

__all__ = ["ClientSelector", "UniformSelector"]


class ClientSelector(ABC):
    """Chooses which clients train in a round; randomness comes from the generator the loop seeds per round."""

    def setup(self, ctx: SetupContext) -> None:
        """Called once before the first round with the run's shape and parts."""

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
