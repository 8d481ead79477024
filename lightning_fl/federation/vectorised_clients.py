"""Vectorised clients: a round's selected plain clients trained at once, behind the worker pool's interface.

:class:`VectorisedClients` is what :class:`~lightning_fl.federation.client_round.ClientStep` trains the round's
clients with when ``loop.vectorize`` picks the vectorised fit (see
:mod:`~lightning_fl.federation.vectorised_contract`): like a :class:`~lightning_fl.federation.workers.WorkerPool`
it takes ``(client_id, round_idx, received)`` fits and returns one result per client, which :meth:`collect` turns
into the raw update. Each client starts from what it received plus its own private state (loaded by
:meth:`ClientRunner.load_client <lightning_fl.federation.client_runner.ClientRunner.load_client>`) and trains on the
batches its own seeded loader yields, as in the sequential fit; its trained parameters are loaded back into the
runner's worker before its update is built, so client transforms see the client's model as they do there. A client
with per-example DP (a seeded ``PerExampleDP``) trains with its own DP-SGD settings, taken when its fit starts
(:meth:`VectorisedClients.client_started`) and put back before its fit ends (:mod:`~.vectorised_dp`).
"""

from __future__ import annotations

import logging
import random
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import lightning as L
import numpy as np
import torch
from torch import Tensor

from lightning_fl.contexts import ClientContext, RoundContext
from lightning_fl.federation.client_runner import seed_all
from lightning_fl.federation.fabric_fit import FitOutcome
from lightning_fl.federation.failures import ClientFailure, client_work
from lightning_fl.federation.vectorised_contract import Vectorize, use_vectorised, vectorised_device, vectorised_refusal
from lightning_fl.federation.vectorised_dp import (
    DPClient,
    DPClientFit,
    StackedDPSGD,
    dp_callbacks_refusal,
    dp_model_refusal,
    per_example_dp,
)
from lightning_fl.federation.vectorised_fit import ClientBatches, StackedModel, fit_stacked, stacked_copy
from lightning_fl.federation.vectorised_optim import StackedOptimizer
from lightning_fl.private import load_state_into

if TYPE_CHECKING:
    from lightning_fl.defences.dp.dp_sgd import PerExampleDP
    from lightning_fl.federation.client_runner import ClientRunner
    from lightning_fl.federation.client_store import ClientFit

__all__ = ["VectorisedClients", "VectorisedResult"]

log = logging.getLogger("lightning_fl.federation.loop")


@dataclass
class VectorisedResult:
    """One client's part of a vectorised round: its trained parameters and outcome, or its failure."""

    client_id: int
    round_idx: int
    received: dict[str, Tensor]
    trained: dict[str, Tensor] | None = None
    outcome: FitOutcome | None = None
    batch_size: int | None = None
    drawn: list[Any] | None = None  # the batches it trained on, when the runner records them
    failure: ClientFailure | None = None


class VectorisedClients:
    """Train a round's clients of ``runner`` at once when ``mode`` (``loop.vectorize``) and the model allow it.

    Args:
        runner: the loop's client runner (its worker model, data, client states and run shape).
        mode: ``True``, ``False`` or ``"auto"`` (see :func:`~.vectorised_contract.use_vectorised`).
        parallel: whether the loop trains its clients in worker processes, Ray actors or DDP ranks (a pool), which
            then train them one by one each.

    Attributes:
        decision: whether the last round's clients trained at once and why (``"yes (auto: ...)"``), ``None`` before
            the first round or with ``mode=False``; with ``"auto"`` and ``parallel``, ``"no (...)"`` from the start.

    Raises:
        ValueError: on an unknown ``mode``, or ``mode=True`` with ``parallel``.
    """

    def __init__(self, runner: ClientRunner, mode: Vectorize, *, parallel: bool = False) -> None:
        if mode not in (True, False, "auto"):
            raise ValueError(f"loop.vectorize={mode!r} is unknown; use true, false or auto.")
        if mode is True and parallel:
            raise ValueError(
                "loop.vectorize=true trains a round's clients at once in this process; it cannot be combined with "
                "loop.workers > 1, Ray or DDP ranks; drop one of them (or use loop.vectorize=auto)."
            )
        self.runner, self.mode = runner, mode
        self.device = vectorised_device(runner.trainer_options) or torch.device("cpu")
        self._model_refusal: str | None = None
        self._stacked: StackedModel | None = None
        self.decision: str | None = None
        if mode == "auto" and parallel:  # the pool trains the clients; for_round is never asked
            self.decision = "no (auto: loop.workers, Ray or DDP ranks train the clients in other processes)"
        self._dp: PerExampleDP | None = None
        self._dp_fits: dict[int, DPClientFit] = {}

    def for_round(self, callbacks: Sequence[Sequence[L.Callback]]) -> VectorisedClients | None:
        """``self`` when the round's clients, with these Trainer ``callbacks`` (one list per client), train
        vectorised, else ``None`` (they train one by one); the decision and its reason are logged when it changes."""
        if self.mode is False:
            return None
        runner = self.runner
        if self._model_refusal is None:
            self._model_refusal = vectorised_refusal(runner.worker, options=runner.trainer_options) or ""
        refusal = next((why for why in map(dp_callbacks_refusal, callbacks) if why), None)
        self._dp, self._dp_fits = next((dp for dp in map(per_example_dp, callbacks) if dp), None), {}
        if self._dp is not None and not refusal:
            refusal = dp_model_refusal(runner.worker)
        refusal = "inner_fit='trainer'" if runner.inner_fit == "trainer" else refusal or self._model_refusal or None
        parameters = sum(p.numel() for p in runner.worker.parameters())
        use, why = use_vectorised(self.mode, refusal, clients=len(callbacks), parameters=parameters, device=self.device)
        decision = f"{'yes' if use else 'no'} ({why})"
        if decision != self.decision:
            self.decision = decision
            if not use and self.mode is True:
                warnings.warn(f"loop.vectorize=true, but clients train one by one: {why}.", stacklevel=3)
            log.info("vectorised client fit: %s", decision)
        return self if use else None

    def client_started(self, client_id: int) -> None:
        """Take the per-fit settings the client callbacks hold now that ``client_id``'s fit-start callbacks ran (a
        ``PerExampleDP``'s clip bound, seed, sample rate and accountant, which ``ClientDPSGD`` sets per client)."""
        if self._dp is not None:
            self._dp_fits[client_id] = DPClientFit.of(self._dp)

    def run(self, fits: Sequence[tuple[int, int, dict[str, Tensor]]]) -> dict[int, VectorisedResult]:
        """Train ``(client_id, round_idx, received)`` fits at once; results by client id."""
        runner, worker = self.runner, self.runner.worker
        optimizer = worker.configure_optimizers()
        stacked = StackedOptimizer.like(optimizer, {id(p): name for name, p in worker.named_parameters()})
        results, starts, data, dp_clients = {}, [], [], []
        for i, (client_id, round_idx, received) in enumerate(fits):
            result = results[client_id] = VectorisedResult(client_id, round_idx, received)
            ctx = runner.context(RoundContext(runner.spec, round_idx), client_id)
            runner.load_client(ctx, received)
            try:
                with client_work(client_id, "training"):
                    batches, result.batch_size, dp_client = self._batches(
                        ctx, last=i == len(fits) - 1, num_tensors=len(stacked.names)
                    )
            except ClientFailure as failure:
                result.failure = failure
                continue
            if runner.local_steps and runner.record_drawn:
                result.drawn = list(batches.batches)
            starts.append({name: p.detach().clone() for name, p in worker.named_parameters()})
            data.append(batches)
            dp_clients.append(dp_client)
        trained = [r for r in results.values() if r.failure is None]
        if not trained:
            return results
        dp = None
        if self._dp is not None:
            dp = StackedDPSGD(dp_clients, stacked.names, clipping=self._dp.clipping)
        try:
            if self._stacked is None:
                self._stacked = stacked_copy(worker)
            outcomes = fit_stacked(self._stacked, starts, data, stacked, device=self.device, dp=dp)
        except Exception as error:  # the clients' own training step raised: every client of the stack failed
            for r in trained:
                r.failure = ClientFailure(r.client_id, "vectorised training", repr(error))
                r.failure.__cause__ = error
            return results
        for r, outcome, dp_client in zip(trained, outcomes, dp_clients, strict=True):
            if dp_client is not None:
                dp_client.account(outcome.steps)
            r.trained = outcome.state
            metrics = {runner.train_loss_key: outcome.loss}
            r.outcome = FitOutcome(metrics, outcome.steps, outcome.epochs, optimizer)
        return results

    def collect(self, result: VectorisedResult, *, ctx: ClientContext) -> ClientFit:
        """Load ``result``'s trained client into the runner's worker and return its fit.

        Raises:
            ClientFailure: when the client's data or the vectorised training step raised.
        """
        if result.client_id in self._dp_fits:
            self._dp_fits[result.client_id].restore(self._dp)
        if result.failure is not None:
            raise result.failure
        load_state_into(self.runner.worker, result.trained)
        return self.runner.update_of(
            result.client_id,
            result.round_idx,
            result.received,
            result.outcome,
            batch_size=result.batch_size,
            drawn=result.drawn,
        )

    def _batches(
        self, ctx: ClientContext, *, last: bool, num_tensors: int
    ) -> tuple[ClientBatches, int | None, DPClient | None]:
        """The batches client ``ctx.client_id``'s seeded loader yields in its fit, drawn as the sequential fit draws
        them (its Poisson batches with per-example DP), its batch size, and its DP-SGD client (``None`` without DP,
        see :class:`~.vectorised_dp.DPClient`; ``num_tensors`` trained parameter tensors). The host generators are
        seeded for each client (data randomness), the device ones only for the ``last`` (``torch.manual_seed`` on a
        CUDA build also queues a CUDA seed with a captured stack), so the generators end the round as the sequential
        path leaves them; a dropout model's masks are drawn from them afterwards, so its generators move on
        differently (see :mod:`~.vectorised_contract`)."""
        runner = self.runner
        fit_seed = ctx.seed("fit", ctx.client_id)
        if last:
            seed_all(fit_seed)
        else:
            random.seed(fit_seed)
            np.random.seed(fit_seed)
            torch.default_generator.manual_seed(fit_seed)
        loader = runner.datamodule.train_dataloader(ctx.client_id, seed=fit_seed)
        batch_size, dp_client = getattr(loader, "batch_size", None), None
        if self._dp is not None:
            fit = self._dp_fits[ctx.client_id]
            dp_client, loader = DPClient.start(self._dp, fit, loader, num_tensors=num_tensors, device=self.device)
        max_steps, max_epochs = runner.local_steps or -1, runner.local_epochs
        batches, epochs, epoch = [], [], 0
        while (max_steps > 0 and len(batches) < max_steps) or (max_steps <= 0 and epoch < max_epochs):
            before = len(batches)
            for batch in loader:
                batches.append(batch)
                epochs.append(epoch)
                if 0 < max_steps <= len(batches):
                    break
            epoch += 1
            if len(batches) == before:  # an empty loader: nothing to train on
                break
        return ClientBatches(batches, epochs), batch_size, dp_client
