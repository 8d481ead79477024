r"""Aggregation on encoded updates: weighted sums of ciphertexts beside the plaintext layers.

A client transform may replace an update's delta by an opaque ``payload`` that the server can still combine
linearly (Paillier ciphertexts, :mod:`lightning_fl.defences.secure_aggregation.paillier`; thesis Eq. 4.4). The server
needs two things of such a payload, which it declares (:class:`LinearPayload`): the tensors it stands for
(``shapes``) and how several combine (``weighted_sum``), so the aggregation rules here never import the
cryptography, and :class:`~lightning_fl.server.fedboosting.FedBoosting` and
:class:`~lightning_fl.defences.SecureFedAvg` share them.
"""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from torch import Tensor

from lightning_fl.messages import ClientUpdate
from lightning_fl.server.aggregation import Aggregator
from lightning_fl.server.aggregation import weighted_sum as _linear_combination

if TYPE_CHECKING:
    from lightning_fl.contexts import SetupContext

__all__ = ["EncryptedAggregate", "LinearPayload", "PaillierAggregator", "check_payloads", "combine_updates"]


@runtime_checkable
class LinearPayload(Protocol):
    """An update's encoded payload that the server can combine without decoding it (Paillier ciphertexts)."""

    shapes: dict[str, tuple[int, ...]]

    @staticmethod
    def weighted_sum(items: Sequence[Any], *, weights: Sequence[int], normaliser: int) -> Any:
        r""":math:`\sum_i w_i x_i / \mathrm{normaliser}` of payloads of one type, still encoded."""


@dataclass(frozen=True)
class EncryptedAggregate:
    """What a Paillier-aware aggregator sends back to the clients.

    Args:
        encrypted: the combined ciphertexts of the encrypted layers.
        plaintext: the combined layers that clients sent in the clear (``PaillierEncryption(layers=...)``);
            the only part the server can read.
        cost: server-side cost of producing it (``he_aggregate_s``), logged by the decrypting client.
        sender: the client whose own update this is, when the server forwards one update unchanged (FedBoosting's
            training loss); that client holds the plaintext, so it downloads and decrypts nothing.
    """

    encrypted: LinearPayload
    plaintext: dict[str, Tensor] = field(default_factory=dict)
    cost: dict[str, float] = field(default_factory=dict)
    sender: int | None = None


def combine_updates(
    updates: Sequence[ClientUpdate], *, weights: Sequence[float], normaliser: float
) -> dict[str, Tensor] | EncryptedAggregate:
    r"""Server side: :math:`\sum_i w_i \Delta_i / \mathrm{normaliser}` on plaintext deltas or on ciphertexts.

    Encrypted updates (``payload`` set) are combined homomorphically (thesis Eq. 4.4), which needs integer
    weights and normaliser; their plaintext layers, if any, are combined in the clear with the same weights.

    Raises:
        ValueError: if some updates are encrypted and others not, or encrypted updates get non-integer weights.

    Example:
        >>> import torch
        >>> u = [ClientUpdate(k, 0, {"w": torch.tensor([float(k)])}, 10, 0.0) for k in range(3)]
        >>> combine_updates(u, weights=[1, 1, 2], normaliser=4)
        {'w': tensor([1.2500])}
    """
    encrypted = [isinstance(u.payload, LinearPayload) for u in updates]
    if not any(encrypted):
        return _linear_combination([u.delta for u in updates], weights, normaliser)
    if not all(encrypted):
        missing = [u.client_id for u, e in zip(updates, encrypted, strict=True) if not e]
        raise ValueError(f"clients {missing} sent no Paillier payload while others did; all must encrypt.")
    if any(int(w) != w for w in weights) or int(normaliser) != normaliser:
        raise ValueError(f"Paillier aggregation needs integer weights and normaliser, got {list(weights)}.")
    int_weights = [int(w) for w in weights]
    start = time.perf_counter()
    payloads = [u.payload for u in updates]
    combined = type(payloads[0]).weighted_sum(payloads, weights=int_weights, normaliser=int(normaliser))
    elapsed = time.perf_counter() - start
    plaintext = _linear_combination([u.delta for u in updates], int_weights, normaliser) if updates[0].delta else {}
    return EncryptedAggregate(combined, plaintext, {"he_aggregate_s": elapsed})


def check_payloads(updates: Sequence[ClientUpdate], *, global_state: dict[str, Tensor]) -> None:
    """Server side: the encrypted layers of every update must be layers of the global model, of its shapes.

    Raises:
        ValueError: naming the first client whose ciphertexts describe other tensors.

    Example:
        >>> import torch
        >>> check_payloads([ClientUpdate(0, 0, {"w": torch.zeros(2)}, 1, 0.0)], global_state={"w": torch.zeros(2)})
    """
    for update in updates:
        if not isinstance(update.payload, LinearPayload):
            continue
        wrong = [
            name
            for name, shape in update.payload.shapes.items()
            if name not in global_state or tuple(global_state[name].shape) != shape
        ]
        if wrong or set(update.payload.shapes) & set(update.delta):
            raise ValueError(
                f"client {update.client_id} sent ciphertexts for {wrong[:3] or sorted(update.payload.shapes)[:3]} "
                "that do not match the global model's layers (or are also in its plaintext delta)."
            )


class PaillierAggregator(Aggregator):
    """An aggregator that can combine Paillier ciphertexts (``ClientUpdate.payload``) as well as deltas.

    It declares the largest sum of integer weights it applies in one combination, so that
    :class:`~lightning_fl.defences.PaillierEncryption` can check at setup that the packing slots have enough headroom.
    """

    @abstractmethod
    def max_weight_sum(self, ctx: SetupContext) -> int:
        """The largest sum of integer weights this aggregator applies to ciphertexts in the run ``ctx``."""
