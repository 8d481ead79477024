"""FederatedLoop against a minimal hand-written PyTorch FedAvg loop doing the same work, in one run.

Same data (digits, 10 clients, Dirichlet 0.5), same sigmoid LeNet, same selected clients, Adam lr 2e-3,
3 local epochs, batch 32, global test evaluation every round: ``configs/quickstart.yaml`` with ``--rounds``, the
FederatedLoop built from it by ``lightning_fl.bench.build_loop`` (as ``lightning-fl fit`` builds it) outside the timed
region; runs write to a fresh temporary folder. Prints the CPU time of each (this process, one thread: robust to
other load on the machine), the wall time, the ratios, and where the time of the Lightning loop goes (the clients'
fits, evaluation, writing and plotting at the end) and which inner fit the clients ran (plain clients: Lightning
Fabric; ``--inner-fit trainer`` sets a ``loop.trainer`` option that sends every fit and evaluation through a
Trainer). Each repeat also runs the loop with vectorised clients (``vectorize=True``: the round's clients trained at
once), interleaved with the other two, and prints the time of the rounds alone (start-up and the plots at the end
excluded) of both FederatedLoop runs. The loop is timed at its FL callback hooks (``_timing.RoundTimer``), never by
patching it.

    .venv/bin/python benchmarks/loop_overhead.py --rounds 10 --repeats 3 [--inner-fit trainer] [--device cuda]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F
from _timing import RoundTimer

from lightning_fl import FederatedDataModule, ImageClassifier
from lightning_fl.bench import build_loop, fit_config_spec
from lightning_fl.contexts import RoundContext
from lightning_fl.federation import derive_seed
from lightning_fl.federation.client_runner import seed_all as _seed_all

BACKBONE = "lenet_dlg"
DEVICE = "cpu"


def spec(rounds: int, *, vectorize: bool = False, inner_fit: str = "auto") -> dict:
    """The quickstart's federation (``configs/quickstart.yaml``) with this run's rounds, backbone and device;
    ``inner_fit="trainer"`` sets a ``loop.trainer`` option beyond the quiet defaults (``benchmark: false``, cuDNN's
    autotuner, which a CPU run never uses), which sends every client fit and evaluation through a ``Trainer``."""
    quickstart = fit_config_spec("configs/quickstart.yaml")
    model = {**quickstart["model"], "init_args": {**quickstart["model"]["init_args"], "backbone": BACKBONE}}
    trainer = {
        "accelerator": "gpu" if DEVICE == "cuda" else "cpu",
        **({"benchmark": False} if inner_fit == "trainer" else {}),
    }
    loop = {**quickstart["loop"], "num_rounds": rounds, "vectorize": vectorize, "trainer": trainer}
    return {**quickstart, "model": model, "loop": loop}


def build(dm: FederatedDataModule) -> ImageClassifier:
    """The hand-written loop's model: the quickstart's, initialised from seed 0 as the built loop's is."""
    torch.manual_seed(0)
    return ImageClassifier(BACKBONE, **dm.model_options, lr=2e-3)


def run_lightning(
    rounds: int, out: str, inner_fit: str = "auto", *, vectorize: bool = False
) -> tuple[tuple[float, float], float, dict[str, float]]:
    """One FederatedLoop run, timed at its FL callback hooks (:class:`RoundTimer`); the evaluation's share is the
    time of one more ``loop.evaluate()`` after the fit, once per evaluated round."""
    timer = RoundTimer(synchronize=DEVICE == "cuda")
    loop = build_loop(
        spec(rounds, vectorize=vectorize, inner_fit="auto" if vectorize else inner_fit), out, callbacks=[timer]
    )
    print(f"inner fit: {loop.runner.inner_fit_for()}")
    start = time.perf_counter(), time.process_time()
    summary = loop.fit()
    total = time.process_time() - start[1], time.perf_counter() - start[0]
    evaluate = time.process_time()
    loop.evaluate()
    evaluated = sum("test_accuracy" in entry for entry in loop.history)
    parts = {
        "fit": timer.total("clients")[0],
        "evaluate": (time.process_time() - evaluate) * evaluated,
        "finalize": start[1] + total[0] - timer.fit_end[0],
        "rounds": timer.total("rounds")[0],
        "rounds_wall": timer.total("rounds")[1],
    }
    return total, summary["test_accuracy"], parts


def run_plain(dm: FederatedDataModule, rounds: int, schedule: list[list[int]]) -> tuple[tuple[float, float], float]:
    """The loop as a bare PyTorch script writes it (one model reused, fresh Adam per client fit)."""
    model = build(dm).to(DEVICE)
    local = copy.deepcopy(model)
    start = time.perf_counter(), time.process_time()
    for round_idx in range(rounds):
        global_state = {k: v.clone() for k, v in model.state_dict().items()}
        deltas, weights = [], []
        for client in schedule[round_idx]:
            local.load_state_dict(global_state)
            seed = derive_seed(0, round_idx, "fit", client)
            _seed_all(seed)
            optimizer = torch.optim.Adam(local.parameters(), lr=2e-3)
            local.train()
            loader = dm.train_dataloader(client, seed=seed)
            for _ in range(3):
                for x, y in loader:
                    x, y = x.to(DEVICE), y.to(DEVICE)
                    optimizer.zero_grad()
                    F.cross_entropy(local(x), y).backward()
                    optimizer.step()
            deltas.append({k: local.state_dict()[k] - global_state[k] for k in global_state})
            weights.append(dm.num_train_samples(client))
        total = sum(weights)
        with torch.no_grad():
            for k, v in model.state_dict().items():
                if not v.is_floating_point():
                    continue  # BatchNorm's step counters are not averaged (as in FederatedLoop)
                v.add_(sum(d[k] * (w / total) for d, w in zip(deltas, weights, strict=True)))
        model.eval()
        correct = n = 0
        with torch.no_grad():
            for x, y in dm.test_dataloader():
                x, y = x.to(DEVICE), y.to(DEVICE)
                correct += (model(x).argmax(1) == y).sum().item()
                n += len(y)
        accuracy = correct / n
    return (time.process_time() - start[1], time.perf_counter() - start[0]), accuracy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--backbone", default="lenet_dlg", help="a backbone name, e.g. resnet20 for heavier steps")
    parser.add_argument(
        "--inner-fit", default="auto", choices=["auto", "trainer"], help="trainer: every client fit on a Trainer"
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cuda: every loop on the GPU")
    args = parser.parse_args()
    global BACKBONE, DEVICE
    BACKBONE, DEVICE = args.backbone, args.device
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="loop_overhead_") as out:
        probe = build_loop(spec(args.rounds), f"{out}/probe")
        state = probe.global_public_state()
        schedule = [probe.selector.select(RoundContext(probe.spec, r, state)) for r in range(args.rounds)]
        dm = probe.datamodule
        ours, vectorised, plain, parts_all, parts_vectorised = [], [], [], [], []
        for i in range(args.repeats):
            t, acc_l, parts = run_lightning(args.rounds, f"{out}/loop_{i}", args.inner_fit)
            ours.append(t)
            parts_all.append(parts)
            t, acc_v, parts = run_lightning(args.rounds, f"{out}/vectorised_{i}", args.inner_fit, vectorize=True)
            vectorised.append(t)
            parts_vectorised.append(parts)
            t, acc_p = run_plain(dm, args.rounds, schedule)
            plain.append(t)
    fits = args.rounds * 5
    for i, kind in enumerate(("CPU", "wall")):
        o, p = statistics.median(t[i] for t in ours), statistics.median(t[i] for t in plain)
        v = statistics.median(t[i] for t in vectorised)
        print(
            f"{kind} time: FederatedLoop {o:.2f} s (acc {acc_l:.3f}); vectorised clients {v:.2f} s (acc {acc_v:.3f}); "
            f"plain PyTorch {p:.2f} s (acc {acc_p:.3f}); ratios to plain {o / p:.2f} and {v / p:.2f}"
        )
    for key, kind in (("rounds", "CPU"), ("rounds_wall", "wall")):
        o = statistics.median(pp[key] for pp in parts_all)
        v = statistics.median(pp[key] for pp in parts_vectorised)
        print(
            f"rounds (on_round_start to on_round_end, evaluation included), {kind}: FederatedLoop {o:.2f} s, "
            f"vectorised clients {v:.2f} s, ratio {v / o:.2f}"
        )
    print("FederatedLoop CPU time by part (fit: the clients' span of each round, Trainer construction included):")
    for name in ("fit", "evaluate", "finalize"):
        print(f"  {name}: {statistics.median(pp[name] for pp in parts_all) / fits * 1e3:.1f} ms per client fit")
    print(f"load average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
