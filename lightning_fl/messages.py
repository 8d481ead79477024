"""Messages that cross the client/server boundary, and what an attacker at a leak point holds.

The three leak points are the Fed-CDP threat model's leakage types (Wei et al., ICDCS 2021, Sec. III):
type 0 the aggregate (``"aggregate"``), type 1 a client's shared update (``"client_update"``) and type 2
a local gradient during the client's own training (``"local_gradient"``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from torch import Tensor, nn

__all__ = ["LEAK_POINTS", "ClientUpdate", "GradientRelease", "GroundTruth", "LeakPoint", "ServerView"]

LeakPoint = Literal["aggregate", "client_update", "local_gradient"]
LEAK_POINTS: frozenset[str] = frozenset({"aggregate", "client_update", "local_gradient"})

GradientRelease = Callable[[nn.Module, dict[str, Tensor], Any, Any], None]
"""``release(model, gradients, batch, optimizer)``: hand one released local gradient to the type-2 leak point."""


@dataclass(frozen=True)
class ClientUpdate:
    """What a client sends to the server after local training: public tensors only.

    Args:
        client_id: index of the client in the federated data module.
        round_idx: 0-based round in which the update was produced.
        delta: public floating-point state after local training minus the state the client received,
            keyed like the model's ``state_dict``. Private tensors are never here.
        num_samples: number of local training samples (the FedAvg weight).
        loss: mean local training loss of the last local epoch.
        metadata: public facts about the local run: ``local_steps``, ``local_epochs``, ``lr``,
            ``batch_size``, and whatever client transforms add (e.g. a clip bound).
        payload: an opaque replacement for ``delta`` produced by a client transform (e.g. Paillier
            ciphertexts); aggregators that understand it use it, others reject the update.
    """

    client_id: int
    round_idx: int
    delta: dict[str, Tensor]
    num_samples: int
    loss: float
    metadata: dict[str, Any] = field(default_factory=dict)
    payload: Any = None


@dataclass(frozen=True)
class ServerView:
    """Everything an honest-but-curious server holds at one leak point, and nothing else.

    Args:
        leak_point: where it was intercepted (see :data:`LeakPoint`).
        model: the architecture with the public weights the intercepted tensors refer to. Private
            modules hold the server's own initialisation (the attacker's guess), never a client's secret.
            It is the attacker's own copy: attacks may change it.
        tensors: the intercepted tensors keyed like ``model.state_dict()``: a gradient (``kind="gradient"``)
            or a multi-step weight difference new minus old (``kind="update"``).
        kind: ``"gradient"`` or ``"update"``.
        metadata: public metadata: ``round_idx``, ``client_id`` (``None`` for the aggregate),
            ``local_steps``, ``local_epochs``, ``lr``, ``batch_size``, ``num_samples``, ``num_classes``,
            ``input_shape``; at ``local_gradient`` also ``step``, the 0-based local step; ``inputs``:
            ``"images"`` when absent, ``"features"`` for a view whose model input is an intermediate output
            (FDL-PP's cut), where attacks use no image prior.
    """

    leak_point: LeakPoint
    model: nn.Module
    tensors: dict[str, Tensor]
    kind: Literal["gradient", "update"]
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class GroundTruth:
    """The private data behind a leak, kept aside by the loop for scoring only; never given to an attack.

    Args:
        inputs: images in [0, 1], shape ``(N, C, H, W)``.
        targets: integer labels, shape ``(N,)``.
    """

    inputs: Tensor
    targets: Tensor
