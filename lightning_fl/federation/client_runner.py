"""The client runner: trains one whole client on what it received and returns what the fit produced.

This is the seam for parallel back ends: a runner takes a :class:`~lightning_fl.federation.ClientContext` and the
state the client received and returns a :class:`~lightning_fl.federation.client_store.ClientFit` (the raw update,
the client's new private state, what it trained on). :class:`ClientRunner` does it
in this process with one reused worker model; worker processes, Ray actors or DDP ranks would each train whole
clients the same way (same seeds, so the same results) and send the updates back.
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import lightning as L
import numpy as np
import torch
from torch import Tensor

from lightning_fl.contexts import ClientContext, FederationSpec, derive_seed
from lightning_fl.federation.client_store import ClientFit, ClientStore
from lightning_fl.federation.fabric_fit import FabricFit, FitOutcome, model_needs_trainer, options_need_trainer
from lightning_fl.federation.failures import client_work
from lightning_fl.federation.model_contract import split_batch
from lightning_fl.messages import ClientUpdate, GroundTruth
from lightning_fl.private import load_state_into, private_state, public_state, reset_private_state
from lightning_fl.trainers import build_trainer, quiet_lightning

if TYPE_CHECKING:
    from lightning_fl.datamodules.federated import FederatedDataModule

__all__ = ["ClientRunner", "seed_all"]


def seed_all(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators (dropout, augmentation inside a client fit)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class ClientRunner:
    """Train whole clients in this process, one after the other, on one reused worker model.

    Private state is born client-side: the first time a client trains, every private module draws its own
    secrets (``reset_private``) from ``derive_seed(seed, "private", client_id)``. The client keeps them only once
    that fit succeeded, so a client whose first fit fails draws the same secrets again next time.

    Args:
        model: the global model; the worker is a copy of it, built once.
        datamodule: the federated data.
        spec: the run's shape (local epochs or steps, the master seed).
        trainer_options: options of each client's Trainer (see :func:`.trainers.trainer_options`).
        train_loss_key: the metric the model logs in ``training_step`` that is reported as the update's loss.
        record_drawn: keep the examples a fit by local steps draws (a callback reads the type-1 or type-0 leak
            point and scores an attack against them).

    Attributes:
        store: every client's own state and the initial private state (:class:`ClientStore`, their one writer).
        inner_fit: ``"auto"`` trains plain clients on Lightning Fabric and the others on a ``Trainer`` (see
            :meth:`inner_fit_for`); ``"trainer"`` trains every client on a ``Trainer``. Both give the same result.
    """

    def __init__(
        self,
        model: L.LightningModule,
        datamodule: FederatedDataModule,
        spec: FederationSpec,
        *,
        trainer_options: dict[str, Any],
        train_loss_key: str = "train_loss",
        record_drawn: bool = False,
    ) -> None:
        self.global_model, self.datamodule, self.trainer_options, self.spec = model, datamodule, trainer_options, spec
        self.local_epochs, self.local_steps, self.seed = spec.local_epochs, spec.local_steps, spec.seed
        self.train_loss_key = train_loss_key
        self.store = ClientStore(datamodule.num_clients, private_state(model))
        self._worker: L.LightningModule | None = None
        self.inner_fit = "auto"
        self._fabric: FabricFit | None = None
        self._model_reason: str | None = None  # why the worker model needs the Trainer ("" once checked: it does not)
        self.record_drawn = record_drawn

    def use_devices(self, devices: list[int]) -> None:
        """Train the clients on ``devices`` from now on (a DDP rank on its own accelerator)."""
        self.trainer_options = {**self.trainer_options, "devices": devices}

    @property
    def worker(self) -> L.LightningModule:
        """The one local model instance reused for every client fit (built once, never per client)."""
        if self._worker is None:
            self._worker = copy.deepcopy(self.global_model)
        return self._worker

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (Ray actors) without the Fabric, which each process builds for itself."""
        return {**self.__dict__, "_fabric": None}

    def ground_truth(self, batches: Sequence[Any] | None) -> GroundTruth | None:
        """The examples of the ``batches`` a fit drew (recorded when it trains by ``local_steps`` and ``record_drawn``
        is on), for scoring attacks on its update; ``None`` without any (the client's whole training set is then the
        ground truth)."""
        if not batches:
            return None
        inputs, targets = zip(*(split_batch(self.worker, b) for b in batches), strict=True)
        return GroundTruth(torch.cat(inputs).detach().cpu().clone(), torch.cat(targets).detach().cpu().clone())

    def context(self, round_ctx: Any, client_id: int) -> ClientContext:
        """The :class:`ClientContext` of ``client_id`` in the round ``round_ctx``."""
        return ClientContext(
            spec=round_ctx.spec,
            round_idx=round_ctx.round_idx,
            global_state=round_ctx.global_state,
            metrics_sink=round_ctx.metrics_sink,
            client_id=client_id,
            model=self.worker,
            state=self.store[client_id],
            val_dataloader=lambda: self.datamodule.val_dataloader(client_id),
        )

    def load_client(self, ctx: ClientContext, received: dict[str, Tensor]) -> None:
        """Load the received public state and the client's own private state into the worker."""
        worker, state, initial = self.worker, self.store[ctx.client_id], self.store.initial_private
        load_state_into(worker, received)
        if not initial:
            return
        if state.initialised:
            load_state_into(worker, state.private)
        else:
            load_state_into(worker, initial)
            reset_private_state(
                worker, generator=torch.Generator().manual_seed(derive_seed(self.seed, "private", ctx.client_id))
            )

    def load_trained(self, public: dict[str, Tensor], private: dict[str, Tensor]) -> None:
        """Load a client trained elsewhere (a worker process) into the worker, as if it had trained here."""
        load_state_into(self.worker, public)
        load_state_into(self.worker, private)

    def inner_fit_for(self, callbacks: Sequence[L.Callback] = ()) -> tuple[str, str | None]:
        """Which inner fit trains a client with these Trainer ``callbacks``: ``("fabric", None)`` for a plain
        client, else ``("trainer", reason)`` (client callbacks such as ``PerExampleDP`` or the gradient tap, a
        ``loop.trainer`` option, a hook only the Trainer calls, or ``inner_fit="trainer"``)."""
        if self.inner_fit == "trainer":
            return "trainer", "inner_fit='trainer'"
        if self._model_reason is None:
            self._model_reason = model_needs_trainer(self.worker) or ""
        reason = options_need_trainer(self.trainer_options, callbacks) or self._model_reason
        return ("trainer", reason) if reason else ("fabric", None)

    def fit(
        self, ctx: ClientContext, received: dict[str, Tensor], *, callbacks: Sequence[L.Callback] = ()
    ) -> ClientFit:
        """Train client ``ctx.client_id`` on ``received``; returns its raw update (before client transforms), its
        private state and what it trained on. Writes nothing but the worker model.

        Raises:
            ClientFailure: when the client's training raised (see :mod:`~lightning_fl.federation.failures`).
        """
        client_id = ctx.client_id
        fabric = self.inner_fit_for(callbacks)[0] == "fabric"
        outcome, loader, seen = self._train(ctx, received, callbacks, fabric=fabric)
        if outcome is None:  # it logged in a form only the Trainer reduces: this fit and every later one on it
            self._model_reason = "it logs in a form only the Trainer reduces"
            outcome, loader, seen = self._train(ctx, received, callbacks, fabric=False)
        batch_size = getattr(loader, "batch_size", None)
        return self.update_of(client_id, ctx.round_idx, received, outcome, batch_size=batch_size, drawn=seen)

    def update_of(
        self,
        client_id: int,
        round_idx: int,
        received: dict[str, Tensor],
        outcome: FitOutcome,
        *,
        batch_size: int | None,
        drawn: Sequence[Any] | None = None,
    ) -> ClientFit:
        """The fit of client ``client_id``, just trained into the worker from ``received``: its raw update, the
        worker's private state (the client's own from now on) and the examples of the ``drawn`` batches."""
        worker = self.worker
        private = {k: v.detach().clone() for k, v in private_state(worker).items()}
        local = public_state(worker)
        loss = outcome.metrics.get(self.train_loss_key)
        optimizer = outcome.optimizer
        update = ClientUpdate(
            client_id=client_id,
            round_idx=round_idx,
            delta={k: (local[k] - received[k]).detach().clone() for k in self.spec.update_keys},
            num_samples=self.datamodule.num_train_samples(client_id),
            loss=float(loss) if loss is not None else math.nan,
            metadata={
                "local_steps": outcome.global_step,
                "local_epochs": outcome.current_epoch,
                "lr": optimizer.param_groups[0]["lr"] if optimizer is not None else None,
                "optimizer": type(optimizer).__name__.lower() if optimizer is not None else None,
                "batch_size": batch_size,
            },
        )
        return ClientFit(update, private, self.ground_truth(drawn))

    def _train(
        self, ctx: ClientContext, received: dict[str, Tensor], callbacks: Sequence[L.Callback], *, fabric: bool
    ) -> tuple[FitOutcome | None, Any, list[Any] | None]:
        """Load the client, seed its fit and train it on Fabric (``None``: this model needs the Trainer) or on a
        fresh Lightning ``Trainer`` (any client; callbacks such as Opacus' need it); returns the outcome, the loader
        and the batches it drew (``None`` when not recorded)."""
        self.load_client(ctx, received)
        fit_seed = ctx.seed("fit", ctx.client_id)
        seed_all(fit_seed)
        loader = self.datamodule.train_dataloader(ctx.client_id, seed=fit_seed)
        steps = {"max_steps": self.local_steps or -1, "max_epochs": -1 if self.local_steps else self.local_epochs}
        seen: list[Any] | None = [] if self.local_steps and self.record_drawn else None
        if fabric:
            if self._fabric is None:
                self._fabric = FabricFit()
            with client_work(ctx.client_id, "training"):
                return self._fabric.fit(self.worker, loader, seen=seen, **steps), loader, seen
        recorder = [] if seen is None else [BatchRecorder(seen)]
        with quiet_lightning():
            trainer = build_trainer(self.trainer_options, callbacks=[*callbacks, *recorder], **steps)
            with client_work(ctx.client_id, "training"):
                trainer.fit(self.worker, train_dataloaders=loader)
        return (
            FitOutcome(
                {k: float(v) for k, v in trainer.callback_metrics.items()},
                int(trainer.global_step),
                int(trainer.current_epoch),
                trainer.optimizers[0] if trainer.optimizers else None,
            ),
            loader,
            seen,
        )


class BatchRecorder(L.Callback):
    """Appends every batch a client's ``Trainer`` fit trains on to ``batches`` (the examples behind its update)."""

    def __init__(self, batches: list[Any]) -> None:
        self.batches = batches

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.batches.append(batch)
