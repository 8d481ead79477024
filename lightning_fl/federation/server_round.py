"""The server's part of one round: aggregate the clients' updates and apply the result to the global model."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from lightning_fl.federation.updates import check_aggregate, decode_aggregate
from lightning_fl.messages import ClientUpdate

if TYPE_CHECKING:
    from lightning_fl.federation.contexts import RoundContext
    from lightning_fl.federation.loop import FederatedLoop

__all__ = ["ServerRound"]


class ServerRound:
    """Aggregate a round's valid updates for ``loop`` and add the aggregate delta to its global model.

    In order: measure each update against the global state (persistent broadcasts, see
    :class:`~lightning_fl.federation.updates.Downlink`), let the selector observe them, aggregate (logging the
    aggregator's metrics), decode the aggregate with the client transforms (decrypt), apply the server transforms,
    refuse a non-finite aggregate, report the aggregate leak point (type 0: the delta after the server transforms,
    i.e. what the new global model reveals), then update the global model in place.
    Like :class:`~lightning_fl.federation.client_round.ClientRound`, it reads the loop's parts when it runs.
    """

    def __init__(self, loop: FederatedLoop) -> None:
        self.loop = loop

    def run(self, ctx: RoundContext, updates: list[ClientUpdate]) -> list[ClientUpdate]:
        """Aggregate ``updates`` into the global model; returns them as measured against the global state."""
        loop = self.loop
        updates = [loop.downlink.against_global(u) for u in updates]
        loop.selector.observe(updates)
        aggregate, metrics = loop.aggregator.aggregate(updates, ctx=ctx)
        loop.log_metrics(metrics)
        decoder = loop.runner.context(ctx, updates[0].client_id)  # any participating client holds the keys
        delta = decode_aggregate(aggregate, loop.client_transforms, ctx=decoder, source=loop.aggregator)
        readable = set(delta)
        if updates[0].payload is not None:  # the server itself reads only the plaintext part of an encoded one
            readable = {k for k in delta if all(k in u.delta for u in updates)}
        for transform in loop.server_transforms:
            delta = transform(delta, ctx=ctx)
        check_aggregate(delta, round_idx=loop.round_idx)
        global_state = loop.global_public_state()
        # type 0 is what is broadcast: the delta after the server transforms (server-side DP noise included)
        loop.leaks.aggregate(updates, global_state=global_state, readable={k: delta[k] for k in delta if k in readable})
        with torch.no_grad():
            for key, value in delta.items():
                global_state[key].add_(value.to(global_state[key].dtype))
        return updates
