"""The client pool of one ``fit``: local worker processes, Ray actors or DDP ranks, chosen when the fit starts.

:func:`open_pool` is called by :meth:`FederatedLoop.fit <lightning_fl.federation.loop.FederatedLoop.fit>` (the
assembler) once per fit; the client step only receives the pool it opened.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal

from lightning_fl.federation.distributed import RankPool, Ranks
from lightning_fl.federation.workers import WorkerPool

if TYPE_CHECKING:
    from lightning_fl.federation.client_round import ClientPool
    from lightning_fl.federation.client_runner import ClientRunner
    from lightning_fl.federation.leak_points import LeakPoints

__all__ = ["open_pool"]


@contextlib.contextmanager
def open_pool(
    runner: ClientRunner,
    *,
    workers: int,
    backend: Literal["processes", "ray"],
    ranks: Ranks | None,
    leaks: LeakPoints,
    given: ClientPool | None = None,
) -> Iterator[ClientPool | None]:
    """The pool that trains the clients of one ``fit``: the ``given`` one (Flower's SuperNodes; its owner closes it),
    else ``workers`` processes, Ray actors, or the DDP ``ranks``; ``None`` (train in this process) by default.
    A pool opened here is closed when the block ends.

    Raises:
        ValueError: when a callback taps local gradients (type 2, a listener of ``leaks``), which other processes
            cannot report.
    """
    if given is not None:
        yield given
        return
    if workers == 1 and backend == "processes" and ranks is None:
        yield None
        return
    if leaks.listeners("on_local_gradient"):
        raise ValueError(
            "loop.workers > 1 and DDP ranks cannot tap local gradients (a callback listens at the type-2 leak "
            "point) in other processes; use loop.workers=1 on one device for gradient-leakage attacks."
        )
    if ranks is not None:
        pool: ClientPool = RankPool(runner, ranks)
    elif backend == "ray":
        from lightning_fl.federation.ray_backend import RayPool

        pool = RayPool(runner, workers)
    else:
        pool = WorkerPool(runner, workers)
    try:
        yield pool
    finally:
        pool.close()
