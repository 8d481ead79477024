"""One round as a function of values: ``Round.run(round_idx, global_state) -> RoundResult``.

A round selects clients, runs the client step (downlink, local fits, checked updates) and the server step
(aggregation into a new global state) and returns what it produced: the new global state, the aggregated updates,
the failures, the metrics the plug-ins reported, the clients whose state changed and whether a plug-in asked to stop.
It changes no model and writes no file: :class:`~lightning_fl.federation.round_loop.RoundLoop` commits the result.
Compare pfl-research's ``simulate_one_user -> (statistics, metrics)`` and Flower's
``aggregate_fit(server_round, results, failures)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from torch import Tensor

from lightning_fl.contexts import RoundContext
from lightning_fl.messages import ClientUpdate
from lightning_fl.view import RoundReport

if TYPE_CHECKING:
    from lightning_fl.contexts import FederationSpec
    from lightning_fl.federation.client_round import ClientPool, ClientStep
    from lightning_fl.federation.composition import Plugins
    from lightning_fl.federation.server_round import ServerStep
    from lightning_fl.view import FederationView

__all__ = ["Round", "RoundResult"]


@dataclass(frozen=True)
class RoundResult:
    """What one round produced; committing it is all that changes the run.

    Args:
        round_idx: the 0-based round.
        global_state: the new public global state of the keys the updates carry.
        updates: the updates that were aggregated (measured against the global state).
        failures: client id to why that selected client sent no usable update.
        metrics: what the aggregator and the plug-ins reported for the round's history.
        touched: the clients whose client-side state may have changed (committed with the round).
        stop: why a plug-in asked to stop after this round, or ``None``.
    """

    round_idx: int
    global_state: dict[str, Tensor]
    updates: list[ClientUpdate] = field(default_factory=list)
    failures: dict[int, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    touched: tuple[int, ...] = ()
    stop: str | None = None


class Round:
    """Runs one round on the values it is given (:meth:`run`).

    Args:
        spec: the run's shape.
        plugins: the run's plug-ins; a round uses the selector (it picks the round's clients) and the FL callbacks
            (``on_round_start``).
        client_step: trains the selected clients and returns their checked updates.
        server_step: aggregates the updates into the new global state.
        federation: the read-only view the FL callbacks receive; each round gets its own (:meth:`FederationView.at`).
    """

    def __init__(
        self,
        spec: FederationSpec,
        plugins: Plugins,
        *,
        client_step: ClientStep,
        server_step: ServerStep,
        federation: FederationView,
    ) -> None:
        self.spec, self.selector, self.client_step, self.server_step = spec, plugins.selector, client_step, server_step
        self.callbacks, self.federation = tuple(plugins.callbacks), federation

    def run(self, round_idx: int, global_state: Mapping[str, Tensor], pool: ClientPool | None = None) -> RoundResult:
        """Round ``round_idx`` from ``global_state`` (the public global state, never written to); the clients train in
        ``pool`` (``None``: in this process).

        Raises:
            RuntimeError: when fewer than ``loop.min_clients`` valid updates remain, or the aggregate is not finite.
        """
        report = RoundReport()
        federation = self.federation.at(round_idx, report)
        ctx = RoundContext(self.spec, round_idx, global_state, report.log_metrics)
        selected = self.selector.select(ctx)
        for client_id in selected:  # whose client-side state may change in the round
            report.touch(client_id)
        for cb in self.callbacks:  # each its own list: a callback cannot change who trains
            cb.on_round_start(federation, round_idx, list(selected))
        clients = self.client_step.run(ctx, selected, federation, pool)
        server = self.server_step.run(ctx, clients, global_state=global_state, federation=federation)
        report.log_metrics(server.metrics)
        return RoundResult(
            round_idx=round_idx,
            global_state=server.global_state,
            updates=server.updates,
            failures=dict(clients.failures),
            metrics=dict(report.metrics),
            touched=tuple(report.touched),
            stop=report.stop,
        )
