"""CPU time of a federation's rounds with clients trained one by one and vectorised (``loop.vectorize``), A/B.

The federation is the quickstart's (digits, Dirichlet 0.5, Adam 2e-3, 3 local epochs, batch 32, the sigmoid DLG
LeNet, or ``--backbone``) with ``--clients`` clients, ``--per-round`` a round, built by
``lightning_fl.bench.build_loop`` (``scaling.federation_spec``); ``--fed-cdp`` adds the ``FedCDP`` defence
(per-example DP-SGD in every client, the paper's sigma 6 and C 4, Poisson batches). Each repeat builds both loops from
the same seed and fits them one after the other, the order alternating between repeats (interleaved A/B on a shared
machine); ``--seeds`` runs that for each seed. The figures are the time of the rounds (start-up excluded; from
``on_round_start`` to ``on_round_end``, the evaluation included) and of the clients' training alone (from the first
``on_client_fit_start`` to the last ``on_client_fit_end``), timed at the loop's FL callback hooks
(``_timing.RoundTimer``): this process's CPU time (the one to read on a shared CPU) and the wall time (the one to
read on a GPU), with the ratios vectorised / sequential; then the final accuracies, the largest difference of any
round's train loss and test accuracy, and (``--fed-cdp``) the final epsilon of both, which must be equal.
``--profile`` instead runs the vectorised rounds once under cProfile and prints the top entries; ``--layers`` times the
DLG LeNet's convolutional body with its sigmoids (forward and backward, B = 32, ``--per-round`` clients) in three forms:
one NCHW convolution per client, each client's activations apart (as the sequential fit), the stacked layers with one
channels-last convolution per client (the vectorised fit on a CPU) and with one grouped convolution (on a GPU; the form
``torch.func.vmap`` gives).

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/vectorise_speed.py --clients 10 --per-round 5
    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/vectorise_speed.py --clients 100 --per-round 20
    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/vectorise_speed.py --clients 10 --per-round 5 --fed-cdp
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import tempfile
import time

import torch
from _timing import RoundTimer
from scaling import federation_spec

from lightning_fl.bench import build_loop
from lightning_fl.federation.vectorised_layers import StackedConv2d
from lightning_fl.models.lenet import LeNetDLG


def _fit(
    *,
    vectorize: bool,
    clients: int,
    per_round: int,
    rounds: int,
    seed: int,
    accelerator: str,
    backbone: str,
    fed_cdp: bool,
) -> tuple[dict[str, list[float]], list]:
    """The (CPU s, wall s) of the rounds and of the clients' training (:class:`RoundTimer` spans), and the history."""
    options = {"num_rounds": rounds, "clients_per_round": per_round, "local_epochs": 3, "vectorize": vectorize}
    spec = federation_spec(
        clients=clients, backbone=backbone, seed=seed, **options, trainer={"accelerator": accelerator}
    )
    if fed_cdp:
        spec["defences"] = [{"class_path": "lightning_fl.defences.FedCDP"}]
    timer = RoundTimer(synchronize=torch.cuda.is_available())
    with tempfile.TemporaryDirectory() as out:
        loop = build_loop(spec, out, callbacks=[timer])
        loop.fit()
        return {name: list(timer.total(name)) for name in ("rounds", "clients")}, loop.history


def _body_times(clients: int, batch: int = 32, repeats: int = 5, calls: int = 10) -> dict[str, float]:
    """CPU ms per client of the DLG LeNet body's forward and backward in each form (best of ``repeats``)."""
    torch.manual_seed(0)
    convs = [m for m in LeNetDLG(in_channels=1).body if isinstance(m, torch.nn.Conv2d)]
    weights = [torch.stack([c.weight.detach()] * clients).requires_grad_() for c in convs]
    biases = [torch.stack([c.bias.detach()] * clients).requires_grad_() for c in convs]
    x = torch.rand(clients * batch, 1, 32, 32)

    def each() -> torch.Tensor:
        outs = []
        for k, part in enumerate(x.split(batch)):
            h = part
            for conv, weight, bias in zip(convs, weights, biases, strict=True):
                h = torch.sigmoid(torch.nn.functional.conv2d(h, weight[k], bias[k], conv.stride, conv.padding))
            outs.append(h)
        return torch.cat(outs)

    def stacked(grouped: bool) -> torch.Tensor:
        h = x
        for conv, weight, bias in zip(convs, weights, biases, strict=True):
            layer = StackedConv2d(conv)
            layer.sizes, layer.grouped, layer.weight, layer.bias = [batch] * clients, grouped, weight, bias
            h = torch.sigmoid(layer(h))
        return h

    forms = {"per client, NCHW (the sequential fit)": each}
    forms["stacked, per client channels-last (the vectorised fit on a CPU)"] = lambda: stacked(False)
    forms["stacked, grouped channels-last (the vectorised fit on a GPU)"] = lambda: stacked(True)
    times = {}
    for name, form in forms.items():
        best = float("inf")
        for _ in range(repeats):
            cpu = time.process_time()
            for _ in range(calls):
                torch.autograd.grad(form().sum(), weights + biases)
            best = min(best, (time.process_time() - cpu) / calls)
        times[name] = 1e3 * best / clients
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="each seed runs --repeats A/B repeats")
    parser.add_argument("--backbone", default="lenet_dlg", help="ImageClassifier's backbone (one that qualifies)")
    parser.add_argument("--accelerator", default="cpu", help="loop.trainer's accelerator: cpu or gpu")
    parser.add_argument("--fed-cdp", action="store_true", help="every client with FedCDP (per-example DP-SGD)")
    parser.add_argument("--layers", action="store_true", help="time the LeNet body's three forms instead")
    parser.add_argument("--profile", action="store_true", help="cProfile the vectorised rounds once instead")
    args = parser.parse_args()
    run = {"clients": args.clients, "per_round": args.per_round, "rounds": args.rounds, "seed": args.seeds[0]}
    run.update(accelerator=args.accelerator, backbone=args.backbone, fed_cdp=args.fed_cdp)
    if args.layers:
        for name, ms in _body_times(args.per_round).items():
            print(f"{name}: {ms:.2f} ms CPU per client step (B = 32, {args.per_round} clients)")
        return
    if args.profile:
        profile = cProfile.Profile()
        profile.runcall(_fit, vectorize=True, **run)
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        return
    print(
        "| seed | repeat | order | rounds CPU s seq / vec | ratio | rounds wall s seq / vec | ratio "
        "| clients CPU s seq / vec | ratio | final accuracy seq / vec | max abs diff train loss / accuracy "
        "| final epsilon seq / vec | load |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for i, (seed, repeat) in enumerate((seed, repeat) for seed in args.seeds for repeat in range(args.repeats)):
        load, order = os.getloadavg()[0], (False, True) if i % 2 == 0 else (True, False)
        timed = {vectorize: _fit(vectorize=vectorize, **{**run, "seed": seed}) for vectorize in order}
        (s, hs), (v, hv) = timed[False], timed[True]
        loss = max(abs(a["train_loss"] - b["train_loss"]) for a, b in zip(hs, hv, strict=True))
        acc = max(abs(a["test_accuracy"] - b["test_accuracy"]) for a, b in zip(hs, hv, strict=True))
        epsilon = f"{hs[-1]['epsilon']:.4f} / {hv[-1]['epsilon']:.4f}" if args.fed_cdp else "-"
        first = "seq, vec" if order[0] is False else "vec, seq"
        print(
            f"| {seed} | {repeat} | {first} | {_pair(s, v, 'rounds', 0)} | {_pair(s, v, 'rounds', 1)} "
            f"| {_pair(s, v, 'clients', 0)} | {hs[-1]['test_accuracy']:.4f} / {hv[-1]['test_accuracy']:.4f} "
            f"| {loss:.1e} / {acc:.1e} | {epsilon} | {load:.1f} |",
            flush=True,
        )


def _pair(s: dict[str, list[float]], v: dict[str, list[float]], phase: str, clock: int) -> str:
    """``seq / vec | ratio`` of one phase's CPU (``clock`` 0) or wall (1) seconds."""
    return f"{s[phase][clock]:.2f} / {v[phase][clock]:.2f} | {v[phase][clock] / s[phase][clock]:.2f}"


if __name__ == "__main__":
    main()
