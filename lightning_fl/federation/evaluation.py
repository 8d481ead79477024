"""Evaluation of the global model, or of each trained client's own model for personalised defences."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import lightning as L
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader

from lightning_fl.contexts import ClientState
from lightning_fl.federation.fabric_fit import lean_test, model_needs_trainer, options_need_trainer
from lightning_fl.federation.updates import decode_aggregate
from lightning_fl.private import load_state_into, private_state
from lightning_fl.trainers import build_trainer, quiet_lightning

if TYPE_CHECKING:
    from collections.abc import Iterable

    from lightning_fl.contexts import ClientContext, RoundContext
    from lightning_fl.datamodules.federated import FederatedDataModule
    from lightning_fl.federation.checkpoint import Checkpoint
    from lightning_fl.federation.client_runner import ClientRunner
    from lightning_fl.transforms import ClientTransform

__all__ = [
    "ClientEvaluation",
    "Evaluator",
    "eval_hook",
    "evaluate_state",
    "logged_metric",
    "mean_over_clients",
    "trained_clients",
]

EvalOn = Literal["global", "clients"]


def eval_hook(model: L.LightningModule) -> str:
    """The hook that scores ``model``: ``test_step``, or ``validation_step`` when it defines only that one.

    Example:
        >>> class OnlyValidation(L.LightningModule):
        ...     def validation_step(self, batch, batch_idx): ...
        >>> eval_hook(OnlyValidation()), eval_hook(L.LightningModule())
        ('validation_step', 'test_step')
    """

    def overrides(hook: str) -> bool:
        return getattr(type(model), hook) is not getattr(L.LightningModule, hook)

    return "validation_step" if overrides("validation_step") and not overrides("test_step") else "test_step"


def logged_metric(results: dict[str, Any], key: str, *, owner: str, hook: str, field: str) -> float:
    """``results[key]`` as a float, or a ``KeyError`` that lists what was logged and how to fix it."""
    if key not in results:
        raise KeyError(
            f"{field}={key!r} was not logged by {owner}.{hook}; logged: {sorted(results)}. "
            f"HINT: log it with self.log({key!r}, ...) in {hook} or change {field}."
        )
    return float(results[key])


class ClientEvaluation:
    """A declared evaluation step on the clients' side: a model goes out, one scalar loss per client comes back.

    A server-side rule that needs the clients' judgement (FedBoosting's cross-validation, thesis Alg. 2) asks
    for it here instead of reaching into the clients: a client decodes the message through the client transforms'
    ``decode_aggregate`` (the seam that decodes every aggregate: Paillier decrypts with the client's key and counts
    the download), loads its own private layers and evaluates on its own data; only the losses go back.
    Simulation shortcut (documented in FedBoosting): the first client of ``client_ids`` decodes once for all.

    Args:
        model: the global model (architecture); evaluation runs on a copy.
        datamodule: the federated data (each client's train and validation sets).
        states: the clients' own states.
        options: the inner Trainers' options.
        client_transforms: the client-side chain whose ``decode_aggregate`` decodes a message.
        context: builds a client's :class:`~lightning_fl.contexts.ClientContext` in a round.
    """

    def __init__(
        self,
        model: L.LightningModule,
        datamodule: Any,
        states: Sequence[ClientState],
        options: dict,
        *,
        client_transforms: Sequence[ClientTransform] = (),
        context: Callable[[RoundContext, int], ClientContext] | None = None,
    ) -> None:
        self._global, self._datamodule, self._states, self._options = model, datamodule, states, options
        self._transforms, self._context = client_transforms, context
        self._model: L.LightningModule | None = None  # copied on first use: most runs never ask
        self._trainer: L.Trainer | None = None

    def losses(
        self,
        message: Any,
        *,
        ctx: RoundContext,
        client_ids: Sequence[int],
        split: Literal["train", "val"],
        metric: str,
        source: Any = None,
        field: str = "metric",
    ) -> list[float]:
        """``metric`` of the model ``ctx.global_state + decoded message`` on the ``split`` data of each client.

        ``source`` (what produced the message, the aggregator) is named if no client transform decodes it.
        """
        if self._model is None:
            self._model = copy.deepcopy(self._global)
        if self._context is None:
            raise RuntimeError("ClientEvaluation has no client context; FederatedLoop builds it with one.")
        decoder = self._context(ctx, client_ids[0])
        delta = decode_aggregate(message, self._transforms, ctx=decoder, source=source)
        base = ctx.global_state
        load_state_into(self._model, {k: v + delta[k].to(v.dtype) if k in delta else v for k, v in base.items()})
        dm, out = self._datamodule, []
        for client_id in client_ids:
            if self._states[client_id].private:
                load_state_into(self._model, self._states[client_id].private)
            dataset = dm.client_train_set(client_id) if split == "train" else dm.client_val_set(client_id)
            if self._trainer is None:
                self._trainer = build_trainer(self._options, validate=True)
            with quiet_lightning():
                results = self._trainer.validate(
                    self._model, dataloaders=DataLoader(dataset, batch_size=dm.eval_batch_size), verbose=False
                )
            owner = type(self._model).__name__
            out.append(logged_metric(results[0], metric, owner=owner, hook="validation_step", field=field))
        return out


class Evaluator:
    """Test accuracy on the held-out data, every ``every`` rounds and after the last.

    Args:
        options: the inner Trainers' options.
        every: evaluate every this many rounds (and always after the last); 0 disables.
        on: ``global`` tests the global model; ``clients`` averages each trained client's own model
            (global public state + its private layers), as personalised defences need.
        metric: the name the model logs in ``test_step`` (in ``validation_step`` when it defines no ``test_step``,
            as Lightning users expect: :func:`eval_hook`).

    Attributes:
        lean: test a model that overrides no test hook but ``test_step`` and the epoch hooks, under the quiet default
            options, without a ``Trainer`` (:func:`~lightning_fl.federation.fabric_fit.lean_test`: the same metrics,
            without the Trainer's per-call set-up and per-batch hooks); ``False`` always uses ``Trainer.test``.
        threads: torch threads for evaluation (``None``: as set). The loop gives N (at most the CPU count) with
            ``loop.workers`` N local processes: the evaluation in the loop's process, during which the workers are
            idle, uses their cores (measured in docs/performance.md).
    """

    def __init__(
        self,
        options: dict[str, Any],
        *,
        every: int = 1,
        on: EvalOn = "global",
        metric: str = "test_acc",
        threads: int | None = None,
    ):
        if every < 0:
            raise ValueError(f"loop.eval_every={every} must be >= 0.")
        if on not in ("global", "clients"):
            raise ValueError(f"loop.eval_on={on!r} is unknown; use 'global' or 'clients'.")
        self.options, self.every, self.on, self.metric = options, every, on, metric
        self.lean = True
        self.threads = threads
        self._trainer: L.Trainer | None = None
        self._needs_trainer: dict[type, bool] = {}

    def due(self, round_idx: int, num_rounds: int) -> bool:
        """Whether round ``round_idx`` ends with an evaluation."""
        return bool(self.every) and ((round_idx + 1) % self.every == 0 or round_idx == num_rounds - 1)

    def test(self, model: L.LightningModule, loader: Iterable[Any]) -> float:
        """``metric`` of ``model`` on ``loader``."""
        threads = torch.get_num_threads()
        torch.set_num_threads(self.threads or threads)
        try:
            results = self._results(model, loader)
        finally:
            torch.set_num_threads(threads)
        return logged_metric(
            results, self.metric, owner=type(model).__name__, hook=eval_hook(model), field="loop.eval_metric"
        )

    def check_metric(self, model: L.LightningModule, datamodule: FederatedDataModule) -> None:
        """Test ``model`` on one batch of the test set, so a ``metric`` the model never logs fails before training
        (nothing without a test set or with evaluation off).

        Raises:
            KeyError: naming ``loop.eval_metric`` and what was logged.
        """
        if not (self.every and datamodule.has_test_set):
            return
        results = self._results(model, datamodule.test_dataloader(), one_batch=True)
        logged_metric(results, self.metric, owner=type(model).__name__, hook=eval_hook(model), field="loop.eval_metric")

    def _results(self, model: L.LightningModule, loader: Iterable[Any], *, one_batch: bool = False) -> dict[str, Any]:
        """What ``Trainer.test(model, loader)`` returns (on the first batch only with ``one_batch``), by
        :func:`lean_test` where it gives the same."""
        if eval_hook(model) == "validation_step":
            options = {k: v for k, v in self.options.items() if k != "limit_val_batches"}
            with quiet_lightning():
                trainer = build_trainer({**options, "limit_val_batches": 1} if one_batch else options)
                return trainer.validate(model, dataloaders=loader, verbose=False)[0]
        kind = type(model)
        if kind not in self._needs_trainer:
            reason = options_need_trainer(self.options, ()) or model_needs_trainer(model, stage="test")
            self._needs_trainer[kind] = bool(reason)
        lean = self.lean and not self._needs_trainer[kind]
        results = lean_test(model, [next(iter(loader))] if one_batch else loader) if lean else None
        if results is not None:
            return results
        self._needs_trainer[kind] = True  # e.g. it logs in a form only the Trainer reduces: from now on
        with quiet_lightning():
            if one_batch:
                trainer = build_trainer({**self.options, "limit_test_batches": 1})
                return trainer.test(model, dataloaders=loader, verbose=False)[0]
            if self._trainer is None:
                self._trainer = build_trainer(self.options)
            return self._trainer.test(model, dataloaders=loader, verbose=False)[0]

    def evaluate(
        self,
        global_model: L.LightningModule,
        loader: Iterable[Any],
        *,
        worker: L.LightningModule,
        clients: Sequence[ClientState],
        public: dict[str, Tensor],
    ) -> float:
        """The global model's score, or the mean over trained clients' own models (``on="clients"``)."""
        trained = [c for c in clients if c.initialised]
        if self.on == "global" or not trained:
            return self.test(global_model, loader)
        scores = []
        for client in trained:
            load_state_into(worker, public)
            load_state_into(worker, client.private)
            scores.append(self.test(worker, loader))
        return float(np.mean(scores))


def evaluate_state(
    public: Mapping[str, Tensor],
    *,
    evaluator: Evaluator,
    model: L.LightningModule,
    datamodule: FederatedDataModule,
    runner: ClientRunner,
) -> float:
    """The test score of the committed public global state ``public`` (held by ``model``): the global model's, or
    the mean over the trained clients' own models (``loop.eval_on: clients``, on the runner's worker)."""
    return evaluator.evaluate(
        model, datamodule.test_dataloader(), worker=runner.worker, clients=runner.store, public=dict(public)
    )


def trained_clients(model: L.LightningModule, checkpoint: Checkpoint) -> list[ClientState]:
    """The trained clients whose own models score ``model``'s run, or ``[]`` when its public weights are the model.

    A model with private layers (key-locks, passports, a private split) is a different model on each client: the
    public global state alone, with the layers' initial values, is no client's model (docs/defences.md compares
    the two scores). Its score is that of each trained client's
    own model, as ``loop.eval_on: clients`` computes it during the run; the clients' private layers are read from
    their committed client-side storage (``clients/``, named and digest-checked by the manifest), in the clients'
    role: only the scores leave.

    Raises:
        ValueError: when ``model`` has private layers but the run directory holds no trained client's state.
    """
    private = private_state(model)
    if not private:
        return []
    manifest = checkpoint.read_manifest()
    slots = sorted(map(int, manifest["clients"])) if manifest else []
    clients = [c for c in (checkpoint.load_client(k, manifest) for k in slots) if c.initialised]
    if not clients:
        raise ValueError(
            f"the model has private layers ({sorted(private)[:2]} ...) that the public global model does not hold, "
            f"and {str(checkpoint.output_dir)!r} holds no trained client's state to score each client's own model "
            "with; set output_dir to the run that trained it."
        )
    return clients


def mean_over_clients(
    model: L.LightningModule, clients: Sequence[ClientState], score: Callable[[L.LightningModule], dict[str, float]]
) -> dict[str, float]:
    """Each metric of ``score(model)`` averaged over ``clients``' own models (``model`` + each one's private layers).

    ``model`` keeps the last client's private layers afterwards.

    Example:
        >>> from torch import nn
        >>> from lightning_fl.private import mark_private
        >>> net = nn.Sequential(nn.Linear(1, 1), mark_private(nn.Linear(1, 1)))
        >>> clients = [ClientState(k, {"1.bias": torch.tensor([float(k)])}, initialised=True) for k in (1, 3)]
        >>> mean_over_clients(net, clients, lambda m: {"bias": float(m[1].bias.detach())})
        {'bias': 2.0}
    """
    results = []
    for client in clients:
        load_state_into(model, client.private)
        results.append(score(model))
    return {key: float(np.mean([r[key] for r in results])) for key in results[0]}
