"""FederatedLoop: rounds of client selection, local Lightning training, aggregation and evaluation.

Each selected client trains a local copy of the global model with its own ``lightning.Trainer`` (any
accelerator, strategy or precision) and returns a :class:`~lightning_fl.messages.ClientUpdate` of public
tensors. See DESIGN.md for the data flow and the three leak points.

Determinism and resume: every random stream of a round (selection, each client's shuffling and dropout,
each transform's noise) is seeded from ``(seed, round_idx, client_id)`` rather than from a running
generator, so a run resumed from the checkpoint of round r continues exactly as the uninterrupted run.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import logging
import math
import random
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import lightning as L
import numpy as np
import torch
from lightning.pytorch.loggers import CSVLogger, Logger
from torch import Tensor

from lightning_fl.callbacks.base import FederatedCallback
from lightning_fl.client import Client, load_state_into
from lightning_fl.datamodules.federated import FederatedDataModule
from lightning_fl.messages import ClientUpdate, GroundTruth, ServerView
from lightning_fl.private import private_state, public_state
from lightning_fl.server import Aggregator, ClientSelector, FedAvg, UniformSelector
from lightning_fl.transforms import BroadcastTransform, ClientTransform, ServerTransform

__all__ = ["FederatedLoop", "derive_seed"]

log = logging.getLogger(__name__)

_QUIET_TRAINER = {
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
    "num_sanity_val_steps": 0,
    "limit_val_batches": 0,
}


def derive_seed(seed: int, *parts: object) -> int:
    """A 31-bit seed derived from ``seed`` and a path of parts (round, client, purpose).

    Example:
        >>> derive_seed(0, "round", 3) == derive_seed(0, "round", 3) != derive_seed(0, "round", 4)
        True
    """
    digest = hashlib.sha256("/".join(map(str, (seed, *parts))).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@contextlib.contextmanager
def _quiet_lightning() -> Iterator[None]:
    """Silence the per-fit chatter of client Trainers (info lines, data-loader and pytree warnings).

    Re-entrant and cheap when already quiet: ``Logger.setLevel`` clears every logger's cache, so levels are
    only touched when they differ.
    """
    names = ("lightning.pytorch", "lightning.fabric")
    loggers = [lg for lg in map(logging.getLogger, names) if lg.level != logging.WARNING]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            for message in (
                ".*does not have many workers.*",
                ".*number of training batches.*",
                ".*but have no `val_dataloader`.*",
                ".*LeafSpec.*",
                ".*GPU available but not used.*",
                ".*exists and is not empty.*",
            ):
                warnings.filterwarnings("ignore", message=message)
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _overrides(callback: object, hook: str) -> bool:
    """Whether ``callback`` implements ``hook``; ``listens_to(hook) -> bool`` narrows it (one attack, one leak)."""
    listens_to = getattr(callback, "listens_to", None)
    if callable(listens_to) and not listens_to(hook):
        return False
    return getattr(type(callback), hook) is not getattr(FederatedCallback, hook)


class _LocalGradientTap(L.Callback):
    """Lightning callback inside a client's Trainer: hands each local gradient to the loop (type-2 leak)."""

    def __init__(self, loop: FederatedLoop, client_id: int) -> None:
        self.loop, self.client_id, self.batch = loop, client_id, None

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.batch = batch

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        gradients = {n: p.grad for n, p in pl_module.named_parameters() if p.grad is not None}
        self.loop.emit_local_gradient(self.client_id, pl_module, gradients, self.batch, optimizer)


class FederatedLoop:
    """Run federated training where every client is an ordinary Lightning Trainer.

    Args:
        model: the global model; any ``LightningModule``. Modules marked private (see
            :mod:`lightning_fl.private`) stay on the clients.
        datamodule: the federated data.
        num_rounds: number of communication rounds T.
        clients_per_round: clients selected per round: an int K, or a fraction C in (0, 1] of the clients.
        local_epochs: local epochs E per client fit (ignored when ``local_steps`` is set).
        local_steps: local optimiser steps per client fit instead of epochs.
        selector: client selection strategy (uniform by default).
        aggregator: aggregation rule (sample-weighted FedAvg by default).
        client_transforms: client-side chain applied to each update before it is sent (clip, noise, encrypt).
        server_transforms: server-side chain applied to the aggregate delta (server noise, fine-tuning).
        broadcast_transforms: server-side chain applied to the global state sent to each client.
        callbacks: federated callbacks (attacks, budget, logging).
        client_callbacks: Lightning callbacks added to every client's Trainer (e.g. per-example DP).
        trainer: options for each client's ``lightning.Trainer`` (``accelerator``, ``devices``, ``strategy``,
            ``precision``, ...); logging, checkpointing and the per-client progress bar are off unless given.
        loggers: Lightning loggers at the loop level, stepped by round. A CSV logger is always added.
        wandb_project: if set, also log to Weights & Biases under this project.
        wandb_mode: ``offline`` (default: no network, sync later with ``wandb sync``), ``online`` or ``disabled``.
        eval_every: evaluate every this many rounds (and always after the last); 0 disables.
        eval_on: ``global`` evaluates the global model; ``clients`` averages the accuracy of each trained
            client's own model (global public state + its private layers), as personalised defences need.
        eval_metric: the name the model logs in ``test_step`` that is reported as ``test_accuracy``.
        min_clients: a round fails with an error when fewer valid updates than this remain.
        output_dir: run directory for ``summary.json``, checkpoints, logs and attack images.
        checkpoint: write a checkpoint after every round (needed for ``resume``).
        seed: master seed; every random stream derives from it.
        progress_bar: show a rich progress bar over rounds.

    Raises:
        ValueError: on inconsistent settings (named in the message), before any training.
    """

    def __init__(
        self,
        model: L.LightningModule,
        datamodule: FederatedDataModule,
        *,
        num_rounds: int = 10,
        clients_per_round: int | float = 1.0,
        local_epochs: int = 1,
        local_steps: int | None = None,
        selector: ClientSelector | None = None,
        aggregator: Aggregator | None = None,
        client_transforms: Sequence[ClientTransform] = (),
        server_transforms: Sequence[ServerTransform] = (),
        broadcast_transforms: Sequence[BroadcastTransform] = (),
        callbacks: Sequence[FederatedCallback] = (),
        client_callbacks: Sequence[L.Callback] = (),
        trainer: dict[str, Any] | None = None,
        loggers: Sequence[Logger] = (),
        wandb_project: str | None = None,
        wandb_mode: Literal["offline", "online", "disabled"] = "offline",
        eval_every: int = 1,
        eval_on: Literal["global", "clients"] = "global",
        eval_metric: str = "test_acc",
        min_clients: int = 1,
        output_dir: str | Path = "runs/lightning-fl",
        checkpoint: bool = True,
        seed: int = 0,
        progress_bar: bool = True,
    ) -> None:
        if num_rounds < 0:
            raise ValueError(f"loop.num_rounds={num_rounds} must be >= 0.")
        if local_steps is None and local_epochs < 1:
            raise ValueError(f"loop.local_epochs={local_epochs} must be >= 1 (or set loop.local_steps).")
        if local_steps is not None and local_steps < 1:
            raise ValueError(f"loop.local_steps={local_steps} must be >= 1 or null.")
        if eval_every < 0:
            raise ValueError(f"loop.eval_every={eval_every} must be >= 0.")
        if eval_on not in ("global", "clients"):
            raise ValueError(f"loop.eval_on={eval_on!r} is unknown; use 'global' or 'clients'.")
        datamodule.setup()  # load and partition now, so data errors surface before any training
        self.num_clients = datamodule.num_clients
        self.clients_per_round = self._resolve_clients_per_round(clients_per_round, self.num_clients)
        if not 1 <= min_clients <= self.clients_per_round:
            raise ValueError(
                f"loop.min_clients={min_clients} must be between 1 and loop.clients_per_round "
                f"({self.clients_per_round})."
            )
        forbidden = {"max_epochs", "max_steps", "callbacks"} & set(trainer or {})
        if forbidden:
            raise ValueError(
                f"loop.trainer sets {sorted(forbidden)}; use loop.local_epochs / loop.local_steps / "
                "loop.client_callbacks instead."
            )
        self.global_model = model
        self.datamodule = datamodule
        self.num_rounds = num_rounds
        self.local_epochs, self.local_steps = local_epochs, local_steps
        self.selector = selector or UniformSelector()
        self.aggregator = aggregator or FedAvg()
        self.client_transforms = list(client_transforms)
        self.server_transforms = list(server_transforms)
        self.broadcast_transforms = list(broadcast_transforms)
        self.callbacks = list(callbacks)
        self.client_callbacks = list(client_callbacks)
        self.trainer_options = {**_QUIET_TRAINER, "accelerator": "cpu", "devices": 1, **(trainer or {})}
        self.eval_every, self.eval_on, self.eval_metric = eval_every, eval_on, eval_metric
        self.min_clients = min_clients
        self.output_dir = Path(output_dir)
        self.checkpoint_enabled = checkpoint
        self.seed = seed
        self.progress_bar = progress_bar
        self.wandb_project, self.wandb_mode = wandb_project, wandb_mode
        self._extra_loggers = list(loggers)

        self.round_idx = 0
        self.clients = [Client(k) for k in range(self.num_clients)]
        self.history: list[dict[str, Any]] = []
        self.attacks: list[dict[str, Any]] = []
        self._round_metrics: dict[str, float] = {}
        self._initial_private = {k: v.detach().clone() for k, v in private_state(model).items()}
        self._worker: L.LightningModule | None = None
        self._current_client: int | None = None
        self._received: dict[str, Tensor] = {}
        self._broadcast_offsets: dict[int, dict[str, Tensor]] = {}
        self._delta_key_cache: list[str] | None = None
        self.loggers: list[Logger] = []

    # -- configuration helpers --------------------------------------------------------------------------
    @staticmethod
    def _resolve_clients_per_round(value: int | float, num_clients: int) -> int:
        if (isinstance(value, float) and not value.is_integer()) or (isinstance(value, float) and value <= 1.0):
            if not 0.0 < value <= 1.0:
                raise ValueError(f"loop.clients_per_round={value} as a fraction must be in (0, 1].")
            return max(1, round(value * num_clients))
        k = int(value)
        if k < 1:
            raise ValueError(f"loop.clients_per_round={value} must be >= 1.")
        if k > num_clients:
            raise ValueError(
                f"loop.clients_per_round={k} exceeds data.num_clients={num_clients}; lower the first or "
                "raise the second."
            )
        return k

    @property
    def run_dir(self) -> Path:
        return self.output_dir

    @property
    def worker(self) -> L.LightningModule:
        """The one local model instance reused for every client fit (built once, never per client)."""
        if self._worker is None:
            self._worker = copy.deepcopy(self.global_model)
        return self._worker

    def global_public_state(self) -> dict[str, Tensor]:
        """The public global state (references into the global model)."""
        return public_state(self.global_model)

    def _delta_keys(self) -> list[str]:
        """Keys of the public floating-point tensors: what an update carries. Fixed for a run, so computed once."""
        if self._delta_key_cache is None:
            self._delta_key_cache = [k for k, v in self.global_public_state().items() if v.is_floating_point()]
        return self._delta_key_cache

    # -- public API for callbacks and transforms ------------------------------------------------------
    def log_metrics(self, metrics: dict[str, float]) -> None:
        """Add metrics to the current round's history entry (and the loggers), e.g. ``{"epsilon": 1.2}``."""
        self._round_metrics.update({k: float(v) for k, v in metrics.items()})

    def record_attack(self, entry: dict[str, Any]) -> None:
        """Append one attack result to ``summary.json["attacks"]``."""
        self.attacks.append(dict(entry))

    def round_seed(self, *parts: object) -> int:
        """A seed for something random in the current round, e.g. ``loop.round_seed("noise", client_id)``."""
        return derive_seed(self.seed, self.round_idx, *parts)

    def request_stop(self, reason: str) -> None:
        """Stop after the current round (used by the privacy-budget callback)."""
        self._stop_reason = reason

    def attacker_model(self, state: dict[str, Tensor] | None = None) -> L.LightningModule:
        """A fresh copy of the global model as the server knows it, with ``state`` (public) loaded.

        Private modules keep the server's own initialisation: the attacker's guess, never a client's secret.
        """
        model = copy.deepcopy(self.global_model)
        if state is not None:
            load_state_into(model, state)
        return model.train()

    def public_metadata(self, **extra: Any) -> dict[str, Any]:
        dm = self.datamodule
        return {
            "round_idx": self.round_idx,
            "num_classes": dm.num_classes,
            "input_shape": dm.input_shape,
            "batch_size": dm.batch_size,
            "local_epochs": None if self.local_steps else self.local_epochs,
            **extra,
        }

    # -- the type-2 leak point -------------------------------------------------------------------------
    def wants_local_gradients(self) -> bool:
        return any(_overrides(cb, "on_local_gradient") for cb in self.callbacks)

    def emit_local_gradient(
        self,
        client_id: int,
        model: L.LightningModule,
        gradients: dict[str, Tensor],
        batch: Any,
        optimizer: Any,
    ) -> None:
        """Hand one released local gradient to the callbacks (type-2 leak point).

        ``gradients`` must be the gradient the client's optimiser really applies (a DP optimiser calls this
        with its noised gradient). Private parameters are dropped.
        """
        listeners = [cb for cb in self.callbacks if _overrides(cb, "on_local_gradient")]
        if not listeners:
            return
        public = public_state(model)
        view = ServerView(
            leak_point="local_gradient",
            model=self.attacker_model({k: v for k, v in public.items()}),
            tensors={k: g.detach().clone() for k, g in gradients.items() if k in public},
            kind="gradient",
            metadata=self.public_metadata(
                client_id=client_id,
                lr=optimizer.param_groups[0]["lr"] if optimizer is not None else None,
                batch_size=len(batch[1]),
                local_steps=1,
            ),
        )
        truth = GroundTruth(batch[0].detach().clone(), batch[1].detach().clone())
        for cb in listeners:
            cb.on_local_gradient(self, view, truth)

    # -- one client -------------------------------------------------------------------------------------
    def _broadcast(self, client_id: int) -> dict[str, Tensor]:
        state = {k: v.detach().clone() for k, v in self.global_public_state().items()}
        for transform in self.broadcast_transforms:
            state = transform(state, client_id=client_id, loop=self)
        if any(t.persistent for t in self.broadcast_transforms):
            public = self.global_public_state()
            self._broadcast_offsets[client_id] = {k: state[k] - public[k] for k in self._delta_keys()}
        return state

    def _against_global(self, update: ClientUpdate) -> ClientUpdate:
        """Server side, for persistent broadcast transforms: measure ``update`` against the global state.

        ``delta + (received - global) = w_k - w``, so aggregation averages client models (2DP-FL) instead of
        forgetting what the broadcast added.
        """
        offset = self._broadcast_offsets.pop(update.client_id, None)
        if offset is None:
            return update
        if update.payload is not None:
            raise ValueError(
                "a persistent broadcast transform cannot be combined with an encrypted update payload; "
                "the server cannot add the broadcast offset to ciphertexts."
            )
        return dataclasses.replace(update, delta={k: v + offset[k] for k, v in update.delta.items()})

    def _make_trainer(self, callbacks: list[L.Callback]) -> L.Trainer:
        steps = (
            {"max_steps": self.local_steps, "max_epochs": -1} if self.local_steps else {"max_epochs": self.local_epochs}
        )
        return L.Trainer(**self.trainer_options, **steps, callbacks=callbacks)

    def fit_client(self, client_id: int) -> ClientUpdate:
        """Train client ``client_id`` on the state the server sends it; return its raw update."""
        client, worker = self.clients[client_id], self.worker
        received = self._broadcast(client_id)
        self._received = received
        client.prepare(
            worker,
            received,
            generator_seed=derive_seed(self.seed, "private", client_id),
            initial_private=self._initial_private,
        )
        fit_seed = self.round_seed("fit", client_id)
        _seed_all(fit_seed)
        callbacks = [*self.client_callbacks]
        # a DP callback whose optimiser noises inside its step releases the gradient itself (emits_local_gradient)
        if self.wants_local_gradients() and not any(getattr(cb, "emits_local_gradient", False) for cb in callbacks):
            callbacks.append(_LocalGradientTap(self, client_id))
        loader = self.datamodule.train_dataloader(client_id, seed=fit_seed)
        with _quiet_lightning():
            trainer = self._make_trainer(callbacks)
            trainer.fit(worker, train_dataloaders=loader)
        client.keep_private(worker)
        local = public_state(worker)
        delta = {k: (local[k] - received[k]).detach().clone() for k in self._delta_keys()}
        loss = trainer.callback_metrics.get("train_loss")
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        return ClientUpdate(
            client_id=client_id,
            round_idx=self.round_idx,
            delta=delta,
            num_samples=self.datamodule.num_train_samples(client_id),
            loss=float(loss) if loss is not None else math.nan,
            metadata={
                "local_steps": int(trainer.global_step),
                "local_epochs": int(trainer.current_epoch),
                "lr": optimizer.param_groups[0]["lr"] if optimizer is not None else None,
                "optimizer": type(optimizer).__name__.lower() if optimizer is not None else None,
                "batch_size": loader.batch_size,
            },
        )

    def _validate(self, update: ClientUpdate, expected: dict[str, Tensor]) -> str | None:
        """Why ``update`` must be dropped, or None when it is sound."""
        if update.payload is not None:
            # an opaque payload (ciphertexts) carries the layers missing from delta; the aggregator that reads it
            # checks it, here only the plaintext layers are
            expected = {k: v for k, v in expected.items() if k in update.delta}
        if set(update.delta) != set(expected):
            missing, extra = (
                sorted(set(expected) - set(update.delta)),
                sorted(set(update.delta) - set(expected)),
            )
            return f"wrong keys (missing {missing[:3]}, unexpected {extra[:3]})"
        for key, value in update.delta.items():
            if not isinstance(value, Tensor) or value.shape != expected[key].shape:
                return (
                    f"tensor {key!r} has shape {getattr(value, 'shape', None)}, expected {tuple(expected[key].shape)}"
                )
            if not torch.isfinite(value).all():
                return f"tensor {key!r} has non-finite values"
        if not (update.num_samples > 0):
            return f"num_samples={update.num_samples} is not positive"
        return None

    def _run_client(self, client_id: int) -> ClientUpdate | None:
        for cb in self.callbacks:
            cb.on_client_fit_start(self, client_id)
        self._current_client = client_id
        try:
            update = self.fit_client(client_id)
            for cb in self.callbacks:
                cb.on_client_fit_end(self, update)
            for transform in self.client_transforms:
                update = transform(update, loop=self)
        except Exception as err:  # a failing client must never stop or corrupt the federation
            warnings.warn(
                f"round {self.round_idx}: client {client_id} failed and is dropped ({type(err).__name__}: {err})",
                stacklevel=2,
            )
            log.exception("client %s failed", client_id)
            return None
        finally:
            self._current_client = None
        public = self.global_public_state()
        reason = self._validate(update, {k: public[k] for k in self._delta_keys()})
        if reason is not None:
            warnings.warn(f"round {self.round_idx}: update of client {client_id} is dropped: {reason}.", stacklevel=2)
            return None
        listeners = [cb for cb in self.callbacks if _overrides(cb, "on_client_update")]
        if listeners:
            view = ServerView(
                leak_point="client_update",
                model=self.attacker_model(self._received),
                tensors={k: v.detach().clone() for k, v in update.delta.items()},
                kind="update",
                metadata=self.public_metadata(client_id=client_id, num_samples=update.num_samples, **update.metadata),
            )
            truth = self.datamodule.ground_truth(client_id)
            for cb in listeners:
                cb.on_client_update(self, view, truth)
        return update

    # -- one round ---------------------------------------------------------------------------------------
    def select_clients(self) -> list[int]:
        generator = torch.Generator().manual_seed(self.round_seed("select"))
        return self.selector.select(
            round_idx=self.round_idx,
            num_clients=self.num_clients,
            k=self.clients_per_round,
            generator=generator,
        )

    def run_round(self) -> dict[str, Any]:
        """Run round ``self.round_idx``: select, train, aggregate, evaluate. Returns its history entry."""
        self._round_metrics = {}
        self._broadcast_offsets.clear()
        selected = self.select_clients()
        for cb in self.callbacks:
            cb.on_round_start(self, self.round_idx, selected)
        updates = [u for u in (self._run_client(k) for k in selected) if u is not None]
        if len(updates) < self.min_clients:
            raise RuntimeError(
                f"round {self.round_idx}: only {len(updates)} valid client updates (of {len(selected)} selected) "
                f"but loop.min_clients={self.min_clients}; see the warnings above for why clients were dropped."
            )
        updates = [self._against_global(u) for u in updates]
        self.selector.observe(updates)
        global_state = self.global_public_state()
        aggregate = self.aggregator.aggregate(updates, global_state=global_state)
        delta = self._decode_aggregate(aggregate)
        # what the server itself can read: all of a plain aggregate, only the plaintext part of an encoded one
        server_readable = delta if isinstance(aggregate, dict) else dict(getattr(aggregate, "plaintext", {}))
        for transform in self.server_transforms:
            delta = transform(delta, loop=self)
        bad = [k for k, v in delta.items() if not torch.isfinite(v).all()]
        if bad:
            raise RuntimeError(
                f"round {self.round_idx}: the aggregate has non-finite values in {bad[:3]}; "
                "the global model was left unchanged."
            )
        listeners = [cb for cb in self.callbacks if _overrides(cb, "on_aggregate_end")]
        if listeners:
            view = ServerView(
                leak_point="aggregate",
                model=self.attacker_model(global_state),
                tensors={k: v.detach().clone() for k, v in server_readable.items()},
                kind="update",
                metadata=self.public_metadata(
                    client_id=None,
                    num_samples=sum(u.num_samples for u in updates),
                    num_clients=len(updates),
                    **{k: updates[0].metadata.get(k) for k in ("lr", "local_steps")},
                ),
            )
            parts = [self.datamodule.ground_truth(u.client_id) for u in updates]
            truth = GroundTruth(torch.cat([p.inputs for p in parts]), torch.cat([p.targets for p in parts]))
            for cb in listeners:
                cb.on_aggregate_end(self, view, truth)
        with torch.no_grad():
            for key, value in delta.items():
                global_state[key].add_(value.to(global_state[key].dtype))
        losses = [u.loss for u in updates if math.isfinite(u.loss)]
        entry: dict[str, Any] = {
            "round": self.round_idx,
            "clients": [u.client_id for u in updates],
            "train_loss": float(np.mean(losses)) if losses else None,
        }
        last = self.round_idx == self.num_rounds - 1
        if self.eval_every and ((self.round_idx + 1) % self.eval_every == 0 or last):
            entry["test_accuracy"] = self.evaluate()
        entry.update(self._round_metrics)
        return entry

    def _decode_aggregate(self, aggregate: Any) -> dict[str, Tensor]:
        """Client side: the client transforms, in reverse order, decode what the aggregator returned (decrypt)."""
        for transform in reversed(self.client_transforms):
            aggregate = transform.decode_aggregate(aggregate, loop=self)
        if not isinstance(aggregate, dict):
            raise TypeError(
                f"loop.aggregator={type(self.aggregator).__name__} returned a {type(aggregate).__name__} that no "
                "client transform decoded; add the matching client transform (e.g. PaillierEncryption)."
            )
        return aggregate

    # -- evaluation ----------------------------------------------------------------------------------------
    def _test(self, model: L.LightningModule) -> float:
        with _quiet_lightning():
            if self._eval_trainer is None:
                self._eval_trainer = L.Trainer(**self.trainer_options)
            results = self._eval_trainer.test(model, dataloaders=self.datamodule.test_dataloader(), verbose=False)
        if self.eval_metric not in results[0]:
            raise KeyError(
                f"loop.eval_metric={self.eval_metric!r} was not logged by {type(model).__name__}.test_step; "
                f"logged: {sorted(results[0])}. HINT: log it with self.log(...) or change loop.eval_metric."
            )
        return float(results[0][self.eval_metric])

    _eval_trainer: L.Trainer | None = None

    def evaluate(self) -> float:
        """Test accuracy of the global model, or the mean over trained clients' own models (``eval_on``)."""
        if self.eval_on == "global" or not self._initial_private:
            return self._test(self.global_model)
        trained = [c for c in self.clients if c.initialised]
        if not trained:
            return self._test(self.global_model)
        worker, scores = self.worker, []
        public = {k: v.detach().clone() for k, v in self.global_public_state().items()}
        for client in trained:
            load_state_into(worker, public)
            load_state_into(worker, client.private)
            scores.append(self._test(worker))
        return float(np.mean(scores))

    # -- checkpoints ---------------------------------------------------------------------------------------
    @property
    def server_checkpoint_path(self) -> Path:
        return self.output_dir / "checkpoints" / "server.pt"

    def client_checkpoint_path(self, client_id: int) -> Path:
        """Client-side storage (private tensors); never part of the server checkpoint."""
        return self.output_dir / "clients" / f"client_{client_id}.pt"

    @staticmethod
    def _atomic_save(obj: Any, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save(obj, tmp)
        tmp.replace(path)

    def save_checkpoint(self, touched: Sequence[int] = ()) -> None:
        """Write the server checkpoint (public state only) and the state of the clients in ``touched``."""
        self._atomic_save(
            {
                "round_idx": self.round_idx,
                "global_state": {k: v.detach().cpu() for k, v in self.global_public_state().items()},
                "selector": self.selector.state_dict(),
                "aggregator": self.aggregator.state_dict(),
                "transforms": [t.state_dict() for t in self._transforms()],
                "callbacks": [cb.state_dict() for cb in self.callbacks],
                "history": self.history,
                "attacks": self.attacks,
            },
            self.server_checkpoint_path,
        )
        initial = self.output_dir / "clients" / "initial_private.pt"
        if self._initial_private and not initial.exists():
            self._atomic_save(self._initial_private, initial)  # what new clients start from (client-side storage)
        for client_id in touched:
            client = self.clients[client_id]
            if client.initialised or client.extra:
                self._atomic_save(client.state_dict(), self.client_checkpoint_path(client_id))

    def _transforms(self) -> list[Any]:
        return [*self.client_transforms, *self.server_transforms, *self.broadcast_transforms]

    def load_checkpoint(self) -> bool:
        """Restore the last completed round; False when there is no checkpoint."""
        path = self.server_checkpoint_path
        if not path.exists():
            return False
        state = torch.load(path, map_location="cpu", weights_only=True)
        load_state_into(self.global_model, state["global_state"])
        self.round_idx = int(state["round_idx"])
        self.selector.load_state_dict(state["selector"])
        self.aggregator.load_state_dict(state["aggregator"])
        for transform, t_state in zip(self._transforms(), state["transforms"], strict=True):
            transform.load_state_dict(t_state)
        for cb, cb_state in zip(self.callbacks, state["callbacks"], strict=True):
            cb.load_state_dict(cb_state)
        self.history, self.attacks = list(state["history"]), list(state["attacks"])
        initial = self.output_dir / "clients" / "initial_private.pt"
        if initial.exists():
            self._initial_private = torch.load(initial, map_location="cpu", weights_only=True)
        for k in range(self.num_clients):
            cpath = self.client_checkpoint_path(k)
            if cpath.exists():
                self.clients[k] = Client.from_state_dict(torch.load(cpath, map_location="cpu", weights_only=True))
        return True

    # -- the run ---------------------------------------------------------------------------------------------
    def _setup_loggers(self) -> None:
        self.loggers = [CSVLogger(str(self.output_dir), name="logs", version="")]
        if self.wandb_project is not None:
            from lightning.pytorch.loggers import WandbLogger

            self.loggers.append(
                WandbLogger(project=self.wandb_project, save_dir=str(self.output_dir), mode=self.wandb_mode)
            )
        self.loggers.extend(self._extra_loggers)
        for entry in self.history:  # a resumed run replays finished rounds so every logger holds the whole curve
            self._log_entry(entry)

    def _log_entry(self, entry: dict[str, Any]) -> None:
        metrics = {k: v for k, v in entry.items() if isinstance(v, int | float) and k != "round"}
        for logger in self.loggers:
            logger.log_metrics(metrics, step=entry["round"])

    def summary(self) -> dict[str, Any]:
        """What ``summary.json`` holds."""
        accuracies = [h["test_accuracy"] for h in self.history if h.get("test_accuracy") is not None]
        return {
            "rounds_completed": len(self.history),
            "test_accuracy": accuracies[-1] if accuracies else None,
            "history": self.history,
            "attacks": self.attacks,
            "stop_reason": getattr(self, "_stop_reason", None),
        }

    def write_summary(self) -> Path:
        path = self.output_dir / "summary.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.summary(), indent=2, default=float))
        return path

    def fit(self, *, resume: bool = False) -> dict[str, Any]:
        """Run the remaining rounds; with ``resume``, continue from the last checkpointed round.

        Returns:
            the summary (also written to ``output_dir/summary.json``).
        """
        from rich.progress import Progress

        self.output_dir.mkdir(parents=True, exist_ok=True)
        if resume and self.load_checkpoint():
            log.info("resumed after round %d", self.round_idx - 1)
        self._stop_reason = None
        self._setup_loggers()
        for component in (self.selector, self.aggregator, *self._transforms()):
            component.setup(self)
        for cb in self.callbacks:
            cb.on_fit_start(self)
        with _quiet_lightning(), Progress(disable=not self.progress_bar, transient=False) as progress:
            task = progress.add_task("rounds", total=self.num_rounds, completed=self.round_idx)
            while self.round_idx < self.num_rounds:
                entry = self.run_round()
                self.history.append(entry)
                self._log_entry(entry)
                for cb in self.callbacks:
                    cb.on_round_end(self, self.round_idx, entry)
                self.round_idx += 1
                if self.checkpoint_enabled:
                    self.save_checkpoint(touched=entry["clients"])
                self.write_summary()
                acc = entry.get("test_accuracy")
                progress.update(task, advance=1, description=f"rounds (acc {acc:.3f})" if acc is not None else "rounds")
                if self._stop_reason:
                    log.warning("stopping after round %d: %s", self.round_idx - 1, self._stop_reason)
                    break
        for cb in self.callbacks:
            cb.on_fit_end(self)
        for logger in self.loggers:
            logger.finalize("success")
        self.write_summary()
        return self.summary()
