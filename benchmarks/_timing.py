"""The benchmarks' clocks: one for the attack benchmarks (process CPU seconds on the CPU, wall seconds after a
synchronise on a GPU), and :class:`RoundTimer`, which times a federated run through the loop's public observer seam,
its FL callback hooks, instead of patching the loop.

On the shared 2-core CPU, process time is what stays comparable under other people's load; on a GPU the work is
asynchronous, so only wall time bracketed by ``torch.cuda.synchronize`` measures it.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from lightning_fl.callbacks import FederatedCallback


def clock(device: torch.device | str) -> float:
    """Now, in the unit that suits ``device`` (differences are seconds)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
        return time.perf_counter()
    return time.process_time()


SPANS = {
    "rounds": ("start", "end"),
    "clients": ("clients_start", "clients_end"),
    "server": ("clients_end", "end"),
}
"""The spans of a round :meth:`RoundTimer.total` sums, each between two hooks: ``rounds`` from ``on_round_start``
(after the selection) to ``on_round_end`` (training, aggregation, the commit and the evaluation when it is due);
``clients`` from the first ``on_client_fit_start`` to the last ``on_client_fit_end`` (the clients' training, here,
at once or in a pool); ``server`` from there to ``on_round_end`` (aggregation, commit, evaluation)."""


class RoundTimer(FederatedCallback):
    """Times each round of a run at the FL callback hooks, in (process CPU s, wall s); ``synchronize`` waits for the
    GPU's queued work before each reading. Give it to the loop as an FL callback (``build_loop(..., callbacks=)``).

    Overriding ``on_client_fit_end`` makes the loop hand this callback a copy of each update (a copy per client fit).
    """

    def __init__(self, synchronize: bool = False) -> None:
        self.synchronize = synchronize
        self.rounds: list[dict[str, tuple[float, float]]] = []
        self.fit_end: tuple[float, float] | None = None

    def now(self) -> tuple[float, float]:
        """(process CPU s, wall s) now."""
        if self.synchronize:
            torch.cuda.synchronize()
        return time.process_time(), time.perf_counter()

    def on_round_start(self, federation: Any, round_idx: int, selected: list[int]) -> None:
        self.rounds.append({"start": self.now()})

    def on_client_fit_start(self, federation: Any, client_id: int) -> None:
        self.rounds[-1].setdefault("clients_start", self.now())

    def on_client_fit_end(self, federation: Any, update: Any) -> None:
        self.rounds[-1]["clients_end"] = self.now()

    def on_round_end(self, federation: Any, round_idx: int, metrics: dict[str, float]) -> None:
        self.rounds[-1]["end"] = self.now()

    def on_fit_end(self, federation: Any) -> None:
        self.fit_end = self.now()

    def total(self, span: str) -> tuple[float, float]:
        """The (CPU s, wall s) of ``span`` (a key of :data:`SPANS`) summed over the rounds that reached both ends."""
        first, last = SPANS[span]
        done = [r for r in self.rounds if first in r and last in r]
        return sum(r[last][0] - r[first][0] for r in done), sum(r[last][1] - r[first][1] for r in done)
