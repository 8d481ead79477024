"""Client selection: which clients train in a round. Uniform sampling without replacement by default.

A selector sees a round as a Flower strategy's ``configure_fit`` does: through the round's
:class:`~lightning_fl.contexts.RoundContext` (round index, the run's shape in ``ctx.spec``, seeded
randomness ``ctx.rng("select")``), not the loop.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from lightning_fl.messages import ClientUpdate

if TYPE_CHECKING:
    from lightning_fl.contexts import RoundContext, SetupContext

__all__ = ["ClientSelector", "UniformSelector"]


class ClientSelector(ABC):
    """Chooses which clients train in a round; its randomness comes from ``ctx.rng("select")``, seeded per round."""

    def setup(self, ctx: SetupContext) -> None:
        """Called once before the first round with the run's shape and parts."""

    @abstractmethod
    def select(self, ctx: RoundContext) -> list[int]:
        """Return the ids of the ``ctx.spec.clients_per_round`` clients that train in round ``ctx.round_idx``.

        Draw randomness only from ``ctx.rng("select")`` (one generator per call), so a resumed run selects as the
        uninterrupted one did.
        """

    def observe(self, updates: Sequence[ClientUpdate]) -> None:
        """See the updates of the round just finished (losses etc.), e.g. for active selection."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


class UniformSelector(ClientSelector):
    """Pick ``k`` distinct clients uniformly at random (FedAvg's C-fraction sampling).

    Example:
        >>> from lightning_fl.contexts import FederationSpec, RoundContext
        >>> spec = FederationSpec(num_clients=10, clients_per_round=3, num_rounds=1, local_epochs=1,
        ...                       local_steps=None, seed=0, batch_size=8, num_train_samples=(8,) * 10)
        >>> UniformSelector().select(RoundContext(spec, round_idx=0))
        [0, 1, 6]
    """

    def select(self, ctx: RoundContext) -> list[int]:
        return uniform_sample(ctx.spec.num_clients, ctx.spec.clients_per_round, ctx.rng("select"))


def uniform_sample(num_clients: int, k: int, generator: torch.Generator) -> list[int]:
    """``k`` distinct client ids out of ``num_clients``, uniformly at random, sorted."""
    return sorted(torch.randperm(num_clients, generator=generator)[:k].tolist())
