"""The loop over the rounds of one ``fit``, as Lightning's ``FitLoop`` is to ``Trainer.fit``.

:class:`~lightning_fl.federation.loop.FederatedLoop` builds the :class:`~lightning_fl.federation.round.Round` and the
:class:`RoundLoop` once; its ``fit`` prepares the run, launches the DDP ranks, locks ``output_dir`` and opens the client
pool, and :class:`RoundLoop` then runs the remaining rounds in that pool with a progress bar. Each round is a value
(:class:`~lightning_fl.federation.round.RoundResult`) that :meth:`RoundLoop.commit` writes: the new global state
into the global model, the history entry (with the test accuracy when due), the ``on_round_end`` callbacks, the
checkpoint manifest, ``logs/metrics.csv`` and ``summary.json``. It stops early when a plug-in asks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from torch import Tensor

from lightning_fl.federation.recording import RunRecorder
from lightning_fl.private import load_state_into, public_state
from lightning_fl.trainers import quiet_lightning
from lightning_fl.view import RoundReport

if TYPE_CHECKING:
    from lightning_fl.federation.checkpoint import Checkpoint, RunParts
    from lightning_fl.federation.client_round import ClientPool
    from lightning_fl.federation.evaluation import Evaluator
    from lightning_fl.federation.round import Round, RoundResult

__all__ = ["RoundLoop", "global_state_of"]

log = logging.getLogger("lightning_fl.federation.loop")  # a stop request stays logged under the loop's name


def global_state_of(parts: RunParts) -> dict[str, Tensor]:
    """A copy of the committed public global state (what the next round starts from)."""
    return {k: v.detach().clone() for k, v in public_state(parts.global_model).items()}


class RoundLoop:
    """Run the rounds from ``start`` to the run's ``num_rounds`` (or a stop request); :meth:`run` returns the summary.

    Args:
        round: runs one round on values; its FL callbacks are called, with its read-only view, at the start and end
            of the run and of each committed round.
        parts: what a round commits (the global model, the recorder, the checkpointed parts).
        checkpoint: where the rounds are committed (when it is ``enabled``).
        evaluator: says which rounds are scored; evaluate: the test accuracy of the committed global state.
        progress_bar: show a rich progress bar over rounds.
    """

    def __init__(
        self,
        round: Round,
        parts: RunParts,
        checkpoint: Checkpoint,
        evaluator: Evaluator,
        evaluate: Callable[[Mapping[str, Tensor]], float],
        *,
        progress_bar: bool,
    ) -> None:
        self.round, self.parts, self.checkpoint = round, parts, checkpoint
        self.evaluator, self.evaluate = evaluator, evaluate
        self.callbacks, self.federation = round.callbacks, round.federation
        self.num_rounds, self.progress_bar = round.spec.num_rounds, progress_bar

    def step(self, round_idx: int, pool: ClientPool | None = None) -> tuple[dict[str, Any], RoundReport]:
        """Run round ``round_idx`` (its clients in ``pool``; ``None``: in this process) and commit it in memory;
        returns its history entry and what the callbacks of its end reported (files are written by :meth:`run`)."""
        return self.commit(self.round.run(round_idx, global_state_of(self.parts), pool))

    def commit(self, result: RoundResult) -> tuple[dict[str, Any], RoundReport]:
        """Write what ``result`` holds: its global state into the global model, its history entry (scored when
        due), then the ``on_round_end`` callbacks; returns the entry and the round's report (touched, stop)."""
        load_state_into(self.parts.global_model, result.global_state)
        entry = RunRecorder.new_entry(result.round_idx, result.updates)
        if self.evaluator.due(result.round_idx, self.num_rounds):
            entry["test_accuracy"] = self.evaluate(global_state_of(self.parts))
        entry.update(result.metrics)
        self.parts.recorder.end_round(entry)
        report = RoundReport(touched=list(result.touched), stop=result.stop)
        federation = self.federation.at(result.round_idx, report)
        for cb in self.callbacks:  # each its own copy: a callback cannot rewrite the history
            cb.on_round_end(federation, result.round_idx, dict(entry))
        entry.update(report.metrics)
        return entry, report

    def run(self, *, start: int, num_clients: int, pool: ClientPool | None = None) -> tuple[dict[str, Any], int]:
        """Run the remaining rounds from ``start``, their clients in ``pool`` (the fit's; ``None``: in this process);
        before the first round of a fresh run, commit the start (all ``num_clients``). Returns the summary and the
        next round to run."""
        from rich.progress import Progress

        recorder, round_idx, stop = self.parts.recorder, start, None
        recorder.start()
        if self.checkpoint.enabled and round_idx == 0:  # commit the start: a kill in round 0 resumes from it
            self.checkpoint.save_run(self.parts, round_idx=0, touched=range(num_clients))
        started = RoundReport()
        for cb in self.callbacks:
            cb.on_fit_start(self.federation.at(round_idx, started))
        with quiet_lightning(), Progress(disable=not self.progress_bar) as progress:
            task = progress.add_task("rounds", total=self.num_rounds, completed=round_idx)
            while round_idx < self.num_rounds:
                entry, report = self.step(round_idx, pool)
                round_idx += 1
                if self.checkpoint.enabled:
                    self.checkpoint.save_run(self.parts, round_idx=round_idx, touched=report.touched)
                stop = report.stop or started.stop
                recorder.write(stop_reason=stop)
                acc = entry.get("test_accuracy")
                progress.update(task, advance=1, description=f"rounds (acc {acc:.3f})" if acc is not None else "rounds")
                if stop:
                    log.warning("stopping after round %d: %s", round_idx - 1, stop)
                    break
        for cb in self.callbacks:
            cb.on_fit_end(self.federation.at(round_idx))
        recorder.finalize()
        recorder.write(stop_reason=stop)
        return recorder.summary(stop_reason=stop), round_idx
