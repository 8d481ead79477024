"""Clients trained on Ray actors (``FederatedLoop(backend="ray", workers=N)``), as Flower's simulation does.

Each actor holds one copy of the loop's :class:`~lightning_fl.federation.client_runner.ClientRunner` (model and data,
sent once, without any client's state) and trains whole clients on it, exactly as a local worker process does
(:mod:`lightning_fl.federation.workers`): the same :class:`~lightning_fl.federation.workers.ClientJob` in, the same
:class:`~lightning_fl.federation.workers.ClientResult` out, private state back to the loop's client store. Jobs go
largest client first to whichever actor is free. Needs the ``ray`` extra (``pip install lightning-fl[ray]``).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from lightning_fl.contexts import ClientContext
from lightning_fl.federation.workers import ClientResult, collect, fit_job, job

if TYPE_CHECKING:
    from lightning_fl.federation.client_runner import ClientRunner
    from lightning_fl.federation.client_store import ClientFit

__all__ = ["RayPool"]


class _Actor:
    """One Ray actor: one runner, reused for every client it trains."""

    def __init__(self, runner: ClientRunner, threads: int) -> None:
        torch.set_num_threads(threads)
        self.runner = runner

    def fit(self, task: Any) -> ClientResult:
        return fit_job(self.runner, task)


class RayPool:
    """``workers`` Ray actors (Ray is started here when it is not running yet).

    Raises:
        ImportError: with the install line, when Ray is not installed.
    """

    encodes = False  # the client step encodes what it collects

    def __init__(self, runner: ClientRunner, workers: int, *, threads: int = 1) -> None:
        try:
            import ray
        except ImportError as err:
            raise ImportError("loop.backend='ray' needs Ray: pip install 'lightning-fl[ray]'") from err
        self.ray, self.runner = ray, runner
        if not ray.is_initialized():
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False, configure_logging=False)
        shipped = copy.copy(runner)  # model and data only: no client's state leaves the client store
        shipped.store = runner.store.emptied()
        shared = ray.put(shipped)
        actor = ray.remote(num_cpus=1)(_Actor)
        self.actors = [actor.remote(shared, threads) for _ in range(workers)]

    def run(self, fits: Sequence[tuple[int, int, dict[str, Tensor]]]) -> dict[int, ClientResult]:
        """Train ``(client_id, round_idx, received)`` fits, largest client first to a free actor; results by id."""
        order = sorted(fits, key=lambda f: (-self.runner.datamodule.num_train_samples(f[0]), f[0]))
        queue = [job(self.runner, k, r, received) for k, r, received in order]
        running = {}
        for actor in self.actors[: len(queue)]:
            running[actor.fit.remote(queue.pop(0))] = actor
        done: dict[int, ClientResult] = {}
        while running:
            (ready,), _ = self.ray.wait(list(running), num_returns=1)
            actor = running.pop(ready)
            result = self.ray.get(ready)
            done[result.client_id] = result
            if queue:
                running[actor.fit.remote(queue.pop(0))] = actor
        return done

    def collect(self, result: ClientResult, *, ctx: ClientContext) -> ClientFit:
        """The raw update of ``result`` (see :func:`~lightning_fl.federation.workers.collect`)."""
        return collect(self.runner, result)

    def close(self) -> None:
        """End the actors (Ray itself keeps running for the rest of the process)."""
        for actor in self.actors:
            self.ray.kill(actor)
