"""The clients' part of one round: the round trip of each selected client, from downlink to a checked update.

For every selected client, :class:`ClientRound` runs the fit-start callbacks, sends it the global state through the
downlink (broadcast transforms), trains it (in this process with the gradient tap, or in the worker pool), runs the
fit-end callbacks, encodes the update with the client transforms, drops failed clients (a
:class:`~lightning_fl.federation.failures.ClientFailure`; any other error propagates), unsound updates and norm
outliers with a warning, and reports each kept update at the client-update leak point. It also chooses the pool
(local worker processes, Ray actors or DDP ranks) that trains the clients during one ``fit``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from torch import Tensor

from lightning_fl.federation.distributed import RankPool, Ranks
from lightning_fl.federation.failures import ClientFailure
from lightning_fl.federation.updates import check_update, drop_norm_outliers, encode_update
from lightning_fl.federation.workers import WorkerPool
from lightning_fl.messages import ClientUpdate

if TYPE_CHECKING:
    from lightning_fl.federation.contexts import ClientContext, RoundContext
    from lightning_fl.federation.loop import FederatedLoop

__all__ = ["ClientRound"]

log = logging.getLogger("lightning_fl.federation.loop")  # client failures stay logged under the loop's name


class ClientRound:
    """Train a round's selected clients for ``loop`` and return their valid updates.

    Reads the loop's settings (callbacks, transforms, update-norm bounds, pool) when it runs, as the loop's own
    methods did, so a setting changed on the loop takes effect in the next round.
    """

    def __init__(self, loop: FederatedLoop) -> None:
        self.loop = loop

    def run(self, round_ctx: RoundContext, selected: Sequence[int]) -> list[ClientUpdate]:
        """Train ``selected`` and return the updates that pass every check (at least ``loop.min_clients``).

        Raises:
            RuntimeError: when fewer than ``loop.min_clients`` valid updates remain.
        """
        loop = self.loop
        updates = drop_norm_outliers(
            self._train(round_ctx, selected),
            max_ratio=loop.max_update_norm_ratio,
            max_norm=loop.max_update_norm,
            round_idx=loop.round_idx,
        )
        if len(updates) < loop.min_clients:
            raise RuntimeError(
                f"round {loop.round_idx}: only {len(updates)} valid client updates (of {len(selected)} selected) "
                f"but loop.min_clients={loop.min_clients}; see the warnings above for why clients were dropped."
            )
        return updates

    @contextlib.contextmanager
    def pool(self, ranks: Ranks | None) -> Iterator[None]:
        """Start ``loop.workers`` processes, or use the DDP ranks, for the rounds of one ``fit`` (none by default)."""
        loop = self.loop
        if loop.workers == 1 and loop.backend == "processes" and ranks is None:
            yield
            return
        if loop.leaks.listeners("on_local_gradient"):
            raise ValueError(
                "loop.workers > 1 and DDP ranks cannot tap local gradients (a callback listens at the type-2 leak "
                "point) in other processes; use loop.workers=1 on one device for gradient-leakage attacks."
            )
        if ranks is not None:
            loop.pool = RankPool(loop.runner, ranks)
        elif loop.backend == "ray":
            from lightning_fl.federation.ray_backend import RayPool

            loop.pool = RayPool(loop.runner, loop.workers)
        else:
            loop.pool = WorkerPool(loop.runner, loop.workers)
        try:
            yield
        finally:
            loop.pool.close()
            loop.pool = None

    def _train(self, round_ctx: RoundContext, selected: Sequence[int]) -> list[ClientUpdate]:
        """Train the selected clients here one after the other, at once (``loop.vectorize``), or in the worker pool
        (``workers > 1``)."""
        loop = self.loop
        pool = loop.pool or loop.vectorised.for_round(
            [loop.leaks.with_tap(loop.client_callbacks, round_idx=loop.round_idx, client_id=k) for k in selected]
        )
        if pool is None:
            updates = []
            for k in selected:
                ctx, received = self._start(round_ctx, k)
                callbacks = loop.leaks.with_tap(loop.client_callbacks, round_idx=loop.round_idx, client_id=k)
                train = functools.partial(loop.runner.fit, ctx, received, callbacks=callbacks)
                updates.append(self._finish(ctx, received, train))
            return [u for u in updates if u is not None]
        started = [self._start(round_ctx, k) for k in selected]
        results = pool.run([(ctx.client_id, loop.round_idx, received) for ctx, received in started])
        updates = [
            self._finish(ctx, received, functools.partial(pool.collect, results[ctx.client_id]))
            for ctx, received in started
        ]
        return [u for u in updates if u is not None]

    def _start(self, round_ctx: RoundContext, client_id: int) -> tuple[ClientContext, dict[str, Tensor]]:
        for cb in self.loop.callbacks:
            cb.on_client_fit_start(self.loop.view, client_id)
        ctx = self.loop.runner.context(round_ctx, client_id)
        return ctx, self.loop.downlink.send(ctx)

    def _finish(
        self, ctx: ClientContext, received: dict[str, Tensor], train: Callable[[], ClientUpdate]
    ) -> ClientUpdate | None:
        loop, client_id = self.loop, ctx.client_id
        try:  # only the client's own work (training, client transforms) raises ClientFailure: see failures.py
            update = train()
            for cb in loop.callbacks:
                cb.on_client_fit_end(loop.view, update)
            update, refused = encode_update(update, loop.client_transforms, ctx=ctx, max_norm=loop.max_update_norm)
        except ClientFailure as failure:  # a failing client must never stop or corrupt the federation
            # stacklevel 4: the warnings point at FederatedLoop.run_round, as before the round trip moved here
            warnings.warn(
                f"round {loop.round_idx}: client {client_id} failed and is dropped ({failure.detail})", stacklevel=4
            )
            log.exception("client %s failed in %s", client_id, failure.stage)
            return None
        reason = refused or check_update(update, {k: ctx.global_state[k] for k in loop.spec.update_keys})
        if reason is not None:
            warnings.warn(f"round {loop.round_idx}: update of client {client_id} is dropped: {reason}.", stacklevel=4)
            return None
        loop.leaks.client_update(update, received)
        return update
