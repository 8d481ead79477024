"""FedAvg: McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized Data".

AISTATS 2017, arXiv:1602.05629, Algorithm 1: the new global model is the sample-count weighted average of
the client models, here written on deltas: w <- w + sum_k (n_k / n) * delta_k.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from torch import Tensor
from typing_extensions import override

from lightning_fl.messages import ClientUpdate
from lightning_fl.server.aggregation import Aggregator, weighted_average

if TYPE_CHECKING:
    from lightning_fl.contexts import RoundContext

__all__ = ["FedAvg"]


class FedAvg(Aggregator):
    """Federated Averaging (McMahan et al., 2017, Alg. 1): average of client deltas.

    Args:
        weighted: weight each client by its number of training samples ``n_k`` (the paper); if false,
            a plain mean.

    Example:
        >>> import torch
        >>> u = [ClientUpdate(k, 0, {"w": torch.tensor([float(k)])}, k + 1, 0.0) for k in range(2)]
        >>> FedAvg().aggregate(u, ctx=None)
        ({'w': tensor([0.6667])}, {})
    """

    def __init__(self, *, weighted: bool = True) -> None:
        self.weighted = weighted

    @override
    def aggregate(
        self, updates: Sequence[ClientUpdate], *, ctx: RoundContext | None
    ) -> tuple[dict[str, Tensor], dict[str, float]]:
        weights = [u.num_samples if self.weighted else 1.0 for u in updates]
        return weighted_average([u.delta for u in updates], weights), {}
