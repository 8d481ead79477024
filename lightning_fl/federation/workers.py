"""Local worker processes that train whole clients in parallel (``FederatedLoop(workers=N)``).

pfl-research's design (Granqvist et al., 2024, "pfl-research: simulation framework for accelerating research
in private federated learning", Sec. 3): each worker process holds one model and one
:class:`~lightning_fl.federation.client_runner.ClientRunner` that it reuses for every client it trains; nothing
of the topology is simulated. The server side stays in the loop's process.

What crosses the process boundary, per client fit:

* to the worker, a :class:`ClientJob`: the client id, the round, the state the client received (after the
  broadcast transforms) and the client's own private state from the loop's client store;
* back, a :class:`ClientResult`: the raw :class:`~lightning_fl.messages.ClientUpdate`, the trained public
  state and the client's private state, which :meth:`WorkerPool.collect` hands to the client store (the
  loop's ``ClientState``), never to anything server-side. The worker forgets it after the fit.

Tensors travel as bytes (:func:`pack`: one flat buffer per dtype, no shared-memory files), and every random
stream of a client fit derives from ``(seed, round, client)``, so the results equal ``workers=1`` for the same
seed: bit for bit when each process uses the same number of torch threads (one, as here by default).

Jobs are queued largest client first and each free worker takes the next one: greedy longest-processing-time
list scheduling (Graham, 1969), within 4/3 of the best makespan.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import queue
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from lightning_fl.contexts import ClientContext, ClientState, RoundContext
from lightning_fl.federation.client_store import ClientFit
from lightning_fl.federation.failures import ClientFailure
from lightning_fl.messages import ClientUpdate, GroundTruth
from lightning_fl.private import public_state

if TYPE_CHECKING:
    from collections.abc import Sequence

    import lightning as L

    from lightning_fl.federation.client_runner import ClientRunner

__all__ = ["ClientJob", "ClientResult", "WorkerPool", "check_workers", "collect", "fit_job", "job"]


def pack(state: dict[str, Tensor]) -> bytes:
    """Tensors by value as one byte string: a JSON header (name, dtype, shape) and one flat buffer per dtype.

    A memory copy per dtype, not a pickled file per tensor (``torch.save`` runs four times per client fit and was
    the largest fixable cost of worker processes: docs/performance.md, "Scaling"). No shared-memory file per tensor.

    Example:
        >>> state = {"w": torch.arange(6.0).view(2, 3), "n": torch.tensor(3), "b": torch.ones(2, dtype=torch.bfloat16)}
        >>> back = unpack(pack(state))
        >>> all(torch.equal(back[k], v) and back[k].dtype == v.dtype for k, v in state.items())
        True
    """
    tensors = {k: v.detach().cpu().contiguous().reshape(-1) for k, v in state.items()}
    dtypes = sorted({str(t.dtype) for t in tensors.values()})
    header = [[k, str(v.dtype), list(v.shape)] for k, v in state.items()]
    blobs = [
        torch.cat([t for t in tensors.values() if str(t.dtype) == d]).view(torch.uint8).numpy().tobytes()
        for d in dtypes
    ]
    head = json.dumps({"tensors": header, "sizes": [len(b) for b in blobs]}).encode()
    return len(head).to_bytes(8, "little") + head + b"".join(blobs)


def unpack(data: bytes) -> dict[str, Tensor]:
    """The tensors of :func:`pack` (only a JSON header is parsed: nothing in the bytes is executed)."""
    size = int.from_bytes(data[:8], "little")
    head = json.loads(data[8 : 8 + size])
    dtypes = sorted({d for _, d, _ in head["tensors"]})
    flat, offset = {}, 8 + size
    for d, nbytes in zip(dtypes, head["sizes"], strict=True):
        raw = torch.frombuffer(bytearray(data[offset : offset + nbytes]), dtype=torch.uint8) if nbytes else None
        flat[d] = raw.view(getattr(torch, d.removeprefix("torch."))) if raw is not None else None
        offset += nbytes
    out, used = {}, dict.fromkeys(dtypes, 0)
    for name, d, shape in head["tensors"]:
        n = math.prod(shape)
        dtype = getattr(torch, d.removeprefix("torch."))
        out[name] = flat[d][used[d] : used[d] + n].view(shape) if n else torch.empty(shape, dtype=dtype)
        used[d] += n
    return out


@dataclass(frozen=True)
class ClientJob:
    """One client fit as a worker receives it (client side of the boundary)."""

    client_id: int
    round_idx: int
    received: bytes
    private: bytes
    initialised: bool


@dataclass(frozen=True)
class ClientResult:
    """One client fit as a worker returns it: the raw update and the client's own state, or the error.

    ``error`` is the worker's traceback; ``client_failure`` is set (to what the client's work raised) when the
    error was the client's own work failing, which the loop drops, and ``None`` for anything else, which stops the
    run; see :mod:`~lightning_fl.federation.failures`. ``trained_on``: the examples a fit by local steps drew
    (packed ``inputs``/``targets``, the type-1 ground truth kept apart for scoring), or empty.
    """

    client_id: int
    update: ClientUpdate | None = None
    delta: bytes = b""
    trained: bytes = b""
    private: bytes = b""
    error: str | None = None
    client_failure: str | None = None
    trained_on: bytes = b""


class RemoteTraceback(Exception):
    """The traceback of an error in a worker process, as the cause of the error raised here (as
    ``concurrent.futures`` does)."""


def check_workers(
    workers: int,
    *,
    trainer_options: dict[str, Any],
    client_callbacks: Sequence[L.Callback],
    backend: str = "processes",
    ranks: int = 1,
    taps_local_gradients: bool = False,
) -> None:
    """Raise a one-line ``ValueError`` when ``loop.workers`` and ``loop.backend`` cannot run with these settings,
    or with ``ranks`` DDP processes (before training); Ray actors train clients outside this process even for one
    worker. ``taps_local_gradients``: a callback listens at the type-2 leak point, which only this process sees."""
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"loop.workers={workers!r} must be an int >= 1 (1 trains clients in this process).")
    if workers > 1 or backend == "ray":
        if trainer_options.get("accelerator", "cpu") != "cpu" or trainer_options.get("devices", 1) not in (1, "1"):
            raise ValueError(
                f"loop.workers={workers} runs CPU worker processes with one device each; set loop.trainer "
                "'{accelerator: cpu, devices: 1}' or use loop.workers=1 for accelerators."
            )
        if client_callbacks:
            names = sorted({type(cb).__name__ for cb in client_callbacks})
            raise ValueError(
                f"loop.workers={workers} cannot run client Trainer callbacks {names} in worker processes (their "
                "state lives in this process); use loop.workers=1 with them."
            )
    if ranks > 1 and (workers > 1 or backend == "ray" or client_callbacks):
        raise ValueError(
            f"loop.trainer asks for {ranks} processes (DDP); it cannot be combined with loop.workers > 1, "
            "loop.backend='ray' or client Trainer callbacks yet; drop one of them."
        )
    if backend not in ("processes", "ray"):
        raise ValueError(f"loop.backend={backend!r} is unknown; use 'processes' or 'ray'.")
    if taps_local_gradients and (workers > 1 or backend == "ray" or ranks > 1):
        raise ValueError(
            f"loop.workers={workers} (backend {backend!r}, {ranks} DDP process(es)) cannot tap local gradients in "
            "other processes, and loop.callbacks listen at the type-2 leak point (leak_point='local_gradient'); "
            "use loop.workers=1 on one device for gradient-leakage attacks on local gradients."
        )


def _serve(runner: ClientRunner, jobs: Any, results: Any, threads: int) -> None:
    """A worker's life: take jobs until ``None``, train each client on the one reused runner, send results."""
    torch.set_num_threads(threads)
    while (task := jobs.get()) is not None:
        results.put(fit_job(runner, task))


def fit_job(runner: ClientRunner, task: ClientJob) -> ClientResult:
    """Train one job on ``runner`` (in a worker process or a DDP rank); an error comes back as its traceback."""
    k = task.client_id
    runner.store.restore(ClientState(k, private=unpack(task.private), initialised=task.initialised))
    try:
        ctx = runner.context(RoundContext(runner.spec, task.round_idx), k)
        fit = runner.fit(ctx, unpack(task.received))
        update, truth = fit.update, fit.trained_on
        slim = ClientUpdate(k, update.round_idx, {}, update.num_samples, update.loss, update.metadata)
        drawn = pack({"inputs": truth.inputs, "targets": truth.targets}) if truth is not None else b""
        return ClientResult(
            k, slim, pack(update.delta), pack(public_state(runner.worker)), pack(fit.private or {}), trained_on=drawn
        )
    except ClientFailure as failure:  # the client's own work: dropped by the loop, as an in-process failure is
        return ClientResult(k, error=traceback.format_exc().strip(), client_failure=failure.detail)
    except Exception:  # a fault of our own code in the worker: collect raises it in the loop's process
        return ClientResult(k, error=traceback.format_exc(limit=-3).strip())
    finally:
        runner.store.forget(k)  # the worker keeps no client's secrets between fits


def collect(runner: ClientRunner, result: ClientResult) -> ClientFit:
    """Load the trained client of a result into the runner's worker model (what a client transform sees as
    ``ctx.model``) and return its fit (raw update, private state, what it trained on).

    Raises:
        ClientFailure: with the remote traceback when the client's own work failed there.
        RuntimeError: with the remote traceback when anything else failed there.
    """
    if result.client_failure is not None:
        cause = RemoteTraceback(f"in worker process:\n{result.error}")
        raise ClientFailure(result.client_id, "training in a worker process", result.client_failure) from cause
    if result.error is not None:
        raise RuntimeError(f"in worker process: {result.error}")
    private = unpack(result.private)
    runner.load_trained(unpack(result.trained), private)
    truth = GroundTruth(**unpack(result.trained_on)) if result.trained_on else None
    u = result.update
    update = ClientUpdate(u.client_id, u.round_idx, unpack(result.delta), u.num_samples, u.loss, u.metadata)
    return ClientFit(update, private, truth)


def job(runner: ClientRunner, client_id: int, round_idx: int, received: dict[str, Tensor]) -> ClientJob:
    """The :class:`ClientJob` of one fit: what the client received and its own state from the client store."""
    state = runner.store[client_id]
    return ClientJob(client_id, round_idx, pack(received), pack(state.private), state.initialised)


class WorkerPool:
    """``workers`` processes, each training whole clients on its own copy of ``runner`` (forked once).

    Args:
        runner: the loop's runner; each worker inherits a copy (model, data, Trainer options) at start.
        workers: number of processes.
        threads: torch threads per worker.
    """

    encodes = False  # the client step encodes what it collects

    def __init__(self, runner: ClientRunner, workers: int, *, threads: int = 1) -> None:
        self.runner = runner
        context = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
        self.jobs, self.results = context.Queue(), context.Queue()
        self.processes = [
            context.Process(target=_serve, args=(runner, self.jobs, self.results, threads), daemon=False)
            for _ in range(workers)
        ]
        for process in self.processes:
            process.start()

    def run(self, fits: Sequence[tuple[int, int, dict[str, Tensor]]]) -> dict[int, ClientResult]:
        """Train ``(client_id, round_idx, received)`` fits, largest client first; results by client id."""
        order = sorted(fits, key=lambda f: (-self.runner.datamodule.num_train_samples(f[0]), f[0]))
        for k, round_idx, received in order:
            self.jobs.put(job(self.runner, k, round_idx, received))
        done: dict[int, ClientResult] = {}
        while len(done) < len(fits):
            try:
                result = self.results.get(timeout=1.0)
            except queue.Empty as empty:
                dead = [p.exitcode for p in self.processes if not p.is_alive()]
                if dead:
                    raise RuntimeError(
                        f"a client worker process exited (exit codes {dead}); see its output above."
                    ) from empty
                continue
            done[result.client_id] = result
        return done

    def collect(self, result: ClientResult, *, ctx: ClientContext) -> ClientFit:
        """The raw update of ``result`` (see :func:`collect`)."""
        return collect(self.runner, result)

    def close(self) -> None:
        """Stop the workers (each finishes its current job first)."""
        for _ in self.processes:
            self.jobs.put(None)
        for process in self.processes:
            process.join(timeout=30)
            if process.is_alive():
                process.terminate()
        self.jobs.close()
        self.results.close()
