"""The server step of a round: aggregate the clients' updates into the new global state.

In order: measure each update against the global state (persistent broadcasts, see
:class:`~lightning_fl.federation.updates.Downlink`), let the selector observe them, aggregate, decode the aggregate
with the client transforms (decrypt, on a participating client's side), apply the server transforms, refuse a
non-finite aggregate, report the aggregate leak point (type 0: the delta after the server transforms, what the new
global model reveals) and return the new global state with the aggregator's metrics. Plug-ins see the global state
only through their :class:`~lightning_fl.contexts.RoundContext` (a copy); the step adds the delta to the state it
reads from ``global_state`` into new tensors and changes no model: :func:`apply_global_state` commits what it
returns.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from lightning_fl.federation.updates import check_aggregate, decode_aggregate
from lightning_fl.messages import ClientUpdate

if TYPE_CHECKING:
    from lightning_fl.contexts import ClientContext, RoundContext
    from lightning_fl.federation.leak_points import LeakPoints
    from lightning_fl.federation.updates import Downlink
    from lightning_fl.server import Aggregator, ClientSelector
    from lightning_fl.transforms import ClientTransform, ServerTransform

__all__ = ["ServerStep", "ServerStepResult", "apply_global_state"]


@dataclass(frozen=True)
class ServerStepResult:
    """What the server step returns.

    Args:
        global_state: the new public global state of the keys the updates carry.
        metrics: the aggregator's metrics for the round's history.
        updates: the updates as measured against the global state (what was aggregated).
    """

    global_state: dict[str, Tensor]
    metrics: dict[str, float] = field(default_factory=dict)
    updates: list[ClientUpdate] = field(default_factory=list)


class ServerStep:
    """Aggregate a round's checked updates into a new global state (:meth:`run`).

    Args:
        aggregator: the aggregation rule.
        selector: the client selection strategy (it observes the round's updates).
        client_transforms: the client-side chain, whose ``decode_aggregate`` runs on a participating client.
        server_transforms: the server-side chain applied to the aggregate delta.
        downlink: measures updates against the global state after a persistent broadcast.
        leaks: the leak points (the aggregate, type 0).
        client_context: builds a client's context in a round (to decode the aggregate on that client's side).
        global_state: reads the current public global state (never written to).
    """

    def __init__(
        self,
        *,
        aggregator: Aggregator,
        selector: ClientSelector,
        client_transforms: Sequence[ClientTransform],
        server_transforms: Sequence[ServerTransform],
        downlink: Downlink,
        leaks: LeakPoints,
        client_context: Callable[[RoundContext, int], ClientContext],
        global_state: Callable[[], Mapping[str, Tensor]],
    ) -> None:
        self.aggregator, self.selector, self.downlink, self.leaks = aggregator, selector, downlink, leaks
        self.client_transforms, self.server_transforms = tuple(client_transforms), tuple(server_transforms)
        self.client_context, self.global_state = client_context, global_state

    def run(self, ctx: RoundContext, updates: Sequence[ClientUpdate]) -> ServerStepResult:
        """The new global state after aggregating ``updates`` in round ``ctx``, and the aggregator's metrics."""
        updates = [self.downlink.against_global(u) for u in updates]
        self.selector.observe(updates)
        aggregate, metrics = self.aggregator.aggregate(updates, ctx=ctx)
        decoder = self.client_context(ctx, updates[0].client_id)  # any participating client holds the keys
        delta = decode_aggregate(aggregate, self.client_transforms, ctx=decoder, source=self.aggregator)
        readable = set(delta)
        if updates[0].payload is not None:  # the server itself reads only the plaintext part of an encoded one
            readable = {k for k in delta if all(k in u.delta for u in updates)}
        for transform in self.server_transforms:
            delta = transform(delta, ctx=ctx)
        check_aggregate(delta, round_idx=ctx.round_idx)
        state = self.global_state()
        # type 0 is what is broadcast: the delta after the server transforms (server-side DP noise included)
        self.leaks.aggregate(updates, global_state=dict(state), readable={k: delta[k] for k in delta if k in readable})
        new_state = {k: state[k] + v.to(state[k].dtype) for k, v in delta.items()}
        return ServerStepResult(new_state, dict(metrics), updates)


def apply_global_state(model: nn.Module, state: Mapping[str, Tensor]) -> None:
    """Copy ``state`` (public tensors, by state-dict key) into ``model`` in place.

    Example:
        >>> model = nn.Linear(1, 1)
        >>> apply_global_state(model, {"bias": torch.tensor([2.0])})
        >>> model.bias.data
        tensor([2.])
    """
    current = model.state_dict()
    with torch.no_grad():
        for key, value in state.items():
            current[key].copy_(value)
