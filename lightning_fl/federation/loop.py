"""FederatedLoop builds a run's collaborators and hands them to the round loop; it holds no per-round logic."""

from __future__ import annotations

import functools
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
from lightning_fl.federation.distributed import client_options, launch, serve
from lightning_fl.federation.evaluation import ClientEvaluation, Evaluator, evaluate_state
from lightning_fl.federation.fingerprint import federation_fingerprint
from lightning_fl.federation.leak_points import LeakPoints
from lightning_fl.federation.loop_settings import FEDERATED_LOOP_DOC
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


class FederatedLoop:
    __doc__ = FEDERATED_LOOP_DOC  # each setting's meaning (loop_settings.py), which `lightning-fl fit --help` shows

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
        self.max_update_norm_ratio, self.max_update_norm = bounds = norm_bounds(max_update_norm_ratio, max_update_norm)
        self.process_options = options = trainer_options(trainer)
        self.ranks, options = client_options(options)
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
        self.recorder = RunRecorder(output_dir, loggers=loggers, wandb_project=wandb_project, wandb_mode=wandb_mode)
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
        self.vectorised = vectorised = VectorisedClients(self.runner, vectorize, parallel=parallel)
        store, context = self.runner.store, self.runner.context  # the clients' side, which evaluation asks
        self.client_evaluation = ClientEvaluation(
            model, datamodule, store, options, client_transforms=self.client_transforms, context=context
        )
        self._evaluate = functools.partial(
            evaluate_state, evaluator=self.evaluator, model=model, datamodule=datamodule, runner=self.runner
        )
        self.round_idx = 0  # the next round to run
        self.view = FederationView(  # what FL callbacks receive
            self.spec, self.output_dir, global_model=model, recorder=self.recorder, clients=store, plugins=plugins
        )
        self.downlink = Downlink(self.broadcast_transforms)
        self.server_step = ServerStep(plugins, leaks=self.leaks, client_context=self.runner.context)
        self.client_step = ClientStep(
            self.runner, plugins, self.downlink, self.leaks, vectorised, norm_bounds=bounds, min_clients=min_clients
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
            norm_bounds=bounds,
            eval_on=self.evaluator.on,
        )
        self.parts = RunParts(model, plugins.components, self.callbacks, self.recorder, self.runner.store, fingerprint)
        one_round = Round(
            self.spec, plugins, client_step=self.client_step, server_step=self.server_step, federation=self.view
        )
        self.rounds = RoundLoop(
            one_round, self.parts, self.checkpoint, self.evaluator, self._evaluate, progress_bar=progress_bar
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
        """Check and set up everything a run needs, writing nothing (:meth:`fit` calls it when it was not called):
        restore the last committed round (``resume``), set the plug-ins up (not their client side for a ``pool``
        whose clients set themselves up) and test the global model on one batch, so a wrong ``eval_metric`` fails.

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
        self.round_idx = self.round_idx if restored is None else restored
        client_setup = None if pool is not None and pool.encodes else self.client_setup_context()
        set_up_plugins(self.plugins.components, setup=self.setup_context(), client_setup=client_setup)
        for callback in self.callbacks:  # their checks that need the set-up run, before anything is written
            callback.check_fit(self.view.at(self.round_idx))
        self.evaluator.check_metric(self.global_model, self.datamodule)
        self._prepared = resume

    def fit(self, *, resume: bool = False, overwrite: bool = False, pool: ClientPool | None = None) -> dict[str, Any]:
        """Run the remaining rounds: a fresh fit, or one that continues (``resume``) or replaces (``overwrite``) the
        run in ``output_dir``. The clients train here or in a pool (:func:`open_pool`: ``pool`` as Flower's SuperNodes,
        workers, Ray actors or DDP ranks); under DDP only rank 0 returns the summary, the others ``{}``.

        Raises:
            ValueError: when ``output_dir`` holds a run and neither ``resume`` nor ``overwrite`` is set, or both are.
            RuntimeError: when another live run holds ``output_dir``.
        """
        self.prepare(resume=resume, pool=pool)
        ranks = launch(self.process_options, self.runner) if self.ranks > 1 else None
        if ranks is not None and ranks.rank > 0:
            serve(self.runner, ranks)  # trains the clients rank 0 sends; writes nothing
            return {}
        chosen = open_pool(
            self.runner, workers=self.workers, backend=self.backend, ranks=ranks, leaks=self.leaks, given=pool
        )
        with writing_run(self.lock, self.checkpoint, resume=resume, overwrite=overwrite), chosen as opened:
            summary, self.round_idx = self.rounds.run(start=self.round_idx, num_clients=self.num_clients, pool=opened)
        return summary
