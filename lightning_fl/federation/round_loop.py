"""The loop over the rounds of one ``fit``, as Lightning's ``FitLoop`` is to ``Trainer.fit``.

:meth:`FederatedLoop.fit <lightning_fl.federation.loop.FederatedLoop.fit>` prepares the run, launches the DDP ranks,
locks ``output_dir`` and opens the client pool; :class:`RoundLoop` then runs the remaining rounds with a progress
bar: it runs one round (``run_round``, which returns the round's history entry), records it, calls the callbacks,
advances the round clock, commits the round (``commit``: the checkpoint manifest) and writes ``logs/metrics.csv``
and ``summary.json``; it stops early when a callback asks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from lightning_fl.federation.trainers import quiet_lightning

if TYPE_CHECKING:
    from lightning_fl.callbacks.base import FederatedCallback
    from lightning_fl.federation.recording import RunRecorder
    from lightning_fl.federation.view import FederationView, RoundClock

__all__ = ["RoundLoop"]

log = logging.getLogger("lightning_fl.federation.loop")  # a stop request stays logged under the loop's name


class RoundLoop:
    """Run the rounds from ``clock.round_idx`` to ``num_rounds`` (or a stop request); :meth:`run` returns the summary.

    Args:
        run_round: runs round ``clock.round_idx`` and returns its history entry.
        commit: commits the finished rounds (the clock already names the next round) with the touched clients.
        clock: the round index and the clients touched in the round.
        recorder: the run's history, loggers and files.
        callbacks: the FL callbacks, called with ``federation``.
        federation: the read-only view the FL callbacks receive.
        num_rounds: rounds T of the run.
        progress_bar: show a rich progress bar over rounds.
    """

    def __init__(
        self,
        *,
        run_round: Callable[[], dict[str, Any]],
        commit: Callable[[Sequence[int]], None] | None,
        clock: RoundClock,
        recorder: RunRecorder,
        callbacks: Sequence[FederatedCallback],
        federation: FederationView,
        num_rounds: int,
        progress_bar: bool,
    ) -> None:
        self.run_round, self.commit, self.clock, self.recorder = run_round, commit, clock, recorder
        self.callbacks, self.federation = tuple(callbacks), federation
        self.num_rounds, self.progress_bar = num_rounds, progress_bar

    def run(self, *, num_clients: int) -> dict[str, Any]:
        """Run the remaining rounds; before the first round of a fresh run, commit the start (all ``num_clients``)."""
        from rich.progress import Progress

        clock, recorder = self.clock, self.recorder
        recorder.stop_reason = None
        recorder.start()
        if self.commit is not None and clock.round_idx == 0:  # commit the start: a kill in round 0 resumes from it
            self.commit(range(num_clients))
        for cb in self.callbacks:
            cb.on_fit_start(self.federation)
        with quiet_lightning(), Progress(disable=not self.progress_bar) as progress:
            task = progress.add_task("rounds", total=self.num_rounds, completed=clock.round_idx)
            while clock.round_idx < self.num_rounds:
                entry = self.run_round()
                recorder.end_round(entry)
                for cb in self.callbacks:
                    cb.on_round_end(self.federation, clock.round_idx, entry)
                clock.round_idx += 1
                if self.commit is not None:
                    self.commit(clock.touched)
                recorder.write()
                acc = entry.get("test_accuracy")
                progress.update(task, advance=1, description=f"rounds (acc {acc:.3f})" if acc is not None else "rounds")
                if recorder.stop_reason:
                    log.warning("stopping after round %d: %s", clock.round_idx - 1, recorder.stop_reason)
                    break
        for cb in self.callbacks:
            cb.on_fit_end(self.federation)
        recorder.finalize()
        recorder.write()
        return recorder.summary()
