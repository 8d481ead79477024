"""The loop over the rounds of one ``fit``, as Lightning's ``FitLoop`` is to ``Trainer.fit``.

:meth:`FederatedLoop.fit <lightning_fl.federation.loop.FederatedLoop.fit>` prepares the run, launches the DDP ranks
and locks ``output_dir``; :class:`RoundLoop` then runs the remaining rounds inside the client pool (see
:meth:`ClientRound.pool <lightning_fl.federation.client_round.ClientRound.pool>`) with a progress bar, commits each
finished round (checkpoint manifest, ``logs/metrics.csv``, ``summary.json``) and stops early when a callback asks.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from lightning_fl.federation.trainers import quiet_lightning

if TYPE_CHECKING:
    from lightning_fl.federation.distributed import Ranks
    from lightning_fl.federation.loop import FederatedLoop

__all__ = ["RoundLoop"]

log = logging.getLogger("lightning_fl.federation.loop")  # a stop request stays logged under the loop's name


class RoundLoop:
    """Run ``loop``'s rounds from ``loop.round_idx`` to ``loop.num_rounds`` (or a stop request); returns the summary."""

    def __init__(self, loop: FederatedLoop) -> None:
        self.loop = loop

    def run(self, ranks: Ranks | None) -> dict[str, Any]:
        """Run the remaining rounds, the clients training in this process, the workers or the DDP ``ranks``."""
        from rich.progress import Progress

        loop = self.loop
        loop.recorder.stop_reason = None
        loop.recorder.start()
        if loop.checkpoint.enabled and loop.round_idx == 0:  # commit the start: a kill in round 0 resumes from it
            loop.checkpoint.save_run(loop, touched=range(loop.num_clients))
        for cb in loop.callbacks:
            cb.on_fit_start(loop.view)
        with loop.client_round.pool(ranks), quiet_lightning(), Progress(disable=not loop.progress_bar) as progress:
            task = progress.add_task("rounds", total=loop.num_rounds, completed=loop.round_idx)
            while loop.round_idx < loop.num_rounds:
                entry = loop.run_round()
                loop.recorder.end_round(entry)
                for cb in loop.callbacks:
                    cb.on_round_end(loop.view, loop.round_idx, entry)
                loop.round_idx += 1
                if loop.checkpoint.enabled:
                    loop.checkpoint.save_run(loop, touched=loop._touched)
                loop.recorder.write()
                acc = entry.get("test_accuracy")
                progress.update(task, advance=1, description=f"rounds (acc {acc:.3f})" if acc is not None else "rounds")
                if loop.recorder.stop_reason:
                    log.warning("stopping after round %d: %s", loop.round_idx - 1, loop.recorder.stop_reason)
                    break
        for cb in loop.callbacks:
            cb.on_fit_end(loop.view)
        loop.recorder.finalize()
        loop.recorder.write()
        return loop.recorder.summary()
