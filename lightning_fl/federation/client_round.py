"""The client step of a round: each selected client's round trip, from downlink to a checked update.

For every selected client, :class:`ClientStep` runs the fit-start callbacks, sends it the global state through the
downlink (broadcast transforms), trains it (in this process with the gradient tap, in the client pool, or at once
with the round's other clients by the vectorised clients), runs the fit-end callbacks, encodes the update with the
client transforms, drops failed clients (a :class:`~lightning_fl.federation.failures.ClientFailure`; any other error
propagates), unsound updates and norm outliers with a warning, and reports each kept update at the client-update
leak point (type 1). The pool that trains the clients of a ``fit`` (local worker processes, Ray actors or DDP ranks)
is opened by :func:`~lightning_fl.federation.pools.open_pool`.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from torch import Tensor

from lightning_fl.federation.failures import ClientFailure, log_failure
from lightning_fl.federation.updates import check_update, drop_norm_outliers, encode_update
from lightning_fl.messages import ClientUpdate, GroundTruth

if TYPE_CHECKING:
    from lightning_fl.callbacks.base import FederatedCallback
    from lightning_fl.contexts import ClientContext, RoundContext
    from lightning_fl.federation.client_runner import ClientRunner
    from lightning_fl.federation.client_store import ClientFit
    from lightning_fl.federation.composition import Plugins
    from lightning_fl.federation.leak_points import LeakPoints
    from lightning_fl.federation.updates import Downlink
    from lightning_fl.federation.vectorised_clients import VectorisedClients
    from lightning_fl.transforms import ClientTransform
    from lightning_fl.view import FederationView

__all__ = ["ClientPool", "ClientStep", "ClientStepResult", "copy_update"]

log = logging.getLogger("lightning_fl.federation.loop")  # client failures stay logged under the loop's name


class ClientPool(Protocol):
    """Trains whole clients elsewhere (worker processes, Ray actors, DDP ranks, Flower SuperNodes).

    ``encodes`` says whether the updates it returns were already encoded by the client transforms on the clients'
    side (Flower's ClientApps run them), so the client step does not encode them again.
    """

    encodes: bool

    def run(self, fits: Sequence[tuple[int, int, dict[str, Tensor]]]) -> dict[int, Any]:
        """Train ``(client_id, round_idx, received)`` for each fit; one result per client id."""

    def collect(self, result: Any, *, ctx: ClientContext) -> ClientFit:
        """The fit in ``result`` (metrics its client logged go to ``ctx``); raises ``ClientFailure`` for a client
        that failed."""

    def close(self) -> None:
        """Stop what the pool started."""


@dataclass(frozen=True)
class ClientStepResult:
    """What the client step returns: the checked updates, why each dropped client was dropped, what was broadcast.

    Args:
        updates: the updates that passed every check, in the order of the selection.
        failures: client id to the reason it was dropped (failed, unsound update, norm outlier).
        offsets: client id to the offset a persistent broadcast added to what it received (see
            :class:`~lightning_fl.federation.updates.Downlink`); empty without one.
        trained_on: client id to the examples its local steps drew (recorded when a callback listens at the
            client-update or aggregate leak point, :class:`~lightning_fl.federation.client_store.ClientFit`), for the
            kept updates; a client missing here trained on its whole training set.
    """

    updates: list[ClientUpdate]
    failures: dict[int, str] = field(default_factory=dict)
    offsets: dict[int, dict[str, Tensor]] = field(default_factory=dict)
    trained_on: dict[int, GroundTruth] = field(default_factory=dict)


def copy_update(update: ClientUpdate) -> ClientUpdate:
    """``update`` with copies of its tensors (what a callback may read and write without touching the original).

    Example:
        >>> import torch
        >>> update = ClientUpdate(0, 0, {"w": torch.zeros(1)}, 1, 0.0)
        >>> _ = copy_update(update).delta["w"].add_(1.0)
        >>> update.delta["w"]
        tensor([0.])
    """
    delta = {k: v.detach().clone() for k, v in update.delta.items()}
    return dataclasses.replace(update, delta=delta, metadata=copy.deepcopy(update.metadata))


def _overrides(callback: FederatedCallback, hook: str) -> bool:
    from lightning_fl.callbacks.base import FederatedCallback

    return getattr(type(callback), hook) is not getattr(FederatedCallback, hook)


class ClientStep:
    """Train a round's selected clients and return their checked updates (:meth:`run`).

    Args:
        runner: trains a client in this process and builds each client's context.
        plugins: the run's plug-ins; this step uses the client-side chain each update passes before it is sent
            (clip, noise, encrypt), the Lightning callbacks added to each client's Trainer and the FL callbacks,
            called with the round's view at the start and end of each client fit.
        downlink: what each client receives (the broadcast transforms).
        leaks: the leak points (the type-2 tap of a local fit, the type-1 report of each kept update).
        vectorised: trains a round's clients in this process at once, when :meth:`run` gets no ``pool`` and the model
            and the round's Trainer callbacks qualify (``None``, or a round that does not qualify: one after the
            other), see :class:`~lightning_fl.federation.vectorised_clients.VectorisedClients`.
        norm_bounds: the update-norm bounds ``(max_update_norm_ratio, max_update_norm)`` (``inf``: off), see
            :func:`~lightning_fl.federation.updates.drop_norm_outliers`.
        min_clients: the fewest valid updates a round may keep.
    """

    def __init__(
        self,
        runner: ClientRunner,
        plugins: Plugins,
        downlink: Downlink,
        leaks: LeakPoints,
        vectorised: VectorisedClients | None = None,
        *,
        norm_bounds: tuple[float, float],
        min_clients: int,
    ) -> None:
        self.runner, self.vectorised, self.downlink, self.leaks = runner, vectorised, downlink, leaks
        self.client_transforms = tuple(plugins.client_transforms)
        self.client_callbacks, self.callbacks = tuple(plugins.client_callbacks), tuple(plugins.callbacks)
        self.max_update_norm_ratio, self.max_update_norm = norm_bounds
        self.min_clients = min_clients

    def run(
        self,
        round_ctx: RoundContext,
        selected: Sequence[int],
        federation: FederationView,
        pool: ClientPool | None = None,
    ) -> ClientStepResult:
        """Train ``selected`` and return the updates that pass every check (at least ``min_clients``); the FL
        callbacks receive ``federation``, the round's view. The clients train in ``pool`` (the pool of the fit;
        ``None``: in this process); a pool that ``encodes`` runs the client transforms itself.

        Raises:
            RuntimeError: when fewer than ``min_clients`` valid updates remain.
        """
        failures: dict[int, str] = {}
        offsets: dict[int, dict[str, Tensor]] = {}
        drawn: dict[int, GroundTruth] = {}
        transforms = () if pool is not None and pool.encodes else self.client_transforms
        trained = self._train(round_ctx, selected, federation, pool, transforms, failures, offsets, drawn)
        updates = drop_norm_outliers(
            trained,
            max_ratio=self.max_update_norm_ratio,
            max_norm=self.max_update_norm,
            round_idx=round_ctx.round_idx,
        )
        kept = {u.client_id for u in updates}
        failures.update({u.client_id: "update-norm outlier" for u in trained if u.client_id not in kept})
        if len(updates) < self.min_clients:
            raise RuntimeError(
                f"round {round_ctx.round_idx}: only {len(updates)} valid client updates (of {len(selected)} "
                f"selected) but loop.min_clients={self.min_clients}; see the warnings above for why clients were "
                "dropped."
            )
        return ClientStepResult(
            updates,
            failures,
            {k: v for k, v in offsets.items() if k in kept},
            {k: v for k, v in drawn.items() if k in kept},
        )

    def _train(
        self,
        round_ctx: RoundContext,
        selected: Sequence[int],
        federation: FederationView,
        given: ClientPool | None,
        transforms: tuple[ClientTransform, ...],
        failures: dict[int, str],
        offsets: dict[int, dict[str, Tensor]],
        drawn: dict[int, GroundTruth],
    ) -> list[ClientUpdate]:
        """Train the selected clients here one after the other, at once (the vectorised clients), or in the pool;
        ``failures``, ``offsets`` and ``drawn`` (the examples a fit drew) receive each client's."""
        round_idx = round_ctx.round_idx
        pool: ClientPool | VectorisedClients | None = given
        if pool is None and self.vectorised is not None:
            pool = self.vectorised.for_round(
                [
                    self.leaks.with_tap(self.client_callbacks, federation, round_idx=round_idx, client_id=k)
                    for k in selected
                ]
            )
        if pool is None:
            updates = []
            for k in selected:
                ctx, received = self._start(round_ctx, k, federation, offsets)
                callbacks = self.leaks.with_tap(self.client_callbacks, federation, round_idx=round_idx, client_id=k)
                train = functools.partial(self.runner.fit, ctx, received, callbacks=callbacks)
                updates.append(self._finish(ctx, received, train, federation, transforms, failures, drawn))
            return [u for u in updates if u is not None]
        started = []
        for k in selected:
            started.append(self._start(round_ctx, k, federation, offsets))
            if pool is self.vectorised:  # what the fit-start callbacks set for this client (DP settings)
                pool.client_started(k)
        results = pool.run([(ctx.client_id, round_idx, received) for ctx, received in started])
        updates = [
            self._finish(
                ctx,
                received,
                functools.partial(pool.collect, results[ctx.client_id], ctx=ctx),
                federation,
                transforms,
                failures,
                drawn,
            )
            for ctx, received in started
        ]
        return [u for u in updates if u is not None]

    def _start(
        self,
        round_ctx: RoundContext,
        client_id: int,
        federation: FederationView,
        offsets: dict[int, dict[str, Tensor]],
    ) -> tuple[ClientContext, dict[str, Tensor]]:
        for cb in self.callbacks:
            cb.on_client_fit_start(federation, client_id)
        ctx = self.runner.context(round_ctx, client_id)
        received, offset = self.downlink.send(ctx)
        if offset is not None:
            offsets[client_id] = offset
        return ctx, received

    def _finish(
        self,
        ctx: ClientContext,
        received: dict[str, Tensor],
        train: Callable[[], ClientFit],
        federation: FederationView,
        transforms: tuple[ClientTransform, ...],
        failures: dict[int, str],
        drawn: dict[int, GroundTruth],
    ) -> ClientUpdate | None:
        client_id, round_idx = ctx.client_id, ctx.round_idx
        try:  # only the client's own work (training, client transforms) raises ClientFailure: see failures.py
            fit = train()
            update = fit.update
            if fit.private is not None:  # the client keeps its new private state once its fit succeeded
                self.runner.store.keep_fit(client_id, fit.private)
            for cb in self.callbacks:  # each gets its own copy: a write into it never reaches the aggregate
                cb.on_client_fit_end(federation, copy_update(update) if _overrides(cb, "on_client_fit_end") else update)
            update, refused = encode_update(update, transforms, ctx=ctx, max_norm=self.max_update_norm)
        except ClientFailure as failure:  # a failing client must never stop or corrupt the federation
            failures[client_id] = f"failed ({failure.detail})"
            message = f"round {round_idx}: client {client_id} failed and is dropped ({failure.detail})"
            warnings.warn(message, stacklevel=4)
            log_failure(log, failure)
            return None
        shapes = ctx.global_state.shapes()
        expected = {k: shapes[k] for k in ctx.spec.update_keys}
        samples = ctx.spec.num_train_samples[client_id]
        reason = refused or check_update(
            update, expected, num_train_samples=samples, client_id=client_id, round_idx=round_idx
        )
        if reason is not None:
            failures[client_id] = reason
            warnings.warn(f"round {round_idx}: update of client {client_id} is dropped: {reason}.", stacklevel=4)
            return None
        self.leaks.client_update(update, received, federation, trained_on=fit.trained_on)
        if fit.trained_on is not None:
            drawn[client_id] = fit.trained_on
        return update
