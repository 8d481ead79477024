"""How FederatedLoop scales: the same federation with ``workers`` 1, 2, ... local worker processes.

Section ``workers``: a cross-device workload, ResNet-20 on ``digits`` (32x32), 100 clients
(Dirichlet 0.5), 10 a round, 2 local epochs of Adam, batch 32, global test evaluation every round; the same
seed for every worker count. Prints per setting the whole-run wall time, the CPU time of this process plus its
(joined) worker processes, the final accuracy, whether the history equals ``workers=1`` exactly, and the
load average before the run, because wall time on a shared machine depends on it; and where the time goes, timed at
the loop's FL callback hooks (``_timing.RoundTimer``, never by patching the loop): the rounds, the clients' span
(sending jobs, the pool's work, collecting results), the server's part and, of it, the evaluation.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/scaling.py workers --workers 1 2 --rounds 3 [--ray]

Section ``memory``: peak resident memory when every one of 1,000 clients has trained once with
key-lock secrets (``KeyLocks``), held in the loop's client store:

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/scaling.py memory --clients 1000 --per-round 100 --backbone lenet_dlg

Section ``ddp``: the quickstart config through the CLI in one process and in 2 DDP processes (gloo):

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/scaling.py ddp --rounds 10

Section ``flower``: the quickstart workload's whole-process wall time through ``lightning-fl fit -c
configs/quickstart.yaml`` against Flower simulations of the same model, data, partition and clients (a plain Flower
app with a bare PyTorch client, and our Flower adapter; see ``benchmarks/flower_quickstart.py``), one after another:

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/scaling.py flower --rounds 25

Clients trained one by one against vectorised (``loop.vectorize``): ``benchmarks/vectorise_speed.py``.
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time

import torch
from _timing import RoundTimer

from lightning_fl.bench import build_loop
from lightning_fl.contexts import RoundContext
from lightning_fl.server import ClientSelector


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def federation_spec(
    *, clients: int, partition: str = "dirichlet", backbone: str, seed: int = 0, **loop: object
) -> dict:
    """The benchmarks' federation: ``digits`` split over ``clients`` (Dirichlet 0.5 or IID, the split's seed fixed at
    0), ``ImageClassifier(backbone)`` with Adam 2e-3 initialised from ``seed``; ``loop`` holds the loop's options."""
    return {
        "seed": seed,
        "data": {"dataset": "digits", "num_clients": clients, "partition": partition, "alpha": 0.5, "seed": 0},
        "model": {"class_path": "lightning_fl.models.ImageClassifier", "init_args": {"backbone": backbone, "lr": 2e-3}},
        "loop": loop,
    }


def run_workers(
    workers: int,
    *,
    rounds: int,
    clients: int,
    per_round: int,
    backbone: str,
    backend: str = "processes",
) -> dict:
    """One run with ``workers`` worker processes, timed at the loop's FL callback hooks (``_timing.RoundTimer``): the
    rounds, the clients' span (sending the jobs, the pool's work, collecting the results), the server's part
    (aggregation, commit, evaluation) and the evaluation alone (one more ``loop.evaluate()`` after the fit, once per
    evaluated round), in this process's CPU time and wall time."""
    options = {"num_rounds": rounds, "clients_per_round": per_round, "local_epochs": 2, "workers": workers}
    timer = RoundTimer()
    with tempfile.TemporaryDirectory() as out:
        spec = federation_spec(clients=clients, backbone=backbone, **options, backend=backend)
        loop = build_loop(spec, out, callbacks=[timer])
        load = os.getloadavg()[0]
        wall, cpu, own = time.perf_counter(), _cpu_seconds(), time.process_time()
        summary = loop.fit()
        wall, cpu, own = time.perf_counter() - wall, _cpu_seconds() - cpu, time.process_time() - own
        evaluated = sum("test_accuracy" in entry for entry in loop.history)
        before = timer.now()
        loop.evaluate()
        evaluation = [(now - then) * evaluated for now, then in zip(timer.now(), before, strict=True)]
    print(f"workers={workers} ({backend}): wall {wall:.2f} s, CPU all processes {cpu:.2f} s, loop process {own:.2f} s")
    phases = {name: timer.total(name) for name in ("rounds", "clients", "server")}
    for name, (c, w) in {**phases, "evaluation (of the server's part)": evaluation}.items():
        print(f"    {name}: CPU {c:.2f} s, wall {w:.2f} s")
    return {
        "workers": f"{workers} ({backend})",
        "wall": wall,
        "cpu": cpu,
        "acc": summary["test_accuracy"],
        "load": load,
        "h": loop.history,
    }


class EveryClientOnce(ClientSelector):
    """Round r trains clients ``r * per_round`` to ``(r + 1) * per_round - 1``: every client once over the run."""

    def __init__(self, per_round: int) -> None:
        self.per_round = per_round

    def select(self, ctx: RoundContext) -> list[int]:
        first = ctx.round_idx * self.per_round
        return list(range(first, min(ctx.spec.num_clients, first + self.per_round)))


def run_memory(*, clients: int, per_round: int, backbone: str) -> None:
    """Peak resident memory of a run in which every one of ``clients`` clients trains once with key-lock secrets."""
    from lightning_fl.defences import KeyLocks

    options = {"num_rounds": -(-clients // per_round), "clients_per_round": per_round, "local_steps": 1}
    spec = federation_spec(clients=clients, partition="iid", backbone=backbone, **options, eval_every=0)
    spec["loop"]["selector"] = EveryClientOnce(per_round)
    with tempfile.TemporaryDirectory() as out:
        loop = build_loop({**spec, "defences": [KeyLocks()]}, out)
        wall = time.perf_counter()
        loop.fit()
        wall = time.perf_counter() - wall
    holding = sum(c.initialised for c in loop.clients)
    private = sum(v.numel() * v.element_size() for c in loop.clients for v in c.private.values())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"| {clients} | {holding} | {private / 2**20:.1f} | {peak:.0f} | {wall:.0f} |")


def run_ddp(*, rounds: int) -> None:
    """The quickstart through the CLI in 1 and 2 DDP processes (gloo): whole-process wall time, accuracy per round."""
    import json
    import subprocess
    import sys

    print("| processes | whole-process wall s | test accuracy per round | load before |\n|---|---|---|---|")
    for devices in (1, 2):
        with tempfile.TemporaryDirectory() as out:
            trainer = (
                f"{{accelerator: cpu, strategy: ddp, devices: {devices}}}" if devices > 1 else "{accelerator: cpu}"
            )
            command = [sys.executable, "-m", "lightning_fl.cli", "fit", "--config", "configs/quickstart.yaml"]
            command += ["--loop.num_rounds", str(rounds), "--loop.progress_bar", "false", "--output_dir", out]
            load, wall = os.getloadavg()[0], time.perf_counter()
            subprocess.run([*command, "--loop.trainer", trainer], check=True, capture_output=True)
            wall = time.perf_counter() - wall
            with open(f"{out}/summary.json") as f:
                accuracies = [round(h["test_accuracy"], 4) for h in json.load(f)["history"]]
        print(f"| {devices} | {wall:.1f} | {accuracies} | {load:.1f} |")


def _tree_cpu_seconds(root: int, seen: dict[int, float]) -> None:
    """Record the CPU seconds of ``root`` and its descendants (Ray's raylet, GCS and actors) from ``/proc``."""
    parents, ticks = {}, os.sysconf("SC_CLK_TCK")
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / ticks)
    tree = {root}
    for _ in range(8):  # the process tree is shallow
        tree |= {pid for pid, (ppid, _) in parents.items() if ppid in tree}
    seen.update({pid: parents[pid][1] for pid in tree if pid in parents})


def run_flower(*, rounds: int) -> None:
    """``lightning-fl fit`` on the quickstart against Flower's simulation of it: whole-process wall and CPU seconds
    (this process tree, sampled every 0.2 s from /proc, so a process living less than that is missed)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    path = os.pathsep.join([str(here.parent), str(here), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "LIGHTNING_FL_BENCH_ROUNDS": str(rounds)}
    print("| run | whole-process wall s | CPU s (process tree) | final accuracy | per round == fit | load before |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as out:
        fit = [sys.executable, "-m", "lightning_fl.cli", "fit", "-c", "configs/quickstart.yaml"]
        runs = {
            "lightning-fl fit": [*fit, "--loop.num_rounds", str(rounds), "--output_dir", out],
            "Flower simulation, plain app (bare PyTorch client)": [sys.executable, __file__, "flower-run", "bare"],
            "Flower simulation, lightning-fl adapter": [sys.executable, __file__, "flower-run", "adapter"],
        }
        for name, command in runs.items():
            load, wall, seen = os.getloadavg()[0], time.perf_counter(), {}
            process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            while process.poll() is None:
                _tree_cpu_seconds(process.pid, seen)
                time.sleep(0.2)
            wall = time.perf_counter() - wall
            if process.returncode:
                raise RuntimeError(f"{name} failed with exit code {process.returncode}: {command}")
            if name == "lightning-fl fit":
                with open(f"{out}/summary.json") as f:
                    accuracies = reference = [h["test_accuracy"] for h in json.load(f)["history"]]
            else:
                accuracies = json.loads(process.stdout.read().strip().splitlines()[-1])
            same = accuracies == reference
            print(f"| {name} | {wall:.1f} | {sum(seen.values()):.1f} | {accuracies[-1]:.4f} | {same} | {load:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("section", choices=["workers", "memory", "ddp", "flower", "flower-run"])
    parser.add_argument("impl", nargs="?", choices=["bare", "adapter"], help="flower-run: which Flower app")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--backbone", default="resnet20")
    parser.add_argument("--ray", action="store_true", help="also run the largest worker count on Ray actors")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.section == "flower":
        run_flower(rounds=args.rounds)
        return
    if args.section == "flower-run":  # one Flower simulation, in a process of its own (run by ``flower``)
        import json

        import flower_quickstart

        print(json.dumps(flower_quickstart.run(args.impl)))
        return
    if args.section == "ddp":
        run_ddp(rounds=args.rounds)
        return
    if args.section == "memory":
        print(
            "| clients | holding key-lock secrets | private state MiB | peak RSS MiB | wall s |\n|---|---|---|---|---|"
        )
        run_memory(clients=args.clients, per_round=args.per_round, backbone=args.backbone)
        return
    rows = [
        run_workers(
            w,
            rounds=args.rounds,
            clients=args.clients,
            per_round=args.per_round,
            backbone=args.backbone,
        )
        for w in args.workers
    ]
    if args.ray:
        options = {"rounds": args.rounds, "clients": args.clients, "per_round": args.per_round}
        rows.append(run_workers(max(args.workers), **options, backbone=args.backbone, backend="ray"))
    base = rows[0]
    print(
        "| workers | wall s | wall / workers=1 | CPU s (all processes) | accuracy | history == workers=1 "
        "| load before |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        same = r["h"] == base["h"]
        print(
            f"| {r['workers']} | {r['wall']:.1f} | {r['wall'] / base['wall']:.2f} | {r['cpu']:.1f} | {r['acc']:.4f} "
            f"| {same} | {r['load']:.1f} |"
        )


if __name__ == "__main__":
    main()
