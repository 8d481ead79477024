"""FederatedLoop: the assembler of a federated run, where every client is trained by a Lightning Trainer.

The loop builds the run's collaborators once and hands them to the round loop; it holds no per-round logic.
:class:`Round` runs one round on values (select, :class:`ClientStep`, :class:`ServerStep`) and returns a
``RoundResult``; :class:`RoundLoop` commits each result. Plug-ins are merged by :func:`compose`, set up by
:func:`set_up_plugins` and receive narrow contexts (:mod:`lightning_fl.contexts`); FL callbacks receive a read-only
:class:`FederationView`. Every random stream is seeded from ``(seed, round_idx, purpose)``, so a resumed run continues
exactly as the uninterrupted one. See docs/architecture.md.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import lightning as L
from lightning.pytorch.loggers import Logger
from torch import Tensor

from lightning_fl.callbacks.base import FederatedCallback
from lightning_fl.contexts import ClientSetupContext, FederationSpec, RoundContext, SetupContext
from lightning_fl.datamodules.federated import FederatedDataModule
from lightning_fl.defences.base import Defence
from lightning_fl.federation.checkpoint import Checkpoint, RunParts
from lightning_fl.federation.client_round import ClientPool, ClientStep
from lightning_fl.federation.client_runner import ClientRunner
from lightning_fl.federation.client_store import ClientStore
from lightning_fl.federation.composition import compose
from lightning_fl.federation.distributed import launch, ranks_requested, serve, single_device_options
from lightning_fl.federation.evaluation import ClientEvaluation, Evaluator, evaluate_state
from lightning_fl.federation.fingerprint import federation_fingerprint
from lightning_fl.federation.leak_points import LeakPoints
from lightning_fl.federation.model_contract import check_model
from lightning_fl.federation.plugin_setup import client_setup_context, set_up_plugins, setup_context
from lightning_fl.federation.pools import open_pool
from lightning_fl.federation.recording import RunRecorder
from lightning_fl.federation.round import Round
from lightning_fl.federation.round_loop import RoundLoop, global_state_of
from lightning_fl.federation.run_dir import writing_run
from lightning_fl.federation.run_lock import RunLock
from lightning_fl.federation.server_round import ServerStep
from lightning_fl.federation.updates import Downlink, norm_bounds
from lightning_fl.federation.vectorised_clients import VectorisedClients
from lightning_fl.federation.workers import check_workers
from lightning_fl.private import public_state
from lightning_fl.server import Aggregator, ClientSelector
from lightning_fl.trainers import trainer_options
from lightning_fl.transforms import BroadcastTransform, ClientTransform, ServerPlugin, ServerTransform
from lightning_fl.validation import check_federated_data, check_output_dir, check_private_state_stays_local
from lightning_fl.view import FederationView

__all__ = ["FederatedLoop"]

log = logging.getLogger(__name__)


class FederatedLoop:
    """Run federated training where every client is an ordinary Lightning Trainer.

    Args:
        model: the global model; any ``LightningModule`` (see :mod:`lightning_fl.federation.model_contract`);
            modules marked private (:mod:`lightning_fl.private`) stay on the clients.
        datamodule: the federated data.
        num_rounds: number of communication rounds T.
        clients_per_round: clients per round: an int K, or a fraction C in (0, 1] of the clients.
        local_epochs: local epochs E per client fit; local_steps: optimiser steps instead of epochs.
        defences: defence bundles; each adds its model layers (applied to ``model`` now), client callbacks,
            transforms, aggregator or selector to the stages below (see :class:`~lightning_fl.defences.Defence`).
        server_plugins: what a malicious server changes of the model it ships and of what it broadcasts, applied
            before the defences (see :class:`~lightning_fl.transforms.ServerPlugin`).
        selector: client selection strategy (uniform by default).
        aggregator: aggregation rule (sample-weighted FedAvg by default).
        client_transforms: client-side chain applied to each update before it is sent (clip, noise, encrypt).
        server_transforms: server-side chain applied to the aggregate delta (server noise, fine-tuning).
        broadcast_transforms: server-side chain applied to the global state sent to each client.
        callbacks: federated callbacks (attacks, budget, logging).
        client_callbacks: Lightning callbacks added to every client's Trainer.
        trainer: options for each client's ``lightning.Trainer`` (``accelerator``, ``devices``, ``strategy``,
            ``precision``, ...); logging, checkpointing and the per-client progress bar are off unless given.
        loggers: Lightning loggers stepped by round (a CSV logger is always added); wandb_project and
            wandb_mode (``offline`` by default) add Weights & Biases.
        eval_every: evaluate every this many rounds (and always after the last); 0 disables.
        eval_on: ``global`` evaluates the global model; ``clients`` averages the accuracy of each trained
            client's own model (global public state + its private layers), as personalised defences need.
        eval_metric: the name the model logs in ``test_step`` (reported as ``test_accuracy``); train_loss_key:
            the one it logs in ``training_step`` (reported as ``train_loss``).
        min_clients: a round fails with an error when fewer valid updates than this remain.
        max_update_norm_ratio: drop a plaintext update whose L2 norm (after the client transforms) exceeds this
            multiple of the round's median update norm; ``None`` disables (docs/architecture.md).
        max_update_norm: drop any update whose L2 norm exceeds this absolute bound (checked on the client, before
            encryption, for an encrypted update); ``None`` disables.
        output_dir: run directory for ``summary.json``, checkpoints, logs and attack images.
        checkpoint: write a checkpoint after every round (needed for ``resume``).
        seed: master seed; every random stream derives from it.
        progress_bar: show a rich progress bar over rounds.
        workers: train each round's clients in this many local worker processes (CPU), each reusing one model;
            the history equals ``workers=1`` for the same seed (:mod:`lightning_fl.federation.workers`).
        backend: where ``workers`` run: local ``processes``, or ``ray`` actors (needs the ``ray`` extra).
        vectorize: ``True`` trains each round's plain clients at once, parameters stacked
            (:mod:`lightning_fl.federation.vectorised_contract` says which models qualify); ``"auto"`` where the
            model qualifies and it pays; ``False`` one by one. Equal to the sequential history to float tolerance.

    Raises:
        ValueError: on inconsistent settings (named in the message), before any training.
        TypeError: on a model that cannot be a client model (the message says what to add).
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
        defences: Sequence[Defence] = (),
        server_plugins: Sequence[ServerPlugin] = (),
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
        train_loss_key: str = "train_loss",
        min_clients: int = 1,
        max_update_norm_ratio: float | None = 1e3,
        max_update_norm: float | None = 1e6,
        output_dir: str | Path = "runs/lightning-fl",
        checkpoint: bool = True,
        seed: int = 0,
        progress_bar: bool = True,
        workers: int = 1,
        backend: Literal["processes", "ray"] = "processes",
        vectorize: bool | Literal["auto"] = False,
    ) -> None:
        check_model(model)  # every setting is checked before the defences change the model
        check_output_dir(output_dir)  # '' would write the run into the current directory
        self.max_update_norm_ratio, self.max_update_norm = norm_bounds(max_update_norm_ratio, max_update_norm)
        self.process_options = options = trainer_options(trainer)
        self.ranks = ranks_requested(options)
        options = single_device_options(options) if self.ranks > 1 else options
        check_federated_data(datamodule)
        datamodule.setup()  # load and partition now, so data errors surface before any training
        shape = dict(clients_per_round=clients_per_round, num_rounds=num_rounds, local_epochs=local_epochs)
        shape.update(local_steps=local_steps, min_clients=min_clients)
        own = dict(client_transforms=client_transforms, server_transforms=server_transforms, callbacks=callbacks)
        own.update(broadcast_transforms=broadcast_transforms, client_callbacks=client_callbacks)
        own.update(server_plugins=server_plugins, selector=selector, aggregator=aggregator)
        own.update(clients_per_round=FederationSpec.check(datamodule.num_clients, **shape))
        self.plugins = plugins = compose(defences, model=model, data=datamodule, **own)
        self.spec = FederationSpec.build(model, datamodule, seed=seed, **shape)  # the update keys of the defended model
        self.num_clients, self.clients_per_round = self.spec.num_clients, self.spec.clients_per_round
        self.global_model, self.datamodule, self.defences = model, datamodule, list(defences)
        self.num_rounds, self.local_epochs, self.local_steps, self.seed = num_rounds, local_epochs, local_steps, seed
        self.selector, self.aggregator, self.callbacks = plugins.selector, plugins.aggregator, plugins.callbacks
        self.client_transforms, self.server_transforms = plugins.client_transforms, plugins.server_transforms
        self.broadcast_transforms, self.client_callbacks = plugins.broadcast_transforms, plugins.client_callbacks
        check_private_state_stays_local(model, trainer, self.client_callbacks)  # for Python users too, not only the CLI
        self.min_clients, self.output_dir, self.progress_bar = min_clients, Path(output_dir), progress_bar
        self.checkpoint, self.lock = Checkpoint(self.output_dir, enabled=checkpoint), RunLock(self.output_dir)
        self.recorder = RunRecorder(
            self.output_dir, loggers=loggers, wandb_project=wandb_project, wandb_mode=wandb_mode
        )
        check_workers(
            workers, trainer_options=options, client_callbacks=self.client_callbacks, backend=backend, ranks=self.ranks
        )
        self.workers, self.backend = workers, backend
        # with local worker processes, their idle cores evaluate (docs/performance.md)
        threads = min(workers, os.cpu_count() or 1) if workers > 1 and backend == "processes" else None
        self.evaluator = Evaluator(options, every=eval_every, on=eval_on, metric=eval_metric, threads=threads)
        self.leaks = LeakPoints(self.callbacks, global_model=model, datamodule=datamodule, spec=self.spec)
        # an attack on an update or on the aggregate is scored on the examples the local steps drew
        drawn = bool(self.leaks.listeners("on_client_update") or self.leaks.listeners("on_aggregate_end"))
        self.runner = ClientRunner(
            model, datamodule, self.spec, trainer_options=options, train_loss_key=train_loss_key, record_drawn=drawn
        )
        parallel = workers > 1 or backend == "ray" or self.ranks > 1
        self.vectorised = VectorisedClients(self.runner, vectorize, parallel=parallel)
        store, context = self.runner.store, self.runner.context  # the clients' side, which evaluation asks
        self.client_evaluation = ClientEvaluation(
            model, datamodule, store, options, client_transforms=self.client_transforms, context=context
        )
        self._evaluate = functools.partial(
            evaluate_state, evaluator=self.evaluator, model=model, datamodule=datamodule, runner=self.runner
        )
        self.round_idx = 0  # the next round to run
        self.view = FederationView(  # what FL callbacks receive
            spec=self.spec,
            num_rounds=num_rounds,
            output_dir=self.output_dir,
            global_model=model,
            recorder=self.recorder,
            clients=self.runner.store,
            callbacks=self.callbacks,
            client_callbacks=self.client_callbacks,
            ledgers=[*self.callbacks, *plugins.components],
        )
        self.downlink = Downlink(self.broadcast_transforms)
        self.server_step = ServerStep(
            aggregator=self.aggregator,
            selector=self.selector,
            client_transforms=self.client_transforms,
            server_transforms=self.server_transforms,
            leaks=self.leaks,
            client_context=self.runner.context,
        )
        self.client_step = ClientStep(
            self.runner,
            vectorised=self.vectorised,
            downlink=self.downlink,
            leaks=self.leaks,
            client_transforms=self.client_transforms,
            client_callbacks=self.client_callbacks,
            callbacks=self.callbacks,
            max_update_norm_ratio=self.max_update_norm_ratio,
            max_update_norm=self.max_update_norm,
            min_clients=min_clients,
        )
        fingerprint = functools.partial(
            federation_fingerprint,
            spec=self.spec,
            datamodule=datamodule,
            model=model,
            defences=self.defences,
            vectorize=self.vectorised.mode,
            **plugins.by_stage(),
            trainer=self.process_options,
            norm_bounds=(self.max_update_norm_ratio, self.max_update_norm),
            eval_on=self.evaluator.on,
        )
        self.parts = RunParts(model, plugins.components, self.callbacks, self.recorder, self.runner.store, fingerprint)
        one_round = Round(
            spec=self.spec,
            selector=self.selector,
            client_step=self.client_step,
            server_step=self.server_step,
            callbacks=self.callbacks,
            federation=self.view,
        )
        self.rounds = RoundLoop(
            round=one_round,
            parts=self.parts,
            checkpoint=self.checkpoint if checkpoint else None,
            evaluator=self.evaluator,
            evaluate=self._evaluate,
            callbacks=self.callbacks,
            federation=self.view,
            num_rounds=num_rounds,
            progress_bar=progress_bar,
        )
        self._prepared: bool | None = None  # the ``resume`` flag prepare() ran with

    @property
    def clients(self) -> ClientStore:
        """The clients' own states (client-side; only FL callbacks that model a client may read them)."""
        return self.runner.store

    @property
    def history(self) -> list[dict[str, Any]]:
        return self.recorder.history

    def global_public_state(self) -> dict[str, Tensor]:
        """A copy of the committed public global state."""
        return global_state_of(self.parts)

    def round_context(self) -> RoundContext:
        """The :class:`RoundContext` of round ``round_idx`` from the committed global state (metrics not kept)."""
        return RoundContext(self.spec, self.round_idx, public_state(self.global_model))

    def run_round(self) -> dict[str, Any]:
        """Run round ``round_idx`` in this process and commit it in memory (no files); returns its history entry."""
        return self.rounds.step(self.round_idx)[0]

    def evaluate(self) -> float:
        """Test accuracy of the global model, or the mean over trained clients' own models (``eval_on``)."""
        return self._evaluate(global_state_of(self.parts))

    def fingerprint(self) -> dict[str, Any]:
        """The settings that define this federation (see :mod:`lightning_fl.federation.fingerprint`)."""
        return self.parts.fingerprint()

    def setup_context(self) -> SetupContext:
        """What the server-side parts inspect in their ``setup``: no client's state or data."""
        options, evaluation = self.runner.trainer_options, self.client_evaluation
        return setup_context(self.spec, self.datamodule, self.global_model, options, self.plugins, evaluation)

    def client_setup_context(self) -> ClientSetupContext:
        """What the plug-ins' client-side set-up (``setup_clients``) receives: the clients' own states and data."""
        return client_setup_context(spec=self.spec, datamodule=self.datamodule, clients=self.runner.store)

    def prepare(self, *, resume: bool = False, pool: ClientPool | None = None) -> None:
        """Check and set up everything a run needs, writing nothing; :meth:`fit` calls it when it was not called.

        Restores the last committed round (``resume``), sets the plug-ins up (:func:`set_up_plugins`; not their
        client side for a ``pool`` whose clients set themselves up) and tests the global model on one batch, so a
        wrong ``eval_metric`` fails here.

        Raises:
            ValueError: on a setting a component rejects, or a checkpoint that does not belong to this federation.
            KeyError: when the model does not log ``eval_metric``.
            RuntimeError: when another live run holds ``output_dir``.
        """
        if self._prepared is not None:
            if self._prepared != resume:
                raise RuntimeError(f"FederatedLoop.prepare ran with resume={self._prepared}; fit(resume={resume}).")
            return
        self.lock.check()
        self.checkpoint.fingerprint(self.parts)  # of the plug-ins as built, before their setup changes them
        restored = self.checkpoint.restore_run(self.parts) if resume else None
        if restored is not None:
            self.round_idx = restored
            log.info("resumed after round %d", self.round_idx - 1)
        remote = pool is not None and pool.encodes  # a remote pool's clients set up their own transforms
        client_setup = None if remote else self.client_setup_context()
        set_up_plugins(self.plugins.components, setup=self.setup_context(), client_setup=client_setup)
        for callback in self.callbacks:  # their checks that need the set-up run, before anything is written
            callback.check_fit(self.view.at(self.round_idx))
        if self.evaluator.every and self.datamodule.has_test_set:
            self.evaluator.check_metric(self.global_model, self.datamodule.test_dataloader())
        self._prepared = resume

    def fit(self, *, resume: bool = False, overwrite: bool = False, pool: ClientPool | None = None) -> dict[str, Any]:
        """Run the remaining rounds; with ``resume``, continue from the last committed round.

        Into a directory that holds a run, a fresh fit raises unless it continues it (``resume``) or replaces it
        (``overwrite``; :mod:`lightning_fl.federation.run_dir`). The clients train in this process or in the pool of
        this fit (:func:`open_pool`: ``pool`` when given, as Flower's SuperNodes, else workers, Ray actors or DDP
        ranks). Under DDP only rank 0 returns the summary (also in ``output_dir/summary.json``); the others ``{}``.

        Raises:
            ValueError: when ``output_dir`` holds a run and neither ``resume`` nor ``overwrite`` is set, or both are.
            RuntimeError: when another live run holds ``output_dir``.
        """
        self.prepare(resume=resume, pool=pool)
        ranks = launch(self.process_options) if self.ranks > 1 else None
        if ranks is not None and ranks.device_type != "cpu":  # each rank trains on its own device
            self.runner.use_devices([ranks.local_rank])
        if ranks is not None and ranks.rank > 0:
            serve(self.runner, ranks)  # trains the clients rank 0 sends; writes nothing
            return {}
        taps = bool(self.leaks.listeners("on_local_gradient"))
        chosen = open_pool(
            self.runner, workers=self.workers, backend=self.backend, ranks=ranks, taps_local_gradients=taps, given=pool
        )
        with writing_run(self.lock, self.checkpoint, resume=resume, overwrite=overwrite), chosen as opened:
            summary, self.round_idx = self.rounds.run(start=self.round_idx, num_clients=self.num_clients, pool=opened)
        return summary
