"""The server step of a round: aggregate the clients' updates into the new global state.

In order: measure each update against the global state (persistent broadcasts, see
:class:`~lightning_fl.federation.updates.Downlink`), let the selector observe them, aggregate (with the round's
failures, for an aggregator that takes them), decode the aggregate
with the client transforms (decrypt, on a participating client's side), apply the server transforms, refuse a
non-finite aggregate, report the aggregate leak point (type 0: the delta after the server transforms, what the new
global model reveals) and return the new global state with the aggregator's metrics. Plug-ins see the global state
only through their :class:`~lightning_fl.contexts.RoundContext` (a copy); the step adds the delta to the global
state it is given into new tensors and changes no model: the round's commit writes what it returns.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torch import Tensor

from lightning_fl.federation.updates import against_global, check_aggregate, decode_aggregate
from lightning_fl.messages import ClientUpdate

if TYPE_CHECKING:
    from lightning_fl.contexts import ClientContext, RoundContext
    from lightning_fl.federation.client_round import ClientStepResult
    from lightning_fl.federation.composition import Plugins
    from lightning_fl.federation.leak_points import LeakPoints
    from lightning_fl.view import FederationView

__all__ = ["ServerStep", "ServerStepResult", "accepts_keyword"]


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
        plugins: the run's plug-ins; this step uses the aggregation rule, the selector (it observes the round's
            updates), the client-side chain (whose ``decode_aggregate`` runs on a participating client) and the
            server-side chain applied to the aggregate delta.
        leaks: the leak points (the aggregate, type 0).
        client_context: builds a client's context in a round (to decode the aggregate on that client's side).
    """

    def __init__(
        self,
        plugins: Plugins,
        *,
        leaks: LeakPoints,
        client_context: Callable[[RoundContext, int], ClientContext],
    ) -> None:
        self.aggregator, self.selector, self.leaks = plugins.aggregator, plugins.selector, leaks
        self.client_transforms = tuple(plugins.client_transforms)
        self.server_transforms = tuple(plugins.server_transforms)
        self.client_context = client_context
        self._takes_failures = accepts_keyword(self.aggregator.aggregate, "failures")

    def run(
        self,
        ctx: RoundContext,
        clients: ClientStepResult,
        *,
        global_state: Mapping[str, Tensor],
        federation: FederationView,
    ) -> ServerStepResult:
        """The new global state after aggregating the updates of ``clients`` onto ``global_state`` in round ``ctx``,
        and the aggregator's metrics; the FL callbacks at the aggregate leak point receive ``federation``.

        The aggregator also receives ``clients.failures`` when its ``aggregate`` takes a ``failures`` keyword (as
        Flower's ``aggregate_fit(server_round, results, failures)``).
        """
        updates = [against_global(u, clients.offsets.get(u.client_id)) for u in clients.updates]
        self.selector.observe(updates)
        if self._takes_failures:
            aggregate, metrics = self.aggregator.aggregate(updates, ctx=ctx, failures=dict(clients.failures))
        else:
            aggregate, metrics = self.aggregator.aggregate(updates, ctx=ctx)
        decoder = self.client_context(ctx, updates[0].client_id)  # any participating client holds the keys
        delta = decode_aggregate(aggregate, self.client_transforms, ctx=decoder, source=self.aggregator)
        readable = set(delta)
        if updates[0].payload is not None:  # the server itself reads only the plaintext part of an encoded one
            readable = {k for k in delta if all(k in u.delta for u in updates)}
        for transform in self.server_transforms:
            delta = transform(delta, ctx=ctx)
        check_aggregate(delta, round_idx=ctx.round_idx)
        # type 0 is what is broadcast: the delta after the server transforms (server-side DP noise included)
        self.leaks.aggregate(
            updates,
            federation,
            global_state=dict(global_state),
            readable={k: delta[k] for k in delta if k in readable},
            trained_on=clients.trained_on,
        )
        new_state = {k: global_state[k] + v.to(global_state[k].dtype) for k, v in delta.items()}
        return ServerStepResult(new_state, dict(metrics), updates)


def accepts_keyword(function: Callable[..., Any], name: str) -> bool:
    """Whether ``function`` takes the keyword argument ``name`` (by name or through ``**kwargs``).

    Example:
        >>> accepts_keyword(lambda updates, *, ctx, failures=None: None, "failures")
        True
        >>> accepts_keyword(lambda updates, *, ctx: None, "failures")
        False
    """
    parameters = inspect.signature(function).parameters.values()
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
