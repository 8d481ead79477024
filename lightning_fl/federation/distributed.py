"""The federation across processes under Lightning's DDP strategy: launched once, clients split across ranks.

``loop.trainer: {strategy: ddp, devices: N}`` (or ``num_nodes``) makes :meth:`FederatedLoop.fit` launch N
processes once with Lightning Fabric (the script is re-run per rank, as Lightning's ``Trainer`` does). Rank 0
runs the loop: selection, the server side, evaluation and every write. Each round it assigns the selected
clients to ranks greedily by size (largest first, to the least loaded rank), sends each rank its
:class:`~lightning_fl.federation.workers.ClientJob` s (the state each client received and its own private state
from the client store, which stays on rank 0), every rank trains its clients on a single device with the same
seeds, and rank 0 gathers the raw updates and private states back. Gathering every update rather than
all-reducing a weighted sum keeps the server side identical to one process, so robust rules, secure
aggregation and FedBoosting, which need every update, work unchanged, and the results equal the
single-process run. Each client is trained exactly once per round, on one rank.

Every launched rank dies with the process that launched it (Linux: ``PR_SET_PDEATHSIG``; elsewhere a thread that
watches the parent), so a killed run leaves no ranks behind; ``devices`` beyond the machine's count is refused
before anything is launched.

Strategies that launch processes differently cannot run a federation (``ddp_spawn`` and ``ddp_fork``
pickle or fork the loop per ``fit`` call, ``fsdp`` / ``deepspeed`` shard one model); they are refused before
training with a one-line error.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import Tensor

from lightning_fl.federation.run_lock import LAUNCHER_PID_ENV, launched_rank
from lightning_fl.federation.workers import ClientResult, collect, fit_job, job
from lightning_fl.validation import check_device_count

if TYPE_CHECKING:
    from lightning_fl.contexts import ClientContext
    from lightning_fl.federation.client_runner import ClientRunner
    from lightning_fl.federation.client_store import ClientFit

__all__ = [
    "RankPool",
    "Ranks",
    "die_with_launcher",
    "die_with_parent",
    "launch",
    "ranks_requested",
    "serve",
    "single_device_options",
]

_LAUNCHED_ONCE = {"ddp", "ddp_find_unused_parameters_true", "ddp_find_unused_parameters_false"}
_PROCESS_OPTIONS = ("strategy", "devices", "num_nodes")


def ranks_requested(options: dict[str, Any]) -> int:
    """How many processes ``loop.trainer`` asks for (1 = this process only).

    Raises:
        ValueError: for a strategy that cannot run a federation, naming it and the options that can.

    Example:
        >>> ranks_requested({"accelerator": "cpu", "strategy": "ddp", "devices": 2})
        2
        >>> ranks_requested({"accelerator": "cpu", "devices": 1})
        1
    """
    devices, nodes = options.get("devices", 1), int(options.get("num_nodes", 1))
    check_device_count(options)
    if devices in ("auto", -1, "-1"):
        raise ValueError(
            f"loop.trainer.devices={devices!r}: give the number of processes of the federation explicitly, e.g. 2."
        )
    count = (len(devices) if isinstance(devices, list | tuple) else int(devices)) * nodes
    strategy = options.get("strategy", "auto")
    if count == 1 and strategy in ("auto", "ddp", "single_device"):
        return 1
    if strategy not in _LAUNCHED_ONCE and not (strategy == "auto" and count > 1):
        raise ValueError(
            f"loop.trainer.strategy={strategy!r} cannot run a federation (it relaunches or shards the model per fit); "
            "use strategy: ddp with devices: N (N processes, launched once, clients split across them) or "
            "loop.workers: N for local CPU worker processes."
        )
    return count


def client_options(options: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """``(ranks, client options)``: how many processes ``options`` (``loop.trainer``) ask for, and the client
    Trainers' options in each (:func:`single_device_options` under DDP, else ``options``).

    Example:
        >>> client_options({"accelerator": "cpu", "strategy": "ddp", "devices": 2})
        (2, {'accelerator': 'cpu', 'devices': 1})
    """
    ranks = ranks_requested(options)
    return ranks, single_device_options(options) if ranks > 1 else options


def single_device_options(options: dict[str, Any], *, local_rank: int | None = None) -> dict[str, Any]:
    """The client Trainers' options on one rank: the same, on one device of this rank, without a strategy.

    On GPUs that device is this rank's own: ``LOCAL_RANK`` (set by the launcher in every re-run of the script;
    unset, i.e. 0, in the first process) indexes ``devices`` when it lists GPU ids, else it is the GPU id, so
    two ranks on one machine do not both train on GPU 0. On CPU every rank takes one CPU device.

    Example:
        >>> single_device_options({"accelerator": "gpu", "strategy": "ddp", "devices": [2, 3]}, local_rank=1)
        {'accelerator': 'gpu', 'devices': [3]}
        >>> single_device_options({"accelerator": "cpu", "strategy": "ddp", "devices": 2}, local_rank=1)
        {'accelerator': 'cpu', 'devices': 1}
    """
    single = {**{k: v for k, v in options.items() if k not in _PROCESS_OPTIONS}, "devices": 1}
    accelerator = str(options.get("accelerator", "auto"))
    if accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available()):
        rank = int(os.environ.get("LOCAL_RANK", 0)) if local_rank is None else local_rank
        devices = options.get("devices", 1)
        single["devices"] = [int(devices[rank])] if isinstance(devices, list | tuple) else [rank]
    return single


def launch(options: dict[str, Any], runner: ClientRunner) -> Ranks:
    """Launch the ranks (Lightning re-runs the script once per rank) and connect them; returns this rank's view.
    Each rank on an accelerator trains its clients (``runner``) on its own device.

    Lightning Fabric starts the processes and the default process group only long enough to agree on a free port
    for a key-value store (``torch.distributed.TCPStore``); the group is then destroyed, so that the client
    Trainers and their metrics (torchmetrics syncs whenever a default group exists) run as in one process.
    """
    import lightning as L

    check_device_count(options)
    die_with_launcher()
    fabric = L.Fabric(
        accelerator=options.get("accelerator", "cpu"),
        devices=options.get("devices", 1),
        num_nodes=int(options.get("num_nodes", 1)),
        strategy="ddp",
    )
    launcher = not launched_rank()
    if launcher:  # the ranks inherit it while they are started: they share this run's lock and die with it
        os.environ[LAUNCHER_PID_ENV] = str(os.getpid())
    try:
        fabric.launch()
    finally:
        if launcher:
            os.environ.pop(LAUNCHER_PID_ENV, None)
    rank, world = fabric.global_rank, fabric.world_size
    box = [_free_port() if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    store = dist.TCPStore(host, box[0], world, is_master=rank == 0, timeout=timedelta(days=1))
    dist.barrier()
    dist.destroy_process_group()
    if fabric.device.type != "cpu":
        runner.use_devices([fabric.local_rank])
    return Ranks(rank, world, fabric.local_rank, fabric.device.type, store)


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_launcher() -> None:
    """In a launched rank, end this process when the process that launched it ends (:func:`die_with_parent`);
    elsewhere do nothing."""
    if launched_rank():
        die_with_parent(int(os.environ[LAUNCHER_PID_ENV]))


def die_with_parent(parent: int) -> None:
    """End this process when its parent ``parent`` ends (a DDP rank's launcher, a bench's worker pool owner).

    On Linux the kernel sends SIGKILL on the parent's death (``prctl(PR_SET_PDEATHSIG)``: a process blocked in a
    collective or on its work queue gets no chance to run a Python handler, and it writes nothing); on other
    systems a daemon thread polls the parent pid. A parent that died before this call ends the process at once.
    """
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    else:
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True, name="lightning-fl-parent").start()
    if os.getppid() != parent:
        os._exit(1)


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


@dataclass
class Ranks:
    """This process's place among the ranks and the store they exchange jobs and results through."""

    rank: int
    world: int
    local_rank: int
    device_type: str
    store: dist.TCPStore = field(repr=False)
    sequence: int = 0

    def post(self, name: str, value: Any) -> None:
        self.store.set(f"{self.sequence}/{name}", pickle.dumps(value))

    def take(self, name: str, *, delete: bool) -> Any:
        key = f"{self.sequence}/{name}"
        value = pickle.loads(self.store.get(key))  # blocks until posted; only our own ranks post
        if delete:
            self.store.delete_key(key)
        return value


def _assign(sizes: dict[int, int], ranks: int) -> list[list[int]]:
    """Clients per rank, greedily: largest client first, each to the least-loaded rank (lowest rank on ties)."""
    load, plan = [0] * ranks, [[] for _ in range(ranks)]
    for k in sorted(sizes, key=lambda c: (-sizes[c], c)):
        rank = min(range(ranks), key=lambda r: (load[r], r))
        load[rank] += sizes[k]
        plan[rank].append(k)
    return plan


def serve(runner: ClientRunner, ranks: Ranks) -> None:
    """A rank other than 0: train the jobs rank 0 posts until it posts ``None``."""
    while (plan := ranks.take("plan", delete=False)) is not None:
        ranks.post(f"results/{ranks.rank}", [fit_job(runner, task) for task in plan[ranks.rank]])
        ranks.sequence += 1


class RankPool:
    """Rank 0's side: the same ``run`` / ``collect`` as :class:`~lightning_fl.federation.workers.WorkerPool`."""

    encodes = False  # the client step encodes what it collects

    def __init__(self, runner: ClientRunner, ranks: Ranks) -> None:
        self.runner, self.ranks = runner, ranks

    def run(self, fits: Sequence[tuple[int, int, dict[str, Tensor]]]) -> dict[int, ClientResult]:
        """Train ``(client_id, round_idx, received)`` fits across the ranks; results by client id."""
        sizes = {k: self.runner.datamodule.num_train_samples(k) for k, _, _ in fits}
        jobs = {k: job(self.runner, k, r, received) for k, r, received in fits}
        plan = [[jobs[k] for k in ranked] for ranked in _assign(sizes, self.ranks.world)]
        self.ranks.post("plan", plan)
        results = [fit_job(self.runner, task) for task in plan[0]]
        for rank in range(1, self.ranks.world):
            results += self.ranks.take(f"results/{rank}", delete=True)
        self.ranks.store.delete_key(f"{self.ranks.sequence}/plan")
        self.ranks.sequence += 1
        return {result.client_id: result for result in results}

    def collect(self, result: ClientResult, *, ctx: ClientContext) -> ClientFit:
        """The raw update of ``result``; its private state goes to the client store on rank 0."""
        return collect(self.runner, result)

    def close(self) -> None:
        """Tell the other ranks to stop."""
        self.ranks.post("plan", None)
