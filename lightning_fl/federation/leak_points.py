"""The three leak points: the local-gradient tap (type 2), and the one builder of what the server sees.

Fed-CDP's threat model (Wei et al., ICDCS 2021, Sec. III) names three leakages: type 0 the aggregate, type 1 a
client's shared update and type 2 a local gradient. :class:`LeakPoints` builds the
:class:`~lightning_fl.messages.ServerView` of each, only for callbacks that listen, and keeps the ground truth
apart for scoring.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import lightning as L
import torch
from torch import Tensor

from lightning_fl.federation.failures import ServerSideError
from lightning_fl.federation.model_contract import split_batch
from lightning_fl.messages import ClientUpdate, GradientRelease, GroundTruth, LeakPoint, ServerView
from lightning_fl.private import load_state_into, public_state

if TYPE_CHECKING:
    from lightning_fl.callbacks.base import FederatedCallback
    from lightning_fl.contexts import FederationSpec
    from lightning_fl.datamodules.federated import FederatedDataModule
    from lightning_fl.view import FederationView

__all__ = ["GradientRelease", "LeakPoints", "LocalGradientSource", "LocalGradientTap"]


@runtime_checkable
class LocalGradientSource(Protocol):
    """A client training callback that releases the local gradient itself (Opacus' noised gradient).

    While ``release`` is set, the callback calls it with the gradient the optimiser really applies, and the
    loop's default tap (which reads ``p.grad`` before the step) stays off for that fit.
    """

    release: GradientRelease | None


class LocalGradientTap(L.Callback):
    """Lightning callback in a client's Trainer: releases ``p.grad`` before each optimiser step (type-2 leak)."""

    def __init__(self, release: GradientRelease) -> None:
        self.release, self.batch = release, None

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.batch = batch

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        gradients = {n: p.grad for n, p in pl_module.named_parameters() if p.grad is not None}
        self.release(pl_module, gradients, self.batch, optimizer)


class LeakPoints:
    """Builds server views for the callbacks that listen at a leak point, and hands them the ground truth apart.

    Each report takes the round's read-only view, which the callbacks receive as their first argument.

    Args:
        callbacks: the federated callbacks.
        global_model: the global model; views hold fresh copies of it with the public state they refer to.
        datamodule: the federated data (ground truth and public data facts).
        spec: the run's shape (its local epochs go into the views' metadata).
    """

    def __init__(
        self,
        callbacks: Sequence[FederatedCallback],
        *,
        global_model: L.LightningModule,
        datamodule: FederatedDataModule,
        spec: FederationSpec,
    ) -> None:
        self.callbacks, self.global_model = tuple(callbacks), global_model
        self.datamodule, self.local_epochs = datamodule, spec.local_epochs

    def listeners(self, hook: str, **event: Any) -> list[FederatedCallback]:
        """Callbacks that implement ``hook`` and listen to it (:meth:`FederatedCallback.listens_to`); given an
        ``event`` (``round_idx``, ``client_id``, ``step``), only those that want it (:meth:`FederatedCallback.wants`).
        """
        from lightning_fl.callbacks.base import FederatedCallback

        return [
            cb
            for cb in self.callbacks
            if cb.listens_to(hook)
            and getattr(type(cb), hook) is not getattr(FederatedCallback, hook)
            and (not event or cb.wants(hook, **event))
        ]

    def with_tap(
        self, callbacks: Sequence[L.Callback], federation: FederationView, *, round_idx: int, client_id: int
    ) -> list[L.Callback]:
        """A client's Trainer callbacks, plus the type-2 tap when a callback wants this client's local gradients.

        A :class:`LocalGradientSource` among ``callbacks`` (a DP optimiser) releases its noised gradient itself;
        the default tap then stays off. The tap numbers the released gradients (the 0-based local ``step``).
        """
        callbacks = list(callbacks)
        if not self.listeners("on_local_gradient", round_idx=round_idx, client_id=client_id, step=None):
            return callbacks
        steps = itertools.count()

        def release(model: L.LightningModule, grads: dict[str, Tensor], batch: Any, opt: Any) -> None:
            self.local_gradient(federation, round_idx, client_id, next(steps), model, grads, batch, opt)

        sources = [cb for cb in callbacks if isinstance(cb, LocalGradientSource)]
        for source in sources:
            source.release = release
        return callbacks if sources else [*callbacks, LocalGradientTap(release)]

    def attacker_model(self, state: dict[str, Tensor] | None = None) -> L.LightningModule:
        """A fresh copy of the global model as the server knows it, with ``state`` (public) loaded.

        Private modules keep the server's own initialisation: the attacker's guess, never a client's secret.
        """
        model = copy.deepcopy(self.global_model)
        if state is not None:
            load_state_into(model, state)
        return model.train()

    def view(
        self,
        leak_point: LeakPoint,
        *,
        state: dict[str, Tensor],
        tensors: dict[str, Tensor],
        kind: str,
        round_idx: int,
        **metadata: Any,
    ) -> ServerView:
        """The one :class:`ServerView` builder: attacker's model at ``state``, copies of ``tensors``, public facts."""
        dm = self.datamodule
        return ServerView(
            leak_point=leak_point,
            model=self.attacker_model(state),
            tensors={k: v.detach().clone() for k, v in tensors.items()},
            kind=kind,
            metadata={
                "round_idx": round_idx,
                "num_classes": dm.num_classes,
                "input_shape": dm.input_shape,
                "batch_size": dm.batch_size,
                "local_epochs": self.local_epochs,
                **metadata,
            },
        )

    def local_gradient(
        self,
        federation: FederationView,
        round_idx: int,
        client_id: int,
        step: int,
        model: L.LightningModule,
        gradients: dict[str, Tensor],
        batch: Any,
        opt: Any,
    ) -> None:
        """Type 2: the local gradient of 0-based ``step``; private parameters are dropped.

        It runs inside the client's fit but is the server's (the attacks'): what it raises propagates as a
        :class:`~lightning_fl.federation.failures.ServerSideError`, never as that client's failure.
        """
        listeners = self.listeners("on_local_gradient", round_idx=round_idx, client_id=client_id, step=step)
        if not listeners:
            return
        try:
            public = public_state(model)
            inputs, targets = split_batch(model, batch)
            view = self.view(
                "local_gradient",
                state=dict(public),
                tensors={k: g for k, g in gradients.items() if k in public},
                kind="gradient",
                round_idx=round_idx,
                client_id=client_id,
                step=step,
                lr=opt.param_groups[0]["lr"] if opt is not None else None,
                batch_size=len(targets),
                local_steps=1,
            )
            truth = GroundTruth(inputs.detach().clone(), targets.detach().clone())
            for cb in listeners:
                cb.on_local_gradient(federation, view, truth)
        except Exception as err:
            raise ServerSideError(f"the local-gradient leak point failed in client {client_id}'s fit: {err!r}") from err

    def client_update(
        self,
        update: ClientUpdate,
        received: dict[str, Tensor],
        federation: FederationView,
        *,
        trained_on: GroundTruth | None = None,
    ) -> None:
        """Type 1: the update as the server receives it, on the model its client received.

        The ground truth is ``trained_on`` (the examples the client's local steps drew) when given, else the client's
        whole training set (a fit of whole epochs trains on all of it).
        """
        listeners = self.listeners("on_client_update", round_idx=update.round_idx, client_id=update.client_id)
        if not listeners:
            return
        view = self.view(
            "client_update",
            state=received,
            tensors=update.delta,
            kind="update",
            round_idx=update.round_idx,
            client_id=update.client_id,
            num_samples=update.num_samples,
            **update.metadata,
        )
        truth = trained_on if trained_on is not None else self.datamodule.ground_truth(update.client_id)
        for cb in listeners:
            cb.on_client_update(federation, view, truth)

    def aggregate(
        self,
        updates: Sequence[ClientUpdate],
        federation: FederationView,
        *,
        global_state: dict[str, Tensor],
        readable: dict[str, Tensor],
        trained_on: Mapping[int, GroundTruth] | None = None,
    ) -> None:
        """Type 0: what the server itself can read of the broadcast aggregate (all of it, or its plaintext part).

        ``readable`` is the delta after the server transforms (e.g. server-side DP noise): what anyone who sees
        the new global model sees, not the aggregate before them. The ground truth is, client by client in the
        order of ``updates``, the examples its local steps drew (``trained_on``) when given, else its whole
        training set (a fit of whole epochs trains on all of it): the images behind the aggregate.
        """
        listeners = self.listeners("on_aggregate_end", round_idx=updates[0].round_idx, client_id=None)
        if not listeners:
            return
        view = self.view(
            "aggregate",
            state=global_state,
            tensors=readable,
            kind="update",
            round_idx=updates[0].round_idx,
            client_id=None,
            num_samples=sum(u.num_samples for u in updates),
            num_clients=len(updates),
            **{k: updates[0].metadata.get(k) for k in ("lr", "local_steps")},
        )
        drawn, whole = trained_on or {}, self.datamodule.ground_truth
        parts = [drawn[u.client_id] if u.client_id in drawn else whole(u.client_id) for u in updates]
        truth = GroundTruth(torch.cat([p.inputs for p in parts]), torch.cat([p.targets for p in parts]))
        for cb in listeners:
            cb.on_aggregate_end(federation, view, truth)
