"""Evaluation of the global model, or of each trained client's own model for personalised defences."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import lightning as L
import numpy as np
from torch import Tensor

from lightning_fl.federation.contexts import ClientState
from lightning_fl.federation.trainers import build_trainer, quiet_lightning
from lightning_fl.private import load_state_into

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["Evaluator", "logged_metric"]

EvalOn = Literal["global", "clients"]


def logged_metric(results: dict[str, Any], key: str, *, owner: str, hook: str, field: str) -> float:
    """``results[key]`` as a float, or a ``KeyError`` that lists what was logged and how to fix it."""
    if key not in results:
        raise KeyError(
            f"{field}={key!r} was not logged by {owner}.{hook}; logged: {sorted(results)}. "
            f"HINT: log it with self.log({key!r}, ...) in {hook} or change {field}."
        )
    return float(results[key])


class Evaluator:
    """Test accuracy on the held-out data, every ``every`` rounds and after the last.

    Args:
        options: the inner Trainers' options.
        every: evaluate every this many rounds (and always after the last); 0 disables.
        on: ``global`` tests the global model; ``clients`` averages each trained client's own model
            (global public state + its private layers), as personalised defences need.
        metric: the name the model logs in ``test_step``.
    """

    def __init__(self, options: dict[str, Any], *, every: int = 1, on: EvalOn = "global", metric: str = "test_acc"):
        if every < 0:
            raise ValueError(f"loop.eval_every={every} must be >= 0.")
        if on not in ("global", "clients"):
            raise ValueError(f"loop.eval_on={on!r} is unknown; use 'global' or 'clients'.")
        self.options, self.every, self.on, self.metric = options, every, on, metric
        self._trainer: L.Trainer | None = None

    def due(self, round_idx: int, num_rounds: int) -> bool:
        """Whether round ``round_idx`` ends with an evaluation."""
        return bool(self.every) and ((round_idx + 1) % self.every == 0 or round_idx == num_rounds - 1)

    def test(self, model: L.LightningModule, loader: Iterable[Any]) -> float:
        """``metric`` of ``model`` on ``loader``."""
        with quiet_lightning():
            if self._trainer is None:
                self._trainer = build_trainer(self.options)
            results = self._trainer.test(model, dataloaders=loader, verbose=False)
        return logged_metric(
            results[0], self.metric, owner=type(model).__name__, hook="test_step", field="loop.eval_metric"
        )

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
